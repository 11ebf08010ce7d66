"""Per-partition ingest jobs on rq (ARCHITECTURE §3), scheduled fairly across topics.

One job per partition with work. A partition's job marker ``{sow:T:p}:job`` says who answers
for its unapplied entries: ``job:<rq job id>`` while a job waits in the queue (set with
``SET NX PX`` by whoever enqueues it, a publisher or the sweep), ``held:<owner>:<fence>``
while a job of process ``<owner>`` serves the partition under its lease (fencing token
``<fence>``). A job runs only when the marker
still names it (else it is stale: it ends at once); a job that adopts a partition whose job
waits in the queue takes that job out of the queue. So the queue never holds more jobs than
partitions with work.

Round robin across topics: the queue is first in, first out; a job serves its partition (and
a fair share of its topic's free partitions) and, while any job of another topic waits, gives
way within :data:`YIELD_EVERY_S` seconds, re-enqueueing each partition it leaves at the back
of the queue. A saturated topic thereby never holds a quiet topic's job back for longer
than one yield per worker.

Every worker sweeps the partitions now and then (one sweeper at a time, under a sweep
lease), so entries written by any Redis client, or left by a dead worker, are picked up; a
marker that stands for no job (no lifetime, a job that does not exist, a lease no one holds)
is removed and a job enqueued. Jobs are JSON-serialized and only sow_redis's own job
functions run (:mod:`sow_redis.apply.safejob`). A sweep also takes back what a dead job left behind
(a lease and a marker), so a partition moves on within one sweep instead of after
``lease_ms`` / ``marker_ttl_ms``: the lease of a process of this host that no longer runs, and
this process's own lease when no job of this process works on the partition (its job died on
a lost Redis connection). ``recover=True`` (after an outage) also drops the marker of every
lagging partition that no one leases, since the job it stands for may have been lost with the
connection.
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
from collections.abc import Callable, Iterable, Mapping
from typing import cast

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, OutOfMemoryError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import keys
from ..connection import Client, control_of, data_of, get_many, single_pool, xread_any
from ..errors import FencedError, UnknownTopicError, WaitTimeout
from ..logs import fields
from ..model.topic import TopicConfig
from ..outage import reporter
from ..partition_state import count_pending, read_cursor
from ..registry import TopicCache
from ..settings import QUEUE_NAME, Settings
from ..streamids import ZERO, parse
from .applier import PartitionApplier
from .scripts import Scripts, attached, scripts_of

log = logging.getLogger(__name__)

JOB_FUNC = "sow_redis.apply.jobs.ingest_job"
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
    return attached(r, "tools", lambda c: (scripts_of(c), TopicCache(c)))


BEHIND_COUNT_MAX = 1_000
"""Unapplied log entries counted for a job's description at most (shown as ``1,000+``)."""


def new_job_id() -> str:
    """A fresh rq job id for an ingest job (its marker value is ``job:<id>``)."""
    return uuid.uuid4().hex


def job_marker_value(job_id: str) -> str:
    """The job marker value of a queued ingest job (see the module docstring)."""
    return "job:" + job_id


def held_marker_value(owner: str, fence: int) -> str:
    """The job marker value of a partition that lease owner ``owner`` serves under fencing
    token ``fence``: ``held:<owner>:<fence>`` (one value per hold, see :func:`stale_markers`)."""
    return f"held:{owner}:{fence}"


def enqueue_job(r: Client, topic: str, p: int, behind: int | None = None,
                job_id: str | None = None) -> str:
    """Enqueue an ingest job of partition ``p`` on the control Redis of data client ``r``
    (:func:`sow_redis.connection.control_of`; the caller set its job marker to
    ``job:<job_id>``). Its description, shown by rq-dashboard, is ``ingest <topic>[<p>]
    (N entries behind)``: ``behind`` when the caller knows the backlog (log entries not
    applied yet, at least), else counted here (at most :data:`BEHIND_COUNT_MAX`, then
    ``1,000+``; no count when the ACL user may not read the log).

    Returns:
        The job id.
    """
    # start-up time: rq (~0.3 s) loads only when a job is enqueued, not with the Sow facade
    from rq import Queue

    # start-up time: safejob imports rq
    from .safejob import SERIALIZER

    shown = f"{behind:,}" if behind is not None else None
    if behind is None:
        try:
            behind = count_pending(r, topic, p, BEHIND_COUNT_MAX)
            shown = f"{behind:,}" + ("+" if behind >= BEHIND_COUNT_MAX else "")
        except NoPermissionError:  # a publisher's ACL user may not read the log
            pass
    job_id = job_id or new_job_id()
    Queue(QUEUE_NAME, connection=control_of(r), serializer=SERIALIZER).enqueue(
        JOB_FUNC, topic, p, result_ttl=0, failure_ttl=86400, job_timeout=JOB_TIMEOUT_S,
        job_id=job_id, description=f"ingest {topic}[{p}]" + (
            "" if shown is None else f" ({shown} entr{'y' if behind == 1 else 'ies'} behind)"),
    )
    # the marker may have been taken over between its SET and this enqueue (a job adopted
    # the partition and looked for this job in the queue before it was there): then this
    # job is not needed, and leaves the queue at once
    marker = keys.job_marker(topic, p)
    try:
        current = r.get(marker)
    except NoPermissionError:  # a publisher's ACL user may not read markers back
        return job_id
    if current != job_marker_value(job_id).encode():
        try:
            _drop_queued(r, job_marker_value(job_id).encode())
        except NoPermissionError:  # the publisher role may not LREM: it ends when run
            pass
    return job_id


