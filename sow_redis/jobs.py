"""Per-partition ingest jobs on rq (ARCHITECTURE §3).

At most one job per partition is outstanding: a marker key ``{sow:T:p}:job`` (SET NX PX) is
set when a job is enqueued and removed when the job finds the partition drained. A job takes
the partition lease (fencing token), applies batches for up to ``job_budget_s`` seconds, then
re-enqueues itself while the log has more. Publishers enqueue on publish; every worker also
sweeps all partitions every ``sweep_interval_s`` seconds, so entries written by any Redis
client, or left by a dead worker, are picked up.

Jobs are JSON-serialized and only sow_redis's own job functions run (:mod:`sow_redis.safejob`).
A sweep also takes back what a dead job left behind (a lease and a marker), so a partition
moves on within one sweep instead of after ``lease_ms`` / ``marker_ttl_ms``: the lease of a
process of this host that no longer runs, and this process's own lease when no job of this
process works on the partition (its job died on a lost Redis connection). ``recover=True``
(after an outage) also drops the marker of every lagging partition that no one leases, since
the job it stands for may have been lost with the connection.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import cast

from . import keys
from .apply import PartitionApplier
from .config import TopicCache, TopicConfig
from .connection import Client
from .errors import FencedError, UnknownTopicError
from .logs import fields
from .partition_state import read_cursor
from .scripts import Scripts, attached
from .settings import QUEUE_NAME, Settings
from .streamids import ZERO, parse

log = logging.getLogger(__name__)

JOB_FUNC = "sow_redis.jobs.ingest_job"
JOB_TIMEOUT_S = 600
"""rq job timeout in seconds (a job normally returns after ``job_budget_s``)."""

HOST = socket.gethostname()
OWNER = f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
"""This process's lease owner id: ``<host>:<pid>:<random>``."""

_active: set[tuple[str, int]] = set()
"""Partitions an ingest job of this process is working on (under ``_active_lock``)."""
_active_lock = threading.Lock()

QUEUE_KEY = f"rq:queue:{QUEUE_NAME}"
"""The Redis list of rq's ``sow`` queue (rq's key layout: ``rq:queue:<name>``)."""


def _tools(r: Client) -> tuple[Scripts, TopicCache]:
    """The scripts and registry cache of client ``r`` (made once per client)."""
    return attached(r, "tools", lambda c: (Scripts(c), TopicCache(c)))


def enqueue_job(r: Client, topic: str, p: int) -> None:
    """Enqueue an ingest job of partition ``p`` (the caller set its job marker)."""
    from rq import Queue

    from .safejob import SERIALIZER

    Queue(QUEUE_NAME, connection=r, serializer=SERIALIZER).enqueue(
        JOB_FUNC, topic, p, result_ttl=0, failure_ttl=86400, job_timeout=JOB_TIMEOUT_S,
        description=f"ingest {topic}[{p}]",
    )


def ensure_jobs(r: Client, topic: str, partitions: list[int], settings: Settings) -> int:
    """Enqueue an ingest job for each partition that has none outstanding.

    Returns:
        The number of jobs enqueued.
    """
    pipe = r.pipeline(transaction=False)
    for p in partitions:
        pipe.set(keys.job_marker(topic, p), OWNER, nx=True, px=settings.marker_ttl_ms)
    n = 0
    for p, ok in zip(partitions, pipe.execute()):
        if ok:
            enqueue_job(r, topic, p)
            n += 1
    return n


def lagging_partitions(r: Client, topic: TopicConfig) -> list[int]:
    """Partitions whose log has entries after the applied cursor."""
    pipe = r.pipeline(transaction=False)
    for p in range(topic.partitions):
        pipe.xrevrange(keys.log(topic.name, p), count=1)
        pipe.hget(keys.state(topic.name, p), "cursor")
    res = pipe.execute()
    out = []
    for p in range(topic.partitions):
        last, cursor = res[2 * p], res[2 * p + 1]
        if last and parse(last[0][0]) > parse(cursor or ZERO):
            out.append(p)
    return out


