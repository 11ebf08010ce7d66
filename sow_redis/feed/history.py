"""Historical SOW: the records of a topic as they were at a point in time (issue 25.1; AMPS
SOW ``History``, "query the contents of the SOW at a particular point in time and replay
changes from that point in time", seeds/004).

A topic with ``history = { window = … }`` keeps, for at least the window, every change in
its change feed with the record's previous state (``change_previous``). The SOW at a point
``P`` (a per-partition change sequence: an ISO-8601 time, a bookmark or ``EPOCH``, resolved
by :func:`sow_redis.feed.changes.resolve`) is the current SOW with the changes after ``P``
undone: for each SOW key changed after ``P``, its first change after ``P`` tells what it was
at ``P`` (the ``previous`` state of a publish or delta_publish, ``null`` when it did not
exist; the removed record of a sow_delete). Records deleted or expired since ``P`` are
therefore in the result, and ``sow_delete`` never removes history.

The cost is the current SOW plus the changes since ``P``: an as-of query near the present
reads about what a current query reads. :func:`sow_redis.query.sow.query` filters, orders and
pages the result like any query (``source``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import orjson

from .. import keys
from ..connection import Client, StreamEntry
from ..errors import BookmarkError
from ..model.events import ChangeEvent, parse_block
from ..model.records import Record
from ..model.records import decode as decode_record
from ..model.topic import TopicConfig
from .changes import RESYNC_HINT, blocks_after, resolve


def as_of_position(r: Client, topic: TopicConfig, when: str) -> list[int]:
    """The per-partition change sequences of ``when`` (an ISO-8601 time, a bookmark string or
    ``EPOCH``) on a topic that keeps history.

    Raises:
        BookmarkError: the topic keeps no history, ``when`` is malformed or ahead of the
            topic, or older than the history holds (the message names the oldest point
            kept).
    """
    if not topic.history_ms:
        raise BookmarkError(f"topic '{topic.name}' keeps no history: an as-of query needs "
                            'history = { window = "…" } in its definition')
    if when.strip().upper() == "NOW":
        raise BookmarkError("--as-of NOW is the current SOW: query without --as-of")
    try:
        return list(resolve(r, topic, when).seqs)
    except BookmarkError as exc:  # older than the window: the message names the oldest point
        why = str(exc).removesuffix(RESYNC_HINT)
        raise BookmarkError(f"as-of {when.strip()[:80]!r}: {why}") from None


def records_as_of(r: Client, topic: TopicConfig, position: list[int],
                  at_ms: int | None = None) -> Iterator[Record]:
    """The records of every partition as they were at ``position`` (see the module
    docstring). A record restored from a change carries that change's seq minus one and
    log stream id; its expiry when the change is its removal, else none (a publish's change
    does not hold the expiry of the record it replaced, which was not due: a due record is
    removed, with its own change, before a publish replaces it).

    A record due at the point (expiry in ms at or before ``at_ms``, the point's time; by
    default the time of the partition's change at ``position``) is left out, as a query at
    that moment would have left it out although the expirer had not removed it yet.

    Raises:
        FeedGap: the change feed no longer holds a change after ``position`` (trimmed while
            the query ran).
    """
    for p, at in enumerate(position):
        cutoff = _change_ms(r, topic, p, at) if at_ms is None else at_ms
        for rec in _partition_as_of(r, topic, p, at):
            if not 0 < rec.expiry_ms <= cutoff:
                yield rec


def _change_ms(r: Client, topic: TopicConfig, p: int, seq: int) -> int:
    """Server time in ms of the call that made change ``seq`` of partition ``p`` (0 when the
    feed no longer holds it or ``seq`` is 0)."""
    if seq <= 0:
        return 0
    found = cast("list[StreamEntry]",
                 r.xrevrange(keys.changes(topic.name, p), f"{seq}-0", "-", count=1))
    for _id, fields in found:
        try:
            return int(parse_block(fields[b"block"])["ms"])
        except (ValueError, TypeError, KeyError):  # not a block: no time known
            return 0
    return 0


def _partition_as_of(r: Client, topic: TopicConfig, p: int, at: int) -> Iterator[Record]:
    pipe = r.pipeline(transaction=True)  # the records exactly as of the partition's seq
    pipe.hget(keys.state(topic.name, p), "seq")
    pipe.hgetall(keys.records(topic.name, p))
    seq_raw, raw = pipe.execute()
    now = int(seq_raw or 0)
    before: dict[str, Record | None] = {}
    for block in blocks_after(r, topic, p, at, now):
        for ev in block["events"]:
            if ev["seq"] <= at or ev["seq"] > now or ev["sow_key"] in before:
                continue
            before[ev["sow_key"]] = _state_before(ev)
    for k, v in raw.items():
        key = k.decode("utf-8", "surrogateescape") if isinstance(k, bytes) else k
        if key in before:
            continue
        yield decode_record(k, v, lenient=True)
    for rec in before.values():
        if rec is not None:
            yield rec


def _state_before(ev: ChangeEvent) -> Record | None:
    """The record a change found, from the change: None when there was none."""
    if ev["op"] == "sow_delete":
        data = ev.get("data")
    else:
        if "previous" not in ev:
            raise BookmarkError(f"change {ev['seq']} of SOW key {ev['sow_key']!r} has no "
                                "previous state (written before the topic kept history)")
        data = ev["previous"]
    if data is None:
        return None
    expiry = ev.get("expiry_ms", 0) if ev["op"] == "sow_delete" else 0
    return Record(sow_key=ev["sow_key"], seq=max(ev["seq"] - 1, 0), expiry_ms=expiry,
                  stream_id=ev.get("id", ""), data=orjson.dumps(data))
