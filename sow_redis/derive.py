"""The deriver: views and conflated topics, kept from their underlying topics (issue 26.3-4).

A **view** (``[[view]]``; AMPS ``View`` with ``Projection`` and ``Grouping``) is a SOW topic
with one record per group of its underlying topic's records: the grouping fields and the
aggregates of its projection (:mod:`sow_redis.model.aggregate`), keyed by the grouping values.
A **conflated topic** (``[[conflated_topic]]``; AMPS ``ConflatedTopic``) holds the records of
its underlying topic that match its filter, written at most once per SOW key per ``interval``
(the latest version), so its subscribers get at most one update per key per interval; a
record removed from the underlying topic is removed from it at the next interval, with the
usual out-of-focus notice. Both are queried and subscribed like any topic; publishers do not
write to them.

The deriver follows each underlying topic the way ``sow_and_subscribe`` does (records and
change sequence read together, then every change after them, gaps recovered from the change
feed; :class:`sow_redis.feed.subscriber.Subscriber` with out-of-focus notices) and writes
what changed through the normal write path (``append`` with the records' SOW keys, applied by
the workers, or in process by an inline :class:`~sow_redis.client.Sow`). When it starts
following a derived topic it first makes the topic equal to what the underlying topic gives
(every row or record written, anything else removed), so a deriver that stopped, crashed or
missed changes leaves no stale record: after a restart the derived topic is whole again.

One deriver at a time serves a derived topic: it holds the topic's lease
(:func:`sow_redis.keys.derive_lease`, renewed every :data:`LEASE_RENEW_S` seconds, lost after
:data:`LEASE_TTL_MS` ms without renewal), so any number may run for availability.
``sow-redis derive`` runs one; ``sow-redis up`` starts one beside the expirer.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from . import keys
from .apply.scripts import Scripts
from .client import Sow
from .errors import FilterEvalError
from .feed.subscriber import Message, Subscriber
from .model.aggregate import Aggregation
from .model.topic import TopicConfig
from .model.values import JSON, JSONObject, canonical, get_path, split_path
from .query.filter import compile_filter
from .registry import load_topics
from .stopping import StopEvent, stop_on_signals

log = logging.getLogger(__name__)

LEASE_TTL_MS = 15_000
"""Milliseconds a deriver's lease on a derived topic lasts without renewal."""

LEASE_RENEW_S = 3.0
"""Seconds between two renewals of a deriver's leases (and looks for new derived topics)."""

STEP_S = 0.01
"""Seconds the deriver waits for the next message before it serves its followers again (each
of N followers waits at most STEP_S / N, so an idle one delays the others little)."""

FLUSH_S = 0.005
"""Seconds a follower takes messages at most before it writes what changed: a follower that
fell behind writes as it catches up, instead of after taking the whole backlog."""

FLUSH_MAX_S = 0.05
"""Seconds a follower takes messages at most before it writes, in place of :data:`FLUSH_S`,
once it has been behind for :data:`BACKLOG_S` (every step stopped by the clock, none by
taking all that arrived): a row changed by many messages of a backlog is then written once
per 50 ms, not once per 5 ms, which took 40 % off the deriver's CPU per message in a backlog
(``scripts/bench_views.py``). A follower that keeps up, or falls behind only briefly, writes
as before."""

BACKLOG_S = 0.1
"""Seconds a follower must have been behind before it writes every :data:`FLUSH_MAX_S`."""

BURST_TIMEOUT_S = 60.0
"""Seconds ``derive --burst`` waits at most for a derived topic to be whole."""

_EMPTY = b"{}"

WRITER_CLOSE_S = 30.0
"""Seconds a follower's close waits at most for its writer to finish what it was handed."""


