#!/usr/bin/env python3
"""What the deriver costs per change, on its own: the change blocks of ``--n`` messages into a
topic with one view (``bench_views.py``'s first: by ``/g``, COUNT, SUM, AVG, MIN, MAX) are
captured once, then replayed through a view follower (``sow_redis.derive``) in a fresh
process, with its writes left out (its rows are made, not written): the work a deriver does
for each change it takes, apart from Redis and the other processes of the machine.

Each replay runs in a process of its own with the sow_redis of a given tree first on its path
(this checkout, and with ``--against DIR`` another one, e.g. ``git worktree add --detach
/tmp/old <rev>``), in three stages, so the table splits the cost:

* ``parse``: decoding the blocks (``sow_redis.model.events.parse_block``, or
  ``plain_changes`` in a tree whose deriver subscribes with ``batches``);
* ``subscriber``: the same, taken by the follower's subscription (``Subscriber``: its
  position, out-of-focus view and messages; one ``changes`` message per block with
  ``batches``);
* ``all``: and the follower's work: the aggregation of each change, the rows of every
  ``--flush-every`` changes (what one 5 ms write window holds at 35,000 changes/s; a
  ``changes`` message is split there, so both kinds of tree make the same rows).

Figures: CPU microseconds per change (the replay loop's process time, the median of
``--runs`` replays, each after one warm-up pass that the figures leave out); with
``--callgrind``, also instructions per change, counted by valgrind's callgrind (the same count
whatever else the machine does: a replay of no block is subtracted, so start-up cancels out).
Starts its own redis-server on a free port for each replay (the follower's subscription needs
one; the machine's 6379 is never used). Output: a table and a JSON file (``--json``)::

    .venv/bin/python scripts/bench_deriver.py --against /tmp/old --callgrind
    .venv/bin/python scripts/bench_deriver.py --n 2000 --runs 1   # a smoke run
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))  # benchlib, bench_views

from benchlib import machine_info, private_redis, write_json  # noqa: E402

STAGES = ("parse", "subscriber", "all")

REPLAY = r'''
import os, pickle, sys, tempfile, time
from pathlib import Path
from sow_redis.client import Sow
from sow_redis.model.events import parse_block
from sow_redis.ops.server import free_port, spawn_redis
import sow_redis.derive as derive
data = pickle.loads(Path(sys.argv[1]).read_bytes())
stage, count, passes = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
flush_every = data["flush_every"]
blocks = data["blocks"][:count]
folder = tempfile.mkdtemp(prefix="bench-deriver-")
port = free_port()
server = spawn_redis(port, Path(folder) / "redis", persist=False)
try:
    sow = Sow(f"redis://127.0.0.1:{port}/0")
    sow.apply_config(data["config"])
    follower = derive._ViewFollower(sow, sow.topic(data["view"]))
    follower.write = lambda rows, gone: None  # rows are made, not written
    while not follower.ready:
        follower.step(0.1)
    sub, start, times = follower.sub, list(follower.sub.pos), []
    # a tree whose subscription takes the blocks as they come (batches: plain_changes, one
    # message per block), or one that takes them decoded (parse_block)
    raw_blocks = hasattr(sub, "_live_message")
    batches = getattr(sub, "_batches", False)
    if batches:
        from sow_redis.model.events import plain_changes
        fields = getattr(sub, "_decode", None)  # a tree whose view decodes only its fields
        decode = ((lambda raw: plain_changes(raw) or parse_block(raw)) if fields is None else
                  (lambda raw: plain_changes(raw, fields) or parse_block(raw)))
    else:
        decode = parse_block
    for _ in range(passes):
        sub.pos = list(start)  # the same changes again, as new
        taken = 0
        t0 = time.process_time()
        for raw in blocks:
            if stage == "parse":
                decode(raw)
                continue
            if raw_blocks:
                sub._live_message(raw)
            else:
                sub._block(parse_block(raw))
            if stage == "subscriber":
                sub._ready.clear()
                continue
            while (msg := sub.get(0)) is not None:
                if batches and msg["kind"] == "changes":
                    changes, i = msg["changes"], 0  # flushed after the same changes as below
                    while i < len(changes):
                        k = min(len(changes) - i, flush_every - taken % flush_every)
                        follower.take(msg if k == len(changes) else
                                      {**msg, "changes": changes[i:i + k]})
                        taken, i = taken + k, i + k
                        if taken % flush_every == 0:
                            follower.flush()
                    continue
                follower.take(msg)
                taken += 1
                if taken % flush_every == 0:
                    follower.flush()
        follower.flush()
        times.append(time.process_time() - t0)
    if follower.writer is not None:
        follower.writer.close()
    print(derive.__file__)
    print(" ".join(f"{t:.6f}" for t in times))
finally:
    server.terminate()
    server.wait(timeout=15)
'''


def capture(n: int, nkeys: int, groups: int, partitions: int, flush_every: int,
            path: Path) -> tuple[int, dict[str, Any]]:
    """Publish ``n`` messages of bench_views into a topic with one view and keep the change
    blocks its channels carried (with the configuration) in ``path``; returns the number of
    blocks and the machine's description (``benchlib.machine_info``)."""
    import bench_views as bv

    from sow_redis import keys
    from sow_redis.client import Sow
    from sow_redis.feed.live import ShardListener
    from sow_redis.publish.append import append

    config = bv.topic_toml("t", partitions) + bv.views_toml("t", 1)
    with private_redis("bench-deriver-") as server:
        sow = Sow(server.url)
        sow.apply_config(config)
        machine = machine_info(sow.r)
        listener = ShardListener(sow.r, [keys.partition_channel("t", p)
                                         for p in range(partitions)])
        append(sow.r, sow.topic("t"), (("publish", m, None)
                                      for m in bv.make_messages(n, nkeys, groups)),
               jobs=bv.SETTINGS)
        blocks = []
        while (raw := listener.get(1.0)) is not None:
            blocks.append(raw)
        listener.close()
    path.write_bytes(pickle.dumps({"config": config, "view": "t_v1", "blocks": blocks,
                                   "flush_every": flush_every}))
    return len(blocks), machine


