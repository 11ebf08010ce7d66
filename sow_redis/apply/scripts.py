"""Loads ``sow_redis/apply/lua/*.lua`` once per client and exposes typed wrappers.

Scripts are registered with redis-py's ``register_script`` (EVALSHA, falling back to EVAL
after a script cache flush), which works on a single server, on a Redis Cluster (all keys of
one call share a hash tag) and on fakeredis for the ``memory://`` backend. Callers never call
``evalsha`` themselves.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, cached_property, lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar, cast

import msgpack
from redis.exceptions import NoScriptError, ResponseError

from .. import keys
from ..connection import Client, Fields, Pipeline, single_pool
from ..errors import from_script_error
from ..model.expiry import expiry_for
from .ops import Ack, ChainLink, Delete, Op, Reject, Upsert

if TYPE_CHECKING:
    from ..model.topic import TopicConfig

INCLUDE = re.compile(r"^--@include (\w+)$", re.M)

T_co = TypeVar("T_co", covariant=True)
"""What a :class:`PendingCall` returns."""

ScriptArg: TypeAlias = "str | bytes | int | float"
"""One ARGV value of a script call, as redis-py sends it (numbers as their decimal text)."""

Reply: TypeAlias = Any
"""A script's reply as redis-py parses it (integers, bytes, nested lists): each wrapper
reads the shape its script documents in its header (``Output:``)."""


@cache
def script_source(name: str) -> str:
    """Text of ``sow_redis/apply/lua/<name>.lua`` as written (includes not expanded)."""
    return resources.files(__package__).joinpath(f"lua/{name}.lua").read_text(encoding="utf-8")


def expanded_source(name: str) -> str:
    """Script text with every ``--@include <part>`` line replaced by ``lua/include/<part>.lua``."""
    def include(m: re.Match[str]) -> str:
        return script_source(f"include/{m.group(1)}")

    return INCLUDE.sub(include, script_source(name))


def attached(r: Client, name: str, make: Callable[[Client], Any]) -> Any:
    """A helper object kept on the client ``r`` itself (made once by ``make(r)``), so it lives
    exactly as long as the client and can never be handed to another client. (Typed
    ``Any``: callers ``cast`` the object to what their ``make`` builds.)"""
    attr = f"_sow_{name}"
    value = getattr(r, attr, None)
    if value is None:
        value = make(r)
        setattr(r, attr, value)
    return value


def script_names() -> list[str]:
    """Names of every bundled script (file stem)."""
    return sorted(
        p.name[:-4] for p in resources.files(__package__).joinpath("lua").iterdir()
        if p.is_file() and p.name.endswith(".lua")
    )


class Scripts:
    """The bundled scripts registered on one Redis client."""

    def __init__(self, r: Client) -> None:
        self._r = r
        self._scripts = {name: r.register_script(expanded_source(name)) for name in script_names()}
        self._packing: str | None = None

    @property
    def packing(self) -> str:
        """How apply.lua's per-op fields travel: ``"msgpack"`` (one argument, where the
        server's Lua has cmsgpack, as every Redis has) or ``"flat"`` (one argument per
        field; fakeredis for memory:// has no cmsgpack). Asked of the server on first use."""
        if self._packing is None:
            self._packing = _packing(self._r)
        return self._packing

    def call(self, name: str, keys: list[str], args: Sequence[ScriptArg]) -> Reply:
        """Run script ``name``; ``SOW_<CODE>`` error replies raise their SowError class."""
        try:
            return self._scripts[name](keys=keys, args=args)
        except ResponseError as exc:
            raise from_script_error(exc) from None

    def queue(self, pipe: Pipeline, name: str, keys: list[str], args: Sequence[ScriptArg]
              ) -> None:
        """Queue script ``name`` on a pipeline as a bare EVALSHA (its reply comes from
        :meth:`execute`; no SCRIPT EXISTS round trip per pipeline)."""
        # execute_command, not pipe.evalsha: redis-py's cluster pipeline refuses the method
        # (it routes the command by its first key all the same)
        pipe.execute_command("EVALSHA", self._scripts[name].sha, len(keys), *keys, *args)
        calls = getattr(pipe, "_sow_calls", None)
        if calls is None:
            calls = []
            pipe._sow_calls = calls  # type: ignore[attr-defined]
        calls.append((name, keys, args))

    def execute(self, pipe: Pipeline) -> list[Reply]:
        """Execute a non-transactional pipeline of :meth:`queue` calls only, loading the
        scripts once if the server lost them (restart, SCRIPT FLUSH) and running the calls
        again in a new pipeline (the calls that ran on nodes of a cluster holding the
        scripts run again, as on a restart).

        Raises:
            redis.exceptions.RedisError: as ``Pipeline.execute``.
        """
        try:
            return pipe.execute()
        except NoScriptError:
            for script in self._scripts.values():
                self._r.script_load(script.script)
            again = self._r.pipeline(transaction=False)
            for name, ks, args in getattr(pipe, "_sow_calls", []):
                self.queue(again, name, ks, args)
            return again.execute()

    def apply(self, topic: TopicConfig, p: int, fence: int, first: str, last: str,
              rejects: Sequence[Reject], ops: Sequence[Op]) -> tuple[int, str]:
        """apply.lua, operation ``planned``: apply the batch of log entries ``first`` … ``last`` (stream ids) of
        partition ``p``: write ``rejects`` to its error stream, apply ``ops`` in order, move the
        cursor to ``last``; atomically.

        Returns:
            ``(ops applied, cursor)``; ``(-1, cursor)`` when the batch was applied before.

        Raises:
            FencedError: ``fence`` is stale (another worker took the lease).
            ConflictError: a record's ``expect_seq`` did not hold; nothing was written.
        """
        ks, argv = apply_args(topic, p, fence, first, last, rejects, ops, self.packing)
        return _apply_reply(self.call("apply", ks, argv))

    def apply_log(self, topic: TopicConfig, p: int, fence: int, count: int,
                  upto: str = "") -> LogApplied:
        """apply.lua, operation ``log``: apply the plain publishes at the head of partition ``p``'s unapplied
        log, read by the script itself, at most ``count`` entries: those inside the ranges a
        trusted caller appended (:func:`sow_redis.keys.trusted`) and those up to stream id
        ``upto``, which the caller has verified (their ``k``/``m`` are what their data
        gives: :func:`sow_redis.apply.keying.verified_prepared`; "" none); it stops before any
        other entry.

        Raises:
            FencedError: ``fence`` is stale (another worker took the lease).
        """
        ks, argv = apply_log_args(topic, p, fence, count, upto or "0-0")
        return _log_applied(self.call("apply", ks, argv))

    def send_apply_log(self, topic: TopicConfig, p: int, fence: int, count: int,
                       upto: str) -> PendingCall[LogApplied]:
        """Send the :meth:`apply_log` call now and read its reply later
        (:meth:`PendingCall.result`, a :class:`LogApplied`), on a connection of its own."""
        ks, argv = apply_log_args(topic, p, fence, count, upto)
        return PendingCall(self, "apply", ks, argv, _log_applied)

    def apply_appended_call(self, topic: TopicConfig, p: int, packed: bytes, marker_ttl_ms: int,
                            through: bool, marker: str
                            ) -> tuple[str, list[str], list[ScriptArg]]:
        """``(sha, KEYS, ARGV)`` of apply.lua's operation ``appended`` for partition ``p``
        (include apply_appended): a publisher's
        append of the entries of one chunk to ``p`` (``packed``: :func:`pack_entries`),
        which the script appends itself, records as trusted and, with ``through``, applies
        when the log held no unapplied entry before them; sent as a bare EVALSHA (see
        :meth:`load`). ``marker``: the job marker value set (``SET NX PX marker_ttl_ms``)
        when entries are left to the workers ("" none). Its reply is ``[entries applied,
        stream id of the last entry appended, 1 when it set the job marker, apply error text
        or ""]``, or ``[-1, why, stored definition]`` when the partition takes entries under
        another definition than ``topic`` (nothing appended; see the script's header); an
        error reply means nothing was appended."""
        ks, argv = partition(topic, p).args("appended", packed, marker_ttl_ms,
                                            "1" if through else "0", marker)
        return self._scripts["apply"].sha, ks, argv

    def delete_now(self, topic: TopicConfig, p: int, fields: Fields,
                   sow_keys: Sequence[str]) -> tuple[int, str] | None:
        """delete_now.lua: append the ``sow_delete`` entry ``fields`` to partition ``p``'s
        log and remove the records of ``sow_keys`` in the same call, also when Redis is out
        of memory (the script is flagged ``allow-oom``), provided the log holds no unapplied
        entry and no shape migration holds the partition.

        Returns:
            ``(records removed, stream id of the entry)``; None when nothing was written
            (unapplied entries wait before it, a migration runs, or the partition stores
            another definition of the topic).
        """
        removed, sid = self.call("delete_now", *partition(topic, p).args(
            "delete_now", msgpack.packb([x for kv in fields.items() for x in kv],
                                        use_bin_type=False), *sow_keys))
        if int(removed) < 0:
            return None
        return int(removed), sid.decode() if isinstance(sid, bytes) else sid

    def load(self, name: str) -> None:
        """``SCRIPT LOAD`` script ``name`` (before sending it as a bare EVALSHA)."""
        self._r.script_load(self._scripts[name].script)

    def send_apply(self, topic: TopicConfig, p: int, fence: int, first: str, last: str,
                   rejects: Sequence[Reject], ops: Sequence[Op]) -> PendingCall[tuple[int, str]]:
        """Send the :meth:`apply` call now and read its reply later
        (:meth:`PendingCall.result`), on a connection of its own: the caller can prepare the
        next batch while Redis runs this one."""
        ks, argv = apply_args(topic, p, fence, first, last, rejects, ops, self.packing)
        return PendingCall(self, "apply", ks, argv, _apply_reply)

    def queue_expire(self, pipe: Pipeline, topic: TopicConfig, p: int, limit: int) -> None:
        """Queue expire.lua for partition ``p`` on ``pipe`` (remove at most ``limit`` due
        records); its reply (from :meth:`execute`) is ``[expired, next due ms or -1, server
        now ms, dead-letter outbox length]``."""
        self.queue(pipe, "expire", *partition(topic, p).args("expire", limit))

    def load_batch(self, topic: str, p: int, marker: str, entries: Sequence[Fields],
                   rejects: Sequence[tuple[str, str, bytes]]) -> tuple[int, str]:
        """load_batch.lua: append a bulk-load batch to partition ``p``'s log exactly once
        (``marker``: ``<load id>:<batch number>``), its ``rejects`` (reason, detail, data) to
        the topic's error stream.

        Returns:
            ``(entries appended, last stream id)``; ``(-1, "")`` when the batch was appended
            before.
        """
        packed = pack_load_batch(entries, rejects)
        n, last = self.call("load_batch", [keys.log(topic, p), keys.loads(topic, p),
                                           keys.partition_errors(topic, p)], [marker, packed])
        return int(n), last.decode() if isinstance(last, bytes) else last

    def apply_load(self, topic: TopicConfig, p: int, load_id: str, splits: int, split: int,
                   batch: int, last: bool, packed: bytes, max_batches: int) -> LoadApplied:
        """apply.lua, operation ``load``: batch ``batch`` of split ``split`` of the bulk load ``load_id`` into
        partition ``p``, in the load's order and exactly once: appended to the log and applied
        when the batches ahead of it are, else staged; then the staged batches that follow
        (``max_batches`` batches in all). ``split`` -1: only the staged batches. ``splits``:
        the load's number of splits (another number than the load's first call gave is
        refused: :attr:`LoadStatus.SPLITS_CHANGED`, ``next`` = (the first number, 0)).

        Args:
            last: this is the split's last batch of partition ``p``.
            packed: :func:`pack_load_batch` of the batch's entries and rejected rows.
        """
        reply = self.call("apply", *partition(topic, p).args(
            "load", load_id, split, batch, "1" if last else "0", packed, max_batches, splits))
        status, applied, rejected, split_at, batch_at = (int(x) for x in reply)
        return LoadApplied(LoadStatus(status), applied, rejected, (split_at, batch_at))

    def rebuild(self, topic: TopicConfig, p: int, fence: int) -> tuple[bool, str, str]:
        """rebuild.lua: when partition ``p`` of transient ``topic`` lost its SOW (its state
        has no cursor), clear what is left of it and set the cursor to the topic's recovery
        point (:attr:`TopicConfig.recovery_ms`), under fencing token ``fence``.

        Returns:
            ``(started, cursor, horizon)``: whether a rebuild started, the applied cursor
            (stream id), and the log's last entry the rebuild replays without change events
            (``""`` when none started).

        Raises:
            FencedError: ``fence`` is stale.
        """
        ms = topic.recovery_ms
        started, cursor, horizon = cast("list[bytes | int]", self.call(
            "rebuild", *partition(topic, p).args("rebuild", fence,
                                                 "now" if ms is None else ms)))

        def text(v: bytes | int) -> str:
            return v.decode() if isinstance(v, bytes) else str(v)
        return bool(started), text(cursor), text(horizon)

    def lease_acquire(self, lease_key: str, state_key: str, owner: str, ms: int) -> int | None:
        """lease_acquire.lua: the fencing token, or None when another owner holds the lease."""
        token = self.call("lease_acquire", [lease_key, state_key], [owner, ms])
        return None if token is None else int(token)

    def lease_release(self, lease_key: str, owner: str) -> bool:
        """lease_release.lua: True when the lease was the caller's and is now free."""
        return bool(self.call("lease_release", [lease_key], [owner]))


