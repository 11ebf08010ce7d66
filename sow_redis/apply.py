"""Worker side: read a partition's log from its applied cursor and apply it with apply.lua.

One :func:`apply_batch` call reads up to ``batch_size`` entries after the cursor, turns them
into apply ops (SOW keys, delta merges, hash-index members), sends rejected entries to the
topic's error stream, and makes one atomic Lua call (ARCHITECTURE §3). The Lua call checks
the fencing token and the cursor, so each log entry is applied exactly once, in order.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import orjson

from . import chaining, keys
from .chaining import ChainConflict, ChainIds, ChainResolver
from .config import TopicConfig
from .errors import ConflictError, FilterSyntaxError, MessageError
from .messages import (
    COMMANDS,
    check_expiration,
    check_size,
    expiry_for,
    index_members,
    key_of,
    merge,
    parse,
    partition_for,
)
from .records import seq_of
from .scripts import Scripts, attached

log = logging.getLogger(__name__)

ERRORS_MAXLEN = 100_000
"""Approximate cap on entries kept in a topic's error stream."""


@dataclass
class _Plan:
    ops: list[Any] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    # validation reports of chain conflicts: (field, value) of keys.chain_conflicts
    conflicts: list[tuple[str, bytes]] = field(default_factory=list)
    # sow_key -> (obj or None if absent/deleted) as it stands after the ops planned so far
    state: dict[str, dict[str, Any] | None] = field(default_factory=dict)


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


def _reject(plan: _Plan, sid: str, fields: dict[bytes, bytes], reason: str, detail: str,
            p: int) -> None:
    plan.errors.append({
        "reason": reason,
        "detail": detail,
        "id": sid,
        "partition": str(p),
        "cmd": (fields.get(b"cmd") or b""),
        "data": (fields.get(b"data") or b""),
        "sow_key": (fields.get(b"sow_key") or b""),
    })


def _current(r: Any, topic: TopicConfig, p: int, plan: _Plan, key: str,
             prefetched: dict[str, bytes | None]) -> dict[str, Any] | None:
    """The record's object as it stands in this batch so far (reading Redis on first touch)."""
    if key in plan.state:
        return plan.state[key]
    raw = prefetched[key] if key in prefetched else r.hget(keys.records(topic.name, p), key)
    obj = None if raw is None else orjson.loads(raw.partition(b"\n")[2])
    plan.state[key] = obj
    # compare-and-set: the record must still be at this version when the batch applies
    plan.ops.append(("check", key, seq_of(raw)))
    return obj


_COMMANDS = {c.encode(): c for c in COMMANDS}


def _plan_entry(r: Any, topic: TopicConfig, p: int, sid: str, fields: dict[bytes, bytes],
                plan: _Plan, prefetched: dict[str, bytes | None],
                chains: ChainResolver | None, pre: dict[str, _Pre]) -> None:
    cmd_b = fields.get(b"cmd") or b"publish"
    cmd = _COMMANDS.get(cmd_b) or cmd_b.decode(errors="replace")
    if cmd not in COMMANDS:
        raise MessageError("bad_command", f"unknown cmd {cmd!r}")
    data = fields.get(b"data")
    supplied = fields.get(b"sow_key")
    supplied_s = supplied.decode(errors="replace") if supplied else None
    if cmd == "sow_delete" and data is None:
        if b"keys" in fields:
            for k in fields[b"keys"].decode().split(","):
                if k:
                    plan.ops.append(("sow_delete", sid, k, "", "", "-", ""))
                    plan.state[k] = None
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
    if cmd == "sow_delete":  # the record this data would update; chains are left as they are
        _current(r, topic, p, plan, key, prefetched)
        plan.ops.append(("sow_delete", sid, key, "", "", "-", ""))
        plan.ops.append(("ack", sid, "", "", "", "-", ""))
        plan.state[key] = None
        return
    ttl = check_expiration(fields[b"expiration"]) if b"expiration" in fields else None
    if cmd == "delta_publish":
        base = _current(r, topic, p, plan, key, prefetched)
        if base is not None:
            obj = merge(base, obj)
            data = orjson.dumps(obj)
    ex = expiry_for(topic, ttl, sid)
    if res is not None:
        for ident, head in chains.commit(res):  # type: ignore[union-attr]
            plan.ops.append(("chain", sid, ident, head, "", "-", ""))
    plan.state[key] = None if ex == "now" else obj
    plan.ops.append((cmd, sid, key, data, ex, "-", index_members(obj, topic, key)))


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
            obj = orjson.loads(data)
            if isinstance(obj, dict):
                out[sid.decode()] = (fields.get(b"cmd"), obj, chaining.chain_values(obj, topic))
        except (orjson.JSONDecodeError, MessageError):
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


