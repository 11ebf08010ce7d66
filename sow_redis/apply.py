"""Worker side: read a partition's log from its applied cursor and apply it with apply.lua.

One :func:`apply_batch` call reads up to ``batch_size`` entries after the cursor, turns them
into apply ops (SOW keys, delta merges, hash-index members) and rejections, and makes one
atomic Lua call (ARCHITECTURE §3). The Lua call checks the fencing token and the cursor, so
each log entry is applied, or written to the partition's error stream, exactly once, in order.
Every entry sees the SOW as of its own log time: a record due at or before an entry's stream
id time is gone for that entry (expired first, with its event and dead letter).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.exceptions import RedisError, ResponseError

from . import chaining, keys
from .chaining import ChainConflict, ChainIds, ChainResolver
from .config import TopicConfig
from .errors import ConflictError, FencedError, FilterSyntaxError, MessageError
from .messages import (
    COMMANDS,
    check_expiration,
    check_size,
    decode,
    expiry_for,
    index_members,
    key_of,
    merge,
    parse,
    partition_for,
)
from .records import seq_of
from .scripts import Scripts, attached
from .sowkey import is_valid_user_key

log = logging.getLogger(__name__)



@dataclass
class _Plan:
    ops: list[Any] = field(default_factory=list)
    # rejected entries: (stream id, reason, detail, cmd, data, sow_key), written by apply.lua
    errors: list[tuple[str, str, str, bytes, bytes, bytes]] = field(default_factory=list)
    # validation reports of chain conflicts: (field, value) of keys.chain_conflicts
    conflicts: list[tuple[str, bytes]] = field(default_factory=list)
    # sow_key -> (obj or None if absent/deleted, expiry ms or 0) after the ops planned so far
    state: dict[str, tuple[dict[str, Any] | None, int]] = field(default_factory=dict)
    # sow_key -> the seq its record had when the worker read it (compare-and-set in apply.lua)
    checks: dict[str, str] = field(default_factory=dict)


def _raw_xrange_client(r: Any) -> Any:
    if type(r).__module__.startswith("fakeredis"):
        return r
    from redis import Redis

    raw = Redis(connection_pool=r.connection_pool)
    raw.set_response_callback("XRANGE", lambda response, **_options: response)
    return raw


def read_log(r: Any, topic: str, p: int, cursor: str, count: int) -> list[tuple[bytes, dict]]:
    """Up to ``count`` log entries after ``cursor``, as ``(id, fields)``.

    Uses a sibling client (same connection pool) whose XRANGE reply is left raw: building the
    field dicts here costs half of what redis-py's generic stream parser does.
    """
    raw = attached(r, "raw_xrange", _raw_xrange_client)
    entries = raw.xrange(keys.log(topic, p), min="(" + cursor, count=count)
    if raw is r:
        return entries
    out = []
    for sid, flat in entries:
        it = iter(flat)
        out.append((sid, dict(zip(it, it))))
    return out


def read_cursor(r: Any, topic: str, p: int) -> str:
    """The partition's applied cursor (stream id), ``0-0`` before anything was applied."""
    c = r.hget(keys.state(topic, p), "cursor")
    return c.decode() if c else "0-0"


def _rejection(exc: BaseException) -> tuple[str, str]:
    """``(reason, detail)`` for whatever one log entry raised while it was planned: a bad
    entry goes to the error stream with its reason, it never stops the partition."""
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
    if isinstance(exc, ResponseError):
        return "apply_failed", f"the apply script failed on this entry: {exc}"
    return "bad_entry", f"{type(exc).__name__}: {exc}"


def _reject(plan: _Plan, sid: str, fields: dict[bytes, bytes], exc: BaseException,
            p: int) -> None:
    reason, detail = _rejection(exc)
    plan.errors.append((sid, reason, detail, fields.get(b"cmd") or b"",
                        fields.get(b"data") or fields.get(b"filter") or fields.get(b"keys")
                        or b"", fields.get(b"sow_key") or b""))
    log.warning("partition %d: entry %s rejected: %s: %s", p, sid, reason, detail)


def _ms(sid: str) -> int:
    return int(sid.split("-", 1)[0])