def settle_heap(full: bool = True) -> None:
    """Collect the garbage now, then keep every object alive now out of the collections to
    come (:func:`gc.freeze`). ``full``: the objects frozen before are collected too (and
    frozen again if alive), which walks the whole heap; else only those since the last
    freeze are, so a deriver whose many followers become ready one after the other walks
    each one's objects once.

    A follower's initial records leave tens of thousands of long-lived objects (about 44,000
    for a view over 20,000 records), which the first full collection after them walks: 15–40
    ms, measured with ``gc.callbacks`` in the deriver of ``scripts/bench_views.py``, which held
    up every change the view was to take in that time. The view's lag p99 at 10,000
    changes/s (5 s rounds, the deriver at its default priority, runs alternating,
    2026-11-28): 6.5, 16.5 and 11.2 ms with, 26.1, 20.4 and 8.9 ms without; after it a
    young or middle collection took at most 0.9 ms. Settled when a follower's
    initial records are in, and when one is dropped: the pause then falls where following a
    topic anew already costs its query, and a dropped follower's reference cycles (its
    aggregation's and its subscription's) are freed instead of staying frozen for good
    (``full``, which a follower becoming ready does not need)."""
    if full:
        gc.unfreeze()
    gc.collect()
    gc.freeze()


class _Writer:
    """Writes a follower's rows from a thread of its own, one call at a time, so that the
    follower goes on taking changes while Redis applies the last rows (at 10,000 changes/s a
    flush took 1.7 ms at the median, mostly waiting for Redis, against 1 ms to take the
    changes it wrote: ``scripts/bench_views.py``). Rows handed over while a call runs wait for the
    next, merged: a key's latest row or removal replaces what waited for it, which is what
    writing each in turn would leave (a row is a whole record).

    An error of a call is raised by the next :meth:`put` or :meth:`drain` (the rows of that
    call are not retried: the deriver follows the topic anew, which rewrites it whole).
    """

    def __init__(self, write: Callable[[dict[str, JSONObject], set[str]], None],
                 name: str) -> None:
        self._write = write
        self._rows: dict[str, JSONObject] = {}
        self._gone: set[str] = set()
        self._busy = False
        self._closed = False
        self._error: Exception | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"deriver-writer-{name}",
                                        daemon=True)
        self._thread.start()

    def put(self, rows: dict[str, JSONObject], gone: set[str]) -> None:
        """Hand ``rows`` (SOW key → record) and removals ``gone`` over to be written.

        Raises:
            Exception: what the last call raised.
        """
        with self._cond:
            self._raise()
            for key in gone:
                self._rows.pop(key, None)
            self._gone.difference_update(rows)
            self._gone.update(gone)
            self._rows.update(rows)
            self._cond.notify_all()

    def drain(self) -> None:
        """Wait until everything handed over is written.

        Raises:
            Exception: what a call raised.
        """
        with self._cond:
            while (self._rows or self._gone or self._busy) and self._error is None:
                self._cond.wait()
            self._raise()

    def close(self) -> None:
        """Write what waits (at most :data:`WRITER_CLOSE_S` seconds), then stop the thread.

        Raises:
            Exception: what a call raised.
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(WRITER_CLOSE_S)
        if self._thread.is_alive():  # a call that hangs: its rows may still land later
            log.warning("deriver: a write still runs after %g s; left to finish",
                        WRITER_CLOSE_S)
        with self._cond:
            self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._rows or self._gone or self._closed):
                    self._cond.wait()
                if not (self._rows or self._gone):
                    return  # closed, and nothing waits
                rows, gone, self._rows, self._gone = self._rows, self._gone, {}, set()
                self._busy = True
            try:
                self._write(rows, gone)
            except Exception as exc:  # raised in the follower's thread at its next call
                with self._cond:
                    self._error = exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


class _Follower:
    """One derived topic fed from its underlying topic."""

    agg: Aggregation | None = None
    """A view's aggregation (its rows)."""

    decode: Callable[[str | bytes], Any] | None = None
    """What decodes the records of the subscription's ``changes`` messages (None: whole, by
    orjson)."""

    writer: _Writer | None = None
    """Writes the rows of each flush (started by the first)."""

    def __init__(self, sow: Sow, target: TopicConfig) -> None:
        self.sow, self.target = sow, target
        self.sub = Subscriber(sow.r, sow.topic(target.underlying),
                              filter=target.filter or None, oof=True, sow=True,
                              bookmarks=False, batches=True, decode=self.decode)
        self.ready = False  # the initial records are in
        self._initial: JSONObject = {}
        self.rows: dict[str, JSONObject] = {}  # SOW key → what the next flush writes
        self.gone: set[str] = set()  # SOW keys the next flush removes
        self.dirty: set[str] = set()  # group keys whose row the next flush reads from agg
        self.behind_since: float | None = None  # monotonic time the follower fell behind

    def step(self, wait: float = STEP_S) -> int:
        """Take the messages that arrived (waiting at most ``wait`` seconds for the first,
        taking them for at most :data:`FLUSH_S` seconds, :data:`FLUSH_MAX_S` once it has been
        behind for :data:`BACKLOG_S`) and write what is due; returns the messages taken (a
        ``changes`` message counts its changes)."""
        n = 0
        check = 64  # the clock is read once per 64 messages taken
        msg = self.sub.get(wait)
        start = time.monotonic()
        behind = self.behind_since is not None and start - self.behind_since >= BACKLOG_S
        until = start + (FLUSH_MAX_S if behind else FLUSH_S)
        while msg is not None:
            self.take(msg)
            n += len(msg["changes"]) if msg["kind"] == "changes" else 1
            if n >= check:
                check = n + 64
                if time.monotonic() >= until:
                    break  # msg stays set: stopped by the clock
            msg = self.sub.get(0.0001)
        if msg is None:
            self.behind_since = None
        elif self.behind_since is None:
            self.behind_since = start
        self.flush()
        return n

    def take(self, msg: Message) -> None:
        raise NotImplementedError

    def mark(self, key: str, row: JSONObject | None) -> None:
        """Write ``row`` as ``key``'s record at the next flush (None: remove the record)."""
        if row is None:
            self.rows.pop(key, None)
            self.gone.add(key)
        else:
            self.rows[key] = row
            self.gone.discard(key)

    def changed(self, changed: list[tuple[str, str, JSONObject | None]]) -> None:
        """Mark the rows an :class:`~sow_redis.model.aggregate.Aggregation` says changed
        (``upsert_keys``, ``remove_keys``: a changed row is read once, at the flush; nothing
        before the initial records are in: :meth:`reconcile` writes those)."""
        if self.ready:
            for what, key, _row in changed:
                if what == "publish":
                    self.dirty.add(key)
                    self.gone.discard(key)
                else:
                    self.dirty.discard(key)
                    self.mark(key, None)

    def flush(self) -> None:
        """Write what is marked (every step; a conflated topic once per interval)."""
        if self.dirty and self.agg is not None:
            for key in self.dirty:
                self.rows[key] = self.agg.row(key)
            self.dirty.clear()
        if self.ready and (self.rows or self.gone):
            rows, gone, self.rows, self.gone = self.rows, self.gone, {}, set()
            if self.writer is None:
                self.writer = _Writer(self.write, self.target.name)
            self.writer.put(rows, gone)

    def write(self, upserts: dict[str, JSONObject], removals: set[str]) -> None:
        """Publish ``upserts`` (SOW key → record) and remove ``removals`` from the target."""
        # each row as a dict: the publish encodes it, and a row of JSON scalars (a view's
        # without nested paths) is not decoded again from its text
        items: list[tuple[str, JSON, str | None]] = [
            ("publish", rec, key) for key, rec in upserts.items()]
        items += [("sow_delete", _EMPTY, key) for key in removals - set(upserts)]
        if not items:
            return
        # the client's own publish path: written through where caught up (also inline)
        result = self.sow.append_blocks(self.target, [items])
        if result.rejected:
            log.warning("deriver: %s: %d write(s) refused, first: %s", self.target.name,
                        len(result.rejected), result.rejected[0])
        self.sow.handoff_published(self.target, result)

    def reconcile(self, wanted: dict[str, JSONObject]) -> None:
        """Make the target hold exactly ``wanted``: write each, remove every other record
        (after the rows handed to the writer are written)."""
        if self.writer is not None:
            self.writer.drain()
        held = {rec.sow_key for rec in self.sow.sow(self.target.name)}
        self.write(wanted, held - set(wanted))
        self.ready = True

    def close(self) -> None:
        """Write what the writer holds, then stop following (a write that fails is logged:
        whoever follows the topic next rewrites it whole)."""
        self.close_writer()
        self.sub.close()

    def close_writer(self) -> None:
        if self.writer is None:
            return
        try:
            self.writer.close()
        except Exception as exc:
            log.warning("deriver: %s: the last rows were not written: %s", self.target.name,
                        exc)
        self.writer = None


