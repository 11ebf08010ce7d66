#!/usr/bin/env python3
"""Historical SOW (issue 25.1): an as-of query against the same current query, and the memory
each retained version takes against the record's own size, in one run on the same data.

Starts its own redis-server on a free port (no persistence; never the machine's 6379), defines
a topic with ``history = { window = "1h" }``, publishes ``--n`` records of about ``--size``
bytes, notes the time, then updates ``--changes`` of them (publish and delta_publish) and
deletes a few. Then, in ``--runs`` alternating rounds:

* ``current``: ``Sow.sow(topic)`` (every record now);
* ``as-of``: ``Sow.sow(topic, as_of=<the noted time>)`` (every record as it was), checked
  record by record against the records published before the time.

Memory: ``MEMORY USAGE`` of the topic's change streams over the changes they hold (bytes per
retained version), against the records hash over its records (bytes per record, the record's
own size in Redis). An update keeps its new version whole and, as its previous state, only
the members that differ (apply/lua/include/reverse_delta.lua).

Ingest: then ``--runs`` alternating rounds publish the same workload (the ``--n`` inserts,
then the ``--changes`` updates) into a fresh topic with history (``on``) and one without
(``off``): messages per second (wall) and redis-server CPU µs per message (``INFO cpu``).
Prints a table of medians and writes JSON (``--json``).

    .venv/bin/python scripts/bench_history.py --n 100000 --changes 10000 --runs 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from benchlib import machine_info, private_redis, redis_cpu_s, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sow_redis import keys  # noqa: E402
from sow_redis.client import Sow  # noqa: E402


def _feed_bytes(sow: Sow, name: str, partitions: int) -> int:
    """``MEMORY USAGE`` of the topic's change streams, in bytes."""
    return sum(int(sow.r.memory_usage(keys.changes(name, p), samples=0) or 0)
               for p in range(partitions))


