"""Every CLI error path ends in one line on stderr and a non-zero exit status, and never prints
a password (issue 8 items 6, 7, 8, 11; issue 7 item 10)."""

from __future__ import annotations

import socket
import threading
import uuid

import pytest
from conftest import run_cli
from redis import Redis


def one_line_error(proc) -> str:
    err = proc.stderr.decode()
    assert proc.returncode not in (0, None), err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def cli(url, *args, **kw):
    return run_cli(url, *args, check=False, **kw)


@pytest.fixture(scope="module")
def not_redis():
    """A TCP server on loopback that answers like an HTTP server, not like Redis."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            try:
                conn.settimeout(2)
                conn.recv(1024)
                conn.sendall(b"<html>HTTP/1.0 400 Bad Request</html>\r\n")
            except OSError:
                pass
            finally:
                conn.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    yield f"redis://127.0.0.1:{srv.getsockname()[1]}/0"
    stop.set()
    th.join(2)
    srv.close()


@pytest.mark.parametrize("bad", ["notaurl", "http://127.0.0.1:1/0", "redis://127.0.0.1:1/0"])
def test_unusable_urls_are_one_line(bad):
    line = one_line_error(cli(bad, "sow", "-t", "orders"))
    assert bad in line
    assert ("invalid --redis-url" in line) or ("cannot reach Redis" in line)


def test_a_server_that_is_not_redis_is_one_line(not_redis):
    line = one_line_error(cli(not_redis, "sow", "-t", "orders"))
    assert "does not answer as a Redis server" in line or "cannot reach Redis" in line


def test_db_index_out_of_range_is_one_line(redis_server):
    url = redis_server.rsplit("/", 1)[0] + "/99"
    line = one_line_error(cli(url, "sow", "-t", "orders"))
    assert "DB index is out of range" in line


@pytest.mark.parametrize("args", [("up",), ("sow", "-t", "x"), ("config", "show"),
                                  ("worker", "--burst"), ("expirer", "--burst")])
def test_memory_url_is_refused_on_the_command_line(args):
    line = one_line_error(cli("memory://", *args))
    assert "memory://" in line and "sow-redis up" in line and "Python API" in line


def test_passwords_are_never_printed_and_auth_failures_say_so(redis_server):
    r = Redis.from_url(redis_server)
    user = f"u{uuid.uuid4().hex[:8]}"
    r.acl_setuser(user, enabled=True, passwords=["+RightPassw0rd"], keys=["*"],
                  commands=["+@all"])
    try:
        host = redis_server.split("//", 1)[1]
        wrong = f"redis://{user}:S3cretPassw0rd@{host}"
        line = one_line_error(cli(wrong, "sow", "-t", "orders"))
        assert "S3cretPassw0rd" not in line
        assert "authentication failed" in line and f"redis://{user}:***@" in line
        unreachable = "redis://alice:S3cretPassw0rd@127.0.0.1:1/0"
        line = one_line_error(cli(unreachable, "sow", "-t", "orders"))
        assert "S3cretPassw0rd" not in line and "cannot reach Redis" in line
    finally:
        r.acl_deluser(user)


def test_errors_of_an_unknown_topic_is_an_error(redis_server):
    line = one_line_error(cli(redis_server, "errors", "-t", "nosuchtopic"))
    assert "nosuchtopic" in line and "not defined" in line


def test_format_fix_is_refused_for_a_json_topic(redis_server, topic_name, tmp_path):
    cfg = tmp_path / "t.toml"
    cfg.write_text(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\n')
    run_cli(redis_server, "config", "apply", str(cfg))
    line = one_line_error(cli(redis_server, "sow", "-t", topic_name, "--format", "fix"))
    assert "--format fix needs a FIX topic" in line


def test_every_help_example_names_the_redis_it_needs():
    """Issue 8.12: the --help examples are runnable as written: each names its Redis (the
    quick start's port 6390, never the machine's 6379), or exports SOW_REDIS_URL first."""
    from click.testing import CliRunner

    from sow_redis.cli import main

    runner = CliRunner()
    commands = [[]] + [[name] for name in main.commands if name != "config"] + [
        ["config", "apply"], ["config", "show"]]
    seen = 0
    for cmd in commands:
        text = runner.invoke(main, [*cmd, "--help"]).output
        # example lines: indented command lines (prose mentioning `sow-redis x` is not one)
        lines = [ln for ln in text.splitlines()
                 if ln.lstrip().startswith(("sow-redis ", "echo ")) and "sow-redis " in ln]
        exported = "export SOW_REDIS_URL=redis://127.0.0.1:6390/0" in text
        for ln in lines:
            seen += 1
            assert exported or "--redis-url redis://127.0.0.1:6390/0" in ln, (cmd, ln)
    assert seen >= 15
