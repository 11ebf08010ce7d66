"""Change events, change blocks and dead-letter copies: the one Python definition of their
formats (the Lua side: ``sow_redis/apply/lua/include/event.lua``).

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
     op, sow_key, seq, id, reason, expiry_ms, data, previous,     # one change: 8 fields
     op, sow_key, seq, id, reason, expiry_ms, data, previous, …]

* ``first`` … ``last``: the partition's change sequence numbers (``seq``) of the block's
  changes. Every change moves its partition's ``seq`` by one, so a partition's consecutive
  blocks have ``first`` = previous ``last`` + 1: a reader that sees a larger ``first`` missed a
  block and reads it from the change feed. ``ms``: server time of the call (ms since epoch).
* ``op``: ``publish`` | ``delta_publish`` (``data`` is the merged record) | ``sow_delete`` (a
  removal; ``reason`` ``deleted`` by a sow_delete, or ``expired``; ``data`` is the removed
  record); ``reason`` is ``""`` for the others. ``id``: the log entry that caused the change
  (for an expiry, the entry that last wrote the record); ``expiry_ms``: the record's expiry in
  ms since the epoch on the Redis server clock, 0 = none; ``data``: the record's JSON text.
* ``previous``: on a topic with ``change_previous = true``, the record's JSON text before a
  ``publish`` or ``delta_publish`` (``null`` when there was no record; as stored, with the
  record's header ``<seq>:<expiry ms>:<stream id>`` and a newline before the JSON, when it
  was read from the SOW: a copy fewer in Lua; the reader strips it), so a subscriber that
  joined late still knows what changed (exact out-of-focus notices, deltas); on a topic that
  keeps history, where every change is retained for the window, only what differs, as a
  reverse delta ``~[{members before}, [names absent before]]`` (top-level members, copied
  as their stored text), from which :func:`parse_block` rebuilds the previous record; ``""``
  otherwise, and on a removal, whose ``data`` is the removed record. A block written before
  ``previous`` existed has 7 fields per change; :func:`parse_block` reads both (the width is
  the block's field count over its ``last - first + 1`` changes).

:func:`parse_block` decodes either encoding into a :class:`ChangeBlock` of
:class:`ChangeEvent` dicts (``data`` decoded). Whatever bytes a record or key holds, every
block that Lua wrote decodes: a change whose SOW key or data cannot be decoded (not UTF-8, not
a JSON object, NaN text, nested deeper than the JSON decoder goes) becomes an event with
``error`` (what could not be decoded) and ``data`` None, so a reader accounts for its ``seq``,
reports it and goes on. An expiry beyond any clock reads as
:data:`sow_redis.model.expiry.MAX_EXPIRY_MS`. The change feed keeps blocks for the topic's
``change_retention`` (age and count per partition, defaults 1 h and 100,000 changes): the
oldest blocks are trimmed as new ones come (by count at every block, keeping whole blocks down
to the one holding the oldest change to keep, so a block of more changes than the count stays;
by age each time the partition's sequence crosses a multiple of 64). A block's time is also indexed in
``{sow:<topic>:<p>}:changes:t`` (ZSET first seq → ms).

The expirer publishes one more message when it removes an idle topic (``idle_expiration``):
``{"topic": …, "op": "topic_removed", "reason": "idle_expiration"}`` (:func:`topic_removed`).

A **dead-letter copy** of an expired record (RabbitMQ dead-letter exchange, seeds/001) is
published to the topic's ``dead_letter`` topic as :func:`dead_letter`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from itertools import count, repeat
from typing import Any, TypedDict

import msgpack
import orjson

from .expiry import MAX_EXPIRY_MS, expiry_of
from .values import JSON, JSONObject

OPS = ("publish", "delta_publish", "sow_delete")
"""``op`` of a change event."""

_OPS = frozenset(OPS)

REASONS = ("deleted", "expired")
"""``reason`` of a removal (``sow_delete`` event)."""


class ChangeEvent(TypedDict, total=False):
    """One change (see the module docstring). :func:`events_of` adds ``topic`` and
    ``partition`` from its block; ``reason`` only on removals; ``previous`` only where the
    topic records it (``change_previous``; None: there was no record before) and it decodes
    to a JSON object; ``error`` only on a change that cannot be decoded (``data`` is None then, ``sow_key`` the key with its undecodable
    bytes shown as ``\\xNN``)."""

    topic: str
    partition: int
    op: str
    sow_key: str
    seq: int
    id: str
    reason: str
    expiry_ms: int
    data: JSONObject | None
    previous: JSONObject | None
    error: str


class ChangeBlock(TypedDict):
    """The changes of one atomic call in one partition (see the module docstring)."""

    topic: str
    partition: int
    first: int
    last: int
    ms: int
    events: list[ChangeEvent]


EVENT_WIDTH = 8
"""Fields per change in a block (7 in blocks written before ``previous``; see
:func:`_width`)."""

_WIDTHS = (EVENT_WIDTH, 7)


def _width(arr: list[JSON]) -> int:
    """Fields per change of a block: its field count over its ``last - first + 1`` changes
    (8, or 7 for a block written before ``previous``); 0 when it is not a change block."""
    first, last = arr[2], arr[3]
    if type(first) is not int or type(last) is not int or last < first:
        return 0
    fields, count = len(arr) - 5, last - first + 1
    width = fields // count
    return width if width in _WIDTHS and width * count == fields else 0


def _previous(raw: object, data: JSONObject) -> tuple[bool, JSONObject | None]:
    """``(recorded, previous record)`` of a change's ``previous`` field, the change's record
    being ``data``: ``null``, a JSON object (after the stored record's header and newline,
    when it has them), or a reverse delta (``~[{members before},
    [names absent before]]``, written for a topic that keeps history:
    apply/lua/include/reverse_delta.lua), from which the previous record is ``data`` without
    the names absent before, with the members before; not recorded for ``""`` or anything
    else."""
    if not raw or not isinstance(raw, (str, bytes)):
        return False, None
    if raw[:1].isdigit():  # the stored record, "<header>\n<JSON>": the JSON
        cut = raw.find("\n") if isinstance(raw, str) else raw.find(b"\n")
        if cut < 0:
            return False, None
        raw = raw[cut + 1:]
    if raw[:1] in ("~", b"~"):
        return _undone(raw[1:], data)
    try:
        obj = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        return False, None
    if obj is None or type(obj) is dict:
        return True, obj
    return False, None


def _undone(raw: str | bytes, data: JSONObject) -> tuple[bool, JSONObject | None]:
    """``(recorded, previous record)`` of a reverse delta's JSON (see :func:`_previous`):
    not recorded when it is not ``[object, [text, …]]``."""
    try:
        delta = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        return False, None
    if not (type(delta) is list and len(delta) == 2 and type(delta[0]) is dict
            and type(delta[1]) is list and all(type(k) is str for k in delta[1])):
        return False, None
    absent = set(delta[1])
    before = {k: v for k, v in data.items() if k not in absent}
    before.update(delta[0])
    return True, before


def _unpack(raw: bytes) -> object:
    """The block's array; strings that are not UTF-8 keep their bytes as lone surrogates
    (``surrogateescape``) for :func:`_change` to report."""
    if raw[:1] != b"[":
        return msgpack.unpackb(raw, raw=False, unicode_errors="surrogateescape")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:  # memory://: cjson copies a string's bytes as they are
        return json.loads(raw.decode("utf-8", "surrogateescape"))


def _text(value: object) -> str:
    """A field as text: bytes (a MessagePack bin) decoded keeping bad bytes as surrogates."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value if isinstance(value, str) else str(value)


