#!/usr/bin/env python3
"""Bulk load throughput: ``sow-redis spark load`` against the CLI publish + workers path, on
the same data in the same run.

Starts its own redis-server on a free port (benchlib; the machine's 6379 is never used), takes
the NYC flights (``scripts/export_flights.py`` into ``--data``, 336,776 rows; ``--rows N``
keeps the first N), and measures, each into a fresh topic of the same definition (key
``/tailnum``, key domain ``flights``, hash indexes on ``/carrier`` and ``/origin``,
``--partitions`` partitions, the default change feed):

* ``cli publish + workers``: ``--workers`` W ``sow-redis worker`` processes are started and
  registered first (not timed); the clock runs from starting ``python -m sow_redis.cli publish
  -t T FILE`` (a subprocess, as a user runs it) until every partition's applied cursor
  reached its last entry (``wait_applied``, polled every 5 ms).
* ``spark load``: ``sow_redis.spark.load.load`` in this process on a ``--master`` session
  (``local[*]``), from the call until it returns (every split appended and applied). The
  session is created before (``spark start: session``) and one trivial job is run (``spark
  start: first job``: starting the Python workers); both are in the JSON, and the row
  ``spark load incl. start-up`` adds them to the load time.

* ``apply alone`` (the bound, ``--no-bound`` to skip): the same file appended to a third
  topic with no worker running (``publisher.append``, no jobs), then ``--workers`` workers
  started and the partitions handed to them; Redis's CPU while they apply is the work any path
  that gives the same SOW (records, hash indexes, change feed) makes Redis's single thread do,
  whoever sends it, less the log reads (``XRANGE``, from ``INFO commandstats``), which a path
  holding the messages itself could skip. When that exceeds half the CLI path's time, no load
  through the Lua apply path can be 2× the CLI path on this Redis.

* ``machine CPU``: the CPU seconds all processes used during each path (``/proc/stat``; run
  it on a quiet machine). A load on C cores cannot take less than its CPU ÷ C seconds, so 2×
  the CLI path is out of reach when the load uses more than C × (CLI seconds) ÷ 2 CPU
  seconds; the line says which side of that bound the run fell. ``CPU by process`` splits it
  (``benchlib.cpu_by_group``: redis-server, the workers, Spark's JVM and Python workers,
  this process with the publisher it ran).

Both runs are verified: records equal record by record (SOW key → message bytes), the change
sequences sum to the messages applied, and both error streams hold the same number of
rejections (flights without a tailnum: ``missing_key_field``).

Output: a rich table and a JSON file (``--json``). Example::

    .venv/bin/python scripts/bench_spark.py                 # full flights
    .venv/bin/python scripts/bench_spark.py --rows 20000    # quick
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchlib import (
    BenchError,
    Workers,
    applied_counts,
    cpu_by_group,
    cpu_by_group_since,
    machine_cpu_s,
    machine_info,
    private_redis,
    redis_cpu_s,
    write_json,
)
from redis import Redis
from rich.console import Console
from rich.table import Table

from sow_redis import keys
from sow_redis.config import TopicConfig, apply_topics, parse_topics
from sow_redis.errors import SowError
from sow_redis.partition_state import read_cursors
from sow_redis.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.005

console = Console(width=max(Console().width, 120))


def topic_config(name: str, partitions: int) -> TopicConfig:
    """The flights topic of the benchmark (one definition for both paths)."""
    return parse_topics(f'[[topic]]\nname = "{name}"\nkey = ["/tailnum"]\n'
                        'key_domain = "flights"\nhash_index = [["/carrier"], ["/origin"]]\n'
                        f"partitions = {partitions}\n")[0]


def flights_file(data: Path, rows: int | None) -> tuple[Path, int]:
    """The flights JSON Lines (exported when missing), cut to ``rows`` lines; (path, lines)."""
    data.mkdir(parents=True, exist_ok=True)
    full = data / "flights.jsonl"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "export_flights.py"), str(data)],
                   check=True, capture_output=True, timeout=600)
    if rows is None:
        with open(full, "rb") as fh:
            return full, sum(1 for _ in fh)
    part = data / f"flights_{rows}.jsonl"
    n = 0
    with open(full, "rb") as src, open(part, "wb") as dst:
        for line in src:
            if n >= rows:
                break
            dst.write(line)
            n += 1
    return part, n


def wait_all_applied(r: Redis, t: TopicConfig, timeout_s: float) -> None:
    """Until every partition's applied cursor reached the last entry of its log."""
    deadline = time.monotonic() + timeout_s
    while True:
        lasts: dict[int, str] = {}
        for p in range(t.partitions):
            if r.exists(keys.log(t.name, p)):
                lasts[p] = r.xinfo_stream(keys.log(t.name, p))["last-generated-id"].decode()
        cursors = read_cursors(r, t.name, lasts)
        if all(cursors.get(p) == sid for p, sid in lasts.items()):
            return
        if time.monotonic() > deadline:
            raise BenchError(f"topic {t.name}: not applied after {timeout_s:g} s")
        time.sleep(POLL_S)