def ensure_jobs(r: Client, topic: str, partitions: list[int], settings: Settings,
                behind: Mapping[int, int] | None = None) -> int:
    """Enqueue an ingest job for each partition that has none outstanding (its marker set
    with ``SET NX``).

    Returns:
        The number of jobs enqueued.
    """
    ids = {p: new_job_id() for p in partitions}
    pipe = r.pipeline(transaction=False)
    for p in partitions:
        pipe.set(keys.job_marker(topic, p), job_marker_value(ids[p]), nx=True,
                 px=settings.queued_marker_ttl_ms)
    n = 0
    for p, ok in zip(partitions, pipe.execute()):
        if ok:
            enqueue_job(r, topic, p, behind=behind.get(p) if behind else None, job_id=ids[p])
            n += 1
    return n


def drop_markers(r: Client, topic: str, partitions: Iterable[int]) -> None:
    """Remove the job markers of ``partitions`` and take the queued jobs they name out of
    the queue: a marker removed while its job waits would let a second job of the
    partition in."""
    pipe = r.pipeline(transaction=False)
    parts = list(partitions)
    for p in parts:
        pipe.getdel(keys.job_marker(topic, p))
    for old in pipe.execute():
        _drop_queued(r, old)


def _set_marker(r: Client, topic: str, p: int, value: str, px: int,
                keep: str | None = None) -> None:
    """Set partition ``p``'s job marker to ``value`` (lifetime ``px`` ms) and take the queued
    job the marker named before out of the queue (unless it is ``keep``): a marker replaced
    while its job waits would leave a second job of the partition in the queue."""
    _drop_queued(r, cast("bytes | None", r.set(keys.job_marker(topic, p), value, px=px,
                                               get=True)), keep=keep)


def _drop_queued(r: Client, marker: bytes | None, keep: str | None = None) -> None:
    """Take the queued job a marker value names (``job:<id>``, unless it is ``keep``) out of
    the queue: the partition is served now, the job would only end at once."""
    if not marker or not marker.startswith(b"job:"):
        return
    job_id = marker[4:].decode(errors="replace")
    if job_id == keep:
        return
    control = control_of(r)
    if control.lrem(QUEUE_KEY, 1, job_id):  # still queued: no worker has it, drop its hash
        control.delete("rq:job:" + job_id)


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
        drop_markers(r, topic, stale)
    return stale


def stale_markers(r: Client, topic: TopicConfig, partitions: list[int], settings: Settings,
                  suspects: dict[tuple[str, int], bytes] | None = None) -> list[int]:
    """Remove the job markers of ``partitions`` that stand for no job, so the next
    :func:`ensure_jobs` enqueues one: a marker without a lifetime (any client allowed to set
    markers may have set it), a value that is neither ``job:<id>`` nor ``held:<owner>``, a
    ``job:<id>`` whose rq job is not waiting in the queue (a job that runs marks its
    partition ``held`` at once; one that died running leaves ``job:``), a ``held:<owner>``
    whose partition's lease that owner does not hold. The last two are only suspected the
    first time (``suspects``, kept by the caller from one sweep to the next: a publisher's
    job may be on its way into the queue, a lease on its way to its owner) and removed when
    a later sweep finds the same value; without ``suspects`` at once. A marker whose job
    waits in the queue gets its lifetime back (``queued_marker_ttl_ms``), so it never lapses
    while the job waits. A partition with a marker that stands for no job thereby moves on
    within two sweeps.

    Returns:
        The partitions whose marker was removed.
    """
    pipe = r.pipeline(transaction=False)
    for p in partitions:
        pipe.get(keys.job_marker(topic.name, p))
        pipe.pttl(keys.job_marker(topic.name, p))
        pipe.get(keys.lease(topic.name, p))
    res = pipe.execute()
    stale: list[tuple[int, bytes]] = []
    doubtful: list[tuple[int, bytes]] = []
    jobs: list[tuple[int, bytes]] = []
    for i, p in enumerate(partitions):
        value, ttl, owner = res[3 * i], int(res[3 * i + 1]), res[3 * i + 2]
        if value is None:
            continue
        if ttl < 0 or not value.startswith((b"job:", b"held:")):
            stale.append((p, value))  # never set by sow_redis
        elif value.startswith(b"job:"):
            jobs.append((p, value))
        elif owner != value[5:].rsplit(b":", 1)[0]:
            doubtful.append((p, value))
    if jobs:
        cpipe = control_of(r).pipeline(transaction=False)
        for _p, value in jobs:
            cpipe.hget(b"rq:job:" + value[4:], "status")
        found = cpipe.execute()
        # a job that runs says "held" in its marker within moments: "job:" is for waiting
        doubtful += [pv for pv, status in zip(jobs, found) if status != b"queued"]
        alive = [p for (p, _v), status in zip(jobs, found) if status == b"queued"]
        if alive:
            pipe = r.pipeline(transaction=False)
            for p in alive:
                pipe.pexpire(keys.job_marker(topic.name, p), settings.queued_marker_ttl_ms)
            pipe.execute()
    for p, value in doubtful:
        if suspects is None or suspects.pop((topic.name, p), None) == value:
            stale.append((p, value))
        else:
            suspects[(topic.name, p)] = value
    if stale:
        log.warning("%s: removed job markers that stand for no job: %s", topic.name,
                    ", ".join(f"[{p}] {v[:60]!r}" for p, v in sorted(stale)))
        r.delete(*[keys.job_marker(topic.name, p) for p, _v in stale])
    return [p for p, _v in stale]


