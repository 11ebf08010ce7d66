#!/usr/bin/env python3
"""Read-your-writes latency: ``Sow.publish(..., wait=True)`` of one message, idle workers.

Starts its own redis-server on a free loopback port (``--save "" --appendonly no``, in a
temporary folder; never 6379). For each worker count W of ``--workers`` and each linger of
``--linger-ms`` (``SOW_LINGER_MS`` of the workers; ``default`` = the library's), it starts W
``sow-redis worker`` processes (rq registered, start-up excluded), then for each gap of
``--gap-ms`` runs ``--tries`` tries on a fresh topic (``key = ["/id"]``, ``--partitions``
partitions), each with a new ``id`` (so the partitions vary), ``gap`` ms apart:

* ``api``: ``Sow.publish(topic, msg, wait=True)`` through the Python API, as a user calls it
  (``wait_applied`` polls the cursor every 10 ms); the time of the call is the latency.
* ``steps``: the same steps done one by one, timed (registry read; ``append`` = XADD and the
  ``last_used`` HSET; ``ensure_jobs`` = job marker SET NX and the rq enqueue, or nothing when
  a job is still outstanding, e.g. lingering on the partition), then the partition's lease
  and cursor polled every 0.2 ms: ``→ lease`` = until a job holds the partition's lease (rq
  dequeue + job start-up; 0 when a lingering job already held it), ``→ applied`` = until the
  cursor covers the message. ``wait 10 ms`` = what the API's 10 ms poll adds on top (the
  ``api`` latency minus the ``steps`` applied time, medians).

A gap longer than the linger (e.g. 100 ms against 50) makes every try find its workers idle
(no job lingering anywhere): the pure cold path. A gap of 0 is back-to-back publishing.

Prints p50 / p99 / max in ms per configuration and writes JSON (``--json``). This is a
benchmark, not a test: the figures depend on the machine's load.

Example::

    .venv/bin/python scripts/bench_wait.py --tries 200 --workers 1,2 --gap-ms 0,100
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
import uuid
from typing import Any

import orjson
from bench_ingest import topic_config
from benchlib import BenchError, Workers, machine_info, private_redis, write_json
from redis import Redis
from rich.console import Console
from rich.table import Table

from sow_redis import keys
from sow_redis.apply.jobs import ensure_jobs
from sow_redis.client import Sow
from sow_redis.publish.append import append
from sow_redis.registry import apply_topics, get_topic
from sow_redis.settings import Settings

console = Console(width=140)
FINE_POLL_S = 0.0002
"""Poll interval (seconds) of the lease and cursor in the ``steps`` tries."""


def pct(xs: list[float], q: float) -> float:
    """The q-th percentile (0-100, nearest rank) of ``xs``."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def summary(xs: list[float]) -> dict[str, float]:
    return {"p50": pct(xs, 50), "p99": pct(xs, 99), "max": max(xs), "mean": statistics.fmean(xs)}


def message(i: int) -> bytes:
    return orjson.dumps({"id": i, "price": 1.5, "qty": 7, "symbol": "MSFT", "pad": "x" * 120})


def api_tries(sow: Sow, topic: str, tries: int, gap_s: float, first_id: int) -> list[float]:
    out = []
    for i in range(tries):
        t0 = time.perf_counter()
        res = sow.publish(topic, message(first_id + i), wait=True, timeout=30)
        out.append(1000 * (time.perf_counter() - t0))
        if res.published != 1:
            raise BenchError(f"publish: {res}")
        time.sleep(gap_s)
    return out


