"""The command line as a Unix tool (issue 27, defects 1 and 2, and the slow stream and table
width of item 9): a closed pipe ends a command quietly, Ctrl-C ends it with the counts of
what was done, a slow input stream is published as it arrives, and a table written to a pipe
keeps its full width. These run the real process: pipes and signals are the point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import cli_env, client, run_cli, wait_until

from sow_redis import keys

EXIT_PIPE, EXIT_INTERRUPTED = 141, 130


def cfg(name: str, partitions: int = 2) -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = {partitions}\n'


@pytest.fixture
def topic(lonely_url, tmp_path, topic_name):
    """A topic on the module's server without workers (what is appended stays in the log)."""
    conf = tmp_path / "sow.toml"
    conf.write_text(cfg(topic_name))
    run_cli(lonely_url, "config", "apply", str(conf))
    return topic_name


def log_len(url: str, topic: str, partitions: int = 2) -> int:
    r = client(url)
    return sum(r.xlen(keys.log(topic, p)) for p in range(partitions))


def _holds_sigint(pid: int) -> bool:
    """Whether process ``pid`` runs ``sow_redis.cli`` past :func:`sow_redis.cli.interrupt.hold`:
    its command line names the module (between fork and exec the child still has the test
    process's), and it has loaded ``xxhash``'s extension, which the CLI's imports load after
    ``hold()`` (``sow_redis`` itself does not). A SIGINT before that lands in Python's own
    start-up (``site``) or its default action, as in any program; on a busy machine that
    start-up alone took more than the 0.3 s this test used to wait."""
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        if b"sow_redis.cli" not in fh.read():
            return False
    with open(f"/proc/{pid}/maps", "rb") as fh:
        return b"xxhash" in fh.read()


def spawn(url: str, *args: str, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
          **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sow_redis.cli", *args], stdin=stdin,
                            stdout=stdout, stderr=subprocess.PIPE, env=cli_env(url, **extra))


def closed_pipe() -> int:
    """The write end of a pipe whose reader is gone: the first write fails (EPIPE)."""
    r, w = os.pipe()
    os.close(r)
    return w


# -- 1. a closed pipe ---------------------------------------------------------------------
@pytest.mark.parametrize("args", [("sow", "-t", "TOPIC"), ("status",),
                                  ("sow", "-t", "TOPIC", "--format", "table")])
def test_closed_stdout_ends_quietly_with_141(lonely_url, topic, args):
    """`sow-redis sow -t T | head -2`, `status | head -1`: the reader went away; the command
    ends without an error line, with status 141 (as a tool that SIGPIPE ended)."""
    run_cli(lonely_url, "publish", "-t", topic, input=b'{"id": 1}\n{"id": 2}\n')
    run_cli(lonely_url, "worker", "--burst")
    w = closed_pipe()
    try:
        proc = spawn(lonely_url, *(topic if a == "TOPIC" else a for a in args), stdout=w)
    finally:
        os.close(w)
    _out, err = proc.communicate(timeout=60)
    assert err.decode() == "" and proc.returncode == EXIT_PIPE, (proc.returncode, err)


def test_head_of_a_long_query_ends_quietly(lonely_url, topic):
    """`sow -t T | head -2` for real: the first two lines, then status 141, no error."""
    lines = b"".join(b'{"id": %d, "pad": "%s"}\n' % (i, b"x" * 200) for i in range(3000))
    run_cli(lonely_url, "publish", "-t", topic, input=lines)
    run_cli(lonely_url, "worker", "--burst")
    proc = spawn(lonely_url, "sow", "-t", topic)
    first = [proc.stdout.readline() for _ in range(2)]
    proc.stdout.close()
    proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    assert all(x.startswith(b'{"id":') for x in first)
    assert err == "" and proc.returncode == EXIT_PIPE, (proc.returncode, err)


def test_subscribe_into_a_closed_pipe_ends_quietly(lonely_url, topic):
    w = closed_pipe()
    try:
        proc = spawn(lonely_url, "subscribe", "-t", topic, "--timeout", "30", stdout=w)
    finally:
        os.close(w)
    ready = proc.stderr.readline().decode()
    assert ready.startswith(f"live on {topic} (2 partition(s))"), ready
    run_cli(lonely_url, "publish", "-t", topic, input=b'{"id": 7}\n')
    run_cli(lonely_url, "worker", "--burst")
    proc.wait(timeout=30)
    err = proc.stderr.read().decode()
    assert err == "" and proc.returncode == EXIT_PIPE, (proc.returncode, err)


# -- 2. Ctrl-C on the commands that run until stopped --------------------------------
@pytest.mark.parametrize("args", [("stats", "--watch", "--json", "--interval", "0.2"),
                                  ("subscribe", "-t", "TOPIC")])
def test_ctrl_c_ends_watching_commands_with_0(lonely_url, topic, args):
    """`stats --watch` and `subscribe` run until stopped: Ctrl-C ends them with status 0
    and no `Aborted!` (subscribe: once it said it is live)."""
    proc = spawn(lonely_url, *(topic if a == "TOPIC" else a for a in args))
    if args[0] == "subscribe":
        assert proc.stderr.readline().decode().startswith(f"live on {topic}")
    else:
        assert proc.stdout.readline().startswith(b"{")
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Aborted!" not in err.decode() and "Traceback" not in err.decode()