def snapshot(r: Redis, t: TopicConfig) -> dict[bytes, bytes]:
    """SOW key → message bytes of every record of ``t``."""
    out: dict[bytes, bytes] = {}
    for p in range(t.partitions):
        for k, v in r.hscan_iter(keys.records(t.name, p), count=5000):
            out[k] = v.partition(b"\n")[2]
    return out


def run_cli(url: str, r: Redis, t: TopicConfig, path: Path, workers: int, tmp: Path,
            timeout_s: float) -> dict[str, Any]:
    apply_topics(r, [t])
    ws = Workers(url, workers, tmp)
    ws.start()
    try:
        ws.wait_registered(r)
        cpu0, m0, g0 = redis_cpu_s(r), machine_cpu_s(), cpu_by_group()
        t0 = time.perf_counter()
        env = dict(os.environ, SOW_REDIS_URL=url)
        proc = subprocess.run([sys.executable, "-m", "sow_redis.cli", "publish", "-t", t.name,
                               str(path)], env=env, cwd=str(ROOT), capture_output=True,
                              timeout=timeout_s, check=False)
        published = time.perf_counter() - t0
        if proc.returncode not in (0, 3):  # 3: some lines were rejected (reported)
            raise BenchError(f"sow-redis publish exited {proc.returncode}: "
                             f"{proc.stderr.decode()[-2000:]}")
        wait_all_applied(r, t, timeout_s)
        took = time.perf_counter() - t0
        redis_cpu, machine_cpu = redis_cpu_s(r) - cpu0, machine_cpu_s() - m0
        by_process = cpu_by_group_since(g0)
    finally:
        ws.stop()
    return {"seconds": took, "publish_seconds": published, "redis_cpu_s": redis_cpu,
            "machine_cpu_s": machine_cpu, "cpu_by_process": by_process,
            "stdout_tail": proc.stdout.decode()[-300:]}


def run_apply_bound(url: str, r: Redis, t: TopicConfig, path: Path, workers: int, tmp: Path,
                    timeout_s: float) -> dict[str, Any]:
    """Redis CPU seconds of applying the file's messages, appended first with no worker
    running; the log reads (``XRANGE`` inside the apply script) are given apart."""
    from sow_redis.jobs import ensure_jobs
    from sow_redis.publisher import append

    apply_topics(r, [t])
    with open(path, "rb") as fh:
        res = append(r, t, (("publish", line, None) for line in fh))
    ws = Workers(url, workers, tmp)
    ws.start()
    try:
        ws.wait_registered(r)
        r.config_resetstat()
        cpu0 = redis_cpu_s(r)
        t0 = time.perf_counter()
        ensure_jobs(r, t.name, list(range(t.partitions)), Settings.from_env(redis_url=url))
        wait_all_applied(r, t, timeout_s)
        took = time.perf_counter() - t0
        cpu = redis_cpu_s(r) - cpu0
        xrange = r.info("commandstats").get("cmdstat_xrange", {}).get("usec", 0) / 1e6
    finally:
        ws.stop()
    return {"appended": res.published, "seconds": took, "redis_cpu_s": cpu,
            "log_read_cpu_s": xrange, "apply_cpu_s": cpu - xrange}


