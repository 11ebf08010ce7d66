#!/usr/bin/env python3
"""Views, conflated topics and delta subscriptions (issue 26): what a view costs the apply
throughput of its underlying topic, how far a view lags behind it, how much a conflated topic
thins a stream, and how many bytes a delta subscription saves.

Starts its own redis-server on a free port (no persistence; the machine's 6379 is never
used) and one ``sow-redis worker`` for the whole run, and for every measurement a fresh
**deriver process** (``python -m sow_redis.cli derive``, as ``sow-redis up`` starts it) on
topics defined for that measurement alone (their keys and registry entries are removed
after it). Redis, the worker, the deriver and this benchmark share the machine's cores, so a
view's cost is the real CPU contention of a deriver beside the write path (on the 2-core
project machine: two cores for four busy processes).

1. **Apply throughput** (``--n`` messages of 15 fields, ``id`` round robin over ``--keys``
   keys, written through with ``sow_redis.publish.append.append`` from this process as
   ``bench_previous.py`` does) into a topic with 0 (the baseline), 1 and 3 views over it,
   the same messages each time, rounds interleaved (baseline, 1 view, 3 views, then the
   other way round, …) so drift cancels. Per variant: messages per second of the publish
   (the figure of the goal), and of the publish until every view reflects the last message
   (``caught up``), CPU seconds of redis-server, the deriver and the worker per 1,000
   messages, and the view rows written (and removed) per 1,000 messages. Views: by ``/g``
   (COUNT, SUM, AVG, MIN, MAX), by ``/sym`` (COUNT, SUM) and by ``/g`` of the records with
   ``/side = 'B'`` (COUNT, SUM); 1 view is the first.
2. **View lag**: a publisher process publishes at a paced rate (``--lag-rates``, in batches
   of rate/1000 per millisecond, for ``--lag-seconds``) into a topic with one view (by
   ``/g``, ``--groups`` groups, with ``MAX(/n) AS /n``); this process subscribes to the view.
   The lag of change ``n`` is the time from its **publish** (the publisher's clock just
   before the publish call that carries it; publish → log → apply → change feed included)
   to the receipt of the first view event of its group whose ``/n`` is at least ``n`` (the
   view row reflecting it). One host, one clock. The first ``--warmup`` seconds are left
   out. p50 / p99 / max in milliseconds. The baseline, in rounds alternating with the
   view's: the same publisher and deriver, this process subscribed to the topic itself
   (the lag of change ``n`` is its own event's receipt): what any subscriber waits on this
   machine at that moment, so the view's own share is the difference.
3. **Conflation**: the same paced publisher (``--conf-rate``) over ``--conf-keys`` keys into
   a topic with one conflated topic per interval of ``--intervals``; this process subscribes
   to each and counts their events per second, against the underlying rate and the bound
   (keys ÷ interval).
4. **Delta subscriptions**: ``--delta-n`` updates of ``--keys`` 15-field records on a topic
   with ``change_previous``, each changing 3 fields (``px``, ``filled``, ``leaves``); a
   plain and a ``delta=True`` subscription receive the same stream. Bytes per event: the
   JSON line ``sow-redis subscribe`` prints (``to_line``) and its ``data`` alone.

Every measurement is repeated ``--runs`` times and the medians are reported, with the load
average at the start and the end. Output: a table and a JSON file (``--out``). Example::

    .venv/bin/python scripts/bench_views.py --runs 3 --out bench-results/bench_views.json
    .venv/bin/python scripts/bench_views.py --quick     # a smoke run of a few seconds
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import multiprocessing as mp
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from redis import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this tree's sow_redis, also for benchlib

from benchlib import (  # noqa: E402
    BenchError,
    RedisServer,
    Workers,
    applied_counts,
    machine_info,
    private_redis,
    proc_cpu_s,
    redis_cpu_s,
    write_json,
)

from sow_redis import keys  # noqa: E402
from sow_redis.client import Sow  # noqa: E402
from sow_redis.feed.subscriber import to_line  # noqa: E402
from sow_redis.publish.append import append  # noqa: E402
from sow_redis.registry import get_topic  # noqa: E402
from sow_redis.settings import Settings  # noqa: E402

SETTINGS = Settings.from_env()
"""Write-through on (the default): a caught-up partition's chunk is applied by its append."""

