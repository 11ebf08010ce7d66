#!/usr/bin/env python3
"""Profile the publisher and the worker's apply loop in process, under pyinstrument.

Starts its own redis-server on a free loopback port (never 6379), builds N messages like
``bench_ingest.py`` (same generator, same seed), then:

1. ``publish``: ``sow_redis.publish.append.append`` of the N messages to a fresh topic, once
   without and once under pyinstrument;
2. ``apply``: ``sow_redis.apply.jobs.drain_partition`` of every partition of a backlog of N entries
   (no linger, no budget), once without and once under pyinstrument (on a second backlog).

pyinstrument hooks every Python call, so it inflates call-heavy Python code (the profiled
runs are ~1.7x slower here); ``--profiler none`` runs only the plain phases, to be sampled
from outside without that bias::

    py-spy record --idle -f raw -o bench-results/pyspy_inproc.txt -- \
        .venv/bin/python scripts/profile_ingest.py --profiler none
    .venv/bin/python scripts/pyspy_summary.py bench-results/pyspy_inproc.txt --root run_apply

For each phase it prints wall seconds, µs per message, redis-server CPU seconds (``INFO
cpu``) and the server's own time per command (``INFO commandstats``, µs per message), and,
for the profiled run, the functions with the most self time and a chosen set of inclusive
times (µs per message and % of the profiled wall time). The full pyinstrument trees go to
``<out>/profile_<phase>.txt`` and everything to ``<out>/profile_ingest.json``.

Example::

    .venv/bin/python scripts/profile_ingest.py --n 100000 --keys 50000
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench_ingest import make_messages, topic_config
from benchlib import applied_counts, private_redis, redis_cpu_s, write_json
from redis import Redis

from sow_redis.apply.jobs import drain_partition
from sow_redis.publish.append import append
from sow_redis.registry import apply_topics
from sow_redis.settings import Settings

INCLUSIVE = {
    "publish": ["append", "check", "encode", "unwrap", "parse", "decode", "key_of",
                "partition_for", "_entry", "xadd", "flush", "execute", "_execute_pipeline",
                "pack_commands", "_send_command_parse_response", "read_response"],
    "apply": ["apply_batch", "read_log", "xrange", "_apply_entries", "_prefetch", "_plan_entry",
              "parse", "decode", "key_of", "partition_for", "expiry_for", "index_members",
              "_flatten", "_call", "call", "__call__", "evalsha", "pack_command",
              "read_response", "send_packed_command", "drain_partition", "_trim"],
}
"""Function names whose inclusive time is reported per phase (outermost frame counted)."""


def server_stats(r: Redis) -> dict[str, dict[str, float]]:
    """``INFO commandstats``: command → {calls, usec}."""
    out = {}
    for k, v in r.info("commandstats").items():
        out[k.removeprefix("cmdstat_")] = {"calls": v["calls"], "usec": v["usec"]}
    return out


def walk(frame: Any, stack: tuple[str, ...], incl: dict) -> None:
    """Add a pyinstrument frame tree's inclusive times per function name into ``incl``,
    counted at the function's outermost frame only (recursion is not counted twice)."""
    name = frame.function or "?"
    if name not in stack:
        incl[name] += frame.time
    for child in frame.children:
        walk(child, stack + (name,), incl)


def self_times(frame: Any) -> dict[str, float]:
    """Self time per function: a frame's time minus its children's."""
    out: dict[str, float] = defaultdict(float)

    def rec(f: Any, parent: str) -> None:
        if f.function == "[self]":  # pyinstrument's own-time frame: the parent's self time
            name = parent
        else:
            name = f"{f.function} ({f.file_path_short}:{f.line_no})"
        out[name] += f.time - sum(c.time for c in f.children)
        for c in f.children:
            rec(c, name)

    rec(frame, "?")
    return out


def analyse(profiler: Any, n: int, names: list[str], wall: float, top: int) -> dict[str, Any]:
    root = profiler.last_session.root_frame()
    st = self_times(root)
    incl: dict[str, float] = defaultdict(float)
    walk(root, (), incl)
    total = root.time
    top_self = sorted(st.items(), key=lambda kv: -kv[1])[:top]
    return {
        "profiled_wall_s": wall,
        "root_time_s": total,
        "top_self": [{"function": k, "us_per_msg": 1e6 * v / n, "pct": 100 * v / total}
                     for k, v in top_self if v > 0],
        "inclusive": [{"function": k, "us_per_msg": 1e6 * incl[k] / n,
                       "pct": 100 * incl[k] / total} for k in names if k in incl],
    }


def phase_stats(r: Redis, n: int, wall: float, cpu0: float, stats0: dict) -> dict[str, Any]:
    stats1 = server_stats(r)
    per_cmd = {}
    for cmd, v in stats1.items():
        calls = v["calls"] - stats0.get(cmd, {}).get("calls", 0)
        usec = v["usec"] - stats0.get(cmd, {}).get("usec", 0)
        if calls:
            per_cmd[cmd] = {"calls": calls, "usec": usec, "us_per_msg": usec / n}
    return {"seconds": wall, "us_per_msg": 1e6 * wall / n, "msg_s": n / wall,
            "redis_cpu_s": redis_cpu_s(r) - cpu0, "redis_cpu_us_per_msg":
            1e6 * (redis_cpu_s(r) - cpu0) / n, "commands": per_cmd}


