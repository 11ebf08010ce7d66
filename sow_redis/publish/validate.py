"""Validation: each item of a publish checked and turned into its log entry, or rejected with
its position and reason (AMPS User Guide ch. 7; the checks are :mod:`sow_redis.model.messages`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from ..connection import Fields
from ..errors import MessageError
from ..model.entries import make_entry
from ..model.expiry import check_expiration
from ..model.fix import to_message
from ..model.messages import encode, index_members, parse, unwrap
from ..model.topic import TopicConfig
from ..model.xml import to_message as xml_message
from .result import PublishResult, Rejected

_SCALARS = frozenset({str, int, float, bool, type(None)})

Item = tuple[str, Any, "str | None"] | tuple[str, Any, "str | None", "float | None"]
"""One message to publish: ``(cmd, message, publisher SOW key or None[, expiration seconds
or None])``. The message is any value :func:`~sow_redis.model.messages.encode` takes (bytes,
str, a JSON-encodable value such as a dict): ``Any``, since a value it cannot take is
rejected, not refused by the type."""

Positioned = tuple[int, Item]
"""An item with its position (1-based line or item number)."""

Checked = tuple[int, Fields]
"""A validated item: ``(partition, log entry fields)``."""


def prepare(topic: TopicConfig, item: Item, fix_separator: bytes | None = None,
            skip_msg_types: frozenset[str] | None = None) -> Checked | None:
    """Validate one message and build its log entry: what
    :func:`~sow_redis.publish.append.append` does to every item before it is sent (also used
    by bulk loaders that write the log themselves).

    Args:
        item: ``(cmd, message, publisher SOW key or None[, expiration seconds or None])``, as
            for :func:`~sow_redis.publish.append.append`.
        fix_separator / skip_msg_types: FIX topics (defaults: the topic's settings).

    Returns:
        ``(partition, stream fields)``; None for a FIX message of a skipped MsgType.

    Raises:
        MessageError: the message is refused, with its reason; other exceptions for inputs
            no check foresaw (:func:`~sow_redis.publish.append.append` reports them as
            ``bad_message``).
    """
    cmd, msg, sow_key = item[0], item[1], item[2]
    expiration = item[3] if len(item) > 3 else None
    data = encode(msg).strip()
    if not data:
        raise MessageError("empty", "empty message")
    text = data
    data, opts = unwrap(text)
    obj = None
    if type(msg) is dict and data is text and topic.message_type == "json" \
            and all(type(v) in _SCALARS for v in msg.values()):
        # a flat dict of JSON scalars is its own decoding: encode() accepted it (string
        # keys, integers in range, finite floats), and its text reads back equal, so it is
        # not parsed again (about a third of this function for such a message)
        obj = msg
    if topic.message_type == "xml" and not isinstance(msg, dict):  # a dict is its own form
        data, obj = xml_message(data)
    if topic.message_type == "fix":
        sep = fix_separator or topic.field_separator.encode()
        skip = frozenset(topic.skip_msg_types) if skip_msg_types is None else skip_msg_types
        converted = to_message(data, sep, skip)
        if converted is None:
            return None
        data, obj = converted
    if opts:  # envelope options override the item's; null means absent
        sow_key = opts.get("sow_key") or sow_key
        if opts.get("expiration") is not None:
            expiration = opts["expiration"]
    expiration = check_expiration(expiration)
    parsed = parse(data, topic, sow_key, obj)
    members = index_members(parsed.obj, topic, parsed.sow_key) if (
        cmd == "publish" and topic.n_indexes and parsed.sow_key) else ""
    return parsed.partition, make_entry(cmd, data, sow_key, expiration, parsed.sow_key, members)


class ReadFailed(Exception):
    """Iterating the items raised ``exc`` (the publish appends what it has, then raises
    ``exc`` again with a note)."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


class Source:
    """The items of one publish, each with its position (``start`` for the first); items a
    definition fence refused are put back in front (:meth:`put_back`) and come again marked
    as not new, so that they are validated again but counted as read once."""

    def __init__(self, items: Iterable[Item], start: int) -> None:
        self._it = iter(items)
        self._next = start
        self._back: deque[Positioned] = deque()

    def put_back(self, held: list[Positioned]) -> None:
        """Items to take again before the rest, in position order."""
        self._back.extendleft(sorted(held, key=lambda pair: pair[0], reverse=True))

    def __iter__(self) -> Iterator[tuple[int, Item, bool]]:
        return self

    def __next__(self) -> tuple[int, Item, bool]:
        """``(position, item, new)``. Raises StopIteration, or what iterating raises."""
        if self._back:
            pos, item = self._back.popleft()
            return pos, item, False
        item = next(self._it)
        pos, self._next = self._next, self._next + 1
        return pos, item, True


def validated(topic: TopicConfig, source: Source, result: PublishResult,
              fix_separator: bytes | None) -> Iterator[tuple[int, Item, Checked | None, bool]]:
    """Each item read, validated (:func:`prepare`): ``(position, item, (partition, entry) to
    append or None, new)``; None when it was rejected (added to ``result.rejected`` with its
    position: a problem no check foresaw is ``bad_message`` with the exception text) or
    skipped (counted in ``result.skipped``); ``new`` is False for an item put back after a
    definition fence (``result.read`` counts new items only).

    Raises:
        ReadFailed: iterating the items raised.
    """
    sep = fix_separator or topic.field_separator.encode()
    skip = frozenset(topic.skip_msg_types)
    while True:
        try:
            pos, item, new = next(source)
        except StopIteration:
            return
        except Exception as exc:
            raise ReadFailed(exc) from exc
        if new:
            result.read += 1
        checked: Checked | None
        try:
            checked = prepare(topic, item, sep, skip)
        except MessageError as exc:
            result.rejected.append(Rejected(pos, exc.reason, exc.detail))
            checked = None
        except Exception as exc:
            result.rejected.append(Rejected(pos, "bad_message", f"{type(exc).__name__}: {exc}"))
            checked = None
        else:
            if checked is None:
                result.skipped += 1
        yield pos, item, checked, new
