#!/usr/bin/env python3
"""Ingest throughput of sow_redis against a raw pipelined-Lua baseline, in one run.

Starts its own redis-server on a free port (``--save "" --appendonly no``, in a temporary
folder; the machine's 6379 is never used), generates N JSON messages once, then measures:

* ``baseline``: no sow_redis code. An inline Lua script (HSET record, ZADD a sorted set,
  PUBLISH the message) called with EVALSHA in batches of ``--batch-size`` messages, pipelined
  so one round trip carries about 1,000 messages, from this process. The client parses each
  message with orjson to take its ``id`` as the hash field. Best of 3 (at least ``--repeat``).
* for each worker count W of ``--workers`` (fresh topic names each time):

  - ``publish``: ``sow_redis.publish.append.append`` of the N messages (validate, key, partition,
    XADD pipelined) while no worker runs, so nothing is applied meanwhile.
  - ``worker start-up``: from Popen of W ``python -m sow_redis.cli worker`` processes to all W
    being registered in rq (``rq.Worker.all``).
  - ``apply backlog``: the backlog above is written to a topic that is NOT yet in the registry,
    so the running workers cannot see it. The clock starts when the benchmark stores the topic
    in the registry and enqueues one ingest job per partition (what a publisher does), and
    stops when every partition's applied cursor has reached its last published stream id
    (``wait_applied``, polled every 5 ms). Idle, registered workers: start-up is excluded.
  - ``live publish`` / ``live end-to-end``: with the W workers running and a fresh topic in the
    registry, ``append`` the N messages as fast as possible (after each 1,000-message pipeline
    round trip the publisher sets the job markers and enqueues the missing jobs in the same
    write, as ``Sow.publish`` does: ``append(..., jobs=settings)``), while the workers
    apply concurrently. ``live publish`` = N / publish time; ``live end-to-end`` = N / (time
    from publish start until everything is applied).

After every run the result is verified: records = distinct keys, the partitions' ``seq`` sum
= N (each message applied exactly once), no entry in the topic's error stream.

Output: a rich table and a JSON file (``--json``). Example::

    .venv/bin/python scripts/bench_ingest.py --n 200000 --keys 50000 --workers 1,2
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import random
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from benchlib import (
    BenchError,
    Workers,
    applied_counts,
    machine_info,
    private_redis,
    redis_cpu_s,
    write_json,
)
from redis import Redis
from rich.console import Console
from rich.table import Table

from sow_redis.apply.jobs import ensure_jobs
from sow_redis.config import parse_topics
from sow_redis.errors import SowError
from sow_redis.expirer import remove_topic
from sow_redis.model.topic import TopicConfig
from sow_redis.publish.append import CHUNK, append, wait_applied
from sow_redis.registry import apply_topics, store_fingerprints
from sow_redis.settings import QUEUE_NAME, Settings

ROOT = Path(__file__).resolve().parent.parent

console = Console(width=max(Console().width, 132))

SYMBOLS = ["AAPL", "MSFT", "GOOG", "AMZN", "IBM", "ORCL", "TSLA", "NVDA", "META", "INTC",
           "CSCO", "ADBE", "CRM", "QCOM", "TXN", "AVGO"]
SEED = 20240601
POLL_S = 0.005
"""Poll interval of the applied cursors (seconds)."""

BASELINE_LUA = """
-- KEYS[1] records HASH, KEYS[2] ZSET, KEYS[3] state HASH; ARGV[1] channel;
-- ARGV[2..] pairs: hash field (the message id), message bytes
local rec, z, st, chan = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local seq = tonumber(redis.call('HGET', st, 'seq') or '0')
for i = 2, #ARGV, 2 do
  seq = seq + 1
  redis.call('HSET', rec, ARGV[i], ARGV[i + 1])
  redis.call('ZADD', z, seq, ARGV[i])
  redis.call('PUBLISH', chan, ARGV[i + 1])