class _ViewFollower(_Follower):
    """A view: the rows of its projection, rewritten as changes alter them."""

    agg: Aggregation

    def __init__(self, sow: Sow, target: TopicConfig) -> None:
        self.agg = Aggregation(list(target.projection), list(target.grouping),
                               domain=target.name)
        # the fields the projection reads, not the whole record (none: it reads a nested path)
        self.decode = self.agg.decode_inputs
        self._take = self.agg.take_inputs or self.agg.take_changes
        super().__init__(sow, target)

    def take(self, msg: Message) -> None:
        kind = msg["kind"]
        if kind == "changes":  # first: nearly every change comes in one (Subscriber batches)
            # as a publish / oof message each: an update within a group is marked directly
            self._take(msg["changes"], self.dirty if self.ready else set(), self.changed)
        elif kind == "publish":
            self.changed(self.agg.upsert_keys(msg["sow_key"], msg["data"]))
        elif kind == "oof":
            self.changed(self.agg.remove_keys(msg["sow_key"]))
        elif kind == "sow":
            self.agg.upsert(msg["sow_key"], msg["data"])
        elif kind == "group_end":
            self.reconcile(dict(self.agg.rows()))


class _ConflationFollower(_Follower):
    """A conflated topic: the latest version of each changed record, every interval."""

    def __init__(self, sow: Sow, target: TopicConfig) -> None:
        self.due = 0.0
        super().__init__(sow, target)

    def take(self, msg: Message) -> None:
        kind = msg["kind"]
        if kind == "sow":
            self._initial[msg["sow_key"]] = msg["data"]
        elif kind == "group_end":
            initial, self._initial = self._initial, {}
            self.reconcile(initial)
            self.due = time.monotonic() + self.target.interval_ms / 1000
        elif kind in ("publish", "oof"):
            self.mark(msg["sow_key"], msg["data"] if kind == "publish" else None)
        elif kind == "changes":  # a publish or an oof (record None) each
            for key, record in msg["changes"]:
                self.mark(key, record)

    def flush(self) -> None:
        now = time.monotonic()
        if self.ready and now >= self.due:
            self.due = now + self.target.interval_ms / 1000
            super().flush()


