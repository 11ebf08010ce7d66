#!/usr/bin/env python3
"""Summarise a py-spy ``--format raw`` (collapsed stacks) profile: self and inclusive shares.

Each line of the input is ``frame;frame;…;leaf count`` with frames ``function (file:line)``
(``py-spy record -f raw``; with ``--threads`` the first frame names the thread). Samples are
counted at py-spy's rate (default 100 per second), so shares are of wall time when the
profile was taken with ``--idle`` (waiting on a socket counts) and of CPU time otherwise.

Options select the stacks that contain a frame of function ``--root`` (e.g. ``run_apply``,
``perform_job``), print the leaf functions with the most samples (self time) and the
inclusive share of every function name given with ``--names`` (counted once per stack).
With ``--per N --rate R`` (py-spy's ``-r``, default 100) samples are also shown as µs per
message: count / R / N × 1e6 (wall time with ``--idle``).

Example::

    .venv/bin/python scripts/pyspy_summary.py bench-results/pyspy_worker.txt \\
        --root perform_job --names read_log,_plan_entry,parse,_call --rate 200 --per 200000
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def func_of(frame: str) -> str:
    m = FRAME.match(frame)
    return m.group("func") if m else frame


def matches(func: str, name: str) -> bool:
    """``name`` is the function or its last dotted part (``xadd`` for
    ``StreamCommands.xadd``, ``check`` for ``append.<locals>.check``)."""
    return func == name or func.endswith("." + name)


def short(frame: str) -> str:
    """``function (file:line)`` with the file cut after site-packages/ or the project root."""
    m = FRAME.match(frame)
    if not m:
        return frame
    f = m.group("file")
    for cut in ("site-packages/", "sow_redis/", "scripts/", "lib/python3.11/"):
        if cut in f:
            f = (cut if cut.startswith("sow_") else "") + f.split(cut, 1)[1]
            break
    return f"{m.group('func')} ({f})"


def load(path: str) -> list[tuple[list[str], int]]:
    out = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, count = line.rpartition(" ")
            out.append((stack.split(";"), int(count)))
    return out


def summarise(stacks: list[tuple[list[str], int]], root: str | None, names: list[str],
              top: int) -> dict:
    sel = [(s, c) for s, c in stacks if root is None or any(matches(func_of(f), root)
                                                             for f in s)]
    total = sum(c for _s, c in sel)
    leaf: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for s, c in sel:
        leaf[short(s[-1])] += c
        funcs = {func_of(f) for f in s}
        for name in names:  # "xadd" matches "StreamCommands.xadd" and "append.<locals>.xadd"
            if any(matches(f, name) for f in funcs):
                incl[name] += c
    return {"samples": total,
            "top_self": [(k, v) for k, v in leaf.most_common(top)],
            "inclusive": [(n, incl[n]) for n in names]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="py-spy raw profiles (summed)")
    ap.add_argument("--root", help="only stacks with a frame of this function")
    ap.add_argument("--names", default="", help="comma-separated function names (inclusive)")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--per", type=int, help="messages, for µs per message")
    ap.add_argument("--rate", type=float, default=100.0, help="py-spy samples per second")
    a = ap.parse_args(argv)
    stacks = [x for f in a.files for x in load(f)]
    res = summarise(stacks, a.root, [n for n in a.names.split(",") if n], a.top)
    total = res["samples"] or 1
    scale = 1e6 / a.rate / a.per if a.per else None

    def fmt(k: str, v: int) -> str:
        us = f"{v * scale:7.3f} µs/msg " if scale else ""
        return f"  {us}{100 * v / total:5.1f} %  {v:6d}  {k}"

    print(f"{res['samples']} samples" + (f" under {a.root}" if a.root else ""))
    print("self (leaf):")
    for k, v in res["top_self"]:
        print(fmt(k, v))
    if res["inclusive"]:
        print("inclusive:")
        for k, v in res["inclusive"]:
            print(fmt(k, v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
