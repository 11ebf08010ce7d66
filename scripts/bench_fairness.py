#!/usr/bin/env python3
"""Fair scheduling: is a quiet topic served while another topic keeps the workers busy, and
what do idle topics cost? (issue 23, item 7; ARCHITECTURE §3.6)

Starts its own redis-server on a free port (no persistence, in a temporary folder; the
machine's 6379 is never used) and W ``sow-redis worker`` processes, then measures:

* ``saturated``: topic ``busy`` (``--busy-partitions`` partitions) receives
  ``delta_publish`` batches of ``--busy-batch`` messages back to back from a publisher
  process of its own (deltas go through the workers; nothing is written through), while
  topic ``quiet`` (1 partition) receives one ``delta_publish`` every ``--probe-every-ms``
  milliseconds from this process, for ``--seconds`` seconds. For each probe: publish →
  applied (the partition's applied cursor reaching the probe's stream id, polled every
  2 ms). The rq queue length is sampled every 50 ms.
* ``idle topics``: ``--idle-topics`` topics of 8 partitions each are added to the registry,
  nothing is published, and the workers' CPU is measured over ``--idle-seconds`` seconds
  (``/proc/<pid>/stat``, per worker). Then ``--raw-probes`` raw ``XADD`` entries (no job
  marker, no job: what any Redis client may append) go to random idle topics, one at a time;
  for each: XADD → applied, found by the workers' sweep.
* The same saturated run again with the idle topics defined (``saturated, idle topics``).

Output: a table (p50 / p99 / max latency, queue length max and mean, busy messages applied,
idle CPU) and a JSON file (``--json``) with every sample and the load average beside each
phase. Example::

    .venv/bin/python scripts/bench_fairness.py --seconds 60 --idle-topics 10000
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from benchlib import ROOT, BenchError, Workers, machine_info, private_redis, proc_cpu_s, write_json
from redis import Redis
from rich.console import Console
from rich.table import Table

from sow_redis import keys
from sow_redis.apply.jobs import QUEUE_KEY
from sow_redis.client import Sow
from sow_redis.config import parse_topics
from sow_redis.registry import apply_topics
from sow_redis.settings import Settings
from sow_redis.streamids import reached

console = Console(width=max(Console().width, 132))

BUSY_PUBLISHER = """
import sys, time
from sow_redis.client import Sow
from sow_redis.settings import Settings
url, topic, batch, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
sow = Sow(settings=Settings.from_env(redis_url=url))
end, i, n = time.monotonic() + seconds, 0, 0
while time.monotonic() < end:
    sow.delta_publish(topic, [{"id": (i + j) % 20000, "f%d" % (j % 7): i} for j in range(batch)])
    i += batch
    n += batch
