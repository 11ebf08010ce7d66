"""The worker's pipeline: a partition's log entries → typed ops → one atomic ``apply.lua`` call.

One :func:`apply_batch` call

1. reads up to ``batch_size`` entries after the partition's applied cursor (:func:`read_log`),
2. decodes each once into a typed :class:`~sow_redis.model.entries.LogEntry`,
3. resolves SOW keys with the topic's :class:`~sow_redis.apply.keying.KeyResolver` (plain keys, or
   the chaining key generator with its batch look-ahead),
4. reads in one HMGET the stored records that delta merges and deletes by data need, and
   plans typed :mod:`~sow_redis.apply.ops` (merges done here, guarded by compare-and-set),
5. makes one :meth:`Scripts.apply <sow_redis.apply.scripts.Scripts.apply>` call, which checks the
   fencing token and the cursor, so each entry is applied, or written to the partition's error
   stream, exactly once, in order (ARCHITECTURE §3).

Every entry sees the SOW as of its own log time: a record due at or before an entry's stream id
time is gone for that entry (apply.lua expires it first, with its event and dead letter).
A ``sow_delete`` by filter sees every change before it, so the batch is cut there.
A bad entry becomes a :class:`~sow_redis.apply.ops.Reject` with its reason; when the Lua call of a
whole batch fails, the batch is retried one entry per call, so one entry never holds back the
others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from redis import Redis
from redis.connection import ConnectionPool
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)

from .. import keys, streamids
from ..connection import Client, StreamEntry, single_pool
from ..errors import ConflictError, FencedError, FilterSyntaxError, MessageError, ScriptArgsError
from ..logs import fields as event_fields
from ..model import chains
from ..model.chains import ChainConflict
from ..model.entries import Command, LogEntry, decode_entry, original
from ..model.expiry import expiry_for, is_due
from ..model.messages import index_members, merge
from ..model.records import decode as decode_record
from ..model.topic import TopicConfig
from ..partition_state import read_cursor
from ..query.sow import partition_candidates
from .keying import KeyResolver, Resolved, check_members, resolver, verified_prepared
from .ops import Ack, ChainLink, Delete, Op, Reject, Upsert
from .scripts import LogApplied, PendingCall, Scripts, attached

log = logging.getLogger(__name__)


# -- reading ----------------------------------------------------------------------------------
def _raw_xrange_client(pool: ConnectionPool) -> Client:
    raw = Redis(connection_pool=pool)
    raw.set_response_callback("XRANGE", lambda response, **_options: response)
    return raw


def read_log(r: Client, topic: str, p: int, cursor: str, count: int) -> list[StreamEntry]:
    """Up to ``count`` log entries after ``cursor``, as ``(id, fields)``.

    Uses a sibling client (same connection pool) whose XRANGE reply is left raw: building the
    field dicts here costs half of what redis-py's generic stream parser does.
    """
    pool = single_pool(r)
    if pool is None:  # redis-py's parser; the cluster client follows slot redirections
        return [(sid, dict(fields)) for sid, fields in cast(
            "list[StreamEntry]", r.xrange(keys.log(topic, p), min="(" + cursor, count=count))]
    raw = attached(r, "raw_xrange", lambda _c: _raw_xrange_client(pool))
    out = []
    for sid, flat in raw.xrange(keys.log(topic, p), min="(" + cursor, count=count):
        it = iter(flat)
        out.append((sid, dict(zip(it, it))))
    return out


# -- rejections -------------------------------------------------------------------------------
def _rejection(exc: BaseException) -> tuple[str, str]:
    """``(reason, detail)`` for whatever one log entry raised: a bad entry goes to the error
    stream with its reason, it never stops the partition."""
    if isinstance(exc, MessageError):
        return exc.reason, exc.detail
    if isinstance(exc, FilterSyntaxError):
        return "bad_filter", str(exc)
    if isinstance(exc, RecursionError):
        return "too_deep", "the message or filter nests too deeply to process"
    if isinstance(exc, UnicodeDecodeError):
        return "bad_encoding", f"not UTF-8 text: {exc.reason} at byte {exc.start}"
    if isinstance(exc, orjson.JSONEncodeError):
        return "bad_message", f"cannot be stored as JSON: {exc}"
    if isinstance(exc, (ResponseError, ScriptArgsError)):
        return "apply_failed", f"the apply script failed on this entry: {exc}"
    return "bad_entry", f"{type(exc).__name__}: {exc}"


def _reject(sid: str, fields: dict[bytes, bytes], exc: BaseException, p: int) -> Reject:
    reason, detail = _rejection(exc)
    log.warning("partition %d: entry %s rejected: %s: %s", p, sid, reason, detail,
                extra=event_fields("rejected", partition=p, id=sid, reason=reason))
    return Reject(sid, reason, detail, *original(fields))


_SERVER_STATES = frozenset(("OOM", "BUSY", "LOADING", "READONLY", "NOSCRIPT", "MASTERDOWN",
                            "CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK", "NOAUTH", "WRONGPASS",
                            "NOPERM", "MISCONF"))
"""Error reply codes that describe the server's state, not the entries being applied."""

