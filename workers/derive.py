"""Entry point for a deriver process (same as ``sow-redis derive``): keeps every view and
conflated topic from its underlying topic (:mod:`sow_redis.derive`).

Usage: ``python workers/derive.py [--burst] [--nice N]``; settings from ``SOW_*`` env vars.
"""

from __future__ import annotations

import argparse

from sow_redis.client import Sow
from sow_redis.derive import Deriver
from sow_redis.ops.priority import lower_priority
from sow_redis.settings import Settings

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--burst", action="store_true",
                    help="make every derived topic whole now, then exit")
    ap.add_argument("--nice", type=int, default=0, choices=range(20), metavar="0-19",
                    help="run at this much lower CPU priority (default 0; as sow-redis derive)")
    a = ap.parse_args()
    deriver = Deriver(Sow(settings=Settings.from_env()))
    if a.burst:
        print("derived:", ", ".join(deriver.burst()) or "nothing")
    else:
        lower_priority(a.nice)
        deriver.run()
