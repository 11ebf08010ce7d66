#!/usr/bin/env python3
"""Bulk load cost and throughput: ``sow-redis spark load`` against the CLI publish + workers
path on the same data in the same run (issue 28 items 3 and 4).

Starts its own redis-server on a free port (benchlib; the machine's 6379 is never used), takes
the NYC flights (``scripts/export_flights.py`` into ``--data``, 336,776 rows; ``--rows N``
keeps the first N), and loads them, each run into fresh topics of the same definition (key
``/tailnum``, key domain ``flights``, hash indexes on ``/carrier`` and ``/origin``,
``--partitions`` partitions, the default change feed).

Default mode (item 3), ``--runs`` times (3), alternating:

* ``cli publish + workers``: ``--workers`` W ``sow-redis worker`` processes are started and
  registered first (not timed); the clock runs from starting ``python -m sow_redis.cli publish
  -t T FILE`` (a subprocess, as a user runs it) until every partition's applied cursor
  reached its last entry (``wait_all_applied``, polled every 5 ms).
* ``spark load``: ``sow_redis.spark.load.load`` in this process on one session (``--master``,
  default ``local[*]``; ``--standalone W``: a Spark standalone cluster of W workers of 1 core
  and 1 GB started for the run), from the call until it returns. The session's start-up and
  a first trivial job are measured once, apart.

Each run is verified (records equal record by record, change sequences, rejections), and the
medians are printed as a table: wall time, rows/s, and CPU seconds per 1,000 rows for each
process group (Spark's JVMs, its Python workers, redis-server, the sow-redis workers, this
process with the CLI publisher it waited for), counted over this process and its descendants
only (:func:`benchlib.cpu_by_group` with ``own``: other users of a shared machine are not counted; the
``/proc/stat`` machine CPU is kept in the JSON too), with the load average of each run. The
goals of issue 28: the Spark load's CPU per row ≤ the CLI path's, its wall time ≤ 1.0× the
CLI path's. ``apply alone`` (``--no-bound`` to skip): Redis CPU of applying the file appended
with no worker running (the work any path giving this SOW makes Redis do).

``--scaling`` (item 4): no CLI path; the Spark load on ``local[2]`` against the server and
against a 3-primary Redis Cluster (no replicas) started for the run, and on a standalone
cluster of 2 workers limited to 1 and to 2 executors (``spark.cores.max``) against the
Redis Cluster; medians of ``--runs`` runs per layout, every run verified against the first,
with Redis CPU per applied row (all primaries).

Output: a rich table and a JSON file (``--json``; default ``bench-results/bench_spark.json``
or ``bench_spark_scaling.json``). Example::

    .venv/bin/python scripts/bench_spark.py                        # full flights, 3 runs
    .venv/bin/python scripts/bench_spark.py --rows 20000 --runs 1  # quick
    .venv/bin/python scripts/bench_spark.py --scaling --rows 100000 --partitions 6
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
from sow_redis.config import parse_topics
from sow_redis.errors import SowError
from sow_redis.model.topic import TopicConfig
from sow_redis.partition_state import read_cursors
from sow_redis.registry import apply_topics
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
        cpu0, m0, g0 = redis_cpu_s(r), machine_cpu_s(), cpu_by_group(own=True)
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
        by_process = cpu_by_group_since(g0, own=True)
    finally:
        ws.stop()
    return {"seconds": took, "publish_seconds": published, "redis_cpu_s": redis_cpu,
            "machine_cpu_s": machine_cpu, "cpu_by_process": by_process,
            "stdout_tail": proc.stdout.decode()[-300:]}


def run_apply_bound(url: str, r: Redis, t: TopicConfig, path: Path, workers: int, tmp: Path,
                    timeout_s: float) -> dict[str, Any]:
    """Redis CPU seconds of applying the file's messages, appended first with no worker
    running; the log reads (``XRANGE`` inside the apply script) are given apart."""
    from sow_redis.apply.jobs import ensure_jobs
    from sow_redis.publish.append import append

    apply_topics(r, [t])
    # nothing to apply before ensure_jobs below: the workers sweep once as they start (before
    # they register) and then every 300 s, so the entries are appended once they are
    # registered; appended before, a start sweep found them and a worker applied them before
    # the measurement began (0 s of log reads measured, 2026-11-28)
    ws = Workers(url, workers, tmp, env={"SOW_SWEEP_INTERVAL_S": "300"})
    ws.start()
    try:
        ws.wait_registered(r)
        with open(path, "rb") as fh:
            res = append(r, t, (("publish", line, None) for line in fh))
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


def cluster_redis_cpu_s(r: Any) -> float:
    """CPU seconds every primary of a Redis Cluster (or the one server) has used."""
    from sow_redis.connection import is_cluster

    if not is_cluster(r):
        return redis_cpu_s(r)
    infos = r.info("cpu", target_nodes=r.PRIMARIES)
    return sum(float(i["used_cpu_user"]) + float(i["used_cpu_sys"]) for i in infos.values())


SESSION: dict[str, Any] = {"spark": None, "key": None}


def spark_session(master: str, conf: dict[str, str] | None = None) -> tuple[Any, float, float]:
    """The benchmark's SparkSession on ``master`` with ``conf`` (a running one with other
    settings is stopped first); (session, seconds to start it, seconds of a first trivial job
    that starts the executors' Python workers); 0.0, 0.0 when it was running already."""
    from sow_redis.spark.session import get_session

    key = (master, tuple(sorted((conf or {}).items())))
    if SESSION["spark"] is not None and SESSION["key"] == key:
        return SESSION["spark"], 0.0, 0.0
    if SESSION["spark"] is not None:
        SESSION["spark"].stop()
        SESSION["spark"] = None
    t0 = time.perf_counter()
    spark = get_session(master, "bench-spark", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    spark.sparkContext.parallelize(range(4), 4).map(lambda x: x + 1).sum()
    SESSION.update(spark=spark, key=key)
    return spark, session_s, time.perf_counter() - t1


def run_spark(url: str, r: Any, t: TopicConfig, path: Path, master: str,
              batch_size: int, conf: dict[str, str] | None = None) -> dict[str, Any]:
    spark, session_s, first_job_s = spark_session(master, conf)
    from sow_redis.spark.load import load

    apply_topics(r, [t])
    cpu0, m0, g0 = cluster_redis_cpu_s(r), machine_cpu_s(), cpu_by_group(own=True)
    t2 = time.perf_counter()
    res = load(spark, url, t, [str(path)], batch_size=batch_size,
               load_id=f"bench-{uuid.uuid4().hex[:8]}")
    took = time.perf_counter() - t2
    return {"seconds": took, "session_s": session_s, "first_job_s": first_job_s,
            "redis_cpu_s": cluster_redis_cpu_s(r) - cpu0, "machine_cpu_s": machine_cpu_s() - m0,
            "cpu_by_process": cpu_by_group_since(g0, own=True),
            "result": {"rows": res.rows, "appended": res.appended, "rejected": res.rejected,
                       "applied": res.applied}}


def per_1000(run: dict[str, Any], rows: int) -> dict[str, float]:
    """CPU seconds per 1,000 rows of a run, by process group, plus ``all`` (their sum)."""
    out = {g: v * 1000 / rows for g, v in run["cpu_by_process"].items()}
    out["all"] = sum(run["cpu_by_process"].values()) * 1000 / rows
    return out


def median_of(runs: list[dict[str, Any]], rows: int) -> dict[str, Any]:
    """Medians over runs: seconds, rows/s, Redis CPU, and CPU per 1,000 rows by group."""
    import statistics

    groups = sorted({g for run in runs for g in per_1000(run, rows)})
    return {"seconds": statistics.median(x["seconds"] for x in runs),
            "rows_s": statistics.median(rows / x["seconds"] for x in runs),
            "redis_cpu_s": statistics.median(x["redis_cpu_s"] for x in runs),
            "cpu_per_1000_rows": {g: round(statistics.median(per_1000(x, rows).get(g, 0.0)
                                                             for x in runs), 4)
                                  for g in groups},
            "seconds_each": [round(x["seconds"], 2) for x in runs]}


def loadavg() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


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
    ap.add_argument("--standalone", type=int, default=0, metavar="W",
                    help="Start a Spark standalone cluster of W workers (1 core, 1 GB each) "
                    "and load through it (instead of --master).")
    ap.add_argument("--runs", type=int, default=3, help="Runs of each path (the median is "
                    "reported).")
    ap.add_argument("--scaling", action="store_true",
                    help="Item 4 of issue 28: the Spark load alone on local[2] against one "
                    "server and a 3-primary Redis Cluster, and on a standalone cluster with 1 "
                    "and 2 executors against the Redis Cluster (no CLI path).")
    ap.add_argument("--batch-size", type=int, default=5000,
                    help="Log entries per load_batch call of the Spark load.")
    ap.add_argument("--timeout", type=float, default=1800, help="Seconds per path, at most.")
    ap.add_argument("--no-bound", action="store_true",
                    help="Skip the apply-alone measurement (Redis CPU of the apply).")
    ap.add_argument("--json", default=None, help="JSON result file (default: "
                    "bench-results/bench_spark.json, or bench_spark_scaling.json).")
    return ap.parse_args(argv)


def executor_env() -> None:
    """The Spark processes of the benchmark listen on loopback only, and the executors run
    this interpreter (the package is shipped to them: spark/session.py)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def cpu_table(title: str, rows: list[tuple[str, dict[str, Any]]], cli_seconds: float | None
              ) -> Table:
    groups = ["spark JVM", "spark python workers", "redis-server", "sow-redis workers",
              "benchmark", "other", "all"]
    short = {"spark JVM": "JVM", "spark python workers": "Python wk", "redis-server": "redis",
             "sow-redis workers": "sow wk", "benchmark": "bench+pub", "other": "other",
             "all": "all"}
    table = Table(title=title)
    for col in ("path", "seconds", "rows/s", *(["× cli"] if cli_seconds else []),
                *[short[g] for g in groups]):
        table.add_column(col, justify="left" if col == "path" else "right")
    for name, m in rows:
        cells = [name, f"{m['seconds']:.1f}", f"{m['rows_s']:,.0f}"]
        if cli_seconds:
            cells.append(f"{cli_seconds / m['seconds']:.2f}")
        cells += [f"{m['cpu_per_1000_rows'].get(g, 0.0):.4f}" for g in groups]
        table.add_row(*cells)
    return table


def main_compare(args: argparse.Namespace, path: Path, n: int) -> int:
    """Item 3: the CLI path and the Spark load on the same data in the same run, ``--runs``
    times each (alternating), medians of wall time and CPU per 1,000 rows by process."""
    from sow_redis.spark.standalone import start_standalone

    standalone = None
    with private_redis("sow-bench-spark-") as server:
        r = Redis.from_url(server.url)
        master = args.master
        try:
            if args.standalone:
                standalone = start_standalone(server.workdir / "spark", args.standalone)
                master = standalone.master_url
            _s, session_s, first_job_s = spark_session(master)
            console.print(f"Spark on {master}: session {session_s:.1f} s, first job "
                          f"{first_job_s:.1f} s (load average {loadavg()})")
            clis, sparks, verified, loads = [], [], [], []
            for i in range(args.runs):
                tag = uuid.uuid4().hex[:6]
                t_cli = topic_config(f"cli_{tag}", args.partitions)
                t_spark = topic_config(f"spark_{tag}", args.partitions)
                loads.append(loadavg())
                cli = run_cli(server.url, r, t_cli, path, args.workers, server.workdir,
                              args.timeout)
                sp = run_spark(server.url, r, t_spark, path, master, args.batch_size)
                ok = verify_pair(r, t_cli, t_spark, cli, sp)
                console.print(f"run {i + 1}: cli {cli['seconds']:.1f} s, spark "
                              f"{sp['seconds']:.1f} s, verified {ok['ok']} (load average "
                              f"{loads[-1]})")
                clis.append(cli)
                sparks.append(sp)
                verified.append(ok)
                r.flushdb()
            mc, ms = median_of(clis, n), median_of(sparks, n)
            console.print(cpu_table(
                f"bulk load of {n:,} NYC flights, median of {args.runs} runs "
                f"({args.partitions} partitions, {os.cpu_count()} cores, Spark {master}); "
                "CPU s per 1,000 rows: Spark's JVMs, its Python workers, redis-server, "
                "sow-redis workers, this process with the publisher",
                [(f"cli publish + {args.workers} workers", mc), ("spark load", ms)],
                mc["seconds"]))
            cpu_ratio = ms["cpu_per_1000_rows"]["all"] / mc["cpu_per_1000_rows"]["all"]
            wall_ratio = ms["seconds"] / mc["seconds"]
            console.print(f"spark load / cli path: CPU per row {cpu_ratio:.2f}× (goal ≤ 1.0: "
                          f"{'met' if cpu_ratio <= 1.0 else 'not met'}), wall time "
                          f"{wall_ratio:.2f}× (goal ≤ 1.0: "
                          f"{'met' if wall_ratio <= 1.0 else 'not met'}); load averages "
                          f"{'; '.join(loads)}")
            bound = None
            if not args.no_bound:
                bound = run_apply_bound(server.url, r, topic_config(f"bound_{uuid.uuid4().hex[:6]}",
                                                                    args.partitions),
                                        path, args.workers, server.workdir, args.timeout)
                console.print(f"apply alone: {bound['redis_cpu_s']:.1f} s of Redis CPU "
                              f"({bound['redis_cpu_s'] * 1000 / n:.3f} s per 1,000 rows), of "
                              f"which log reads {bound['log_read_cpu_s']:.1f} s")
            ok = all(v["ok"] for v in verified)
            result = {
                "benchmark": "bench_spark",
                "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": machine_info(r), "load_averages": loads,
                "options": {"rows": n, "partitions": args.partitions, "workers": args.workers,
                            "master": master, "standalone_workers": args.standalone,
                            "batch_size": args.batch_size, "runs": args.runs,
                            "input": str(path), "input_bytes": path.stat().st_size},
                "spark_start": {"session_s": session_s, "first_job_s": first_job_s},
                "median": {"cli": mc, "spark": ms},
                "ratios": {"cpu_per_row": cpu_ratio, "wall": wall_ratio},
                "runs": {"cli": clis, "spark": sparks}, "apply_bound": bound,
                "verify": verified, "verified": ok,
            }
            out = args.json or str(ROOT / "bench-results" / "bench_spark.json")
            console.print(f"results written to {write_json(out, result)}")
            if not ok:
                console.print("[red]verification failed (see the JSON file)[/red]")
                return 1
        finally:
            if SESSION["spark"] is not None:
                SESSION["spark"].stop()
                SESSION["spark"] = None
            if standalone is not None:
                standalone.stop()
    return 0


def verify_pair(r: Any, t_cli: TopicConfig, t_spark: TopicConfig, cli: dict[str, Any],
                sp: dict[str, Any]) -> dict[str, Any]:
    """Both paths gave the same records (SOW key → bytes), change-sequence sums and
    rejections."""
    import re

    a, b = snapshot(r, t_cli), snapshot(r, t_spark)
    ca, cb = applied_counts(r, t_cli), applied_counts(r, t_spark)
    got = re.search(r"rejected (\d+)", cli["stdout_tail"])
    cli_rejected = int(got.group(1)) if got else 0
    return {"ok": a == b and len(a) > 0 and ca[:2] == cb[:2]
            and cb[2] == cli_rejected == sp["result"]["rejected"],
            "cli_rejected": cli_rejected, "records": len(a), "records_spark": len(b),
            "cli_counts": ca, "spark_counts": cb}


def main_scaling(args: argparse.Namespace, path: Path, n: int) -> int:
    """Item 4: the Spark load's throughput by Spark and Redis layout (see ``--scaling``)."""
    from sow_redis.connection import connect
    from sow_redis.ops.server import spawn_cluster
    from sow_redis.spark.standalone import start_standalone

    with private_redis("sow-bench-spark-scale-") as server:
        r1 = Redis.from_url(server.url)
        cluster = standalone = None
        try:
            cluster = spawn_cluster(3, 0, server.workdir / "cluster")
            rc = connect(cluster.url)
            standalone = start_standalone(server.workdir / "spark", 2)
            layouts = [
                ("local[2], one server", "local[2]", None, server.url, r1),
                ("local[2], 3-primary cluster", "local[2]", None, cluster.url, rc),
                ("standalone, 1 executor, 3-primary cluster", standalone.master_url,
                 {"spark.cores.max": "1"}, cluster.url, rc),
                ("standalone, 2 executors, 3-primary cluster", standalone.master_url,
                 {"spark.cores.max": "2"}, cluster.url, rc),
            ]
            reference: dict[bytes, bytes] | None = None
            rows, detail, loads = [], {}, []
            ok = True
            for name, master, conf, url, r in layouts:
                _s, session_s, first_s = spark_session(master, conf)
                runs = []
                for _i in range(args.runs):
                    loads.append(loadavg())
                    t = topic_config(f"scale_{uuid.uuid4().hex[:6]}", args.partitions)
                    run = run_spark(url, r, t, path, master, args.batch_size, conf)
                    snap = snapshot(r, t)
                    if reference is None:
                        reference = snap
                    ok = ok and snap == reference and len(snap) > 0
                    run["redis_cpu_per_1000_applied"] = (
                        run["redis_cpu_s"] * 1000 / max(run["result"]["applied"], 1))
                    runs.append(run)
                    console.print(f"{name}: {run['seconds']:.1f} s, {n / run['seconds']:,.0f} "
                                  f"rows/s (load average {loads[-1]})")
                    r.delete(*keys.all_partition_keys(t.name, t.partitions, 2))  # memory
                m = median_of(runs, n)
                m["redis_cpu_per_1000_applied"] = sorted(
                    x["redis_cpu_per_1000_applied"] for x in runs)[len(runs) // 2]
                m["spark_start_s"] = session_s + first_s
                rows.append((name, m))
                detail[name] = {"median": m, "runs": runs}
            console.print(cpu_table(
                f"Spark load scaling, {n:,} NYC flights, median of {args.runs} runs "
                f"({args.partitions} partitions, {os.cpu_count()} cores; CPU s per 1,000 rows)",
                rows, None))
            for name, m in rows:
                console.print(f"{name}: Redis CPU {m['redis_cpu_per_1000_applied']:.3f} s per "
                              "1,000 applied rows")
            result = {
                "benchmark": "bench_spark_scaling",
                "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": machine_info(r1), "load_averages": loads,
                "options": {"rows": n, "partitions": args.partitions, "runs": args.runs,
                            "batch_size": args.batch_size, "input": str(path)},
                "layouts": detail, "verified": ok,
            }
            out = args.json or str(ROOT / "bench-results" / "bench_spark_scaling.json")
            console.print(f"verified: {ok}; results written to {write_json(out, result)}")
            return 0 if ok else 1
        finally:
            if SESSION["spark"] is not None:
                SESSION["spark"].stop()
                SESSION["spark"] = None
            if standalone is not None:
                standalone.stop()
            if cluster is not None:
                cluster.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_term(*_a: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    executor_env()
    if args.input:
        path = Path(args.input)
        with open(path, "rb") as fh:
            n = sum(1 for _ in fh)
    else:
        path, n = flights_file(Path(args.data), args.rows)
    console.print(f"flights: {n:,} rows, {path.stat().st_size / 1e6:.1f} MB ({path}); load "
                  f"average {loadavg()}")
    try:
        return main_scaling(args, path, n) if args.scaling else main_compare(args, path, n)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        return 130
    except (BenchError, SowError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