_SERVER_ERRORS = (OutOfMemoryError, ReadOnlyError, NoScriptError, NoPermissionError,
                  BusyLoadingError, AuthenticationError)
"""redis-py's classes of such replies: it takes the code (``OOM``, ``READONLY`` …) off their
text, so they are known by class (an out-of-memory reply once rejected the entries of the
batch that met it to the error stream)."""


def _transient(exc: BaseException) -> bool:
    """True for failures that say nothing about the entries (lease lost, record changed,
    Redis unreachable, out of memory, read-only replica, …): never turned into rejections.
    An error reply of the apply script itself (a Lua runtime error) is the entries' fault."""
    if isinstance(exc, (FencedError, ConflictError, *_SERVER_ERRORS)):
        return True
    if isinstance(exc, ResponseError):
        return str(exc).split(" ", 1)[0] in _SERVER_STATES
    return isinstance(exc, RedisError)


# -- planning ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _LogRun:
    """Verified plain publishes at the head of the unapplied log, applied by one
    apply.lua (log) call: ``count`` entries, the last of them ``upto``."""

    count: int
    upto: str


@dataclass
class _Segment:
    """The ops of consecutive entries applied by one Lua call."""

    first: str
    last: str
    ops: list[Op] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    # chain-conflict reports (validation): (field, value) of keys.chain_conflicts
    conflicts: list[tuple[str, bytes]] = field(default_factory=list)