def step_tries(r: Redis, settings: Settings, topic: str, tries: int, gap_s: float,
               first_id: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k in ("registry", "append", "ensure_jobs",
                                                   "to_lease", "to_applied", "total")}
    out["enqueued"] = []
    for i in range(tries):
        t0 = time.perf_counter()
        t = get_topic(r, topic)
        t1 = time.perf_counter()
        res = append(r, t, [("publish", message(first_id + i), None)])
        t2 = time.perf_counter()
        enq = ensure_jobs(r, t.name, list(res.last_ids), settings)
        t3 = time.perf_counter()
        (p, sid), = res.last_ids.items()
        want = tuple(int(x) for x in sid.split("-"))
        lease_at = None
        deadline = t3 + 30
        while True:
            pipe = r.pipeline(transaction=False)
            pipe.exists(keys.lease(t.name, p))
            pipe.hget(keys.state(t.name, p), "cursor")
            leased, cur = pipe.execute()
            now = time.perf_counter()
            if leased and lease_at is None:
                lease_at = now
            if cur is not None and tuple(int(x) for x in cur.split(b"-")) >= want:
                break
            if now > deadline:
                raise BenchError(f"{topic}[{p}] not applied after 30 s")
            time.sleep(FINE_POLL_S)
        lease_at = lease_at or now
        ms = 1000.0
        out["registry"].append(ms * (t1 - t0))
        out["append"].append(ms * (t2 - t1))
        out["ensure_jobs"].append(ms * (t3 - t2))
        out["to_lease"].append(ms * (lease_at - t3))
        out["to_applied"].append(ms * (now - t3))
        out["total"].append(ms * (now - t0))
        out["enqueued"].append(float(enq))
        time.sleep(gap_s)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--tries", type=int, default=200)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--linger-ms", default="default",
                    help="comma-separated SOW_LINGER_MS values for the workers")
    ap.add_argument("--gap-ms", default="0,100", help="comma-separated pauses between tries")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--json", default="bench-results/bench_wait.json")
    a = ap.parse_args(argv)
    wcounts = [int(x) for x in a.workers.split(",") if x]
    lingers = [x for x in a.linger_ms.split(",") if x]
    gaps = [float(x) for x in a.gap_ms.split(",") if x]
    rows: list[dict[str, Any]] = []
    try:
        with private_redis("sow-lat-") as server:
            tmp = server.workdir
            r = Redis.from_url(server.url)
            settings = Settings.from_env(redis_url=server.url)
            sow = Sow(settings=settings)
            next_id = 0
            for w in wcounts:
                for linger in lingers:
                    env_before = os.environ.get("SOW_LINGER_MS")
                    if linger != "default":
                        os.environ["SOW_LINGER_MS"] = linger
                    ws = Workers(server.url, w, tmp, {"SOW_BATCH_SIZE": str(settings.batch_size)})
                    if env_before is None:
                        os.environ.pop("SOW_LINGER_MS", None)
                    else:
                        os.environ["SOW_LINGER_MS"] = env_before
                    try:
                        ws.start()
                        ws.wait_registered(r)
                        time.sleep(0.5)
                        for gap in gaps:
                            t = topic_config(f"lat_{uuid.uuid4().hex[:8]}", a.partitions)
                            apply_topics(r, [t])
                            api = api_tries(sow, t.name, a.tries, gap / 1000, next_id)
                            next_id += a.tries
                            steps = step_tries(r, settings, t.name, a.tries, gap / 1000, next_id)
                            next_id += a.tries
                            lg = (settings.linger_ms if linger == "default" else int(linger))
                            row = {"workers": w, "linger_ms": lg, "gap_ms": gap,
                                   "api_ms": summary(api),
                                   "steps_ms": {k: summary(v) for k, v in steps.items()
                                                if k != "enqueued"},
                                   "enqueued_share": statistics.fmean(steps["enqueued"]),
                                   "api_raw_ms": api, "steps_raw_ms": steps}
                            rows.append(row)
                            console.print(
                                f"W={w} linger={lg} ms gap={gap:g} ms: api p50 "
                                f"{row['api_ms']['p50']:.1f} p99 {row['api_ms']['p99']:.1f} "
                                f"max {row['api_ms']['max']:.1f} ms; steps applied p50 "
                                f"{row['steps_ms']['total']['p50']:.1f} p99 "
                                f"{row['steps_ms']['total']['p99']:.1f} ms")
                    finally:
                        ws.stop()
            table = Table(title=f"publish(wait=True) of one message, {a.tries} tries, "
                                f"{a.partitions} partitions (ms)")
            for col in ("W", "linger", "gap", "api p50", "api p99", "api max", "registry",
                        "append", "ensure_jobs", "job enqueued", "→ lease p50/p99",
                        "→ applied p50/p99", "wait 10 ms"):
                table.add_column(col, justify="right")
            for x in rows:
                s = x["steps_ms"]
                table.add_row(
                    str(x["workers"]), str(x["linger_ms"]), f"{x['gap_ms']:g}",
                    f"{x['api_ms']['p50']:.1f}", f"{x['api_ms']['p99']:.1f}",
                    f"{x['api_ms']['max']:.1f}", f"{s['registry']['p50']:.2f}",
                    f"{s['append']['p50']:.2f}", f"{s['ensure_jobs']['p50']:.2f}",
                    f"{100 * x['enqueued_share']:.0f} %",
                    f"{s['to_lease']['p50']:.1f}/{s['to_lease']['p99']:.1f}",
                    f"{s['to_applied']['p50']:.1f}/{s['to_applied']['p99']:.1f}",
                    f"{x['api_ms']['p50'] - s['total']['p50']:.1f}")
            console.print(table)
            result = {
                "benchmark": "bench_wait",
                "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": machine_info(r),
                "options": vars(a), "rows": rows,
            }
            console.print(f"results written to {write_json(a.json, result)}")
            return 0
    except BenchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