def _flatten(ops: list) -> list[Any]:
    """ARGV tail for apply.lua: 5 fields per op (op, id, key, data, meta); a "check" op folds
    its expected seq into the next op on the same key."""
    expects: dict[str, str] = {}
    argv: list[Any] = []
    for op in ops:
        if op[0] == "check":
            expects[op[1]] = op[2]
            continue
        o, sid, key, data, ex, expect, members = op
        expect = expects.pop(key, expect)
        meta = "" if not ex and expect == "-" and not members else f"{ex}|{expect}|{members}"
        argv += [o, sid, key, data, meta]
    assert not expects, "every checked record is followed by an op on it"
    return argv


def _call(scripts: Scripts, topic: TopicConfig, p: int, fence: int, first: str, last: str,
          ops: list) -> Any:
    return scripts.apply(
        keys.partition_keys(topic.name, p, len(topic.hash_index)),
        [fence, keys.channel(topic.name), topic.name, first, last, len(topic.hash_index),
         "1" if topic.dead_letter else "0", *_flatten(ops)],
    )


def _write_errors(r: Any, topic: TopicConfig, plan: _Plan) -> None:
    errors = plan.errors
    if not errors:
        return
    pipe = r.pipeline(transaction=False)
    for e in errors:
        pipe.xadd(keys.errors(topic.name), e, maxlen=ERRORS_MAXLEN, approximate=True)
    for fld, value in plan.conflicts:
        pipe.hset(keys.chain_conflicts(topic.name), fld, value)
    pipe.execute()
    for e in errors:
        log.warning("topic %s: entry %s rejected: %s: %s", topic.name, e["id"], e["reason"],
                    e["detail"])


def apply_batch(r: Any, scripts: Scripts, topic: TopicConfig, p: int, fence: int,
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
    """
    for _attempt in range(5):
        if cursor is None:
            cursor = read_cursor(r, topic.name, p)
        entries = read_log(r, topic.name, p, cursor, batch_size)
        if not entries:
            return 0, cursor
        try:
            _apply_entries(r, scripts, topic, p, fence, entries)
            return len(entries), entries[-1][0].decode()
        except ConflictError:
            # a record changed (e.g. expired) between our read and the apply: plan again
            cursor = None
            continue
    raise ConflictError(f"topic {topic.name} partition {p}: records keep changing under the worker")


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
        _write_errors(r, topic, plan)
        _call(scripts, topic, p, fence, seg_first or last, last, plan.ops)
        plan, seg_first, prefetched = _Plan(), None, {}

    for raw_sid, fields in entries:
        sid = raw_sid.decode()
        if _is_filter_delete(fields):
            # a filter delete sees every change before it: apply what is planned so far first
            if seg_first is not None:
                flush(prev_sid)
            try:
                plan.ops = _filter_delete_ops(r, topic, p, sid, fields[b"filter"].decode())
            except FilterSyntaxError as exc:
                _reject(plan, sid, fields, "bad_filter", str(exc), p)
            seg_first = sid
            flush(sid)
        else:
            if seg_first is None:
                seg_first = sid
            try:
                _plan_entry(r, topic, p, sid, fields, plan, prefetched, chains, pre)
            except MessageError as exc:
                _reject(plan, sid, fields, exc.reason, exc.detail, p)
                if isinstance(exc, ChainConflict) and topic.chain_validation:
                    plan.conflicts.append(chaining.conflict_report(p, sid, exc))
        prev_sid = sid
    if seg_first is not None:
        flush(prev_sid)