class _JoinFollower(_Follower):
    """A view of two topics joined on a field: its projection over the joined rows, each
    ``{<first topic>: record, <second topic>: record}`` for every pair of records whose
    join fields are equal (an inner join); the filter applies to the joined rows."""

    agg: Aggregation

    def __init__(self, sow: Sow, target: TopicConfig) -> None:
        self.agg = Aggregation(list(target.projection), list(target.grouping),
                               domain=target.name)
        self.names = (target.underlying, target.joined)
        self.paths = tuple(split_path(p) for p in target.join)
        self.pred = compile_filter(target.filter) if target.filter else None
        self.records: tuple[dict[str, JSONObject], ...] = ({}, {})
        self.by_value: tuple[dict[str, set[str]], ...] = ({}, {})
        self.rows, self.gone, self.dirty = {}, set(), set()
        self.ends = 0
        self.sow, self.target = sow, target
        self.subs = [Subscriber(sow.r, sow.topic(name), oof=True, sow=True, bookmarks=False)
                     for name in self.names]
        self.sub = self.subs[0]
        self.ready = False

    def step(self, wait: float = STEP_S) -> int:
        n = 0
        until = time.monotonic() + FLUSH_S
        for side, sub in enumerate(self.subs):
            msg = sub.get(wait / 2)
            while msg is not None:
                n += 1
                self._take(side, msg)
                if not n % 64 and time.monotonic() >= until:
                    break
                msg = sub.get(0.0001)
        self.flush()
        return n

    def take(self, msg: Message) -> None:  # pragma: no cover - the sides go by _take
        raise NotImplementedError

    def _take(self, side: int, msg: Message) -> None:
        kind = msg["kind"]
        if kind in ("sow", "publish"):
            self._set(side, msg["sow_key"], msg["data"])
        elif kind == "oof":
            self._set(side, msg["sow_key"], None)
        elif kind == "group_end":
            self.ends += 1
            if self.ends == 2:
                self.rows, self.gone, self.dirty = {}, set(), set()
                self.reconcile(dict(self.agg.rows()))

    def _set(self, side: int, key: str, record: JSONObject | None) -> None:
        """Take a record's new version (None: removed) on one side of the join."""
        records, index, other = self.records[side], self.by_value[side], 1 - side
        old = records.pop(key, None)
        value = None if old is None else _join_value(old, self.paths[side])
        if value is not None:
            index.get(value, set()).discard(key)
            for partner in self.by_value[other].get(value, ()):
                self.changed(self.agg.remove_keys(_pair(side, key, partner)))
        if record is None:
            return
        records[key] = record
        value = _join_value(record, self.paths[side])
        if value is None:  # a null or missing join field joins nothing
            return
        index.setdefault(value, set()).add(key)
        for partner in self.by_value[other].get(value, ()):
            left, right = ((record, self.records[other][partner]) if side == 0
                           else (self.records[other][partner], record))
            row = {self.names[0]: left, self.names[1]: right}
            if self.pred is None or _matches(self.pred, row):
                self.changed(self.agg.upsert_keys(_pair(side, key, partner), row))

    def close(self) -> None:
        self.close_writer()
        for sub in self.subs:
            sub.close()


