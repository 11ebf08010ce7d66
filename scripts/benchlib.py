"""Shared by the benchmark scripts: a private redis-server and the benchmark error.

Run the benchmarks as ``python scripts/bench_*.py`` (this folder is then on ``sys.path``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from sow_redis.server import free_port, spawn_redis


class BenchError(RuntimeError):
    """A benchmark cannot go on (setup failed, a check failed)."""


class RedisServer:
    """A private redis-server without persistence on a free port (``sow_redis.server``)."""

    def __init__(self, workdir: Path):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = spawn_redis(self.port, workdir / "redis", persist=False)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def proc_cpu_s(pid: int) -> float:
    """user + system CPU seconds of a live process (Linux /proc), 0.0 if unavailable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def redis_cpu_s(r: Any) -> float:
    """CPU seconds (user + system) redis-server has used, from ``INFO cpu``."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def write_json(path: str, result: dict[str, Any]) -> Path:
    """Write a benchmark's results as indented JSON (folders created); returns the path."""
    import orjson

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return out


def applied_counts(r: Any, t: Any) -> tuple[int, int, int]:
    """``(records, sum of the partitions' change sequences, error stream length)`` of a topic:
    after a run, records = distinct keys and the seq sum = messages applied exactly once."""
    from sow_redis import keys
    from sow_redis.status import error_count

    pipe = r.pipeline(transaction=False)
    for p in range(t.partitions):
        pipe.hlen(keys.records(t.name, p))
        pipe.hget(keys.state(t.name, p), "seq")
    res = pipe.execute()
    return sum(res[0::2]), sum(int(s or 0) for s in res[1::2]), error_count(r, t)
