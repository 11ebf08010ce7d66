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

import functools
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import cast

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import keys
from .apply import PartitionApplier
from .config import TopicCache, TopicConfig
from .connection import Client, control_of, data_of, is_cluster
from .errors import FencedError, UnknownTopicError
from .logs import fields
from .partition_state import count_pending, read_cursor
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


def get_many(r: Client, names: list[str]) -> list[bytes | None]:
    """``GET`` of each key (one round trip; on a cluster, one per node): what ``MGET`` does
    on one server, without its same-slot rule."""
    if not is_cluster(r):
        return cast("list[bytes | None]", r.mget(names))
    pipe = r.pipeline(transaction=False)
    for name in names:
        pipe.get(name)
    return cast("list[bytes | None]", pipe.execute())


BEHIND_COUNT_MAX = 1_000
"""Unapplied log entries counted for a job's description at most (shown as ``1,000+``)."""


def enqueue_job(r: Client, topic: str, p: int, behind: int | None = None) -> None:
    """Enqueue an ingest job of partition ``p`` on the control Redis of data client ``r``
    (:func:`sow_redis.connection.control_of`; the caller set its job marker). Its
    description, shown by rq-dashboard, is ``ingest <topic>[<p>] (N entries behind)``:
    ``behind`` when the caller knows the backlog (log entries not applied yet, at least),
    else counted here (at most :data:`BEHIND_COUNT_MAX`, then ``1,000+``; no count when
    the ACL user may not read the log)."""
    from rq import Queue

    from .safejob import SERIALIZER

    shown = f"{behind:,}" if behind is not None else None
    if behind is None:
        try:
            behind = count_pending(r, topic, p, BEHIND_COUNT_MAX)
            shown = f"{behind:,}" + ("+" if behind >= BEHIND_COUNT_MAX else "")
        except NoPermissionError:  # a publisher's ACL user may not read the log
            pass
    Queue(QUEUE_NAME, connection=control_of(r), serializer=SERIALIZER).enqueue(
        JOB_FUNC, topic, p, result_ttl=0, failure_ttl=86400, job_timeout=JOB_TIMEOUT_S,
        description=f"ingest {topic}[{p}]" + (
            "" if shown is None else f" ({shown} entr{'y' if behind == 1 else 'ies'} behind)"),
    )


def ensure_jobs(r: Client, topic: str, partitions: list[int], settings: Settings,
                behind: Mapping[int, int] | None = None) -> int:
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
            enqueue_job(r, topic, p, behind=behind.get(p) if behind else None)
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
    owners = get_many(r, [keys.lease(topic, p) for p in partitions])
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
"""A lingering job blocks on its partitions' logs for at most this many milliseconds at a
time, then looks at the queue: a job of another topic's partition waiting there ends the
linger."""

GATHER_S = 0.003
GATHER_MIN = 32
"""After a round of apply calls that took at least ``GATHER_MIN`` entries but less than a
quarter of a batch (a live publisher, the logs drained as fast as they fill), a job waits
``GATHER_S`` seconds so the next calls take larger batches: fewer, larger calls leave Redis
and the cores to the publisher (docs/benchmarks.md). A trickle (fewer entries per round) is
applied at once, without the wait."""

ADOPT_EVERY_S = 0.25
"""Seconds between two looks for free partitions of the job's topic to adopt."""


def _linger(r: Client, logs: Mapping[str, str | None], wait_ms: int,
            needed: Callable[[], str | None] | None) -> str | None:
    """Wait up to ``wait_ms`` milliseconds for an entry after the cursor of any of ``logs``
    (log key → cursor; one blocking XREAD on all of them), in slices of
    :data:`LINGER_SLICE_MS`; ``needed()`` is asked before each slice.

    Returns:
        ``"entry"`` when an entry arrived, what ``needed()`` returned when it returned
        something (see :func:`_queued_work`), None when the time ran out.
    """
    deadline = time.monotonic() + wait_ms / 1000
    streams: dict[str, str] = {k: v for k, v in logs.items() if v is not None}
    # on a cluster one XREAD cannot name logs of several slots: look at each, then sleep
    polled = is_cluster(r) and len(streams) > 1
    while True:
        if needed is not None:
            why = needed()
            if why is not None:
                return why
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            return None
        if polled:
            pipe = r.pipeline(transaction=False)
            for k, v in streams.items():
                pipe.xread({k: v}, count=1)
            if any(pipe.execute()):
                return "entry"
            time.sleep(min(left_ms, LINGER_SLICE_MS) / 1000)
        elif r.xread(streams, count=1, block=min(left_ms, LINGER_SLICE_MS)):  # type: ignore[arg-type]
            return "entry"