def scripts_of(r: Client) -> Scripts:
    """The :class:`Scripts` of client ``r``, made once per client: registering the bundled
    scripts (a SHA1 of each) costs about 0.5 ms, as much as a round trip, which a
    ``sow_delete`` by SOW keys paid on every call."""
    return cast(Scripts, attached(r, "scripts", Scripts))


def pack_entries(entries: Sequence[Fields]) -> bytes:
    """MessagePack of log entries, each the flat array of its field names and values (the
    entries argument of apply.lua (appended) and, inside :func:`pack_load_batch`, of
    apply.lua (load))."""
    return msgpack.packb([[x for kv in fields.items() for x in kv] for fields in entries],
                         use_bin_type=False)


def pack_load_batch(entries: Sequence[Fields], rejects: Sequence[tuple[str, str, bytes]]) -> bytes:
    """The batch argument of load_batch.lua and apply.lua (load): MessagePack of ``[entries,
    rejected rows]``, each entry its fields and values in turn, each rejected row ``[reason,
    detail, data]``. One packed argument instead of one per field: the client packs a batch
    in one C call (redis-py's per-argument packing was a fifth of a load task's time)."""
    return msgpack.packb([[[x for kv in fields.items() for x in kv] for fields in entries],
                          [list(rej) for rej in rejects]], use_bin_type=False)


