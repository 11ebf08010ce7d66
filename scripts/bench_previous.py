#!/usr/bin/env python3
"""The cost of recording the previous state in the change feed (``change_previous``, issue
26.1), against the same topic without it, in one run on the same data.

Starts its own redis-server on a free port (no persistence; the machine's 6379 is never
used), generates N JSON messages once (``id`` round robin over ``--keys`` keys, so most
publishes replace a record and carry its previous state), then for each of ``--runs`` rounds
publishes them, alternating the variants, to a fresh topic each time:

* ``off``: the topic as it is by default (change events without the previous state);
* ``on``: the same topic with ``change_previous = true``;
* ``off, expiring`` / ``on, expiring``: both again on a topic with ``expiration = "1h"``
  (its write path reads the old record anyway, to expire it if due).

``--path write-through`` (the default): a publish goes through
``sow_redis.publish.append.append`` with write-through: apply.lua appends and applies each
1,000-message chunk in one call (the path of a caught-up topic), so the figures are those of
the publish and its apply together. ``--path workers``: the messages are appended to the log
first (not timed), then the workers' code drains every partition in process
(``sow_redis.apply.jobs.drain_partition``: apply.lua reads the log in batches of
``SOW_BATCH_SIZE``), and only that is timed: the apply throughput of workers working off a
backlog. Per variant it reports the medians over the rounds of:
messages per second (wall), redis-server CPU µs per message (``INFO cpu``), and change-feed
bytes per change (``MEMORY USAGE`` of the partitions' change streams over N); and the range
of the rounds' own ratios (each round's rate against its base variant's in the same round),
which shows how far one round moves on the machine. Every run is
verified: records = distinct keys, the partitions' seq sum = N, no error entry.

Output: a table and a JSON file (``--json``). Example::

    .venv/bin/python scripts/bench_previous.py --n 100000 --keys 20000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from benchlib import applied_counts, machine_info, private_redis, redis_cpu_s, write_json
from redis import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sow_redis import keys  # noqa: E402
from sow_redis.apply.jobs import drain_partition
from sow_redis.config import parse_topics
from sow_redis.model.topic import TopicConfig
from sow_redis.publish.append import append  # noqa: E402
from sow_redis.registry import apply_topics  # noqa: E402
from sow_redis.settings import Settings  # noqa: E402

SETTINGS = Settings.from_env()
"""Write-through on (the default): each chunk is applied by the same apply.lua call."""

VARIANTS = {"off": (False, False), "on": (True, False),
            "off, expiring": (False, True), "on, expiring": (True, True)}


def make_messages(n: int, nkeys: int, size: int) -> list[bytes]:
    """N JSON messages of about ``size`` bytes, ``id`` round robin over ``nkeys`` keys."""
    rnd = random.Random(26)
    out = []
    for i in range(n):
        obj: dict[str, Any] = {"id": i % nkeys, "px": round(rnd.uniform(1, 1000), 4),
                               "qty": rnd.randint(1, 100_000), "pad": ""}
        obj["pad"] = "x" * max(0, size - len(orjson.dumps(obj)))
        out.append(orjson.dumps(obj))
    return out


def topic(partitions: int, previous: bool, expiring: bool) -> TopicConfig:
    name = f"prev_{uuid.uuid4().hex[:8]}"
    text = f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = {partitions}\n'
    text += "change_previous = true\n" if previous else ""
    text += 'expiration = "1h"\n' if expiring else ""
    return parse_topics(text)[0]


def run_once(r: Redis, msgs: list[bytes], nkeys: int, t: TopicConfig,
             path: str = "write-through") -> dict[str, Any]:
    """Publish ``msgs`` to ``t`` and measure the apply on ``path`` (see the module
    docstring); raises on a failed check."""
    apply_topics(r, [t])
    items = (("publish", m, None) for m in msgs)
    if path == "workers":
        result = append(r, t, items)  # into the log only: the workers' backlog
        cpu0, t0 = redis_cpu_s(r), time.perf_counter()
        for p in range(t.partitions):
            while not drain_partition(r, t, p, SETTINGS, budget_s=60, linger_ms=0)[1]:
                pass
    else:
        cpu0, t0 = redis_cpu_s(r), time.perf_counter()
        result = append(r, t, items, jobs=SETTINGS)
    wall, cpu = time.perf_counter() - t0, redis_cpu_s(r) - cpu0
    records, seq, errors = applied_counts(r, t)
    if (result.published, records, seq, errors) != (len(msgs), nkeys, len(msgs), 0):
        raise SystemExit(f"check failed: published {result.published}, records {records}, "
                         f"seq sum {seq}, errors {errors}")
    feed = sum(int(r.memory_usage(keys.changes(t.name, p), samples=0) or 0)
               for p in range(t.partitions))
    for p in range(t.partitions):  # free the memory for the next run
        r.delete(*keys.partition_keys(t.name, p, 0))
    return {"msgs_per_s": len(msgs) / wall, "redis_us_per_msg": cpu / len(msgs) * 1e6,
            "feed_bytes_per_change": feed / len(msgs)}


def main() -> int:
    """Run the rounds, print the table of medians and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="messages per run")
    ap.add_argument("--keys", type=int, default=20_000, help="distinct SOW keys")
    ap.add_argument("--size", type=int, default=200, help="approximate message bytes")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="rounds (medians are reported)")
    ap.add_argument("--path", choices=("write-through", "workers"), default="write-through",
                    help="the apply measured (see above)")
    ap.add_argument("--json", default="bench-results/bench_previous.json")
    args = ap.parse_args()
    msgs = make_messages(args.n, args.keys, args.size)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    load = os.getloadavg()
    with private_redis("bench_previous_") as server:
        r = Redis.from_url(server.url)
        machine = machine_info(r)
        for i in range(args.runs):
            order = list(VARIANTS) if i % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                previous, expiring = VARIANTS[name]
                runs[name].append(run_once(r, msgs, args.keys,
                                           topic(args.partitions, previous, expiring),
                                           args.path))
    medians = {v: {k: statistics.median(x[k] for x in rs) for k in rs[0]}
               for v, rs in runs.items()}
    print(f"{args.n} messages of ~{args.size} B over {args.keys} keys, {args.partitions} "
          f"partitions, {args.path} path, median of {args.runs} runs (load average {load[0]:.2f} at start)")
    print(f"{'variant':16} {'msgs/s':>10} {'vs off':>8} {'rounds':>11} {'redis µs/msg':>13} "
          f"{'vs off':>8} {'feed B/change':>14}")
    paired = {}
    for v, m in medians.items():
        base_name = "off, expiring" if "expiring" in v else "off"
        base = medians[base_name]
        # each round's rate against its base's in the same round: how far one round moves
        paired[v] = [x["msgs_per_s"] / b["msgs_per_s"] for x, b in zip(runs[v], runs[base_name])]
        spread = f"{min(paired[v]):.2f}–{max(paired[v]):.2f}"
        print(f"{v:16} {m['msgs_per_s']:10.0f} {m['msgs_per_s'] / base['msgs_per_s']:8.2f} "
              f"{spread:>11} {m['redis_us_per_msg']:13.2f} "
              f"{m['redis_us_per_msg'] / base['redis_us_per_msg']:8.2f} "
              f"{m['feed_bytes_per_change']:14.0f}")
    print("rounds: the least and greatest of the rounds' own ratios (each round's rate against "
          "its base's in the same round)")
    out = write_json(args.json, {"args": vars(args), "machine": machine,
                                 "loadavg_start": load, "loadavg_end": os.getloadavg(),
                                 "runs": runs, "medians": medians, "paired_ratios": paired})
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