def _current(r: Any, topic: TopicConfig, p: int, plan: _Plan, key: str,
             prefetched: dict[str, bytes | None], at_ms: int) -> dict[str, Any] | None:
    """The record's object as an entry logged at ``at_ms`` sees it: as it stands in this batch
    so far (reading Redis on first touch), or None when absent or, with expiration enabled,
    due at or before ``at_ms`` (apply.lua then removes it as an expiry before the op)."""
    if key in plan.state:
        obj, exp = plan.state[key]
    else:
        raw = prefetched[key] if key in prefetched else r.hget(keys.records(topic.name, p), key)
        if raw is None:
            obj, exp = None, 0
        else:
            head, _, body = raw.partition(b"\n")
            obj, exp = orjson.loads(body), int(head.split(b":", 2)[1])
        plan.state[key] = (obj, exp)
        # compare-and-set: the record must still be at this version when the batch applies
        plan.checks[key] = seq_of(raw)
    if obj is not None and exp and topic.expiration_enabled and exp <= at_ms:
        return None
    return obj


_COMMANDS = {c.encode(): c for c in COMMANDS}


def _delete_keys(fields: dict[bytes, bytes]) -> list[str]:
    """The SOW keys of a ``sow_delete`` by keys. Raises MessageError ``bad_sow_key``."""
    out = [k for k in fields[b"keys"].decode().split(",") if k]
    for k in out:
        if not is_valid_user_key(k):
            raise MessageError("bad_sow_key", f"SOW key {k[:80]!r} has characters outside Base64")
    return out


def _plan_entry(r: Any, topic: TopicConfig, p: int, sid: str, fields: dict[bytes, bytes],
                plan: _Plan, prefetched: dict[str, bytes | None],
                chains: ChainResolver | None, pre: dict[str, _Pre]) -> None:
    """Add the ops of one log entry to ``plan``. Everything that can fail runs before the plan,
    the chain view or the batch state change, so a rejected entry leaves no trace."""
    cmd_b = fields.get(b"cmd") or b"publish"
    cmd = _COMMANDS.get(cmd_b) or cmd_b.decode(errors="replace")
    if cmd not in COMMANDS:
        raise MessageError("bad_command", f"unknown cmd {cmd[:80]!r}")
    data = fields.get(b"data")
    supplied = fields.get(b"sow_key")
    supplied_s = supplied.decode() if supplied else None
    if cmd == "sow_delete" and data is None:
        if b"keys" in fields:
            ks = _delete_keys(fields)
            plan.ops += [("sow_delete", sid, k, "", "", "-", "") for k in ks]
            plan.state.update((k, (None, 0)) for k in ks)
        elif b"filter" in fields:
            raise AssertionError("filter deletes are planned by _filter_delete_ops")
        else:
            raise MessageError("bad_command", "sow_delete needs data, keys or filter")
        plan.ops.append(("ack", sid, "", "", "", "-", ""))
        return
    if data is None:
        raise MessageError("bad_command", f"{cmd} without data")
    res = None
    hit = pre.get(sid)
    if hit is not None:  # decoded with its chain identifiers while loading the chains
        check_size(data, topic)
        obj, part = hit[1], partition_for(hit[1], topic, "")
    else:
        parsed = parse(data, topic, supplied_s)
        obj, part = parsed.obj, parsed.partition
    if part != p:
        raise MessageError("wrong_partition", f"message belongs to partition {part}")
    if chains is not None:
        res = chains.resolve(obj, hit[2] if hit is not None else None)
        key = chaining.sow_key(topic, res.head)
    else:
        key = parsed.sow_key
    at_ms = _ms(sid)
    if cmd == "sow_delete":  # the record this data would update; chains are left as they are
        _current(r, topic, p, plan, key, prefetched, at_ms)
        plan.ops += [("sow_delete", sid, key, "", "", "-", ""), ("ack", sid, "", "", "", "-", "")]
        plan.state[key] = (None, 0)
        return
    ttl = check_expiration(fields[b"expiration"]) if b"expiration" in fields else None
    if cmd == "delta_publish":
        base = _current(r, topic, p, plan, key, prefetched, at_ms)
        if base is not None:
            obj = merge(base, obj)
            data = orjson.dumps(obj)
    ex = expiry_for(topic, ttl, sid)
    members = index_members(obj, topic, key)
    # nothing below can fail: commit the chain view, the ops and the batch state
    if res is not None:
        plan.ops += [("chain", sid, ident, head, "", "-", "")
                     for ident, head in chains.commit(res)]  # type: ignore[union-attr]
    plan.state[key] = (None, 0) if ex == "now" else (obj, int(ex) if ex else 0)
    plan.ops.append((cmd, sid, key, data, ex, "-", members))


