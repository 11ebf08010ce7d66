#!/usr/bin/env python3
"""Scale-out: applied messages per second with 1, 2 and 4 workers, on one redis-server and on a
3-primary Redis Cluster, in one run.

Starts, on free loopback ports (the machine's 6379 is never used), without persistence:

* ``server``: one redis-server (data and control plane in one);
* ``cluster``: a Redis Cluster of ``--primaries`` primaries (``--replicas`` replicas each;
  ``sow_redis.ops.server.spawn_cluster``, as ``sow-redis up --cluster`` and the tests start it)
  plus a plain redis-server as control plane (rq's queue and workers: rq cannot run on a
  cluster).

For each plane and each worker count W of ``--workers``: W ``python -m sow_redis.cli worker``
processes are started and registered in rq (excluded from the timing); a backlog of ``--n``
JSON messages (``--keys`` distinct keys, about ``--size`` bytes, ``--partitions``
partitions) is appended to the logs of a topic that is not yet in the registry (the running
workers cannot see it); the clock starts when the topic is stored in the registry and one
ingest job per partition is enqueued (what a publisher does) and stops when every
partition's applied cursor has reached its last stream id. ``applied/s`` = N / that time.
With ``--live`` also: the W workers running, the N messages are published as fast as one
publisher can (``append(..., jobs=settings)``, as ``Sow.publish`` does) and the clock runs
from the first publish to the last entry applied (``live/s``).

With ``--repeat R`` every plane × worker count runs R times, the rounds interleaved (server
and cluster alternate, so a busy moment of the machine hits both), and the best run of each
is reported (the table; the JSON keeps every run).

Every run is verified: records = distinct keys, the partitions' ``seq`` sum = N (each message
applied exactly once), nothing in the error streams. Each run ends once rq's queue is empty
(a live run's re-enqueued jobs would otherwise delay the next run's workers). The check of issue 12: ``cluster`` with 2
workers ≥ ``--target`` (1.5) × ``server`` with 1 worker, both measured here.

Output: a rich table and a JSON file (``--json``). Example::

    .venv/bin/python scripts/bench_scale.py --n 1000000 --workers 1,2 --repeat 2
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_ingest import make_messages, rate, topic_config, verify
from benchlib import BenchError, Workers, machine_info, redis_cpu_s, write_json
from rich.console import Console
from rich.table import Table

from sow_redis.apply.jobs import QUEUE_KEY, ensure_jobs
from sow_redis.connection import Client, connect, connect_pair, control_of
from sow_redis.ops.server import LocalCluster, spawn_cluster, spawn_redis_on_free_port
from sow_redis.publish.append import append, wait_applied
from sow_redis.registry import store_fingerprints, store_topics
from sow_redis.settings import Settings

POLL_S = 0.02
"""Seconds between two looks at the applied cursors. One look (48 partitions) costs this
process 0.43 ms of CPU on a server and 1.04 ms on the 3-primary cluster (redis-py's cluster
pipeline): every 5 ms, as before 2026-11-25, that took ~20 % of a core from the cluster's
primaries on a 2-core machine (the single server, bound to one core, did not feel it); every
20 ms it is ~5 %, and the end of a run is seen at most 20 ms late (< 1 % of a 2 s run)."""


class Plane:
    """A data plane under test: its data URL, control URL and processes."""

    def __init__(self, name: str, url: str, control_url: str | None, stop: Any,
                 cpu: Any) -> None:
        self.name, self.url, self.control_url = name, url, control_url
        self._stop, self._cpu = stop, cpu

    def client(self) -> Client:
        return connect_pair(self.url, self.control_url)

    def cpu_s(self) -> float:
        """redis-server CPU seconds used so far, summed over the plane's data nodes."""
        return float(self._cpu())

    def stop(self) -> None:
        self._stop()


def start_server(workdir: Path) -> Plane:
    port, proc = spawn_redis_on_free_port(workdir / "server", persist=False)
    url = f"redis://127.0.0.1:{port}/0"
    r = connect(url)

    def stop() -> None:
        proc.terminate()
        proc.wait(timeout=15)

    return Plane("server", url, None, stop, lambda: redis_cpu_s(r))


