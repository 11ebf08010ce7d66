"""Shared by the benchmark scripts: a private redis-server, the machine's description and the
benchmark error.

Run the benchmarks as ``python scripts/bench_*.py`` (this folder is then on ``sys.path``).
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sow_redis.ops.server import spawn_redis_on_free_port

ROOT = Path(__file__).resolve().parent.parent


class BenchError(RuntimeError):
    """A benchmark cannot go on (setup failed, a check failed)."""


class RedisServer:
    """A private redis-server without persistence on a free port (``sow_redis.ops.server``); its
    files go to ``workdir / "redis"``, the rest of ``workdir`` is the benchmark's to use.

    Raises ``SowError`` if redis-server is missing or does not start."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port, self.proc = spawn_redis_on_free_port(workdir / "redis", persist=False)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def private_redis(prefix: str) -> Iterator[RedisServer]:
    """A :class:`RedisServer` in a new temporary folder named ``<prefix>…`` (its ``workdir``).

    On leaving the block, normally or by any exception (``BenchError``, ``KeyboardInterrupt``
    …), the server is stopped (SIGTERM, SIGKILL after 15 s) and the folder removed; the
    exception then goes on. Raises ``SowError`` if the server cannot start (folder removed)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    server: RedisServer | None = None
    try:
        server = RedisServer(tmp)
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def machine_info(r: Any) -> dict[str, Any]:
    """The ``"machine"`` entry of a benchmark's JSON: ``{"cpu_count": int, "redis_server":
    version string from INFO server, "python": "3.x.y", "platform": platform.platform()}``."""
    return {"cpu_count": os.cpu_count(), "redis_server": r.info("server")["redis_version"],
            "python": platform.python_version(), "platform": platform.platform()}


def _cpu_ticks(pid: int | str, children: bool = False) -> int | None:
    """user + system clock ticks of a live process from /proc/<pid>/stat (``children``: with
    those of the finished children it waited for); None if unavailable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return sum(int(x) for x in fields[11:15 if children else 13])
    except (OSError, IndexError, ValueError):
        return None


def proc_cpu_s(pid: int) -> float:
    """user + system CPU seconds of a live process (Linux /proc), 0.0 if unavailable."""
    return (_cpu_ticks(pid) or 0) / os.sysconf("SC_CLK_TCK")


def machine_cpu_s() -> float:
    """CPU seconds every core of the machine has been busy (user, nice, system, irq, softirq,
    steal from /proc/stat): the difference over a run is the CPU all its processes used
    (and whatever else ran meanwhile); 0.0 if unavailable."""
    try:
        with open("/proc/stat", "rb") as fh:
            fields = fh.readline().split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


PROCESS_GROUPS = (("pyspark.daemon", "spark python workers"), ("java", "spark JVM"),
                  ("redis-server", "redis-server"), (" worker", "sow-redis workers"))


def _own_pids() -> set[int]:
    """This process and its descendants (from the parent pid of every /proc entry)."""
    parent: dict[int, int] = {}
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    parent[int(pid)] = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    mine = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, pp in parent.items():
            if pp in mine and pid not in mine:
                mine.add(pid)
                grew = True
    return mine


def cpu_by_group(own: bool = False) -> dict[str, float]:
    """CPU seconds (user + system, with the finished children each process waited for) of
    every live process, summed by group: the first of ``PROCESS_GROUPS`` whose text is in its
    command line, ``"benchmark"`` for this process (a publisher it ran and waited for
    included), ``"other"`` for the rest. ``own``: only this process and its descendants (the
    servers, workers, JVMs … it started), so other users of a shared machine are not counted.
    The difference of two calls splits a run's CPU by process kind; Linux /proc only (empty
    elsewhere)."""
    tck = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    out: dict[str, float] = {}
    pids = (sorted(_own_pids()) if own else
            [int(p) for p in (os.listdir("/proc") if os.path.isdir("/proc") else [])
             if p.isdigit()])
    for pid in pids:
        ticks = _cpu_ticks(pid, children=True)
        if ticks is None:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        group = "benchmark" if pid == me else next(
            (name for text, name in PROCESS_GROUPS if text in cmd), "other")
        out[group] = out.get(group, 0.0) + ticks / tck
    return out


def cpu_by_group_since(before: dict[str, float], own: bool = False) -> dict[str, float]:
    """:func:`cpu_by_group` now less ``before``, groups that used under 0.01 s left out."""
    now = cpu_by_group(own)
    diff = {g: round(now.get(g, 0.0) - before.get(g, 0.0), 2) for g in now.keys() | before}
    return dict(sorted(((g, v) for g, v in diff.items() if v >= 0.01), key=lambda x: -x[1]))


@contextmanager
def apply_calls() -> Iterator[list[tuple[tuple[Any, ...], bytes]]]:
    """Records the apply.lua calls sow_redis's publisher sends within the block: per call, the
    arguments of ``WriteThrough.packed`` (topic, partition, entries, marker lifetime in ms,
    job id, write-through) and the RESP command it packed from them."""
    from sow_redis.publish import through

    seen: list[tuple[tuple[Any, ...], bytes]] = []
    packed = through.WriteThrough.packed

    def spy(self: through.WriteThrough, *args: Any) -> bytes:
        out = packed(self, *args)
        seen.append((args, out))
        return out

    through.WriteThrough.packed = spy  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        through.WriteThrough.packed = packed  # type: ignore[method-assign]


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
    from sow_redis.ops.status import error_count

    pipe = r.pipeline(transaction=False)
    for p in range(t.partitions):
        pipe.hlen(keys.records(t.name, p))
        pipe.hget(keys.state(t.name, p), "seq")
    res = pipe.execute()
    return sum(res[0::2]), sum(int(s or 0) for s in res[1::2]), error_count(r, t)


class Workers:
    """W ``python -m sow_redis.cli worker`` processes (not burst), logging to ``logdir``;
    ``env``: more environment variables for them (e.g. ``SOW_BATCH_SIZE``)."""

    def __init__(self, url: str, count: int, logdir: Path, env: dict[str, str] | None = None):
        self.url, self.count, self.logdir = url, count, logdir
        self.env = dict(os.environ, SOW_REDIS_URL=url, **(env or {}))
        self.names = [f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}-{i}" for i in range(count)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self) -> None:
        for name in self.names:
            log = self.logdir / f"{name}.log"
            self.logs.append(log)
            with open(log, "wb") as fh:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "sow_redis.cli", "worker", "--name", name],
                    env=self.env, cwd=str(ROOT), stdout=fh, stderr=subprocess.STDOUT,
                    start_new_session=True))

    def _check_alive(self) -> None:
        for p, log in zip(self.procs, self.logs):
            if p.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:]
                raise BenchError(f"worker exited with {p.returncode}:\n{tail}")

    def wait_registered(self, r: Any, timeout_s: float = 60.0) -> None:
        from rq import Worker

        # --name is a prefix: rq lists each worker as <name>-<host>-<pid>-<random>
        deadline = time.monotonic() + timeout_s
        while True:
            have = [w.name for w in Worker.all(connection=r)]
            if all(any(h.startswith(n + "-") for h in have) for n in self.names):
                return
            self._check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"workers not registered in rq after {timeout_s:g} s")
            time.sleep(0.005)

    def cpu_s(self) -> float:
        return sum(proc_cpu_s(p.pid) for p in self.procs if p.poll() is None)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
