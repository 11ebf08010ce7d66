"""Topic patterns (issue 25.4; AMPS: "the topic can be a literal topic name or a regular
expression pattern"): sow, sow-delete, subscribe and sow-and-subscribe accept -t as a regular
expression; every result line names its topic."""

from __future__ import annotations

import signal
import subprocess
import sys

import orjson
import pytest

from sow_redis.client import Sow
from sow_redis.errors import UnknownTopicError
from conftest import cli_env, run_cli, start_worker


@pytest.fixture(scope="module")
def worker(redis_server):
    """A worker for the sow-delete by filter (the CLI hands deletes to the workers)."""
    w = start_worker(redis_server)
    yield w
    w.send_signal(signal.SIGTERM)
    w.wait(timeout=30)


def _define(url: str, base: str) -> Sow:
    sow = Sow(url)
    sow.apply_config("".join(f'[[topic]]\nname = "{base}_{s}"\nkey = ["/id"]\npartitions = 2\n'
                             for s in ("ord_a", "ord_b", "fills")))
    return sow


def test_resolving_names_and_patterns(url, topic_name):
    sow = _define(url, topic_name)
    assert sow.resolve_topics(f"{topic_name}_ord_a") == [f"{topic_name}_ord_a"]
    assert sow.resolve_topics(f"^{topic_name}_ord.*") == [f"{topic_name}_ord_a",
                                                          f"{topic_name}_ord_b"]
    assert sow.resolve_topics(f"{topic_name}_ord_.", regex=True) == [
        f"{topic_name}_ord_a", f"{topic_name}_ord_b"]
    with pytest.raises(UnknownTopicError, match="is not defined"):
        sow.resolve_topics(f"{topic_name}_nothing")
    with pytest.raises(UnknownTopicError, match="no topic matches"):
        sow.resolve_topics(f"^{topic_name}_zzz.*")
    with pytest.raises(UnknownTopicError, match="no regular expression"):
        sow.resolve_topics("(", regex=True)


def test_cli_sow_and_sow_delete_over_a_pattern(url, topic_name, worker):
    _define(url, topic_name)
    for s in ("ord_a", "ord_b", "fills"):
        run_cli(url, "publish", "-t", f"{topic_name}_{s}", "--wait",
                input=b'{"id": 1, "s": "%s"}\n' % s.encode())
    out = run_cli(url, "sow", "-t", f"^{topic_name}_ord.*")
    lines = [orjson.loads(x) for x in out.stdout.splitlines()]
    assert lines == [{"topic": f"{topic_name}_ord_a", "data": {"id": 1, "s": "ord_a"}},
                     {"topic": f"{topic_name}_ord_b", "data": {"id": 1, "s": "ord_b"}}]
    out = run_cli(url, "sow-delete", "-t", f"{topic_name}_ord_.", "--topic-regex", "-f", "1=1")
    assert out.stdout.decode().splitlines() == [
        f"removed 1 record(s) from {topic_name}_ord_a",
        f"removed 1 record(s) from {topic_name}_ord_b"]
    bad = run_cli(url, "sow", "-t", f"^{topic_name}_none.*", check=False)
    err = bad.stderr.decode().strip().splitlines()
    assert bad.returncode == 1 and len(err) == 1 and "no topic matches" in err[0], err


def test_cli_subscribe_over_a_pattern(url, topic_name):
    sow = _define(url, topic_name)
    proc = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "subscribe", "-t",
                             f"^{topic_name}_ord", "--count", "2", "--timeout", "30"],
                            env=cli_env(url), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        live_line = proc.stderr.readline().decode()  # printed once every topic is subscribed
        assert f"{topic_name}_ord_a" in live_line and f"{topic_name}_ord_b" in live_line
        sow.publish(f"{topic_name}_fills", {"id": 9})  # not matched: never printed
        sow.publish(f"{topic_name}_ord_b", {"id": 2}, wait=True)
        sow.publish(f"{topic_name}_ord_a", {"id": 1}, wait=True)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    got = sorted((m["topic"], m["data"]["id"]) for m in map(orjson.loads, out.splitlines()))
    assert got == [(f"{topic_name}_ord_a", 1), (f"{topic_name}_ord_b", 2)]


def test_cli_sow_and_subscribe_over_a_pattern(url, topic_name):
    """Each matching topic's query part (its own group_end), then the live changes of all,
    every line naming its topic; an aggregated subscription takes one topic only."""
    sow = _define(url, topic_name)
    for s in ("ord_a", "ord_b", "fills"):
        sow.publish(f"{topic_name}_{s}", {"id": 1, "s": s}, wait=True)
    proc = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "sow-and-subscribe", "-t",
                             f"^{topic_name}_ord", "--select", "/s", "--count", "5",
                             "--timeout", "30"],
                            env=cli_env(url), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stderr.readline()  # the live line: every topic is subscribed
        sow.publish(f"{topic_name}_fills", {"id": 2, "s": "no"})  # not matched
        sow.publish(f"{topic_name}_ord_b", {"id": 2, "s": "new"}, wait=True)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    got = sorted(((m["topic"], m["kind"], m.get("data")) for m in map(orjson.loads,
                                                                      out.splitlines())),
                 key=str)
    assert got == sorted([(f"{topic_name}_ord_a", "sow", {"s": "ord_a"}),
                          (f"{topic_name}_ord_a", "group_end", None),
                          (f"{topic_name}_ord_b", "sow", {"s": "ord_b"}),
                          (f"{topic_name}_ord_b", "group_end", None),
                          (f"{topic_name}_ord_b", "publish", {"s": "new"})], key=str), got
    bad = run_cli(url, "sow-and-subscribe", "-t", f"^{topic_name}_ord", "--grouping", "/s",
                  "--projection", "/s", check=False)
    err = bad.stderr.decode().strip().splitlines()
    assert bad.returncode == 2 and "not a pattern" in err[-1], err
