"""No secret in output (issue 12 item 5): with a URL holding a password, every CLI failure
path (wrong password, unreachable server, bad URL, refused command), with and without
``SOW_DEBUG=1`` (tracebacks), and the logs of long-running workers and expirers, print the
password nowhere: not in stdout, stderr or the log lines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from urllib.parse import quote

import pytest
from conftest import FAST, sow_redis_cli
from redis import Redis

SECRET = "S3cr3t-xyzzy"
"""The password of the test users, and the text that must never be printed."""

ODD_SECRET = "p@ss:w/rd S3cr3t?#%"
"""A password that needs percent-encoding in a URL: neither its encoded nor its decoded form
may be printed."""

COMMANDS = [
    ("sow", "-t", "orders"),
    ("sow-delete", "-t", "orders", "--keys", "a"),
    ("publish", "-t", "orders"),
    ("config", "apply", "CONFIG"),
    ("config", "show"),
    ("stats",),
    ("status",),
    ("errors", "-t", "orders"),
    ("chains", "-t", "orders"),
    ("subscribe", "-t", "orders", "--count", "1", "--timeout", "1"),
    ("worker", "--burst"),
    ("expirer", "--burst"),
]
"""Every command that talks to Redis and returns (long-running ones: see the log tests)."""


def _forms(secret: str) -> list[str]:
    return [secret, quote(secret, safe=""), quote(secret)]


def _run(url: str, args: tuple[str, ...], cfg: str, process: bool = False,
         **env: str) -> subprocess.CompletedProcess:
    """The command's exit status and output: in this process where :func:`sow_redis_cli`
    can (what the command prints is under test, not the process), else as a process."""
    args = tuple(cfg if a == "CONFIG" else a for a in args)
    return sow_redis_cli(dict(os.environ, SOW_REDIS_URL=url, **FAST, **env), *args,
                         input=b'{"id": 1}\n', timeout=60, process=process)


@pytest.fixture(scope="module")
def users(redis_server):
    """Users on the session's redis-server: ``alice`` (all rights, password SECRET),
    ``odd`` (all rights, password ODD_SECRET), ``bob`` (password SECRET, may only connect).
    Yields the ``host:port`` part."""
    r = Redis.from_url(redis_server)
    tag = uuid.uuid4().hex[:6]
    names = {"alice": f"alice{tag}", "odd": f"odd{tag}", "bob": f"bob{tag}"}
    r.acl_setuser(names["alice"], enabled=True, passwords=[f"+{SECRET}"], keys=["*"],
                  channels=["*"], commands=["+@all"])
    r.acl_setuser(names["odd"], enabled=True, passwords=[f"+{ODD_SECRET}"], keys=["*"],
                  channels=["*"], commands=["+@all"])
    r.acl_setuser(names["bob"], enabled=True, passwords=[f"+{SECRET}"],
                  commands=["+ping", "+hello", "+client|setname"])
    yield redis_server.split("//", 1)[1].rsplit("/", 1)[0], names
    for name in names.values():
        r.acl_deluser(name)


def _failing_urls(hostport: str, names: dict[str, str]) -> dict[str, str]:
    alice, bob = names["alice"], names["bob"]
    return {
        "wrong password": f"redis://{alice}:WRONG{SECRET}@{hostport}/0",
        "wrong odd password": f"redis://{alice}:{quote(ODD_SECRET + 'x', safe='')}@{hostport}/0",
        "unreachable": f"redis://{alice}:{SECRET}@127.0.0.1:1/0",
        "port out of range": f"redis://{alice}:{SECRET}@127.0.0.1:99999/0",
        "port not a number": f"redis://{alice}:{SECRET}@127.0.0.1:port/0",
        "not a redis scheme": f"http://{alice}:{SECRET}@{hostport}/0",
        "unparsable": f"redis://{alice}:{SECRET}@[::1/0",
        "unknown option": f"redis://{alice}:{SECRET}@{hostport}/0?ssl_ca_cert=/x",
        "bad option value": f"redis://{alice}:{SECRET}@{hostport}/0?socket_timeout=soon",
        "password option": f"redis://{hostport}/0?password={SECRET}&ssl_ca_cert=x",
        "refused command": f"redis://{bob}:{SECRET}@{hostport}/0",
    }


@pytest.mark.slow  # 60 command runs, workers and expirers as processes
def test_every_failure_path_is_one_line_without_the_password(users, tmp_path):
    hostport, names = users
    cfg = tmp_path / "sow.toml"
    cfg.write_text('[[topic]]\nname = "orders"\nkey = ["/id"]\n')
    seen: dict[str, set[str]] = {}
    runs = 0
    for kind, url in _failing_urls(hostport, names).items():
        commands = COMMANDS if kind in ("wrong password", "refused command") else COMMANDS[:1] + [
            ("publish", "-t", "orders"), ("worker", "--burst"), ("expirer", "--burst")]
        for args in commands:
            out = _run(url, args, str(cfg))
            runs += 1
            text = out.stdout.decode() + out.stderr.decode()
            for form in _forms(SECRET) + _forms(ODD_SECRET + "x"):
                assert form not in text, (kind, args, text)
            err = out.stderr.decode().strip().splitlines()
            assert out.returncode == 1 and len(err) == 1 and "Traceback" not in text, (
                kind, args, text)
            seen.setdefault(kind, set()).add(err[0].split(":", 2)[1].strip()[:30])
    for kind, firsts in seen.items():
        print(f"{kind}: {sorted(firsts)}")
    print(f"{runs} failing command runs, no password printed")
    assert "authentication failed at redis" in " ".join(seen["wrong password"])


def test_debug_tracebacks_hold_no_password(users, tmp_path):
    """SOW_DEBUG=1 lets an internal error's traceback through: still no password."""
    hostport, names = users
    urls = _failing_urls(hostport, names)
    for kind in ("wrong password", "unreachable", "refused command", "unknown option"):
        for args in (("sow", "-t", "orders"), ("worker", "--burst")):
            out = _run(urls[kind], args, "", process=True, SOW_DEBUG="1")  # as Python prints it
            text = out.stdout.decode() + out.stderr.decode()
            assert out.returncode != 0 and SECRET not in text, (kind, args, text)


