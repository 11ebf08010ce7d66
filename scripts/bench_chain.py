#!/usr/bin/env python3
"""Chained ingest against plain-key ingest of the same FIX order flow, in one run.

Starts its own redis-server on a free port (no persistence, temporary folder; the machine's
6379 is never used) and generates ``--orders`` synthetic FIX order flows once: each order is a
NewOrderSingle (35=D) and its ack (35=8 with 37 OrderID), then 0-9 cancel/replaces (35=G, 11
new ClOrdID, 41 the previous one) each with its ack, so replace chains are 1-10 ClOrdIDs deep;
the orders are interleaved at random, keeping each order's own sequence. Two FIX topics with
the same partitioning (``partition_by = ["/55"]``, ``--partitions``) take the same messages:

* ``plain``: default key generator on ``/11`` (one record per ClOrdID);
* ``chained``: chaining key generator on ``/11`` then ``/41`` (one record per order).

For each (repeated ``--repeat`` times, alternating, best run kept):

* ``publish``: ``sow_redis.publish.append.append`` of the FIX lines (FIX parse, validation,
  partition, pipelined XADD) while nothing applies;
* ``apply``: the worker code applying the whole backlog of every partition in this process
  (``Sow(inline=True).handoff``, which drains each partition as a worker job does), timed from
  the first to the last partition drained.

In the same run, the FIX parser (``sow_redis.model.fix.decode``) is timed against simplefix's
``FixParser`` (installed with the dev extra) on the same lines: the figure behind keeping our
own parser.

Each run is verified: records = ClOrdIDs (plain) or orders (chained), every record holds its
newest message, the partitions' change sequences sum to the message count, no error entry.

Output: a rich table and a JSON file (``--json``). Example::

    .venv/bin/python scripts/bench_chain.py --orders 20000 --repeat 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchlib import BenchError, RedisServer, applied_counts, write_json
from redis import Redis
from rich.console import Console
from rich.table import Table

from sow_redis.client import Sow
from sow_redis.config import parse_topics
from sow_redis.errors import SowError
from sow_redis.expirer import remove_topic
from sow_redis.publish.append import append
from sow_redis.registry import apply_topics
from sow_redis.settings import Settings

console = Console()
SEED = 20261121
SYMBOLS = ["AAPL", "MSFT", "GOOG", "AMZN", "IBM", "ORCL", "TSLA", "NVDA", "META", "INTC",
           "CSCO", "ADBE", "CRM", "QCOM", "TXN", "AVGO", "LLOY", "BARC", "VOD", "BP"]


def make_flows(orders: int) -> tuple[list[bytes], int, int]:
    """FIX lines (SOH) of ``orders`` interleaved order flows with replace chains of depth
    1-10. Returns ``(lines, orders, ClOrdIDs)``."""
    rnd = random.Random(SEED)
    flows: list[list[bytes]] = []
    clordids = 0
    for k in range(orders):
        sym = rnd.choice(SYMBOLS)
        depth = rnd.randint(1, 10)
        oid, qty, px = f"OID{k:07d}", rnd.randint(1, 100) * 100, rnd.randint(1000, 5000) / 10
        ids = [f"C{k:07d}-{j}" for j in range(depth)]
        clordids += depth
        common = f"55={sym}\x0154=1\x0140=2\x0159=0\x0160=20261121-10:00:00.000"
        msgs = [f"35=D\x0111={ids[0]}\x01{common}\x0138={qty}\x0144={px}",
                (f"35=8\x0137={oid}\x0111={ids[0]}\x0117=E{k}-0\x01150=0\x0139=0\x01{common}"
                 f"\x0138={qty}\x0144={px}\x0114=0\x01151={qty}")]
        for j in range(1, depth):
            qty += 100
            msgs.append(f"35=G\x0111={ids[j]}\x0141={ids[j - 1]}\x01{common}\x0138={qty}"
                        f"\x0144={px}")
            msgs.append(f"35=8\x0137={oid}\x0111={ids[j]}\x0141={ids[j - 1]}\x0117=E{k}-{j}"
                        f"\x01150=5\x0139=5\x01{common}\x0138={qty}\x0144={px}\x0114=0"
                        f"\x01151={qty}")
        flows.append([b"8=FIX.4.4\x019=0\x01" + m.encode() + b"\x0110=000\x01" for m in msgs])
    # interleave: repeatedly take the next message of a random unfinished order
    lines: list[bytes] = []
    live = [f for f in flows]
    pos = [0] * len(live)
    idx = list(range(len(live)))
    while idx:
        i = rnd.randrange(len(idx))
        f = idx[i]
        lines.append(live[f][pos[f]])
        pos[f] += 1
        if pos[f] == len(live[f]):
            idx[i] = idx[-1]
            idx.pop()
    return lines, orders, clordids


def config(name: str, chained: bool, partitions: int) -> str:
    key = ('key = ["/11", "/41"]\nkey_generator = { type = "chaining" }\n' if chained
           else 'key = ["/11"]\n')
    return (f'[[topic]]\nname = "{name}"\nmessage_type = "fix"\n{key}'
            f'partition_by = ["/55"]\npartitions = {partitions}\n')


def run_once(r: Redis, url: str, lines: list[bytes], chained: bool, cmd: str,
             partitions: int, expected_records: int, batch: int) -> dict[str, Any]:
    name = f"bench_{'chained' if chained else 'plain'}_{uuid.uuid4().hex[:6]}"
    (t,) = parse_topics(config(name, chained, partitions))
    apply_topics(r, [t])
    try:
        t0 = time.perf_counter()
        res = append(r, t, ((cmd, line, None) for line in lines))
        t1 = time.perf_counter()
        if res.rejected or res.published != len(lines):
            raise BenchError(f"{name}: {len(res.rejected)} rejected: {res.rejected[:3]}")
        settings = Settings.from_env(redis_url=url, batch_size=batch)
        t2 = time.perf_counter()
        applied = Sow(client=r, settings=settings, inline=True).handoff(t, res.last_ids)
        t3 = time.perf_counter()
        check = verify(r, t, len(lines), expected_records)
        return {"topic": "chained" if chained else "plain", "cmd": cmd,
                "messages": len(lines), "records": check["records"],
                "publish_s": t1 - t0, "apply_s": t3 - t2,
                "publish_msg_s": len(lines) / (t1 - t0), "apply_msg_s": applied / (t3 - t2)}
    finally:
        remove_topic(r, t)


def verify(r: Redis, t: Any, n: int, expected_records: int) -> dict[str, int]:
    records, seq, errors = applied_counts(r, t)
    if records != expected_records or seq != n or errors:
        raise BenchError(f"{t.name}: records {records} (expected {expected_records}), seq sum "
                         f"{seq} (expected {n}), {errors} error entries")
    return {"records": records}


def parser_rates(lines: list[bytes], repeat: int) -> dict[str, float]:
    """FIX messages parsed per second (best of ``repeat``): ours and simplefix's, if present."""
    from sow_redis.model import fix

    def ours() -> None:
        for line in lines:
            fix.decode(line)

    out = {"sow_redis.model.fix": best_rate(ours, len(lines), repeat)}
    try:
        import simplefix
    except ImportError:
        return out

    def theirs() -> None:
        parser = simplefix.FixParser()
        for line in lines:
            parser.append_buffer(line)
            parser.get_message()

    from importlib.metadata import version

    out[f"simplefix {version('simplefix')}"] = best_rate(theirs, len(lines), repeat)
    return out


