"""The expirer sleeps when there is nothing to do and wakes for new due times (issue 27,
defect 8): idle, it used 7-11 % of a core (a pass every 10 ms); now it passes once a second
unless a change block on a topic it serves wakes it, and a record published with a short
lifetime while it sleeps is still removed within milliseconds of its due time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_env, client, wait_until

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.connection import server_ms

pytestmark = pytest.mark.slow  # each measures seconds of an expirer process

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


@pytest.fixture
def expirer(lonely_url, topic_name):
    sow = Sow(lonely_url, inline=True)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 4\n'
                     'expiration = "enabled"\n')
    proc = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "expirer", "-t", topic_name],
                            env=cli_env(lonely_url), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    time.sleep(1.0)  # started: imports, first pass
    assert proc.poll() is None
    yield sow, proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode == 0


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_idle_expirer_uses_almost_no_cpu(expirer):
    _sow, proc = expirer
    time.sleep(1.5)  # started, first passes done
    c0, t0 = cpu_s(proc.pid), time.monotonic()
    time.sleep(4)
    share = (cpu_s(proc.pid) - c0) / (time.monotonic() - t0)
    print(f"idle expirer: {share * 100:.2f} % of a core")
    assert share < 0.02  # was 0.07-0.11 with a pass every 10 ms


def test_a_short_lifetime_published_while_it_sleeps_expires_on_time(expirer, topic_name):
    sow, _proc = expirer
    r = client(sow.url)
    lags = []
    for i in range(8):
        time.sleep(1.2)  # the expirer is in its long sleep (nothing due)
        res = sow.publish(topic_name, {"id": i}, expiration=0.15)
        (sid,) = res.last_ids.values()
        due_ms = int(sid.split("-")[0]) + 150  # the stored expiry: entry id time + lifetime

        def gone(i=i) -> bool:
            return sum(r.hlen(keys.records(topic_name, p)) for p in range(4)) == 0

        wait_until(gone, 5, f"record {i} expired", step=0.002)
        lags.append(server_ms(r) - due_ms)
    print(f"expiry lag (ms, upper bounds: polled every 2 ms): {lags}")
    # without the wake-up each lag is anywhere up to the 1 s sleep: 7 of 8 under 150 ms would
    # then happen once in 80,000 runs; one late sample is the machine (CI, stop 44: 219 ms
    # beside four of 1-8 ms)
    assert sum(lag < 150 for lag in lags) >= 7, lags