def _pair(side: int, key: str, partner: str) -> str:
    """The key of a joined row: the first topic's SOW key, then the second's."""
    return f"{key}|{partner}" if side == 0 else f"{partner}|{key}"


def _join_value(record: JSONObject, path: tuple[str, ...]) -> str | None:
    """A record's join field as key text; None when null or missing (it joins nothing)."""
    value = get_path(record, path)
    if value is None:
        return None
    return orjson.dumps(value).decode() if type(value) is str else canonical(value)


def _matches(pred: JSON, row: JSONObject) -> bool:
    try:
        return bool(pred(row))
    except (FilterEvalError, RecursionError, TypeError, ValueError):
        return False


_FOLLOWERS = {"view": _ViewFollower, "conflated_topic": _ConflationFollower}


class Deriver:
    """Keeps every view and conflated topic of the registry (see the module docstring).

    ``loop()`` does one unit of work (each follower takes what arrived and writes what is
    due; every :data:`LEASE_RENEW_S` seconds the leases are renewed and the registry is read
    for derived topics added, changed or removed); ``run()`` repeats it until :meth:`stop`.

    Args:
        sow: the client the deriver reads and writes through (its mode decides who applies
            the writes: the workers, or this process when inline).
        stop: the event that stops :meth:`run` (default: a new one); the CLI passes the one
            its start-up's signal handlers set, so a SIGTERM before :meth:`run` is not lost.
        settle: call :func:`settle_heap` when a follower's initial records are in (the
            objects since the last settle) and when one is dropped (the whole heap): the
            CLI's deriver, a process of its own; the freeze is the whole process's, so a
            deriver inside another program leaves it off (the default).
    """

    def __init__(self, sow: Sow, stop: StopEvent | None = None, settle: bool = False) -> None:
        self.sow = sow
        self.settle = settle
        self._unsettled: bool | None = None  # settle_heap(full) due: True a follower was
        # dropped, False one became ready
        self.owner = f"derive:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.scripts = Scripts(sow.r)
        self.followers: dict[str, _Follower] = {}
        self._next_renew = 0.0
        self._stop = StopEvent() if stop is None else stop

    def loop(self) -> int:
        """One unit of work; returns the messages taken (see :meth:`_Follower.step`)."""
        if time.monotonic() >= self._next_renew:
            self._refresh()
            self._next_renew = time.monotonic() + LEASE_RENEW_S
        taken = 0
        wait = STEP_S / max(1, len(self.followers))
        for name, follower in list(self.followers.items()):
            ready = follower.ready
            try:
                taken += follower.step(wait)
            except Exception as exc:  # one topic's trouble never stops the others
                log.warning("deriver: %s: %s; following it again", name, exc)
                follower.close()
                del self.followers[name]
                self._next_renew = 0.0
                self._unsettled = True
            else:
                if follower.ready and not ready and not self._unsettled:
                    self._unsettled = False
        if self._unsettled is not None and self.settle:
            settle_heap(full=self._unsettled)
        self._unsettled = None
        if not self.followers:
            self._stop.wait(STEP_S * 10)
        return taken

    def _refresh(self) -> None:
        """Renew the leases, take free derived topics, drop those gone or changed."""
        derived = {t.name: t for t in load_topics(self.sow.r).values() if t.derived}
        for name, follower in list(self.followers.items()):
            target = derived.get(name)
            if target != follower.target or not self._lease(name):
                follower.close()
                del self.followers[name]
                self._unsettled = True
        for name, target in derived.items():
            if name not in self.followers and self._lease(name):
                follow = _JoinFollower if target.joined else _FOLLOWERS[target.kind]
                try:
                    self.followers[name] = follow(self.sow, target)
                except Exception as exc:  # e.g. the underlying topic is not defined yet
                    log.warning("deriver: %s: cannot follow %s: %s", name, target.underlying,
                                exc)
                    self._release(name)

    def _lease(self, name: str) -> bool:
        """Take or renew the lease on derived topic ``name``; False when another holds it."""
        return self.scripts.lease_acquire(keys.derive_lease(name), keys.derive_state(name),
                                          self.owner, LEASE_TTL_MS) is not None

    def _release(self, name: str) -> None:
        self.scripts.lease_release(keys.derive_lease(name), self.owner)

    def run(self) -> None:
        """Run :meth:`loop` until :meth:`stop` (or SIGTERM / SIGINT in the main thread)."""
        if threading.current_thread() is threading.main_thread():
            stop_on_signals(self._stop)
        while not self._stop.is_set():
            self.loop()
        for name, follower in list(self.followers.items()):
            follower.close()
            self._release(name)
        self.followers.clear()

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current loop."""
        self._stop.set()

    def burst(self, timeout_s: float = BURST_TIMEOUT_S) -> list[str]:
        """Make every derived topic whose lease is free equal to what its underlying topic
        gives now, then return (``sow-redis derive --burst``); returns their names.

        Raises:
            TimeoutError: a derived topic was not whole after ``timeout_s`` seconds.
        """
        self._refresh()
        deadline = time.monotonic() + timeout_s
        try:
            for name, follower in self.followers.items():
                while not follower.ready:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{name} was not whole after {timeout_s:g} s")
                    follower.step()
            return sorted(self.followers)
        finally:
            for name, follower in list(self.followers.items()):
                follower.close()
                self._release(name)
            self.followers.clear()