def best_rate(fn: Any, n: int, repeat: int) -> float:
    best = 0.0
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        fn()
        best = max(best, n / (time.perf_counter() - t0))
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orders", type=int, default=20000, help="Order flows (default 20000).")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="Runs per topic; best kept.")
    ap.add_argument("--batch-size", type=int, default=500, help="Worker batch (entries).")
    ap.add_argument("--json", default="bench-results/bench_chain.json")
    args = ap.parse_args(argv)
    lines, orders, clordids = make_flows(args.orders)
    console.print(f"{len(lines):,} FIX messages: {orders:,} orders, {clordids:,} ClOrdIDs "
                  f"(replace chains 1-10 deep)")
    with tempfile.TemporaryDirectory(prefix="bench_chain_") as tmp:
        try:
            server = RedisServer(Path(tmp))
        except SowError as exc:
            console.print(f"[red]cannot start redis-server: {exc}")
            return 1
        try:
            r = Redis.from_url(server.url)
            runs: list[dict[str, Any]] = []
            for cmd in ("publish", "delta_publish"):
                for _ in range(args.repeat):
                    for chained in (False, True):
                        runs.append(run_once(r, server.url, lines, chained, cmd,
                                             args.partitions, orders if chained else clordids,
                                             args.batch_size))
        except BenchError as exc:
            console.print(f"[red]benchmark failed: {exc}")
            return 1
        finally:
            server.stop()
    rows = []
    for cmd in ("publish", "delta_publish"):
        best = {}
        for topic in ("plain", "chained"):
            mine = [x for x in runs if x["cmd"] == cmd and x["topic"] == topic]
            best[topic] = max(mine, key=lambda x: x["apply_msg_s"])
            best[topic]["publish_msg_s_best"] = max(x["publish_msg_s"] for x in mine)
        for topic in ("plain", "chained"):
            b = best[topic]
            rows.append({"cmd": cmd, "topic": topic, "records": b["records"],
                         "publish_msg_s": b["publish_msg_s_best"], "apply_msg_s": b["apply_msg_s"],
                         "apply_ratio": b["apply_msg_s"] / best["plain"]["apply_msg_s"]})
    table = Table(title=f"chained vs plain-key ingest: {len(lines):,} FIX messages, "
                        f"{args.partitions} partitions, best of {args.repeat}")
    for col in ("command", "topic", "records", "publish msg/s", "apply msg/s",
                "apply vs plain"):
        table.add_column(col, justify="right" if col not in ("command", "topic") else "left")
    for row in rows:
        table.add_row(row["cmd"], row["topic"], f"{row['records']:,}",
                      f"{row['publish_msg_s']:,.0f}", f"{row['apply_msg_s']:,.0f}",
                      f"{row['apply_ratio']:.1%}")
    console.print(table)
    parsers = parser_rates(lines[:50000], args.repeat)
    ptable = Table(title=f"FIX parser: {min(len(lines), 50000):,} messages, best of {args.repeat}")
    ptable.add_column("parser")
    ptable.add_column("msg/s", justify="right")
    for name, r_ in parsers.items():
        ptable.add_row(name, f"{r_:,.0f}")
    console.print(ptable)
    out = write_json(args.json, {
        "benchmark": "bench_chain", "when": dt.datetime.now(dt.UTC).isoformat(),
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "messages": len(lines), "orders": orders, "clordids": clordids,
        "partitions": args.partitions, "rows": rows, "runs": runs, "fix_parsers": parsers})
    console.print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