def start_cluster(workdir: Path, primaries: int, replicas: int) -> Plane:
    cluster: LocalCluster = spawn_cluster(primaries, replicas, workdir / "cluster")
    try:
        cport, control = spawn_redis_on_free_port(workdir / "control", persist=False)
    except BaseException:
        cluster.stop()
        raise
    nodes = [connect(cluster.node_url(p)) for p in cluster.ports]

    def stop() -> None:
        control.terminate()
        control.wait(timeout=15)
        cluster.stop()

    return Plane("cluster", cluster.url, f"redis://127.0.0.1:{cport}/0", stop,
                 lambda: sum(redis_cpu_s(n) for n in nodes))


def run_one(plane: Plane, workers: int, msgs: list[bytes], args: argparse.Namespace,
            logdir: Path) -> dict[str, Any]:
    """One plane × worker count: backlog (and live) applied/s, verified."""
    r = plane.client()
    settings = Settings.from_env(redis_url=plane.url, control_url=plane.control_url,
                                 batch_size=args.batch_size)
    w = Workers(plane.url, workers, logdir, {"SOW_BATCH_SIZE": str(args.batch_size)})
    if plane.control_url:
        w.env["SOW_CONTROL_URL"] = plane.control_url
    out: dict[str, Any] = {"plane": plane.name, "workers": workers}
    w.start()
    try:
        w.wait_registered(control_of(r))
        items = [("publish", m, None) for m in msgs]
        t = topic_config(f"scale{uuid.uuid4().hex[:8]}", args.partitions)
        store_fingerprints(r, [t])  # its partitions take entries under this definition
        res = append(r, t, items)  # not in the registry yet: no worker sees it
        cpu0, wcpu0 = plane.cpu_s(), w.cpu_s()
        t0 = time.perf_counter()
        store_topics(r, [t])
        ensure_jobs(r, t.name, sorted(res.last_ids), settings)
        wait_applied(r, t, res.last_ids, timeout_s=args.timeout, poll_s=POLL_S)
        s = time.perf_counter() - t0
        out["backlog_s"] = round(s, 3)
        out["applied_per_s"] = round(rate(len(msgs), s))
        out["redis_cpu_s"] = round(plane.cpu_s() - cpu0, 2)
        out["worker_cpu_s"] = round(w.cpu_s() - wcpu0, 2)
        out["verify"] = verify(r, t, len(msgs), min(args.keys, len(msgs)))
        if args.live:
            lt = topic_config(f"live{uuid.uuid4().hex[:8]}", args.partitions)
            store_topics(r, [lt])
            t0 = time.perf_counter()
            lres = append(r, lt, items, jobs=settings)
            pub_s = time.perf_counter() - t0
            wait_applied(r, lt, lres.last_ids, timeout_s=args.timeout, poll_s=POLL_S)
            s = time.perf_counter() - t0
            out["live_publish_per_s"] = round(rate(len(msgs), pub_s))
            out["live_per_s"] = round(rate(len(msgs), s))
            out["live_verify"] = verify(r, lt, len(msgs), min(args.keys, len(msgs)))
        # leave no queued job behind for the next run's workers: re-enqueued jobs of a live
        # run pile up in the queue and a new worker would run them all before the next topic
        deadline = time.monotonic() + args.timeout
        while control_of(r).llen(QUEUE_KEY) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        w.stop()
    for key in ("verify", "live_verify"):
        if key in out and not out[key]["ok"]:
            raise BenchError(f"{plane.name} with {workers} worker(s): {key} failed: {out[key]}")
    return out


