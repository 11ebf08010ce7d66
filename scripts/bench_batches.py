#!/usr/bin/env python3
"""The client's memory for a query over N records, with and without a batch size (issue 25.5:
"``--batch-size B`` streams results in batches so a query over 1,000,000 records keeps the
client under 100 MB RSS (measure it)").

Starts its own redis-server on a free port (no persistence; the machine's 6379 is never used),
publishes N JSON records of about ``--size`` bytes to one topic of ``--partitions``
partitions (write-through: each 1,000-message chunk applied by one apply.lua call), then runs
each variant ``--runs`` times as a process of its own and takes its peak resident set size
(``ru_maxrss`` from ``wait4``) and its wall time:

* ``start-up``: ``sow-redis sow --top-n 0`` (the CLI's own imports and connection: the floor);
* ``sow``: ``sow-redis sow -t T`` (the result built as one list) and ``sow --batch-size B``;
* ``Sow.sow``: the Python API, ``Sow(url).sow(T)`` (a list) and ``Sow(url).sow(T,
  batch_size=B)`` (an iterator), counting the records;
* ``sow-and-subscribe``: ``--count N+1`` (the query part, then ``group_end``) without and
  with ``--batch-size B`` (one partition copied in Redis at a time: its records hash's
  ``MEMORY USAGE`` is printed as what Redis holds in addition meanwhile);
* ``sow-and-subscribe --projection``: an aggregated subscription (the count of records per
  ``/sym``, 500 groups): its rows and ``group_end`` (``--count 501``);
* with ``--as-of``, the same N records also published to a topic with ``history``, then an
  update of every ``--updated``-th record after a point in time: ``sow --as-of T`` and
  ``sow-and-subscribe --as-of T`` (its query part as of T, ``group_end``, the updates
  replayed, ``completed``) without and with ``--batch-size B``; and ``subscribe --bookmark
  EPOCH``, the replay of every change the history topic's feed holds (N + the updates), then
  ``completed``.

Every run's output is counted (N records, N + 1 messages) and a wrong count stops the script.
The medians are printed as a table with the load average, and written as JSON (``--json``).
Example (1,000,000 records, 3 runs each; about 10 minutes)::

    .venv/bin/python scripts/bench_batches.py --n 1000000 --runs 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
from benchlib import applied_counts, machine_info, private_redis, write_json
from redis import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sow_redis import keys  # noqa: E402
from sow_redis.config import parse_topics  # noqa: E402
from sow_redis.publish.append import append  # noqa: E402
from sow_redis.registry import apply_topics  # noqa: E402
from sow_redis.settings import Settings  # noqa: E402

TOPIC = "batches"
HISTORY_TOPIC = "batches_history"
COUNT = "import sys; from sow_redis.client import Sow; n = 0\n" \
        "for _r in Sow(sys.argv[1]).sow(sys.argv[2]{extra}):\n    n += 1\nprint(n)"
"""The Python variants: count the records of a query (one line: the count)."""
MEASURE = "import os, sys\npid = os.fork()\nif pid == 0:\n    os.execvp(sys.argv[2], sys.argv[2:])\n" \
    "_pid, status, usage = os.wait4(pid, 0)\nopen(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n" \
    "sys.exit(os.waitstatus_to_exitcode(status))"
"""Runs a command as a child of this small process and writes the child's peak RSS (KiB) to a
file: Linux keeps a process's peak RSS across ``exec``, so a command started straight from
this script (hundreds of MiB once the records are generated) would report this script's."""


def messages(n: int, size: int) -> Iterator[tuple[str, bytes, None]]:
    """N publish commands of JSON records ``{"id", "px", "sym", "pad"}`` of about ``size``
    bytes."""
    for i in range(n):
        obj = {"id": i, "px": (i * 7919) % 100_000 / 100, "sym": f"S{i % 500}", "pad": ""}
        obj["pad"] = "x" * max(0, size - len(orjson.dumps(obj)))
        yield "publish", orjson.dumps(obj), None