class LagScanner:
    """Finds the partitions with unapplied log entries among every topic's, at a cost that
    grows with the partitions whose log moved, not with all partitions (10,000 idle topics
    cost an idle worker next to nothing; docs/benchmarks.md, fair scheduling).

    On one server: one non-blocking ``XREAD COUNT 1`` per :attr:`CHUNK` logs, pipelined,
    naming each log with the applied cursor last seen for it, so Redis answers only for the
    logs that have an entry after that id (an idle partition costs Redis a key lookup and
    this process nothing); those are checked against their applied cursors. A chunk's
    command is packed once and again only when one of its ids changed. On a cluster an XREAD
    names keys of one slot only: there, an XREVRANGE and an HGET per partition, pipelined
    (:func:`lagging_partitions`).
    """

    CHUNK = 2000

    def __init__(self) -> None:
        self._names: tuple[str, ...] = ()
        self._logs: list[tuple[str, int, bytes]] = []  # (topic, partition, log key)
        self._index: dict[bytes, int] = {}  # log key → its position in _logs
        self._known: list[bytes] = []  # per log: the applied cursor last seen
        self._keys: list[bytes] = []  # per chunk: the RESP of its log keys
        self._packed: list[bytes | None] = []  # per chunk: its XREAD, None when changed
        self.suspects: dict[tuple[str, int], bytes] = {}
        """Job markers suspected to stand for no job at the last sweep (:func:`stale_markers`)."""

    def _layout(self, topics: Mapping[str, TopicConfig]) -> None:
        shape = tuple(f"{n}:{t.partitions}" for n, t in sorted(topics.items()))
        if shape == self._names:
            return
        known = {(t, p): k for (t, p, _l), k in zip(self._logs, self._known)}
        self._names = shape
        self._logs = [(n, p, keys.log(n, p).encode()) for n, t in sorted(topics.items())
                      for p in range(t.partitions)]
        self._known = [known.get((n, p), b"0-0") for n, p, _l in self._logs]
        self._index = {k: i for i, (_n, _p, k) in enumerate(self._logs)}
        self._keys = [b"".join(b"$%d\r\n%s\r\n" % (len(k), k)
                               for _n, _p, k in self._logs[c:c + self.CHUNK])
                      for c in range(0, len(self._logs), self.CHUNK)]
        self._packed = [None] * len(self._keys)

    def _command(self, c: int) -> bytes:
        cmd = self._packed[c]
        if cmd is None:
            ids = self._known[c * self.CHUNK:(c + 1) * self.CHUNK]
            cmd = (b"*%d\r\n$5\r\nXREAD\r\n$5\r\nCOUNT\r\n$1\r\n1\r\n$7\r\nSTREAMS\r\n"
                   % (4 + 2 * len(ids)) + self._keys[c]
                   + b"".join(b"$%d\r\n%s\r\n" % (len(i), i) for i in ids))
            self._packed[c] = cmd
        return cmd

    def lagging(self, r: Client, topics: Mapping[str, TopicConfig]) -> dict[str, list[int]]:
        """Topic name → its partitions with entries after the applied cursor (topics without
        any are left out)."""
        pool = single_pool(r)
        if pool is None:  # one XREAD cannot name logs of several slots
            return {n: lag for n, t in sorted(topics.items()) if (lag := lagging_partitions(r, t))}
        self._layout(topics)
        if not self._logs:
            return {}
        conn = pool.get_connection()
        try:
            conn.send_packed_command([self._command(c) for c in range(len(self._keys))],
                                     check_health=False)
            replies = [conn.read_response() for _c in range(len(self._keys))]
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        # RESP3 answers a map of log key → entries, RESP2 an array of [log key, entries]
        moved = [self._index[name if isinstance(reply, dict) else name[0]]
                 for reply in replies if reply for name in reply]
        if not moved:
            return {}
        pipe = r.pipeline(transaction=False)
        for i in moved:
            name, p, log_key = self._logs[i]
            pipe.hget(keys.state(name, p), "cursor")
            pipe.xrevrange(log_key, count=1)
        res = pipe.execute()
        out: dict[str, list[int]] = {}
        for j, i in enumerate(moved):
            name, p, _log = self._logs[i]
            cursor, last = res[2 * j] or b"0-0", res[2 * j + 1]
            if last and parse(last[0][0]) > parse(cursor):
                out.setdefault(name, []).append(p)
            if cursor != self._known[i]:
                self._known[i] = cursor
                self._packed[i // self.CHUNK] = None
        return out


def lost_partitions(r: Client, topics: Mapping[str, TopicConfig]) -> dict[str, list[int]]:
    """Transient topic name → its partitions whose SOW was lost (no applied cursor, see
    ``lua/rebuild.lua``), in one pipelined round trip (one ``HEXISTS`` per partition of the
    transient topics; persistent topics cost nothing). A worker's job rebuilds them."""
    transient = [t for t in topics.values() if t.transient]
    if not transient:
        return {}
    pipe = r.pipeline(transaction=False)
    for t in transient:
        for p in range(t.partitions):
            pipe.hexists(keys.state(t.name, p), "cursor")
    found = iter(pipe.execute())
    out: dict[str, list[int]] = {}
    for t in transient:
        lost = [p for p in range(t.partitions) if not next(found)]
        if lost:
            out[t.name] = lost
    return out


def sweep(r: Client, settings: Settings, recover: bool = False,
          scanner: LagScanner | None = None) -> int:
    """Enqueue jobs for every lagging partition of every topic, and every partition of a
    transient topic whose SOW was lost (:func:`lost_partitions`), after :func:`reclaim` and
    :func:`stale_markers`. One worker process sweeps at a time (the sweep lease
    :data:`keys.SWEEP_LEASE`, lifetime three sweep intervals); ``recover`` (after an outage)
    sweeps whoever holds it.

    Returns:
        The number of jobs enqueued.
    """
    lease_ms = max(1000, int(settings.sweep_interval_s * 3000))
    if not recover and not r.set(keys.SWEEP_LEASE, OWNER, nx=True, px=lease_ms):
        if r.get(keys.SWEEP_LEASE) != OWNER.encode():
            return 0  # another worker sweeps
        r.pexpire(keys.SWEEP_LEASE, lease_ms)
    _scripts, cache = _tools(r)
    topics = cache.all()
    scanner = scanner or LagScanner()
    n = 0
    work = scanner.lagging(r, topics)
    for name, lost in lost_partitions(r, topics).items():  # a lost SOW: rebuilt by a job
        work[name] = sorted(set(work.get(name, [])) | set(lost))
    for name, lag in work.items():
        reclaim(r, name, lag, recover)
        stale_markers(r, topics[name], lag, settings, scanner.suspects)
        n += ensure_jobs(r, name, lag, settings)
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

YIELD_EVERY_S = 0.02
"""Seconds between two looks of a busy job at the queue: a job of another topic waiting
there is served in passing (:func:`_help_queued`; round robin across topics: a quiet
topic's entry waits about this long plus one step of the busy job)."""


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
    while True:
        if needed is not None:
            why = needed()
            if why is not None:
                return why
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            return None
        if xread_any(r, streams, min(left_ms, LINGER_SLICE_MS)):
            return "entry"


QUEUE_PEEK = 100
"""Queued jobs looked at to decide whether a worker is needed elsewhere."""

_DESCRIPTION = re.compile(rb"^ingest (.+)\[(\d+)\](?: \([\d,]+\+? entr(?:y|ies) behind\))?$")


def _free_queued(r: Client) -> list[tuple[str, str, int]] | None:
    """The queued ingest jobs whose partition no one leases, ``(job id, topic, partition)``,
    in queue order, among the first :data:`QUEUE_PEEK` queued jobs (by their description
    ``ingest <topic>[<p>]``; the queue on the control Redis, the leases on the data Redis
    ``r``). A job whose partition's lease is held ends at once when run: it needs no one.

    Returns:
        The list; None when a job that is not an ingest job waits (it needs a worker).
    """
    control = control_of(r)
    ids = cast("list[bytes]", control.lrange(QUEUE_KEY, 0, QUEUE_PEEK - 1))
    if not ids:
        return []
    pipe = control.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(b"rq:job:" + job_id, "description")
    queued: list[tuple[str, str, int]] = []
    for job_id, desc in zip(ids, pipe.execute()):
        if desc is None:
            continue  # taken out of the queue meanwhile
        m = _DESCRIPTION.match(desc)
        if m is None:
            log.debug("queued job %r needs a worker", desc)
            return None
        queued.append((job_id.decode(), m.group(1).decode(), int(m.group(2))))
    owners = get_many(r, [keys.lease(t, q) for _j, t, q in queued])
    return [jtq for jtq, owner in zip(queued, owners) if owner is None]


def _queued_work(r: Client, topic: str, can_adopt: bool) -> str | None:
    """What the queued jobs ask of a job serving a share of ``topic`` (``can_adopt``: it
    holds fewer partitions than its share); see :func:`_free_queued`.

    Returns:
        ``"elsewhere"`` when a job of another topic (or not an ingest job) needs a worker;
        else ``"adopt"`` when free partitions of ``topic`` wait and ``can_adopt`` (the
        caller takes them rather than ending so that new jobs take them one by one); else
        None (free partitions of ``topic`` beyond this job's share are left to an idle
        worker).
    """
    free = _free_queued(r)
    if free is None:
        return "elsewhere"
    if not free:
        return None
    log.debug("queued jobs of free partitions %s", free)
    if any(t != topic for _j, t, _q in free):
        return "elsewhere"
    return "adopt" if can_adopt else None


HELP_BUDGET_S = 0.05
"""Seconds a busy job spends at most on one queued partition of another topic it serves
in passing (:func:`_help_queued`) before it goes back to its own."""


def _help_queued(r: Client, topic: str, settings: Settings) -> int:
    """Round robin without a hand-over: serve, in passing, the first queued job of another
    topic than ``topic`` whose partition is free. Its lease is taken, its marker says
    "served", its job leaves the queue, its entries are applied for up to
    :data:`HELP_BUDGET_S` seconds, then the partition is retired (drained) or enqueued
    again at the back of the queue. A quiet topic's entries thereby wait for one step of a
    busy job, not for the busy job to end.

    Returns:
        Log entries applied.
    """
    free = _free_queued(r)
    if not free:
        return 0
    job_id, name, q = next(((j, t, p) for j, t, p in free if t != topic), ("", "", -1))
    if q < 0:
        return 0
    scripts, cache = _tools(r)
    try:
        t = cache.get(name)
    except UnknownTopicError:
        return 0
    with _active_lock:  # marked before leasing: the sweeper leaves our leases alone
        _active.add((name, q))
    done, drained = 0, False
    try:
        fence = scripts.lease_acquire(keys.lease(name, q), keys.state(name, q), OWNER,
                                      settings.lease_ms)
        if fence is None:
            return 0
        try:
            _set_marker(r, name, q, held_marker_value(OWNER, fence), settings.marker_ttl_ms)
            _drop_queued(r, job_marker_value(job_id).encode())
            applier = PartitionApplier(r, scripts, t, q, fence, settings.batch_size)
            deadline = time.monotonic() + HELP_BUDGET_S
            try:
                while True:
                    done += applier.step()
                    if applier.drained or time.monotonic() >= deadline:
                        break
            finally:
                done += applier.finish()
            drained = applier.drained
        finally:
            _release(scripts, keys.lease(name, q), OWNER)
    except FencedError:
        log.warning("%s[%d]: lease taken over while serving it in passing", name, q)
        return done
    finally:
        with _active_lock:
            _active.discard((name, q))
    _hand_over(r, t, q, done, drained, settings, come_back=False)
    return done


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
                 settings: Settings) -> None:
        self.p, self.fence = p, fence
        self.applier = PartitionApplier(r, scripts, topic, p, fence, settings.batch_size)
        self.done = 0


