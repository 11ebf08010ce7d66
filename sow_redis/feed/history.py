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
reads about what a current query reads. Read in pages (``page_size``: a query in batches),
each partition is copied in Redis with its seq and the copy scanned
(:mod:`sow_redis.feed.snapshot`): the client then holds a page, the states before the
partition's changes since ``P`` and the SOW keys given so far, not the partition.
:func:`sow_redis.query.sow.query` filters, orders and pages the result like any query
(``source``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import orjson
from redis.exceptions import RedisError

from .. import keys
from ..connection import Client, StreamEntry
from ..errors import BookmarkError
from ..model.events import ChangeEvent, parse_block
from ..model.records import Record
from ..model.records import decode as decode_record
from ..model.topic import TopicConfig
from .changes import RESYNC_HINT, blocks_after, resolve
from .snapshot import copy_records, scan_page, snapshot_name


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
                  at_ms: int | None = None, page_size: int | None = None) -> Iterator[Record]:
    """The records of every partition as they were at ``position`` (see the module
    docstring). A record restored from a change carries that change's seq minus one and
    log stream id; its expiry when the change is its removal, else none (a publish's change
    does not hold the expiry of the record it replaced, which was not due: a due record is
    removed, with its own change, before a publish replaces it).

    A record due at the point (expiry in ms at or before ``at_ms``, the point's time; by
    default the time of the partition's change at ``position``) is left out, as a query at
    that moment would have left it out although the expirer had not removed it yet.

    ``page_size``: read each partition from a copy made in Redis, about that many records at
    a time (see the module docstring), instead of whole; where Redis refuses the copy, the
    partition is read whole. A copy gone before its scan ends (deleted by another client, or
    unread for :data:`~sow_redis.feed.snapshot.SNAPSHOT_TTL_MS`) is followed by the partition
    read whole, its records not given yet: the result is the same.

    Raises:
        FeedGap: the change feed no longer holds a change after ``position`` (trimmed while
            the query ran).
    """
    for p, at in enumerate(position):
        cutoff = _change_ms(r, topic, p, at) if at_ms is None else at_ms
        for rec in _partition_as_of(r, topic, p, at, page_size):
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


def _partition_as_of(r: Client, topic: TopicConfig, p: int, at: int,
                     page_size: int | None) -> Iterator[Record]:
    if page_size is not None:
        copy = snapshot_name(topic.name, p)
        copied = copy_records(r, topic.name, p, copy)
        if copied is not None:
            try:
                yield from _paged_as_of(r, topic, p, at, page_size, copy, *copied)
            finally:
                try:
                    r.delete(copy)
                except RedisError:
                    pass  # its lifetime removes it
            return
    now, raw = _read_whole(r, topic, p)
    before = _states_before(r, topic, p, at, now)
    for k, v in raw.items():
        if _key(k) not in before:
            yield decode_record(k, v, lenient=True)
    for rec in before.values():
        if rec is not None:
            yield rec


def _paged_as_of(r: Client, topic: TopicConfig, p: int, at: int, size: int, copy: str,
                 now: int, made: bool) -> Iterator[Record]:
    """Partition ``p`` as of ``at`` from ``copy`` (its records at seq ``now``; ``made``: there
    were records to copy), in pages of about ``size``."""
    before = _states_before(r, topic, p, at, now)
    given: set[str] = set()  # HSCAN may return a record twice; the copy may go
    cursor = 0
    while made:
        cursor, page, alive = scan_page(r, copy, cursor, size)
        if not alive:  # gone: the rest from the partition read whole (the same past)
            now, page = _read_whole(r, topic, p)
            before, cursor = _states_before(r, topic, p, at, now), 0
        for k, v in page.items():
            key = _key(k)
            if key not in before and key not in given:
                given.add(key)
                yield decode_record(k, v, lenient=True)
        if cursor == 0:
            break
    for key, rec in before.items():
        if rec is not None and key not in given:
            yield rec


def _read_whole(r: Client, topic: TopicConfig, p: int) -> tuple[int, dict[bytes, bytes]]:
    """Partition ``p``'s seq and its records, read in one MULTI/EXEC (exactly as of it)."""
    pipe = r.pipeline(transaction=True)
    pipe.hget(keys.state(topic.name, p), "seq")
    pipe.hgetall(keys.records(topic.name, p))
    seq_raw, raw = pipe.execute()
    return int(seq_raw or 0), raw


def _states_before(r: Client, topic: TopicConfig, p: int, at: int,
                   now: int) -> dict[str, Record | None]:
    """Per SOW key changed in partition ``p`` after seq ``at`` up to ``now``, its record
    before the first such change (None: it did not exist)."""
    before: dict[str, Record | None] = {}
    for block in blocks_after(r, topic, p, at, now):
        for ev in block["events"]:
            if ev["seq"] <= at or ev["seq"] > now or ev["sow_key"] in before:
                continue
            before[ev["sow_key"]] = _state_before(ev)
    return before


def _key(k: bytes | str) -> str:
    return k.decode("utf-8", "surrogateescape") if isinstance(k, bytes) else k


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