class LoadStatus(enum.IntEnum):
    """What :meth:`Scripts.apply_load` did with its batch (lua/include/apply_load.lua)."""

    APPLIED = 0
    """Applied (with the staged batches after it); or nothing was staged (split -1)."""
    STAGED = 1
    """Kept until the batches ahead of it are applied."""
    APPLIED_BEFORE = 2
    """Applied by an earlier call (a retried task, a replayed batch, a rerun): nothing done."""
    LOG_BACKLOG = 3
    """The log holds entries the workers' path must apply first (publishes not applied yet,
    or an entry that needs planning); nothing, or the batches up to that entry, applied."""
    MIGRATING = 4
    """A shape migration holds the partition: nothing done."""
    SPLITS_CHANGED = 5
    """The load ran before with another number of splits: nothing done."""
    DEFINITION_CHANGED = 6
    """The partition stores another definition of the topic than the load's (``config
    apply`` changed it since the load read it): nothing done."""


@dataclass(frozen=True, slots=True)
class LoadApplied:
    """Reply of :meth:`Scripts.apply_load`: its status, the log entries it applied and the
    rejected rows it wrote (its batch's and the staged batches'), the load's next
    ``(split, batch)`` in the partition."""

    status: LoadStatus
    applied: int
    rejected: int
    next: tuple[int, int]