def _shown(text: str) -> str:
    """Text with any undecodable byte shown as ``\\xNN`` (printable, encodable)."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _change(fields: Sequence[object], seq: int) -> ChangeEvent:
    """One change of a block, ``seq`` its position (the block's first + index)."""
    op, key, _seq, sid, reason, expiry, data = fields[:7]
    ev: ChangeEvent = {"op": _text(op), "seq": _seq if type(_seq) is int else seq,
                       "id": _text(sid), "expiry_ms": expiry_of(expiry)}
    if reason:
        ev["reason"] = _text(reason)
    if ev["op"] not in OPS:
        ev["sow_key"], ev["data"] = _shown(_text(key)), None
        ev["error"] = f"unknown op {_shown(ev['op'])[:40]!r}"
        return ev
    ev.update(decode_change(_text(key), data))
    return ev


def decode_change(sow_key: str, data: object) -> ChangeEvent:
    """``sow_key`` and ``data`` (JSON object text, str or bytes) of a change or a stored record,
    decoded as a reader can use them: ``{"sow_key", "data"}``, or with ``error`` (what cannot
    be decoded; ``data`` None, undecodable key bytes shown as ``\\xNN``). A key read with
    ``surrogateescape`` (as :func:`sow_redis.model.records.decode` does) is checked here."""
    ev: ChangeEvent = {"sow_key": sow_key, "data": None}
    if not sow_key.isascii() and not _is_utf8(sow_key):
        ev["sow_key"], ev["error"] = _shown(sow_key), "the SOW key is not UTF-8"
        return ev
    try:
        obj = orjson.loads(data if isinstance(data, (bytes, str)) else b"")
    except orjson.JSONDecodeError as exc:
        ev["error"] = ("the data is not UTF-8" if not _is_utf8(_text(data))
                       else f"the data is not JSON the reader can decode ({exc})")
        return ev
    if isinstance(obj, dict):
        ev["data"] = obj
    else:
        ev["error"] = f"the data is a JSON {type(obj).__name__}, not an object"
    return ev


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def parse_block(raw: bytes) -> ChangeBlock:
    """Decode one change block (MessagePack, or JSON on ``memory://``) as published on a
    topic's channel or kept in its change feed. A change that cannot be decoded is an event
    with ``error`` (see the module docstring); it never fails the block.

    Raises:
        ValueError: not a change block (e.g. a ``topic_removed`` message, or bytes no
            sow_redis script wrote).
    """
    try:
        arr = _unpack(raw)
    except Exception as exc:
        raise ValueError(f"not a change block: {exc}") from None
    if not isinstance(arr, list) or len(arr) <= 5 or not (width := _width(arr)):
        raise ValueError("not a change block")
    topic, partition, first, last, ms = arr[:5]
    if not isinstance(topic, (str, bytes)) or not all(
            type(x) is int for x in (partition, first, last, ms)):
        raise ValueError("not a change block: bad header")
    topic = _shown(_text(topic))
    events: list[ChangeEvent] = []
    append, loads, max_expiry = events.append, orjson.loads, MAX_EXPIRY_MS
    fields = iter(arr[5:])  # one change per step, as a tuple (no slice, no index)
    columns = [fields] * width if width == EVENT_WIDTH else [fields] * width + [repeat("")]
    for op, key, seq, sid, reason, expiry, data, prev in zip(*columns):
        try:  # the common case, inline (a subscriber decodes every change)
            if op not in _OPS or not key.isascii():
                raise ValueError
            obj = loads(data)
            if type(obj) is not dict:
                raise ValueError
        except (ValueError, AttributeError, TypeError):  # JSONDecodeError is a ValueError
            ev = _change((op, key, seq, sid, reason, expiry, data), first + len(events))
            ev["topic"], ev["partition"] = topic, partition
            decoded = ev.get("data")
            if prev and decoded is not None:  # decoded after all (a non-ASCII key)
                recorded, previous = _previous(prev, decoded)
                if recorded:
                    ev["previous"] = previous
            append(ev)
            continue
        ev = {"topic": topic, "partition": partition, "op": op, "sow_key": key,
              "seq": seq if type(seq) is int else first + len(events), "id": sid,
              "expiry_ms": expiry if type(expiry) is int and 0 <= expiry <= max_expiry
              else expiry_of(expiry), "data": obj}
        if reason:
            ev["reason"] = reason
        if prev:  # "" when not recorded (and in a block of 7 fields per change)
            recorded, previous = _previous(prev, obj)
            if recorded:
                ev["previous"] = previous
        append(ev)
    return {"topic": topic, "partition": partition, "first": first, "last": last, "ms": ms,
            "events": events}


PlainBlock = tuple[int, int, int, list[tuple[str, JSONObject | None]]]
"""What :func:`plain_changes` gives: ``(partition, first, last, changes)``."""


def plain_changes(raw: bytes, decode: Callable[[str | bytes], Any] | None = None
                  ) -> PlainBlock | None:
    """The changes of a change block as ``(partition, first, last, [(sow_key, record), …])``
    (``record`` None for a removal: a ``sow_delete``, deleted or expired), when
    :func:`parse_block` decodes every change of it the common way (no ``error``) and their
    seqs are ``first`` … ``last`` in order; None for any other block or message (decode it
    with :func:`parse_block`, which says what is wrong). Cheaper than :func:`parse_block`:
    no dict per change, and the ids, expiries, reasons and previous records are not kept
    (a removal's record is decoded, as :func:`parse_block` does, only to be checked): for
    a reader of every change that needs none of those, the deriver.

    ``decode`` (default: ``orjson.loads`` and a test that it gave a dict) decodes each
    record; it raises ValueError (or RecursionError) for one that is no JSON object, and the
    block is then None (a view's deriver decodes only the fields its projection reads:
    :attr:`sow_redis.model.aggregate.Aggregation.decode_inputs`)."""
    try:
        arr = _unpack(raw)
    except Exception:
        return None
    if not isinstance(arr, list) or len(arr) <= 5 or not (width := _width(arr)):
        return None
    topic, partition, first, last, ms = arr[:5]
    if not isinstance(topic, (str, bytes)) or not all(
            type(x) is int for x in (partition, first, last, ms)):
        return None
    _shown(_text(topic))  # raises where parse_block raises (a surrogate no decoder made)
    out: list[tuple[str, JSONObject | None]] = []
    append, ops, max_expiry = out.append, _OPS, MAX_EXPIRY_MS
    loads = orjson.loads if decode is None else decode
    for op, key, seq, expiry, data, at in zip(arr[5::width], arr[6::width], arr[7::width],
                                              arr[10::width], arr[11::width], count(first)):
        if seq != at or type(expiry) is not int or not 0 <= expiry <= max_expiry:
            return None  # parse_block reads these otherwise
        try:  # parse_block's common case (anything else: it says what is wrong)
            if op not in ops or not key.isascii():
                return None
            obj = loads(data)
        except (ValueError, AttributeError, TypeError, RecursionError):  # JSONDecodeError,
            return None  # msgspec's errors, UnicodeError: ValueErrors
        if decode is None and type(obj) is not dict:
            return None
        append((key, None if op == "sow_delete" else obj))
    return partition, first, last, out


def due_times(raw: bytes) -> list[int]:
    """The expiry times (ms since the epoch, server clock) that the changes of one change
    block set: those of its ``publish`` and ``delta_publish`` events with an expiry; [] for
    a block without any and for other messages. Cheaper than :func:`parse_block` (the
    records' JSON is not decoded): the expirer reads every block of the topics it serves."""
    try:
        arr = orjson.loads(raw) if raw[:1] == b"[" else msgpack.unpackb(raw, raw=False)
    except Exception:
        return []
    if not isinstance(arr, list) or len(arr) <= 5 or not (width := _width(arr)):
        return []
    return [int(arr[i + 5]) for i in range(5, len(arr), width)
            if arr[i] != "sow_delete" and int(arr[i + 5]) > 0]


def events_of(raw: bytes) -> list[ChangeEvent]:
    """The events of a change block; [] for other messages on the channel
    (``topic_removed``)."""
    try:
        return parse_block(raw)["events"]
    except ValueError:
        return []


def topic_migrating(topic: str) -> bytes:
    """The notice a shape migration sends on each of the topic's old partition channels when
    it begins (:mod:`sow_redis.migrate`): JSON ``{"topic", "op": "topic_migrating"}``."""
    return orjson.dumps({"topic": topic, "op": "topic_migrating"})


def notice_op(raw: bytes) -> str | None:
    """The ``op`` of a topic notice (:func:`topic_removed`, :func:`topic_migrating`) on a
    topic's channels; None for anything else."""
    if raw[:1] != b"{":
        return None
    try:
        msg = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    op = msg.get("op") if isinstance(msg, dict) else None
    return op if op in ("topic_removed", "topic_migrating") else None


def topic_removed(topic: str) -> bytes:
    """The event published when the expirer removes an idle topic."""
    return orjson.dumps({"topic": topic, "op": "topic_removed", "reason": "idle_expiration"})


def dead_letter(sow_key: str, topic: str, expiry_ms: int, data: bytes) -> bytes:
    """The message published to the dead-letter topic for an expired record:
    ``{"sow_key", "topic", "expiry_ms", "reason": "expired", "data"}`` (``data``: the record's
    JSON text, embedded as it is)."""
    return orjson.dumps({"sow_key": sow_key, "topic": topic, "expiry_ms": expiry_ms,
                         "reason": "expired", "data": orjson.Fragment(data)})
