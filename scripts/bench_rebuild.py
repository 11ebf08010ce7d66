#!/usr/bin/env python3
"""How fast a transient topic's SOW is rebuilt from its log (issue 25.2), against the first
apply of the same log, in one run on the same data; and what keeping the log costs.

Starts its own redis-server on a free port (no persistence; the machine's 6379 is never
used), generates N JSON messages once (``id`` round robin over ``--keys`` keys, one in
``--delta-every`` a ``delta_publish``), then per round, on a fresh transient topic:

* ``apply``: the messages appended to the log (no write-through), then applied by the
  workers' code in this process (``sow_redis.apply.jobs.apply_here``): the baseline;
* ``rebuild``: the SOW dropped (``sow_redis.rebuild.drop_sow``: each partition's cursor,
  under its lease) and rebuilt by the same code from the log (epoch), its change events
  left out (the entries were applied before).

Per phase it reports the medians over the rounds of log entries per second (wall) and
redis-server CPU µs per entry (``INFO cpu``); and the log's bytes per entry (``MEMORY USAGE``
of the partitions' logs over N), the memory a transient topic keeps. Every round is
verified: records = distinct keys, no error entry, and the rebuilt records (data, expiry,
stream id) equal the applied ones.

Output: a table and a JSON file (``--json``). Example::

    .venv/bin/python scripts/bench_rebuild.py --n 100000 --keys 20000 --runs 3
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
from sow_redis.apply.jobs import apply_here  # noqa: E402
from sow_redis.config import parse_topics  # noqa: E402
from sow_redis.model.topic import TopicConfig  # noqa: E402
from sow_redis.publish.append import append  # noqa: E402
from sow_redis.rebuild import drop_sow  # noqa: E402
from sow_redis.registry import apply_topics  # noqa: E402
from sow_redis.settings import Settings  # noqa: E402


def make_messages(n: int, nkeys: int, size: int, delta_every: int
                  ) -> list[tuple[str, bytes, None]]:
    """N ``(command, JSON, None)`` items of about ``size`` bytes, ``id`` round robin over
    ``nkeys`` keys; one in ``delta_every`` (after the first round of keys) a delta."""
    rnd = random.Random(25)
    out: list[tuple[str, bytes, None]] = []
    for i in range(n):
        obj: dict[str, Any] = {"id": i % nkeys, "px": round(rnd.uniform(1, 1000), 4),
                               "qty": rnd.randint(1, 100_000), "pad": ""}
        obj["pad"] = "x" * max(0, size - len(orjson.dumps(obj)))
        delta = i >= nkeys and delta_every and i % delta_every == 0
        out.append(("delta_publish" if delta else "publish", orjson.dumps(obj), None))
    return out


def topic(partitions: int) -> TopicConfig:
    name = f"rebuild_{uuid.uuid4().hex[:8]}"
    return parse_topics(f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = '
                        f'{partitions}\npersistence = "transient"\n')[0]


def records(r: Redis, t: TopicConfig) -> dict[bytes, tuple[list[bytes], bytes]]:
    """SOW key → (expiry, stream id; data) of every record (the seqs differ by design)."""
    out = {}
    for p in range(t.partitions):
        for k, v in r.hgetall(keys.records(t.name, p)).items():
            head, body = v.split(b"\n", 1)
            out[k] = (head.split(b":")[1:], body)
    return out


def timed(r: Redis, fn: Any) -> tuple[float, float]:
    """(wall s, redis-server CPU s) of ``fn()``."""
    cpu0, t0 = redis_cpu_s(r), time.perf_counter()
    fn()
    return time.perf_counter() - t0, redis_cpu_s(r) - cpu0


def run_once(r: Redis, msgs: list[tuple[str, bytes, None]], nkeys: int, t: TopicConfig,
             settings: Settings) -> dict[str, Any]:
    """One round (see the module docstring); raises SystemExit on a failed check."""
    apply_topics(r, [t])
    parts = list(range(t.partitions))
    result = append(r, t, iter(msgs))
    if result.published != len(msgs):
        raise SystemExit(f"check failed: published {result.published} of {len(msgs)}")
    log_bytes = sum(int(r.memory_usage(keys.log(t.name, p), samples=0) or 0) for p in parts)
    wall_a, cpu_a = timed(r, lambda: apply_here(r, t, parts, settings, 60))
    first = records(r, t)
    wall_r, cpu_r = timed(r, lambda: (drop_sow(r, t, settings, 10),
                                      apply_here(r, t, parts, settings, 60)))
    n_rec, _seq, errors = applied_counts(r, t)
    if (n_rec, errors) != (nkeys, 0) or records(r, t) != first:
        raise SystemExit(f"check failed: records {n_rec} of {nkeys}, errors {errors}, "
                         f"rebuilt equal to applied: {records(r, t) == first}")
    for p in parts:  # free the memory for the next round
        r.delete(*keys.partition_keys(t.name, p, 0))
    n = len(msgs)
    return {"apply": {"entries_per_s": n / wall_a, "redis_us_per_entry": cpu_a / n * 1e6},
            "rebuild": {"entries_per_s": n / wall_r, "redis_us_per_entry": cpu_r / n * 1e6},
            "log_bytes_per_entry": log_bytes / n}


def main() -> int:
    """Run the rounds, print the table of medians and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="messages per round")
    ap.add_argument("--keys", type=int, default=20_000, help="distinct SOW keys")
    ap.add_argument("--size", type=int, default=200, help="approximate message bytes")
    ap.add_argument("--delta-every", type=int, default=10,
                    help="one message in this many is a delta_publish (0: none)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="rounds (medians are reported)")
    ap.add_argument("--json", default="bench-results/bench_rebuild.json")
    args = ap.parse_args()
    msgs = make_messages(args.n, args.keys, args.size, args.delta_every)
    runs: list[dict[str, Any]] = []
    load = os.getloadavg()
    with private_redis("bench_rebuild_") as server:
        r = Redis.from_url(server.url)
        settings = Settings.from_env(redis_url=server.url, write_through=False)
        machine = machine_info(r)
        for _ in range(args.runs):
            runs.append(run_once(r, msgs, args.keys, topic(args.partitions), settings))
    med = {ph: {k: statistics.median(x[ph][k] for x in runs) for k in runs[0][ph]}
           for ph in ("apply", "rebuild")}
    log_b = statistics.median(x["log_bytes_per_entry"] for x in runs)
    print(f"{args.n} messages of ~{args.size} B over {args.keys} keys (1 in "
          f"{args.delta_every} a delta), {args.partitions} partitions, median of {args.runs} "
          f"runs (load average {load[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end)")
    print(f"{'phase':10} {'entries/s':>10} {'vs apply':>9} {'redis µs/entry':>15} {'vs apply':>9}")
    for ph, m in med.items():
        base = med["apply"]
        print(f"{ph:10} {m['entries_per_s']:10.0f} "
              f"{m['entries_per_s'] / base['entries_per_s']:9.2f} "
              f"{m['redis_us_per_entry']:15.2f} "
              f"{m['redis_us_per_entry'] / base['redis_us_per_entry']:9.2f}")
    print(f"the log kept: {log_b:.0f} bytes per entry")
    out = write_json(args.json, {"args": vars(args), "machine": machine,
                                 "loadavg_start": load, "loadavg_end": os.getloadavg(),
                                 "runs": runs, "medians": med,
                                 "log_bytes_per_entry": log_b})
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