class _Planner:
    """Plans one partition's entries into ops, keeping each record's state as of the ops
    planned so far (``state``: SOW key → (object or None, expiry ms or 0)) and the version the
    worker read it at (``checks``, compare-and-set in apply.lua)."""

    def __init__(self, r: Client, topic: TopicConfig, p: int, keyer: KeyResolver) -> None:
        self.r, self.topic, self.p, self.keyer = r, topic, p, keyer
        self.state: dict[str, tuple[dict[str, Any] | None, int]] = {}
        self.checks: dict[str, int] = {}

    def prefetch(self, wanted: list[str]) -> None:
        """Read, in one call, the stored records of ``wanted`` SOW keys not known yet."""
        wanted = [k for k in dict.fromkeys(wanted) if k not in self.state]
        if wanted:
            raws = cast("list[bytes | None]",
                        self.r.hmget(keys.records(self.topic.name, self.p), wanted))
            for k, raw in zip(wanted, raws):
                self._remember(k, raw)

    def _remember(self, key: str, raw: bytes | None) -> None:
        if raw is None:
            self.state[key], self.checks[key] = (None, 0), 0
            return
        rec = decode_record(key, raw)
        self.state[key] = (orjson.loads(rec.data), rec.expiry_ms)
        self.checks[key] = rec.seq

    def current(self, key: str, at_ms: int) -> dict[str, Any] | None:
        """The record as an entry logged at ``at_ms`` sees it: None when absent or, with
        expiration enabled, due at or before ``at_ms``."""
        if key not in self.state:
            self._remember(key, cast("bytes | None",
                                     self.r.hget(keys.records(self.topic.name, self.p), key)))
        obj, exp = self.state[key]
        if obj is not None and self.topic.expiration_enabled and is_due(exp, at_ms):
            return None
        return obj

    def plan(self, e: LogEntry, res: Resolved | None) -> list[Op]:
        """The ops of one entry (``res``: its resolved key, None for a delete by keys)."""
        if e.delete_keys is not None:
            for k in e.delete_keys:
                self.state[k] = (None, 0)
            return [*(Delete(e.id, k) for k in e.delete_keys), Ack(e.id)]
        assert res is not None and e.obj is not None and e.data is not None
        key = res.sow_key
        if e.command is Command.SOW_DELETE:  # the record this data would update
            self.current(key, e.ms)
            self.state[key] = (None, 0)
            return [Delete(e.id, key), Ack(e.id)]
        obj, data = e.obj, e.data
        delta = e.command is Command.DELTA_PUBLISH
        if delta:
            base = self.current(key, e.ms)
            if base is not None:
                obj = merge(base, obj)
                data = orjson.dumps(obj)
        ex = expiry_for(self.topic, e.expiration_s, e.id)
        now = ex == "now"
        expiry_ms = e.ms if now else (int(ex) if ex else None)
        op = Upsert(e.id, key, data, delta, expiry_ms, now,
                    members=index_members(obj, self.topic, key))
        self.state[key] = (None, 0) if now else (obj, expiry_ms or 0)
        if not res.links:
            return [op]
        return [*(ChainLink(e.id, ident, head) for ident, head in res.links), op]

    def segment(self, entries: list[tuple[LogEntry | Exception, tuple[bytes, dict]]]
                ) -> _Segment:
        """Resolve keys for ``entries`` (decoded, or what decoding raised), read the records
        they need, and plan their ops."""
        seg = _Segment(entries[0][1][0].decode(), entries[-1][1][0].decode())
        self.keyer.prepare([e for e, _raw in entries if isinstance(e, LogEntry)])
        resolved: list[tuple[LogEntry, Resolved | None]] = []
        wanted: list[str] = []
        for e, (sid, fields) in entries:
            if not isinstance(e, LogEntry):  # decoding failed: e is what it raised
                seg.rejects.append(_reject(sid.decode(), fields, e, self.p))
                continue
            if e.obj is None:
                resolved.append((e, None))
                continue
            try:
                res = self.keyer.resolve(e)
                check_members(e, self.topic, res.sow_key)
            except RedisError:
                raise
            except Exception as exc:
                seg.rejects.append(_reject(e.id, fields, exc, self.p))
                if isinstance(exc, ChainConflict) and self.topic.chain_validation:
                    seg.conflicts.append(chains.conflict_report(self.p, e.id, exc))
                continue
            resolved.append((e, res))
            if e.command is not Command.PUBLISH:
                wanted.append(res.sow_key)
        self.prefetch(wanted)
        for entry, keyed in resolved:
            # a failure here after the key resolution changed the chain view: the caller
            # retries the batch one entry per call (see apply_batch)
            seg.ops += self.plan(entry, keyed)
        return seg

    def filter_delete(self, e: LogEntry) -> _Segment:
        """A ``sow_delete`` by filter: every stored record it matches (records due at the
        entry's time are expired by apply.lua instead of deleted)."""
        # start-up time: the filter grammar (lark, re2: ~0.13 s) loads only for a filter
        from ..query.filter import compile_filter

        assert e.delete_filter is not None
        pred = compile_filter(e.delete_filter)
        # a filter that pins the key fields reads those records only, else a scan
        ops: list[Op] = [Delete(e.id, rec.sow_key)
                         for rec in partition_candidates(self.r, self.topic, self.p, pred)
                         if pred(rec.obj())]
        ops.append(Ack(e.id))
        self.state.clear()  # the records are re-read after this segment is applied
        self.checks.clear()
        return _Segment(e.id, e.id, ops)

    def seal(self, seg: _Segment) -> _Segment:
        """Give the first op on each record the worker read its compare-and-set version."""
        for op in seg.ops:
            if isinstance(op, (Upsert, Delete)) and op.sow_key in self.checks:
                op.expect_seq = self.checks.pop(op.sow_key)
        return seg


