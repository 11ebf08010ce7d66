"""The main job's check of a view against Spark SQL (scripts/main.sh).

Reads the rows of ``sow-redis spark sql`` (JSON Lines: ``carrier``, ``aircraft``,
``avg_dep_delay``) from a file, then polls ``sow-redis sow -t delay_by_carrier`` (the view the
deriver keeps; it follows the flights as they are applied) until both give the same rows
(averages compared to 9 decimals: Spark adds doubles, the view adds exactly), at most
``--timeout`` seconds. Prints both side by side; exit status 0 when equal, 1 otherwise.

Usage: ``python scripts/compare_view.py SPARK_ROWS_FILE [--timeout 120]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import orjson


def rows(text: str) -> dict[str, tuple[int, float | None]]:
    """carrier → (aircraft, average departure delay rounded to 9 decimals)."""
    out = {}
    for line in text.splitlines():
        r = orjson.loads(line)
        avg = r["avg_dep_delay"]
        out[r["carrier"]] = (r["aircraft"], None if avg is None else round(avg, 9))
    return out


def main() -> int:
    """Compare, print, and return the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spark_rows")
    ap.add_argument("--view", default="delay_by_carrier")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args()
    with open(args.spark_rows, encoding="utf-8") as fh:
        spark = rows(fh.read())
    deadline = time.monotonic() + args.timeout
    while True:
        view = rows(subprocess.run(["sow-redis", "sow", "-t", args.view], check=True,
                                   capture_output=True, text=True).stdout)
        if view == spark or time.monotonic() > deadline:
            break
        time.sleep(0.5)

    def show(x: float | None) -> str:
        return "null" if x is None else f"{x:.4f}"

    print(f"{'carrier':8} {'view: aircraft':>15} {'avg_dep_delay':>14}   "
          f"{'spark sql: aircraft':>20} {'avg_dep_delay':>14}")
    for c in sorted(set(view) | set(spark),
                    key=lambda c: -((spark.get(c) or (0, None))[1] or -1e9)):
        v, s = view.get(c, ("-", None)), spark.get(c, ("-", None))
        print(f"{c:8} {v[0]:>15} {show(v[1]):>14}   {s[0]:>20} {show(s[1]):>14}")
    print(f"{len(view)} carrier(s) in the view, {len(spark)} in Spark SQL: "
          + ("equal" if view == spark else "DIFFERENT"))
    return 0 if view == spark else 1


if __name__ == "__main__":
    sys.exit(main())
