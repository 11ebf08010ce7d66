#!/usr/bin/env python3
"""What redis-py costs this process per round trip, by version: the client CPU of a ``GET``,
an ``EVALSHA`` and a pipeline of 10 ``GET``s, and of an inline ``Sow.publish`` of one message
(written through: one round trip for the append and apply, one for the registry check; 8
before fbac736: append, lease, apply, release) and an inline ``Sow.sow_delete`` by a filter
on the key field (the path of every test and notebook on ``Sow(inline=True)``), each in
microseconds of this process's CPU (user + system) per call.

``--tree DIR`` (repeatable) measures another checkout of sow_redis (e.g. ``git worktree add
--detach /tmp/old <rev>``) with each interpreter: the child imports sow_redis from there
(checked: it reports the path it imported) and runs in a scratch folder.

Each interpreter given (this one, and every ``--python PATH``: another virtualenv with
sow_redis's dependencies and another redis-py, e.g. ``python3 -m venv /tmp/r81 &&
/tmp/r81/bin/pip install -e . "redis[hiredis]==8.1.0"``) is measured in a child process of its
own, in rounds that alternate the interpreters, against one redis-server started on a free
port (the machine's 6379 is never used). Figures are the medians of ``--runs`` rounds.
Output: a table and a JSON file (``--json``)::

    .venv/bin/python scripts/bench_client.py --python /tmp/r81/bin/python --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CALLS = ("get", "evalsha", "pipeline_10", "inline_publish", "inline_delete")


def _per_call_us(fn: Callable[[], object], n: int) -> float:
    """CPU microseconds per call of ``fn`` over ``n`` calls (after 200 warm-up calls)."""
    for _ in range(200):
        fn()
    started = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - started) / n * 1e6


def child(url: str, n: int) -> dict:
    """The figures of this interpreter (run with ``--child URL``)."""
    import redis

    import sow_redis
    from sow_redis.client import Sow

    r = redis.Redis.from_url(url)
    r.set("bench:x", "1")
    sha = r.script_load("return 1")

    def pipeline() -> None:
        pipe = r.pipeline(transaction=False)
        for _ in range(10):
            pipe.get("bench:x")
        pipe.execute()

    sow = Sow(url, inline=True)
    name = f"bench{os.getpid()}"
    sow.apply_config(f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = 4\n')
    counter = iter(range(10**9))

    def publish() -> None:
        sow.publish(name, {"id": next(counter) % 500, "v": 1})

    out = {"redis_py": redis.__version__, "sow_redis": str(Path(sow_redis.__file__).parent),
           "get": _per_call_us(lambda: r.get("bench:x"), n),
           "evalsha": _per_call_us(lambda: r.evalsha(sha, 0), n),
           "pipeline_10": _per_call_us(pipeline, n // 10),
           "inline_publish": _per_call_us(publish, n // 20)}
    # verified: every publish applied (the ids cycle over 500 keys, one record each)
    published = next(counter)
    records = len(sow.sow(name))
    if records != min(published, 500):
        raise SystemExit(f"{records} records after {published} publishes")
    deletes = iter(range(10**9))

    def delete() -> None:
        sow.sow_delete(name, f"/id = {next(deletes) % 500}")

    out["inline_delete"] = _per_call_us(delete, n // 100)
    gone = set(range(min(next(deletes), 500)))  # verified: every id deleted is gone
    left = {rec.obj()["id"] for rec in sow.sow(name)}
    if left & gone or len(left) != records - len(gone & set(range(records))):
        raise SystemExit(f"{len(left & gone)} deleted records left")
    return {**out, "published": published, "records": records}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", default=[], metavar="PATH",
                    help="another interpreter to measure (repeatable)")
    ap.add_argument("--n", type=int, default=20_000, help="calls of GET / EVALSHA per round")
    ap.add_argument("--runs", type=int, default=3, help="rounds (each interpreter once each)")
    ap.add_argument("--json", default="bench-results/bench_client.json", help="output file")
    ap.add_argument("--tree", action="append", default=[], metavar="DIR",
                    help="another checkout of sow_redis to measure (repeatable)")
    ap.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if args.tree:  # this checkout's folder was put first on the path above
            sys.path.insert(0, str(Path(args.tree[0]).resolve()))
        print(json.dumps(child(args.child, args.n)))
        return

    import redis
    from benchlib import machine_info, private_redis, write_json

    pythons = list(dict.fromkeys([sys.executable, *args.python]))  # each once
    trees = [str(Path(t).resolve()) for t in args.tree] or [None]
    variants = [(py, tree) for py in pythons for tree in trees]
    rounds: dict[str, list[dict]] = {f"{py} {tree or '.'}": [] for py, tree in variants}
    loads = []
    with private_redis("bench-client-") as server, \
            tempfile.TemporaryDirectory(prefix="bench-client-") as scratch:
        for _ in range(args.runs):
            loads.append(os.getloadavg()[0])
            for py, tree in variants:
                cmd = [py, str(Path(__file__).resolve()), "--child", server.url, "--n",
                       str(args.n), *(["--tree", tree] if tree else [])]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                                     timeout=600, cwd=scratch)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                if tree and not got["sow_redis"].startswith(tree):
                    raise SystemExit(f"the child imported {got['sow_redis']}, not {tree}")
                rounds[f"{py} {tree or '.'}"].append(got)
        machine = machine_info(redis.Redis.from_url(server.url))
    medians = {name: {"redis_py": runs[0]["redis_py"], "tree": name.split(" ", 1)[1],
                      **{c: round(statistics.median(run[c] for run in runs), 1)
                         for c in CALLS}}
               for name, runs in rounds.items()}
    print(f"client CPU µs per call, median of {args.runs} rounds (load average "
          f"{', '.join(f'{x:.1f}' for x in loads)})")
    print(f"{'redis-py':>10} {'tree':>16} " + " ".join(f"{c:>15}" for c in CALLS))
    for med in medians.values():
        print(f"{med['redis_py']:>10} {str(med['tree'])[-16:]:>16} "
              + " ".join(f"{med[c]:>15.1f}" for c in CALLS))
    path = write_json(args.json, {"machine": machine, "load_averages": loads, "n": args.n,
                                  "runs": {py: runs for py, runs in rounds.items()},
                                  "median": medians})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
