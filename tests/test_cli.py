"""The sow-redis command line against the real redis-server, with a worker process running."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import ROOT, cli_env, free_port, run_cli, start_worker

from sow_redis.model import sowkey


@pytest.fixture(scope="module")
def worker(redis_server):
    w = start_worker(redis_server)
    yield w
    w.send_signal(signal.SIGTERM)
    w.wait(timeout=30)


@pytest.fixture
def topic(url, tmp_path, topic_name, worker):
    conf = tmp_path / "sow.toml"
    conf.write_text(f'[[topic]]\nname = "{topic_name}"\nkey = ["/orderId"]\npartitions = 4\n'
                    'hash_index = [["/sym"]]\nmax_message_bytes = 100\n')
    out = run_cli(url, "config", "apply", str(conf))
    assert f"applied 1 topic(s) from {conf}: {topic_name}" in out.stdout.decode()
    return topic_name


def lines(proc):
    return [orjson.loads(x) for x in proc.stdout.splitlines()]


def test_config_apply_invalid_file_one_line_per_problem(url, tmp_path, topic_name):
    conf = tmp_path / "bad.toml"
    conf.write_text(f'[[topic]]\nname = "{topic_name}"\nkey = ["x"]\npartitions = "8"\n')
    out = run_cli(url, "config", "apply", str(conf), check=False)
    assert out.returncode == 1
    err = sorted(out.stderr.decode().splitlines())
    assert err == [
        f"error: {conf}: topic #1 '{topic_name}': 'key': field path must look like /name or /a/b, got 'x'",
        f"error: {conf}: topic #1 '{topic_name}': 'partitions' must be an integer, got a string",
    ]
    shown = run_cli(url, "config", "show").stdout.decode()
    assert topic_name not in shown


def test_publish_file_query_formats_and_rejections(url, topic, tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_bytes(b'{"orderId": 1, "sym": "IBM", "px": 120}\n'
                  b'{"orderId": 2, "sym": "MSFT", "px": 120}\n'
                  b'not json\n'
                  b'{"sym": "NOKEY"}\n'
                  b'{"orderId": 3, "pad": "' + b"x" * 120 + b'"}\n'
                  b'{"orderId": 2, "sym": "MSFT", "px": 95}\n')
    out = run_cli(url, "publish", "-t", topic, str(f), "--wait", check=False)
    assert out.returncode == 3  # some lines rejected
    err = out.stderr.decode()
    assert "rejected line 3: bad_json" in err
    assert "rejected line 4: missing_key_field: key field /orderId is missing or null" in err
    assert "rejected line 5: too_large" in err
    assert (f"published 3 message(s) to {topic}, rejected 3 (bad_json: 1, missing_key_field: 1, "
            "too_large: 1)") in out.stdout.decode()
    assert lines(run_cli(url, "sow", "-t", topic, "--order-by", "/orderId")) == [
        {"orderId": 1, "sym": "IBM", "px": 120}, {"orderId": 2, "sym": "MSFT", "px": 95}]
    got = lines(run_cli(url, "sow", "-t", topic, "-f", "/sym = 'MSFT'", "--with-key"))
    assert got[0]["sow_key"] == sowkey.generate(topic, ["2"]) and got[0]["data"]["px"] == 95
    assert got[0]["expiry_ms"] == 0 and got[0]["seq"] >= 1
    top = lines(run_cli(url, "sow", "-t", topic, "--order-by", "/px DESC", "--top-n", "1"))
    assert top == [{"orderId": 1, "sym": "IBM", "px": 120}]
    k1 = sowkey.generate(topic, ["1"])
    assert lines(run_cli(url, "sow", "-t", topic, "--keys", k1)) == [
        {"orderId": 1, "sym": "IBM", "px": 120}]
    table = run_cli(url, "sow", "-t", topic, "--format", "table").stdout.decode()
    assert "2 record(s)" in table and "MSFT" in table and "IBM" in table


def test_delta_publish_alias_and_flag(url, topic):
    run_cli(url, "publish", "-t", topic, "--wait", input=b'{"orderId": 1, "a": 1, "b": 1}\n')
    run_cli(url, "delta-publish", "-t", topic, "--wait", input=b'{"orderId": 1, "b": 2}\n')
    run_cli(url, "publish", "--delta", "-t", topic, "--wait", input=b'{"orderId": 1, "c": 3}\n')
    assert lines(run_cli(url, "sow", "-t", topic)) == [{"orderId": 1, "a": 1, "b": 2, "c": 3}]


def test_sow_delete_prints_count(url, topic):
    run_cli(url, "publish", "-t", topic, "--wait",
            input=b"".join(b'{"orderId": %d, "s": %d}\n' % (i, i % 3) for i in range(9)))
    assert run_cli(url, "sow-delete", "-t", topic, "-f", "/s = 0").stdout == \
        f"removed 3 record(s) from {topic}\n".encode()
    assert b"removed 1 record(s)" in run_cli(url, "sow-delete", "-t", topic, "--data",
                                             '{"orderId": 1}').stdout
    k2 = sowkey.generate(topic, ["2"])
    assert b"removed 1 record(s)" in run_cli(url, "sow-delete", "-t", topic, "--keys", k2).stdout
    assert b"removed 4 record(s)" in run_cli(url, "sow-delete", "-t", topic, "-f", "1=1").stdout
    out = run_cli(url, "sow-delete", "-t", topic, check=False)
    assert out.returncode == 2 and b"exactly one of --filter, --keys or --data" in out.stderr


def test_subscribe_prints_events(url, topic):
    sub = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "subscribe", "-t", topic,
                            "-f", "/px > 10", "--oof", "--count", "2", "--timeout", "30"],
                           env=cli_env(url), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ready = sub.stderr.readline().decode()  # the readiness line: subscribed from here on
    assert ready.startswith(f"live on {topic}"), ready
    run_cli(url, "publish", "-t", topic, "--wait",
            input=b'{"orderId": 1, "px": 5}\n{"orderId": 2, "px": 50}\n')
    run_cli(url, "sow-delete", "-t", topic, "-f", "/orderId = 2")
    out, err = sub.communicate(timeout=40)
    evs = [orjson.loads(x) for x in out.splitlines()]
    assert [(e["kind"], e["op"], e.get("reason"), e["data"]) for e in evs] == [
        ("publish", "publish", None, {"orderId": 2, "px": 50}),
        ("oof", "sow_delete", "deleted", {"orderId": 2, "px": 50})]
    assert all(e["bookmark"] and e["sow_key"] for e in evs)


def test_errors_lists_worker_rejections(url, r, topic):
    from sow_redis import keys

    r.xadd(keys.log(topic, 0), {"cmd": "publish", "data": b"{broken"})
    import time

    for _ in range(100):
        out = run_cli(url, "errors", "-t", topic)
        if out.stdout:
            break
        time.sleep(0.1)
    (e,) = lines(out)
    assert e["reason"] == "bad_json" and e["data"] == "{broken" and e["partition"] == "0"


def test_one_line_errors_for_user_mistakes(url, topic):
    out = run_cli(url, "sow", "-t", topic, "-f", "/a = = 1", check=False)
    assert out.returncode == 1
    assert out.stderr.decode().strip().startswith("Error: filter syntax error at column")
    assert len(out.stderr.decode().strip().splitlines()) == 1
    out = run_cli(url, "sow", "-t", "no-such-topic", check=False)
    assert out.stderr.decode().strip() == ("Error: topic 'no-such-topic' is not defined in the "
                                           "registry (run: sow-redis config apply FILE)")
    out = run_cli(url, "publish", "-t", topic, "/no/such/file.jsonl", check=False)
    assert out.returncode == 1 and "cannot read /no/such/file.jsonl" in out.stderr.decode()
    dead = f"redis://127.0.0.1:{free_port()}/0"
    out = run_cli(dead, "sow", "-t", topic, check=False)
    err = out.stderr.decode().strip()
    assert out.returncode == 1 and err.startswith(f"Error: cannot reach Redis at {dead}")
    assert len(err.splitlines()) == 1
    # a cluster URL whose node is down: an outage in one line, not an internal error
    dead_node = f"redis+cluster://127.0.0.1:{free_port()}"
    out = run_cli(dead_node, "--control-url", "redis://127.0.0.1:1/0", "sow", "-t", topic,
                  check=False)
    err = out.stderr.decode().strip()
    assert out.returncode == 1 and err.startswith(
        f"Error: cannot reach Redis at {dead_node}: no node of the Redis Cluster at "
        f"{dead_node} answers"), err
    assert len(err.splitlines()) == 1 and "internal error" not in err


def test_status_shows_records_and_pending(url, topic):
    run_cli(url, "publish", "-t", topic, "--wait", input=b'{"orderId": 1}\n{"orderId": 2}\n')
    st = [x for x in lines(run_cli(url, "status")) if x["topic"] == topic][0]
    assert st["records"] == 2 and st["pending"] == 0 and len(st["partitions"]) == 4


def test_every_command_is_documented_in_readme():
    """Every command is named in the README or in one of the guides it links (``docs/``)."""
    from sow_redis.cli import main

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    readme = "\n".join(p.read_text() for p in pages)
    names = []
    for name, cmd in main.commands.items():
        if hasattr(cmd, "commands"):
            names += [f"{name} {sub}" for sub in cmd.commands]
        else:
            names.append(name)
    missing = [n for n in names if f"sow-redis {n}" not in readme and f"sow-redis … {n}" not in readme]
    assert not missing, f"commands not in README.md or docs/*.md: {missing}"
    assert Path(ROOT / ".ci" / "run").read_text().count("scripts/test.sh") == 1


def test_keys_prints_each_partitions_log_key_for_any_redis_client(url, r, topic):
    """``sow-redis keys``: one line per partition with its slot, tag, log and live channel;
    an entry XADDed by a plain Redis client to the printed log is applied."""
    from redis.crc import key_slot

    from sow_redis.client import Sow
    from sow_redis.model.messages import parse
    from sow_redis.publish.append import wait_applied

    got = lines(run_cli(url, "keys", "-t", topic))
    assert [x["partition"] for x in got] == [0, 1, 2, 3]
    for x in got:
        assert x["log"] == x["tag"] + ":log" and x["live"] == x["tag"] + ":live"
        assert key_slot(x["log"].encode()) == x["slot"]
    sow = Sow(url)
    p = parse(b'{"orderId": 77}', sow.topic(topic)).partition
    sid = r.xadd(got[p]["log"], {"cmd": "publish", "data": '{"orderId": 77}'})
    wait_applied(r, sow.topic(topic), {p: sid.decode()}, timeout_s=30)
    assert [x.obj() for x in sow.sow(topic, "/orderId = 77")] == [{"orderId": 77}]