print(n)
"""


def _cfg(name: str, partitions: int) -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = {partitions}\n'


def _applied(r: Redis, topic: str, last_ids: dict[int, str]) -> bool:
    pipe = r.pipeline(transaction=False)
    for p in last_ids:
        pipe.hget(keys.state(topic, p), "cursor")
    return all(c is not None and reached(c.decode(), sid)
               for c, sid in zip(pipe.execute(), last_ids.values()))


def _wait_applied(r: Redis, topic: str, last_ids: dict[int, str], t0: float,
                  timeout_s: float) -> float:
    while not _applied(r, topic, last_ids):
        if time.monotonic() - t0 > timeout_s:
            return float("inf")
        time.sleep(0.002)
    return time.monotonic() - t0


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


def saturated(url: str, args: argparse.Namespace, label: str) -> dict[str, Any]:
    """One saturated run: the busy publisher process, the quiet probes, the queue samples."""
    r = Redis.from_url(url)
    sow = Sow(settings=Settings.from_env(redis_url=url))
    busy, quiet = f"busy{label}", f"quiet{label}"
    sow.apply_config(_cfg(busy, args.busy_partitions) + _cfg(quiet, 1))
    load_before = os.getloadavg()
    pub = subprocess.Popen([sys.executable, "-c", BUSY_PUBLISHER, url, busy,
                            str(args.busy_batch), str(args.seconds)],
                           cwd=str(ROOT), stdout=subprocess.PIPE)
    stop = threading.Event()
    queue: list[tuple[float, int]] = []
    t_start = time.monotonic()

    def watch() -> None:
        while not stop.is_set():
            queue.append((round(time.monotonic() - t_start, 3), int(r.llen(QUEUE_KEY))))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(1.0)  # the busy topic's workers are at it
    latencies: list[float] = []
    publish_s: list[float] = []
    n = 0
    end = t_start + args.seconds - 0.5
    while time.monotonic() < end:
        t0 = time.monotonic()
        res = sow.delta_publish(quiet, [{"id": n % 10, "v": n}])
        publish_s.append(time.monotonic() - t0)
        latencies.append(_wait_applied(r, quiet, res.last_ids, t0, 30))
        n += 1
        time.sleep(max(0.0, args.probe_every_ms / 1000 - (time.monotonic() - t0)))
    out, _err = pub.communicate(timeout=args.seconds + 120)
    stop.set()
    watcher.join(timeout=5)
    busy_sent = int(out.decode().strip() or 0)
    t_busy = time.monotonic()
    pending = {p: r.xrevrange(keys.log(busy, p), count=1) for p in range(args.busy_partitions)}
    last = {p: e[0][0].decode() for p, e in pending.items() if e}
    drain_s = _wait_applied(r, busy, last, t_busy, 300)
    lengths = [q for _t, q in queue]
    return {
        "label": f"saturated{label and ', idle topics'}",
        "probes": len(latencies),
        "p50_ms": statistics.median(latencies) * 1000 if latencies else None,
        "p99_ms": _pct(latencies, 0.99) * 1000,
        "max_ms": max(latencies) * 1000 if latencies else None,
        "publish_call_p50_ms": statistics.median(publish_s) * 1000 if publish_s else None,
        "queue_max": max(lengths) if lengths else 0,
        "queue_mean": statistics.fmean(lengths) if lengths else 0,
        "busy_sent": busy_sent,
        "busy_drain_after_s": drain_s,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "latencies_ms": [round(x * 1000, 2) for x in latencies],
        "queue_samples": queue,
    }


def define_idle(url: str, count: int) -> list[str]:
    """``count`` topics of 8 partitions in the registry (nothing published)."""
    names = [f"idle{i:05d}" for i in range(count)]
    r = Redis.from_url(url)
    for at in range(0, count, 1000):
        apply_topics(r, parse_topics("".join(_cfg(n, 8) for n in names[at:at + 1000])))
    return names


def idle_costs(url: str, ws: Workers, names: list[str], args: argparse.Namespace
               ) -> dict[str, Any]:
    """Worker CPU with only idle topics, then raw XADDs found by the sweep."""
    r = Redis.from_url(url)
    time.sleep(2.0)  # let the workers see the new registry
    load_before = os.getloadavg()
    before = [proc_cpu_s(p.pid) for p in ws.procs]
    redis_before = float(r.info("cpu")["used_cpu_sys"]) + float(r.info("cpu")["used_cpu_user"])
    time.sleep(args.idle_seconds)
    per_worker = [(proc_cpu_s(p.pid) - b) / args.idle_seconds * 100
                  for p, b in zip(ws.procs, before)]
    redis_after = float(r.info("cpu")["used_cpu_sys"]) + float(r.info("cpu")["used_cpu_user"])
    rng = random.Random(7)
    found: list[float] = []
    for _ in range(args.raw_probes):
        name = rng.choice(names)
        p = rng.randrange(8)
        t0 = time.monotonic()
        sid = r.xadd(keys.log(name, p), {"cmd": "publish", "data": b'{"id": 1}'}).decode()
        found.append(_wait_applied(r, name, {p: sid}, t0, 30))
        time.sleep(rng.uniform(0.05, 0.3))
    return {
        "label": f"{len(names):,} idle topics",
        "idle_cpu_pct_per_worker": per_worker,
        "idle_redis_cpu_pct": (redis_after - redis_before) / args.idle_seconds * 100,
        "raw_xadd_found_p50_ms": statistics.median(found) * 1000 if found else None,
        "raw_xadd_found_max_ms": max(found) * 1000 if found else None,
        "raw_xadd_found_ms": [round(x * 1000, 1) for x in found],
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--busy-partitions", type=int, default=8)
    ap.add_argument("--busy-batch", type=int, default=500)
    ap.add_argument("--probe-every-ms", type=float, default=100.0)
    ap.add_argument("--idle-topics", type=int, default=10_000)
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--raw-probes", type=int, default=20)
    ap.add_argument("--json", default="bench-results/bench_fairness.json")
    args = ap.parse_args()
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    rows: list[dict[str, Any]] = []
    with private_redis("sow-bench-fair-") as server:
        r = Redis.from_url(server.url)
        ws = Workers(server.url, args.workers, server.workdir)
        ws.start()
        try:
            ws.wait_registered(r)
            console.print(f"[dim]saturated run, {args.seconds:g} s…[/]")
            rows.append(saturated(server.url, args, ""))
            if args.idle_topics:
                console.print(f"[dim]defining {args.idle_topics:,} idle topics…[/]")
                names = define_idle(server.url, args.idle_topics)
                console.print(f"[dim]idle costs, {args.idle_seconds:g} s…[/]")
                rows.append(idle_costs(server.url, ws, names, args))
                console.print(f"[dim]saturated run with the idle topics, {args.seconds:g} s…[/]")
                rows.append(saturated(server.url, args, "2"))
            machine = machine_info(r)
        finally:
            ws.stop()
    table = Table(title=f"Fair scheduling: {args.workers} workers, busy topic of "
                        f"{args.busy_partitions} partitions ({args.busy_batch}-delta batches "
                        f"back to back), quiet topic probed every {args.probe_every_ms:g} ms")
    for col in ("phase", "probes", "p50 ms", "p99 ms", "max ms", "queue max", "queue mean",
                "busy deltas", "idle CPU % per worker", "raw XADD found p50 / max ms",
                "load avg (1 min)"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for row in rows:
        if "probes" in row:
            table.add_row(row["label"], str(row["probes"]), f"{row['p50_ms']:.0f}",
                          f"{row['p99_ms']:.0f}", f"{row['max_ms']:.0f}", str(row["queue_max"]),
                          f"{row['queue_mean']:.1f}", f"{row['busy_sent']:,}", "-", "-",
                          f"{row['loadavg_before'][0]:.2f}")
        else:
            table.add_row(row["label"], "-", "-", "-", "-", "-", "-", "-",
                          " / ".join(f"{x:.1f}" for x in row["idle_cpu_pct_per_worker"]),
                          f"{row['raw_xadd_found_p50_ms']:.0f} / "
                          f"{row['raw_xadd_found_max_ms']:.0f}",
                          f"{row['loadavg_before'][0]:.2f}")
    console.print(table)
    path = write_json(args.json, {"timestamp": started, "machine": machine,
                                  "options": vars(args), "runs": rows})
    console.print(f"[dim]JSON: {path}[/]")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        console.print(f"[red]bench_fairness: {exc}[/]")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)