def unapplied_partitions(r: Client) -> dict[str, list[int]]:
    """Topic → partitions whose log has entries after the applied cursor (topics without
    lag are left out)."""
    _scripts, cache = _tools(r)
    out = {}
    for name, topic in sorted(cache.all().items()):
        lag = lagging_partitions(r, topic)
        if lag:
            out[name] = lag
    return out


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists and is not a zombie (Linux ``/proc``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def owner_dead(owner: str) -> bool:
    """Whether lease owner id ``owner`` (``<host>:<pid>:<random>``) is a process of this host
    that no longer runs. Owners on other hosts are never declared dead here: their leases
    lapse after ``lease_ms``."""
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != HOST:
        return False
    try:
        pid = int(parts[1])
    except ValueError:
        return False
    return pid != os.getpid() and not pid_alive(pid)


def reclaim(r: Client, topic: str, partitions: list[int], recover: bool = False) -> list[int]:
    """Release the leases of ``partitions`` left by dead jobs (see the module docstring) and
    drop their job markers, so the next :func:`ensure_jobs` enqueues a fresh job.

    Returns:
        The partitions whose marker was dropped.
    """
    scripts, _cache = _tools(r)
    owners = cast("list[bytes | None]", r.mget([keys.lease(topic, p) for p in partitions]))
    stale = []
    for p, raw in zip(partitions, owners):
        if raw is None:
            if recover:
                stale.append(p)
            continue
        owner = raw.decode()
        if owner == OWNER:
            with _active_lock:  # an ingest job of ours marks a partition before leasing it
                if (topic, p) in _active:
                    continue
                scripts.lease_release(keys.lease(topic, p), owner)
        elif owner_dead(owner):
            scripts.lease_release(keys.lease(topic, p), owner)
        else:
            continue
        log.warning("%s[%d]: released the lease of dead job %s", topic, p, owner)
        stale.append(p)
    if stale:
        r.delete(*[keys.job_marker(topic, p) for p in stale])
    return stale


def sweep(r: Client, settings: Settings, recover: bool = False) -> int:
    """Enqueue jobs for every lagging partition of every topic, after :func:`reclaim`.

    Returns:
        The number of jobs enqueued.
    """
    _scripts, cache = _tools(r)
    n = 0
    for topic in cache.all().values():
        lag = lagging_partitions(r, topic)
        if lag:
            reclaim(r, topic.name, lag, recover)
            n += ensure_jobs(r, topic.name, lag, settings)
    return n


LINGER_SLICE_MS = 5
"""A lingering job blocks on its partition's log for at most this many milliseconds at a time,
then looks at the queue: a job of another partition waiting there ends the linger."""


GATHER_S = 0.003
GATHER_MIN = 8
"""After an apply call that took at least ``GATHER_MIN`` entries but less than a quarter of
a batch (a live publisher, the log drained as fast as it fills), a job waits ``GATHER_S``
seconds so the next call takes a larger batch: fewer, larger calls leave Redis and the
cores to the publisher (docs/benchmarks.md). A trickle (fewer entries per call) is applied
at once, without the wait."""


def _linger(r: Client, log_key: str, cursor: str, wait_ms: int, watch_queue: bool) -> bool:
    """Wait up to ``wait_ms`` milliseconds for an entry after ``cursor`` in ``log_key``.

    Returns:
        True when an entry arrived; False when the time ran out or (``watch_queue``) another
        partition's job waits in the queue, where this worker is needed more.
    """
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        if watch_queue and r.llen(QUEUE_KEY):
            return False
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            return False
        if r.xread({log_key: cursor}, count=1, block=min(left_ms, LINGER_SLICE_MS)):
            return True


def drain_partition(r: Client, topic: TopicConfig, p: int, settings: Settings,
                    budget_s: float | None = None, owner: str = OWNER,
                    linger_ms: int | None = None) -> tuple[int, bool]:
    """Apply partition ``p`` under its lease for up to ``budget_s`` seconds (default
    ``job_budget_s``), waiting up to ``linger_ms`` (default ``settings.linger_ms``) for new
    entries once drained.

    Returns:
        ``(entries consumed, drained)``; ``drained`` is False when the budget ran out or the
        lease belongs to another worker.
    """
    scripts = _tools(r)[0]
    lease_key, state_key = keys.lease(topic.name, p), keys.state(topic.name, p)
    fence = scripts.lease_acquire(lease_key, state_key, owner, settings.lease_ms)
    if fence is None:
        return 0, False
    log.debug("lease taken", extra=fields("lease_taken", topic=topic.name, partition=p,
                                           fence=fence))
    done = 0
    now = time.monotonic()
    deadline = now + (settings.job_budget_s if budget_s is None else budget_s)
    renew_every = settings.lease_ms / 3000  # seconds
    renewed = now
    drained = False
    applier = PartitionApplier(r, scripts, topic, p, fence, settings.batch_size)
    try:
        while True:
            n = applier.step()
            done += n
            if GATHER_MIN <= n < settings.batch_size // 4:
                time.sleep(GATHER_S)  # let a live publisher's entries gather (see GATHER_S)
            now = time.monotonic()
            if applier.drained:
                # drained (nothing in flight): linger briefly for more; a live publisher
                # keeps one job busy instead of paying for a new rq job per burst. Not while
                # other partitions' jobs wait in the queue: this worker is needed there.
                wait_ms = min(settings.linger_ms if linger_ms is None else linger_ms,
                              int((deadline - now) * 1000))
                cursor = applier.cursor
                if cursor is None or not _linger(r, keys.log(topic.name, p), cursor, wait_ms,
                                                 watch_queue=linger_ms is None):
                    drained = True
                    break
                continue
            if now >= deadline:
                break
            if now - renewed >= renew_every:
                if scripts.lease_acquire(lease_key, state_key, owner, settings.lease_ms) != fence:
                    raise FencedError(f"lost the lease of {topic.name}[{p}]")
                renewed = now
        done += applier.finish()
        _trim(r, topic, p, settings)
    finally:
        try:
            applier.finish()  # never leave a call unread (no-op after the finish above)
        except Exception as exc:  # the first error is the one raised
            log.warning("%s[%d]: finishing the batch in flight failed: %s", topic.name, p, exc)
        finally:
            scripts.lease_release(lease_key, owner)
    return done, drained


def _trim(r: Client, topic: TopicConfig, p: int, settings: Settings) -> None:
    """Drop applied log entries once the stream is longer than ``log_max_len``."""
    log_key = keys.log(topic.name, p)
    if r.xlen(log_key) > settings.log_max_len:
        # LIMIT 0: no cap on the entries one call removes (Redis caps "~" trims otherwise)
        r.xtrim(log_key, minid=read_cursor(r, topic.name, p), approximate=True, limit=0)


def ingest_job(topic: str, partition: int) -> int:
    """rq job: apply one partition for a bounded time, then re-enqueue or retire.

    Returns:
        Log entries consumed by this job.
    """
    from rq import get_current_job

    job = get_current_job()
    assert job is not None
    r = job.connection
    settings = Settings.from_env()
    _scripts, cache = _tools(r)
    try:
        t = cache.get(topic)
    except UnknownTopicError:
        r.delete(keys.job_marker(topic, partition))
        log.warning("topic %s no longer defined; job dropped", topic)
        return 0
    marker = keys.job_marker(topic, partition)
    r.pexpire(marker, settings.marker_ttl_ms)
    with _active_lock:
        _active.add((topic, partition))
    try:
        done, drained = drain_partition(r, t, partition, settings)
    except FencedError:
        log.warning("%s[%d]: lease taken over by another worker", topic, partition,
                    extra=fields("lease_lost", topic=topic, partition=partition))
        return 0
    finally:
        with _active_lock:
            _active.discard((topic, partition))
    if done == 0 and not drained:
        # another worker holds the lease: it re-enqueues or retires the partition itself
        return 0
    if drained and done and r.llen(QUEUE_KEY):
        # left its partition for the jobs waiting in the queue while entries kept coming:
        # come back after them (keeping the marker spares a live publisher the enqueue)
        r.pexpire(marker, settings.marker_ttl_ms)
        enqueue_job(r, topic, partition)
    elif drained:
        r.delete(marker)
        # entries appended after our last read but before the marker went away
        if partition in lagging_partitions(r, t):
            ensure_jobs(r, topic, [partition], settings)
    else:
        r.pexpire(marker, settings.marker_ttl_ms)
        enqueue_job(r, topic, partition)
    return done
