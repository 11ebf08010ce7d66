#!/usr/bin/env python3
"""Range (memo) indexes (``index = ["/px"]``, issue 25.3) against a scan, their cost at
ingest, and paging (``--top-n N --skip-n M``), in one run on the same data.

Starts its own redis-server on a free port (no persistence; the machine's 6379 is never
used) and generates N JSON records once (``id`` 0..N-1, ``px`` uniform in [0, 1000),
``time`` an increasing ms timestamp, some padding). Its parts:

* ``ingest``: for each of ``--runs`` rounds, the N messages published (write-through: each
  1,000-message chunk appended and applied by one apply.lua call, as bench_previous.py) to a
  fresh topic with 0, 1 (``/px``) and 2 (``/px``, ``/time``) range indexes and, for
  reference, one hash index (``/sym``), alternating the order; messages per second (wall, the publisher's member computation included) and
  redis-server CPU µs per message, each against the topic without index. Then the same
  variants' apply.lua calls, captured as the publisher sent them, replayed one at a time on
  the emptied topic: redis-server's CPU per message with no publisher sharing the cores
  (``ingest_redis_alone``).
* ``updates``: for each round, the N records published to a fresh topic without index and
  to one with ``index = ["/px"]`` (not timed), then an update of each (timed, as ``ingest``):
  ``px kept`` (the padding changed, the indexed value not: as most updates of an order) and,
  on fresh topics again, ``px moved`` (a new uniform value: as a quote's price), each
  against the topic without index (``ingest_updates``).
* ``query``: the records loaded once into a topic with ``index = ["/px"]`` and into its twin
  without; ``/px < X`` at a few selectivities (0.1 %, 1 %, 10 %, 50 %, 90 %) run ``--runs``
  times on each: the indexed one reads the index (forced above the planner's
  ``MAX_INDEX_FRACTION``; its plan is checked), the twin scans. Both must return the same
  records. The ``planner`` column is what the planner picks by itself (index or scan).
* ``memory``: bytes per record of the range index and of the hash of index members per SOW
  key, against the records hash (``MEMORY USAGE``).
* ``paging``: ``top_n = 100`` with ``skip_n`` 0, 10 % and 90 % of N on the indexed topic
  without and with ``order_by = "/px"`` (a page without order-by stops reading once it is
  full; with one, every match is read and sorted first).

Query times are the median over the runs, in ms, of ``sow_redis.query.sow.query`` called in
this process (read, decode, filter; no CLI start-up). The load average is printed with them.

Output: tables and a JSON file (``--json``). Example::

    .venv/bin/python scripts/bench_query.py --n 100000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from benchlib import (applied_counts, apply_calls, machine_info, private_redis, redis_cpu_s,
                      write_json)
from redis import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sow_redis import keys  # noqa: E402
from sow_redis.config import parse_topics  # noqa: E402
from sow_redis.model.topic import TopicConfig  # noqa: E402
from sow_redis.publish.append import append  # noqa: E402
from sow_redis.query.filter import compile_filter  # noqa: E402
from sow_redis.query import sow as sow_module  # noqa: E402
from sow_redis.query.sow import plan_query, query  # noqa: E402
from sow_redis.registry import apply_topics  # noqa: E402
from sow_redis.settings import Settings  # noqa: E402

SETTINGS = Settings.from_env()
INDEXES = {"none": "", "1 index": 'index = ["/px"]', "2 indexes": 'index = ["/px", "/time"]',
           "1 hash index": 'hash_index = [["/sym"]]'}
"""The ingest variants: extra lines of the topic's definition (a hash index for reference: the
bookkeeping of the members per SOW key is the same for both kinds)."""
DEFAULT_FRACTION = sow_module.MAX_INDEX_FRACTION
SELECTIVITY = (0.001, 0.01, 0.1, 0.5, 0.9)
"""Fractions of the records ``/px < 1000 * s`` matches (px is uniform in [0, 1000))."""


def make_messages(n: int, size: int) -> list[bytes]:
    rnd = random.Random(25)
    out = []
    for i in range(n):
        obj: dict[str, Any] = {"id": i, "px": round(rnd.uniform(0, 1000), 4),
                               "time": 1_700_000_000_000 + i * 7, "sym": f"S{i % 500}",
                               "pad": ""}
        obj["pad"] = "x" * max(0, size - len(orjson.dumps(obj)))
        out.append(orjson.dumps(obj))
    return out


def updated_messages(msgs: list[bytes], moved: bool) -> list[bytes]:
    """An update of each of ``msgs`` (same ``id``): ``px`` kept and the padding changed (a
    record whose indexed value stays, as most of an order's updates), or ``moved`` to a new
    uniform value (as a quote's price)."""
    rnd = random.Random(2525)
    out = []
    for m in msgs:
        obj = orjson.loads(m)
        if moved:
            obj["px"] = round(rnd.uniform(0, 1000), 4)
        obj["pad"] = "y" * len(obj["pad"])
        out.append(orjson.dumps(obj))
    return out


def topic(prefix: str, partitions: int, extra: str) -> TopicConfig:
    return parse_topics(f'[[topic]]\nname = "{prefix}_{uuid.uuid4().hex[:8]}"\nkey = ["/id"]\n'
                        f"partitions = {partitions}\n{extra}\n")[0]


def load(r: Redis, t: TopicConfig, msgs: list[bytes]) -> dict[str, float]:
    """Publish ``msgs`` to ``t`` (write-through) and measure; raises on a failed check."""
    apply_topics(r, [t])
    cpu0, t0 = redis_cpu_s(r), time.perf_counter()
    result = append(r, t, (("publish", m, None) for m in msgs), jobs=SETTINGS)
    wall, cpu = time.perf_counter() - t0, redis_cpu_s(r) - cpu0
    records, seq, errors = applied_counts(r, t)
    if (result.published, records, seq, errors) != (len(msgs), len(msgs), len(msgs), 0):
        raise SystemExit(f"check failed: published {result.published}, records {records}, "
                         f"seq sum {seq}, errors {errors}")
    return {"msgs_per_s": len(msgs) / wall, "redis_us_per_msg": cpu / len(msgs) * 1e6}


def drop(r: Redis, t: TopicConfig) -> None:
    r.delete(*keys.all_partition_keys(t.name, t.partitions, t.n_indexes, len(t.index)))


def ingest(r: Redis, msgs: list[bytes], args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in INDEXES}
    warm = topic("warm", args.partitions, "")  # untimed: scripts loaded, caches warm
    load(r, warm, msgs)
    drop(r, warm)
    for i in range(args.runs):
        for name in (list(INDEXES) if i % 2 == 0 else list(reversed(INDEXES))):
            t = topic("ingest", args.partitions, INDEXES[name])
            runs[name].append(load(r, t, msgs))
            drop(r, t)
    medians = {v: {k: statistics.median(x[k] for x in rs) for k in rs[0]}
               for v, rs in runs.items()}
    base = medians["none"]
    print(f"\ningest: {len(msgs)} messages of ~{args.size} B, {args.partitions} partitions, "
          f"write-through, median of {args.runs} runs")
    print(f"{'indexes':14} {'msgs/s':>10} {'vs none':>8} {'redis µs/msg':>13} "
          f"{'vs none':>8}")
    for v, m in medians.items():
        m["throughput_vs_none"] = m["msgs_per_s"] / base["msgs_per_s"]
        m["redis_cpu_vs_none"] = m["redis_us_per_msg"] / base["redis_us_per_msg"]
        print(f"{v:14} {m['msgs_per_s']:10.0f} {m['throughput_vs_none']:8.2f} "
              f"{m['redis_us_per_msg']:13.2f} {m['redis_cpu_vs_none']:8.2f}")
    return {"runs": runs, "medians": medians}


UPDATE_VARIANTS = ("none", "1 index")
"""The variants of :func:`updates`: without index and with the range index on ``/px``."""


def updates(r: Redis, msgs: list[bytes], args: argparse.Namespace) -> dict[str, Any]:
    """Ingest of updates: per round and variant, the N records published to a fresh topic
    (not timed), then an update of each (write-through, timed): ``px`` kept, then on another
    fresh topic ``px`` moved (:func:`updated_messages`). A range index's cost on an update
    is a ``ZADD`` that finds the key's score unchanged, or one that moves it."""
    kinds = {"px kept": updated_messages(msgs, False), "px moved": updated_messages(msgs, True)}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        k: {v: [] for v in UPDATE_VARIANTS} for k in kinds}
    n = len(msgs)
    for i in range(args.runs):
        for kind, ups in kinds.items():
            for name in (UPDATE_VARIANTS if i % 2 == 0 else UPDATE_VARIANTS[::-1]):
                t = topic("update", args.partitions, INDEXES[name])
                load(r, t, msgs)
                cpu0, t0 = redis_cpu_s(r), time.perf_counter()
                append(r, t, (("publish", m, None) for m in ups), jobs=SETTINGS)
                wall, cpu = time.perf_counter() - t0, redis_cpu_s(r) - cpu0
                records, seq, errors = applied_counts(r, t)
                if (records, seq, errors) != (n, 2 * n, 0):
                    raise SystemExit(f"update check failed: records {records}, seq sum {seq},"
                                     f" errors {errors}")
                runs[kind][name].append({"msgs_per_s": n / wall,
                                         "redis_us_per_msg": cpu / n * 1e6})
                drop(r, t)
    print(f"\ningest of updates: an update of each of the {n} records, write-through, "
          f"median of {args.runs} runs")
    print(f"{'update':9} {'indexes':9} {'msgs/s':>10} {'vs none':>8} {'redis µs/msg':>13} "
          f"{'vs none':>8}")
    out: dict[str, Any] = {}
    for kind, by in runs.items():
        medians = {v: {k: statistics.median(x[k] for x in rs) for k in rs[0]}
                   for v, rs in by.items()}
        base = medians["none"]
        for v, m in medians.items():
            m["throughput_vs_none"] = m["msgs_per_s"] / base["msgs_per_s"]
            m["redis_cpu_vs_none"] = m["redis_us_per_msg"] / base["redis_us_per_msg"]
            print(f"{kind:9} {v:9} {m['msgs_per_s']:10.0f} {m['throughput_vs_none']:8.2f} "
                  f"{m['redis_us_per_msg']:13.2f} {m['redis_cpu_vs_none']:8.2f}")
        out[kind] = {"runs": by, "medians": medians}
    return out


def captured_calls(r: Redis, t: TopicConfig, msgs: list[bytes]) -> list[bytes]:
    """The packed apply.lua calls (RESP) of a write-through publish of ``msgs`` to ``t``,
    as the publisher sent them (the publish itself runs)."""
    with apply_calls() as seen:
        append(r, t, (("publish", m, None) for m in msgs), jobs=SETTINGS)
    return [call for _args, call in seen]


def replayed(r: Redis, t: TopicConfig, calls: list[bytes], n: int) -> float:
    """Redis CPU µs per message of sending ``calls`` again, one at a time, to ``t`` emptied
    and defined anew (no publisher competing for the cores); raises on a failed check."""
    drop(r, t)
    apply_topics(r, [t])
    conn = r.connection_pool.get_connection()
    try:
        cpu0 = redis_cpu_s(r)
        for call in calls:
            conn.send_packed_command([call])
            conn.read_response()
        cpu = redis_cpu_s(r) - cpu0
    finally:
        r.connection_pool.release(conn)
    records, seq, errors = applied_counts(r, t)
    if (records, seq, errors) != (n, n, 0):
        raise SystemExit(f"replay check failed: records {records}, seq sum {seq}, "
                         f"errors {errors}")
    return cpu / n * 1e6


def ingest_redis_alone(r: Redis, msgs: list[bytes], args: argparse.Namespace
                       ) -> dict[str, Any]:
    """Redis CPU per message of each ingest variant's apply.lua calls replayed without the
    publisher (which shares the two cores with redis-server in :func:`ingest`)."""
    calls, tops = {}, {}
    for name in INDEXES:
        tops[name] = topic("alone", args.partitions, INDEXES[name])
        apply_topics(r, [tops[name]])
        calls[name] = captured_calls(r, tops[name], msgs)
    runs: dict[str, list[float]] = {v: [] for v in INDEXES}
    for i in range(args.runs):
        for name in (list(INDEXES) if i % 2 == 0 else list(reversed(INDEXES))):
            runs[name].append(replayed(r, tops[name], calls[name], len(msgs)))
    for name in INDEXES:
        drop(r, tops[name])
    base = statistics.median(runs["none"])
    print(f"\ningest, redis-server alone: the same apply.lua calls replayed one at a time, "
          f"median of {args.runs} runs")
    print(f"{'indexes':14} {'redis µs/msg':>13} {'vs none':>8}")
    out = {}
    for v, xs in runs.items():
        m = statistics.median(xs)
        out[v] = {"redis_us_per_msg": m, "redis_cpu_vs_none": m / base, "runs": xs}
        print(f"{v:14} {m:13.2f} {m / base:8.2f}")
    return out


def timed(fn: Any, runs: int) -> tuple[float, Any]:
    """Median wall ms of ``runs`` calls, and the last call's result."""
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), out


