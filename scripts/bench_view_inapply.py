#!/usr/bin/env python3
"""A view kept inside the apply, measured (issue 26.4: "maintained incrementally by the same
atomic apply as its underlying topic (or by a worker following the change feed, if you
measure that as better)"): what keeping ``scripts/bench_views.py``'s first view in Redis
costs the write-through publish, against the same publish alone, on the same data.

sow_redis keeps views with a deriver following the change feed (``docs/views.md``); this
benchmark measures the alternative with a prototype, ``scripts/bench_view_inapply.lua``
(see there what it keeps and what it leaves out: removals, the merge of the partitions'
partial rows, their change events, all of which would cost more). It starts its own
redis-server on a free port (no persistence; the machine's 6379 is never used), generates
``--n`` messages of ``bench_views.py`` (15 fields, ``id`` round robin over ``--keys`` keys,
``g`` = key mod ``--groups``) once, and in ``--runs`` rounds of interleaved variants
publishes them with write-through (``sow_redis.publish.append.append``, 1,000 messages a
call) to a fresh topic:

* ``publish alone``: the baseline;
* ``in apply: COUNT, SUM, AVG``: after each 1,000 messages, the prototype per partition on
  those messages (pipelined, waited for, as if it ran inside their apply.lua call), without
  the extremes;
* ``in apply: and MIN, MAX``: the same with MIN(/px), MAX(/px) and MAX(/n) (a sorted set per
  group and field).

The prototype's inputs per message (SOW key, ``g``, ``qty``, ``px``, ``n``) are computed
before the clock starts: a publisher that computed them would add its own CPU, so the
figures are a lower bound of what the apply would pay. Per variant, medians over the rounds:
redis-server CPU µs per message (``INFO cpu``) and messages per second, each against the
baseline. Every run is verified (records, seq sum, no error entry; the groups' counts sum to
the keys).

Output: a table and a JSON file (``--json``). Example::

    .venv/bin/python scripts/bench_view_inapply.py --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from bench_views import make_messages
from benchlib import applied_counts, machine_info, private_redis, redis_cpu_s, write_json
from redis import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sow_redis import keys  # noqa: E402
from sow_redis.config import parse_topics  # noqa: E402
from sow_redis.model.messages import key_of  # noqa: E402
from sow_redis.model.sowkey import partition_of_key  # noqa: E402
from sow_redis.model.topic import TopicConfig  # noqa: E402
from sow_redis.publish.append import append  # noqa: E402
from sow_redis.registry import apply_topics  # noqa: E402
from sow_redis.settings import Settings  # noqa: E402

SETTINGS = Settings.from_env()
SLICE = 1000
"""Messages per publish call, and per prototype call of each partition."""
VARIANTS = {"publish alone": None, "in apply: COUNT, SUM, AVG": "0",
            "in apply: and MIN, MAX": "1"}
"""Variant → the prototype's MINMAX argument (None: no view)."""
LUA = Path(__file__).with_suffix(".lua")


def topic(partitions: int) -> TopicConfig:
    name = f"inapply_{uuid.uuid4().hex[:8]}"
    return parse_topics(f'[[topic]]\nname = "{name}"\nkey = ["/id"]\n'
                        f'partitions = {partitions}\n')[0]


def view_args(msgs: list[bytes], t: TopicConfig) -> list[dict[int, list[str]]]:
    """Per slice of :data:`SLICE` messages, per partition: the prototype's message
    arguments (SOW key, g, qty, px, n of each)."""
    out = []
    for s in range(0, len(msgs), SLICE):
        per: dict[int, list[str]] = {}
        for raw in msgs[s:s + SLICE]:
            obj = orjson.loads(raw)
            key = key_of(obj, t)
            per.setdefault(partition_of_key(key, t.partitions), []).extend(
                [key, str(obj["g"]), str(obj["qty"]), repr(obj["px"]), str(obj["n"])])
        out.append(per)
    return out