def _ingest(sow: Sow, history: bool, args: argparse.Namespace,
            pad: str) -> tuple[float, float, float, float]:
    """Publish the workload (inserts, then updates: half publish, half delta_publish) into a
    fresh topic with or without history; ``(messages per second, Redis CPU µs per
    message)`` of the whole workload, then of the updates alone (each carries a previous
    state: with history, its reverse delta)."""
    name = f"ingest_{uuid.uuid4().hex[:8]}"
    sow.apply_config(f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = '
                     f'{args.partitions}\n' + ('history = { window = "1h" }\n' if history else ""))
    step = max(1, args.n // max(1, args.changes))
    changed = list(range(0, args.n, step))[:args.changes]
    half = len(changed) // 2
    cpu0, t0 = redis_cpu_s(sow.r), time.perf_counter()
    for start in range(0, args.n, 10_000):
        sow.publish(name, [{"id": i, "v": 0, "pad": pad}
                           for i in range(start, min(args.n, start + 10_000))])
    cpu1, t1 = redis_cpu_s(sow.r), time.perf_counter()
    sow.publish(name, [{"id": i, "v": 1, "pad": pad} for i in changed[:half]])
    sow.delta_publish(name, [{"id": i, "v": 2} for i in changed[half:]])
    end, cpu_end = time.perf_counter(), redis_cpu_s(sow.r)
    took, cpu = end - t0, cpu_end - cpu0
    n = args.n + len(changed)
    for p in range(args.partitions):
        sow.r.delete(keys.records(name, p), keys.changes(name, p), keys.log(name, p))
    return (n / took, cpu / n * 1e6, len(changed) / (end - t1),
            (cpu_end - cpu1) / max(1, len(changed)) * 1e6)


def main() -> int:
    """Run, print the table, write the JSON; exit status 1 when a check fails."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="records")
    ap.add_argument("--changes", type=int, default=10_000, help="updates after the point")
    ap.add_argument("--size", type=int, default=200, help="approximate record bytes")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default="bench-results/bench_history.json")
    args = ap.parse_args()
    load = os.getloadavg()
    with private_redis("bench_history_") as server:
        sow = Sow(server.url, inline=True)
        name = f"hist_{uuid.uuid4().hex[:8]}"
        sow.apply_config(f'[[topic]]\nname = "{name}"\nkey = ["/id"]\n'
                         f'partitions = {args.partitions}\nhistory = {{ window = "1h" }}\n')
        pad = "x" * max(0, args.size - 40)
        for start in range(0, args.n, 10_000):
            sow.publish(name, [{"id": i, "v": 0, "pad": pad}
                               for i in range(start, min(args.n, start + 10_000))])
        feed_inserts = _feed_bytes(sow, name, args.partitions)
        time.sleep(0.01)
        point = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        time.sleep(0.01)
        step = max(1, args.n // max(1, args.changes))
        changed = list(range(0, args.n, step))[:args.changes]
        half = len(changed) // 2
        sow.publish(name, [{"id": i, "v": 1, "pad": pad} for i in changed[:half]])
        for i in changed[half:]:
            sow.delta_publish(name, {"id": i, "v": 2})
        sow.sow_delete(name, f"/id < {min(100, args.n)}")
        timings: dict[str, list[float]] = {"current": [], "as-of": []}
        ok = True
        for run in range(args.runs):
            for kind in (("current", "as-of") if run % 2 == 0 else ("as-of", "current")):
                t0 = time.perf_counter()
                recs = sow.sow(name) if kind == "current" else sow.sow(name, as_of=point)
                timings[kind].append(time.perf_counter() - t0)
                if kind == "as-of":
                    ok &= len(recs) == args.n and all(r.obj()["v"] == 0 for r in recs)
        r = sow.r
        feed = _feed_bytes(sow, name, args.partitions)
        ingest: dict[str, list[tuple[float, float, float, float]]] = {"off": [], "on": []}
        for run in range(args.runs):
            for kind in (("off", "on") if run % 2 == 0 else ("on", "off")):
                ingest[kind].append(_ingest(sow, kind == "on", args, pad))
        held = sum(int(r.xlen(keys.changes(name, p))) for p in range(args.partitions))
        versions = args.n + len(changed) + min(100, args.n)
        records = sum(int(r.memory_usage(keys.records(name, p), samples=0) or 0)
                      for p in range(args.partitions))
        count = sum(int(r.hlen(keys.records(name, p))) for p in range(args.partitions))
        machine = machine_info(r)
    med = {k: statistics.median(v) for k, v in timings.items()}
    rate = {k: statistics.median(x[0] for x in v) for k, v in ingest.items()}
    cpu = {k: statistics.median(x[1] for x in v) for k, v in ingest.items()}
    up_rate = {k: statistics.median(x[2] for x in v) for k, v in ingest.items()}
    up_cpu = {k: statistics.median(x[3] for x in v) for k, v in ingest.items()}
    per_version, per_record = feed / versions, records / count
    per_insert = feed_inserts / args.n
    per_update = (feed - feed_inserts) / (versions - args.n)
    print(f"{args.n} records of ~{args.size} B, {len(changed)} changed and "
          f"{min(100, args.n)} deleted after the point; median of {args.runs} runs "
          f"(load average {load[0]:.2f} at start)")
    print(f"{'query':10} {'seconds':>9} {'runs':>30}")
    for k, v in timings.items():
        print(f"{k:10} {med[k]:9.3f} {', '.join(f'{x:.3f}' for x in v):>30}")
    print(f"as-of ÷ current: {med['as-of'] / med['current']:.2f}×")
    print(f"memory: {per_version:.0f} B per retained version ({held} change blocks) against "
          f"{per_record:.0f} B per record: {per_version / per_record:.2f}×; an insert "
          f"{per_insert:.0f} B ({per_insert / per_record:.2f}×), an update or delete "
          f"{per_update:.0f} B ({per_update / per_record:.2f}×: the new version and what "
          "differs)")
    print(f"{'ingest':10} {'msgs/s':>9} {'redis µs/msg':>13}")
    for k in ("off", "on"):
        print(f"{'history ' + k:10} {rate[k]:9.0f} {cpu[k]:13.2f}")
    print(f"history on ÷ off: {rate['on'] / rate['off']:.2f}× messages per second, "
          f"{cpu['on'] / cpu['off']:.2f}× Redis CPU per message")
    print(f"the updates alone: {up_rate['off']:.0f} / {up_rate['on']:.0f} msgs/s, "
          f"{up_cpu['off']:.2f} / {up_cpu['on']:.2f} redis µs/msg (off / on): history on ÷ "
          f"off {up_rate['on'] / up_rate['off']:.2f}× messages per second, "
          f"{up_cpu['on'] / up_cpu['off']:.2f}× Redis CPU per message")
    print("check: " + ("as-of records equal the records at the point" if ok
                       else "VERIFY FAILED"))
    out = write_json(args.json, {"args": vars(args), "machine": machine, "loadavg_start": load,
                                 "loadavg_end": os.getloadavg(), "timings": timings,
                                 "medians": med, "bytes_per_version": per_version,
                                 "bytes_per_record": per_record,
                                 "bytes_per_insert": per_insert,
                                 "bytes_per_update": per_update, "ingest": ingest,
                                 "ingest_rate": rate, "ingest_redis_us": cpu,
                                 "updates_rate": up_rate, "updates_redis_us": up_cpu,
                                 "ok": ok})
    print(f"results: {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
