#!/usr/bin/env python3
"""Expiry lag of sow_redis against plain Redis key expiry, in one run.

Expiry lag = the time from a record's due time until its delete event reaches a subscriber.

Starts its own redis-server on a free port (``--save "" --appendonly no``, in a temporary
folder; the machine's 6379 is never used). For each size N of ``--sizes``:

* ``sow_redis``: a fresh topic keyed by ``/id`` with ``expiration = "enabled"`` and
  ``--partitions`` partitions. N records are loaded with per-message expirations chosen so that
  the due times are spread uniformly over ``--window`` seconds, starting ``lead`` seconds after
  the load began (``lead`` is scaled with N from a small calibration load, so that everything is
  loaded, and the subscriber and expirer are running, before the first record is due). Loading =
  ``sow_redis.publish.append.append`` (XADD to the partition logs) then
  ``Sow(inline=True).handoff`` (the workers' code, every partition drained in this process;
  no workers). Each record's
  due time is then read back from what is stored (``expiry_ms`` of the record = log entry id
  time + lifetime, Redis server clock). A subscriber process (raw socket + hiredis parser, so
  it is not the bottleneck) listens on ``sow:<topic>`` and notes the receive time of every
  ``sow_delete`` event with ``"reason":"expired"``. Then one ``python -m sow_redis.cli
  expirer`` process is started. While records expire, this process checks every
  ``--check-interval`` seconds that a SOW query (``Sow.sow(topic, keys=[...])``) returns none of
  a random sample of keys that are already due.
* ``redis PEXPIREAT`` baseline, for each ``--baseline-hz``: N plain string keys
  ``SET k v PXAT due`` with due times spread the same way, ``notify-keyspace-events Ex``, and a
  subscriber on ``__keyevent@0__:expired``. Redis's active expiry cycle runs ``hz`` times per
  second and samples keys, so its lag is expected to be tens of ms.

Lag per record = receive time (subscriber's ``time.time()`` when the read returned, moved onto
the server clock by the offset between ``time.time()`` and ``TIME`` measured once) - due time.
Reported: p50 / p99 / max lag (ms), expirations/s = N / (last event - first due), and counts
(every record must get exactly one expired event).

Output: a rich table and a JSON file (``--json``). Example::

    .venv/bin/python scripts/bench_expiry.py --sizes 10000,100000
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import multiprocessing as mp
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from benchlib import (
    BenchError,
    RedisServer,
    machine_info,
    private_redis,
    proc_cpu_s,
    redis_cpu_s,
    write_json,
)
from redis import Redis
from rich.console import Console
from rich.table import Table

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.config import parse_topics
from sow_redis.connection import server_ms
from sow_redis.errors import SowError
from sow_redis.expirer import remove_topic
from sow_redis.model.topic import TopicConfig
from sow_redis.ops.status import error_count
from sow_redis.publish.append import append
from sow_redis.query.sow import get_records, scan_partition
from sow_redis.registry import apply_topics
from sow_redis.settings import Settings

ROOT = Path(__file__).resolve().parent.parent

console = Console(width=None if sys.stdout.isatty() else 150)

SEED = 20240601
MSG_PAD = 60
"""Filler characters per message (messages are about 100 bytes)."""

STARTUP_S = 3.0
"""Seconds planned for starting the subscriber and the expirer after the load."""

CALIBRATE_N = 5000
"""Records of the calibration load that estimates the load rate (to choose the lead)."""

SAMPLE = 64
"""Keys queried per correctness check (half just due, half any due)."""

DESCRIPTIONS = {
    "sow_redis": "topic keyed /id, expiration enabled, per-message expirations; one "
                 "`sow-redis expirer` process (expire.lua per partition, pipelined); events on "
                 "sow:<topic> received by a separate subscriber process",
    "redis PXAT, hz H": "plain keys SET k v PXAT due; notify-keyspace-events Ex; subscriber on "
                       "__keyevent@0__:expired; Redis active expiry at the stated hz "
                       "(10 = Redis default)",
    "lag": "subscriber receive time (time.time() + clock offset to Redis TIME) - due time "
           "(sow_redis: the stored expiry_ms)",
    "expirations/s": "N / (last expired event received - first due time)",
    "missing": "records without an expired event (duplicates and unknown events are in the "
               "JSON and fail the run too)",
}


def drain(r: Redis, t: TopicConfig, last_ids: dict[int, str], settings: Settings) -> int:
    """Apply the partitions of ``last_ids`` in this process (inline mode, the workers' code)
    until their logs are drained. Returns entries applied."""
    return Sow(client=r, settings=settings, inline=True).handoff(t, last_ids)


class LateLoad(Exception):
    """The load (or start-up) finished too close to the first due time: retry with more lead."""

    def __init__(self, needed_s: float):
        super().__init__(f"needed {needed_s:.1f} s")
        self.needed_s = needed_s


# -- processes ----------------------------------------------------------------------------
def evalsha_calls(r: Redis) -> int:
    stats = r.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


class Expirer:
    """One ``python -m sow_redis.cli expirer`` process (env SOW_REDIS_URL)."""

    def __init__(self, url: str, logdir: Path):
        self.log = logdir / f"expirer-{uuid.uuid4().hex[:6]}.log"
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sow_redis.cli", "expirer"],
                env=dict(os.environ, SOW_REDIS_URL=url), cwd=str(ROOT), stdout=fh,
                stderr=subprocess.STDOUT, start_new_session=True)
        self.cpu_at_stop = 0.0

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise BenchError(f"expirer exited with {self.proc.returncode}:\n{tail}")

    def wait_running(self, r: Redis, calls_before: int, passes: int, timeout_s: float = 30.0
                     ) -> None:
        """Until redis counted ``passes`` more EVALSHA calls (no worker runs: they are its)."""
        deadline = time.monotonic() + timeout_s
        while evalsha_calls(r) < calls_before + passes:
            self.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"expirer made no expire.lua call within {timeout_s:g} s")
            time.sleep(0.01)

    def cpu_s(self) -> float:
        return proc_cpu_s(self.proc.pid) if self.proc.poll() is None else self.cpu_at_stop

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.cpu_at_stop = proc_cpu_s(self.proc.pid)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- subscriber (a separate process) ------------------------------------------------------
def _resp_command(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(p), p))
    return b"".join(out)


def subscriber_main(port: int, channels: list[str], kind: str, ready: Any, stop: Any,
                    count: Any, out_path: str) -> None:
    """Subscribe to ``channels`` (``sow``: the partitions' sharded channels, SSUBSCRIBE;
    ``redis``: SUBSCRIBE); for every expired event note (key, receive time).

    A raw socket with the hiredis parser: every message of one ``recv`` gets the time that
    ``recv`` returned. ``kind`` ``sow``: JSON events, keep ``sow_delete`` with reason
    ``expired`` (others are counted); ``redis``: keyevent messages, the payload is the key.
    Writes ``{"keys", "times", "other"}`` to ``out_path`` when ``stop`` is set.
    """
    import select

    import hiredis

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    verb = b"SSUBSCRIBE" if kind == "sow" else b"SUBSCRIBE"
    for ch in channels:
        sock.sendall(_resp_command(verb, ch.encode()))
    reader = hiredis.Reader()
    confirmed = 0
    while confirmed < len(channels):  # the subscribe confirmations
        reader.feed(sock.recv(65536))
        while reader.gets() is not False:
            confirmed += 1
    ready.set()
    out_keys: list[str] = []
    out_times: list[float] = []
    other = 0
    from sow_redis.model.events import events_of

    now = time.time
    marker = b"expired"
    while not stop.is_set():
        readable, _w, _x = select.select([sock], [], [], 0.05)
        if not readable:
            continue
        buf = sock.recv(1 << 20)
        t = now()
        if not buf:
            break
        reader.feed(buf)
        n0 = len(out_keys)
        while True:
            m = reader.gets()
            if m is False:
                break
            data = m[2]
            if kind == "redis":
                out_keys.append(data.decode())
                out_times.append(t)
                continue
            # change blocks are MessagePack (sow_redis.model.events.parse_block); the marker is
            # a cheap test for blocks that may hold an expiry
            expired = [ev for ev in events_of(data) if ev.get("op") == "sow_delete"
                       and ev.get("reason") == "expired"] if marker in data else []
            for ev in expired:  # one change block per expirer call
                out_keys.append(ev["sow_key"])
                out_times.append(t)
            if not expired:
                other += 1
        if len(out_keys) != n0:
            count.value = len(out_keys)
    sock.close()
    with open(out_path, "wb") as fh:
        fh.write(orjson.dumps({"keys": out_keys, "times": out_times, "other": other}))


class Subscriber:
    def __init__(self, port: int, channels: list[str], kind: str, tmp: Path):
        ctx = mp.get_context("spawn")
        self.ready, self.stop_evt = ctx.Event(), ctx.Event()
        self.count = ctx.Value("q", 0, lock=False)
        self.out = tmp / f"events-{uuid.uuid4().hex[:6]}.json"
        self.proc = ctx.Process(target=subscriber_main, daemon=True,
                                args=(port, channels, kind, self.ready, self.stop_evt,
                                      self.count, str(self.out)))
        self.proc.start()
        if not self.ready.wait(60):
            self.kill()
            raise BenchError("subscriber process did not subscribe within 60 s")

    def cpu_s(self) -> float:
        return proc_cpu_s(self.proc.pid) if self.proc.pid else 0.0

    def finish(self) -> dict[str, Any]:
        self.stop_evt.set()
        self.proc.join(120)
        if self.proc.is_alive() or not self.out.exists():
            self.kill()
            raise BenchError("subscriber process did not write its events")
        data = orjson.loads(self.out.read_bytes())
        self.out.unlink()
        return data

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(10)


# -- helpers ------------------------------------------------------------------------------
def clock_offset_ms(r: Redis, samples: int = 30) -> dict[str, float]:
    """Redis ``TIME`` - local ``time.time()`` in ms, from the sample with the shortest round
    trip (same machine: expected well under 1 ms)."""
    best: tuple[float, float] | None = None
    for _ in range(samples):
        t0 = time.time()
        sec, usec = r.time()
        t1 = time.time()
        rtt = (t1 - t0) * 1000
        off = (int(sec) * 1000 + int(usec) / 1000) - (t0 + t1) * 500
        if best is None or rtt < best[0]:
            best = (rtt, off)
    assert best is not None
    return {"offset_ms": best[1], "rtt_ms": best[0]}


def topic_config(name: str, partitions: int) -> TopicConfig:
    return parse_topics(f'[[topic]]\nname = "{name}"\nkey = ["/id"]\n'
                        f'partitions = {partitions}\nexpiration = "enabled"\n')[0]


def message(i: int) -> bytes:
    return b'{"id":%d,"v":"%s"}' % (i, b"x" * MSG_PAD)


def pct(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, int(-(-q * len(sorted_vals) // 100)) - 1))
    return sorted_vals[k]


def lag_stats(lags: list[float]) -> dict[str, float]:
    s = sorted(lags)
    if not s:
        return {}
    return {"p50_ms": pct(s, 50), "p90_ms": pct(s, 90), "p99_ms": pct(s, 99),
            "p999_ms": pct(s, 99.9), "max_ms": s[-1], "min_ms": s[0],
            "mean_ms": sum(s) / len(s)}


def analyse(due: dict[str, int], events: dict[str, Any], offset_ms: float, window_ms: int,
            first_due_ms: int) -> dict[str, Any]:
    """Lag statistics, counts and rate from the due times and the received events."""
    seen: dict[str, float] = {}
    duplicates = unexpected = 0
    for k, t in zip(events["keys"], events["times"]):
        if k not in due:
            unexpected += 1
        elif k in seen:
            duplicates += 1
        else:
            seen[k] = t * 1000 + offset_ms
    missing = len(due) - len(seen)
    lags = [seen[k] - due[k] for k in seen]
    out: dict[str, Any] = {
        "events": len(events["keys"]), "received": len(seen), "missing": missing,
        "duplicates": duplicates, "unexpected": unexpected,
        "other_events": events.get("other", 0),
        "negative_lags": sum(1 for x in lags if x < 0),
        "lag": lag_stats(lags),
    }
    if seen:
        last = max(seen.values())
        out["last_event_ms"] = last
        span = last - first_due_ms
        out["expirations_s"] = len(due) / (span / 1000) if span > 0 else float("inf")
        out["last_event_after_last_due_ms"] = last - max(due.values())
    # lag per second of the window (by due time): shows whether lag grows with the backlog
    buckets: dict[int, list[float]] = {}
    for k, arrival in seen.items():
        buckets.setdefault((due[k] - first_due_ms) // 1000, []).append(arrival - due[k])
    out["lag_by_due_second"] = [
        {"second": b, "records": len(v), **{k: round(x, 3) for k, x in lag_stats(v).items()
                                           if k in ("p50_ms", "p99_ms", "max_ms")}}
        for b, v in sorted(buckets.items())]
    out["ok"] = missing == 0 and duplicates == 0 and unexpected == 0
    return out


def wait_until_ms(r: Redis, target_ms: int, offset_ms: float) -> None:
    while True:
        left = target_ms - (time.time() * 1000 + offset_ms)
        if left <= 0:
            return
        time.sleep(min(left / 1000, 0.2))


# -- sow_redis ------------------------------------------------------------------------------
def calibrate_sow(r: Redis, args: argparse.Namespace, settings: Settings) -> float:
    """Records/s of append + drain on a scratch topic (CALIBRATE_N records, long lifetime)."""
    t = topic_config(f"bench_exp_cal_{uuid.uuid4().hex[:8]}", args.partitions)
    apply_topics(r, [t])
    try:
        t0 = time.perf_counter()
        res = append(r, t, (("publish", message(i), None, 3600.0) for i in range(CALIBRATE_N)))
        drain(r, t, res.last_ids, settings)
        return CALIBRATE_N / (time.perf_counter() - t0)
    finally:
        remove_topic(r, t)


def load_sow(r: Redis, t: TopicConfig, n: int, first_due_ms: int, window_ms: int,
             offset_ms: float, settings: Settings, rnd: random.Random) -> dict[str, Any]:
    """Append N publishes whose lifetime makes them due at first_due + uniform(0, window)
    (lifetime computed from the server clock when the item is generated), then apply them."""
    now = time.time
    out: dict[str, Any] = {}

    def items():  # lazy: each lifetime is computed just before its XADD is queued
        for i in range(n):
            due = first_due_ms + rnd.random() * window_ms
            yield ("publish", message(i), None, (due - (now() * 1000 + offset_ms)) / 1000)

    t0 = time.perf_counter()
    res = append(r, t, items())
    t1 = time.perf_counter()
    if res.published != n or res.rejected:
        raise BenchError(f"publish: {res.published} published, {len(res.rejected)} rejected "
                         f"({res.rejected[:3]})")
    applied = drain(r, t, res.last_ids, settings)
    t2 = time.perf_counter()
    if applied != n:
        raise BenchError(f"applied {applied} log entries, expected {n}")
    if error_count(r, t):
        raise BenchError(f"error streams of {t.name} are not empty: {error_count(r, t)} entries")
    # applied entries are no longer needed: free the memory of the logs
    for p in range(t.partitions):
        r.xtrim(keys.log(t.name, p), maxlen=0)
    out["publish_s"], out["apply_s"] = t1 - t0, t2 - t1
    return out


def read_due(r: Redis, t: TopicConfig) -> dict[str, int]:
    """SOW key → expiry_ms, read from the stored records."""
    due: dict[str, int] = {}
    for p in range(t.partitions):
        for rec in scan_partition(r, t, p):
            due[rec.sow_key] = rec.expiry_ms
    return due


class Checker:
    """Queries random samples of due keys and counts records a SOW query returns anyway."""

    def __init__(self, sow: Sow, t: TopicConfig, due: dict[str, int], rnd: random.Random):
        self.sow, self.t, self.rnd = sow, t, rnd
        pairs = sorted((ms, k) for k, ms in due.items())
        self.due_ms = [ms for ms, _k in pairs]
        self.keys = [k for _ms, k in pairs]
        self.checks = self.keys_checked = self.violations = 0
        self.still_stored = 0  # due keys physically still in Redis (hidden by the query)
        self.examples: list[str] = []

    def check(self) -> None:
        r = self.sow.r
        before_ms = server_ms(r) - 1
        idx = bisect.bisect_right(self.due_ms, before_ms)
        if idx == 0:
            return
        half = SAMPLE // 2
        recent = self.keys[max(0, idx - 2000):idx]
        sample = set(self.rnd.sample(recent, min(half, len(recent))))
        sample.update(self.keys[self.rnd.randrange(idx)] for _ in range(half))
        ks = list(sample)
        got = self.sow.sow(self.t.name, keys=ks)
        raw = list(get_records(r, self.t, ks))
        self.checks += 1
        self.keys_checked += len(ks)
        self.still_stored += len(raw)
        if got:
            self.violations += len(got)
            self.examples += [g.sow_key for g in got][: max(0, 10 - len(self.examples))]

    def result(self) -> dict[str, Any]:
        return {"checks": self.checks, "keys_checked": self.keys_checked,
                "violations": self.violations, "violation_examples": self.examples,
                "due_but_still_stored_seen": self.still_stored}


def run_sow(server: RedisServer, r: Redis, n: int, args: argparse.Namespace,
            settings: Settings, tmp: Path, lead_s: float, rate: float) -> dict[str, Any]:
    """One attempt. Raises LateLoad when loading + start-up overran the lead."""
    rnd = random.Random(SEED + n)
    t = topic_config(f"bench_exp_{uuid.uuid4().hex[:8]}_{n}", args.partitions)
    apply_topics(r, [t])
    window_ms = int(args.window * 1000)
    clock = clock_offset_ms(r)
    off = clock["offset_ms"]
    out: dict[str, Any] = {"variant": "sow_redis", "n": n, "partitions": args.partitions,
                           "lead_s": lead_s, "window_s": args.window, "clock": clock,
                           "calibrated_load_rate": rate}
    sub: Subscriber | None = None
    exp: Expirer | None = None
    try:
        t_start = time.perf_counter()
        first_planned = server_ms(r) + int(lead_s * 1000)
        console.print(f"  sow_redis N={n:,}: loading (lead {lead_s:.1f} s, window "
                      f"{args.window:g} s) …")
        out["load"] = load_sow(r, t, n, first_planned, window_ms, off, settings, rnd)
        due = read_due(r, t)
        if len(due) != n:
            raise BenchError(f"{len(due)} records stored, expected {n}")
        out["load"]["read_due_s"] = time.perf_counter() - t_start - out["load"]["publish_s"] \
            - out["load"]["apply_s"]
        first_due, last_due = min(due.values()), max(due.values())
        out["first_due_ms"], out["last_due_ms"] = first_due, last_due
        out["planned_first_due_ms"] = first_planned
        loaded_ms = server_ms(r)
        out["load"]["finished_before_first_due_ms"] = first_due - loaded_ms
        console.print(f"  loaded in {time.perf_counter() - t_start:.1f} s "
                      f"(publish {out['load']['publish_s']:.1f} s, apply "
                      f"{out['load']['apply_s']:.1f} s); first due in "
                      f"{(first_due - loaded_ms) / 1000:.1f} s")
        if first_due - loaded_ms < STARTUP_S * 1000 * 0.5:
            raise LateLoad(time.perf_counter() - t_start)

        sub = Subscriber(server.port, [keys.partition_channel(t.name, p)
                                       for p in range(t.partitions)], "sow", tmp)
        calls0 = evalsha_calls(r)
        exp = Expirer(server.url, tmp)
        exp.wait_running(r, calls0, 2 * args.partitions)
        ready_ms = server_ms(r)
        out["started_before_first_due_ms"] = first_due - ready_ms
        if ready_ms >= first_due - 100:
            raise LateLoad(time.perf_counter() - t_start)
        cpu_redis0, cpu_exp0, cpu_sub0 = redis_cpu_s(r), exp.cpu_s(), sub.cpu_s()

        checker = Checker(Sow(client=r, settings=settings), t, due, rnd)
        wait_until_ms(r, first_due, off)
        console.print(f"  expiring {n:,} records over {(last_due - first_due) / 1000:.1f} s …")
        deadline = time.monotonic() + (last_due - first_due) / 1000 + max(60.0, n / 2000)
        next_progress = time.monotonic() + 1.0
        done_at: float | None = None  # when every record was gone after the last due time
        while done_at is None or time.monotonic() - done_at < 0.5:  # 0.5 s for late events
            checker.check()
            now_m = time.monotonic()
            if done_at is None and (now_m >= next_progress or server_ms(r) > last_due):
                pipe = r.pipeline(transaction=False)
                for p in range(t.partitions):
                    pipe.hlen(keys.records(t.name, p))
                left = sum(pipe.execute())
                if now_m >= next_progress:
                    next_progress = now_m + 1.0
                    console.print(f"    removed {n - left:,}/{n:,}, events received "
                                  f"{sub.count.value:,}")
                if left == 0 and server_ms(r) > last_due:
                    done_at = now_m
            exp.check_alive()
            if now_m > deadline:
                console.print("[red]  timed out waiting for the expiry to finish[/red]")
                break
            time.sleep(args.check_interval)
        out["cpu_s"] = {"redis": redis_cpu_s(r) - cpu_redis0, "expirer": exp.cpu_s() - cpu_exp0,
                        "subscriber": sub.cpu_s() - cpu_sub0}
        exp.stop()
        events = sub.finish()
        sub = None
        out["checker"] = checker.result()
        out.update(analyse(due, events, off, window_ms, first_due))
        out["ok"] = out["ok"] and checker.violations == 0
        return out
    finally:
        if exp is not None:
            exp.stop()
        if sub is not None:
            sub.kill()
        remove_topic(r, t)


# -- baseline -----------------------------------------------------------------------------
def run_baseline(server: RedisServer, r: Redis, n: int, hz: int, args: argparse.Namespace,
                 tmp: Path, lead_s: float) -> dict[str, Any]:
    rnd = random.Random(SEED + n)
    tag = uuid.uuid4().hex[:8]
    window_ms = int(args.window * 1000)
    r.config_set("hz", hz)
    r.config_set("notify-keyspace-events", "Ex")
    clock = clock_offset_ms(r)
    off = clock["offset_ms"]
    out: dict[str, Any] = {"variant": f"redis PXAT, hz {hz}", "n": n, "hz": hz,
                           "lead_s": lead_s, "window_s": args.window, "clock": clock,
                           "redis_config": {k: v for k, v in r.config_get("*").items()
                                            if k in ("hz", "dynamic-hz", "active-expire-effort",
                                                     "notify-keyspace-events")}}
    sub = Subscriber(server.port, ["__keyevent@0__:expired"], "redis", tmp)
    try:
        t_start = time.perf_counter()
        first = server_ms(r) + int(lead_s * 1000)
        console.print(f"  redis hz {hz} N={n:,}: loading (lead {lead_s:.1f} s) …")
        due: dict[str, int] = {}
        pipe = r.pipeline(transaction=False)
        for i in range(n):
            k = f"bexp:{tag}:{i}"
            d = first + int(rnd.random() * window_ms)
            due[k] = d
            pipe.set(k, b"x" * MSG_PAD, pxat=d)
            if len(pipe) >= 1000:
                pipe.execute()
        pipe.execute()
        first_due, last_due = min(due.values()), max(due.values())
        loaded_ms = server_ms(r)
        out["load"] = {"seconds": time.perf_counter() - t_start,
                       "finished_before_first_due_ms": first_due - loaded_ms}
        out["first_due_ms"], out["last_due_ms"] = first_due, last_due
        if first_due - loaded_ms < 200:
            names = list(due)
            for i in range(0, n, 1000):
                r.unlink(*names[i:i + 1000])
            raise LateLoad(time.perf_counter() - t_start)
        cpu_redis0, cpu_sub0 = redis_cpu_s(r), sub.cpu_s()
        wait_until_ms(r, first_due, off)
        console.print(f"  expiring {n:,} keys over {(last_due - first_due) / 1000:.1f} s …")
        deadline = time.monotonic() + (last_due - first_due) / 1000 + max(60.0, n / 2000)
        next_progress = time.monotonic() + 1.0
        while True:
            now_m = time.monotonic()
            left = int(r.info("keyspace").get("db0", {}).get("expires", 0))
            if now_m >= next_progress:
                next_progress = now_m + 1.0
                console.print(f"    expired {n - left:,}/{n:,}, events received "
                              f"{sub.count.value:,}")
            if left == 0 and server_ms(r) > last_due:
                time.sleep(0.5)
                break
            if now_m > deadline:
                console.print("[red]  timed out waiting for redis to expire the keys[/red]")
                break
            time.sleep(0.05)
        out["cpu_s"] = {"redis": redis_cpu_s(r) - cpu_redis0, "subscriber": sub.cpu_s() - cpu_sub0}
        events = sub.finish()
        out.update(analyse(due, events, off, window_ms, first_due))
        return out
    finally:
        sub.kill()
        r.config_set("hz", 10)
        r.config_set("notify-keyspace-events", "")


def run_with_retries(fn: Any, n: int, lead_s: float, attempts: int = 3) -> dict[str, Any]:
    for attempt in range(attempts):
        try:
            res = fn(lead_s)
            res["attempts"] = attempt + 1
            return res
        except LateLoad as late:
            new = max(lead_s * 1.5, late.needed_s * 1.5 + STARTUP_S + 1)
            console.print(f"[yellow]  N={n:,}: load/start-up took {late.needed_s:.1f} s, "
                          f"too close to the first due time; retrying with lead "
                          f"{new:.1f} s[/yellow]")
            lead_s = new
    raise BenchError(f"N={n:,}: could not load before the first due time in {attempts} tries")


# -- output -------------------------------------------------------------------------------
def summary_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sow_p99 = {x["n"]: x["lag"].get("p99_ms") for x in runs if x["variant"] == "sow_redis"}
    rows = []
    for x in runs:
        lag = x.get("lag", {})
        sp = sow_p99.get(x["n"])
        ratio = None
        if x["variant"] != "sow_redis" and sp and lag.get("p99_ms") is not None:
            ratio = lag["p99_ms"] / sp
        rows.append({"variant": x["variant"], "n": x["n"], "p50_ms": lag.get("p50_ms"),
                     "p99_ms": lag.get("p99_ms"), "max_ms": lag.get("max_ms"),
                     "expirations_s": x.get("expirations_s"), "missing": x.get("missing"),
                     "duplicates": x.get("duplicates"), "unexpected": x.get("unexpected"),
                     "ratio_p99": ratio, "ok": x.get("ok"),
                     "checker": x.get("checker")})
    return rows


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    table = Table(title=title)
    for col in ["variant", "N", "p50 ms", "p99 ms", "max ms", "expirations/s",
                "missing events", "p99 / sow_redis p99"]:
        table.add_column(col, justify="left" if col == "variant" else "right")
    for row in rows:
        label = row["variant"] + ("" if row["ok"] else " [red](CHECK FAILED)[/red]")
        table.add_row(label, f"{row['n']:,}", fmt(row["p50_ms"], ".1f"),
                      fmt(row["p99_ms"], ".1f"), fmt(row["max_ms"], ".1f"),
                      fmt(row["expirations_s"], ",.0f"), fmt(row["missing"], ","),
                      "-" if row["ratio_p99"] is None else f"{row['ratio_p99']:.1f}×")
    console.print(table)
    for row in rows:
        c = row["checker"]
        if c:
            console.print(f"query check, sow_redis N={row['n']:,}: {c['checks']:,} queries, "
                          f"{c['keys_checked']:,} due keys asked, {c['violations']} returned "
                          f"(must be 0); due keys still stored at query time: "
                          f"{c['due_but_still_stored_seen']:,}")
    for k, v in DESCRIPTIONS.items():
        console.print(f"[bold]{k}[/bold]: {v}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated N")
    ap.add_argument("--window", type=float, default=5.0,
                    help="seconds over which the due times are spread (0: all due at the same "
                         "time, to measure the expirer's throughput)")
    ap.add_argument("--lead", type=float, default=2.0,
                    help="least seconds from the start of loading to the first due time "
                         "(scaled up with N from a calibration load)")
    ap.add_argument("--partitions", type=int, default=8, help="partitions of the topic")
    ap.add_argument("--baseline-hz", default="10,100",
                    help="comma-separated Redis hz values for the baseline (10 = default); "
                         "empty: no baseline")
    ap.add_argument("--check-interval", type=float, default=0.05,
                    help="seconds between two SOW-query correctness checks")
    ap.add_argument("--json", default="bench-results/bench_expiry.json", help="results file")
    a = ap.parse_args(argv)
    try:
        a.size_list = [int(x) for x in a.sizes.split(",") if x.strip()]
        a.hz_list = [int(x) for x in a.baseline_hz.split(",") if x.strip()]
    except ValueError:
        ap.error("--sizes and --baseline-hz take comma-separated integers")
    if not a.size_list or any(s < 1 for s in a.size_list) or a.partitions < 1 \
            or a.window < 0 or a.lead <= 0 or any(not 1 <= h <= 500 for h in a.hz_list):
        ap.error("--sizes, --partitions and --lead must be positive, --window >= 0 (0: all "
                 "due at once), hz 1..500")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_term(*_a: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    failed = False
    try:
        with private_redis("sow-bench-expiry-") as server:
            tmp = server.workdir
            r = Redis.from_url(server.url)
            settings = Settings.from_env(redis_url=server.url)
            redis_version = r.info("server")["redis_version"]
            # a subscriber that falls behind on a busy machine must not be disconnected by the
            # pub/sub output buffer limit (default 32 MB): that would show up as missing events
            r.config_set("client-output-buffer-limit", "pubsub 0 0 0")
            clock = clock_offset_ms(r)
            console.print(f"redis-server {redis_version} on {server.url}; clock offset "
                          f"{clock['offset_ms']:+.3f} ms (rtt {clock['rtt_ms']:.3f} ms)")
            rate = calibrate_sow(r, args, settings)
            console.print(f"calibration: sow_redis loads ~{rate:,.0f} records/s (append + apply)")

            runs: list[dict[str, Any]] = []
            for n in args.size_list:
                # load + read back + start-up must fit before the first due time (50 % margin)
                lead = max(args.lead, 1.5 * (n / rate + n / 200_000) + STARTUP_S)
                res = run_with_retries(
                    lambda ld, n=n: run_sow(server, r, n, args, settings, tmp, ld, rate), n, lead)
                runs.append(res)
                console.print(f"  sow_redis N={n:,}: p50 {res['lag'].get('p50_ms', 0):.1f} ms, "
                              f"p99 {res['lag'].get('p99_ms', 0):.1f} ms, missing "
                              f"{res['missing']}, query violations "
                              f"{res['checker']['violations']}")
                for hz in args.hz_list:
                    blead = max(args.lead, 1.5 * n / 50_000 + 1.0)
                    res = run_with_retries(
                        lambda ld, n=n, hz=hz: run_baseline(server, r, n, hz, args, tmp, ld), n,
                        blead)
                    runs.append(res)
                    console.print(f"  redis hz {hz} N={n:,}: p50 "
                                  f"{res['lag'].get('p50_ms', 0):.1f} ms, p99 "
                                  f"{res['lag'].get('p99_ms', 0):.1f} ms, missing {res['missing']}")

            rows = summary_rows(runs)
            failed = not all(x["ok"] for x in runs)
            print_table(rows, f"expiry lag: due times over {args.window:g} s, "
                              f"{args.partitions} partitions, redis {redis_version}")
            result = {
                "benchmark": "bench_expiry",
                "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": {**machine_info(r), "loadavg_at_end": os.getloadavg()},
                "redis_config": {"client-output-buffer-limit": r.config_get(
                    "client-output-buffer-limit")["client-output-buffer-limit"]},
                "options": {"sizes": args.size_list, "window_s": args.window, "lead_s": args.lead,
                            "partitions": args.partitions, "baseline_hz": args.hz_list,
                            "check_interval_s": args.check_interval, "message_bytes":
                            len(message(0)), "calibration_records": CALIBRATE_N},
                "calibrated_load_rate": rate,
                "descriptions": DESCRIPTIONS,
                "runs": runs,
                "summary": rows,
                "verified": not failed,
            }
            console.print(f"results written to {write_json(args.json, result)}")
            if failed:
                console.print("[red]a check failed (missing/duplicate events or a due record "
                              "returned by a query): see the JSON file[/red]")
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping the expirer, subscriber and "
                      "redis-server[/yellow]")
        return 130
    except (BenchError, SowError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