# -- applying ---------------------------------------------------------------------------------
def apply_batch(r: Client, scripts: Scripts, topic: TopicConfig, p: int, fence: int,
                batch_size: int, cursor: str | None = None) -> tuple[int, str]:
    """Apply the next batch of partition ``p``'s log.

    Args:
        cursor: the applied cursor when the caller knows it (saves a round trip), else read.

    Returns:
        ``(log entries consumed (applied or rejected), applied cursor)``; 0 entries when the
        log is drained.

    Raises:
        FencedError: the lease was taken over; stop working on this partition.
        ConflictError: records kept changing under the worker for 5 attempts in a row.
        redis.exceptions.RedisError: Redis is unreachable or refused a command.
    """
    for _attempt in range(5):
        if cursor is None:
            cursor = read_cursor(r, topic.name, p)
        entries = read_log(r, topic.name, p, cursor, batch_size)
        if not entries:
            return 0, cursor
        try:
            try:
                _apply_entries(r, scripts, topic, p, fence, entries)
            except Exception as exc:
                if _transient(exc):
                    raise
                log.warning("topic %s[%d]: batch of %d failed (%s); retrying entry by entry",
                            topic.name, p, len(entries), exc)
                _apply_one_by_one(r, scripts, topic, p, fence, entries)
            return len(entries), entries[-1][0].decode()
        except ConflictError:
            # a record changed (e.g. expired) between our read and the apply: plan again
            cursor = None
            continue
    raise ConflictError(f"topic {topic.name} partition {p}: records keep changing under the worker")


