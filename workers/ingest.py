"""Entry point for an ingest worker process (same as ``sow-redis worker``).

Usage: ``python workers/ingest.py [--burst] [--name PREFIX]``; settings from ``SOW_*`` env vars.
"""

from __future__ import annotations

import argparse

from sow_redis.ops.worker import run_worker
from sow_redis.settings import Settings

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--burst", action="store_true", help="drain every partition, then exit")
    ap.add_argument("--name", help="prefix of the worker name shown in rq-dashboard "
                    "(the name is <prefix>-<host>-<pid>-<random>, unique per start)")
    a = ap.parse_args()
    run_worker(Settings.from_env(), burst=a.burst, name=a.name)