class _Drain:
    """One :func:`drain_partitions` call: the partitions it holds under their leases, and
    its clocks (``time.monotonic()`` seconds)."""

    def __init__(self, r: Client, topic: TopicConfig, settings: Settings,
                 budget_s: float | None, owner: str, linger_ms: int | None, adopt: bool,
                 job_id: str | None) -> None:
        self.r, self.topic, self.settings = r, topic, settings
        self.scripts = _tools(r)[0]
        self.budget_s = settings.job_budget_s if budget_s is None else budget_s
        self.owner, self.linger_ms, self.adopt, self.job_id = owner, linger_ms, adopt, job_id
        self.held: dict[int, _Held] = {}
        self.renew_every = settings.lease_ms / 3000  # seconds
        self.start(time.monotonic())

    def start(self, now: float) -> None:
        """Start the clocks at ``now``: the budget, lease renewal, adoption and giving way."""
        self.deadline = now + self.budget_s
        self.renewed = now
        self.next_adopt = now if self.adopt else float("inf")
        self.next_yield = now + YIELD_EVERY_S
        self.busy = now  # when a step last applied something: lingering counts from there
        self.share = len(self.held)

    def take(self, q: int) -> bool:
        """Lease partition ``q`` and hold it; False when another worker holds it."""
        name = self.topic.name
        with _active_lock:  # marked before leasing: the sweeper leaves our leases alone
            _active.add((name, q))
        fence = self.scripts.lease_acquire(keys.lease(name, q), keys.state(name, q),
                                           self.owner, self.settings.lease_ms)
        if fence is None:
            with _active_lock:
                _active.discard((name, q))
            return False
        try:  # a transient topic's lost SOW starts its rebuild here (PartitionApplier)
            self.held[q] = _Held(self.r, self.scripts, self.topic, q, fence, self.settings)
        except BaseException:
            with _active_lock:
                _active.discard((name, q))
            _release(self.scripts, keys.lease(name, q), self.owner)
            raise
        if self.adopt:  # a worker's job: the marker says "served" from now on, and the job
            # that waited for q leaves the queue (a publisher enqueues none for q now)
            _set_marker(self.r, name, q, held_marker_value(self.owner, fence),
                        self.settings.marker_ttl_ms, keep=self.job_id)
        log.debug("lease taken", extra=fields("lease_taken", topic=name, partition=q,
                                               fence=fence))
        return True

    def adopt_free(self, now: float) -> None:
        """Take free partitions of the topic up to this job's fair share (partitions /
        registered workers)."""
        self.next_adopt = now + ADOPT_EVERY_S
        self.share = -(-self.topic.partitions // _workers(self.r))
        for q in range(self.topic.partitions):
            if len(self.held) >= self.share:
                break
            if q not in self.held:
                self.take(q)

    def step(self) -> int:
        """One apply step of every held partition; the entries they consumed."""
        n = 0
        for h in self.held.values():
            k = h.applier.step()
            h.done += k
            n += k
        return n

    def upkeep(self, now: float) -> None:
        """Renew the leases when due (also while lingering); with ``adopt``, serve a job of
        another topic that waits, in passing (round robin), when due.

        Raises:
            FencedError: a lease was taken over.
        """
        if now - self.renewed >= self.renew_every:
            _renew(self.r, self.scripts, self.topic, self.held, self.owner, self.settings)
            self.renewed = now
        if self.adopt and now >= self.next_yield:
            self.next_yield = now + YIELD_EVERY_S
            if control_of(self.r).llen(QUEUE_KEY):
                _help_queued(self.r, self.topic.name, self.settings)

    def linger(self, now: float) -> str | None:
        """Every held partition drained (nothing in flight): wait briefly for more on every
        held log. A live publisher keeps one job busy instead of paying for a new rq job per
        burst. A job serving its share of a topic does not give way to queued jobs (mostly
        its own partitions': they find the lease taken and end at once). New entries a
        publisher's write-through applied (nothing left to do) do not extend it: a job that
        only wakes for those retires after the linger.

        Returns:
            As :func:`_linger`, or ``"budget"`` when the budget ran out before the linger.
        """
        linger = self.settings.linger_ms if self.linger_ms is None else self.linger_ms
        linger_left = linger - int((now - self.busy) * 1000)
        budget_left = int((self.deadline - now) * 1000)
        logs = {keys.log(self.topic.name, h.p): h.applier.cursor for h in self.held.values()}
        needed: Callable[[], str | None] | None = None
        if self.linger_ms is None:  # a worker's job: give way to a job that needs a worker
            if self.adopt:  # free partitions of its topic: adopt them, up to its share
                needed = functools.partial(_queued_work, self.r, self.topic.name,
                                           len(self.held) < self.share)
            else:
                needed = functools.partial(_queue_waits, self.r)
        why = None if None in logs.values() else _linger(
            self.r, logs, min(linger_left, budget_left), needed)
        if why is None and budget_left < linger_left:
            why = "budget"  # the budget ran out first: decided at the top
        return why

    def finish(self) -> None:
        """Read the call in flight of every held partition and trim its log."""
        for h in self.held.values():
            h.done += h.applier.finish()
            _trim(self.r, self.topic, h.p, self.settings)

    def release(self) -> None:
        """Read any call still in flight and release every lease (after an error too: the
        first error is the one raised, later ones are logged)."""
        for h in self.held.values():
            try:
                h.applier.finish()  # never leave a call unread (no-op after finish())
            except Exception as exc:  # the first error is the one raised
                log.warning("%s[%d]: finishing the batch in flight failed: %s",
                            self.topic.name, h.p, exc)
            finally:
                with _active_lock:  # first: releasing fails when Redis is gone
                    _active.discard((self.topic.name, h.p))
                _release(self.scripts, keys.lease(self.topic.name, h.p), self.owner)


def drain_partitions(r: Client, topic: TopicConfig, p: int, settings: Settings,
                     budget_s: float | None = None, owner: str = OWNER,
                     linger_ms: int | None = None, adopt: bool = False,
                     job_id: str | None = None) -> dict[int, tuple[int, bool]]:
    """Apply partition ``p`` of ``topic`` (and, with ``adopt``, free partitions of the same
    topic up to a fair share: partitions / registered workers) under their leases, for up to
    ``budget_s`` seconds (default ``job_budget_s``), waiting up to ``linger_ms`` (default
    ``settings.linger_ms``) for new entries once all are drained, on all of them at once.
    With ``adopt`` (a worker's job, ``job_id`` its rq id), it gives way within
    :data:`YIELD_EVERY_S` seconds once a job of another topic waits in the queue (returning
    its partitions not drained, for the caller to enqueue again at the back), and takes an
    adopted partition's queued job out of the queue.

    One job serving several partitions applies each new entry as it comes, instead of
    handing the worker from one partition's rq job to the next (which costs milliseconds of
    latency per hand-over; docs/benchmarks.md, "Subscriber latency").

    Returns:
        partition → ``(entries consumed, drained)`` of each partition served under its lease
        (with ``adopt`` ``p`` may be left out: another worker holds it, and the job served
        free ones); empty when ``p``'s lease belongs to another worker and (``adopt``) no
        partition of the topic was free. ``drained`` is False when the budget ran out or the
        job gave way with entries left.

    Raises:
        FencedError: a held lease was taken over (the others are released).
    """
    d = _Drain(r, topic, settings, budget_s, owner, linger_ms, adopt, job_id)
    # a job whose own partition another job holds still serves its topic: it adopts free
    # partitions (below) rather than ending, so a worker that starts while the queue holds
    # jobs of partitions already taken finds its share at once, not after one rq job each
    if not d.take(p) and not adopt:
        return {}
    now = time.monotonic()
    d.start(now)
    drained = False
    try:
        while True:
            if now >= d.next_adopt:
                d.adopt_free(now)
                if not d.held:  # its partition is another job's, and no other one is free
                    return {}
            n = d.step()
            if GATHER_MIN <= n < settings.batch_size // 4:
                time.sleep(GATHER_S)  # let a live publisher's entries gather (see GATHER_S)
            now = time.monotonic()
            if n:
                d.busy = now
            all_drained = all(h.applier.drained for h in d.held.values())
            d.upkeep(now)
            if now >= d.deadline:
                if not adopt or _queued_work(r, topic.name, False) == "elsewhere":
                    drained = all_drained
                    break
                # nobody else waits for this worker: keep serving (no hand-over gap)
                d.deadline = now + d.budget_s
            if all_drained:
                why = d.linger(now)
                if why is None or why == "elsewhere":
                    drained = True
                    break
                if why == "adopt":  # free partitions of this topic wait: take them now
                    d.next_adopt = time.monotonic()
                now = time.monotonic()
        d.finish()
    finally:
        d.release()
    return {q: (h.done, drained) for q, h in d.held.items()}


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
    _mark_served(r, topic, {q: h.fence for q, h in held.items()}, settings, owner)


def _mark_served(r: Client, topic: TopicConfig, fences: Mapping[int, int],
                 settings: Settings, owner: str = OWNER) -> None:
    """Set the job markers of the partitions of ``fences`` (partition → fencing token of
    its lease; lifetime ``marker_ttl_ms``): a job serves them, so a publisher enqueues none."""
    pipe = r.pipeline(transaction=False)
    for q, fence in fences.items():
        pipe.set(keys.job_marker(topic.name, q), held_marker_value(owner, fence),
                 px=settings.marker_ttl_ms, get=True)
    for old in pipe.execute():  # a job enqueued while the marker had lapsed: not needed
        _drop_queued(r, old)


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
    return drain_partitions(r, topic, p, settings, budget_s, owner, linger_ms).get(p, (0, False))


LEASE_POLL_S = 0.01
"""Seconds between two tries of :func:`apply_here` at a partition another process leases."""


def apply_here(r: Client, topic: TopicConfig, partitions: list[int], settings: Settings,
               timeout: float) -> int:
    """Drain ``partitions`` in this process with the workers' code (the in-process mode of
    :meth:`sow_redis.client.Sow.handoff`, and the bookmark store): each is applied until its
    log is drained; while another process holds a partition's lease it retries every
    :data:`LEASE_POLL_S` seconds, at most ``timeout`` seconds in all.

    Returns:
        The number of log entries applied.

    Raises:
        WaitTimeout: a partition stayed leased by another process for ``timeout`` seconds
            (its entries stay in the log and will be applied).
    """
    deadline = time.monotonic() + timeout
    applied = 0
    for p in partitions:
        while True:
            n, drained = drain_partition(r, topic, p, settings, budget_s=3600, linger_ms=0)
            applied += n
            if drained:
                break
            if n == 0:  # the lease is another process's
                if time.monotonic() >= deadline:
                    raise WaitTimeout(
                        f"topic {topic.name}: partition {p} stayed leased by another process "
                        f"for {timeout:g} s; its entries stay in the log")
                time.sleep(LEASE_POLL_S)
    return applied


def _trim(r: Client, topic: TopicConfig, p: int, settings: Settings) -> None:
    """Drop applied log entries once the stream is longer than ``log_max_len``. A transient
    topic's log is what its SOW is rebuilt from: only its applied entries older than its
    ``log_retention`` go (none without one)."""
    log_key = keys.log(topic.name, p)
    if topic.transient:
        if topic.log_retention_ms:
            sec, usec = r.time()
            cutoff = int(sec) * 1000 + int(usec) // 1000 - topic.log_retention_ms
            cursor = parse(read_cursor(r, topic.name, p))
            upto = min(cursor, (max(cutoff, 0), 0))
            r.xtrim(log_key, minid="%d-%d" % upto, approximate=False)
        return
    if r.xlen(log_key) > settings.log_max_len:
        # LIMIT 0: no cap on the entries one call removes (Redis caps "~" trims otherwise)
        r.xtrim(log_key, minid=read_cursor(r, topic.name, p), approximate=True, limit=0)


OOM_PAUSE_S = 0.5
"""Seconds an ingest job that met an out-of-memory refusal waits before it ends (the worker
would otherwise run the next job into the same refusal at once)."""


def ingest_job(topic: str, partition: int) -> int:
    """rq job: apply one partition (and a fair share of its topic's free partitions) for a
    bounded time, then re-enqueue or retire each. A job whose partition's marker names
    another job or a serving process is stale and ends at once (see the module docstring).

    Returns:
        Log entries consumed by this job.
    """
    # start-up time: rq loads only in a worker (not with the Sow facade)
    from rq import get_current_job

    job = get_current_job()
    assert job is not None
    r = data_of(job.connection)  # the job runs on the control Redis; the data may be elsewhere
    settings = Settings.from_env()
    _scripts, cache = _tools(r)
    marker = keys.job_marker(topic, partition)
    mine = job_marker_value(job.id)
    try:
        t = cache.get(topic)
    except UnknownTopicError:
        if r.get(marker) == mine.encode():
            r.delete(marker)
        log.warning("topic %s no longer defined; job dropped", topic)
        return 0
    current = cast("bytes | None", r.get(marker))
    if current is None:  # lapsed while queued: this job answers for the partition again
        if not r.set(marker, mine, nx=True, px=settings.marker_ttl_ms):
            return 0
    elif current != mine.encode():
        log.debug("%s[%d]: job %s is stale (marker %r)", topic, partition, job.id, current)
        return 0
    else:
        r.pexpire(marker, settings.marker_ttl_ms)
    try:
        results = drain_partitions(r, t, partition, settings, adopt=True, job_id=job.id)
    except FencedError:
        log.warning("%s[%d]: lease taken over by another worker", topic, partition,
                    extra=fields("lease_lost", topic=topic, partition=partition))
        return 0
    except OutOfMemoryError as exc:
        # Redis refuses writes (maxmemory, noeviction): nothing was applied past the cursor;
        # the sweep enqueues the partition again once memory is freed (its marker then
        # stands for no job). One line per episode, and a pause instead of a busy loop.
        reporter("worker").failed(exc)
        time.sleep(OOM_PAUSE_S)
        return 0
    total = 0
    for q, (done, drained) in results.items():
        total += done
        _hand_over(r, t, q, done, drained, settings)
    return total


def _hand_over(r: Client, t: TopicConfig, p: int, done: int, drained: bool,
               settings: Settings, come_back: bool = True) -> None:
    """After a job served partition ``p``: enqueue it again at the back of the queue (its
    marker now names the new job), or retire it. ``come_back``: a drained partition that
    applied entries while jobs waited in the queue is enqueued again too (a live
    publisher's entries keep coming)."""
    if not drained or (come_back and done and control_of(r).llen(QUEUE_KEY)):
        # the budget ran out, it gave way to another topic's job, or it left its partition
        # for the jobs waiting in the queue while entries kept coming: come back after them
        job_id = new_job_id()
        # the marker was this job's; one that lapsed may name a job enqueued since: drop it
        _set_marker(r, t.name, p, job_marker_value(job_id), settings.queued_marker_ttl_ms)
        enqueue_job(r, t.name, p, job_id=job_id)
        return
    drop_markers(r, t.name, [p])
    # entries appended after our last read but before the marker went away
    if p in lagging_partitions(r, t):
        ensure_jobs(r, t.name, [p], settings)
