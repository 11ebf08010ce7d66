"""The ``sow-redis worker`` process: an rq worker plus a sweeper thread, surviving Redis outages.

The rq worker (:class:`SowWorker`, a ``SimpleWorker``: jobs run in the worker process, no
fork per job) executes the per-partition ingest jobs of :mod:`sow_redis.apply.jobs`, so rq-dashboard
shows workers, queue and jobs. It reads jobs as JSON and runs only sow_redis's own job
functions (:mod:`sow_redis.apply.safejob`). rq owns signals while it works: SIGINT/SIGTERM finish
the current job, then exit (warm shutdown).

Failures (issue 7.7): rq quits its work loop on the first Redis connection error that is not
raised while it waits for a job. :func:`run_worker` then waits for Redis with capped
exponential backoff (``BACKOFF_MIN_S`` doubling to ``BACKOFF_MAX_S``), takes back what the
interrupted job left (:func:`sow_redis.apply.jobs.reclaim`) and starts the rq loop again, under the
same name: the name is unique per process start (``<prefix>-<host>-<pid>-<random>``), so a
registration left under it by a lost connection is this process's own and is replaced.
Registrations of dead workers (this host's processes that no longer run, or no heartbeat for
``STALE_AFTER_S``) are removed at start and by the sweeper every ``CLEAN_EVERY_S``.

The sweeper enqueues jobs for partitions with lag every ``sweep_interval_s`` seconds, with the
same backoff while Redis is unreachable; its first sweep after an outage also drops the job
markers of partitions that no one leases (their job may have died with the connection).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from datetime import UTC, datetime
from types import FrameType
from typing import Any, cast

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError
from rq import Queue, SimpleWorker
from rq.exceptions import StopRequested
from rq.utils import utcparse
from rq.worker_registration import clean_worker_registry, get_keys, register, unregister

from ..apply.jobs import HOST, LagScanner, owner_dead, sweep
from ..apply.safejob import SERIALIZER, SowJob
from ..connection import Client, Pipeline, connect_pair, control_of, server_info
from ..logs import fields
from ..outage import REDIS_STUCK, connect_through_outage, reporter
from ..settings import QUEUE_NAME, Settings
from ..stopping import StopEvent, stop_on_signals

log = logging.getLogger(__name__)

REDIS_DOWN = REDIS_STUCK
"""Errors that mean Redis does not answer (BusyLoadingError, while it loads its AOF after a
restart, is a ConnectionError), or refuses writes for want of memory (OutOfMemoryError,
``maxmemory`` under ``noeviction``: rq's heartbeat, its registries and the apply scripts are
refused): the worker waits with backoff and goes on by itself (issue 23, item 9)."""

BACKOFF_MIN_S = 0.1
"""First pause in seconds before trying an unreachable Redis again; it doubles per failure."""

BACKOFF_MAX_S = 2.0
"""Longest pause in seconds between two attempts while Redis does not answer."""

HEALTHY_S = 10.0
"""An rq loop that ran this many seconds before it quit restarts without backoff."""

WORKER_TTL_S = 60
"""rq ``worker_ttl`` in seconds: an idle worker heartbeats every ``WORKER_TTL_S - 15`` s."""

STALE_AFTER_S = 2 * WORKER_TTL_S
"""A registered worker whose last heartbeat is older than this (seconds) is dead."""

CLEAN_EVERY_S = 30.0
"""Seconds between two removals of dead workers' registrations by the sweeper."""


def worker_name(prefix: str | None = None) -> str:
    """``<prefix>-<host>-<pid>-<random>`` (prefix default ``sow``): unique per process start."""
    return f"{prefix or 'sow'}-{HOST}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def sow_queue(r: Client) -> Queue:
    """The rq queue of the ingest jobs, read as JSON into :class:`SowJob`."""
    return Queue(QUEUE_NAME, connection=r, serializer=SERIALIZER, job_class=SowJob)


def out_of_memory(r: Client) -> bool:
    """Whether Redis refuses writes for want of memory now (``used_memory`` less what
    ``maxmemory`` does not count over ``maxmemory``, under ``noeviction``); False on a
    cluster client (asked per node by the commands themselves)."""
    mem = server_info(r, "memory")
    if mem is None:  # a cluster: each primary refuses the writes it cannot take itself
        return False
    limit = int(mem.get("maxmemory", 0))
    return bool(limit) and mem.get("maxmemory_policy") == "noeviction" and (
        int(mem["used_memory"]) - int(mem.get("mem_not_counted_for_evict", 0)) > limit)