SYMS = [f"S{i:02d}" for i in range(20)]
STATUSES = ["new", "partial", "filled", "cancelled"]
VIEWS = [  # (suffix, grouping, projection, filter)
    ("v1", "/g", ["/g", "COUNT(/id) AS /count", "SUM(/qty) AS /qty", "AVG(/px) AS /avg_px",
                  "MIN(/px) AS /lo", "MAX(/px) AS /hi", "MAX(/n) AS /n"], None),
    ("v2", "/sym", ["/sym", "COUNT(/id) AS /count", "SUM(/filled) AS /filled",
                    "MAX(/n) AS /n"], None),
    ("v3", "/g", ["/g", "COUNT(/id) AS /count", "SUM(/leaves) AS /leaves", "MAX(/n) AS /n"],
     "/side = 'B'"),
]
VARIANTS = {"0 views": 0, "1 view": 1, "3 views": 3}


# -- data ------------------------------------------------------------------------------------
def record(n: int, key: int, groups: int, rnd: random.Random) -> dict[str, Any]:
    """A 15-field order record: ``id`` = key, ``g`` = key % groups, ``n`` = its number."""
    qty = rnd.randint(1, 100_000)
    filled = rnd.randint(0, qty)
    return {"id": key, "g": key % groups, "sym": SYMS[key % len(SYMS)],
            "side": "B" if key % 2 else "S", "px": round(rnd.uniform(1, 1000), 4), "qty": qty,
            "filled": filled, "leaves": qty - filled, "status": STATUSES[n % 4],
            "venue": f"XV{key % 7}", "trader": f"t{key % 50:03d}", "account": f"ACC{key % 300}",
            "ccy": "USD" if key % 3 else "EUR", "ts": 1_790_000_000_000 + n, "n": n}


def make_messages(n: int, nkeys: int, groups: int) -> list[bytes]:
    """N messages (:func:`record`), ``id`` round robin over ``nkeys`` keys."""
    rnd = random.Random(26)
    return [orjson.dumps(record(i, i % nkeys, groups, rnd)) for i in range(n)]


def views_toml(topic: str, count: int) -> str:
    """The first ``count`` of :data:`VIEWS` over ``topic`` (names ``<topic>_v1`` …)."""
    out = []
    for suffix, grouping, projection, filter_ in VIEWS[:count]:
        proj = ", ".join(f'"{p}"' for p in projection)
        out.append(f'[[view]]\nname = "{topic}_{suffix}"\nunderlying = "{topic}"\n'
                   f'projection = [{proj}]\ngrouping = ["{grouping}"]\n'
                   + (f'filter = "{filter_}"\n' if filter_ else ""))
    return "".join(out)


def topic_toml(name: str, partitions: int, extra: str = "") -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = {partitions}\n{extra}'


