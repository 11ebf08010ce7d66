"""Riding out a Redis outage: report it once, back off, resume (issue 12, "Redis unreachable").

While Redis does not answer (connection refused or lost, a timeout, ``LOADING`` while it reads
its AOF after a restart), every long-running component retries with a capped exponential
backoff (its own ``BACKOFF_MIN_S`` / ``BACKOFF_MAX_S``). What it logs goes through one
:class:`Outage` per component and process (:func:`reporter`): the first failure of an outage
is one WARNING line (event ``redis_unreachable``), every later failure of the same outage logs
nothing, and the first success after it is one INFO line (event ``redis_reachable``, with the
outage's length in seconds). A worker's rq loop, its sweeper thread and its jobs share the
``worker`` reporter, so a worker process writes one line per outage, not one per retry.

:func:`sow_redis.publish.retry.append_blocks` builds on :func:`call_through_outage` for a
publisher that must keep going through an outage (``sow-redis publish --retry-s``,
``Sow(retry_s=…)``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TypeVar, cast

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .logs import fields

log = logging.getLogger(__name__)

REDIS_DOWN = (RedisConnectionError, RedisTimeoutError)
"""Errors that mean Redis does not answer (``BusyLoadingError``, raised while it loads its
AOF after a restart, is a ``ConnectionError``)."""

REDIS_STUCK = (RedisConnectionError, RedisTimeoutError, OutOfMemoryError)
""":data:`REDIS_DOWN`, and Redis refusing writes for want of memory (``maxmemory`` under
``noeviction``): the processes that keep running (workers, the expirer) ride out both the
same way, with backoff, and go on by themselves when Redis answers or memory is freed."""

BACKOFF_MIN_S = 0.1
"""First pause in seconds before a publisher sends again; it doubles per failure."""

BACKOFF_MAX_S = 2.0
"""Longest pause in seconds between two attempts of a publisher."""

RETRY_CHUNK = 10_000
"""Items :func:`~sow_redis.publish.retry.append_blocks` hands to one
:func:`~sow_redis.publish.append.append` call
(the unit sent again after a failure). Each call ends by waiting for the replies of its last
chunks, so a block of one chunk (1,000) left Redis idle while the next one was validated:
``sow-redis publish`` of 100,000 flights took 6.9-7.4 s against 3.3-4.7 s with ``--retry-s 0``;
ten chunks a block gave 3.0-4.6 s (the same within this machine's noise). The price: after an
outage, up to this many messages of the block in flight are appended again."""


MEMORY_CALM_S = 5.0
"""Seconds without an out-of-memory refusal that end such an episode (see
:meth:`Outage.answered`)."""


class Outage:
    """The Redis outages one component of this process sees (thread-safe).

    Args:
        component: the name in the log lines (``worker``, ``expirer``, ``publisher``).

    Attributes:
        reported: outages reported so far (one WARNING line each).
    """

    def __init__(self, component: str) -> None:
        self.component = component
        self.reported = 0
        self._since: float | None = None
        self._last_failure = 0.0
        self._memory = False  # the outage is Redis refusing writes for want of memory
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        """Whether the last thing noted was a failure."""
        return self._since is not None

    def failed(self, exc: BaseException) -> bool:
        """Note a failure to reach Redis; the first of an outage logs one WARNING line.

        Returns:
            True when this call logged (the outage starts now).
        """
        with self._lock:
            self._last_failure = time.monotonic()
            if self._since is not None:
                return False
            self._since = self._last_failure
            self._memory = isinstance(exc, OutOfMemoryError)
            self.reported += 1
        if isinstance(exc, OutOfMemoryError):  # Redis answers, but refuses writes
            log.warning("%s: redis is out of memory (maxmemory, noeviction: %s); retrying "
                        "with backoff until memory is freed, reported once", self.component,
                        " ".join(str(exc).split()),
                        extra=fields("redis_out_of_memory", component=self.component))
            return True
        log.warning("%s: redis unreachable (%s); retrying with backoff, reported once until "
                    "it answers", self.component, " ".join(str(exc).split()),
                    extra=fields("redis_unreachable", component=self.component))
        return True

    def answered(self) -> None:
        """Note that Redis answered; after an outage, one INFO line with its length. Out of
        memory, Redis answers some writes and refuses others while the memory in use hovers
        at the limit: that episode ends only after :data:`MEMORY_CALM_S` seconds without a
        refusal."""
        with self._lock:
            if self._memory and time.monotonic() - self._last_failure < MEMORY_CALM_S:
                return
            since, self._since = self._since, None
        if since is not None:
            down_s = round(time.monotonic() - since, 1)
            log.info("%s: redis answers again after %.1f s", self.component, down_s,
                     extra=fields("redis_reachable", component=self.component, down_s=down_s))


T = TypeVar("T")

_reporters: dict[str, Outage] = {}
_reporters_lock = threading.Lock()


def reporter(component: str) -> Outage:
    """This process's :class:`Outage` of ``component`` (one per name)."""
    with _reporters_lock:
        return _reporters.setdefault(component, Outage(component))


def call_through_outage(fn: Callable[[], T], retry_s: float, component: str = "publisher") -> T:
    """``fn()``, called again while Redis does not answer (backoff :data:`BACKOFF_MIN_S`
    doubling to :data:`BACKOFF_MAX_S`; the outage reported once through :func:`reporter`
    ``component``) for up to ``retry_s`` seconds. Only for calls that may run twice (reads,
    ``SET NX``, waits).

    Raises:
        redis.exceptions.ConnectionError, TimeoutError: Redis did not answer for ``retry_s``
            seconds; whatever ``fn`` raises otherwise.
    """
    return cast(T, _retry(fn, retry_s, component, None))


def connect_through_outage(connect: Callable[[], T], stop: threading.Event,
                           component: str) -> T | None:
    """``connect()``, tried again while Redis does not answer (as :func:`call_through_outage`,
    for as long as it takes) until ``stop`` is set: for a long-running process (worker,
    expirer, deriver) started while Redis is down, or while the Redis Cluster node its URL
    names is down (a cluster client reads the slot map when it is made, so it connects then).

    Returns:
        What ``connect()`` returned; None when ``stop`` was set first.

    Raises:
        Whatever ``connect()`` raises but :data:`REDIS_DOWN` (a bad URL, a node that is no
        cluster node).
    """
    out = _retry(connect, math.inf, component, stop)
    return None if out is _STOPPED else cast(T, out)


_STOPPED = object()
"""What :func:`_retry` returns when its ``stop`` was set before ``fn`` succeeded."""


def _retry(fn: Callable[[], T], retry_s: float, component: str,
           stop: threading.Event | None) -> T | object:
    """The loop of :func:`call_through_outage` and :func:`connect_through_outage`: ``fn()``
    until it does not raise :data:`REDIS_DOWN`, for up to ``retry_s`` seconds of failures,
    pausing with backoff (on ``stop``, which ends the loop with :data:`_STOPPED`, if given);
    the outage reported once, and its end."""
    outage = reporter(component)
    since: float | None = None
    pause = BACKOFF_MIN_S
    while stop is None or not stop.is_set():
        try:
            out = fn()
        except REDIS_DOWN as exc:
            now = time.monotonic()
            since = now if since is None else since
            if now - since >= retry_s:
                raise
            outage.failed(exc)
            if stop is None:
                time.sleep(pause)
            else:
                stop.wait(pause)
            pause = min(BACKOFF_MAX_S, pause * 2)
            continue
        outage.answered()
        return out
    return _STOPPED