def replay(tree: Path, data: Path, stage: str, count: int, passes: int,
           callgrind: Path | None = None) -> list[float]:
    """Process seconds of each pass of one replay in a fresh process importing ``tree``'s
    sow_redis (under callgrind, its counts to ``callgrind``)."""
    cmd = [sys.executable, "-c", REPLAY, str(data), stage, str(count), str(passes)]
    if callgrind is not None:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={callgrind}", *cmd]
    env = dict(os.environ, PYTHONPATH=str(tree))
    # run in the tree: "python -c" puts the working folder first on the path
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, timeout=1800,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench_deriver: the replay failed ({tree}, {stage}):\n"
                         f"{proc.stderr.decode()[-2000:]}")
    module, times = proc.stdout.decode().splitlines()[-2:]
    if not Path(module).resolve().is_relative_to(tree):
        raise SystemExit(f"bench_deriver: the replay of {tree} imported {module}")
    return [float(x) for x in times.split()]


def instructions(path: Path) -> int:
    """The total instruction count of a callgrind output file."""
    for line in path.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"bench_deriver: no total in {path}")


def measure(tree: Path, data: Path, n: int, blocks: int, runs: int,
            callgrind: bool) -> dict[str, Any]:
    """Per stage: CPU µs per change (median of ``runs``; one warm-up pass first) and, with
    ``callgrind``, instructions per change."""
    out: dict[str, Any] = {"tree": str(tree)}
    for stage in STAGES:
        times = replay(tree, data, stage, blocks, runs + 1)[1:]
        out[f"{stage}_us"] = statistics.median(times) / n * 1e6
        out[f"{stage}_us_runs"] = [t / n * 1e6 for t in times]
    if callgrind:
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp) / "none.out"
            replay(tree, data, "all", 0, 1, base)
            for stage in STAGES:
                counted = Path(tmp) / f"{stage}.out"
                replay(tree, data, stage, blocks, 1, counted)
                out[f"{stage}_instructions"] = (instructions(counted) - instructions(base)) / n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=60_000, help="messages (changes) captured")
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--flush-every", type=int, default=175,
                    help="changes between two flushes of the follower's rows")
    ap.add_argument("--runs", type=int, default=3, help="timed passes of each replay")
    ap.add_argument("--against", metavar="DIR", help="another tree to measure as well")
    ap.add_argument("--callgrind", action="store_true",
                    help="also count instructions with valgrind (minutes per tree)")
    ap.add_argument("--json", default="bench-results/bench_deriver.json", help="output file")
    args = ap.parse_args()
    if args.callgrind and shutil.which("valgrind") is None:
        raise SystemExit("bench_deriver: --callgrind needs valgrind (apt-get install valgrind)")
    trees = [ROOT] + ([Path(args.against).resolve()] if args.against else [])
    for tree in trees:
        if not (tree / "sow_redis" / "derive.py").exists():
            raise SystemExit(f"bench_deriver: {tree} holds no sow_redis with a deriver")
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "blocks.pickle"
        t0 = time.monotonic()
        blocks, machine = capture(args.n, args.keys, args.groups, args.partitions,
                                  args.flush_every, data)
        print(f"captured {blocks} change blocks of {args.n} messages in "
              f"{time.monotonic() - t0:.1f} s")
        results = [measure(tree, data, args.n, blocks, args.runs, args.callgrind)
                   for tree in trees]
    load1 = os.getloadavg()[0]
    print(f"\nper change, medians of {args.runs} pass(es); load average {load0:.2f} at the "
          f"start, {load1:.2f} at the end")
    head = "tree".ljust(28) + "".join(f"{s + ' µs':>15}" for s in STAGES)
    if args.callgrind:
        head += "".join(f"{s + ' instr':>18}" for s in STAGES)
    print(head)
    for res in results:
        line = str(res["tree"])[-28:].ljust(28) + "".join(
            f"{res[f'{s}_us']:>15.2f}" for s in STAGES)
        if args.callgrind:
            line += "".join(f"{res[f'{s}_instructions']:>18,.0f}" for s in STAGES)
        print(line)
    out = write_json(args.json, {"benchmark": "bench_deriver", "machine": machine,
                                 "options": vars(args), "load_average": [load0, load1],
                                 "results": results})
    print(f"results: {out}")


if __name__ == "__main__":
    main()
