"""A topic's last use, recorded by its publishers (and queries) for ``idle_expiration``."""

from __future__ import annotations

import math
import time

from redis.exceptions import OutOfMemoryError

from .. import keys
from ..apply.scripts import attached
from ..connection import Client, server_ms
from ..model.topic import TopicConfig
from ..streamids import ms_of

TOUCH_EVERY_S = 1.0
"""A publisher records a topic's use at most this often (seconds), or a tenth of its
``idle_expiration`` when that is shorter (:func:`touch_used`)."""


def touch(r: Client, topic: str, last_ids: dict[int, str] | None = None) -> None:
    """Record that the topic was used now (for ``idle_expiration``), in ms on the Redis server
    clock: the newest log entry id's time, or the server ``TIME``. Out of memory, nothing is
    recorded (a query still reads then)."""
    if last_ids:
        ms = max(ms_of(sid) for sid in last_ids.values())
    else:
        ms = server_ms(r)
    try:
        r.hset(keys.LAST_USED, topic, ms)
    except OutOfMemoryError:  # a query still reads when Redis is out of memory
        pass


def touch_used(r: Client, topic: TopicConfig, last_ids: dict[int, str]) -> None:
    """:func:`touch` after an append, for a topic with ``idle_expiration`` only (nothing else
    reads the time), and at most every :data:`TOUCH_EVERY_S` seconds per client and topic
    (a tenth of ``idle_expiration`` when shorter): a steady publisher spares a round trip
    per publish."""
    idle_ms = topic.idle_ms
    if not idle_ms or not last_ids:
        return
    seen: dict[str, float] = attached(r, "touched", lambda _r: {})
    now = time.monotonic()
    if now - seen.get(topic.name, -math.inf) < min(TOUCH_EVERY_S, idle_ms / 10_000):
        return
    touch(r, topic.name, last_ids)
    seen[topic.name] = now
