"""Fair scheduling (issue 23, item 7): the rq queue holds at most one job per partition with
work, a saturated topic never starves a quiet one, and a stale or forged job marker never
stalls a partition for more than the lease time. Each test runs on a redis-server of its own
(the queue is the server's), with worker processes, and prints what it measured."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import pytest
from conftest import start_worker, wait_until

from sow_redis import keys
from sow_redis.apply.jobs import QUEUE_KEY
from sow_redis.client import Sow
from sow_redis.ops.server import spawn_redis_on_free_port
from sow_redis.settings import Settings

pytestmark = pytest.mark.slow


@pytest.fixture
def own_url(tmp_path: Path):
    port, proc = spawn_redis_on_free_port(tmp_path, persist=False)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


def _cfg(name: str, partitions: int) -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = {partitions}\n'


def _applied(sow: Sow, topic: str, last_ids: dict[int, str]) -> bool:
    for p, sid in last_ids.items():
        cursor = sow.r.hget(keys.state(topic, p), "cursor")
        if cursor is None:
            return False
        ms, n = (int(x) for x in cursor.decode().split("-"))
        want_ms, want_n = (int(x) for x in sid.split("-"))
        if (ms, n) < (want_ms, want_n):
            return False
    return True


@pytest.mark.serial  # a latency bound: beside 6 busy xdist workers a p99 of 1.6 s
def test_a_quiet_topic_is_served_while_another_keeps_both_workers_busy(own_url):
    """Topic A (8 partitions) gets a delta_publish of 200 messages every 0.1 s while topic B
    gets one delta every 0.1 s, with 2 workers, for 12 s: B's deltas are applied within
    1 s each (p99; scripts/bench_fairness.py measures the real figures), and the queue never
    holds more jobs than partitions with work (9)."""
    sow = Sow(settings=Settings.from_env(redis_url=own_url))
    sow.apply_config(_cfg("busy", 8) + _cfg("quiet", 1))
    workers = [start_worker(own_url) for _ in range(2)]
    stop = threading.Event()
    queue_lengths: list[int] = []
    latencies: list[float] = []
    busy_sent = [0]

    def busy() -> None:
        pub = Sow(settings=Settings.from_env(redis_url=own_url))
        i = 0
        while not stop.is_set():
            pub.delta_publish("busy", [{"id": (i + j) % 5000, f"f{j % 7}": i}
                                       for j in range(200)])
            busy_sent[0] += 200
            i += 200
            time.sleep(0.1)

    def watch() -> None:
        while not stop.is_set():
            queue_lengths.append(sow.r.llen(QUEUE_KEY))
            time.sleep(0.05)

    threads = [threading.Thread(target=busy, daemon=True), threading.Thread(target=watch,
                                                                           daemon=True)]
    try:
        wait_until(lambda: sow.r.scard("rq:workers:sow") == 2, 30, "2 workers registered")
        for t in threads:
            t.start()
        end = time.monotonic() + 12
        n = 0
        while time.monotonic() < end:
            t0 = time.monotonic()
            res = sow.delta_publish("quiet", [{"id": n % 10, "v": n}])
            while not _applied(sow, "quiet", res.last_ids):
                if time.monotonic() - t0 > 20:
                    break
                time.sleep(0.002)
            latencies.append(time.monotonic() - t0)
            n += 1
            time.sleep(max(0.0, 0.1 - (time.monotonic() - t0)))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=30)
    lat = sorted(latencies)
    p50 = statistics.median(lat)
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"\nquiet topic: {len(lat)} deltas, p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
          f"max {lat[-1] * 1000:.0f} ms; busy topic: {busy_sent[0]} deltas; queue length max "
          f"{max(queue_lengths)}, mean {statistics.fmean(queue_lengths):.1f}")
    assert len(lat) >= 50
    assert p99 < 1.0
    assert max(queue_lengths) <= 9


@pytest.mark.serial  # a bound in lease times: at the idle priority beside 6 busy xdist workers
# the unknown job's two sweeps took 3.3 s once (CI, stop 43)
@pytest.mark.parametrize("forged", ["no_ttl", "long_ttl", "unknown_job"])
def test_a_forged_job_marker_never_stalls_a_partition(own_url, forged):
    """A job marker that stands for no job (set by any client allowed to set markers: without
    a lifetime, with a long one, naming a job that does not exist) is found by the workers'
    sweep: the partition's entries are applied within the lease time."""
    settings = Settings.from_env(redis_url=own_url)
    sow = Sow(settings=settings)
    sow.apply_config(_cfg("t", 1))
    marker = keys.job_marker("t", 0)
    if forged == "no_ttl":
        sow.r.set(marker, "x")
    elif forged == "long_ttl":
        sow.r.set(marker, "x", px=3_600_000)
    else:
        sow.r.set(marker, "job:0123456789abcdef", px=60_000)
    workers = [start_worker(own_url)]  # FAST: lease 1 s, sweep every 0.2 s
    try:
        wait_until(lambda: sow.r.scard("rq:workers:sow") == 1, 30, "worker registered")
        t0 = time.monotonic()
        res = sow.delta_publish("t", [{"id": 1, "v": 1}])
        took = wait_until(lambda: _applied(sow, "t", res.last_ids), 10, "the delta applied")
    finally:
        for w in workers:
            w.terminate()
            w.wait(timeout=30)
    print(f"\nforged marker ({forged}): applied after {time.monotonic() - t0:.2f} s")
    assert took < 1.5