QUEUE_PEEK = 100
"""Queued jobs looked at to decide whether a worker is needed elsewhere."""

_DESCRIPTION = re.compile(rb"^ingest (.+)\[(\d+)\](?: \([\d,]+\+? entr(?:y|ies) behind\))?$")


def _queued_work(r: Client, topic: str, can_adopt: bool) -> str | None:
    """What the queued jobs ask of a job serving a share of ``topic`` (``can_adopt``: it
    holds fewer partitions than its share). Looks at the first :data:`QUEUE_PEEK` queued
    jobs, by their description ``ingest <topic>[<p>]`` (the queue on the control Redis, the
    leases on the data Redis ``r``); a job whose partition's lease is held ends at once when run, so it needs no one.

    Returns:
        ``"elsewhere"`` when a job of another topic (or not an ingest job) needs a worker;
        else ``"adopt"`` when free partitions of ``topic`` wait and ``can_adopt`` (the
        caller takes them rather than ending so that new jobs take them one by one); else
        None (free partitions of ``topic`` beyond this job's share are left to an idle
        worker).
    """
    control = control_of(r)
    ids = cast("list[bytes]", control.lrange(QUEUE_KEY, 0, QUEUE_PEEK - 1))
    if not ids:
        return None
    pipe = control.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(b"rq:job:" + job_id, "description")
    queued: list[tuple[str, int]] = []
    for desc in pipe.execute():
        m = _DESCRIPTION.match(desc or b"")
        if m is None:
            log.debug("queued job %r needs a worker", desc)
            return "elsewhere"  # not an ingest job: run it
        queued.append((m.group(1).decode(), int(m.group(2))))
    owners = get_many(r, [keys.lease(t, q) for t, q in queued])
    free = {tq for tq, owner in zip(queued, owners) if owner is None}
    if not free:
        return None
    log.debug("queued jobs of free partitions %s", sorted(free))
    if any(t != topic for t, _q in free):
        return "elsewhere"
    return "adopt" if can_adopt else None


def _queue_waits(r: Client) -> str | None:
    """``"elsewhere"`` when any job is queued (for a job that serves one partition)."""
    return "elsewhere" if control_of(r).llen(QUEUE_KEY) else None


def _workers(r: Client) -> int:
    """Registered rq workers of the ``sow`` queue (at least 1), on the control Redis of
    data client ``r``."""
    return max(1, control_of(r).scard(f"rq:workers:{QUEUE_NAME}"))


class _Held:
    """One partition a job holds: its fencing token and its applier."""

    def __init__(self, r: Client, scripts: Scripts, topic: TopicConfig, p: int, fence: int,
                 settings: Settings):
        self.p, self.fence = p, fence
        self.applier = PartitionApplier(r, scripts, topic, p, fence, settings.batch_size)
        self.done = 0


