#!/usr/bin/env python3
"""Redis time of one apply.lua call of a small publish: this tree's script against another
revision's, on the same arguments.

A publish of one message, or of a few, is one ``apply.lua`` (operation ``appended``) call per
partition, whose fixed costs (defining the script's functions, the definition fence, the
log's tail, the change block) outweigh the message's own. This benchmark starts its own
redis-server (no persistence, a free port), captures the arguments sow_redis's publisher
sends for a publish of N messages to a 1-partition topic, loads the script of this tree and
the script of ``--base`` (default ``HEAD``: ``git show``) and calls each ``--calls`` times
per round, in ``--rounds`` alternating rounds, reading redis-server's own time per call
(``INFO commandstats``, ``usec_per_call`` of ``EVALSHA``: the script and its commands, no
network). Every call must apply its N messages (the reply is checked).

Output: per N, the median µs per call of each script and their ratio, the load average, and
a JSON file (``--json``). Example::

    .venv/bin/python scripts/bench_apply_call.py --base HEAD~1 --sizes 1,10,100
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
from benchlib import BenchError, apply_calls, machine_info, private_redis, write_json
from redis import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sow_redis.apply import scripts  # noqa: E402
from sow_redis.client import Sow  # noqa: E402
from sow_redis.publish import through  # noqa: E402
from sow_redis.publish.append import append  # noqa: E402


def base_source(rev: str) -> str:
    """apply.lua of revision ``rev`` with its includes expanded."""
    def show(name: str) -> str:
        out = subprocess.run(["git", "show", f"{rev}:sow_redis/apply/lua/{name}.lua"],
                             cwd=ROOT, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise BenchError(f"git show {rev}: {out.stderr.strip()}")
        return out.stdout

    return scripts.INCLUDE.sub(lambda m: show(f"include/{m.group(1)}"), show("apply"))


def captured_call(sow: Sow, size: int) -> list[Any]:
    """The EVALSHA arguments (after the SHA) of a publish of ``size`` messages to a fresh
    1-partition topic, as the publisher built them."""
    name = f"call{size}"
    sow.apply_config(f'[[topic]]\nname = "{name}"\npartitions = 1\n')
    t = sow.topic(name)
    items = [("publish", orjson.dumps({"id": i, "px": 100.25, "qty": 100, "sym": "ABC"}),
              f"k{i}") for i in range(size)]
    with apply_calls() as seen:
        append(sow.r, t, items, jobs=sow.job_settings)
    if len(seen) != 1:
        raise BenchError(f"expected one apply.lua call, the publish made {len(seen)}")
    call = through.WriteThrough(sow.r).call(*seen[0][0])
    return call[1:]


def measure(r: Redis, shas: dict[str, str], args: list[Any], size: int, rounds: int,
            calls: int) -> dict[str, list[float]]:
    """µs per call of each script, one figure per round, the rounds alternating."""
    out: dict[str, list[float]] = {name: [] for name in shas}
    names = list(shas)
    for i in range(rounds):
        for name in names if i % 2 == 0 else names[::-1]:
            r.config_resetstat()
            for _ in range(calls):
                reply = r.evalsha(shas[name], *args)
            if reply[0] != size or reply[3] != b"":
                raise BenchError(f"VERIFY FAILED: {name} applied {reply[0]} of {size}: {reply}")
            out[name].append(float(r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]))
    return out


def main() -> int:
    """Measure, print the table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="git revision to compare with")
    ap.add_argument("--sizes", default="1,10,100", help="messages per publish, comma-separated")
    ap.add_argument("--rounds", type=int, default=8, help="alternating rounds (medians)")
    ap.add_argument("--calls", type=int, default=3000, help="calls per script and round")
    ap.add_argument("--json", default="bench-results/bench_apply_call.json")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    load = os.getloadavg()
    sources = {"base": base_source(a.base), "tree": scripts.expanded_source("apply")}
    rows = []
    with private_redis("bench_apply_call_") as server:
        r = Redis.from_url(server.url)
        sow = Sow(server.url)
        shas = {name: r.script_load(src) for name, src in sources.items()}
        print(f"apply.lua (appended), Redis µs per call (INFO commandstats), base {a.base} "
              f"against this tree; {a.rounds} alternating rounds of {a.calls} calls; load "
              f"average {load[0]:.2f}" + ("" if sources["base"] != sources["tree"]
                                          else " (the two scripts are the same)"))
        print(f"{'messages':>8} {'base µs':>9} {'tree µs':>9} {'tree/base':>10}")
        for size in sizes:
            per = measure(r, shas, captured_call(sow, size), size, a.rounds, a.calls)
            base, tree = statistics.median(per["base"]), statistics.median(per["tree"])
            rows.append({"messages": size, "base_us": base, "tree_us": tree,
                         "ratio": tree / base, "rounds": per})
            print(f"{size:8d} {base:9.1f} {tree:9.1f} {tree / base:10.3f}")
        machine = machine_info(r)
    end = os.getloadavg()
    print(f"load average at the end {end[0]:.2f}")
    path = write_json(a.json, {"benchmark": "bench_apply_call", "base": a.base,
                               "options": vars(a), "machine": machine, "loadavg_start": load,
                               "loadavg_end": end, "results": rows})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        sys.exit(f"bench_apply_call: {exc}")
