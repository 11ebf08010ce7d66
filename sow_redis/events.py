"""Change events and dead-letter copies: the one Python definition of their formats.

A **change event** is built by exactly one function, ``change_event`` in
``sow_redis/lua/include/event.lua``, inside the atomic Lua call that makes the change, and
published on the topic's pub/sub channel (:func:`sow_redis.keys.channel`)::

    {"topic": "orders", "op": "publish", "sow_key": "9f0c…", "seq": 17,
     "id": "1700000000000-0", "expiry_ms": 0, "data": {"orderId": 1, "px": 95}}

* ``op``: ``publish`` | ``delta_publish`` (``data`` is the merged record) | ``sow_delete``
  (with ``reason``: ``sow_delete`` or ``expired``; ``data`` is the removed record).
* ``seq``: the partition's change sequence; ``id``: the log entry that caused the change (for
  an expiry, the entry that last wrote the record); ``expiry_ms``: the record's expiry in ms
  since the epoch on the Redis server clock, 0 = none.

The expirer publishes one more kind when it removes an idle topic (``idle_expiration``):
``{"topic": …, "op": "topic_removed", "reason": "idle_expiration"}`` (:func:`topic_removed`).

A **dead-letter copy** of an expired record (RabbitMQ dead-letter exchange, seeds/001) is
published to the topic's ``dead_letter`` topic as :func:`dead_letter`.
"""

from __future__ import annotations

from typing import Any, TypedDict

import orjson

OPS = ("publish", "delta_publish", "sow_delete")
"""``op`` of a change event."""

REASONS = ("sow_delete", "expired")
"""``reason`` of a removal."""


class ChangeEvent(TypedDict, total=False):
    """A decoded change event (see the module docstring); ``reason`` only on removals."""

    topic: str
    op: str
    sow_key: str
    seq: int
    id: str
    reason: str
    expiry_ms: int
    data: dict[str, Any]


def parse_event(raw: bytes) -> ChangeEvent:
    """Decode one event as published on a topic's channel.

    Raises:
        orjson.JSONDecodeError: not JSON (never the case for events sow_redis publishes).
    """
    event: ChangeEvent = orjson.loads(raw)
    return event


def topic_removed(topic: str) -> bytes:
    """The event published when the expirer removes an idle topic."""
    return orjson.dumps({"topic": topic, "op": "topic_removed", "reason": "idle_expiration"})


def dead_letter(sow_key: str, topic: str, expiry_ms: int, data: bytes) -> bytes:
    """The message published to the dead-letter topic for an expired record:
    ``{"sow_key", "topic", "expiry_ms", "reason": "expired", "data"}`` (``data``: the record's
    JSON text, embedded as it is)."""
    return orjson.dumps({"sow_key": sow_key, "topic": topic, "expiry_ms": expiry_ms,
                         "reason": "expired", "data": orjson.Fragment(data)})