# -- processes -------------------------------------------------------------------------------
class DeriverProcess:
    """``python -m sow_redis.cli derive`` on ``url``, logging to a file in ``logdir``."""

    tree: Path = ROOT
    """The folder whose ``sow_redis`` the derivers import (``--deriver-tree``)."""
    profile_dir: Path | None = None
    """Set by ``--profile``: ``py-spy record`` follows each deriver (collapsed stacks)."""

    def __init__(self, url: str, logdir: Path) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.log = logdir / f"derive-{self.tag}.log"
        self.spy: subprocess.Popen[bytes] | None = None
        env = dict(os.environ, SOW_REDIS_URL=url, PYTHONPATH=str(self.tree))
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "derive"],
                                         env=env, cwd=str(self.tree), stdout=fh,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def wait_started(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while b"deriver on" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the deriver did not start:\n{self.tail()}")
            time.sleep(0.02)
        if self.profile_dir is not None:
            self.profile_dir.mkdir(parents=True, exist_ok=True)
            self.spy = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw",
                 "-r", "200", "-p", str(self.proc.pid),
                 "-o", str(self.profile_dir / f"derive-{self.tag}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def cpu_s(self) -> float:
        return proc_cpu_s(self.proc.pid) if self.proc.poll() is None else 0.0

    def stop(self) -> None:
        if self.spy is not None:  # py-spy writes its file on SIGINT
            self.spy.send_signal(signal.SIGINT)
            self.spy.wait(30)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def remove_topics(r: Redis, names: list[str]) -> None:
    """Remove the topics' keys, registry entries and deriver leases (between measurements)."""
    for name in names:
        t = get_topic(r, name)
        r.delete(*keys.all_partition_keys(name, t.partitions, len(t.hash_index)))
        r.delete(keys.derive_lease(name), keys.derive_state(name))
        r.hdel(keys.REGISTRY, name)
        r.hdel(keys.LAST_USED, name)


def wait_for(check: Any, timeout_s: float, what: str, poll_s: float = 0.005) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)


def max_n(sow: Sow, view: str) -> int:
    """The largest ``/n`` of a view's rows (-2 when it has none)."""
    return max((rec.obj().get("n", -2) for rec in sow.sow(view)), default=-2)


# -- 1. apply throughput ---------------------------------------------------------------------
def run_throughput(server: RedisServer, ws: Workers, msgs: list[bytes], nviews: int,
                   args: argparse.Namespace) -> dict[str, Any]:
    """Publish ``msgs`` into a fresh topic with ``nviews`` views, a fresh deriver running."""
    sow = Sow(server.url)
    r = sow.r
    name = f"tp_{uuid.uuid4().hex[:8]}"
    views = [f"{name}_{v[0]}" for v in VIEWS[:nviews]]
    sow.apply_config(topic_toml(name, args.partitions) + views_toml(name, nviews))
    t = sow.topic(name)
    der = DeriverProcess(server.url, server.workdir)
    try:
        der.wait_started()
        warm = record(-1, args.keys, args.groups, random.Random(0)) | {"side": "B"}
        append(r, t, [("publish", orjson.dumps(warm), None)], jobs=SETTINGS)
        for v in views:
            wait_for(lambda v=v: max_n(sow, v) == -1, 60, f"{v} to follow", 0.02)
        # the last n each view reflects: the last message (of side B for the filtered one)
        last = len(msgs) - 1
        last_b = max(i for i, m in enumerate(msgs) if b'"side":"B"' in m)
        expected = {v: last_b if v.endswith("_v3") else last for v in views}
        cpu0 = (redis_cpu_s(r), der.cpu_s(), ws.cpu_s())
        t0 = time.perf_counter()
        result = append(r, t, (("publish", m, None) for m in msgs), jobs=SETTINGS)
        wall = time.perf_counter() - t0
        for v, n in expected.items():
            wait_for(lambda v=v, n=n: max_n(sow, v) == n, 120, f"{v} to catch up")
        caught = time.perf_counter() - t0
        cpu = [b - a for a, b in zip(cpu0, (redis_cpu_s(r), der.cpu_s(), ws.cpu_s()))]
    finally:
        der.stop()
    records, seq, errors = applied_counts(r, t)
    if (result.published, records, seq, errors) != (len(msgs), args.keys + 1, len(msgs) + 1, 0):
        raise BenchError(f"VERIFY FAILED: published {result.published}, records {records}, "
                         f"seq sum {seq}, errors {errors}")
    for v in views:
        rows = [rec.obj() for rec in sow.sow(v)]
        want = args.keys + 1 if not v.endswith("_v3") else args.keys // 2 + 1
        if sum(row["count"] for row in rows) != want:
            raise BenchError(f"VERIFY FAILED: {v} counts {sum(row['count'] for row in rows)} "
                             f"records, not {want}")
    rows = sum(applied_counts(r, sow.topic(v))[1] for v in views)  # written, removals too
    remove_topics(r, [name, *views])
    k = len(msgs) / 1000
    return {"msgs_per_s": len(msgs) / wall, "caught_up_msgs_per_s": len(msgs) / caught,
            "view_rows_per_1k": rows / k,
            "catch_up_s": caught - wall, "redis_cpu_s_per_1k": cpu[0] / k,
            "deriver_cpu_s_per_1k": cpu[1] / k, "worker_cpu_s_per_1k": cpu[2] / k}


# -- paced publisher (its own process) -------------------------------------------------------
def publish_paced(url: str, topic: str, n: int, rate: int, nkeys: int, groups: int,
                  times_path: str) -> None:
    """Publish ``n`` records at ``rate`` per second in batches of rate/1000 per millisecond;
    write the publish time (ns) of each batch's first ``n`` to ``times_path`` (JSON)."""
    sow = Sow(settings=Settings.from_env(redis_url=url))
    rnd = random.Random(7)
    batch = max(1, rate // 1000)
    sent: list[tuple[int, int]] = []
    t0 = time.perf_counter()
    for i in range(0, n, batch):
        wait = t0 + i / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        now = time.time_ns()
        sow.publish(topic, [record(j, j % nkeys, groups, rnd) for j in range(i, min(n, i + batch))])
        sent.append((i, now))
    Path(times_path).write_bytes(orjson.dumps(sent))


def start_publisher(url: str, topic: str, n: int, rate: int, nkeys: int, groups: int,
                    workdir: Path) -> tuple[mp.Process, Path]:
    path = workdir / f"sent-{uuid.uuid4().hex[:6]}.json"
    proc = mp.get_context("fork").Process(
        target=publish_paced, args=(url, topic, n, rate, nkeys, groups, str(path)))
    proc.start()
    return proc, path


def percentiles(vals: list[float]) -> dict[str, float]:
    vals = sorted(vals)

    def q(p: float) -> float:
        return vals[min(len(vals) - 1, int(p * len(vals)))]

    return {"p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": vals[-1]}


# -- 2. view lag -----------------------------------------------------------------------------
def run_lag(server: RedisServer, rate: int, args: argparse.Namespace,
            target: str = "view") -> dict[str, Any]:
    """Lag of one view behind changes published at ``rate`` per second (see the docstring);
    ``target`` ``"topic"``: of a subscriber of the underlying topic itself, the same deriver
    keeping the same view meanwhile (the baseline: what any subscriber waits)."""
    sow = Sow(server.url)
    name = f"lag_{uuid.uuid4().hex[:8]}"
    view = f"{name}_v1"
    sow.apply_config(topic_toml(name, args.partitions) + views_toml(name, 1))
    n = int(rate * args.lag_seconds)
    der = DeriverProcess(server.url, server.workdir)
    got: list[tuple[int, int, int]] = []  # (receive ns, group, n)
    try:
        der.wait_started()
        wait_for(lambda: sow.r.exists(keys.derive_lease(view)) == 1, 60, "the deriver's lease")
        cpu0 = der.cpu_s()
        # a view row is followed by its group; a record of the topic by its key (in order)
        field, groups = ("g", args.groups) if target == "view" else ("id", args.keys)
        with sow.subscribe(view if target == "view" else name) as sub:
            time.sleep(0.2)  # the deriver's subscription to the topic is placed
            proc, path = start_publisher(server.url, name, n, rate, args.keys, args.groups,
                                         server.workdir)
            deadline = time.monotonic() + args.lag_seconds * 3 + 60
            last = {(k % args.keys) % groups: k for k in range(max(0, n - args.keys), n)}
            while last and time.monotonic() < deadline:  # until each group's last change
                m = sub.get(1.0)
                if m is not None and m["kind"] == "publish":
                    now = time.time_ns()
                    data = m["data"]
                    got.append((now, data[field], data["n"]))
                    if last.get(data[field], n) <= data["n"]:
                        del last[data[field]]
            proc.join(60)
        cpu = der.cpu_s() - cpu0
    finally:
        der.stop()
    sent = orjson.loads(Path(path).read_bytes())
    remove_topics(sow.r, [name, view])
    return lag_figures(sent, got, n, rate, groups, args) | {"deriver_cpu_s": cpu,
                                                           "events": len(got)}


def lag_figures(sent: list[list[int]], got: list[tuple[int, int, int]], n: int, rate: int,
                groups: int, args: argparse.Namespace) -> dict[str, Any]:
    """Per change after the warm-up: receive time of the first event of its group (of
    ``groups``: the view's ``/g``, or the topic's keys) with ``/n`` ≥ its number, less its
    publish time (ms)."""
    batch = max(1, rate // 1000)
    start_ns = {i: t for i, t in sent}
    by_group: dict[int, tuple[list[int], list[int]]] = {}
    for now, g, top in got:  # per group, in arrival order; n only grows within a group
        ns, tops = by_group.setdefault(g, ([], []))
        if not tops or top > tops[-1]:
            ns.append(now)
            tops.append(top)
    t_first = sent[0][1]
    lags, missing = [], 0
    for k in range(n):
        t_k = start_ns[k - k % batch]
        if t_k - t_first < args.warmup * 1e9:
            continue
        ns, tops = by_group.get((k % args.keys) % groups, ([], []))
        at = bisect.bisect_left(tops, k)
        if at == len(tops):
            missing += 1
        else:
            lags.append((ns[at] - t_k) / 1e6)
    if not lags:
        raise BenchError("VERIFY FAILED: no change received")
    if missing:
        raise BenchError(f"VERIFY FAILED: {missing} change(s) never received")
    return {"rate": rate, "changes": len(lags), **percentiles(lags)}


# -- 3. conflation ---------------------------------------------------------------------------
def run_conflation(server: RedisServer, args: argparse.Namespace) -> dict[str, Any]:
    """Events per second of conflated topics against the paced underlying rate."""
    sow = Sow(server.url)
    name = f"conf_{uuid.uuid4().hex[:8]}"
    targets = {ms: f"{name}_c{ms}" for ms in args.interval_list}
    sow.apply_config(topic_toml(name, args.partitions) + "".join(
        f'[[conflated_topic]]\nname = "{c}"\nunderlying = "{name}"\ninterval = "{ms}ms"\n'
        for ms, c in targets.items()))
    n = int(args.conf_rate * args.conf_seconds)
    der = DeriverProcess(server.url, server.workdir)
    received: dict[int, list[int]] = {ms: [] for ms in targets}
    stop = threading.Event()

    def listen(ms: int, sub: Any) -> None:
        while not stop.is_set():
            m = sub.get(0.05)
            if m is not None and m["kind"] == "publish":
                received[ms].append(time.time_ns())

    try:
        der.wait_started()
        for c in targets.values():
            wait_for(lambda c=c: sow.r.exists(keys.derive_lease(c)) == 1, 60, f"{c}'s lease")
        subs = {ms: sow.subscribe(c) for ms, c in targets.items()}
        threads = [threading.Thread(target=listen, args=(ms, s), daemon=True)
                   for ms, s in subs.items()]
        for th in threads:
            th.start()
        time.sleep(0.2)
        proc, path = start_publisher(server.url, name, n, args.conf_rate, args.conf_keys,
                                     args.groups, server.workdir)
        proc.join(args.conf_seconds * 3 + 60)
        time.sleep(max(args.interval_list) / 1000 * 2)
        stop.set()
        for th in threads:
            th.join(10)
        for s in subs.values():
            s.close()
    finally:
        der.stop()
    sent = orjson.loads(Path(path).read_bytes())
    t0, t1 = sent[0][1] + args.warmup * 1e9, sent[-1][1]
    span = (t1 - t0) / 1e9
    underlying = sum(1 for i, t in sent if t0 <= t <= t1) * max(1, args.conf_rate // 1000)
    out: dict[str, Any] = {"underlying_per_s": underlying / span, "keys": args.conf_keys,
                           "intervals": {}}
    for ms, times in received.items():
        per_s = sum(1 for t in times if t0 <= t <= t1) / span
        bound = min(args.conf_rate, args.conf_keys * 1000 / ms)
        out["intervals"][str(ms)] = {"events_per_s": per_s, "bound_per_s": bound,
                                     "reduction": out["underlying_per_s"] / per_s
                                     if per_s else 0.0}
    remove_topics(sow.r, [name, *targets.values()])
    return out


# -- 4. delta subscriptions ------------------------------------------------------------------
def run_delta(server: RedisServer, args: argparse.Namespace) -> dict[str, Any]:
    """Bytes per event of a plain and a delta subscription over the same updates."""
    sow = Sow(server.url)
    name = f"delta_{uuid.uuid4().hex[:8]}"
    sow.apply_config(topic_toml(name, args.partitions, "change_previous = true\n"))
    rnd = random.Random(3)
    current = [record(k, k, args.groups, rnd) for k in range(args.keys)]
    for i in range(0, args.keys, 1000):
        sow.publish(name, current[i:i + 1000])
    totals = {"full": [0, 0, 0], "delta": [0, 0, 0]}  # events, line bytes, data bytes
    with sow.subscribe(name) as full, sow.subscribe(name, delta=True) as delta:
        time.sleep(0.1)
        for i in range(0, args.delta_n, 500):
            chunk = []
            for j in range(i, min(args.delta_n, i + 500)):
                rec = dict(current[j % args.keys])
                rec["px"] = round(rnd.uniform(1, 1000), 4)
                rec["filled"] = rnd.randint(0, rec["qty"])
                rec["leaves"] = rec["qty"] - rec["filled"]
                current[j % args.keys] = rec
                chunk.append(rec)
            sow.publish(name, chunk)
            for kind, sub in (("full", full), ("delta", delta)):
                want = totals[kind][0] + len(chunk)
                while totals[kind][0] < want:
                    m = sub.get(30)
                    if m is None:
                        raise BenchError(f"VERIFY FAILED: the {kind} subscription stalled")
                    if m["kind"] != "publish":
                        continue
                    if kind == "delta" and not m.get("delta"):
                        raise BenchError("VERIFY FAILED: an update came whole to the delta "
                                         "subscription")
                    totals[kind][0] += 1
                    totals[kind][1] += len(to_line(m))
                    totals[kind][2] += len(orjson.dumps(m["data"]))
    remove_topics(sow.r, [name])
    out = {kind: {"events": ev, "line_bytes_per_event": lb / ev, "data_bytes_per_event": db / ev}
           for kind, (ev, lb, db) in totals.items()}
    out["line_ratio"] = (out["delta"]["line_bytes_per_event"]
                         / out["full"]["line_bytes_per_event"])
    out["data_ratio"] = (out["delta"]["data_bytes_per_event"]
                         / out["full"]["data_bytes_per_event"])
    return out


# -- medians and the table -------------------------------------------------------------------
def med(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def summarize(runs: dict[str, Any]) -> dict[str, Any]:
    """The medians of every figure over the runs (of the parts that ran)."""
    out: dict[str, Any] = {}
    if all(runs["throughput"].values()):
        tp = {v: {k: med(rs, k) for k in rs[0]} for v, rs in runs["throughput"].items()}
        base = tp["0 views"]["msgs_per_s"]
        for v in tp.values():
            v["vs_baseline"] = v["msgs_per_s"] / base
            v["cost"] = 1 - v["vs_baseline"]
        out["throughput"] = tp
    for part in ("lag", "lag_topic"):
        if all(runs[part].values()):
            out[part] = {str(rate): {k: med(rs, k) for k in ("p50_ms", "p99_ms", "max_ms",
                                                             "changes", "deriver_cpu_s")}
                         for rate, rs in runs[part].items()}
    if conf_runs := runs["conflation"]:
        out["conflation"] = {
            "underlying_per_s": med(conf_runs, "underlying_per_s"), "keys": conf_runs[0]["keys"],
            "intervals": {ms: {k: statistics.median(r["intervals"][ms][k] for r in conf_runs)
                               for k in ("events_per_s", "bound_per_s", "reduction")}
                          for ms in conf_runs[0]["intervals"]}}
    if dr := runs["delta"]:
        delta: dict[str, Any] = {
            kind: {k: statistics.median(r[kind][k] for r in dr)
                   for k in ("line_bytes_per_event", "data_bytes_per_event")}
            for kind in ("full", "delta")}
        delta["line_ratio"] = med(dr, "line_ratio")
        delta["data_ratio"] = med(dr, "data_ratio")
        out["delta"] = delta
    return out


def goals(m: dict[str, Any], lag_rate: int) -> dict[str, Any]:
    """The issue's goals: one view costs ≤ 25 % of apply throughput; view lag p99 ≤ 20 ms
    at ``lag_rate`` (10,000 changes/s). None where the part did not run."""
    one = m["throughput"]["1 view"]["cost"] if "throughput" in m else None
    p99 = m.get("lag", {}).get(str(lag_rate), {}).get("p99_ms")
    return {"one_view_cost": one, "one_view_cost_met": None if one is None else one <= 0.25,
            "lag_rate": lag_rate, "lag_p99_ms": p99,
            "lag_p99_met": None if p99 is None else p99 <= 20.0}


def print_table(m: dict[str, Any], g: dict[str, Any], args: argparse.Namespace,
                load: tuple[float, ...], load_end: tuple[float, ...]) -> None:
    print(f"\nmedians of {args.runs} run(s); load average {load[0]:.2f} at the start, "
          f"{load_end[0]:.2f} at the end; {os.cpu_count()} cores shared by redis-server, "
          "the worker, the deriver and this process")
    if "throughput" in m:
        print(f"\n1. apply throughput, {args.n} messages over {args.keys} keys, "
              f"{args.partitions} partitions")
        print(f"{'variant':9} {'msgs/s':>9} {'vs 0':>6} {'caught up/s':>12} "
              f"{'catch-up s':>11} {'redis s/1k':>11} {'deriver s/1k':>13} {'rows/1k':>8}")
        for v, x in m["throughput"].items():
            print(f"{v:9} {x['msgs_per_s']:9.0f} {x['vs_baseline']:6.2f} "
                  f"{x['caught_up_msgs_per_s']:12.0f} {x['catch_up_s']:11.2f} "
                  f"{x['redis_cpu_s_per_1k']:11.3f} {x['deriver_cpu_s_per_1k']:13.3f} "
                  f"{x.get('view_rows_per_1k', 0):8.0f}")
    if "lag" in m:
        print(f"\n2. lag (publish → event), a view of {args.groups} groups and, the baseline, "
              "the topic itself")
        print(f"{'of':6} {'changes/s':>9} {'changes':>8} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'max ms':>8} {'deriver cpu s':>14}")
        for part, label in (("lag_topic", "topic"), ("lag", "view")):
            for rate, x in m.get(part, {}).items():
                print(f"{label:6} {int(rate):9,} {x['changes']:8.0f} {x['p50_ms']:8.2f} "
                      f"{x['p99_ms']:8.2f} {x['max_ms']:8.2f} {x['deriver_cpu_s']:14.2f}")
    if "conflation" in m:
        c = m["conflation"]
        print(f"\n3. conflation over {c['keys']} keys, underlying "
              f"{c['underlying_per_s']:,.0f} changes/s")
        print(f"{'interval':>9} {'events/s':>9} {'bound/s':>9} {'reduction':>10}")
        for ms, x in c["intervals"].items():
            print(f"{ms + ' ms':>9} {x['events_per_s']:9.0f} {x['bound_per_s']:9.0f} "
                  f"{x['reduction']:9.1f}×")
    if "delta" in m:
        d = m["delta"]
        print("\n4. delta subscription, 3 of 15 fields changed per update")
        print(f"{'events':7} {'line B/event':>13} {'data B/event':>13}")
        for kind in ("full", "delta"):
            print(f"{kind:7} {d[kind]['line_bytes_per_event']:13.0f} "
                  f"{d[kind]['data_bytes_per_event']:13.0f}")
        print(f"{'ratio':7} {d['line_ratio']:13.2f} {d['data_ratio']:13.2f}")
    if g["one_view_cost"] is not None:
        print(f"\ngoal: one view costs {g['one_view_cost']:.1%} of apply throughput "
              f"(≤ 25 %: {'met' if g['one_view_cost_met'] else 'MISSED'})")
    if g["lag_p99_ms"] is not None:
        print(f"goal: view lag p99 at {g['lag_rate']:,}/s {g['lag_p99_ms']:.2f} ms "
              f"(≤ 20 ms: {'met' if g['lag_p99_met'] else 'MISSED'})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000, help="messages per throughput run")
    ap.add_argument("--keys", type=int, default=20_000, help="distinct SOW keys")
    ap.add_argument("--groups", type=int, default=100, help="groups of the views (/g)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="runs of each measurement (medians)")
    ap.add_argument("--lag-rates", default="1000,10000", help="changes/s, comma-separated; "
                    "the last is the goal's rate")
    ap.add_argument("--lag-seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=0.5,
                    help="seconds left out at the start of a paced run")
    ap.add_argument("--conf-rate", type=int, default=10_000, help="underlying changes/s")
    ap.add_argument("--conf-keys", type=int, default=500)
    ap.add_argument("--conf-seconds", type=float, default=5.0)
    ap.add_argument("--intervals", default="500,100", help="conflation intervals in ms")
    ap.add_argument("--delta-n", type=int, default=20_000, help="updates of the delta run")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: small sizes, one run, 1 s paced runs")
    ap.add_argument("--skip", default="", help="parts to leave out: throughput,lag,"
                    "conflation,delta (comma-separated)")
    ap.add_argument("--profile", metavar="DIR",
                    help="run each deriver under py-spy record; collapsed stacks to DIR")
    ap.add_argument("--deriver-tree", metavar="DIR", default=str(ROOT),
                    help="the folder whose sow_redis package the derivers run (e.g. an "
                    "export of an earlier commit, to compare derivers on the same data)")
    ap.add_argument("--out", default="bench-results/bench_views.json")
    a = ap.parse_args(argv)
    if a.quick:
        a.n, a.keys, a.runs, a.lag_seconds, a.conf_seconds = 3000, 500, 1, 1.5, 1.5
        a.delta_n, a.conf_keys, a.groups, a.warmup = 1000, 100, 20, 0.3
    a.lag_rate_list = [int(x) for x in a.lag_rates.split(",") if x.strip()]
    a.interval_list = [int(x) for x in a.intervals.split(",") if x.strip()]
    a.skip_set = {x.strip() for x in a.skip.split(",") if x.strip()}
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_a: (_ for _ in ()).throw(KeyboardInterrupt()))
    DeriverProcess.tree = Path(args.deriver_tree).resolve()
    if args.profile:
        DeriverProcess.profile_dir = Path(args.profile).resolve()
    msgs = make_messages(args.n, args.keys, args.groups)
    runs: dict[str, Any] = {"throughput": {v: [] for v in VARIANTS},
                            "lag": {str(r): [] for r in args.lag_rate_list},
                            "lag_topic": {str(r): [] for r in args.lag_rate_list},
                            "conflation": [], "delta": []}
    load = os.getloadavg()
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    try:
        with private_redis("bench_views_") as server:
            r = Redis.from_url(server.url)
            machine = machine_info(r)
            ws = Workers(server.url, 1, server.workdir)
            ws.start()
            try:
                ws.wait_registered(r)
                for i in range(args.runs):
                    order = list(VARIANTS) if i % 2 == 0 else list(reversed(VARIANTS))
                    for v in order if "throughput" not in args.skip_set else []:
                        res = run_throughput(server, ws, msgs, VARIANTS[v], args)
                        runs["throughput"][v].append(res)
                        print(f"run {i + 1} {v}: {res['msgs_per_s']:,.0f} msgs/s", flush=True)
                    for rate in args.lag_rate_list if "lag" not in args.skip_set else []:
                        targets = ("topic", "view") if i % 2 == 0 else ("view", "topic")
                        for target in targets:
                            res = run_lag(server, rate, args, target)
                            runs["lag" if target == "view" else "lag_topic"][str(rate)].append(res)
                            print(f"run {i + 1} lag of the {target} at {rate:,}/s: p50 "
                                  f"{res['p50_ms']:.2f} ms, p99 {res['p99_ms']:.2f} ms",
                                  flush=True)
                    if "conflation" not in args.skip_set:
                        runs["conflation"].append(run_conflation(server, args))
                    if "delta" not in args.skip_set:
                        runs["delta"].append(run_delta(server, args))
            finally:
                ws.stop()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(exc, file=sys.stderr)
        return 1
    load_end = os.getloadavg()
    result: dict[str, Any] = {"benchmark": "bench_views", "timestamp": started,
                              "options": {k: v for k, v in vars(args).items()
                                          if k != "skip_set"}, "machine": machine,
                              "loadavg_start": load, "loadavg_end": load_end, "runs": runs}
    result["medians"] = summarize(runs)
    result["goals"] = goals(result["medians"], args.lag_rate_list[-1])
    print_table(result["medians"], result["goals"], args, load, load_end)
    print(f"results: {write_json(args.out, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