def wait_for_redis(r: Client, stop: threading.Event) -> bool:
    """Ping ``r`` until it answers and accepts writes (memory below ``maxmemory``), with
    capped exponential backoff; the outage is logged once (:func:`sow_redis.outage.reporter`
    ``worker``), not per retry.

    Returns:
        True when Redis answers; False when ``stop`` was set first.
    """
    pause = BACKOFF_MIN_S
    while not stop.is_set():
        try:
            r.ping()
            if not out_of_memory(r):
                OUTAGE.answered()
                return True
            OUTAGE.failed(OutOfMemoryError("used memory > 'maxmemory'"))
        except REDIS_DOWN as exc:
            OUTAGE.failed(exc)
        stop.wait(pause)
        pause = min(BACKOFF_MAX_S, pause * 2)
    return False


def clean_dead_workers(r: Client, keep: str | None = None) -> list[str]:
    """Remove the rq registrations of dead workers of the ``sow`` queue: a worker that
    registered its death, a process of this host that no longer runs, or a worker without a
    heartbeat for ``STALE_AFTER_S`` seconds. ``keep``: this process's own worker name.

    Returns:
        The names removed.
    """
    queue = sow_queue(r)
    now = datetime.now(UTC)
    removed = []
    for key in sorted(get_keys(queue=queue)):
        w = SimpleWorker.find_by_key(key, connection=r, serializer=SERIALIZER)
        if w is None or w.name == keep:
            continue
        death, beat, host, pid = cast("list[bytes | None]",
                                      r.hmget(key, "death", "last_heartbeat", "hostname", "pid"))
        age = (now - utcparse(beat.decode())).total_seconds() if beat else STALE_AFTER_S + 1
        local_dead = (host is not None and pid is not None
                      and owner_dead(f"{host.decode()}:{pid.decode()}:-"))
        if death is None and not local_dead and age <= STALE_AFTER_S:
            continue
        with r.pipeline() as pipe:
            unregister(w, pipe)
            pipe.delete(w.key, w.executions_key)
            pipe.execute()
        log.warning("removed the registration of dead worker %s", w.name)
        removed.append(w.name)
    clean_worker_registry(queue)
    return removed


