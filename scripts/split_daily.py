#!/usr/bin/env python3
"""Split the flights JSON Lines (scripts/export_flights.py) into one file per day, for the
streaming demo (`sow-redis spark stream -t flights_daily DIR`, README "Spark pipeline").

Usage: python scripts/split_daily.py FLIGHTS_JSONL OUT_DIR

Writes OUT_DIR/YYYY-MM-DD.jsonl for every day (the lines of that day in input order, byte for
byte), replacing files of the same names; prints the number of days and lines. A line without
year, month and day is reported and left out (one line on stderr, exit status 1 at the end).

Spark's file source takes new files in the order of their modification times, and files
written within one second may share one: the files get modification times one second apart,
in day order (the last one now), so a stream reads the days in order.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import orjson


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[3], file=sys.stderr)
        return 2
    src, out = Path(argv[1]), Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    days: dict[str, list[bytes]] = {}
    bad = 0
    with open(src, "rb") as fh:
        for n, line in enumerate(fh, 1):
            try:
                row = orjson.loads(line)
                day = f"{row['year']:04d}-{row['month']:02d}-{row['day']:02d}"
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                print(f"{src}:{n}: no year/month/day ({type(exc).__name__}); left out",
                      file=sys.stderr)
                bad += 1
                continue
            days.setdefault(day, []).append(line if line.endswith(b"\n") else line + b"\n")
    now = time.time()
    for i, day in enumerate(sorted(days)):
        path = out / f"{day}.jsonl"
        path.write_bytes(b"".join(days[day]))
        stamp = now - (len(days) - 1 - i)
        os.utime(path, (stamp, stamp))
    print(f"split {sum(len(v) for v in days.values()):,} line(s) of {src} into {len(days)} "
          f"daily file(s) in {out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
