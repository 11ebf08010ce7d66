"""What the command line says, and with which exit status (issue 27, defect 7 and the smaller
items of 9): --durable without a replica, a FIX file with the wrong separator, an unknown
expirer topic, the banners and summaries of the expirer and `worker --burst`, the RECENT
bookmark error, `config show` as TOML, the group helps' examples, the dashboard on a busy
port, and no Redis password in the process list."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import client, run_cli

from sow_redis import keys
from sow_redis.cli import main
from sow_redis.config import parse_topics


def invoke(url: str, *args: str, input: bytes | None = None):
    """The CLI in this process (click's runner): output and exit status."""
    return CliRunner().invoke(main, ["--redis-url", url, *args], input=input,
                              catch_exceptions=False)


def log_len(url: str, topic: str, partitions: int) -> int:
    r = client(url)
    return sum(r.xlen(keys.log(topic, p)) for p in range(partitions))


def apply(url: str, tmp_path: Path, text: str) -> None:
    conf = tmp_path / f"{uuid.uuid4().hex[:6]}.toml"
    conf.write_text(text)
    res = invoke(url, "config", "apply", str(conf))
    assert res.exit_code == 0, res.output


# -- 7. --durable without a replica ---------------------------------------------------------
def test_durable_without_replica_says_so_at_once(lonely_url, tmp_path, topic_name):
    apply(lonely_url, tmp_path, f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\n')
    started = time.monotonic()
    res = invoke(lonely_url, "publish", "-t", topic_name, "--durable", input=b'{"id": 1}\n')
    took = time.monotonic() - started
    print(f"{took:.2f} s: {res.output}")
    assert res.exit_code == 1 and took < 5
    assert res.output.strip().splitlines() == [
        f"Error: --durable needs a replica, and the server at {lonely_url} has none (INFO "
        "replication: connected_slaves:0): nothing was published; publish without --durable "
        "or add a replica"]
    assert log_len(lonely_url, topic_name, 8) == 0


@pytest.mark.cluster
def test_durable_with_replicas_publishes(monkeypatch, tmp_path, topic_name):
    """The check lets a cluster whose primaries all have a replica through (a cluster of its
    own: the tests' shared cluster has no replicas)."""
    from conftest import _own_cluster

    gen = _own_cluster(tmp_path, replicas=1)
    url, control, _c = next(gen)
    try:
        monkeypatch.setenv("SOW_CONTROL_URL", control)
        apply(url, tmp_path, f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\n')
        res = invoke(url, "publish", "-t", topic_name, "--durable",
                     input=b'{"id": 1}\n{"id": 2}\n')
        assert res.exit_code == 0, res.output
        assert f"published 2 message(s) to {topic_name}" in res.output
    finally:
        gen.close()


# -- 9. FIX lines with another separator ------------------------------------------------------
def test_fix_file_with_the_wrong_separator_hints_and_exits_1(lonely_url, tmp_path, topic_name):
    apply(lonely_url, tmp_path, f'[[topic]]\nname = "{topic_name}"\nmessage_type = "fix"\n'
          'key = ["/37"]\n')  # separator SOH
    lines = b"".join(b"2018/02/23 19:14:25 8=FIX.4.2;9=1;35=8;37=O%d;55=IBM;38=5;10=1;\n" % i
                     for i in range(330))
    res = invoke(lonely_url, "publish", "-t", topic_name, input=lines)
    print(res.output)
    assert res.exit_code == 1
    assert "rejected 330 line(s):" in res.output
    assert "hint: the lines look separated by ';', not by SOH: try --separator ';'" in res.output
    assert "Error: nothing was published: all 330 line(s) were rejected" in res.output
    assert log_len(lonely_url, topic_name, 8) == 0
    ok = invoke(lonely_url, "publish", "-t", topic_name, "--separator", ";", input=lines)
    assert ok.exit_code == 0 and "published 330 message(s)" in ok.output
    assert "hint" not in ok.output


# -- 9. expirer and worker ------------------------------------------------------------------
def test_expirer_burst_unknown_topic_is_one_line(lonely_url):
    res = run_cli(lonely_url, "expirer", "--burst", "-t", "nosuch", check=False)
    assert res.returncode == 1 and res.stdout == b""
    assert res.stderr.decode() == ("Error: topic 'nosuch' is not defined in the registry "
                                   "(run: sow-redis config apply FILE)\n")


def test_expirer_and_worker_burst_print_a_banner_and_a_summary(lonely_url, tmp_path,
                                                                 topic_name):
    apply(lonely_url, tmp_path, f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\n'
          'expiration = "enabled"\npartitions = 2\n')
    run_cli(lonely_url, "publish", "-t", topic_name, "--expiration", "0.05",
            input=b'{"id": 1}\n{"id": 2}\n')
    w = run_cli(lonely_url, "worker", "--burst")
    err = w.stderr.decode().splitlines()
    assert err[0] == (f"worker --burst: queue 'sow' on {lonely_url}, applying to {lonely_url}; "
                      "drains every partition, then exits")
    assert err[-1].startswith("worker --burst: every partition applied (")
    time.sleep(0.1)
    e = run_cli(lonely_url, "expirer", "--burst", "-t", topic_name)
    assert e.stderr.decode().splitlines()[0] == (
        f"expirer --burst on {lonely_url}: topic(s) {topic_name}; 1 with expiration enabled "
        f"({topic_name})")
    assert e.stdout.decode() == "expired 2 record(s)\n"


# -- 9. RECENT ------------------------------------------------------------------------------
def test_recent_bookmark_error_names_the_flags(lonely_url, tmp_path, topic_name):
    apply(lonely_url, tmp_path, f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\n')
    res = invoke(lonely_url, "subscribe", "-t", topic_name, "--bookmark", "RECENT")
    assert res.exit_code == 2
    assert ("--bookmark RECENT needs the bookmark store: give --client-name and --sub-id"
            in res.output)
    assert "client_name" not in res.output and "sub_id" not in res.output


# -- 9. config show -------------------------------------------------------------------------
def test_config_show_prints_toml_that_config_apply_takes(lonely_url, tmp_path, topic_name):
    text = (f'[[topic]]\nname = "{topic_name}a"\nkey = ["/id", "/b/c"]\npartitions = 3\n'
            'hash_index = [["/x"], ["/y", "/z"]]\nexpiration = "30s"\n'
            'expiration_policy = "min"\nidle_expiration = "1h"\nmax_message_bytes = 2048\n'
            'change_retention = { age = "10m", count = 5000 }\n'
            f'[[topic]]\nname = "{topic_name}b"\nmessage_type = "fix"\nfield_separator = ";"\n'
            'key_generator = { type = "chaining", primary = "/11", secondary = ["/41"], '
            'validation = true }\npartition_by = ["/1"]\nchange_retention = 0\n'
            f'dead_letter = "{topic_name}a"\n'
            f'[[topic]]\nname = "{topic_name}c"\nkey_domain = "shared"\nkey = ["/k"]\n')
    apply(lonely_url, tmp_path, text)
    shown = invoke(lonely_url, "config", "show")
    assert shown.exit_code == 0
    mine = parse_topics(shown.output)
    want = {t.name: t for t in parse_topics(text)}
    got = {t.name: t for t in mine if t.name.startswith(topic_name)}
    assert got == want
    # and config apply takes it back as it is (nothing changes: same definitions)
    again = tmp_path / "shown.toml"
    again.write_text(shown.output)
    assert invoke(lonely_url, "config", "apply", str(again)).exit_code == 0
    as_json = invoke(lonely_url, "config", "show", "--json").output.splitlines()
    assert any(f'"name":"{topic_name}a"' in line for line in as_json)


@pytest.mark.parametrize("group", ["config", "spark"])
def test_group_help_has_an_example(group):
    out = CliRunner().invoke(main, [group, "--help"]).output
    assert "Example:" in out and f"sow-redis --redis-url redis://127.0.0.1:6390/0 {group} " in out


# -- 9. dashboard ---------------------------------------------------------------------------
def test_dashboard_on_a_busy_port_is_one_line(lonely_url):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        res = run_cli(lonely_url, "dashboard", "--port", str(port), check=False, timeout=30)
    err = res.stderr.decode()
    print(err)
    assert res.returncode == 1 and "Running on" not in err and "rq-dashboard on" not in err
    assert err.splitlines() == [
        f"Error: dashboard: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(another process uses that port: give --port)"]


# -- 9. no password in the process list -----------------------------------------------------
SECRET = "pw-in-argv-" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def with_password(lonely_server):
    """A user with a password on the module's server; yields its URL."""
    r = client(lonely_server)
    name = f"u{uuid.uuid4().hex[:6]}"
    r.acl_setuser(name, enabled=True, passwords=[f"+{SECRET}"], keys=["*"], channels=["*"],
                  commands=["+@all"])
    yield lonely_server.replace("redis://", f"redis://{name}:{SECRET}@")
    r.acl_deluser(name)


def _argvs() -> dict[int, bytes]:
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                out[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                pass
    return out


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_password_is_in_no_argv_of_up_and_its_children(with_password, tmp_path):
    data = tmp_path / "up"
    env = dict(os.environ, SOW_REDIS_URL=with_password)
    env.pop("SOW_CONTROL_URL", None)
    up = subprocess.run([sys.executable, "-m", "sow_redis.cli", "--config", "none.toml", "up",
                         "--workers", "1", "--detach", "--data-dir", str(data)],
                        env=env, capture_output=True, timeout=120)
    assert up.returncode == 0, up.stderr
    try:
        pid = int((data / "up.pid").read_text().split()[0])
        shown = [a for p, a in _argvs().items() if SECRET.encode() in a]
        ours = [a for a in _argvs().values() if b"sow_redis" in a]
        print(f"up pid {pid}; sow_redis processes: {len(ours)}")
        assert len(ours) >= 3  # up, a worker, the expirer
        assert shown == []
    finally:
        subprocess.run([sys.executable, "-m", "sow_redis.cli", "down", "--data-dir", str(data)],
                       env=env, capture_output=True, timeout=120)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_password_is_not_in_the_dashboards_argv(with_password, tmp_path):
    from test_dashboard import Dashboard

    d = Dashboard(with_password, tmp_path)
    try:
        status, _page = d.wait_page()
        assert status == 200
        argv = Path(f"/proc/{d.proc.pid}/cmdline").read_bytes()
        assert b"sow_redis.ops.dashboard" in argv and SECRET.encode() not in argv
    finally:
        d.stop()