def run_spark(url: str, r: Redis, t: TopicConfig, path: Path, master: str,
              batch_size: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    from sow_redis.spark.session import get_session

    spark = get_session(master, "bench-spark")
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    spark.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).sum()
    first_job_s = time.perf_counter() - t1
    from sow_redis.spark.load import load

    apply_topics(r, [t])
    cpu0, m0, g0 = redis_cpu_s(r), machine_cpu_s(), cpu_by_group()
    t2 = time.perf_counter()
    res = load(spark, url, t, [str(path)], batch_size=batch_size,
               load_id=f"bench-{uuid.uuid4().hex[:8]}")
    took = time.perf_counter() - t2
    return {"seconds": took, "session_s": session_s, "first_job_s": first_job_s,
            "redis_cpu_s": redis_cpu_s(r) - cpu0, "machine_cpu_s": machine_cpu_s() - m0,
            "cpu_by_process": cpu_by_group_since(g0),
            "result": {"rows": res.rows, "appended": res.appended, "rejected": res.rejected,
                       "applied": res.applied}, "spark": spark}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, help="Use the first N flights (default: all).")
    ap.add_argument("--data", default=str(ROOT / ".sow-redis" / "data"),
                    help="Folder of the exported flights (default: .sow-redis/data).")
    ap.add_argument("--input", help="A JSON Lines file of flights-like rows (a /tailnum, "
                    "/carrier and /origin each) to use instead of the NYC flights.")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2, help="Workers of the CLI path.")
    ap.add_argument("--master", default="local[*]", help="Spark master of the load.")
    ap.add_argument("--batch-size", type=int, default=5000,
                    help="Log entries per load_batch call of the Spark load.")
    ap.add_argument("--timeout", type=float, default=1800, help="Seconds per path, at most.")
    ap.add_argument("--no-bound", action="store_true",
                    help="Skip the apply-alone measurement (Redis CPU of the apply).")
    ap.add_argument("--json", default=str(ROOT / "bench-results" / "bench_spark.json"))
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_term(*_a: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    if args.input:
        path = Path(args.input)
        with open(path, "rb") as fh:
            n = sum(1 for _ in fh)
    else:
        path, n = flights_file(Path(args.data), args.rows)
    size = path.stat().st_size
    console.print(f"flights: {n:,} rows, {size / 1e6:.1f} MB ({path})")
    spark = None
    try:
        with private_redis("sow-bench-spark-") as server:
            r = Redis.from_url(server.url)
            tag = uuid.uuid4().hex[:6]
            t_cli = topic_config(f"cli_{tag}", args.partitions)
            t_spark = topic_config(f"spark_{tag}", args.partitions)
            cli = run_cli(server.url, r, t_cli, path, args.workers, server.workdir,
                          args.timeout)
            console.print(f"cli publish + {args.workers} workers: {cli['seconds']:.1f} s, "
                          f"{n / cli['seconds']:,.0f} msg/s")
            sp = run_spark(server.url, r, t_spark, path, args.master, args.batch_size)
            spark = sp.pop("spark")
            start_s = sp["session_s"] + sp["first_job_s"]
            console.print(f"spark load: {sp['seconds']:.1f} s, {n / sp['seconds']:,.0f} msg/s "
                          f"(+ {start_s:.1f} s Spark start-up)")
            a, b = snapshot(r, t_cli), snapshot(r, t_spark)
            ca, cb = applied_counts(r, t_cli), applied_counts(r, t_spark)
            import re

            got = re.search(r"rejected (\d+)", cli["stdout_tail"])
            cli_rejected = int(got.group(1)) if got else 0
            # the CLI publisher reports the lines it refuses; the load puts them in the
            # topic's error stream
            verify = {"ok": a == b and len(a) > 0 and ca[:2] == cb[:2]
                      and cb[2] == cli_rejected == sp["result"]["rejected"],
                      "cli_rejected": cli_rejected, "records": len(a),
                      "records_spark": len(b), "cli_counts": ca, "spark_counts": cb}
            rate_cli, rate_spark = n / cli["seconds"], n / sp["seconds"]
            rate_incl = n / (sp["seconds"] + start_s)
            rows = [
                {"path": f"cli publish + {args.workers} workers", "seconds": cli["seconds"],
                 "msg_s": rate_cli, "vs_cli": 1.0},
                {"path": "spark load", "seconds": sp["seconds"], "msg_s": rate_spark,
                 "vs_cli": rate_spark / rate_cli},
                {"path": "spark load incl. start-up", "seconds": sp["seconds"] + start_s,
                 "msg_s": rate_incl, "vs_cli": rate_incl / rate_cli},
            ]
            table = Table(title=f"bulk load of {n:,} NYC flights ({args.partitions} partitions, "
                                f"{os.cpu_count()} cores, Spark {args.master})")
            for col in ("path", "seconds", "msg/s", "× cli"):
                table.add_column(col, justify="left" if col == "path" else "right")
            for row in rows:
                table.add_row(row["path"], f"{row['seconds']:.1f}", f"{row['msg_s']:,.0f}",
                              f"{row['vs_cli']:.2f}")
            console.print(table)
            console.print(f"Spark start-up: session {sp['session_s']:.1f} s, first job "
                          f"{sp['first_job_s']:.1f} s; verified: {verify['ok']} "
                          f"({len(a):,} records on both paths); Redis CPU: cli path "
                          f"{cli['redis_cpu_s']:.1f} s, spark load {sp['redis_cpu_s']:.1f} s")
            cores = os.cpu_count() or 1
            need = cores * cli["seconds"] / 2
            console.print(
                f"machine CPU (all processes, /proc/stat): cli path {cli['machine_cpu_s']:.1f} s "
                f"({cli['machine_cpu_s'] / n * 1e6:.1f} µs/msg), spark load "
                f"{sp['machine_cpu_s']:.1f} s ({sp['machine_cpu_s'] / n * 1e6:.1f} µs/msg); "
                f"2× the cli path on {cores} cores needs the load to use at most {need:.1f} s "
                f"({'within' if sp['machine_cpu_s'] <= need else 'over'} it)")
            for name, run in (("cli path", cli), ("spark load", sp)):
                console.print(f"CPU by process, {name}: " + ", ".join(
                    f"{g} {v:.1f} s" for g, v in run["cpu_by_process"].items()))
            bound = None
            if not args.no_bound:
                bound = run_apply_bound(server.url, r, topic_config(f"bound_{tag}",
                                                                    args.partitions),
                                        path, args.workers, server.workdir, args.timeout)
                half = cli["seconds"] / 2
                console.print(
                    f"apply alone: {bound['redis_cpu_s']:.1f} s of Redis CPU, of which log reads "
                    f"{bound['log_read_cpu_s']:.1f} s: {bound['apply_cpu_s']:.1f} s of work on "
                    f"Redis's single thread for any path giving this SOW, against "
                    f"{half:.1f} s for 2× the cli path "
                    f"({'within' if bound['apply_cpu_s'] <= half else 'over'} it)")
            result = {
                "benchmark": "bench_spark",
                "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": machine_info(r),
                "options": {"rows": n, "partitions": args.partitions, "workers": args.workers,
                            "master": args.master, "batch_size": args.batch_size,
                            "input": str(path), "input_bytes": size},
                "cli": cli, "spark": sp, "apply_bound": bound,
                "spark_start": {"session_s": sp["session_s"], "first_job_s": sp["first_job_s"]},
                "summary": rows, "verify": verify, "verified": verify["ok"],
            }
            console.print(f"results written to {write_json(args.json, result)}")
            if not verify["ok"]:
                console.print("[red]verification failed (see the JSON file)[/red]")
                return 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        return 130
    except (BenchError, SowError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    finally:
        if spark is not None:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