@dataclass(frozen=True, slots=True)
class LogApplied:
    """Reply of :meth:`Scripts.apply_log`.

    Attributes:
        applied: log entries applied by the call.
        cursor: the partition's applied cursor after it.
        full: ``count`` entries were applied; the log may hold more.
        stopped: it stopped before an entry the worker must plan (apply.lua).
    """

    applied: int
    cursor: str
    full: bool
    stopped: bool


def retention_args(topic: TopicConfig) -> tuple[int, int]:
    """The change feed retention ARGV of the scripts: changes kept per partition (0: no
    feed) and their age limit in ms (0: none)."""
    return topic.change_retention_count, topic.change_retention_ms


def _pack_op(op: Op) -> tuple[ScriptArg, ...]:
    """apply.lua's 7 ARGV fields of one op: kind, stream id, SOW key (chain: identifier),
    data (chain: head), expiry ("" none, "now", or absolute ms), expected seq ("" unchecked),
    index members."""
    if isinstance(op, Upsert):
        expiry = "now" if op.expire_now else ("" if op.expiry_ms is None else op.expiry_ms)
        return ("delta_publish" if op.delta else "publish", op.id, op.sow_key, op.data, expiry,
                "" if op.expect_seq is None else op.expect_seq, op.members)
    if isinstance(op, Delete):
        return ("sow_delete", op.id, op.sow_key, "", "",
                "" if op.expect_seq is None else op.expect_seq, "")
    if isinstance(op, Ack):
        return ("ack", op.id, "", "", "", "", "")
    if isinstance(op, ChainLink):
        return ("chain", op.id, op.ident, op.head, "", "", "")
    raise TypeError(f"not an apply op: {op!r}")


