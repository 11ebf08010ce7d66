"""Subscriptions: ``subscribe``, ``sow_and_subscribe`` and bookmark replay, with out-of-focus
notices, that never lose a change silently (AMPS User Guide: "Atomic Query and Subscribe",
"Out-of-Focus messages", "Replaying Messages with Bookmark Subscription"; seeds/000, 004;
ARCHITECTURE §6).

A :class:`Subscriber` listens to the topic's change blocks on sharded pub/sub, one channel per
partition (:mod:`sow_redis.model.events`, :mod:`sow_redis.feed.live`), and keeps, per partition,
the ``seq`` of the last change it has accounted for. A block that starts after that position
means blocks were lost (Redis drops a subscriber whose output
buffer overflows, and whatever is published while one reconnects): the subscriber reads them
from the change feed; when the feed no longer holds them it re-reads the partition's records
and emits what brings its view up to date. Every recovery is reported as a ``recovery``
message (and to the ``report`` callback, e.g. stderr). Decisions use the per-partition
sequence only, never timing, so the query part of ``sow_and_subscribe`` and the live part meet
with no gap, no duplicate and no older state after a newer one.

Messages are dicts (one JSON line each in the CLI), each with a ``kind``:

* ``sow``: a record of the query part (``sow_and_subscribe``): ``topic``, ``sow_key``,
  ``partition``, ``seq``, ``bookmark`` (the position of the query; none with
  ``batch_size``), ``data``;
* ``group_end``: the end of the query part (also when it is empty): ``topic``, ``count``,
  ``bookmark``;
* ``publish``: a record published to the topic that matches the filter (the merged record of a
  delta_publish): ``topic``, ``op`` (``publish`` | ``delta_publish``), ``sow_key``,
  ``partition``, ``seq``, ``id`` (log entry), ``bookmark``, ``data``; in a **delta
  subscription** (``delta=True``; AMPS ``delta_subscribe``, ``sow_and_delta_subscribe``) an
  update of a record the subscriber holds (its previous state matched the filter) carries
  ``delta`` true, in ``data`` only the fields that changed and in ``removed`` (when any) the
  JSON Pointers of the fields removed (:mod:`sow_redis.model.delta`: applying them to the
  record gives the new one); an update that changes nothing is not sent; a record new to the
  subscriber comes whole;
* ``oof`` (only with ``oof=True``): a record left the subscription's view (``op``: the change's
  op, ``sow_delete`` for a removal), ``reason``
  ``deleted`` (sow_delete), ``expired``, ``match`` (an update no longer matches the filter;
  ``data`` is the update; on a topic with ``change_previous`` also for a record the subscriber
  never saw, because it subscribed later, whose previous state matched) or ``resync`` (found gone when a gap was recovered by re-reading the
  records), with the record's ``sow_key`` and last known ``data``;
* ``changes`` (only with ``batches``: the deriver's subscriptions): the live changes of one
  change block, ``partition`` and ``changes`` (``[(sow_key, record), …]``, ``record`` None for
  a removal), in place of their ``publish`` and ``oof`` messages;
* ``completed``: the end of the replay part of a bookmark subscription: ``bookmark``;
* ``recovery``: ``partition``, ``cause`` (``gap`` | ``reconnect`` | ``replay``: the change
  feed could not give a bookmark replay's changes | ``resync``: the same, asked for with
  ``resync``, for a bookmark older than the feed | ``migration``: the topic was migrated to a
  new layout, ``config apply --migrate``, and every record was read again, ``partition``
  None and ``partitions`` the new count | ``snapshot``: the copy a ``batch_size`` query
  part scans went before it was read, and the partition was read again whole, ``after``
  and ``to`` None), ``how`` (``feed`` | ``requery``), ``after`` and ``to`` (the seqs the
  recovery covered).

Nothing a subscriber receives stops it. A change it cannot decode or render (a SOW key or
data that is not UTF-8, data that is no JSON object: NaN text, nesting deeper than the JSON
decoder goes; see :func:`sow_redis.model.events.parse_block`), a record of the query part or of a
requery that cannot be decoded, or a message on the topic's channels that is no change block,
is skipped (its ``seq`` counts as accounted for) and reported once as an ``error`` message to
the ``report`` callback (``topic``, ``partition``, ``seq``, ``sow_key``, ``id``, ``error``:
what could not be decoded; ``partition`` and ``seq`` None when unknown), or logged as a
warning without one. It is not among the messages :meth:`Subscriber.get` returns.

A plain subscription receives ``publish`` messages only: removals reach subscriptions that ask
for out-of-focus notices.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from operator import itemgetter
from typing import Any, Protocol, TypeVar, cast

import orjson
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import keys
from ..config import shape_changes
from ..connection import Client, server_ms
from ..errors import ConfigError, FilterEvalError, SubscriptionEnded
from ..logs import fields
from ..model.delta import delta_of
from ..model.events import (
    ChangeBlock,
    ChangeEvent,
    decode_change,
    notice_op,
    parse_block,
    plain_changes,
)
from ..model.expiry import is_due
from ..model.records import decode as decode_record
from ..model.topic import TopicConfig
from ..model.values import JSON, JSONObject, select_fields, select_paths
from ..query.orderby import parse_order_by, sort_records
from ..query.sow import check_page, unsorted
from ..registry import await_migration, get_topic, migration_holds
from .bookmark import Bookmark, position_text
from .changes import FeedGap, blocks_after, current_seqs, resolve
from .live import ShardListener, refresh_topology
from .reader import Message, MessageReader
from .snapshot import copy_records, scan_page, snapshot_name

log = logging.getLogger(__name__)
_T = TypeVar("_T")

REPLAY_STEP = 1000
"""Messages a replay from a bookmark, or the recovery of a gap from the change feed, reads
ahead of the consumer, at least (one change block more at the most: up to 1,000 changes)."""


MIGRATION_WAIT_S = 600.0
"""Seconds a subscriber waits at most for a shape migration of its topic to end before it
ends with :class:`~sow_redis.errors.SubscriptionEnded`."""


class Tracker(Protocol):
    """What a bookmark store learns from a subscription (see :mod:`.bookmark_store`)."""

    def start(self, bm: Bookmark) -> None:
        """The subscription starts after ``bm``."""

    def received(self, p: int, seq: int) -> None:
        """Change ``seq`` of partition ``p`` is delivered to the application."""

    def skip(self, p: int, seq: int) -> None:
        """Every change of partition ``p`` up to ``seq`` not delivered is accounted for."""

    def processed(self, p: int, seq: int) -> None:
        """The application handled the delivered change ``seq`` of partition ``p``."""


class Subscriber(MessageReader):
    """One subscription to a topic; iterate it (or :meth:`get`) for messages.

    Args:
        r: the client (its connection pool is used for reads; pub/sub gets a connection of
            its own).
        topic: the topic.
        filter: AMPS content filter applied to each record (None: all).
        oof: deliver out-of-focus notices.
        sow: ``sow_and_subscribe``: first the query result, then ``group_end``, then live.
        top_n / order_by / skip_n: of the query part: at most ``top_n`` records after
            leaving out the first ``skip_n``, in ``order_by``'s order, else (with
            ``skip_n``) the SOW keys' (as :func:`sow_redis.query.sow.query` pages).
        batch_size: of the query part, without ``order_by`` and ``skip_n`` (AMPS
            ``batch_size``): the partitions are read one after the other as the messages are
            asked for, each copied in Redis with its seq in one MULTI/EXEC and the copy read
            ``batch_size`` records at a time (:meth:`_frozen_pages`), so the query part takes
            the client the memory of one batch (Redis, a copy of one partition's records
            while it is read). Its ``sow`` messages carry no ``bookmark``: the query's
            position is known once every partition is read, and ``group_end`` carries it.
            None: the query is read whole at the start.
        select: a select list (AMPS ``select``; ``["/id", "/px"]`` or ``"/id,/px"``,
            :func:`~sow_redis.model.values.select_paths`): the ``data`` of every ``sow``,
            ``publish`` and ``oof`` message keeps only these fields; the filter still
            reads the whole record. Not with ``delta``.
        bookmark: replay the change feed after this point (a bookmark string, ``EPOCH``,
            ``NOW`` or an ISO-8601 time), then ``completed``, then live. The replay is read
            as its messages are taken, about :data:`REPLAY_STEP` at a time (a bookmark days
            behind holds one step in the client, not every change since); the live changes
            meanwhile wait in the subscription.
        resync: a bookmark older than the change feed retains is accepted: the partitions the
            feed cannot replay are re-read (each record changed since the bookmark, as a
            ``publish``; a ``recovery`` message with cause ``resync``), then live.
        tracker: told of every delivered and processed change (a bookmark store).
        report: called with each ``recovery`` and ``error`` message (e.g. to print it on
            stderr; see the module docstring).
        auto_processed: a message counts as processed when the next one is asked for (and at
            :meth:`close`); False: call :meth:`processed` for each (several handler threads).
        delta: a delta subscription (see the module docstring); the topic must record the
            previous state of its records (``change_previous = true``).
        keys: only these SOW keys (AMPS ``SowKeys`` on a subscription): the query part
            returns only these records, and only their changes (and out-of-focus notices)
            are delivered; combined with ``filter``, both must hold. None: every key.
        bookmarks: False: the live part's ``publish`` and ``oof`` messages carry no
            ``bookmark`` (a consumer that never resumes from one, as the deriver, saves
            making one per change; :attr:`bookmark` still gives the position).
        batches: a subscription of every record whole (no filter, SOW keys or delta), with
            ``bookmarks`` False and no tracker, gets the live changes of a block as one
            ``changes`` message (``topic``, ``partition``, ``changes``: ``[(sow_key,
            record), …]`` in order, ``record`` None for a removal, given only with ``oof``),
            in place of their ``publish`` and ``oof`` messages, when every change of the
            block decodes the common way and it follows the partition's position
            (:func:`~sow_redis.model.events.plain_changes`); other blocks as before. For the
            deriver: no dict per change. Ignored for any other subscription.
        decode: with ``batches``, what decodes the records of a ``changes`` message in place
            of ``orjson.loads`` (a view's deriver: only the fields its projection reads,
            :attr:`~sow_redis.model.aggregate.Aggregation.decode_inputs`); it raises
            ValueError for a record that is no JSON object (that block then comes as
            ``publish`` and ``oof`` messages, whose records are dicts).

    Raises:
        ConfigError: ``delta`` on a topic without ``change_previous``.
        ValueError: a ``select`` path is no field path, ``select`` with ``delta``, a
            negative ``skip_n`` or a ``batch_size`` below 1.
        FilterSyntaxError: the filter or order-by does not parse.
        BookmarkError: the bookmark is malformed, ahead of the topic, or (without
            ``resync``) older than the change feed retains.
    """

    def __init__(self, r: Client, topic: TopicConfig, *, filter: str | None = None,
                 oof: bool = False, sow: bool = False, top_n: int | None = None,
                 order_by: str | None = None, bookmark: str | Bookmark | None = None,
                 tracker: Tracker | None = None,
                 report: Callable[[Message], None] | None = None,
                 auto_processed: bool = True, resync: bool = False,
                 delta: bool = False, keys: list[str] | None = None,
                 bookmarks: bool = True, batches: bool = False,
                 decode: Callable[[str | bytes], Any] | None = None,
                 skip_n: int | None = None, select: str | list[str] | None = None,
                 batch_size: int | None = None) -> None:
        # start-up time: the filter grammar (lark, re2: ~0.13 s) loads only for a filter
        from ..query.filter import compile_filter

        if select is not None and delta:
            raise ValueError("a select list does not go with a delta subscription (its "
                             "updates carry only the fields that changed)")
        if delta and not topic.change_previous:
            raise ConfigError([f"topic '{topic.name}' does not record the previous state of "
                               "its records: a delta subscription needs change_previous = "
                               "true in its definition (sow-redis config apply)"])
        check_page(skip_n=skip_n, batch_size=batch_size)
        self._select = select_paths(select)
        if migration_holds(r, topic.name, range(topic.partitions)):
            topic = _after_migration(r, topic)  # started during a migration: its new layout
        self.r, self.topic, self.oof, self.delta = r, topic, oof, delta
        self.pred = compile_filter(filter) if filter else None
        self._keys = frozenset(keys) if keys is not None else None
        # a subscription of every record whole (the deriver's): each change gives its message
        # with no test (what _message gives it, in fewer steps)
        every = self.pred is None and self._keys is None and not delta
        self._render = self._message_of_all if every else self._message
        self._batches = batches and every and not bookmarks and tracker is None
        self._decode = decode
        self._order = parse_order_by(order_by) if order_by else None
        self._top_n, self._skip_n = top_n, skip_n
        self.tracker, self.report, self.auto_processed = tracker, report, auto_processed
        self.resync, self.bookmarks = resync, bookmarks
        self._ready: deque[Message] = deque()
        # a batched query part, a replay or a recovery, read as it is taken (see _more)
        self._rest: Generator[None, None, None] | None = None
        self._head: Iterator[Message] | None = None  # messages before any other (prepend)
        self._last: Message | None = None
        self._live: ShardListener | None = None
        # per partition, the keys of the records seen matching (kept with oof only)
        self._view: list[set[str]] = [set() for _ in range(topic.partitions)]
        # the bookmark's text per partition, and the seq it was made for (bookmark())
        self._texts = [""] * topic.partitions
        self._text_seqs = [-1] * topic.partitions
        self.on_close: list[Callable[[], object]] = []
        """Called by :meth:`close` after the last message is processed (e.g. a bookmark
        store's flush)."""
        self._subscribe()
        if isinstance(bookmark, Bookmark):
            start = bookmark
        elif bookmark is not None:
            start = resolve(r, topic, bookmark, resync)
        else:
            start = None
        if sow and batch_size is not None and unsorted(order_by, skip_n):
            self.pos = [0] * topic.partitions  # each partition's as it is read
            self._rest = self._query_in_batches(batch_size)
        elif sow:
            self.pos = self._query()
        elif start is not None:
            self.pos = list(start.seqs)
            if tracker is not None:
                tracker.start(Bookmark(tuple(self.pos)))
            self._rest = self._replay(current_seqs(r, topic))
        else:
            self.pos = current_seqs(r, topic)
        if tracker is not None and not sow and start is None:
            tracker.start(Bookmark(tuple(self.pos)))

    # -- pub/sub -------------------------------------------------------------------------
    def _subscribe(self) -> None:
        """Subscribe to the partitions' sharded channels on connections of its own and wait
        for the confirmations, so every block published from now on reaches this subscriber
        (or leaves a gap it detects)."""
        self._live = ShardListener(self.r, [keys.partition_channel(self.topic.name, p)
                                            for p in range(self.topic.partitions)])

    def _reconnect(self) -> None:
        """After the connection was lost (or Redis dropped this subscriber, or a partition's
        slot moved): subscribe again, then recover every partition from the change feed (or
        by re-reading its records)."""
        if self._live is not None:
            self._live.close()
        self._live = None

        def attempt() -> list[int] | None:
            if self._layout_changed():  # migrated while this subscriber was away
                self._follow_migration()
                return None
            self._subscribe()
            return current_seqs(self.r, self.topic)

        cur = self._retrying(attempt, (RedisError,))
        if cur is None:
            return
        gaps = [(p, seq) for p, seq in enumerate(cur) if seq > self.pos[p]]
        if gaps:  # live messages are read only once nothing is left to read first
            self._rest = self._recovery(gaps, "reconnect")

    # -- the query part ------------------------------------------------------------------
    def _snapshot(self, p: int) -> tuple[int, list[tuple[JSON, JSONObject]]]:
        """Partition ``p``'s seq and its live records matching the filter, read in one
        MULTI/EXEC (the records exactly as of that seq)."""
        seq, raw, now = self._read_partition(p)
        return seq, list(self._matching(p, raw, now))

    def _read_partition(self, p: int) -> tuple[int, dict[bytes, bytes], int]:
        """Partition ``p``'s seq and its stored records (SOW key → encoded record), read in
        one MULTI/EXEC, and the server's time in ms (0: the topic has no expiration)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hget(keys.state(self.topic.name, p), "seq")
        wanted = sorted(self._keys) if self._keys is not None else None
        if wanted is None:
            pipe.hgetall(keys.records(self.topic.name, p))
        elif wanted:
            pipe.hmget(keys.records(self.topic.name, p), wanted)
        seq_raw, *got = pipe.execute()
        if wanted is None:
            raw = got[0]
        else:  # only the subscribed keys: HMGET them instead of reading the partition
            raw = {k: v for k, v in zip(wanted, got[0] if got else []) if v is not None}
        now = server_ms(self.r) if self.topic.expiration_enabled else 0
        return int(seq_raw or 0), raw, now

    def _matching(self, p: int, raw: dict[Any, bytes],
                  now: int) -> Iterator[tuple[JSON, JSONObject]]:
        """The records of ``raw`` (partition ``p``'s) that match the filter and are not due at
        ``now`` (ms; 0: no check), decoded as they are asked for; a record that cannot be
        read is reported (an ``error`` message) and left out."""
        for k, v in raw.items():
            try:
                rec = decode_record(k, v, lenient=True)
            except ValueError as exc:
                self._error(p, None, k, None, f"the stored record cannot be read ({exc})")
                continue
            if now and is_due(rec.expiry_ms, now):
                continue  # due: its expiry event follows
            ev = decode_change(rec.sow_key, rec.data)
            if "error" in ev:
                self._error(p, rec.seq, ev["sow_key"], rec.stream_id, ev["error"])
                continue
            obj = cast("JSONObject", ev["data"])
            if self._match(obj):
                yield rec, obj

    def _query(self) -> list[int]:
        seqs: list[int] = []
        rows: list[tuple[int, JSON, JSONObject]] = []
        for p in range(self.topic.partitions):
            seq, recs = self._snapshot(p)
            seqs.append(seq)
            rows += [(p, rec, obj) for rec, obj in recs]
            if self.oof:
                self._view[p] = {rec.sow_key for rec, _obj in recs}
        if self._order is not None:
            by_key = {rec.sow_key: (p, rec, obj) for p, rec, obj in rows}
            ordered = sort_records([rec for _p, rec, _o in rows], self._order,
                                   data=lambda rec: by_key[rec.sow_key][2])
            rows = [by_key[rec.sow_key] for rec in ordered]
        elif self._skip_n is not None:  # a page: in the order of the SOW keys
            rows.sort(key=lambda row: row[1].sow_key)
        skip = self._skip_n or 0
        if skip or self._top_n is not None:
            rows = rows[skip:] if self._top_n is None else rows[skip:skip + self._top_n]
        bm = str(Bookmark(tuple(seqs)))
        for p, rec, obj in rows:
            self._ready.append({"kind": "sow", "topic": self.topic.name, "sow_key": rec.sow_key,
                                "partition": p, "seq": rec.seq, "bookmark": bm, "data": obj})
        self._ready.append({"kind": "group_end", "topic": self.topic.name, "count": len(rows),
                            "bookmark": bm})
        if self.tracker is not None:
            self.tracker.start(Bookmark(tuple(seqs)))
        return seqs

    def _query_in_batches(self, size: int) -> Generator[None, None, None]:
        """The query part read as it is asked for (see ``batch_size``): each step adds up to
        ``size`` ``sow`` messages to the ready queue (the last step, ``group_end``)."""
        count, limit, name = 0, self._top_n, self.topic.name
        for p in range(self.topic.partitions):
            view = self._view[p] if self.oof else None
            for page, now in self._frozen_pages(p, size):
                for rec, obj in self._matching(p, page, now):
                    if view is not None:  # the records seen matching, as _query keeps them
                        view.add(rec.sow_key)
                    if limit is not None and count >= limit:
                        continue
                    count += 1
                    self._ready.append({"kind": "sow", "topic": name, "sow_key": rec.sow_key,
                                        "partition": p, "seq": rec.seq, "data": obj})
                    if len(self._ready) >= size:
                        yield
        self._ready.append({"kind": "group_end", "topic": name, "count": count,
                            "bookmark": self.bookmark})
        if self.tracker is not None:
            self.tracker.start(Bookmark(tuple(self.pos)))

    def _frozen_pages(self, p: int, size: int) -> Iterator[tuple[dict[bytes, bytes], int]]:
        """Partition ``p``'s records as of one seq (set as ``pos[p]``), in pages of about
        ``size``, each with the server time (ms; 0: no expiration) its records are checked
        against for being due, taken once, after the copy. The records hash is copied with
        the seq and the copy scanned, then deleted (:mod:`sow_redis.feed.snapshot`): the
        client holds one page, not the partition. Where the copy cannot be made (SOW keys
        asked for, a Redis or ACL user without ``COPY``, no memory for it) the partition is
        read whole, as without ``batch_size``. A copy gone before its scan ends (deleted by
        another client, or unread for its lifetime) is reported (a ``recovery`` message,
        cause ``snapshot``) and the partition read whole again: records already given may
        come again."""
        if self._keys is not None:  # only these SOW keys: an HMGET of them, as without
            yield self._whole(p)
            return
        copy = snapshot_name(self.topic.name, p)
        copied = self._retrying(lambda: copy_records(self.r, self.topic.name, p, copy))
        if copied is None:  # logged by copy_records
            yield self._whole(p)
            return
        self.pos[p], made = copied
        if not made:  # no records hash: an empty partition
            return
        # the time due records are left out at: the copy's, as _read_partition takes it
        now = self._retrying(lambda: server_ms(self.r)) if self.topic.expiration_enabled else 0
        cursor = 0
        try:
            while True:
                cursor, page, alive = self._retrying(
                    functools.partial(scan_page, self.r, copy, cursor, size))
                if not alive:  # the copy is gone: read the partition whole
                    self._snapshot_lost(p)
                    yield self._whole(p)
                    return
                yield page, now
                if cursor == 0:
                    return
        finally:
            try:
                self.r.delete(copy)
            except RedisError:
                pass  # its lifetime removes it

    def _whole(self, p: int) -> tuple[dict[bytes, bytes], int]:
        """Partition ``p`` read whole (:meth:`_read_partition`), its seq set as ``pos[p]``."""
        seq, raw, now = self._retrying(lambda: self._read_partition(p))
        self.pos[p] = seq
        return raw, now

    def _snapshot_lost(self, p: int) -> None:
        """Report that the copy of partition ``p`` went before its scan ended."""
        msg = {"kind": "recovery", "topic": self.topic.name, "partition": p,
               "cause": "snapshot", "how": "requery", "after": None, "to": None}
        log.warning("subscriber of %s: the copy of partition %d's records went before its "
                    "query part was read; the partition is read again whole",
                    self.topic.name, p)
        if self.report is not None:
            self.report(msg)
        self._ready.append(msg)

    def _retrying(self, read: Callable[[], _T],
                  errors: tuple[type[Exception], ...] = (RedisConnectionError,
                                                         RedisTimeoutError)) -> _T:
        """``read()``, tried again (after a pause growing to 1 s, warning once) while it
        raises one of ``errors``, Redis being unreachable: nothing it reads is delivered
        before it succeeds."""
        pause, warned = 0.05, False
        while True:
            try:
                return read()
            except errors as exc:
                if not warned:
                    log.warning("subscriber of %s: Redis unreachable (%s); retrying",
                                self.topic.name, exc)
                    warned = True
                time.sleep(pause)
                pause = min(1.0, pause * 2)
                refresh_topology(self.r)

    def _more(self) -> None:
        """The next step of a batched query part (:meth:`_query_in_batches`), a replay
        (:meth:`_replay`) or a recovery (:meth:`_recovery`)."""
        if self._rest is not None and next(self._rest, StopIteration) is StopIteration:
            self._rest = None

    # -- replay --------------------------------------------------------------------------
    def _replay(self, uptos: list[int]) -> Generator[None, None, None]:
        """The change feed from the bookmark up to ``uptos`` (each partition's seq when the
        subscription started), then ``completed``: each step adds the messages of the next
        change blocks, at least :data:`REPLAY_STEP` unless the replay ends first. A feed
        trimmed past the position before its changes are read: the partition is re-read
        (each record changed since, a ``recovery`` message), as for a gap."""
        for p, upto in enumerate(uptos):
            if upto <= self.pos[p]:
                continue
            after = self.pos[p]
            if (yield from self._catch_up(p, upto, REPLAY_STEP)) == "requery":
                self._recovered(p, after, "resync" if self.resync else "replay", "requery")
        self._ready.append({"kind": "completed", "topic": self.topic.name,
                            "bookmark": self.bookmark})

    # -- live ----------------------------------------------------------------------------
    def _match(self, obj: JSONObject) -> bool:
        if self.pred is None:
            return True
        try:
            return bool(self.pred(obj))
        except (FilterEvalError, RecursionError, TypeError, ValueError):
            return False

    def _block(self, block: ChangeBlock) -> None:
        p = block["partition"]
        if not 0 <= p < self.topic.partitions or block["last"] <= self.pos[p]:
            return  # seen (the query or the replay covered it) or not this topic's layout
        if block["first"] > self.pos[p] + 1:  # then this block, once the gap is recovered
            self._rest = self._recovery([(p, block["first"] - 1)], "gap", block)
            return
        self._events(block)

    def _events(self, block: ChangeBlock, upto: int | None = None) -> None:
        p = block["partition"]
        if self.bookmarks:  # the bookmark around partition p's position: the others stay
            self.bookmark  # noqa: B018 (brings self._texts up to date)
            head = "".join(t + "," for t in self._texts[:p])
            tail = "".join("," + t for t in self._texts[p + 1:])
        pos, tracker, ready, render = self.pos, self.tracker, self._ready, self._render
        for ev in block["events"]:
            seq = ev["seq"]
            if seq <= pos[p] or (upto is not None and seq > upto):
                continue
            pos[p] = seq
            what = ev.get("error")
            msg = None
            if what is None:
                try:
                    msg = render(p, ev)
                except Exception as exc:  # nothing a change holds may stop the subscriber
                    what = f"the change cannot be rendered ({type(exc).__name__}: {exc})"
            if what is not None:
                self._error(p, seq, ev["sow_key"], ev["id"], what)
            if msg is None:
                if tracker is not None:
                    tracker.skip(p, seq)
                continue
            if self.bookmarks:
                msg["bookmark"] = head + position_text(seq) + tail
            if tracker is not None:
                tracker.received(p, seq)
            ready.append(msg)

    def _error(self, p: int | None, seq: int | None, key: str | bytes | None, sid: str | None,
               what: str) -> None:
        """Report one change (or record, or channel message) this subscriber cannot decode or
        render, and go on (see the module docstring)."""
        if isinstance(key, bytes):
            key = key.decode("utf-8", "backslashreplace")
        msg = {"kind": "error", "topic": self.topic.name, "partition": p, "seq": seq,
               "sow_key": key, "id": sid, "error": what}
        if self.report is not None:
            self.report(msg)
        else:
            log.warning("subscriber of %s: partition %s seq %s (SOW key %r): %s; skipped",
                        self.topic.name, p, seq, key, what)

    def _message_of_all(self, p: int, ev: ChangeEvent) -> Message | None:
        """:meth:`_message` for a subscription with no filter, no SOW keys and no delta:
        every change gives its message whole (a removal only with ``oof``), each record is
        in the view (with ``oof``); one dict made per change, not two."""
        key, op = ev["sow_key"], ev["op"]
        if op == "sow_delete":
            if not self.oof:
                return None
            self._view[p].discard(key)
            return {"kind": "oof", "op": op, "reason": ev.get("reason", "deleted"),
                    "topic": self.topic.name, "sow_key": key, "partition": p,
                    "seq": ev["seq"], "id": ev["id"], "expiry_ms": ev["expiry_ms"],
                    "data": ev["data"]}
        if self.oof:
            self._view[p].add(key)
        return {"kind": "publish", "op": op, "topic": self.topic.name, "sow_key": key,
                "partition": p, "seq": ev["seq"], "id": ev["id"],
                "expiry_ms": ev["expiry_ms"], "data": ev["data"]}

    def _message(self, p: int, ev: ChangeEvent) -> Message | None:
        """The message of one change for this subscription, None when it gets none."""
        key, data = ev["sow_key"], cast("JSONObject", ev["data"])
        if self._keys is not None and key not in self._keys:
            return None  # a subscription by SOW keys: another record
        view = self._view[p]
        base = {"topic": self.topic.name, "sow_key": key, "partition": p, "seq": ev["seq"],
                "id": ev["id"], "expiry_ms": ev["expiry_ms"]}
        if ev["op"] == "sow_delete":
            if not self.oof:
                return None
            matched = key in view or self._match(data)
            view.discard(key)
            if matched:
                return {"kind": "oof", "op": ev["op"], "reason": ev.get("reason", "deleted"),
                        **base, "data": data}
            return None
        previous = ev.get("previous")
        if self._match(data):
            if self.oof:  # the view (matching keys) serves out-of-focus notices only
                view.add(key)
            if self.delta and previous is not None and self._match(previous):
                changed, removed = delta_of(previous, data)
                if not changed and not removed:
                    return None  # nothing changed: a delta subscriber gets no copy
                msg: Message = {"kind": "publish", "op": ev["op"], **base, "delta": True,
                                "data": changed}
                if removed:
                    msg["removed"] = removed
                return msg
            return {"kind": "publish", "op": ev["op"], **base, "data": data}
        if key in view or (self.oof and previous is not None and self._match(previous)):
            view.discard(key)
            return {"kind": "oof", "op": ev["op"], "reason": "match", **base, "data": data}
        return None

    def _recovery(self, gaps: list[tuple[int, int]], cause: str,
                  then: ChangeBlock | None = None) -> Generator[None, None, None]:
        """Account for the changes of each partition ``p`` of ``gaps`` (``[(p, upto), …]``)
        after its position up to ``upto``, as they are taken, about :data:`REPLAY_STEP`
        ahead (a gap of 100,000 changes is not held in memory at once): from the change feed,
        or (when the feed no longer holds them) by re-reading the records; a ``recovery``
        message after each partition's; then the change block ``then`` that showed the gap.
        Live messages wait meanwhile (:meth:`get` reads them only without a ``_rest``), as
        they wait during a replay."""
        for p, upto in gaps:
            after = self.pos[p]
            self._recovered(p, after, cause, (yield from self._catch_up(p, upto, REPLAY_STEP)))
        if then is not None:
            self._events(then)

    def _catch_up(self, p: int, upto: int, step: int) -> Generator[None, None, str]:
        """Account for partition ``p``'s changes after its position up to ``upto`` from the
        change feed (returns ``"feed"``) or, when the feed does not hold them all, by
        re-reading the records (``"requery"``); yields after a change block whenever ``step``
        messages or more are ready (a replay or a recovery read as it is taken)."""
        try:
            for block in blocks_after(self.r, self.topic, p, self.pos[p], upto):
                self._events(block, upto)
                if len(self._ready) >= step:
                    yield
            return "feed"
        except FeedGap:
            self._requery(p)
            return "requery"

    def _recovered(self, p: int, after: int, cause: str, how: str) -> None:
        """Report a recovery of partition ``p`` from ``after`` to its position now."""
        msg = {"kind": "recovery", "topic": self.topic.name, "partition": p, "cause": cause,
               "how": how, "after": after, "to": self.pos[p]}
        log.warning("subscriber of %s: partition %d: recovered seq %d..%d (%s, %s)",
                    self.topic.name, p, after + 1, self.pos[p], cause, how,
                    extra=fields("recovery", topic=self.topic.name, partition=p, cause=cause,
                                 how=how, after=after, to=self.pos[p]))
        if self.report is not None:
            self.report(msg)
        self._ready.append(msg)

    def _requery(self, p: int) -> None:
        """The gap is older than the change feed: read partition ``p``'s records and emit the
        current record of each one changed since the position (in change order; a bookmark
        store counts them as received, so its bookmark passes the gap once they are
        processed), and (``oof``) an out-of-focus notice for each record of the view that is
        gone or no longer matches. Only the records changed since are kept decoded (the
        others are decoded to be filtered, then dropped), and with ``oof`` the SOW keys of
        those matching."""
        seq, raw, now = self._read_partition(p)
        after = self.pos[p]
        matching: set[str] = set()
        changed: list[tuple[int, Any, JSONObject]] = []
        for rec, obj in self._matching(p, raw, now):
            if self.oof:
                matching.add(rec.sow_key)
            if rec.seq > after:
                changed.append((rec.seq, rec, obj))
        del raw
        changed.sort(key=itemgetter(0))  # change order: a partition's seqs are unique
        out: list[Message] = []
        if self.oof:
            out += [{"kind": "oof", "reason": "resync", "topic": self.topic.name,
                     "sow_key": key, "partition": p, "seq": seq, "data": None}
                    for key in sorted(self._view[p] - matching)]
            self._view[p] = matching
        out += [{"kind": "publish", "op": "publish", "topic": self.topic.name,
                 "sow_key": rec.sow_key, "partition": p, "seq": rec_seq,
                 "id": rec.stream_id, "data": obj} for rec_seq, rec, obj in changed]
        self.pos[p] = max(seq, after)
        if self.tracker is not None:  # the position moves once these are processed
            for rec_seq, _rec, _obj in changed:
                self.tracker.received(p, rec_seq)
            self.tracker.skip(p, self.pos[p])
        bm = self.bookmark
        for msg in out:
            msg["bookmark"] = bm
            self._ready.append(msg)

    # -- a shape migration ---------------------------------------------------------------
    def _layout_changed(self) -> bool:
        """True while a shape migration holds the topic or when the stored definition lays
        the topic out otherwise than this subscriber's (another definition of the same shape
        is taken as it is)."""
        if migration_holds(self.r, self.topic.name, range(self.topic.partitions)):
            return True
        fresh = get_topic(self.r, self.topic.name)
        if fresh.fingerprint == self.topic.fingerprint:
            return False
        if shape_changes(self.topic, fresh):
            return True
        self.topic = fresh
        return False

    def _follow_migration(self) -> None:
        """The topic's shape migration began (its notice on a partition channel; see
        :mod:`sow_redis.migrate`): stop listening to the old partitions, wait until the
        migration ends (at most :data:`MIGRATION_WAIT_S` seconds), then subscribe to the
        partitions of the definition stored by then and re-read their records: each record
        as a ``publish`` (the view brought up to date as a gap recovery by re-reading does),
        with ``oof`` a ``resync`` notice for each record of the view that is gone, and one
        ``recovery`` message with cause ``migration`` (``partitions``: the new count).

        Raises:
            SubscriptionEnded: the subscription keeps its bookmarks in a bookmark store
                (positions of the old layout), or the migration did not end in time.
        """
        old = self.topic
        if self._live is not None:
            self._live.close()
            self._live = None
        if self.tracker is not None:
            raise SubscriptionEnded(
                f"topic '{old.name}' is being migrated to a new layout (config apply "
                "--migrate): the bookmark store's positions are of the old layout; "
                "subscribe again with --resync once the migration ends")
        new = _after_migration(self.r, old)
        seen = set().union(*self._view)
        n = new.partitions
        self.topic = new
        self._view = [set() for _ in range(n)]
        self._texts, self._text_seqs = [""] * n, [-1] * n
        self.pos = [0] * n
        self._subscribe()
        out: list[Message] = []
        now: set[str] = set()
        for p in range(n):
            seq, recs = self._snapshot(p)
            self.pos[p] = seq
            for rec, obj in sorted(recs, key=lambda pair: pair[0].seq):
                out.append({"kind": "publish", "op": "publish", "topic": new.name,
                            "sow_key": rec.sow_key, "partition": p, "seq": rec.seq,
                            "id": rec.stream_id, "data": obj})
                now.add(rec.sow_key)
            if self.oof:
                self._view[p] = {rec.sow_key for rec, _obj in recs}
        if self.oof:
            out += [{"kind": "oof", "reason": "resync", "topic": new.name, "sow_key": key,
                     "partition": None, "seq": None, "data": None}
                    for key in sorted(seen - now)]
        msg = {"kind": "recovery", "topic": new.name, "partition": None,
               "cause": "migration", "how": "requery", "after": None, "to": None,
               "partitions": n}
        log.warning("subscriber of %s: the topic was migrated (%d → %d partition(s)); "
                    "re-read its records", new.name, old.partitions, n)
        if self.report is not None:
            self.report(msg)
        bm = self.bookmark
        for m in out:
            m["bookmark"] = bm
        self._ready.extend(out)
        self._ready.append(msg)

    # -- the API -------------------------------------------------------------------------
    @property
    def bookmark(self) -> str:
        """The bookmark of everything accounted for so far (as ``str(Bookmark(…))``; each
        partition's text is made again only when its position moved: every message carries
        the bookmark)."""
        texts, seqs = self._texts, self._text_seqs
        for p, seq in enumerate(self.pos):
            if seqs[p] != seq:
                seqs[p] = seq
                texts[p] = position_text(seq)
        return ",".join(texts)

    def prepend(self, messages: Iterable[Message]) -> None:
        """Deliver ``messages`` before any other (the historical query of a
        ``sow_and_subscribe`` as of a point in time), taken from it one at a time as they are
        asked for (an iterator: a query part read in batches; closed by :meth:`close` when not
        read to its end). Once per subscriber."""
        self._head = iter(messages)

    def get(self, timeout: float = 1.0) -> Message | None:
        """The next message, or None after ``timeout`` seconds without one."""
        if self.tracker is not None:  # settling the last message tells the tracker only
            self._settle_last()
        if self._head is not None:
            first = next(self._head, None)
            if first is not None:
                self._last = first
                return first if self._select is None else self._selected(first)
            self._head = None
        if self._ready:  # the deriver's common case: taken one after the other
            out = self._last = self._ready.popleft()
            return out if self._select is None else self._selected(out)
        deadline = time.monotonic() + timeout
        while not self._ready:
            if self._rest is not None:  # a query part, a replay, a recovery: before live
                self._more()
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                if self._live is None:
                    raise RedisConnectionError("not subscribed")
                data = self._live.get(timeout=min(left, 1.0))
            except (RedisConnectionError, RedisTimeoutError, OSError):
                self._reconnect()
                continue
            if data is not None:
                self._live_message(data)
        out = self._ready.popleft()
        self._last = out
        return out if self._select is None else self._selected(out)

    def _selected(self, msg: Message) -> Message:
        """``msg`` with only the select list's fields in its ``data`` (a ``sow``, ``publish``
        or ``oof`` message whose data is a JSON object); any other message as it is."""
        data = msg.get("data")
        if self._select is None or msg["kind"] not in ("sow", "publish", "oof") \
                or not isinstance(data, dict):
            return msg
        return {**msg, "data": select_fields(data, self._select)}

    def _live_message(self, data: bytes) -> None:
        """Account for one message of the topic's channels: a change block (as one
        ``changes`` message with ``batches``, when it can be), a topic notice, or anything
        else (reported)."""
        if self._batches and self._batch(data):
            return
        try:
            block = parse_block(data)
        except ValueError as exc:
            notice = notice_op(data)
            if notice == "topic_migrating":
                self._follow_migration()
            elif notice is None:
                self._error(None, None, None, None, f"a message on the topic's channels "
                            f"is no change block ({exc}); ignored")
            return
        self._block(block)

    def _batch(self, data: bytes) -> bool:
        """Take a change block as one ``changes`` message (see ``batches``), or as nothing
        when its changes are accounted for; False when it is no block of plain changes, or
        when it does not follow its partition's position (a gap: the general path recovers
        it)."""
        got = plain_changes(data, self._decode)
        if got is None:
            return False
        p, first, last, changes = got
        if not 0 <= p < self.topic.partitions or last <= self.pos[p]:
            return True  # seen, or not this topic's layout (as _block)
        if first != self.pos[p] + 1:
            return False
        self.pos[p] = last
        if self.oof:  # the view serves out-of-focus notices (a recovery by re-reading)
            view = self._view[p]
            add, discard = view.add, view.discard
            for key, record in changes:
                if record is None:
                    discard(key)
                else:
                    add(key)
        else:  # removals reach subscriptions with out-of-focus notices only
            changes = [change for change in changes if change[1] is not None]
        self._ready.append({"kind": "changes", "topic": self.topic.name, "partition": p,
                            "changes": changes})
        return True

    def _settle_last(self) -> None:
        last, self._last = self._last, None
        if last is not None and self.auto_processed:
            self.processed(last)

    def processed(self, msg: Message) -> None:
        """Mark a delivered message as handled (the bookmark store's ``discard``)."""
        if self.tracker is not None and msg.get("kind") in ("publish", "oof") \
                and "seq" in msg and msg.get("seq") is not None:
            self.tracker.processed(msg["partition"], msg["seq"])

    def close(self) -> None:
        """Stop listening (the last message counts as processed), then run :attr:`on_close`.
        A batched query part not read to its end deletes the copy it was reading."""
        self._settle_last()
        rest, self._rest = self._rest, None
        if rest is not None:
            rest.close()  # its copy's finally: DEL
        head, self._head = self._head, None
        if isinstance(head, Generator):
            head.close()
        hooks, self.on_close = self.on_close, []
        for hook in hooks:
            hook()
        if self._live is not None:
            self._live.close()
            self._live = None



def _after_migration(r: Client, topic: TopicConfig) -> TopicConfig:
    """Wait until no shape migration holds ``topic`` (at most :data:`MIGRATION_WAIT_S`
    seconds), then its stored definition.

    Raises:
        SubscriptionEnded: the migration did not end in time; UnknownTopicError.
    """
    if not await_migration(r, topic.name, range(topic.partitions), MIGRATION_WAIT_S):
        raise SubscriptionEnded(
            f"topic '{topic.name}': a migration to a new layout did not end within "
            f"{MIGRATION_WAIT_S:g} s; subscribe again once it has")
    return get_topic(r, topic.name)


def to_line(msg: Message) -> bytes:
    """One JSON line of a message."""
    return orjson.dumps(msg) + b"\n"