def test_a_good_url_with_a_password_is_never_printed(users, tmp_path):
    """Working commands with a password URL: their output and DEBUG logs hold no password;
    an odd password (percent-encoded in the URL) works."""
    hostport, names = users
    url = f"redis://{names['odd']}:{quote(ODD_SECRET, safe='')}@{hostport}/0"
    topic = f"t{uuid.uuid4().hex[:8]}"
    cfg = tmp_path / "sow.toml"
    cfg.write_text(f'[[topic]]\nname = "{topic}"\nkey = ["/id"]\n')
    texts = []
    for args in (("config", "apply", str(cfg)), ("publish", "-t", topic),
                 ("--log-level", "DEBUG", "worker", "--burst"), ("sow", "-t", topic),
                 ("--log-level", "DEBUG", "expirer", "--burst"), ("stats",), ("status",)):
        out = _run(url, args, str(cfg))
        assert out.returncode == 0, (args, out.stderr)
        texts.append(out.stdout.decode() + out.stderr.decode())
    assert texts[3] == '{"id": 1}\n'
    for form in _forms(ODD_SECRET):
        assert form not in "".join(texts)


def _log_lines(url: str, args: tuple[str, ...], want: tuple[str, ...],
               limit_s: float = 30) -> list[str]:
    """Run a long-running command until it printed a line holding one of ``want`` (at most
    ``limit_s`` seconds; a start-up line may come alone first), stop it with SIGTERM, and
    return every line it printed."""
    proc = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", *args],
                            env=dict(os.environ, SOW_REDIS_URL=url, **FAST),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    deadline = time.monotonic() + limit_s
    try:
        os.set_blocking(proc.stdout.fileno(), False)
        buf = b""
        while not any(w in line for line in lines for w in want) and \
                time.monotonic() < deadline and proc.poll() is None:
            chunk = proc.stdout.read() or b""
            buf += chunk
            *done, buf = buf.split(b"\n")
            lines += [x.decode() for x in done]
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    return lines + [x for x in (buf + (rest or b"")).decode().splitlines()]


@pytest.mark.slow
def test_worker_and_expirer_logs_hold_no_password(users):
    """Long-running workers and expirers that cannot get in (wrong password, no server)
    report it (once per outage: sow_redis.outage), with no password in the line, text or
    JSON."""
    hostport, names = users
    urls = _failing_urls(hostport, names)
    counts = {}
    for kind in ("wrong password", "unreachable", "wrong odd password"):
        for args in (("worker",), ("expirer",), ("--log-json", "worker"),
                     ("--log-level", "DEBUG", "expirer")):
            lines = _log_lines(urls[kind], args, want=("unreachable", "authentication"))
            text = "\n".join(lines)
            counts[f"{kind} {' '.join(args)}"] = len(lines)
            assert len(lines) >= 1, (kind, args, text)
            assert "unreachable" in text or "authentication" in text, (kind, args, text)
            for form in _forms(SECRET) + _forms(ODD_SECRET + "x"):
                assert form not in text, (kind, args, text)
            assert "Traceback" not in text, (kind, args, text)
    print(counts)


def test_up_never_prints_the_password_and_keeps_its_pidfile_private(tmp_path):
    from sow_redis.errors import SowError
    from sow_redis.ops.server import read_pidfile, start_redis, write_pidfile

    url = f"redis://alice:{SECRET}@192.0.2.1:6390/0"  # TEST-NET-1: not local
    with pytest.raises(SowError) as info:
        start_redis(url, str(tmp_path))
    print(info.value)
    assert SECRET not in str(info.value) and "alice:***@192.0.2.1" in str(info.value)
    path = write_pidfile(tmp_path, url, [1, 2])
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_pidfile(tmp_path).redis_url == url  # `down` needs the password