_Pre = tuple["bytes | None", "dict[str, Any]", ChainIds]


def _chain_ids(topic: TopicConfig, entries: list) -> dict[str, _Pre]:
    """stream id → ``(cmd, object, chain identifiers)`` of the entries of a chaining topic
    that decode to an object with identifiers, in log order (the others are planned through
    :func:`messages.parse`, which rejects them with a reason)."""
    out: dict[str, _Pre] = {}
    for sid, fields in entries:
        data = fields.get(b"data")
        if data is None:
            continue
        try:
            obj = decode(data, topic)  # the same checks as every message (size, depth, range)
            out[sid.decode()] = (fields.get(b"cmd"), obj, chaining.chain_values(obj, topic))
        except Exception:  # noqa: BLE001 - such entries are rejected with a reason when planned
            continue
    return out


def _prefetch(r: Any, topic: TopicConfig, p: int, entries: list, chains: ChainResolver | None,
              pre: dict[str, _Pre]) -> dict[str, bytes | None]:
    """Read in one call the stored records that delta merges and deletes by data need."""
    wanted = []
    if chains is not None:
        if not any(cmd in (b"delta_publish", b"sow_delete") for cmd, _o, _i in pre.values()):
            return {}
        # look ahead on a copy of the chain view: the keys depend on earlier entries' chains
        ahead = chains.fork()
        for cmd, obj, ids in pre.values():
            try:
                res = ahead.resolve(obj, ids)
            except MessageError:
                continue
            if cmd in (b"delta_publish", b"sow_delete"):
                wanted.append(chaining.sow_key(topic, res.head))
            if cmd != b"sow_delete":
                ahead.commit(res)
    else:
        for _sid, fields in entries:
            cmd = fields.get(b"cmd")
            if cmd in (b"delta_publish", b"sow_delete") and b"data" in fields:
                try:
                    obj = orjson.loads(fields[b"data"])
                    sk = fields.get(b"sow_key")
                    wanted.append(key_of(obj, topic, sk.decode() if sk else None))
                except Exception:  # noqa: BLE001 - bad entries are rejected later with a reason
                    continue
    if not wanted:
        return {}
    wanted = list(dict.fromkeys(wanted))
    return dict(zip(wanted, r.hmget(keys.records(topic.name, p), wanted)))


def _filter_delete_ops(r: Any, topic: TopicConfig, p: int, sid: str, text: str) -> list:
    from .filter import compile_filter
    from .query import scan_partition

    pred = compile_filter(text)
    ops = [("sow_delete", sid, rec.sow_key, "", "", "-", "")
           for rec in scan_partition(r, topic, p) if pred(rec.obj())]
    ops.append(("ack", sid, "", "", "", "-", ""))
    return ops


_KEYED_OPS = frozenset(("publish", "delta_publish", "sow_delete"))


def _flatten(plan: _Plan) -> list[Any]:
    """ARGV tail for apply.lua: the rejected entries (6 fields each, after their count), then
    5 fields per op (op, id, key, data, meta); the first op on a record the worker read
    carries the seq it read (compare-and-set)."""
    checks = dict(plan.checks)
    argv: list[Any] = [len(plan.errors)]
    for err in plan.errors:
        argv += err
    for o, sid, key, data, ex, expect, members in plan.ops:
        if o in _KEYED_OPS and key in checks:
            expect = checks.pop(key)
        meta = "" if not ex and expect == "-" and not members else f"{ex}|{expect}|{members}"
        argv += [o, sid, key, data, meta]
    return argv


def _call(r: Any, scripts: Scripts, topic: TopicConfig, p: int, fence: int, first: str,
          last: str, plan: _Plan) -> Any:
    if plan.conflicts:  # chain-conflict reports (validation): idempotent HSETs by stream id
        r.hset(keys.chain_conflicts(topic.name), mapping=dict(plan.conflicts))
    return scripts.apply(
        keys.partition_keys(topic.name, p, len(topic.hash_index)),
        [fence, keys.channel(topic.name), topic.name, first, last, len(topic.hash_index),
         "1" if topic.dead_letter else "0", "1" if topic.expiration_enabled else "0", p,
         *_flatten(plan)],
    )