class PartitionApplier:
    """Applies one partition's log batch after batch under a fencing token the caller holds,
    planning batch k+1 in Python while Redis runs the Lua call of batch k.

    Redis runs one command at a time, so anything sent while a script runs waits for it. Each
    :meth:`step` therefore reads batch k+1 first (Redis is idle then), sends the call of batch
    k planned in the previous step (on a connection of its own, its reply read later), plans
    batch k+1 while that call runs, then reads the reply.

    The planner keeps every record's state as of the ops planned so far, across batches, so
    batch k+1 never needs what batch k writes: a record it reads from Redis is one no planned
    batch touches, and compare-and-set guards it anyway. When batch k fails, the planned batch
    k+1 is dropped and planning starts again from the cursor in Redis: a ``ConflictError``
    re-plans, a failing batch is retried one entry per call (as :func:`apply_batch` does),
    ``FencedError`` and Redis errors are raised. A batch holding a ``sow_delete`` by filter is
    applied on its own, after everything before it (the filter must see all of that).

    A publisher's write-through (lua/include/apply_appended.lua) or a Spark load (lua/include/apply_load.lua)
    may apply entries of a caught-up partition between two batches: a planned batch the
    cursor has moved into is refused (``ConflictError``: planned again), and the planner is
    dropped whenever the cursor is not where this applier left it.

    Nothing read from the log is taken on trust. A plain publish that carries the SOW key and
    index members sow_redis's publisher computed (fields ``k``/``m``) needs no planning once
    this worker has checked them against the data
    (:func:`~sow_redis.apply.keying.verified_prepared`): while a batch starts with such entries,
    :meth:`step` lets ``apply.lua`` (operation ``log``) apply them inside Redis up to the last one checked
    (one call, no round trip of the messages back), and plans here from the first entry
    it leaves (a delta, a delete, a message expiration, a chaining topic's entry, an entry
    without ``k``, and one whose ``k`` or ``m`` is not what its data gives, which the planner
    rejects to the error stream as ``forged_key`` / ``forged_members``). After a planned
    batch that ends with such a publish, it tries the script again.

    Call :meth:`step` until :attr:`drained`, and :meth:`finish` always (``finally``) before
    the lease is released.
    """

    STATE_MAX = 200_000
    """Records whose planned state is kept at most; past that the planner starts afresh."""

    def __init__(self, r: Client, scripts: Scripts, topic: TopicConfig, p: int, fence: int,
                 batch_size: int) -> None:
        self.r, self.scripts, self.topic, self.p = r, scripts, topic, p
        self.fence, self.batch_size = fence, batch_size
        self._planner: _Planner | None = None
        self._cursor: str | None = None  # after the last batch read (None: read it again)
        # planned, not sent yet: a segment for apply.lua, or a run of verified publishes for
        # apply.lua (log) (how many, the stream id of the last)
        self._planned: tuple[_Segment | _LogRun, list] | None = None
        self._inflight: tuple[PendingCall[object], _Segment | _LogRun, list] | None = None
        self.drained = False
        """True after a :meth:`step` that found the log drained with nothing left to apply."""
        self._in_redis = not topic.chaining  # the next batch may start with prepared publishes
        self._trusted_skip = 0  # steps before the next look for trusted entries
        if topic.transient:
            rebuild_if_lost(scripts, topic, p, fence)

    def _reset(self) -> None:
        self._planner, self._cursor, self._planned = None, None, None

    def _send(self) -> None:
        """Send the planned batch (the previous call's reply must have been read)."""
        if self._planned is None:
            return
        seg, entries = self._planned
        self._planned = None
        call: PendingCall[object]
        if isinstance(seg, _LogRun):
            call = self.scripts.send_apply_log(self.topic, self.p, self.fence, seg.count,
                                               seg.upto)
        else:
            _write_conflicts(self.r, self.topic, seg)
            call = self.scripts.send_apply(self.topic, self.p, self.fence, seg.first, seg.last,
                                           seg.rejects, seg.ops)
        self._inflight = (call, seg, entries)

    def _settle(self) -> int:
        """Read the reply of the call in flight; returns its entries once applied (0: none,
        or it failed; then everything planned after it is dropped)."""
        if self._inflight is None:
            return 0
        call, seg, entries = self._inflight
        self._inflight = None
        if isinstance(seg, _LogRun):
            return self._settle_log_run(call, seg)
        try:
            call.result()
            return len(entries)
        except ConflictError:
            self._reset()
            return 0
        except Exception as exc:
            if _transient(exc):
                self._reset()
                raise
            log.warning("topic %s[%d]: batch of %d failed (%s); retrying entry by entry",
                        self.topic.name, self.p, len(entries), exc)
            self._reset()
            _apply_one_by_one(self.r, self.scripts, self.topic, self.p, self.fence, entries)
            return len(entries)

    def _flush(self) -> int:
        """Apply everything planned or in flight; returns the entries applied."""
        done = self._settle()
        self._send()
        return done + self._settle()

    TRUSTED_SKIP = 8
    """Steps without a look for trusted entries after a look found none at the head of the
    log (entries of clients that append with XADD: verified here instead)."""

    def _apply_trusted(self) -> int | None:
        """One apply.lua (log) call for the trusted entries at the head of the unapplied log
        (nothing planned or in flight). Returns the entries applied, or None when it applied
        none before an entry the worker must read (the caller goes on to read the batch)."""
        try:
            res = self.scripts.apply_log(self.topic, self.p, self.fence, self.batch_size)
        except Exception as exc:
            if _transient(exc):
                self._reset()
                raise
            log.warning("topic %s[%d]: apply_log failed (%s); verifying in the worker",
                        self.topic.name, self.p, exc)
            self._trusted_skip = self.TRUSTED_SKIP
            return None
        known, self._cursor = self._cursor, res.cursor
        if res.applied or res.cursor != known:
            self._planner = None  # its view of the records is older than these writes
        if res.applied:
            return res.applied
        if res.stopped:
            self._trusted_skip = self.TRUSTED_SKIP
            return None
        self.drained = True
        return 0

    def _settle_log_run(self, call: PendingCall[object], run: _LogRun) -> int:
        """The reply of an apply.lua (log) call: the entries it applied. When it did not reach
        the run's last entry (an entry Lua would not take, a write-through that moved the
        cursor meanwhile) or failed, everything planned after it is dropped and planning
        starts again from the cursor in Redis (the planned path applies those entries,
        rejecting what it must)."""
        try:
            res = cast(LogApplied, call.result())  # the reply of send_apply_log
        except Exception as exc:
            self._reset()
            if _transient(exc):
                raise
            log.warning("topic %s[%d]: apply_log failed (%s); planning in the worker",
                        self.topic.name, self.p, exc)
            self._in_redis = False
            return 0
        if res.cursor != run.upto:
            self._reset()
            self._in_redis = False
        return res.applied

    def step(self) -> int:
        """Read the next batch, send the one planned before, plan the new one; returns the log
        entries whose apply completed during this call. :attr:`drained` tells when nothing
        was left.

        A batch that starts with plain publishes whose SOW key and index members this worker
        verified against their data (:func:`~sow_redis.apply.keying.verified_prepared`) is applied
        by apply.lua (log) up to the last of them, without the messages' round trip back; like
        a planned batch, it is verified here while Redis applies the batch before it."""
        self.drained = False
        done = 0
        if self._in_redis and not self._trusted_skip:
            # entries a trusted caller appended: apply.lua (log) applies them unread
            done = self._flush()
            trusted = self._apply_trusted()
            if trusted is not None:
                self.drained = self.drained and not done
                return done + trusted
        self._trusted_skip = max(0, self._trusted_skip - 1)
        if self._cursor is None:
            done += self._flush()
            if self._cursor is None:
                self._cursor = read_cursor(self.r, self.topic.name, self.p)
        entries = read_log(self.r, self.topic.name, self.p, self._cursor, self.batch_size)
        if not entries:
            done += self._flush()
            self.drained = self._cursor is not None and not done
            return done
        run = [(_decode(sid, fields, self.topic), (sid, fields)) for sid, fields in entries]
        if any(b"filter" in fields for _sid, fields in entries) and any(
                isinstance(e, LogEntry) and e.is_filter_delete for e, _raw in run):
            return self._sequentially(done + self._flush())
        self._send()  # batch k runs on Redis while batch k+1 is verified or planned here
        if self._in_redis:
            verified = self._verified_run(run, entries, done)
            if verified is not None:
                return verified
        if self._planner is None or len(self._planner.state) > self.STATE_MAX:
            self._planner = _Planner(self.r, self.topic, self.p,
                                     resolver(self.r, self.topic, self.p))
        planner = self._planner
        try:
            seg = planner.seal(planner.segment(run))
        except RedisError:
            self._settle()
            self._reset()
            raise
        except Exception:  # planning failed after keys were resolved
            return self._sequentially(done + self._settle())
        done += self._settle()
        if self._cursor is None:  # batch k failed: what was planned on top of it is dropped
            return done
        self._planned = (seg, entries)
        self._cursor = seg.last
        self._in_redis = _prepared_publish(run[-1][0], self.topic)
        return done

    def _verified_run(self, run: list[tuple[LogEntry | Exception, StreamEntry]],
                      entries: list[StreamEntry], done: int) -> int | None:
        """Plan the plain publishes at the head of ``entries`` that this worker verified
        (:func:`~sow_redis.apply.keying.verified_prepared`) as a run apply.lua (log) applies
        unread; the rest of the batch (if any) is planned in the next step. ``done``: entries
        already applied in this step.

        Returns:
            ``done`` plus the entries whose apply completed meanwhile; None when the batch
            does not start with such a publish (it is planned as usual).
        """
        n = 0
        for e, _raw in run:
            if not (isinstance(e, LogEntry) and verified_prepared(e, self.topic, self.p)):
                break
            n += 1
        if not n:
            self._in_redis = False
            return None
        done += self._settle()
        if self._cursor is None:  # batch k failed: read again from Redis
            return done
        upto = entries[n - 1][0].decode()
        self._planned = (_LogRun(n, upto), entries[:n])
        self._cursor = upto
        self._planner = None  # the run writes records the planner may have read
        self._in_redis = n == len(entries)
        return done

    def _sequentially(self, done: int) -> int:
        """Once nothing is planned or in flight: apply the next batch without overlap
        (:func:`apply_batch`, with its entry-by-entry fallback) and start planning afresh.
        ``done``: entries already applied in this step; returns it plus this batch's."""
        self._planner = None
        if self._cursor is None:  # what was in flight failed: read again next step
            return done
        n, self._cursor = apply_batch(self.r, self.scripts, self.topic, self.p, self.fence,
                                      self.batch_size, self._cursor)
        return done + n

    def finish(self) -> int:
        """Apply what is planned and wait for every call (never leaves one unread); returns
        the entries applied."""
        return self._flush()

    @property
    def cursor(self) -> str | None:
        """The cursor after every batch read so far (None: unknown, read again)."""
        return self._cursor