def _packing(r: Client) -> str:
    """``"msgpack"`` when the server's Lua has the cmsgpack library, else ``"flat"``."""
    try:
        return "msgpack" if r.eval("if cmsgpack then return 1 end return 0", 0) == 1 else "flat"
    except ResponseError:
        return "flat"


def apply_args(topic: TopicConfig, p: int, fence: int, first: str, last: str,
               rejects: Sequence[Reject], ops: Sequence[Op],
               packing: str = "flat") -> tuple[list[str], list[ScriptArg]]:
    """KEYS and ARGV of apply.lua's operation ``planned`` (include apply_planned); with
    ``packing`` ``"msgpack"`` the rejected entries' and ops' fields go as one MessagePack
    array (every field as a string: Redis's cmsgpack takes no binary type)."""
    fields: list[ScriptArg] = []
    for rj in rejects:
        fields += (rj.id, rj.reason, rj.detail, rj.cmd, rj.data, rj.sow_key)
    for op in ops:
        fields += _pack_op(op)
    if packing == "msgpack":
        fields = [msgpack.packb([f if isinstance(f, (str, bytes)) else str(f) for f in fields],
                                use_bin_type=False)]
    return partition(topic, p).args("planned", fence, first, last, len(rejects), packing,
                                    *fields)


def apply_log_args(topic: TopicConfig, p: int, fence: int, count: int,
                   upto: str) -> tuple[list[str], list[ScriptArg]]:
    """KEYS and ARGV of apply.lua's operation ``log`` (include apply_from_log)."""
    return partition(topic, p).args("log", fence, count, upto)


def previous_mode(t: TopicConfig) -> str:
    """ARGV[12] of a partition's scripts (lua/include/partition.lua): "2" when the topic keeps
    history (its change events carry the previous state as the members that differ, to keep
    a retained version small: lua/include/reverse_delta.lua), "1" with ``change_previous``
    (the previous record whole), else "0"."""
    if t.history_ms:
        return "2"
    return "1" if t.change_previous else "0"