def memory(r: Redis, indexed: TopicConfig, n: int) -> dict[str, float]:
    """Bytes per record (``MEMORY USAGE``, every element sampled) of the range index's sorted
    sets (numbers and the rest), of the partition's hash of index members, and of the records
    hash."""
    def per_record(name: Any) -> float:
        return sum(int(r.memory_usage(name(p), samples=0) or 0)
                   for p in range(indexed.partitions)) / n

    out = {"index_bytes_per_record": per_record(lambda p: keys.index(indexed.name, p, 0))
           + per_record(lambda p: keys.range_numbers(indexed.name, p, 0)),
           "members_hash_bytes_per_record": per_record(
               lambda p: keys.index_members(indexed.name, p)),
           "records_bytes_per_record": per_record(lambda p: keys.records(indexed.name, p))}
    print(f"\nmemory per record: range index {out['index_bytes_per_record']:.0f} B, index "
          f"members hash {out['members_hash_bytes_per_record']:.0f} B, record "
          f"{out['records_bytes_per_record']:.0f} B")
    return out


def ids(records: list[Any]) -> list[int]:
    return sorted(orjson.loads(x.data)["id"] for x in records)


def queries(r: Redis, indexed: TopicConfig, plain: TopicConfig, n: int,
            runs: int) -> list[dict[str, Any]]:
    rows = []
    print(f"\nquery: /px < X over {n} records, {indexed.partitions} partitions, median of "
          f"{runs} runs (ms)")
    print(f"{'selectivity':>11} {'matches':>8} {'index ms':>9} {'scan ms':>8} {'speed-up':>9} "
          f"{'planner':>12}")
    for s in SELECTIVITY:
        text = f"/px < {1000 * s:g}"
        chosen = plan_query(indexed, compile_filter(text), None, r)  # the planner's choice
        sow_module.MAX_INDEX_FRACTION = 2.0  # timed: the index at every selectivity
        try:
            plan = plan_query(indexed, compile_filter(text), None, r)
            if plan.kind != "range_index":
                raise SystemExit(f"{text}: planned {plan.text}, not the range index")
            ix_ms, got = timed(lambda t=text: query(r, indexed, t), runs)
        finally:
            sow_module.MAX_INDEX_FRACTION = DEFAULT_FRACTION
        scan_ms, want = timed(lambda t=text: query(r, plain, t), runs)
        if ids(got) != ids(want):  # the twins' SOW keys differ (key domain = topic name)
            raise SystemExit(f"{text}: the index and the scan returned different records")
        row = {"filter": text, "selectivity": s, "matches": len(got), "plan": plan.text,
               "planner": chosen.kind, "index_ms": ix_ms, "scan_ms": scan_ms,
               "speed_up": scan_ms / ix_ms}
        rows.append(row)
        print(f"{s * 100:10g}% {len(got):8d} {ix_ms:9.1f} {scan_ms:8.1f} "
              f"{row['speed_up']:8.1f}x {chosen.kind:>12}")
    return rows


