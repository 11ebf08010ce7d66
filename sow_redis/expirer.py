"""The expirer: SOW message expiration, dead letters and idle topics (ARCHITECTURE §5).

For every topic whose expiration is enabled (a duration or ``"enabled"``; seeds/004 "SOW
Message Expiration"), each pass calls ``expire.lua`` on every partition in one pipeline: due
records are removed with delete processing and a ``sow_delete`` event with reason ``expired``.
The pass then sleeps until the earliest next due time (Redis server clock), at most
``IDLE_MAX_S``. A new due time wakes it earlier: it listens to the live channels of the
topics it serves (the change block every apply call publishes, :mod:`sow_redis.feed.live`)
and reads the expiry times the block's changes set (:func:`sow_redis.model.events.due_times`), so
a record published with a lifetime shorter than the sleep is still removed when it falls
due. With nothing to expire and nothing published it makes one pass a second (it polled
every 10 ms before: 7-11 % of a core with nothing to do, issue 27). Any number of expirers
may run: each ``expire.lua`` call is atomic. Records overdue at startup expire on the first pass (seeds/000,
"Recovery and Expiration"); a topic with expiration disabled is never processed.

Expired records of a topic with ``dead_letter`` are queued in the partition's outbox by the same
Lua call and forwarded here to the dead-letter topic as
``{"sow_key", "topic", "expiry_ms", "reason": "expired", "data"}`` (RabbitMQ dead-letter
exchange, seeds/001). A topic with ``idle_expiration`` that had no publish, query or subscriber
for that long is removed with all its records (RabbitMQ queue TTL ``x-expires``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import cast

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import keys
from .apply.scripts import Scripts
from .client import Sow
from .connection import Client, StreamEntry, connect_pair, server_ms
from .errors import UnknownTopicError
from .feed.live import ShardListener, topic_subscribers
from .logs import fields
from .model import events
from .model.topic import TopicConfig
from .outage import connect_through_outage, reporter
from .publish.append import append
from .registry import TopicCache
from .settings import Settings
from .stopping import StopEvent, stop_on_signals

log = logging.getLogger(__name__)

POLL_MAX_S = 0.01
"""Longest sleep in seconds between two passes of an expirer that cannot listen to change
blocks (a client without sharded pub/sub), or that has just subscribed."""

IDLE_MAX_S = 1.0
"""Longest sleep in seconds between two passes: bounds the time until a topic newly
defined, a changed definition, or a due time written without a change block (none of
sow_redis's writers does that) is seen; one pass a second is the idle cost."""

STOP_POLL_S = 0.05
"""Longest wait in seconds on the listener before the stop flag is looked at again."""

BATCH = 1000
"""Most records one expire.lua call removes in a partition."""

IDLE_CHECK_S = 1.0
"""Seconds between two idle-topic checks."""

BACKOFF_MIN_S = 0.1
"""First pause in seconds after Redis did not answer; it doubles per failure."""

BACKOFF_MAX_S = 2.0
"""Longest pause in seconds while Redis does not answer (the expirer resumes within this
long of Redis answering again)."""


def expire_topic(r: Client, scripts: Scripts, topic: TopicConfig,
                 sow: Sow | None = None) -> tuple[int, int, int]:
    """One expire.lua call per partition, pipelined; dead letters are forwarded through
    ``sow`` (see :func:`forward_dead_letters`).

    Returns:
        ``(records expired, earliest next due ms or -1, server now ms)``.
    """
    pipe = r.pipeline(transaction=False)
    for p in range(topic.partitions):
        scripts.queue_expire(pipe, topic, p, BATCH)
    expired, next_due, now, outbox = 0, -1, 0, 0
    for n, nd, t, dead in scripts.execute(pipe):
        expired += n
        outbox += dead
        now = max(now, t)
        if nd >= 0 and (next_due < 0 or nd < next_due):
            next_due = nd
    if outbox and topic.dead_letter:
        # expired here, or by a worker before an entry logged after the due time
        forward_dead_letters(r, topic, sow)
    return expired, next_due, now


def forward_dead_letters(r: Client, topic: TopicConfig, sow: Sow | None = None) -> int:
    """Publish the outbox entries of every partition to the dead-letter topic, then drop them.

    The copies are appended to the dead-letter topic's log and handed over with
    :meth:`Sow.handoff <sow_redis.client.Sow.handoff>` of ``sow`` (a client of ``r``; default
    ``Sow(client=r)``, whose mode follows ``SOW_REDIS_URL``): applied here when it is inline,
    else enqueued for the workers (not waited for). A crash between the two steps publishes
    an entry twice, which leaves the dead-letter SOW unchanged (same SOW key, same data).
    While the dead-letter topic is not defined, the entries stay in the outbox. Returns the
    number forwarded.
    """
    if sow is None:
        sow = Sow(client=r)
    try:
        dl = sow.topic(topic.dead_letter)
    except UnknownTopicError:
        # nothing is lost: the copies wait in the outbox until the topic is defined
        log.warning("topic %s: dead_letter topic %s is not defined; expired copies kept in "
                    "the outbox", topic.name, topic.dead_letter)
        return 0
    total = 0
    for p in range(topic.partitions):
        outbox = keys.dead_letters(topic.name, p)
        entries = cast("list[StreamEntry]", r.xrange(outbox, count=BATCH))
        if not entries:
            continue
        msgs = []
        for _sid, f in entries:
            body = events.dead_letter(f[b"sow_key"].decode(), f[b"topic"].decode(),
                                      int(f[b"expiry_ms"]), f[b"data"])
            msgs.append(("publish", body, f[b"sow_key"].decode() if dl.publisher_keys else None))
        res = append(r, dl, msgs)
        sow.handoff(res.definition or dl, res.last_ids)
        for rej in res.rejected:
            r.xadd(keys.errors(topic.dead_letter), {"reason": rej.reason, "detail": rej.detail,
                                                   "data": msgs[rej.position - 1][1]})
        r.xdel(outbox, *[sid for sid, _f in entries])
        total += len(entries)
    return total


def idle_topics(r: Client, topics: dict[str, TopicConfig]) -> list[str]:
    """Topics with ``idle_expiration`` unused for longer than that (no publish, query, config
    apply, or pub/sub subscriber)."""
    candidates = [t for t in topics.values() if t.idle_ms]
    if not candidates:
        return []
    now = server_ms(r)
    last = r.hmget(keys.LAST_USED, [t.name for t in candidates])
    subs = topic_subscribers(r, [t.name for t in candidates])
    out = []
    for t, used in zip(candidates, last):
        if subs[t.name] > 0:
            r.hset(keys.LAST_USED, t.name, now)
            continue
        if used is None:
            r.hset(keys.LAST_USED, t.name, now)
            continue
        if now - int(used) > t.idle_ms:  # type: ignore[operator]
            out.append(t.name)
    return out


def remove_topic(r: Client, topic: TopicConfig) -> None:
    """Delete a topic: its definition and every key it owns (records, logs, indexes, errors)."""
    pipe = r.pipeline(transaction=False)
    pipe.hdel(keys.REGISTRY, topic.name)
    pipe.hdel(keys.LAST_USED, topic.name)
    pipe.incr(keys.REGISTRY_VERSION)
    for k in keys.all_partition_keys(topic.name, topic.partitions, topic.n_indexes,
                                     len(topic.index)):
        pipe.delete(k)
    pipe.execute()
    r.publish(keys.channel(topic.name), events.topic_removed(topic.name))


class Expirer:
    """``loop()`` does one pass over the topics; ``run()`` repeats it until :meth:`stop`.

    Args:
        topics: names of the topics this expirer serves (default: every topic in the
            registry). Operators can dedicate expirers to busy topics this way.
        inline: apply the forwarded dead letters in this process (as ``Sow(inline=…)``);
            default: True when ``settings.redis_url`` is ``memory://``, else workers apply
            them.

    Raises:
        ValueError: ``inline=False`` with a ``memory://`` URL (see :class:`Sow`).
    """

    def __init__(self, r: Client, settings: Settings | None = None,
                 topics: Iterable[str] | None = None, inline: bool | None = None) -> None:
        self.r = r
        self.settings = settings or Settings.from_env()
        self.sow = Sow(client=r, settings=self.settings, inline=inline)
        self.only = frozenset(topics) if topics else None
        self.scripts = Scripts(r)
        self.cache = TopicCache(r)
        self._stop = StopEvent()
        self._next_idle_check = 0.0
        self._listener: ShardListener | None = None
        self._channels: frozenset[str] = frozenset()
        self._expiring: list[TopicConfig] = []
        self._skew_s = time.monotonic() - time.time()
        """This process's monotonic clock minus the Redis server clock, in seconds (from
        the server time of the last pass; local time until then)."""

    def loop(self) -> tuple[int, float]:
        """One pass. Returns ``(records expired, seconds until the next due record)``."""
        topics = self.cache.all()
        if self.only is not None:
            topics = {n: t for n, t in topics.items() if n in self.only}
        expired, wait_s = 0, IDLE_MAX_S
        self._expiring = [t for t in topics.values() if t.expiration_enabled]
        for t in self._expiring:
            started = time.monotonic()
            n, next_due, now = expire_topic(self.r, self.scripts, t, self.sow)
            if now > 0:
                self._skew_s = time.monotonic() - now / 1000
            expired += n
            if n:
                log.info("expired %d record(s) of %s", n, t.name, extra=fields(
                    "expired", topic=t.name, count=n,
                    pass_ms=round((time.monotonic() - started) * 1000, 1)))
            if next_due >= 0:
                wait_s = min(wait_s, max(0.0, (next_due - now) / 1000))
        if time.monotonic() >= self._next_idle_check:
            self._next_idle_check = time.monotonic() + IDLE_CHECK_S
            for name in idle_topics(self.r, topics):
                log.warning("topic %s idle for longer than idle_expiration: removed", name)
                remove_topic(self.r, topics[name])
        return expired, (0.0 if expired else wait_s)

    def run(self, burst: bool = False) -> int:
        """Run passes until stopped (``burst``: until nothing is due now). Returns expired.

        While Redis does not answer (connection refused or lost, timeouts, AOF loading after
        a restart) it waits ``BACKOFF_MIN_S`` doubling to ``BACKOFF_MAX_S`` seconds between
        passes and never exits; other errors propagate (``up`` restarts the process). With
        ``burst`` (a one-shot command, like ``worker --burst``) a Redis that does not answer,
        or refuses the password, is raised at once.

        Raises:
            redis.exceptions.ConnectionError, TimeoutError: with ``burst`` only.
        """
        total, pause = 0, 0.0
        outage = reporter("expirer")
        while not self._stop.is_set():
            try:
                n, wait_s = self.loop()
                outage.answered()
                total += n
                if burst and n == 0:
                    break
                pause = 0.0
                if wait_s > 0:
                    self._sleep(wait_s)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                if burst:
                    raise
                self._close_listener()
                pause = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, pause * 2))
                outage.failed(exc)  # one line per outage, not per retry
                self._stop.wait(pause)
        self._close_listener()
        return total

    def _sleep(self, wait_s: float) -> None:
        """Sleep ``wait_s`` seconds (until the earliest due time, or :data:`IDLE_MAX_S`), or
        until an expiry time read from a change block of a served topic, if earlier.
        Without a listener (a client that cannot subscribe), sleep at most
        :data:`POLL_MAX_S`."""
        listener, fresh = self._listen()
        if not self._channels:  # no topic with expiration: nothing can become due
            self._stop.wait(wait_s)
            return
        if listener is None or fresh:
            # no listener: poll; a new one: a block sent before it subscribed was missed,
            # so pass once more before sleeping long
            self._stop.wait(min(wait_s, POLL_MAX_S))
            return
        deadline = time.monotonic() + wait_s
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            raw = listener.get(min(left, STOP_POLL_S))
            if raw is None:
                continue
            for due_ms in events.due_times(raw):  # server clock → monotonic clock
                deadline = min(deadline, due_ms / 1000 + self._skew_s)

    def _listen(self) -> tuple[ShardListener | None, bool]:
        """The listener on the live channels of every partition of the topics with
        expiration (:meth:`loop` lists them), subscribed again when that list changed;
        and whether it is new."""
        channels = frozenset(keys.partition_channel(t.name, p) for t in self._expiring
                             for p in range(t.partitions))
        if channels == self._channels:
            return self._listener, False
        self._close_listener()
        self._channels = channels
        if not channels:
            return None, False
        try:
            self._listener = ShardListener(self.r, sorted(channels))
        except (RedisConnectionError, RedisTimeoutError):
            raise
        except Exception as exc:  # e.g. a client without sharded pub/sub: poll instead
            log.warning("expirer: cannot listen to change blocks (%s); polling every %g s",
                        exc, POLL_MAX_S)
            self._listener = None
        return self._listener, True

    def _close_listener(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._channels = frozenset()

    def stop(self) -> None:
        self._stop.set()


def run_expirer(settings: Settings, burst: bool = False,
                topics: Iterable[str] | None = None) -> int:
    """The ``sow-redis expirer`` process (``topics``: serve only these); stops on SIGINT/SIGTERM.

    Returns the number of records expired. Started while Redis (or the Redis Cluster node of
    the URL) is down, it waits for it (reported once), except with ``burst``.

    Raises:
        redis.exceptions.ConnectionError: with ``burst``, Redis does not answer at start.
    """
    def connect() -> Client:
        return connect_pair(settings.redis_url, settings.control_url, required=False)

    if burst:
        r = connect()
    else:
        starting = StopEvent()
        stop_on_signals(starting)
        up = connect_through_outage(connect, starting, "expirer")
        if up is None:
            return 0
        r = up
    exp = Expirer(r, settings, topics)
    stop_on_signals(exp._stop)
    return exp.run(burst=burst)
