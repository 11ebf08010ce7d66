#!/usr/bin/env python3
"""Publish → subscriber latency of sow_redis subscriptions, next to raw Redis pub/sub and a
NATS JetStream key-value watch, in one run; and the replay rate of a bookmark subscription.

Starts its own redis-server on a free loopback port (never 6379) and ``--workers`` ``sow-redis
worker`` processes, and, when ``nats-server`` is installed, ``nats-server -js`` on a free
loopback port with its store in a temporary folder. For each rate of ``--rates`` (messages per
second) and each variant, a publisher **process** sends ``--seconds`` of messages at that rate
(paced in batches of rate/1000 per millisecond), each carrying its send time
(``time.time_ns()``); the benchmark process receives them and records receive − send (one
host, one clock). The first ``--warmup`` seconds of each run are left out of the figures (jobs
and connections start then), for every variant alike.

Variants:

* ``subscribe``: ``Sow.subscribe(topic)`` while ``Sow.publish`` writes through (the publisher's
  write applies its plain publishes to caught-up partitions: publish → log + Lua apply →
  change block → subscriber, with its gap checks; workers run and apply whatever is left);
* ``subscribe, worker hop``: the same with write-through off (``SOW_WRITE_THROUGH=0``):
  publish → log → worker → Lua apply → change block → subscriber;
* ``sow_and_subscribe``: ``Sow.sow_and_subscribe(topic)``, measured after its ``group_end``;
* ``raw pub/sub``: ``PUBLISH`` of the same payload to a channel, redis-py ``SUBSCRIBE``;
* ``nats kv watch``: ``kv.put`` of the same payload to a JetStream key-value bucket (nats-py),
  a ``watch`` on the bucket.

Replay: ``--replay-n`` changes are published to a topic keeping them all in its change feed,
then ``Sow.subscribe(topic, bookmark="EPOCH")`` is timed until its ``completed`` message.

Prints a table (p50 / p99 / p99.9 / max in ms, and sow_redis p99 ÷ raw pub/sub p99) and
writes JSON (``--json``).

Example::

    .venv/bin/python scripts/bench_latency.py --rates 1000,10000 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import multiprocessing as mp
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

import orjson
from benchlib import BenchError, Workers, machine_info, private_redis, write_json
from redis import Redis
from rich.console import Console
from rich.table import Table

from sow_redis.client import Sow
from sow_redis.ops.server import free_port
from sow_redis.settings import Settings

console = Console(width=max(Console().width, 120))


# -- publishers (run in their own process) --------------------------------------------------
def _pace(n: int, rate: int, send) -> None:
    batch = max(1, rate // 1000)
    t0 = time.perf_counter()
    for i in range(0, n, batch):
        wait = t0 + i / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        send(i, min(batch, n - i))


def publish_sow(url: str, topic: str, n: int, rate: int, write_through: bool = True) -> None:
    sow = Sow(settings=Settings.from_env(redis_url=url, write_through=write_through))
    _pace(n, rate, lambda i, k: sow.publish(
        topic, [{"id": (i + j) % 1000, "t": time.time_ns(), "i": i + j} for j in range(k)]))


def publish_raw(url: str, channel: str, n: int, rate: int) -> None:
    r = Redis.from_url(url)

    def send(i: int, k: int) -> None:
        pipe = r.pipeline(transaction=False)
        for j in range(k):
            pipe.publish(channel, orjson.dumps({"id": (i + j) % 1000, "t": time.time_ns(),
                                                "i": i + j}))
        pipe.execute()

    _pace(n, rate, send)


def publish_nats(nats_url: str, bucket: str, n: int, rate: int) -> None:
    import nats

    async def main() -> None:
        nc = await nats.connect(nats_url)
        kv = await nc.jetstream().key_value(bucket)
        batch = max(1, rate // 1000)
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            wait = t0 + i / rate - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            for j in range(min(batch, n - i)):
                await kv.put(f"k{(i + j) % 1000}", orjson.dumps({"t": time.time_ns(),
                                                               "i": i + j}))
        await nc.close()

    asyncio.run(main())


# -- measuring -------------------------------------------------------------------------------
def summary(lat_ns: list[tuple[int, int]], warmup_s: float) -> dict[str, Any]:
    """Percentiles (ms) of the latencies sent after the warm-up."""
    if not lat_ns:
        return {"n": 0}
    t0 = min(t for t, _l in lat_ns)
    vals = sorted(lat for t, lat in lat_ns if t - t0 >= warmup_s * 1e9)
    if not vals:
        return {"n": 0}

    def q(p: float) -> float:
        return vals[min(len(vals) - 1, int(p * len(vals)))] / 1e6

    return {"n": len(vals), "received": len(lat_ns), "p50_ms": q(0.5), "p99_ms": q(0.99),
            "p999_ms": q(0.999), "max_ms": vals[-1] / 1e6}


def run_sow(url: str, rate: int, args: argparse.Namespace, query_first: bool,
            write_through: bool = True) -> dict[str, Any]:
    sow = Sow(url)
    topic = f"lat_{uuid.uuid4().hex[:8]}"
    sow.apply_config(f'[[topic]]\nname = "{topic}"\nkey = ["/id"]\npartitions = '
                     f"{args.partitions}\n")
    n = rate * args.seconds
    got: list[tuple[int, int]] = []
    sub = sow.sow_and_subscribe(topic) if query_first else sow.subscribe(topic)
    if query_first:
        assert sub.get(5)["kind"] == "group_end"
    proc = mp.Process(target=publish_sow, args=(url, topic, n, rate, write_through))
    proc.start()
    deadline = time.monotonic() + args.seconds * 3 + 30
    with sub:
        while len(got) < n and time.monotonic() < deadline:
            m = sub.get(timeout=1.0)
            if m is not None and m["kind"] == "publish":
                now = time.time_ns()
                got.append((m["data"]["t"], now - m["data"]["t"]))
    proc.join()
    return summary(got, args.warmup) | {"sent": n}


def run_raw(url: str, rate: int, args: argparse.Namespace) -> dict[str, Any]:
    r = Redis.from_url(url)
    channel = f"raw_{uuid.uuid4().hex[:8]}"
    ps = r.pubsub(ignore_subscribe_messages=True)
    ps.subscribe(channel)
    time.sleep(0.1)
    n = rate * args.seconds
    got: list[tuple[int, int]] = []
    proc = mp.Process(target=publish_raw, args=(url, channel, n, rate))
    proc.start()
    deadline = time.monotonic() + args.seconds * 3 + 30
    while len(got) < n and time.monotonic() < deadline:
        m = ps.get_message(timeout=1.0)
        if m is not None and m["type"] == "message":
            now = time.time_ns()
            t = orjson.loads(m["data"])["t"]
            got.append((t, now - t))
    proc.join()
    ps.close()
    return summary(got, args.warmup) | {"sent": n}


def run_nats(nats_url: str, rate: int, args: argparse.Namespace) -> dict[str, Any]:
    import nats

    bucket = f"lat{uuid.uuid4().hex[:8]}"
    n = rate * args.seconds
    got: list[tuple[int, int]] = []

    async def main() -> None:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        kv = await js.create_key_value(bucket=bucket, history=1)
        watcher = await kv.watchall(ignore_deletes=True)
        proc = mp.Process(target=publish_nats, args=(nats_url, bucket, n, rate))
        proc.start()
        deadline = time.monotonic() + args.seconds * 3 + 30
        while len(got) < n and time.monotonic() < deadline:
            try:
                e = await watcher.updates(timeout=1.0)
            except Exception:  # nats-py raises its TimeoutError
                continue
            if e is None or not e.value:
                continue
            now = time.time_ns()
            t = orjson.loads(e.value)["t"]
            got.append((t, now - t))
        await watcher.stop()
        proc.join()
        await js.delete_key_value(bucket)
        await nc.close()

    asyncio.run(main())
    return summary(got, args.warmup) | {"sent": n}


def run_replay(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from sow_redis.publish.append import append, wait_applied

    sow = Sow(url)
    topic = f"replay_{uuid.uuid4().hex[:8]}"
    sow.apply_config(f'[[topic]]\nname = "{topic}"\nkey = ["/id"]\npartitions = '
                     f"{args.partitions}\nchange_retention = {{ count = {args.replay_n * 2} }}\n")
    t = sow.topic(topic)
    n = args.replay_n
    t0 = time.perf_counter()
    res = append(sow.r, t, (("publish", b'{"id":%d,"v":%d}' % (i % 100_000, i), None)
                            for i in range(n)), jobs=sow.settings)
    wait_applied(sow.r, t, res.last_ids, timeout_s=600)
    loaded = time.perf_counter() - t0
    events = 0
    t0 = time.perf_counter()
    with sow.subscribe(topic, bookmark="EPOCH") as sub:
        while True:
            m = sub.get(timeout=30)
            if m is None:
                raise BenchError("replay stalled")
            if m["kind"] == "completed":
                break
            events += 1
    took = time.perf_counter() - t0
    return {"events": events, "seconds": took, "events_s": events / took if took else 0.0,
            "load_seconds": loaded}


class Nats:
    """A ``nats-server -js`` on a free loopback port, its store in a temporary folder."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="nats-bench-")
        self.port = free_port()
        self.proc = subprocess.Popen(["nats-server", "-js", "-a", "127.0.0.1", "-p",
                                      str(self.port), "-sd", self.dir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"nats://127.0.0.1:{self.port}"
        time.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rate and variant over the rounds: the median p50 and p99 (ms), the ratio of the
    median p99 to raw pub/sub's median p99 in the same rounds, and the rounds' own ratios."""
    out = []
    for rate in dict.fromkeys(r["rate"] for r in rows):
        at = [r for r in rows if r["rate"] == rate and "p99_ms" in r]
        raw = [r["p99_ms"] for r in at if r["variant"] == "raw pub/sub"]
        for name in dict.fromkeys(r["variant"] for r in at):
            mine = [r for r in at if r["variant"] == name]
            row = {"variant": name, "rate": rate, "rounds": len(mine),
                   "p50_ms": statistics.median(r["p50_ms"] for r in mine),
                   "p99_ms": statistics.median(r["p99_ms"] for r in mine),
                   "p99_vs_raw_rounds": [r["p99_vs_raw"] for r in mine if "p99_vs_raw" in r]}
            if raw:
                row["p99_vs_raw"] = row["p99_ms"] / statistics.median(raw)
            out.append(row)
    return out


def median_table(meds: list[dict[str, Any]], rounds: int) -> Table:
    table = Table(title=f"medians over {rounds} interleaved rounds (ms)")
    for col in ("variant", "msg/s", "p50", "p99", "p99 ÷ raw", "per round"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for m in meds:
        per = m["p99_vs_raw_rounds"]
        table.add_row(m["variant"], f"{m['rate']:,}", f"{m['p50_ms']:.2f}", f"{m['p99_ms']:.2f}",
                      f"{m['p99_vs_raw']:.1f}×" if "p99_vs_raw" in m else "-",
                      f"{min(per):.1f}–{max(per):.1f}×" if per else "-")
    return table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--rates", default="1000,10000", help="messages per second, comma-separated")
    ap.add_argument("--seconds", type=int, default=10, help="seconds of publishing per run")
    ap.add_argument("--warmup", type=float, default=0.5, help="seconds left out at the start")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--replay-n", type=int, default=1_000_000, help="0: no replay run")
    ap.add_argument("--no-nats", action="store_true", help="skip the NATS baseline")
    ap.add_argument("--variants", default="",
                    help="variant names to run, separated by ';' (default: all); raw pub/sub "
                         "always runs first, for the ratio")
    ap.add_argument("--repeat", type=int, default=1,
                    help="interleaved rounds of the variants per rate; with more than one, "
                         "also the medians and the ratio of the median p99s")
    ap.add_argument("--json", default="bench-results/bench_latency.json")
    a = ap.parse_args(argv)
    a.rate_list = [int(x) for x in a.rates.split(",") if x.strip()]
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_a: (_ for _ in ()).throw(KeyboardInterrupt()))
    nats_server = None
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"benchmark": "bench_latency",
                              "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                              "options": vars(args) | {"rate_list": args.rate_list}}
    try:
        with private_redis("sow-lat-") as server:
            r = Redis.from_url(server.url)
            result["machine"] = machine_info(r)
            ws = Workers(server.url, args.workers, server.workdir, {"SOW_BATCH_SIZE": "500"})
            ws.start()
            ws.wait_registered(r)
            if not args.no_nats and shutil.which("nats-server"):
                nats_server = Nats()
            elif not args.no_nats:
                console.print("nats-server is not installed: no NATS baseline")
            try:
                for rate in args.rate_list:
                    variants = [("raw pub/sub", lambda rt=rate: run_raw(server.url, rt, args)),
                                ("subscribe", lambda rt=rate: run_sow(server.url, rt, args, False)),
                                ("sow_and_subscribe",
                                 lambda rt=rate: run_sow(server.url, rt, args, True)),
                                ("subscribe, worker hop",
                                 lambda rt=rate: run_sow(server.url, rt, args, False, False))]
                    if nats_server is not None:
                        variants.append(("nats kv watch",
                                         lambda rt=rate: run_nats(nats_server.url, rt, args)))
                    if args.variants:
                        wanted = {"raw pub/sub", *(v.strip() for v in args.variants.split(";"))}
                        variants = [(n, f) for n, f in variants if n in wanted]
                    for round_ in range(1, args.repeat + 1):  # interleaved rounds
                        raw_p99 = None
                        for name, run in variants:
                            res = run()
                            if name == "raw pub/sub":
                                raw_p99 = res.get("p99_ms")
                            row = {"variant": name, "rate": rate, "round": round_, **res}
                            if raw_p99 and res.get("p99_ms") is not None:
                                row["p99_vs_raw"] = res["p99_ms"] / raw_p99
                            rows.append(row)
                            console.print(f"{rate:,}/s {name} (round {round_}): {res}")
                if args.replay_n:
                    result["replay"] = run_replay(server.url, args)
                    console.print(f"replay: {result['replay']}")
            finally:
                ws.stop()
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        return 130
    finally:
        if nats_server is not None:
            nats_server.stop()
    table = Table(title="publish → subscriber latency (ms; after the warm-up)")
    for col in ("variant", "msg/s", "round", "received", "p50", "p99", "p99.9", "max",
                "p99 ÷ raw"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for row in rows:
        table.add_row(row["variant"], f"{row['rate']:,}", str(row["round"]),
                      f"{row.get('received', 0):,}",
                      *(f"{row[k]:.2f}" if k in row else "-" for k in
                        ("p50_ms", "p99_ms", "p999_ms", "max_ms")),
                      f"{row['p99_vs_raw']:.1f}×" if "p99_vs_raw" in row else "-")
    console.print(table)
    if args.repeat > 1:
        result["medians"] = medians(rows)
        console.print(median_table(result["medians"], args.repeat))
    if "replay" in result:
        rp = result["replay"]
        console.print(f"bookmark replay from EPOCH: {rp['events']:,} events in "
                      f"{rp['seconds']:.2f} s = {rp['events_s']:,.0f} events/s")
    result["rows"] = rows
    console.print(f"results written to {write_json(args.json, result)}")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench_latency"
    sys.exit(main())
