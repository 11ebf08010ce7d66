"""Change events, change blocks and dead-letter copies: the one Python definition of their
formats (the Lua side: ``sow_redis/lua/include/event.lua``).

Every atomic Lua call that changes records of a partition (a batch of the log applied by a
worker, an expirer pass) publishes its changes as one **change block** on the partition's sharded
pub/sub channel ``{sow:<topic>:<p>}:live`` (``SPUBLISH``; :func:`sow_redis.keys.partition_channel`),
whether or not anyone listens, and,
unless the topic sets ``change_retention = 0``, appends the same bytes to the partition's
**change feed**, the stream ``{sow:<topic>:<p>}:changes`` (:func:`sow_redis.keys.changes`),
under the stream id ``<first>-0``, field ``block``.

A block is one flat array, encoded with MessagePack (a JSON array of the same layout on the
in-process ``memory://`` backend, whose Lua has no MessagePack)::

    [topic, partition, first, last, ms,
     op, sow_key, seq, id, reason, expiry_ms, data,      # one change: 7 fields
     op, sow_key, seq, id, reason, expiry_ms, data, …]

* ``first`` … ``last``: the partition's change sequence numbers (``seq``) of the block's
  changes. Every change moves its partition's ``seq`` by one, so a partition's consecutive
  blocks have ``first`` = previous ``last`` + 1: a reader that sees a larger ``first`` missed a
  block and reads it from the change feed. ``ms``: server time of the call (ms since epoch).
* ``op``: ``publish`` | ``delta_publish`` (``data`` is the merged record) | ``sow_delete`` (a
  removal; ``reason`` ``deleted`` by a sow_delete, or ``expired``; ``data`` is the removed
  record); ``reason`` is ``""`` for the others. ``id``: the log entry that caused the change
  (for an expiry, the entry that last wrote the record); ``expiry_ms``: the record's expiry in
  ms since the epoch on the Redis server clock, 0 = none; ``data``: the record's JSON text.

:func:`parse_block` decodes either encoding into a :class:`ChangeBlock` of
:class:`ChangeEvent` dicts (``data`` decoded). The change feed keeps blocks for the topic's
``change_retention`` (age and count per partition, defaults 1 h and 100,000 changes): the
oldest blocks are trimmed as new ones come (by count at every block, by age each time the
partition's sequence crosses a multiple of 64). A block's time is also indexed in
``{sow:<topic>:<p>}:changes:t`` (ZSET first seq → ms).

The expirer publishes one more message when it removes an idle topic (``idle_expiration``):
``{"topic": …, "op": "topic_removed", "reason": "idle_expiration"}`` (:func:`topic_removed`).

A **dead-letter copy** of an expired record (RabbitMQ dead-letter exchange, seeds/001) is
published to the topic's ``dead_letter`` topic as :func:`dead_letter`.
"""

from __future__ import annotations

from typing import Any, TypedDict

import msgpack
import orjson

OPS = ("publish", "delta_publish", "sow_delete")
"""``op`` of a change event."""

REASONS = ("deleted", "expired")
"""``reason`` of a removal (``sow_delete`` event)."""


class ChangeEvent(TypedDict, total=False):
    """One change (see the module docstring). :func:`events_of` adds ``topic`` and
    ``partition`` from its block; ``reason`` only on removals."""

    topic: str
    partition: int
    op: str
    sow_key: str
    seq: int
    id: str
    reason: str
    expiry_ms: int
    data: dict[str, Any]


class ChangeBlock(TypedDict):
    """The changes of one atomic call in one partition (see the module docstring)."""

    topic: str
    partition: int
    first: int
    last: int
    ms: int
    events: list[ChangeEvent]


EVENT_WIDTH = 7
"""Fields per change in a block."""


def parse_block(raw: bytes) -> ChangeBlock:
    """Decode one change block (MessagePack, or JSON on ``memory://``) as published on a
    topic's channel or kept in its change feed.

    Raises:
        ValueError: not a change block (e.g. a ``topic_removed`` message).
    """
    try:
        arr = orjson.loads(raw) if raw[:1] == b"[" else msgpack.unpackb(raw, raw=False)
    except Exception as exc:
        raise ValueError(f"not a change block: {exc}") from None
    if not isinstance(arr, list) or len(arr) < 5 or (len(arr) - 5) % EVENT_WIDTH:
        raise ValueError("not a change block")
    topic, partition, first, last, ms = arr[:5]
    events: list[ChangeEvent] = []
    for i in range(5, len(arr), EVENT_WIDTH):
        op, key, seq, sid, reason, expiry, data = arr[i:i + EVENT_WIDTH]
        ev: ChangeEvent = {"topic": topic, "partition": partition, "op": op, "sow_key": key,
                           "seq": int(seq), "id": sid, "expiry_ms": int(expiry),
                           "data": orjson.loads(data)}
        if reason:
            ev["reason"] = reason
        events.append(ev)
    return {"topic": topic, "partition": int(partition), "first": int(first),
            "last": int(last), "ms": int(ms), "events": events}


def due_times(raw: bytes) -> list[int]:
    """The expiry times (ms since the epoch, server clock) that the changes of one change
    block set: those of its ``publish`` and ``delta_publish`` events with an expiry; [] for
    a block without any and for other messages. Cheaper than :func:`parse_block` (the
    records' JSON is not decoded): the expirer reads every block of the topics it serves."""
    try:
        arr = orjson.loads(raw) if raw[:1] == b"[" else msgpack.unpackb(raw, raw=False)
    except Exception:
        return []
    if not isinstance(arr, list) or len(arr) < 5 or (len(arr) - 5) % EVENT_WIDTH:
        return []
    return [int(arr[i + 5]) for i in range(5, len(arr), EVENT_WIDTH)
            if arr[i] != "sow_delete" and int(arr[i + 5]) > 0]


def events_of(raw: bytes) -> list[ChangeEvent]:
    """The events of a change block; [] for other messages on the channel
    (``topic_removed``)."""
    try:
        return parse_block(raw)["events"]
    except ValueError:
        return []


def topic_removed(topic: str) -> bytes:
    """The event published when the expirer removes an idle topic."""
    return orjson.dumps({"topic": topic, "op": "topic_removed", "reason": "idle_expiration"})


def dead_letter(sow_key: str, topic: str, expiry_ms: int, data: bytes) -> bytes:
    """The message published to the dead-letter topic for an expired record:
    ``{"sow_key", "topic", "expiry_ms", "reason": "expired", "data"}`` (``data``: the record's
    JSON text, embedded as it is)."""
    return orjson.dumps({"sow_key": sow_key, "topic": topic, "expiry_ms": expiry_ms,
                         "reason": "expired", "data": orjson.Fragment(data)})