def print_table(rows: list[dict[str, Any]], base: float, live: bool, console: Console) -> None:
    table = Table(title="Scale-out: applied messages/s (backlog applied by W workers)",
                  caption="× = applied/s over the single server with 1 worker; CPU = seconds "
                  "of redis-server (summed over nodes) and of the workers during the backlog")
    for col in ["plane", "workers", "applied/s", "×", "backlog s", "redis CPU s",
                "worker CPU s"] + (["live publish/s", "live end-to-end/s"] if live else []):
        table.add_column(col, justify="left" if col == "plane" else "right")
    for row in rows:
        cells = [row["plane"], str(row["workers"]), f"{row['applied_per_s']:,}",
                 f"{row['applied_per_s'] / base:.2f}", f"{row['backlog_s']:.2f}",
                 f"{row['redis_cpu_s']:.1f}", f"{row['worker_cpu_s']:.1f}"]
        if live:
            cells += [f"{row['live_publish_per_s']:,}", f"{row['live_per_s']:,}"]
        table.add_row(*cells)
    console.print(table)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000, help="messages per run")
    ap.add_argument("--keys", type=int, default=50_000, help="distinct SOW keys")
    ap.add_argument("--size", type=int, default=200, help="bytes per message, about")
    ap.add_argument("--partitions", type=int, default=48,
                    help="partitions of the topic (48: a multiple of 1, 2, 4 workers; spread "
                    "over 3 primaries by hash slot, unevenly with few partitions)")
    ap.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    ap.add_argument("--primaries", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=0,
                    help="replicas per primary (0: on a small machine replicas take the "
                    "cores the primaries need)")
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--live", action="store_true", help="also the live publish variant")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of each plane × worker count (interleaved); the best is shown")
    ap.add_argument("--target", type=float, default=1.5,
                    help="required ratio: cluster with 2 workers over server with 1")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run at most")
    ap.add_argument("--planes", default="server,cluster", help="planes to run, comma-separated")
    ap.add_argument("--json", default="test-artifacts/bench_scale.json")
    args = ap.parse_args()
    counts = [int(x) for x in args.workers.split(",")]
    console = Console()
    msgs = make_messages(args.n, args.keys, args.size)
    workdir = Path(tempfile.mkdtemp(prefix="sow-bench-scale-"))
    rows: list[dict[str, Any]] = []
    planes: list[Plane] = []
    machine: dict[str, Any] = {}
    try:
        wanted = args.planes.split(",")
        if "server" in wanted:
            planes.append(start_server(workdir))
        if "cluster" in wanted:
            planes.append(start_cluster(workdir, args.primaries, args.replicas))
        machine = machine_info(connect(planes[0].url.replace("+cluster", "")))
        for rnd in range(args.repeat):
            for plane in planes:
                for w in counts:
                    row = run_one(plane, w, msgs, args, workdir)
                    row["round"] = rnd
                    console.print(f"round {rnd + 1}: {plane.name} × {w} worker(s): "
                                  f"{row['applied_per_s']:,} applied/s")
                    rows.append(row)
    finally:
        for plane in planes:
            plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        k = (r["plane"], r["workers"])
        if k not in best or r["applied_per_s"] > best[k]["applied_per_s"]:
            best[k] = r
    shown = list(best.values())
    base = best[("server", 1)]["applied_per_s"] if ("server", 1) in best else max(
        r["applied_per_s"] for r in shown)
    print_table(shown, base, args.live, console)
    check: dict[str, Any] = {}
    two = [r for r in shown if r["plane"] == "cluster" and r["workers"] == 2]
    if two:
        ratio = two[0]["applied_per_s"] / base
        check = {"cluster_2_workers_over_server_1_worker": round(ratio, 2),
                 "target": args.target, "ok": ratio >= args.target}
        console.print(f"check: cluster with 2 workers = {ratio:.2f} × server with 1 worker "
                      f"(target ≥ {args.target}): {'PASS' if check['ok'] else 'FAIL'}")
    path = write_json(args.json, {
        "benchmark": "scale", "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "params": vars(args), "machine": machine, "runs": rows, "best": shown,
        "check": check})
    console.print(f"JSON: {path}")
    return 0 if not check or check["ok"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench_scale: {exc}", file=sys.stderr)
        sys.exit(2)