def _noting_redis_down(name: str) -> Any:
    """A SowWorker method that calls SimpleWorker's ``name`` and notes a lost connection."""

    def method(self: SowWorker, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(SimpleWorker, name)(self, *args, **kwargs)
        except REDIS_DOWN:
            self.lost_connection = True
            raise

    method.__name__ = name
    return method


class SowWorker(SimpleWorker):
    """rq's SimpleWorker for sow_redis: JSON jobs of :class:`SowJob` only, a short reconnect
    backoff, a registration that survives a lost connection, and a stop flag shared with
    :func:`run_worker`.

    Attributes:
        lost_connection: set when the work loop quit because Redis did not answer.
        tearing_down: set when rq's work loop is over and its teardown began.
    """

    max_connection_wait_time = BACKOFF_MAX_S

    def __init__(self, *args: Any, stop: StopEvent, **kwargs: Any) -> None:
        kwargs.setdefault("serializer", SERIALIZER)
        kwargs.setdefault("job_class", SowJob)
        kwargs.setdefault("worker_ttl", WORKER_TTL_S)
        super().__init__(*args, **kwargs)
        self.stop = stop
        self.lost_connection = False
        self.tearing_down = False

    execute_job = _noting_redis_down("execute_job")
    run_maintenance_tasks = _noting_redis_down("run_maintenance_tasks")
    dequeue_job_and_maintain_ttl = _noting_redis_down("dequeue_job_and_maintain_ttl")

    def check_for_suspension(self, burst: bool) -> None:
        if self.stop.is_set():
            raise StopRequested
        try:
            super().check_for_suspension(burst)
        except REDIS_DOWN:
            self.lost_connection = True
            raise

    def register_birth(self) -> None:
        # the name is this process's own: a registration under it was left by a lost
        # connection of this process (rq would refuse to start: "active worker named …")
        self.connection.delete(self.key)
        super().register_birth()

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop.request()
        super().request_stop(signum, frame)

    def _shutdown(self) -> None:
        # rq's handler raises StopRequested when no job runs, wherever the main thread is; its
        # work loop catches it, but its teardown (in the loop's ``finally``, after the loop
        # ended by itself: a Redis timeout) does not, and neither does run_worker: a SIGTERM
        # there ended the worker with a traceback and status 1. Once the loop is over, the
        # stop flag alone ends run_worker. (rq's private method, as of rq 3.0: the test of
        # tests/test_workers.py that signals during teardown fails if rq renames it.)
        if self.tearing_down:
            return
        super()._shutdown()

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        if pipeline is not None:
            super().heartbeat(timeout, pipeline)
            return
        try:
            with self.connection.pipeline() as pipe:
                super().heartbeat(timeout, pipe)
                created = pipe.execute()[0]
            if created and self.birth_date is not None:
                # the registration was lost (a Redis restart without it): register again
                self.connection.delete(self.key)
                with self.connection.pipeline() as pipe:
                    pipe.hset(self.key, mapping=self.serialize())
                    register(self, pipe)
                    pipe.expire(self.key, self.worker_ttl + 60)
                    pipe.execute()
        except REDIS_DOWN:
            self.lost_connection = True
            raise

    def teardown(self) -> None:
        """Register death and stop the pub/sub thread, even when Redis is gone; a stop signal
        meanwhile only sets the stop flag (:meth:`_shutdown`)."""
        self.tearing_down = True
        try:
            self.register_death()
        except REDIS_DOWN as exc:
            self.lost_connection = True
            OUTAGE.failed(exc)
            log.debug("worker %s: could not register its death (%s)", self.name, exc)
        if self.pubsub_thread is not None:
            try:
                self.pubsub.unsubscribe()  # wakes the thread up
            except REDIS_DOWN:
                pass  # the thread's own reconnect loop sees the stop flag within 2 s
            self.pubsub_thread.stop()
            self.pubsub_thread.join(timeout=1)
            if not self.pubsub_thread.is_alive():
                self.pubsub.close()
            self.pubsub_thread = None


OUTAGE = reporter("worker")
"""The worker process's outage reporter: one line per Redis outage (rq loop, sweeper, jobs)."""


class _RqOutageFilter(logging.Filter):
    """Drops rq's per-retry lines about an unreachable Redis ("could not connect to Redis
    instance … retrying", "Redis connection timeout", a traceback of a connection error) and
    notes the outage in :data:`OUTAGE` instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, REDIS_DOWN):
            OUTAGE.failed(exc)
            return False
        msg = str(record.msg)
        if "could not connect to Redis instance" in msg or "Redis connection timeout" in msg:
            args = record.args if isinstance(record.args, tuple) else ()
            err = next((a for a in args if isinstance(a, BaseException)), None)
            OUTAGE.failed(err or RedisConnectionError(record.getMessage()))
            return False
        return True


def _quiet_rq_outages() -> None:
    """Route rq's outage lines through :data:`OUTAGE` (once per process)."""
    rq_log = logging.getLogger("rq.worker")
    if not any(isinstance(f, _RqOutageFilter) for f in rq_log.filters):
        rq_log.addFilter(_RqOutageFilter())


SWEEPER_JOIN_S = 10.0
"""Seconds a stopping worker waits at most for its sweeper's sweep under way to end."""


class Sweeper(threading.Thread):
    """Daemon thread: ``loop()`` sweeps once; ``run()`` repeats it until stopped. ``r``: the
    data client (carrying its control client, :func:`sow_redis.connection.connect_pair`)."""

    def __init__(self, r: Client, settings: Settings, keep: str | None = None) -> None:
        super().__init__(name="sow-sweeper", daemon=True)
        self.r, self.settings, self.keep = r, settings, keep
        self.stopped = threading.Event()
        self.recover = False
        self.scanner = LagScanner()
        self._next_clean = time.monotonic() + CLEAN_EVERY_S

    def loop(self) -> int:
        """One unit of work: enqueue jobs for every lagging partition (after an outage, also
        those whose marker may stand for a lost job); now and then remove dead workers."""
        n = sweep(self.r, self.settings, recover=self.recover, scanner=self.scanner)
        self.recover = False
        if time.monotonic() >= self._next_clean:
            self._next_clean = time.monotonic() + CLEAN_EVERY_S
            clean_dead_workers(control_of(self.r), keep=self.keep)
        return n

    def run(self) -> None:
        pause = self.settings.sweep_interval_s
        while not self.stopped.wait(pause):
            try:
                self.loop()
                pause = self.settings.sweep_interval_s
                if OUTAGE.down and not out_of_memory(control_of(self.r)):
                    OUTAGE.answered()  # reads go through out of memory: writes must, too
            except REDIS_DOWN as exc:
                pause = BACKOFF_MIN_S if not self.recover else min(BACKOFF_MAX_S, pause * 2)
                self.recover = True
                OUTAGE.failed(exc)
            except Exception:
                log.exception("sweeper failed; retrying")

    def stop(self) -> None:
        """Tell the thread to stop and wait for a sweep under way to end (at most
        :data:`SWEEPER_JOIN_S` seconds): a daemon thread inside a Redis call while Python
        finalizes is a crash risk (a worker stopped by SIGTERM once ended with SIGSEGV, exit
        status -11, in CI on 2026-11-28)."""
        self.stopped.set()
        self.join(timeout=SWEEPER_JOIN_S)




def run_worker(settings: Settings, burst: bool = False, name: str | None = None) -> bool:
    """Run one worker until stopped (or, with ``burst``, until the queue is empty).

    Survives Redis outages (see the module docstring). ``name``: prefix of the worker name.
    The rq worker runs on the control Redis (``settings.control_url``, default the data
    Redis); its jobs apply on the data Redis (``settings.redis_url``, a cluster too).

    Returns:
        True when the worker processed at least one job.

    Raises:
        redis.exceptions.ConnectionError: with ``burst``, Redis does not answer at start.
    """
    stop = StopEvent()
    stop_on_signals(stop)  # outside rq's work loop
    if burst:
        data = connect_pair(settings.redis_url, settings.control_url)
    else:  # started while Redis (or the cluster node of the URL) is down: wait for it
        up = connect_through_outage(
            lambda: connect_pair(settings.redis_url, settings.control_url), stop, "worker")
        if up is None:
            return False
        data = up
    r = control_of(data)  # rq's connection; its jobs find ``data`` from it (data_of)
    _quiet_rq_outages()
    wname = worker_name(name)
    if burst:
        r.ping()
        data.ping()
    elif not wait_for_redis(r, stop) or (data is not r and not wait_for_redis(data, stop)):
        return False
    sweeper = None
    if not burst:
        sweeper = Sweeper(connect_pair(settings.redis_url, settings.control_url), settings,
                          keep=wname)
        sweeper.start()
    # a burst worker is a one-shot command: its start and stop are DEBUG events
    lifecycle = logging.DEBUG if burst else logging.INFO
    log.log(lifecycle, "worker %s started", wname,
            extra=fields("worker_start", worker=wname, burst=burst))
    # a burst worker drains whatever lags, even behind a marker whose job is gone
    worked, pause, recover = False, BACKOFF_MIN_S, burst
    try:
        while not stop.is_set():
            started = time.monotonic()
            worker = None
            try:
                clean_dead_workers(r, keep=wname)
                sweep(data, settings, recover=recover)  # start with everything already waiting
                worker = SowWorker([sow_queue(r)], connection=r, name=wname, stop=stop)
                worked = worker.work(burst=burst, logging_level="WARNING") or worked
                down = worker.lost_connection
            except StopRequested:
                # a stop signal after rq installed its handler and before its loop's ``try``
                # (SowWorker.request_stop has set the stop flag)
                down = False
            except REDIS_DOWN as exc:
                OUTAGE.failed(exc)
                down = True
            finally:
                stop_on_signals(stop)  # outside rq's work loop
            if stop.is_set() or (worker is not None and worker._stop_requested):
                break
            if burst and not down:
                break
            # rq quit its loop (a lost connection, or an error it logged): start it again
            pause = BACKOFF_MIN_S if time.monotonic() - started >= HEALTHY_S else pause
            log.log(logging.DEBUG if down else logging.WARNING,
                    "worker %s: work loop ended; restarting in %.1f s", wname, pause)
            if stop.wait(pause) or not wait_for_redis(r, stop) or (
                    data is not r and not wait_for_redis(data, stop)):
                break
            pause = min(BACKOFF_MAX_S, pause * 2)
            recover = True
    finally:
        if sweeper is not None:
            sweeper.stop()
        log.log(lifecycle, "worker %s stopped", wname, extra=fields("worker_stop", worker=wname))
    return worked
