"""Reading a partition's change feed (``{sow:T:p}:changes``, see :mod:`sow_redis.model.events`).

Blocks are stored under the stream id ``<first seq>-0``, so the block holding any ``seq`` is
the last one whose id is at or below ``<seq>-0`` (one ``XREVRANGE … COUNT 1``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import cast

from .. import keys
from ..connection import Client, StreamEntry
from ..errors import BookmarkError
from ..model.events import ChangeBlock, parse_block
from ..model.topic import TopicConfig
from .bookmark import Bookmark

PAGE = 64
"""Blocks read per XRANGE, at most."""

PAGE_CHANGES = 1000
"""Changes one XRANGE of :func:`blocks_after` reaches: it reads the blocks that start within
the next ``PAGE_CHANGES`` changes (a block's stream id is its first seq), at most
:data:`PAGE` of them, none that starts after the last change asked for. A page so holds
about 1,000 changes (one block more at the most) whatever the blocks' size: a topic
published 1,000 messages a call had 64,000 changes in a page of 64 blocks."""


class FeedGap(Exception):
    """The change feed no longer holds (or never held) the changes after a position."""

    def __init__(self, partition: int, after: int, oldest: int | None) -> None:
        self.partition, self.after, self.oldest = partition, after, oldest
        held = f"its oldest retained change is seq {oldest}" if oldest else "it holds nothing"
        super().__init__(f"partition {partition}: changes after seq {after} are not in the "
                         f"change feed ({held})")


def current_seqs(r: Client, topic: TopicConfig) -> list[int]:
    """Each partition's current change sequence (the seq of its latest change; 0 = none)."""
    pipe = r.pipeline(transaction=False)
    for p in range(topic.partitions):
        pipe.hget(keys.state(topic.name, p), "seq")
    return [int(v or 0) for v in pipe.execute()]


def oldest_retained(r: Client, topic: TopicConfig, p: int) -> int | None:
    """The first seq the change feed of partition ``p`` holds, None when it holds nothing."""
    first = cast("list[StreamEntry]", r.xrange(keys.changes(topic.name, p), count=1))
    return _first_of(first[0][0]) if first else None


def _first_of(sid: bytes | str) -> int:
    text = sid.decode() if isinstance(sid, bytes) else sid
    return int(text.split("-", 1)[0])


def _block(p: int, after: int, fields: dict[bytes, bytes]) -> ChangeBlock:
    """A feed entry's block; an entry that is none (written behind sow_redis's back) cannot
    give the changes after ``after``: :class:`FeedGap`, so a reader re-reads the records."""
    try:
        return parse_block(fields[b"block"])
    except (KeyError, ValueError):
        raise FeedGap(p, after, None) from None


def blocks_after(r: Client, topic: TopicConfig, p: int, after: int, upto: int
                 ) -> Iterator[ChangeBlock]:
    """The blocks of partition ``p`` holding the changes ``after`` + 1 … ``upto`` (the first
    may start before ``after`` + 1, the last end after ``upto``: callers skip by seq).

    Raises:
        FeedGap: the feed does not hold change ``after`` + 1 (trimmed by the retention, or the
            topic keeps no change feed), or holds an entry that is no change block.
    """
    if after >= upto:
        return
    stream = keys.changes(topic.name, p)
    start = after + 1
    below = cast("list[StreamEntry]", r.xrevrange(stream, max=f"{start}-0", min="-", count=1))
    cursor = "-"
    if below:
        sid, fields = below[0]
        block = _block(p, after, fields)
        cursor = "(" + sid.decode()
        if block["last"] >= start:
            yield block
            if block["last"] >= upto:
                return
            start = block["last"] + 1
    while True:
        reach = min(start + PAGE_CHANGES - 1, upto)  # the block holding start begins by it
        page = cast("list[StreamEntry]", r.xrange(stream, min=cursor, max=str(reach),
                                                  count=PAGE))
        if not page:
            raise FeedGap(p, start - 1, oldest_retained(r, topic, p))
        for sid, fields in page:
            block = _block(p, start - 1, fields)
            if block["first"] > start:
                raise FeedGap(p, start - 1, oldest_retained(r, topic, p))
            yield block
            if block["last"] >= upto:
                return
            start = block["last"] + 1
            cursor = "(" + sid.decode()


def seq_at(r: Client, topic: TopicConfig, p: int, ms: int) -> int:
    """The position in partition ``p`` just before its first change at or after ``ms`` (server
    time, ms since the epoch); the current seq when nothing changed since.

    Raises:
        BookmarkError: ``ms`` is older than what the change feed retains.
    """
    pipe = r.pipeline(transaction=False)
    pipe.zrangebyscore(keys.change_times(topic.name, p), ms, "+inf", start=0, num=1)
    pipe.zrange(keys.change_times(topic.name, p), 0, 0, withscores=True)
    pipe.hget(keys.state(topic.name, p), "seq")
    after, oldest, seq = pipe.execute()
    if oldest and oldest[0][1] > ms and int(oldest[0][0]) > 1:
        raise BookmarkError(f"{_when(ms)} is older than the change feed of topic "
                            f"'{topic.name}' retains: partition {p} starts at "
                            f"{_when(int(oldest[0][1]))}")
    if not after:
        return int(seq or 0)
    # blocks of one millisecond share a score, and ZRANGEBYSCORE orders those by member
    # text ("102" before "98"): the earliest block is the lowest seq at the lowest score
    first_ms = r.zscore(keys.change_times(topic.name, p), after[0])
    same = ([] if first_ms is None else  # trimmed meanwhile: the one found
            r.zrangebyscore(keys.change_times(topic.name, p), first_ms, first_ms))
    return min(int(m) for m in [after[0], *same]) - 1


def _when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


RESYNC_HINT = ("; resync (subscribe --resync) re-reads the records changed since the bookmark, "
               "then goes live")
"""The end of the error of a bookmark older than the change feed."""


def check_retained(r: Client, topic: TopicConfig, bm: Bookmark, feed: bool = True) -> None:
    """Raise unless the change feed holds every change after ``bm`` (with ``feed`` False,
    only unless the bookmark is at or before each partition's current seq: a resync).

    Raises:
        BookmarkError: the bookmark is ahead of the topic, or (``feed``) naming the oldest
            retained point of the first partition that lacks changes after the bookmark.
    """
    seqs = current_seqs(r, topic)
    for p, (pos, cur) in enumerate(zip(bm.seqs, seqs)):
        if pos > cur:
            raise BookmarkError(f"bookmark is ahead of topic '{topic.name}': partition {p} is "
                                f"at seq {cur}, the bookmark at {pos}")
        if pos == cur or not feed:
            continue
        oldest = oldest_retained(r, topic, p)
        if oldest is None or oldest > pos + 1:
            head = cast("list[StreamEntry]", r.xrange(keys.changes(topic.name, p), count=1))
            when = ""
            try:
                when = f" ({_when(parse_block(head[0][1][b'block'])['ms'])})" if head else ""
            except (KeyError, ValueError, OverflowError):
                pass
            retained = (f"its oldest retained change is seq {oldest}{when}" if oldest
                        else "the topic keeps no change feed (change_retention = 0)"
                        if not topic.change_feed else "it holds nothing")
            raise BookmarkError(f"bookmark is older than the change feed of topic "
                                f"'{topic.name}' retains: partition {p} needs seq {pos + 1}, "
                                f"{retained}{RESYNC_HINT}")


def iso_ms(text: str) -> int | None:
    """Milliseconds since the epoch of ``text`` when it is written as an ISO-8601 time (UTC
    when it names no zone); None when it is not written as a time (a bookmark, ``EPOCH``).

    Raises:
        BookmarkError: written as a time, but not a valid ISO-8601 time.
    """
    word = text.strip()
    if "," in word or not ("T" in word or ":" in word or word.count("-") >= 2):
        return None
    try:
        when = dt.datetime.fromisoformat(word.replace("Z", "+00:00"))
    except ValueError:
        raise BookmarkError(f"not an ISO-8601 time: {word[:80]!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def resolve(r: Client, topic: TopicConfig, text: str, resync: bool = False) -> Bookmark:
    """A bookmark from its string, ``EPOCH``, ``NOW`` or an ISO-8601 time (``RECENT`` is the
    bookmark store's: :mod:`.bookmark_store`).

    Args:
        resync: accept a bookmark (or time) older than the change feed retains: the
            subscriber re-reads the records changed since (a time older than the feed starts
            its partition at 0: every record).

    Raises:
        BookmarkError: malformed, ahead of the topic, or (without ``resync``) older than the
            change feed retains.
    """
    word = text.strip()
    if word.upper() == "EPOCH":  # all that is retained (a partition with none: from now)
        cur = current_seqs(r, topic)
        seqs = []
        for p in range(topic.partitions):
            oldest = oldest_retained(r, topic, p)
            seqs.append(cur[p] if oldest is None else oldest - 1)
        return Bookmark(tuple(seqs))
    if word.upper() == "NOW":
        return Bookmark(tuple(current_seqs(r, topic)))
    ms = iso_ms(word)
    if ms is not None:
        seqs = []
        for p in range(topic.partitions):
            try:
                seqs.append(seq_at(r, topic, p, ms))
            except BookmarkError as exc:
                if not resync:
                    raise BookmarkError(f"{exc}{RESYNC_HINT}") from None
                seqs.append(0)
        return Bookmark(tuple(seqs))
    bm = Bookmark.parse(word, topic.partitions)
    check_retained(r, topic, bm, feed=not resync)
    return bm
