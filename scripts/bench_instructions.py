"""Instructions per message of the write path, counted with callgrind: the same count for the
same work whatever else the machine is doing (wall-clock ratios on the shared 2-core machine
move by 30 % from run to run; docs/benchmarks.md, "Ingest").

Each workload runs twice, at two sizes, so start-up and warm-up cancel out: instructions per
message = (count at ``--n`` − count at ``--n // 6``) / (the difference in messages).

  * ``redis write-through``: redis-server under callgrind while a publisher appends with
    write-through (``append(..., jobs=…)``; no worker running);
  * ``redis apply trusted``: redis-server under callgrind while entries appended without
    write-through are applied unread by ``drain_partition`` (minus the append alone);
  * ``publisher``: the Python process under callgrind appending with write-through;
  * ``worker verify``: the Python process under callgrind applying plain XADDs (each entry
    read, decoded and verified) with ``drain_partition``.

``--against PATH`` runs every workload also with another checkout of sow_redis first on
``PYTHONPATH`` (e.g. ``git worktree add --detach /tmp/old <rev>``), in the same run, and
prints both with their ratio. ``--topic-extra`` adds lines to the workload topic's definition
(its messages: ``id`` over 5,000 keys, so most publishes replace a record; ``v`` a growing
integer), e.g. ``'index = ["/v"]'`` (a range index) or ``'change_previous = true'``, and
``--workloads`` picks some of the four. Needs ``valgrind`` (Debian package).

    .venv/bin/python scripts/bench_instructions.py --against /tmp/old
    .venv/bin/python scripts/bench_instructions.py --workloads "redis write-through" \
        --topic-extra 'change_previous = true'
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKLOAD = r'''
import sys, time, uuid, orjson
from sow_redis.connection import connect
from sow_redis.config import parse_topics
from sow_redis.settings import Settings
from sow_redis import keys
try:  # this layout (issue 24) or a checkout from before it (--against)
    from sow_redis.registry import apply_topics
    from sow_redis.publish.append import append, prepare
    from sow_redis.apply.jobs import drain_partition
except ImportError:
    from sow_redis.config import apply_topics
    from sow_redis.publisher import append, prepare
    from sow_redis.jobs import drain_partition
kind, url, n, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[5]
import sow_redis
print(sow_redis.__file__)  # the tree measured (checked by the caller)
r = connect(url)
settings = Settings.from_env(redis_url=url)
msgs = [orjson.dumps({"id": i % 5000, "v": i, "pad": "x" * 150}) for i in range(n)]
t = parse_topics(f'[[topic]]\nname = "b{uuid.uuid4().hex[:6]}"\nkey = ["/id"]\n'
                 f'partitions = 8\n{extra}\n')[0]
apply_topics(r, [t])
items = (("publish", m, None) for m in msgs)
if kind in ("redis write-through", "publisher"):
    append(r, t, items, jobs=settings)
elif kind == "redis apply trusted":
    append(r, t, items)
    if sys.argv[4] == "apply":
        for p in range(8):
            while not drain_partition(r, t, p, settings, budget_s=600, linger_ms=0)[1]:
                pass
else:  # worker verify: plain XADDs, as a client without scripts writes them
    pipe = r.pipeline(transaction=False)
    for m in msgs:
        p, e = prepare(t, ("publish", m, None))
        pipe.xadd(keys.log(t.name, p), e)
    pipe.execute()
    if sys.argv[4] == "apply":
        for p in range(8):
            while not drain_partition(r, t, p, settings, budget_s=600, linger_ms=0)[1]:
                pass
'''


KINDS = ("redis write-through", "redis apply trusted", "publisher", "worker verify")
"""The workloads (see the module docstring)."""


def total(out_file: Path) -> int:
    """The PROGRAM TOTALS of a callgrind output file."""
    text = subprocess.run(["callgrind_annotate", str(out_file)], capture_output=True,
                          text=True, check=True).stdout
    line = next(x for x in text.splitlines() if "PROGRAM TOTALS" in x)
    return int(line.split()[0].replace(",", ""))


def free_port() -> int:
    sys.path.insert(0, str(ROOT))
    from sow_redis.ops.server import free_port as fp

    return fp()


def measure(kind: str, n: int, tree: str | None, work: Path, extra: str = "") -> int:
    """Instructions counted for one run of ``kind`` at ``n`` messages."""
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    out = work / f"cg.{abs(hash((kind, n, tree)))}.{time.monotonic_ns()}"
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server_cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                  "--appendonly", "no"]
    traced_server = kind.startswith("redis")
    if traced_server:
        server_cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                      *server_cmd]
    server = subprocess.Popen(server_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                             check=False).stdout.strip() != b"PONG":
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.2)
        phase = "apply" if n > 0 else "none"
        args = [sys.executable, "-c", WORKLOAD, kind, url, str(abs(n)), phase, extra]
        if not traced_server:
            args = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *args]
        # run in the scratch folder: ``python -c`` puts its working folder first on the
        # path, so from the project root this checkout's sow_redis would shadow ``tree``
        done = subprocess.run(args, env=env, cwd=work, check=True, capture_output=True,
                              text=True)
        used = Path(done.stdout.split()[0]).resolve().parent.parent
        wanted = Path(tree or ROOT).resolve()
        if used != wanted:
            raise RuntimeError(f"the workload imported sow_redis from {used}, not {wanted}")
    finally:
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"],
                       capture_output=True, check=False)
        server.wait(timeout=300)
    return total(out)


def per_message(kind: str, n: int, tree: str | None, work: Path, extra: str = "") -> float:
    """Instructions per message of ``kind`` on a topic with ``extra`` lines: the difference
    of two sizes (and, for the apply workloads, of appending alone), so start-up cancels
    out."""
    small = max(1, n // 6)

    def count(m: int) -> int:
        return measure(kind, m, tree, work, extra)

    if kind in ("redis apply trusted", "worker verify"):
        big, little = count(n) - count(-n), count(small) - count(-small)
    else:
        big, little = count(n), count(small)
    return (big - little) / (n - small)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--n", type=int, default=12000, help="messages per workload")
    ap.add_argument("--against", help="another checkout of sow_redis to compare with")
    ap.add_argument("--topic-extra", default="",
                    help="lines added to the workload topic's definition")
    ap.add_argument("--workloads", default=",".join(KINDS),
                    help="comma-separated, of: " + ", ".join(KINDS))
    ap.add_argument("--json", default="bench-results/bench_instructions.json")
    a = ap.parse_args(argv)
    kinds = [k.strip() for k in a.workloads.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds):
        print(f"error: --workloads: each of {', '.join(KINDS)}", file=sys.stderr)
        return 2
    if not shutil.which("valgrind"):
        print("error: valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 1
    trees = {"this tree": str(ROOT)} | ({"against": a.against} if a.against else {})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            row = {"workload": kind}
            for name, tree in trees.items():
                row[name] = per_message(kind, a.n, tree, Path(tmp), a.topic_extra)
            rows.append(row)
    head = f"{'workload':<22}" + "".join(f"{name:>14}" for name in trees) + (
        f"{'ratio':>8}" if a.against else "")
    topic = f", topic with {a.topic_extra!r}" if a.topic_extra else ""
    print(f"instructions per message, {a.n:,} messages{topic} (callgrind)\n{head}")
    for row in rows:
        line = f"{row['workload']:<22}" + "".join(f"{row[name]:>14,.0f}" for name in trees)
        if a.against:
            row["ratio"] = row["this tree"] / row["against"]
            line += f"{row['ratio']:>8.3f}"
        print(line)
    out = ROOT / a.json
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "bench_instructions", "n": a.n,
                               "against": a.against, "topic_extra": a.topic_extra,
                               "rows": rows}, indent=1))
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