def run_publish(r: Redis, msgs: list[bytes], partitions: int, profiler: Any | None) -> tuple:
    t = topic_config(f"prof_{uuid.uuid4().hex[:8]}", partitions)
    cpu0, st0 = redis_cpu_s(r), server_stats(r)
    items = [("publish", m, None) for m in msgs]
    t0 = time.perf_counter()
    if profiler:
        profiler.start()
    res = append(r, t, items)
    if profiler:
        profiler.stop()
    wall = time.perf_counter() - t0
    assert res.published == len(msgs), res
    return t, phase_stats(r, len(msgs), wall, cpu0, st0)


def run_apply(r: Redis, t: Any, n: int, distinct: int, settings: Settings,
              profiler: Any | None) -> dict[str, Any]:
    apply_topics(r, [t])
    cpu0, st0 = redis_cpu_s(r), server_stats(r)
    t0 = time.perf_counter()
    if profiler:
        profiler.start()
    done = 0
    for p in range(t.partitions):
        d, drained = drain_partition(r, t, p, settings, budget_s=1e9, linger_ms=0)
        assert drained
        done += d
    if profiler:
        profiler.stop()
    wall = time.perf_counter() - t0
    records, seq, errors = applied_counts(r, t)
    out = phase_stats(r, n, wall, cpu0, st0)
    out["verify"] = {"ok": done == n and records == distinct and seq == n and errors == 0,
                     "consumed": done, "records": records, "seq_sum": seq, "errors": errors}
    return out


def show(title: str, st: dict[str, Any], prof: dict[str, Any] | None) -> None:
    print(f"\n== {title}: {st['seconds']:.3f} s, {st['us_per_msg']:.2f} µs/msg, "
          f"{st['msg_s']:,.0f} msg/s; redis-server CPU {st['redis_cpu_us_per_msg']:.2f} µs/msg")
    for cmd, v in sorted(st["commands"].items(), key=lambda kv: -kv[1]["usec"])[:8]:
        print(f"   server {cmd:<10} calls {v['calls']:>8,}  {v['us_per_msg']:7.3f} µs/msg")
    if prof is None:
        return
    print(f"   profiled wall {prof['profiled_wall_s']:.3f} s; top self time:")
    for x in prof["top_self"]:
        print(f"   {x['us_per_msg']:7.3f} µs/msg {x['pct']:5.1f} %  {x['function']}")
    print("   inclusive:")
    for x in prof["inclusive"]:
        print(f"   {x['us_per_msg']:7.3f} µs/msg {x['pct']:5.1f} %  {x['function']}")


def main(argv: list[str] | None = None) -> int:
    from pyinstrument import Profiler

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=Settings.batch_size)
    ap.add_argument("--interval", type=float, default=0.0005, help="pyinstrument interval (s)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--profiler", choices=["pyinstrument", "none"], default="pyinstrument",
                    help="none: only the plain runs (to profile from outside with py-spy)")
    ap.add_argument("--out", default="bench-results")
    a = ap.parse_args(argv)
    msgs = make_messages(a.n, a.keys, a.size)
    distinct = min(a.n, a.keys)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"options": vars(a)}
    with private_redis("sow-prof-") as server:
        r = Redis.from_url(server.url)
        settings = Settings.from_env(redis_url=server.url, batch_size=a.batch_size)
        # plain runs first (no profiler overhead), then the profiled ones on fresh topics
        t_plain, pub = run_publish(r, msgs, a.partitions, None)
        show("publish (plain)", pub, None)
        app = run_apply(r, t_plain, a.n, distinct, settings, None)
        show("apply (plain)", app, None)
        result["plain"] = {"publish": pub, "apply": app}
        if a.profiler == "none":  # e.g. under ``py-spy record -- python scripts/profile_…``
            print(f"\nwritten: {write_json(str(out / 'profile_ingest_plain.json'), result)}")
            return 0 if app["verify"]["ok"] else 1
        prof = Profiler(interval=a.interval)
        t_prof, pub_p = run_publish(r, msgs, a.partitions, prof)
        pub_a = analyse(prof, a.n, INCLUSIVE["publish"], pub_p["seconds"], a.top)
        (out / "profile_publish.txt").write_text(prof.output_text(unicode=True, color=False))
        show("publish (pyinstrument)", pub_p, pub_a)
        prof = Profiler(interval=a.interval)
        app_p = run_apply(r, t_prof, a.n, distinct, settings, prof)
        app_a = analyse(prof, a.n, INCLUSIVE["apply"], app_p["seconds"], a.top)
        (out / "profile_apply.txt").write_text(prof.output_text(unicode=True, color=False))
        show("apply (pyinstrument)", app_p, app_a)
        result["profiled"] = {"publish": {**pub_p, "profile": pub_a},
                              "apply": {**app_p, "profile": app_a}}
        print(f"\nwritten: {write_json(str(out / 'profile_ingest.json'), result)}")
        ok = app["verify"]["ok"] and app_p["verify"]["ok"]
        if not ok:
            print("VERIFY FAILED", app["verify"], app_p["verify"])
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