def run_once(r: Redis, sha: str, msgs: list[bytes], nkeys: int, partitions: int,
             minmax: str | None) -> dict[str, float]:
    """Publish ``msgs`` to a fresh topic (with the prototype after each slice unless
    ``minmax`` is None); raises on a failed check."""
    t = topic(partitions)
    apply_topics(r, [t])
    calls = view_args(msgs, t) if minmax is not None else []
    cpu0, t0 = redis_cpu_s(r), time.perf_counter()
    for i, s in enumerate(range(0, len(msgs), SLICE)):
        append(r, t, (("publish", m, None) for m in msgs[s:s + SLICE]), jobs=SETTINGS)
        if calls:
            pipe = r.pipeline(transaction=False)
            for p, args in calls[i].items():
                tag = f"{{inapply:{t.name}:{p}}}"
                pipe.evalsha(sha, 3, tag + "in", tag + "st", tag + "rows", tag + "z:",
                             minmax, *args)
            pipe.execute()
    wall, cpu = time.perf_counter() - t0, redis_cpu_s(r) - cpu0
    records, seq, errors = applied_counts(r, t)
    if (records, seq, errors) != (nkeys, len(msgs), 0):
        raise SystemExit(f"check failed: records {records}, seq sum {seq}, errors {errors}")
    if calls:
        counted = 0
        for p in range(partitions):
            state = r.hgetall(f"{{inapply:{t.name}:{p}}}st")
            counted += sum(int(v.split(b",")[0]) for v in state.values())
        if counted != nkeys:
            raise SystemExit(f"check failed: the groups count {counted} records, not {nkeys}")
    for p in range(partitions):
        r.delete(*keys.partition_keys(t.name, p, 0))
    for key in r.scan_iter(match=f"{{inapply:{t.name}:*", count=1000):
        r.delete(key)
    return {"msgs_per_s": len(msgs) / wall, "redis_us_per_msg": cpu / len(msgs) * 1e6}


def main() -> int:
    """Run the rounds, print the table of medians and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="messages per run")
    ap.add_argument("--keys", type=int, default=20_000, help="distinct SOW keys")
    ap.add_argument("--groups", type=int, default=100, help="distinct /g values")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="rounds (medians are reported)")
    ap.add_argument("--json", default="bench-results/bench_view_inapply.json")
    args = ap.parse_args()
    msgs = make_messages(args.n, args.keys, args.groups)
    load_start = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with private_redis("bench_view_inapply_") as server:
        r = Redis.from_url(server.url)
        machine = machine_info(r)
        sha = r.script_load(LUA.read_text())
        run_once(r, sha, msgs[:SLICE * 4], min(args.keys, SLICE * 4), args.partitions,
                 None)  # untimed warm-up
        for i in range(args.runs):
            order = list(VARIANTS) if i % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                runs[name].append(run_once(r, sha, msgs, args.keys, args.partitions,
                                           VARIANTS[name]))
    load_end = os.getloadavg()
    medians = {v: {k: statistics.median(x[k] for x in rs) for k in rs[0]}
               for v, rs in runs.items()}
    base = medians["publish alone"]
    print(f"{args.n} messages over {args.keys} keys, {args.groups} groups, "
          f"{args.partitions} partitions, write-through in calls of {SLICE}, median of "
          f"{args.runs} runs (load average {load_start[0]:.2f} at start, "
          f"{load_end[0]:.2f} at end)")
    print(f"{'variant':28} {'msgs/s':>9} {'vs alone':>9} {'redis µs/msg':>13} {'vs alone':>9}")
    for v, m in medians.items():
        m["rate_vs_alone"] = m["msgs_per_s"] / base["msgs_per_s"]
        m["redis_cpu_vs_alone"] = m["redis_us_per_msg"] / base["redis_us_per_msg"]
        print(f"{v:28} {m['msgs_per_s']:9.0f} {m['rate_vs_alone']:9.2f} "
              f"{m['redis_us_per_msg']:13.2f} {m['redis_cpu_vs_alone']:9.2f}")
    out = write_json(args.json, {"args": vars(args), "machine": machine,
                                 "loadavg_start": load_start, "loadavg_end": load_end,
                                 "runs": runs, "medians": medians})
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