end
redis.call('HSET', st, 'seq', seq)
return seq
"""

DESCRIPTIONS = {
    "baseline": "no sow_redis: per message orjson parse for the id, then one inline Lua call "
                "per batch (HSET record, ZADD score, PUBLISH message), ~{depth} batch(es) of "
                "{batch} per pipelined round trip; best of {runs}",
    "publish": "sow_redis.publish.append.append: validate + key + partition + XADD (pipelined, "
               "1,000 per round trip); no worker running",
    "worker start-up": "Popen of W worker processes until all W are registered in rq",
    "apply backlog": "W idle workers; clock from 'topic stored in registry + jobs enqueued' "
                     "until every partition's cursor reached its last id",
    "apply backlog, no change feed": "the same on a topic with change_retention = 0 (changes "
                                     "published, not kept): the change feed's cost",
    "live publish": "append while W workers apply concurrently (job markers set with each 1,000)",
    "live end-to-end": "from publish start until everything is applied, W workers running",
}


# -- data ---------------------------------------------------------------------------------
def make_messages(n: int, nkeys: int, size: int) -> list[bytes]:
    """N JSON messages of about ``size`` bytes; ``id`` goes round robin over ``nkeys`` keys."""
    rnd = random.Random(SEED)
    out = []
    for i in range(n):
        obj: dict[str, Any] = {
            "id": i % nkeys,
            "price": round(rnd.uniform(1.0, 1000.0), 4),
            "qty": rnd.randint(1, 100_000),
            "symbol": rnd.choice(SYMBOLS),
            "pad": "",
        }
        base = len(orjson.dumps(obj))
        obj["pad"] = "x" * max(0, size - base)
        out.append(orjson.dumps(obj))
    return out


# -- helpers ------------------------------------------------------------------------------
def topic_config(name: str, partitions: int, change_feed: bool = True) -> TopicConfig:
    """The benchmark topic: keyed by ``/id``; the default change feed retention, or none
    (``change_retention = 0``: changes published only)."""
    feed = "" if change_feed else "change_retention = 0\n"
    return parse_topics(f'[[topic]]\nname = "{name}"\nkey = ["/id"]\n'
                        f"partitions = {partitions}\n{feed}")[0]


def verify(r: Redis, t: TopicConfig, n: int, distinct: int) -> dict[str, Any]:
    records, seq, errors = applied_counts(r, t)
    ok = records == distinct and seq == n and errors == 0
    return {"ok": ok, "records": records, "seq_sum": seq, "errors": errors,
            "expected_records": distinct, "expected_seq_sum": n}


def rate(n: int, s: float) -> float:
    return n / s if s > 0 else float("inf")


# -- baseline -----------------------------------------------------------------------------
def run_baseline(r: Redis, msgs: list[bytes], batch: int, depth: int, distinct: int) -> dict:
    sha = r.script_load(BASELINE_LUA)
    tag = uuid.uuid4().hex[:8]
    ks = [f"bench:base:{tag}:rec", f"bench:base:{tag}:z", f"bench:base:{tag}:state"]
    chan = f"bench:base:{tag}"
    loads = orjson.loads
    pipe = r.pipeline(transaction=False)
    pending = 0
    n = len(msgs)
    t0 = time.perf_counter()
    for s in range(0, n, batch):
        args: list[Any] = [chan]
        for m in msgs[s:s + batch]:
            args.append(str(loads(m)["id"]))
            args.append(m)
        pipe.evalsha(sha, 3, *ks, *args)
        pending += 1
        if pending >= depth:
            pipe.execute()
            pending = 0
    if pending:
        pipe.execute()
    elapsed = time.perf_counter() - t0
    records, seq = r.hlen(ks[0]), int(r.hget(ks[2], "seq") or 0)
    r.unlink(*ks)
    ok = records == distinct and seq == n
    return {"seconds": elapsed, "msg_s": rate(n, elapsed),
            "verify": {"ok": ok, "records": records, "seq_sum": seq,
                       "expected_records": distinct, "expected_seq_sum": n}}


# -- sow_redis ------------------------------------------------------------------------------
def run_sow(url: str, r: Redis, msgs: list[bytes], workers: int, args: argparse.Namespace,
            distinct: int, logdir: Path, settings: Settings) -> dict:
    n = len(msgs)
    uid = uuid.uuid4().hex[:8]
    out: dict[str, Any] = {"workers": workers}
    wait_timeout = max(120.0, n / 500)
    parts = list(range(args.partitions))

    # 1. backlog: append to a topic the workers cannot see yet (not in the registry)
    backlog = topic_config(f"bench_{uid}_backlog_w{workers}", args.partitions)
    cpu0, pcpu0 = redis_cpu_s(r), time.process_time()
    t0 = time.perf_counter()
    # its partitions take entries under this definition (the definition fence), while no
    # worker can see it in the registry
    store_fingerprints(r, [backlog])
    res = append(r, backlog, (("publish", m, None) for m in msgs))
    t1 = time.perf_counter()
    pcpu1 = time.process_time()
    if res.published != n or res.rejected:
        raise BenchError(f"publish: {res.published} published, {len(res.rejected)} rejected")
    out["publish"] = {"seconds": t1 - t0, "msg_s": rate(n, t1 - t0),
                      "redis_cpu_s": redis_cpu_s(r) - cpu0, "publisher_cpu_s": pcpu1 - pcpu0}

    ws = Workers(url, workers, logdir, {"SOW_BATCH_SIZE": str(args.batch_size)})
    try:
        t0 = time.perf_counter()
        ws.start()
        ws.wait_registered(r)
        t1 = time.perf_counter()
        out["worker_startup"] = {"seconds": t1 - t0}
        time.sleep(0.2)  # let the start-up sweeps and imports settle

        def apply_backlog(topic: TopicConfig, last_ids: dict[int, str]) -> dict[str, Any]:
            """Reveal ``topic`` and enqueue its jobs, as a publisher would; time until every
            partition is applied."""
            cpu0, wcpu0 = redis_cpu_s(r), ws.cpu_s()
            t0 = time.perf_counter()
            apply_topics(r, [topic])
            ensure_jobs(r, topic.name, parts, settings)
            wait_applied(r, topic, last_ids, timeout_s=wait_timeout, poll_s=POLL_S)
            t1 = time.perf_counter()
            result = {"seconds": t1 - t0, "msg_s": rate(n, t1 - t0),
                      "redis_cpu_s": redis_cpu_s(r) - cpu0, "workers_cpu_s": ws.cpu_s() - wcpu0,
                      "verify": verify(r, topic, n, distinct)}
            remove_topic(r, topic)
            return result

        # 2. apply the backlog
        out["apply_backlog"] = apply_backlog(backlog, res.last_ids)
        # 2b. the same backlog on a topic without change feed (its cost, same run)
        plain = topic_config(f"bench_{uid}_nofeed_w{workers}", args.partitions, False)
        store_fingerprints(r, [plain])
        res_plain = append(r, plain, (("publish", m, None) for m in msgs))
        out["apply_backlog_no_feed"] = apply_backlog(plain, res_plain.last_ids)

        # 3. live: publish while the workers apply
        live = topic_config(f"bench_{uid}_live_w{workers}", args.partitions)
        apply_topics(r, [live])
        time.sleep(0.2)

        cpu0, wcpu0, pcpu0 = redis_cpu_s(r), ws.cpu_s(), time.process_time()
        t0 = time.perf_counter()
        # jobs=: each chunk sets its partitions' job markers in the same write as its XADDs
        # and enqueues jobs where none was outstanding, as Sow.publish and the CLI do
        res = append(r, live, (("publish", m, None) for m in msgs), jobs=settings)
        t1 = time.perf_counter()
        pcpu1 = time.process_time()
        wait_applied(r, live, res.last_ids, timeout_s=wait_timeout, poll_s=POLL_S)
        t2 = time.perf_counter()
        if res.published != n or res.rejected:
            raise BenchError(f"live publish: {res.published} published, "
                             f"{len(res.rejected)} rejected")
        out["live_publish"] = {"seconds": t1 - t0, "msg_s": rate(n, t1 - t0),
                               "publisher_cpu_s": pcpu1 - pcpu0}
        out["live_end_to_end"] = {"seconds": t2 - t0, "msg_s": rate(n, t2 - t0),
                                  "apply_lag_after_publish_s": t2 - t1,
                                  "redis_cpu_s": redis_cpu_s(r) - cpu0,
                                  "workers_cpu_s": ws.cpu_s() - wcpu0,
                                  "verify": verify(r, live, n, distinct)}
        remove_topic(r, live)
    finally:
        ws.stop()
        from rq import Queue

        with contextlib.suppress(Exception):  # cleanup only; the server may be gone
            Queue(QUEUE_NAME, connection=r).empty()  # leftover jobs of dropped topics
    return out


# -- output -------------------------------------------------------------------------------
def best(runs: list[dict], key: str) -> dict:
    """The run with the highest msg/s (or the lowest seconds) for one measure."""
    vals = [x[key] for x in runs if key in x]
    if "msg_s" in vals[0]:
        return max(vals, key=lambda v: v["msg_s"])
    return min(vals, key=lambda v: v["seconds"])


def summary_rows(n: int, baseline: dict, sow_runs: dict[int, list[dict]]) -> list[dict]:
    base = baseline["msg_s"]
    rows = [{"variant": "baseline", "workers": None, "messages": n,
             "seconds": baseline["seconds"], "msg_s": base, "pct_baseline": 100.0,
             "verified": baseline["verify"]["ok"]}]
    names = [("publish", "publish"), ("worker_startup", "worker start-up"),
             ("apply_backlog", "apply backlog"),
             ("apply_backlog_no_feed", "apply backlog, no change feed"),
             ("live_publish", "live publish"),
             ("live_end_to_end", "live end-to-end")]
    for w, runs in sow_runs.items():
        for key, label in names:
            b = best(runs, key)
            run = next(x for x in runs if x.get(key) is b)
            msg_s = b.get("msg_s")
            verified = b["verify"]["ok"] if "verify" in b else None
            if key == "live_publish":
                verified = best(runs, "live_end_to_end")["verify"]["ok"]
            rows.append({"variant": label, "workers": w,
                         "messages": n if msg_s is not None else None,
                         "seconds": b["seconds"], "msg_s": msg_s,
                         "pct_baseline": 100.0 * msg_s / base if msg_s else None,
                         "verified": verified, "cpu_us": cpu_split(run, key, n)})
    return rows


def cpu_split(run: dict, key: str, n: int) -> dict[str, float] | None:
    """CPU µs per message of redis-server, the workers and the publishing process during one
    measured phase (the publisher's share of live end-to-end is its live publish CPU)."""
    phase = run.get(key, {})
    out = {}
    for who, field in (("redis", "redis_cpu_s"), ("workers", "workers_cpu_s"),
                       ("publisher", "publisher_cpu_s")):
        if field in phase:
            out[who] = 1e6 * phase[field] / n
    if key == "live_end_to_end" and "publisher_cpu_s" in run.get("live_publish", {}):
        out["publisher"] = 1e6 * run["live_publish"]["publisher_cpu_s"] / n
    if key == "live_publish":
        return None
    return out or None


def print_table(rows: list[dict], desc: dict[str, str], title: str) -> None:
    table = Table(title=title, caption="µs: CPU time per message of redis-server, the "
                  "workers and the publishing process during the phase")
    for col, just in [("variant", "left"), ("workers", "right"), ("messages", "right"),
                      ("seconds", "right"), ("msg/s", "right"), ("% of baseline", "right"),
                      ("redis µs", "right"), ("workers µs", "right"),
                      ("publisher µs", "right")]:
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for row in rows:
        ok = row["verified"]
        label = row["variant"] + ("" if ok in (True, None) else " [red](VERIFY FAILED)[/red]")
        table.add_row(
            label,
            "-" if row["workers"] is None else str(row["workers"]),
            "-" if row["messages"] is None else f"{row['messages']:,}",
            f"{row['seconds']:.3f}",
            "-" if row["msg_s"] is None else f"{row['msg_s']:,.0f}",
            "-" if row["pct_baseline"] is None else f"{row['pct_baseline']:.1f} %",
            *(f"{cpu[who]:.1f}" if cpu and who in cpu else "-"
              for cpu in [row.get("cpu_us")] for who in ("redis", "workers", "publisher")),
        )
    console.print(table)
    for k, v in desc.items():
        console.print(f"[bold]{k}[/bold]: {v}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000, help="messages")
    ap.add_argument("--keys", type=int, default=50_000, help="distinct SOW keys (/id values)")
    ap.add_argument("--size", type=int, default=200, help="approximate message bytes")
    ap.add_argument("--partitions", type=int, default=8, help="partitions of the topic")
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--batch-size", type=int, default=Settings.from_env().batch_size,
                    help="log entries per Lua call, for the workers and the baseline "
                         "(default: the library default, SOW_BATCH_SIZE or Settings)")
    ap.add_argument("--json", default="bench-results/bench_ingest.json", help="results file")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per worker count (best reported; baseline: best of max(3, this))")
    a = ap.parse_args(argv)
    a.worker_counts = [int(x) for x in a.workers.split(",") if x.strip()]
    if a.n < 1 or a.keys < 1 or a.partitions < 1 or a.repeat < 1 or a.batch_size < 1 \
            or not a.worker_counts or any(w < 1 for w in a.worker_counts):
        ap.error("--n, --keys, --partitions, --batch-size, --repeat and --workers must be "
                 "positive")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    batch = args.batch_size
    depth = max(1, CHUNK // batch)

    def on_term(*_a: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with INT ignored

    console.print(f"generating {args.n:,} messages of ~{args.size} bytes over "
                  f"{args.keys:,} keys …")
    msgs = make_messages(args.n, args.keys, args.size)
    distinct = len({i % args.keys for i in range(args.n)})
    avg_size = sum(map(len, msgs)) / len(msgs)

    failed = False
    try:
        with private_redis("sow-bench-") as server:
            tmp = server.workdir
            r = Redis.from_url(server.url)
            settings = Settings.from_env(redis_url=server.url, batch_size=batch)
            redis_version = r.info("server")["redis_version"]
            console.print(f"redis-server {redis_version} on {server.url}; batch size {batch}")

            base_runs = []
            for i in range(max(3, args.repeat)):
                b = run_baseline(r, msgs, batch, depth, distinct)
                console.print(f"baseline run {i + 1}: {b['msg_s']:,.0f} msg/s "
                              f"({'ok' if b['verify']['ok'] else 'VERIFY FAILED'})")
                base_runs.append(b)
            baseline = max(base_runs, key=lambda b: b["msg_s"])

            sow_runs: dict[int, list[dict]] = {w: [] for w in args.worker_counts}
            for rep in range(args.repeat):
                for w in args.worker_counts:
                    run = run_sow(server.url, r, msgs, w, args, distinct, tmp, settings)
                    sow_runs[w].append(run)
                    ab, le = run["apply_backlog"], run["live_end_to_end"]
                    console.print(
                        f"run {rep + 1}, {w} worker(s): publish {run['publish']['msg_s']:,.0f}, "
                        f"apply backlog {ab['msg_s']:,.0f} "
                        f"({'ok' if ab['verify']['ok'] else 'VERIFY FAILED'}), "
                        f"live end-to-end {le['msg_s']:,.0f} msg/s "
                        f"({'ok' if le['verify']['ok'] else 'VERIFY FAILED'})")

            rows = summary_rows(args.n, baseline, sow_runs)
            failed = not all(row["verified"] in (True, None) for row in rows) or not all(
                b["verify"]["ok"] for b in base_runs) or not all(
                x[k]["verify"]["ok"] for runs in sow_runs.values() for x in runs
                for k in ("apply_backlog", "apply_backlog_no_feed", "live_end_to_end"))
            desc = dict(DESCRIPTIONS)
            desc["baseline"] = desc["baseline"].format(depth=depth, batch=batch,
                                                       runs=len(base_runs))
            print_table(rows, desc, f"sow_redis ingest: {args.n:,} messages (~{avg_size:.0f} B), "
                                    f"{distinct:,} keys, {args.partitions} partitions")

            result = {
                "benchmark": "bench_ingest",
                "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": machine_info(r),
                "options": {"n": args.n, "keys": args.keys, "size": args.size,
                            "partitions": args.partitions, "workers": args.worker_counts,
                            "batch_size": batch, "repeat": args.repeat,
                            "baseline_batches_per_round_trip": depth,
                            "publish_chunk": CHUNK, "poll_s": POLL_S},
                "data": {"messages": args.n, "distinct_keys": distinct,
                         "avg_message_bytes": avg_size},
                "descriptions": desc,
                "baseline": {"best": baseline, "runs": base_runs},
                "sow_redis": {str(w): runs for w, runs in sow_runs.items()},
                "summary": rows,
                "verified": not failed,
            }
            console.print(f"results written to {write_json(args.json, result)}")
            if failed:
                console.print("[red]verification failed (see the JSON file)[/red]")
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping workers and redis-server[/yellow]")
        return 130
    except (BenchError, SowError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