@dataclass(frozen=True)
class Partition:
    """One partition of a topic as every script that writes its records sees it
    (``lua/include/partition.lua``): its KEYS (:func:`keys.partition_keys`) and the head of
    its ARGV, each built here once and in one order: the operation, channel, topic name,
    partition number, number of hash indexes, dead-letter flag, expiration flag, change-feed
    retention (changes; ms), the expiry of a message without its own (:func:`expiry_for`:
    "" none, "now", or a lifetime in ms), the definition's fingerprint and whether change
    events carry the previous state (``change_previous``). Made by
    :func:`partition` (cached per definition and partition)."""

    topic: TopicConfig
    p: int

    @cached_property
    def keys(self) -> list[str]:
        """The KEYS, in the scripts' order."""
        return keys.partition_keys(self.topic.name, self.p, self.topic.n_indexes,
                                   len(self.topic.index))

    @cached_property
    def head(self) -> tuple[ScriptArg, ...]:
        """ARGV[2 ..] of the head (ARGV[1] is the operation)."""
        t = self.topic
        return (keys.partition_channel(t.name, self.p), t.name, self.p, t.n_indexes,
                "1" if t.dead_letter else "0", "1" if t.expiration_enabled else "0",
                *retention_args(t), expiry_for(t, None, "0-0"), t.fingerprint,
                previous_mode(t))

    def args(self, op: str, *rest: ScriptArg) -> tuple[list[str], list[ScriptArg]]:
        """``(KEYS, ARGV)`` of operation ``op`` with its own arguments ``rest``
        (ARGV[OP + 1 ..])."""
        return self.keys, [op, *self.head, *rest]


OP_ARGS = 12
"""Arguments of the head (the operation included): an operation's own i-th argument is
ARGV[OP_ARGS + i] (``OP`` in ``lua/include/partition.lua``)."""


@lru_cache(maxsize=4096)
def partition(topic: TopicConfig, p: int) -> Partition:
    """The :class:`Partition` handle of partition ``p`` of ``topic`` (one per definition and
    partition: its KEYS and ARGV head are built once)."""
    return Partition(topic, p)


def _log_applied(reply: Reply) -> LogApplied:
    applied, cursor, more = reply
    return LogApplied(int(applied), cursor.decode() if isinstance(cursor, bytes) else cursor,
                      int(more) == 1, int(more) == 2)


def _apply_reply(reply: Reply) -> tuple[int, str]:
    applied, cursor = reply
    return int(applied), cursor.decode() if isinstance(cursor, bytes) else cursor


class PendingCall(Generic[T_co]):
    """A script call sent on a pooled connection of its own, whose reply ``parse(reply)`` is
    read by :meth:`result` (exactly once): the caller prepares the next batch meanwhile."""

    def __init__(self, scripts: Scripts, name: str, ks: list[str], argv: list[ScriptArg],
                 parse: Callable[[Reply], T_co]) -> None:
        self._scripts, self._name, self._ks, self._argv, self._parse = (
            scripts, name, ks, argv, parse)
        pool = single_pool(scripts._r)
        self._pool = pool
        if pool is None:
            # a cluster client has no single connection: the call runs in result(), through
            # the client's redirection and failover handling (no overlap on a cluster)
            return
        self._conn = pool.get_connection()
        try:
            self._conn.send_command("EVALSHA", scripts._scripts[name].sha, len(ks), *ks, *argv)
        except BaseException:
            self._conn.disconnect()
            pool.release(self._conn)
            raise

    def result(self) -> T_co:
        """The parsed reply of the call; raises as :meth:`Scripts.call` does."""
        if self._pool is None:
            return self._parse(self._scripts.call(self._name, self._ks, self._argv))
        try:
            reply = self._conn.read_response()
        except NoScriptError:  # the server lost its script cache: load it and run again
            self._pool.release(self._conn)
            return self._parse(self._scripts.call(self._name, self._ks, self._argv))
        except ResponseError as exc:
            self._pool.release(self._conn)
            raise from_script_error(exc) from None
        except BaseException:
            self._conn.disconnect()
            self._pool.release(self._conn)
            raise
        self._pool.release(self._conn)
        return self._parse(reply)