def load(r: Redis, n: int, size: int, partitions: int, name: str = TOPIC,
         extra: str = "") -> float:
    """Publish the N records to topic ``name`` (``extra``: more lines of its definition);
    returns the seconds it took. Raises SystemExit on a failed check (records, change
    sequences, errors)."""
    (t,) = parse_topics(f'[[topic]]\nname = "{name}"\nkey = ["/id"]\n'
                        f"partitions = {partitions}\n{extra}")
    apply_topics(r, [t])
    t0 = time.perf_counter()
    result = append(r, t, messages(n, size), jobs=Settings.from_env())
    took = time.perf_counter() - t0
    if (result.published, *applied_counts(r, t)) != (n, n, n, 0):
        raise SystemExit(f"check failed: published {result.published}, "
                         f"records/seq/errors {applied_counts(r, t)}")
    return took


def load_history(r: Redis, n: int, size: int, partitions: int, every: int) -> tuple[str, int]:
    """The N records on a topic with history, a point in time, then an update of every
    ``every``-th record: the point (ISO-8601) and the number of updates."""
    load(r, n, size, partitions, HISTORY_TOPIC, 'history = { window = "1h" }\n')
    time.sleep(0.01)
    ms = int(r.time()[0]) * 1000 + int(r.time()[1]) // 1000
    point = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    time.sleep(0.01)
    (t,) = parse_topics(f'[[topic]]\nname = "{HISTORY_TOPIC}"\nkey = ["/id"]\n'
                        f'partitions = {partitions}\nhistory = {{ window = "1h" }}\n')
    updates = [("publish", orjson.dumps({"id": i, "px": 0.0, "sym": "U", "pad": ""}), None)
               for i in range(0, n, every)]
    result = append(r, t, iter(updates), jobs=Settings.from_env())
    if result.published != len(updates):
        raise SystemExit(f"check failed: {result.published} updates of {len(updates)}")
    return point, len(updates)


def variants(url: str, n: int, batch: int,
             as_of: tuple[str, int] | None = None) -> dict[str, tuple[list[str], int]]:
    """Variant name → (command line, lines its output must have). ``as_of``: the point and
    the number of updates after it on the history topic (adds the as-of variants)."""
    cli = [sys.executable, "-m", "sow_redis.cli"]
    py = [sys.executable, "-c"]
    past: dict[str, tuple[list[str], int]] = {}
    if as_of is not None:
        point, updates = as_of
        query = [*cli, "sow", "-t", HISTORY_TOPIC, "--as-of", point]
        replay = [*cli, "sow-and-subscribe", "-t", HISTORY_TOPIC, "--as-of", point, "--count",
                  str(n + updates + 2)]  # records, group_end, the updates, completed
        past = {"sow --as-of": (query, n),
                f"sow --as-of --batch-size {batch}": ([*query, "--batch-size", str(batch)], n),
                "sow-and-subscribe --as-of": (replay, n + updates + 2),
                f"sow-and-subscribe --as-of --batch-size {batch}": (
                    [*replay, "--batch-size", str(batch)], n + updates + 2),
                "subscribe --bookmark EPOCH": (
                    [*cli, "subscribe", "-t", HISTORY_TOPIC, "--bookmark", "EPOCH", "--count",
                     str(n + updates + 1)], n + updates + 1)}
    return {
        "start-up (sow --top-n 0)": ([*cli, "sow", "-t", TOPIC, "--top-n", "0"], 0),
        "sow": ([*cli, "sow", "-t", TOPIC], n),
        f"sow --batch-size {batch}": ([*cli, "sow", "-t", TOPIC, "--batch-size", str(batch)], n),
        "Sow.sow() (a list)": ([*py, COUNT.format(extra=""), url, TOPIC], 1),
        f"Sow.sow(batch_size={batch})": (
            [*py, COUNT.format(extra=f", batch_size={batch}"), url, TOPIC], 1),
        "sow-and-subscribe": ([*cli, "sow-and-subscribe", "-t", TOPIC, "--count",
                               str(n + 1)], n + 1),
        f"sow-and-subscribe --batch-size {batch}": (
            [*cli, "sow-and-subscribe", "-t", TOPIC, "--count", str(n + 1), "--batch-size",
             str(batch)], n + 1),
        "sow-and-subscribe --projection (500 groups)": (
            [*cli, "sow-and-subscribe", "-t", TOPIC, "--projection", "/sym", "--projection",
             "COUNT(/id) AS /n", "--grouping", "/sym", "--count", str(min(n, 500) + 1)],
            min(n, 500) + 1),
        **past,
    }