def rebuild_if_lost(scripts: Scripts, topic: TopicConfig, p: int, fence: int) -> bool:
    """Before a worker applies partition ``p`` of a transient topic under fencing token
    ``fence``: when its SOW was lost (no cursor in its state hash), start rebuilding it
    from its log at the topic's ``recovery_point`` (``lua/rebuild.lua``; AMPS SOW
    ``Durability`` transient and ``RecoveryPoint``, seeds/004). The applier then replays the
    log through apply.lua as ever; entries up to the log's end at this moment make no change
    events (docs/operations.md, "Persistent and transient topics").

    Returns:
        True when a rebuild started.

    Raises:
        FencedError: ``fence`` is stale.
    """
    started, cursor, horizon = scripts.rebuild(topic, p, fence)
    if started:
        log.warning("%s[%d]: the SOW was lost; rebuilding it from the log after %s "
                    "(recovery point %s; replayed without change events up to %s)",
                    topic.name, p, cursor, topic.recovery_point, horizon,
                    extra=event_fields("sow_rebuild", topic=topic.name, partition=p, cursor=cursor,
                                 horizon=horizon, recovery_point=topic.recovery_point))
    return started


def _prepared_publish(e: LogEntry | Exception, topic: TopicConfig) -> bool:
    """True for an entry apply.lua (log) may apply itself once verified (see
    :class:`PartitionApplier`): a candidate for the next step's in-Redis apply."""
    return (isinstance(e, LogEntry) and e.command is Command.PUBLISH
            and e.prepared_key is not None and e.expiration_s is None
            and (not topic.n_indexes or b"m" in e.fields))