def drain_partitions(r: Client, topic: TopicConfig, p: int, settings: Settings,
                     budget_s: float | None = None, owner: str = OWNER,
                     linger_ms: int | None = None, adopt: bool = False
                     ) -> dict[int, tuple[int, bool]]:
    """Apply partition ``p`` of ``topic`` (and, with ``adopt``, free partitions of the same
    topic up to a fair share: partitions / registered workers) under their leases, for up to
    ``budget_s`` seconds (default ``job_budget_s``), waiting up to ``linger_ms`` (default
    ``settings.linger_ms``) for new entries once all are drained, on all of them at once.

    One job serving several partitions applies each new entry as it comes, instead of
    handing the worker from one partition's rq job to the next (which costs milliseconds of
    latency per hand-over; docs/benchmarks.md, "Subscriber latency").

    Returns:
        partition → ``(entries consumed, drained)`` of each partition served (with ``adopt``
        ``p`` may be left out: another worker holds it, and the job served free ones);
        ``{p: (0, False)}`` when ``p``'s lease belongs to another worker and (``adopt``) no
        partition of the topic was free. ``drained`` is False when the budget ran out.

    Raises:
        FencedError: a held lease was taken over (the others are released).
    """
    scripts = _tools(r)[0]
    held: dict[int, _Held] = {}

    def take(q: int) -> bool:
        with _active_lock:  # marked before leasing: the sweeper leaves our leases alone
            _active.add((topic.name, q))
        fence = scripts.lease_acquire(keys.lease(topic.name, q), keys.state(topic.name, q),
                                      owner, settings.lease_ms)
        if fence is None:
            with _active_lock:
                _active.discard((topic.name, q))
            return False
        held[q] = _Held(r, scripts, topic, q, fence, settings)
        log.debug("lease taken", extra=fields("lease_taken", topic=topic.name, partition=q,
                                               fence=fence))
        return True

    # a job whose own partition another job holds still serves its topic: it adopts free
    # partitions (below) rather than ending, so a worker that starts while the queue holds
    # jobs of partitions already taken finds its share at once, not after one rq job each
    if not take(p) and not adopt:
        return {p: (0, False)}
    now = time.monotonic()
    deadline = now + (settings.job_budget_s if budget_s is None else budget_s)
    renew_every = settings.lease_ms / 3000  # seconds
    renewed = now
    next_adopt = now if adopt else float("inf")
    drained = False
    busy = now  # when a step last applied something: lingering counts from there
    share = len(held)
    try:
        while True:
            if now >= next_adopt:
                next_adopt = now + ADOPT_EVERY_S
                share = -(-topic.partitions // _workers(r))  # this job's fair share
                for q in range(topic.partitions):
                    if len(held) >= share:
                        break
                    if q not in held and take(q):
                        # the marker says "served": a publisher enqueues no job for q now
                        _mark_served(r, topic, [q], settings)
                if not held:  # its partition is another job's, and no other one is free
                    return {p: (0, False)}
            n = 0
            for h in held.values():
                k = h.applier.step()
                h.done += k
                n += k
            if GATHER_MIN <= n < settings.batch_size // 4:
                time.sleep(GATHER_S)  # let a live publisher's entries gather (see GATHER_S)
            now = time.monotonic()
            if n:
                busy = now
            all_drained = all(h.applier.drained for h in held.values())
            if now - renewed >= renew_every:  # also while lingering, which loops from below
                _renew(r, scripts, topic, held, owner, settings)
                renewed = now
            if now >= deadline:
                if not adopt or _queued_work(r, topic.name, False) == "elsewhere":
                    drained = all_drained
                    break
                # nobody else waits for this worker: keep serving (no hand-over gap)
                deadline = now + (settings.job_budget_s if budget_s is None else budget_s)
            if all_drained:
                # drained (nothing in flight): linger briefly for more on every held log; a
                # live publisher keeps one job busy instead of paying for a new rq job per
                # burst. A job serving its share of a topic does not give way to queued jobs
                # (mostly its own partitions': they find the lease taken and end at once).
                # new entries a publisher's write-through applied (nothing left to do) do
                # not extend it: a job that only wakes for those retires after the linger
                linger = settings.linger_ms if linger_ms is None else linger_ms
                linger_left = linger - int((now - busy) * 1000)
                budget_left = int((deadline - now) * 1000)
                logs = {keys.log(topic.name, h.p): h.applier.cursor for h in held.values()}
                needed: Callable[[], str | None] | None = None
                if linger_ms is None:  # a worker's job: give way to a job that needs a worker
                    if adopt:  # free partitions of its topic: adopt them, up to its share
                        needed = functools.partial(_queued_work, r, topic.name,
                                                   len(held) < share)
                    else:
                        needed = functools.partial(_queue_waits, r)
                why = None if None in logs.values() else _linger(
                    r, logs, min(linger_left, budget_left), needed)
                if why is None and budget_left < linger_left:
                    why = "budget"  # the budget ran out first: decided at the top
                if why is None or why == "elsewhere":
                    drained = True
                    break
                if why == "adopt":  # free partitions of this topic wait: take them now
                    next_adopt = time.monotonic()
                now = time.monotonic()
                continue
        for h in held.values():
            h.done += h.applier.finish()
            _trim(r, topic, h.p, settings)
    finally:
        for h in held.values():
            try:
                h.applier.finish()  # never leave a call unread (no-op after the finish above)
            except Exception as exc:  # the first error is the one raised
                log.warning("%s[%d]: finishing the batch in flight failed: %s", topic.name,
                            h.p, exc)
            finally:
                with _active_lock:  # first: releasing fails when Redis is gone
                    _active.discard((topic.name, h.p))
                _release(scripts, keys.lease(topic.name, h.p), owner)
    return {q: (h.done, drained) for q, h in held.items()}


def _renew(r: Client, scripts: Scripts, topic: TopicConfig, held: Mapping[int, _Held],
           owner: str, settings: Settings) -> None:
    """Extend the leases of the ``held`` partitions, and their job markers: a publisher
    enqueues no job for a partition a job serves, however long it serves it.

    Raises:
        FencedError: a lease was taken over.
    """
    for h in held.values():
        if scripts.lease_acquire(keys.lease(topic.name, h.p), keys.state(topic.name, h.p),
                                 owner, settings.lease_ms) != h.fence:
            raise FencedError(f"lost the lease of {topic.name}[{h.p}]")
    _mark_served(r, topic, list(held), settings)


def _mark_served(r: Client, topic: TopicConfig, partitions: list[int],
                 settings: Settings) -> None:
    """Set the job markers of ``partitions`` (lifetime ``marker_ttl_ms``): a job serves them,
    so a publisher enqueues none."""
    pipe = r.pipeline(transaction=False)
    for q in partitions:
        pipe.set(keys.job_marker(topic.name, q), OWNER, px=settings.marker_ttl_ms)
    pipe.execute()


def _release(scripts: Scripts, lease_key: str, owner: str) -> None:
    """Release a lease; when Redis cannot be reached the lease lapses by itself (the sweeper
    reclaims it sooner: it is no longer marked active)."""
    try:
        scripts.lease_release(lease_key, owner)
    except RedisError as exc:  # Redis unreachable: the outage is reported once by the worker
        log.log(logging.DEBUG if isinstance(exc, (RedisConnectionError, RedisTimeoutError)) else
                logging.WARNING, "releasing %s failed (%s); it lapses after the lease time",
                lease_key, exc)


def drain_partition(r: Client, topic: TopicConfig, p: int, settings: Settings,
                    budget_s: float | None = None, owner: str = OWNER,
                    linger_ms: int | None = None) -> tuple[int, bool]:
    """Apply partition ``p`` alone (see :func:`drain_partitions`).

    Returns:
        ``(entries consumed, drained)``; ``drained`` is False when the budget ran out or the
        lease belongs to another worker.
    """
    return drain_partitions(r, topic, p, settings, budget_s, owner, linger_ms)[p]


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
    r = data_of(job.connection)  # the job runs on the control Redis; the data may be elsewhere
    settings = Settings.from_env()
    _scripts, cache = _tools(r)
    try:
        t = cache.get(topic)
    except UnknownTopicError:
        r.delete(keys.job_marker(topic, partition))
        log.warning("topic %s no longer defined; job dropped", topic)
        return 0
    r.pexpire(keys.job_marker(topic, partition), settings.marker_ttl_ms)
    try:
        results = drain_partitions(r, t, partition, settings, adopt=True)
    except FencedError:
        log.warning("%s[%d]: lease taken over by another worker", topic, partition,
                    extra=fields("lease_lost", topic=topic, partition=partition))
        return 0
    total = 0
    for q, (done, drained) in results.items():
        total += done
        _hand_over(r, t, q, done, drained, settings)
    return total


def _hand_over(r: Client, t: TopicConfig, p: int, done: int, drained: bool,
               settings: Settings) -> None:
    """After a job served partition ``p``: re-enqueue it or retire it."""
    marker = keys.job_marker(t.name, p)
    if done == 0 and not drained:
        # another worker holds the lease: it re-enqueues or retires the partition itself
        return
    if drained and done and control_of(r).llen(QUEUE_KEY):
        # left its partition for the jobs waiting in the queue while entries kept coming:
        # come back after them (keeping the marker spares a live publisher the enqueue)
        r.pexpire(marker, settings.marker_ttl_ms)
        enqueue_job(r, t.name, p)
    elif drained:
        r.delete(marker)
        # entries appended after our last read but before the marker went away
        if p in lagging_partitions(r, t):
            ensure_jobs(r, t.name, [p], settings)
    else:
        r.pexpire(marker, settings.marker_ttl_ms)
        enqueue_job(r, t.name, p)