def run_once(cmd: list[str], want_lines: int, url: str, n: int) -> dict[str, float]:
    """Run ``cmd`` with its output counted as it comes; its peak RSS (MiB) and wall time (s).
    Raises SystemExit when it fails or prints a wrong number of lines."""
    env = dict(os.environ, SOW_REDIS_URL=url, PYTHONPATH=str(ROOT))
    with tempfile.NamedTemporaryFile(prefix="bench-batches-rss-") as peak:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", MEASURE, peak.name, *cmd],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
        assert proc.stdout is not None and proc.stderr is not None
        lines, last = 0, b""
        while chunk := proc.stdout.read(1 << 20):
            lines += chunk.count(b"\n")
            last = (last + chunk)[-64:]
        err = proc.stderr.read()
        proc.wait()
        took = time.perf_counter() - t0
        rss_kib = int(Path(peak.name).read_text() or 0)
    if proc.returncode != 0 or lines != want_lines:
        raise SystemExit(f"{' '.join(cmd[2:])}: exit status {proc.returncode}, {lines} lines "
                         f"(want {want_lines}): {err.decode()[-500:]}")
    if want_lines == 1 and int(last.strip()) != n:  # a Python variant prints its count
        raise SystemExit(f"{cmd[-2:]}: counted {last.strip()!r} records, want {n}")
    return {"rss_mib": rss_kib / 1024, "seconds": took}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="records")
    ap.add_argument("--size", type=int, default=150, help="approximate record bytes")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3, help="runs per variant (medians reported)")
    ap.add_argument("--as-of", action="store_true", help="also the as-of variants (a second "
                    "topic of N records, with history)")
    ap.add_argument("--updated", type=int, default=100, help="with --as-of: every N-th record "
                    "is updated after the point")
    ap.add_argument("--only", help="only the variants whose name holds this text")
    ap.add_argument("--json", default="bench-results/bench_batches.json")
    args = ap.parse_args()
    with private_redis("bench-batches-") as server:
        r = Redis.from_url(server.url)
        load_s = load(r, args.n, args.size, args.partitions)
        used = int(r.info("memory")["used_memory"])
        # what a batched sow-and-subscribe copies at a time: one partition's records hash
        copy = int(r.memory_usage(keys.records(TOPIC, 0), samples=0) or 0)
        print(f"{args.n:,} records of ~{args.size} bytes in {args.partitions} partitions "
              f"loaded in {load_s:.1f} s (Redis used_memory {used / 2**20:.0f} MiB; one "
              f"partition's records hash, what a batched sow-and-subscribe copies at a time: "
              f"{copy / 2**20:.0f} MiB)")
        as_of = None
        if args.as_of:
            as_of = load_history(r, args.n, args.size, args.partitions, args.updated)
            print(f"history topic: {args.n:,} records, {as_of[1]:,} updated after {as_of[0]}")
        table = {name: v for name, v in variants(server.url, args.n, args.batch_size,
                                                  as_of).items()
                 if args.only is None or args.only in name}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in table}
        loads = []
        for _round in range(args.runs):
            loads.append(os.getloadavg()[0])
            for name, (cmd, want) in table.items():
                runs[name].append(run_once(cmd, want, server.url, args.n))
        info = machine_info(r)
    medians = {name: {k: statistics.median(x[k] for x in rs) for k in ("rss_mib", "seconds")}
               for name, rs in runs.items()}
    print(f"\npeak RSS of the client process, median of {args.runs} (load average at the "
          f"rounds' starts: {', '.join(f'{x:.1f}' for x in loads)})")
    print(f"{'variant':<46} {'RSS MiB':>9} {'range':>13} {'seconds':>8}")
    for name, m in medians.items():
        rss = [x["rss_mib"] for x in runs[name]]
        print(f"{name:<46} {m['rss_mib']:>9.0f} {min(rss):>6.0f}–{max(rss):<6.0f} "
              f"{m['seconds']:>8.1f}")
    path = write_json(args.json, {
        "n": args.n, "size": args.size, "partitions": args.partitions,
        "batch_size": args.batch_size, "runs": args.runs, "load_seconds": load_s,
        "redis_used_memory": used, "partition_copy_bytes": copy, "load_average": loads, "medians": medians,
        "all_runs": runs, "machine": info})
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