def _apply_one_by_one(r: Client, scripts: Scripts, topic: TopicConfig, p: int, fence: int,
                      entries: list) -> None:
    """Apply ``entries`` one per Lua call; an entry whose call fails is rejected (written to
    the error stream by a call that only moves the cursor past it)."""
    cursor = read_cursor(r, topic.name, p)
    for raw_sid, fields in entries:
        sid = raw_sid.decode()
        if streamids.reached(cursor, sid):
            continue  # applied by an earlier segment of the failed batch
        try:
            _apply_entries(r, scripts, topic, p, fence, [(raw_sid, fields)])
        except Exception as exc:
            if _transient(exc):
                raise
            _call(r, scripts, topic, p, fence,
                  _Segment(sid, sid, rejects=[_reject(sid, fields, exc, p)]))


CONFLICTS_MAX = 100_000
"""Chain-conflict reports kept per topic at most, as the error stream keeps its last 100,000
entries: a feed that keeps sending conflicting messages does not grow the hash without
bound. Past it (by a tenth, so one ``HKEYS`` per 10,000 reports), the oldest go."""


def _write_conflicts(r: Client, topic: TopicConfig, seg: _Segment) -> None:
    """Keep the segment's chain-conflict reports (validation on): idempotent HSETs keyed by
    stream id, written before the apply call; at most :data:`CONFLICTS_MAX` per topic."""
    if not seg.conflicts:
        return
    name = keys.chain_conflicts(topic.name)
    pipe = r.pipeline(transaction=False)
    pipe.hset(name, mapping=dict(seg.conflicts))
    pipe.hlen(name)
    size = int(pipe.execute()[1])
    if size > CONFLICTS_MAX + CONFLICTS_MAX // 10:
        r.hdel(name, *_oldest_conflicts(cast("list[bytes]", r.hkeys(name)), CONFLICTS_MAX))


def _oldest_conflicts(fields: list[bytes], keep: int) -> list[bytes]:
    """The fields of :func:`keys.chain_conflicts` (``<partition>:<stream id>``) beyond the
    newest ``keep`` by stream id; a field of another form (a foreign write) first."""
    def age(f: bytes) -> tuple[int, int, int]:
        try:
            return (1, *streamids.parse(f.split(b":", 1)[1]))
        except (ValueError, IndexError):
            return (0, 0, 0)

    ordered = sorted(fields, key=age)
    return ordered[:max(0, len(ordered) - keep)]


def _call(r: Client, scripts: Scripts, topic: TopicConfig, p: int, fence: int,
          seg: _Segment) -> None:
    _write_conflicts(r, topic, seg)
    scripts.apply(topic, p, fence, seg.first, seg.last, seg.rejects, seg.ops)


def _decode(sid: bytes, fields: dict[bytes, bytes], topic: TopicConfig) -> LogEntry | Exception:
    try:
        return decode_entry(sid, fields, topic)
    except Exception as exc:
        return exc


def _apply_entries(r: Client, scripts: Scripts, topic: TopicConfig, p: int, fence: int,
                   entries: list) -> None:
    planner = _Planner(r, topic, p, resolver(r, topic, p))
    run: list[tuple[LogEntry | Exception, tuple[bytes, dict]]] = []
    for raw in entries:
        e = _decode(raw[0], raw[1], topic)
        if isinstance(e, LogEntry) and e.is_filter_delete:
            # a filter delete sees every change before it: apply what is planned so far first
            if run:
                _call(r, scripts, topic, p, fence, planner.seal(planner.segment(run)))
                run = []
            try:
                seg = planner.filter_delete(e)
            except RedisError:
                raise
            except Exception as exc:
                seg = _Segment(e.id, e.id, rejects=[_reject(e.id, raw[1], exc, p)])
            _call(r, scripts, topic, p, fence, seg)
        else:
            run.append((e, raw))
    if run:
        _call(r, scripts, topic, p, fence, planner.seal(planner.segment(run)))