def test_ctrl_c_while_subscribe_starts_is_quiet(lonely_url, topic):
    """SIGINT 0.3 s after the command line holds it (sow_redis.cli.interrupt, while it imports
    its modules): it may still be importing, or be connecting or subscribing: status 0
    either way, no traceback, no `Aborted!`."""
    proc = spawn(lonely_url, "subscribe", "-t", topic)
    wait_until(lambda: _holds_sigint(proc.pid), 30, "the command line's SIGINT hold")
    time.sleep(0.3)  # importing, connecting or subscribing
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Aborted!" not in err.decode(), err


def test_subscribe_says_when_it_is_live(lonely_url, topic):
    """The readiness line on stderr: a publish sent after it is received."""
    proc = spawn(lonely_url, "subscribe", "-t", topic, "--count", "1", "--timeout", "20")
    ready = proc.stderr.readline().decode()
    assert ready.startswith(f"live on {topic} (2 partition(s)): every change from now on")
    run_cli(lonely_url, "publish", "-t", topic, input=b'{"id": 42}\n')
    run_cli(lonely_url, "worker", "--burst")
    out, _err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and b'"id":42' in out


# -- 2 and 9. publish: Ctrl-C, a slow input stream -----------------------------------
def test_ctrl_c_during_publish_of_a_file_prints_the_counts(lonely_url, topic, tmp_path):
    """SIGINT while a big file is being published: the lines read are still sent, then the
    counts (appended, rejected, not sent) and status 130, never `Aborted!`."""
    n = 400_000
    f = tmp_path / "big.jsonl"
    f.write_bytes(b"".join(b'{"id": %d}\n' % i if i % 1000 else b"bad\n" for i in range(1, n + 1)))
    proc = spawn(lonely_url, "publish", "-t", topic, str(f))
    wait_until(lambda: log_len(lonely_url, topic) > 2000, 60, "publish started")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    out, err = out.decode(), err.decode()
    print(out, err)
    assert proc.returncode == EXIT_INTERRUPTED, (proc.returncode, err)
    assert "Aborted!" not in err and "Traceback" not in err
    import re

    m = re.search(r"published (\d+) message\(s\) to \S+, rejected (\d+) .*; read (\d+) line",
                  out)
    assert m, out
    published, rejected, read = map(int, m.groups())
    assert published == log_len(lonely_url, topic)  # what it says is what is in the log
    assert published + rejected == read < n
    assert rejected == read // 1000
    stop = re.search(rf"interrupted: appended {published} message\(s\) to the log of {topic} "
                     rf"\(they will be applied\), rejected {rejected}; not sent: (\d+) line\(s\) "
                     rf"of {re.escape(str(f))} after line {read}", err)
    assert stop, err
    assert int(stop.group(1)) == n - read


@pytest.mark.serial  # each line within 1.5 s of its arrival: bound to wall-clock time
def test_ctrl_c_on_a_slow_stream_sends_what_arrived(lonely_url, topic):
    """`tail -f log | publish -`: each line is published within 0.2 s of its arrival (not
    held back for a block of 1,000-10,000), and Ctrl-C ends with the counts, status 130."""
    proc = spawn(lonely_url, "publish", "-t", topic, "-", stdin=subprocess.PIPE)
    assert proc.stdin is not None
    for i in range(3):
        sent = time.monotonic()
        proc.stdin.write(b'{"id": %d}\n' % i)
        proc.stdin.flush()
        took = wait_until(lambda i=i: log_len(lonely_url, topic) == i + 1, 10,
                          f"line {i + 1} published")
        print(f"line {i + 1}: in the log after {took * 1000:.0f} ms")
        assert time.monotonic() - sent < 1.5  # 0.2 s, plus a slow start-up for the first
    proc.stdin.write(b'{"id": ')  # half a line: not sent
    proc.stdin.flush()
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert "Aborted!" not in err.decode()
    assert f"published 3 message(s) to {topic}, rejected 0; read 3 line(s)" in out.decode()
    assert (f"interrupted: appended 3 message(s) to the log of {topic} (they will be applied), "
            "rejected 0; not sent: the rest of standard input after line 3") in err.decode()
    assert log_len(lonely_url, topic) == 3


def test_slow_stream_then_end_of_input_exits_0(lonely_url, topic):
    proc = spawn(lonely_url, "publish", "-t", topic, "-", stdin=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(b'{"id": 1}\n{"id": 2}\n')
    proc.stdin.flush()
    wait_until(lambda: log_len(lonely_url, topic) == 2, 10, "two lines published")
    proc.stdin.write(b'{"id": 3}')  # the last line without a line break
    proc.stdin.close()
    proc.wait(timeout=30)
    out, err = proc.stdout.read(), proc.stderr.read()
    assert proc.returncode == 0, err
    assert f"published 3 message(s) to {topic}, rejected 0; read 3 line(s)" in out.decode()


# -- 9. a table in a pipe -------------------------------------------------------------------
def test_table_into_a_pipe_keeps_every_column_whole(lonely_url, topic):
    wide = {f"column_{i}": f"value-{i}-" + "x" * 10 for i in range(12)}
    import orjson

    run_cli(lonely_url, "publish", "-t", topic, input=orjson.dumps({"id": 1, **wide}) + b"\n")
    run_cli(lonely_url, "worker", "--burst")
    out = run_cli(lonely_url, "sow", "-t", topic, "--format", "table").stdout.decode()
    print(out)
    assert "…" not in out
    for name, value in wide.items():
        assert name in out and value in out