def apply_batch(r: Any, scripts: Scripts, topic: TopicConfig, p: int, fence: int,
                batch_size: int, cursor: str | None = None) -> tuple[int, str]:
    """Apply the next batch of partition ``p``'s log.

    A log entry that cannot be applied (bad JSON, missing key, two chains, a filter that
    does not parse or evaluate, anything it raises) goes to the partition's error stream with
    its reason, written by the same atomic call that moves the cursor past it. When the Lua
    call of a whole batch fails, the batch is retried entry by entry, so one bad entry never
    holds back the others.

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


_SERVER_STATES = frozenset(("OOM", "BUSY", "LOADING", "READONLY", "NOSCRIPT", "MASTERDOWN",
                            "CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK", "NOAUTH", "WRONGPASS",
                            "NOPERM", "MISCONF"))
"""Error reply codes that describe the server's state, not the entries being applied."""


def _transient(exc: BaseException) -> bool:
    """True for failures that say nothing about the entries (lease lost, record changed,
    Redis unreachable, out of memory, read-only replica, …): never turned into rejections.
    An error reply of the apply script itself (a Lua runtime error) is the entries' fault."""
    if isinstance(exc, (FencedError, ConflictError)):
        return True
    if isinstance(exc, ResponseError):
        return str(exc).split(" ", 1)[0] in _SERVER_STATES
    return isinstance(exc, RedisError)


def _apply_one_by_one(r: Any, scripts: Scripts, topic: TopicConfig, p: int, fence: int,
                      entries: list) -> None:
    """Apply ``entries`` one per Lua call; an entry whose call fails is rejected (written to
    the error stream by a call that only moves the cursor past it)."""
    cursor = read_cursor(r, topic.name, p)
    for raw_sid, fields in entries:
        sid = raw_sid.decode()
        if _id_tuple(sid) <= _id_tuple(cursor):
            continue  # applied by an earlier segment of the failed batch
        try:
            _apply_entries(r, scripts, topic, p, fence, [(raw_sid, fields)])
        except Exception as exc:
            if _transient(exc):
                raise
            plan = _Plan()
            _reject(plan, sid, fields, exc, p)
            _call(r, scripts, topic, p, fence, sid, sid, plan)


def _id_tuple(sid: str) -> tuple[int, int]:
    a, _, b = sid.partition("-")
    return int(a), int(b or 0)


def _is_filter_delete(fields: dict[bytes, bytes]) -> bool:
    return fields.get(b"cmd") == b"sow_delete" and b"filter" in fields and b"data" not in fields


def _apply_entries(r: Any, scripts: Scripts, topic: TopicConfig, p: int, fence: int,
                   entries: list) -> None:
    chains, pre = None, {}
    if topic.chaining:
        pre = _chain_ids(topic, entries)
        chains = ChainResolver(r, topic, p)
        chains.load([ids for _cmd, _obj, ids in pre.values()])
    prefetched = _prefetch(r, topic, p, entries, chains, pre)
    plan = _Plan()
    seg_first: str | None = None
    prev_sid = ""

    def flush(last: str) -> None:
        nonlocal plan, seg_first, prefetched
        _call(r, scripts, topic, p, fence, seg_first or last, last, plan)
        plan, seg_first, prefetched = _Plan(), None, {}

    for raw_sid, fields in entries:
        sid = raw_sid.decode()
        if _is_filter_delete(fields):
            # a filter delete sees every change before it: apply what is planned so far first
            if seg_first is not None:
                flush(prev_sid)
            try:
                plan.ops = _filter_delete_ops(r, topic, p, sid, fields[b"filter"].decode())
            except RedisError:
                raise
            except Exception as exc:  # noqa: BLE001 - a bad filter is this entry's problem
                _reject(plan, sid, fields, exc, p)
            seg_first = sid
            flush(sid)
        else:
            if seg_first is None:
                seg_first = sid
            try:
                _plan_entry(r, topic, p, sid, fields, plan, prefetched, chains, pre)
            except RedisError:
                raise
            except Exception as exc:  # noqa: BLE001 - any entry-level failure is a rejection
                _reject(plan, sid, fields, exc, p)
                if isinstance(exc, ChainConflict) and topic.chain_validation:
                    plan.conflicts.append(chaining.conflict_report(p, sid, exc))
        prev_sid = sid
    if seg_first is not None:
        flush(prev_sid)