def paging(r: Redis, t: TopicConfig, n: int, runs: int) -> list[dict[str, Any]]:
    rows = []
    print(f"\npaging: top_n 100 over {n} records (ms, median of {runs} runs)")
    print(f"{'skip_n':>8} {'no order-by':>12} {'order by /px':>13}")
    for skip in (0, n // 10, n * 9 // 10):
        plain_ms, page = timed(lambda k=skip: query(r, t, None, top_n=100, skip_n=k), runs)
        sorted_ms, spage = timed(
            lambda k=skip: query(r, t, None, top_n=100, skip_n=k, order_by="/px"), runs)
        pxs = [orjson.loads(x.data)["px"] for x in spage]
        if len(page) != min(100, n - skip) or pxs != sorted(pxs) or len(spage) != len(page):
            raise SystemExit(f"skip_n {skip}: wrong page ({len(page)}, {len(spage)} records)")
        rows.append({"top_n": 100, "skip_n": skip, "no_order_ms": plain_ms,
                     "order_by_px_ms": sorted_ms})
        print(f"{skip:8d} {plain_ms:12.1f} {sorted_ms:13.1f}")
    return rows


def main() -> int:
    """Run the parts, print their tables and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="records")
    ap.add_argument("--size", type=int, default=150, help="approximate message bytes")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="runs per figure (medians reported)")
    ap.add_argument("--json", default="bench-results/bench_query.json")
    args = ap.parse_args()
    msgs = make_messages(args.n, args.size)
    load_start = os.getloadavg()
    print(f"load average at start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}")
    with private_redis("bench_query_") as server:
        r = Redis.from_url(server.url)
        machine = machine_info(r)
        ing = ingest(r, msgs, args)
        alone = ingest_redis_alone(r, msgs, args)
        upd = updates(r, msgs, args)
        indexed = topic("idx", args.partitions, INDEXES["1 index"])
        plain = topic("scan", args.partitions, "")
        load(r, indexed, msgs)
        load(r, plain, msgs)
        q = queries(r, indexed, plain, args.n, args.runs)
        pg = paging(r, indexed, args.n, args.runs)
        mem = memory(r, indexed, args.n)
    load_end = os.getloadavg()
    print(f"load average at end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    out = write_json(args.json, {"args": vars(args), "machine": machine,
                                 "loadavg_start": load_start, "loadavg_end": load_end,
                                 "ingest": ing, "ingest_redis_alone": alone,
                                 "ingest_updates": upd, "query": q,
                                 "paging": pg, "memory": mem})
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
