"""Shape migration: ``sow-redis config apply --migrate`` (issue 7.4).

A topic's *shape* (``partitions``, ``key``, ``key_domain``, ``key_generator``,
``message_type``, ``partition_by``; :func:`config.shape_changes`) decides the SOW key and the
partition of every record. ``config apply`` refuses to change it while the topic holds
anything; :func:`migrate_topic` changes it and moves what the topic holds:

1. take the lease of every partition of the old and the new layout (owner ``migrate:…``,
   the fencing tokens of :mod:`sow_redis.apply.jobs`) for the whole migration, so no worker applies
   anything meanwhile, under either definition (a worker busy on a partition is waited for);
2. drain every old partition's log in process under the OLD definition, with the normal
   apply path (:func:`apply.apply_batch` under the held fencing token; ``jobs.drain_partition``
   would give the lease up when done);
3. read every record of the old layout (and the chain tables of a chaining topic), then delete
   the old layout's records, expiry sets, hash-index members and indexes, chain tables;
4. re-publish each record's data to the NEW partition logs as a ``publish`` entry (oldest
   change first, so when two records get one new key, the newer one wins, as it would have
   when published), carrying the chain tables over when both definitions chain on the same
   fields; drain those logs in process under the new definition (new SOW keys, partitions,
   hash indexes: exactly what publishing the records gives), then set each record's expiry
   back to its absolute time (none stays none). A record the new definition cannot take
   (e.g. no value for a new key field) goes to the topic's error stream with its reason;
5. store the new definition, move what partitions beyond the new count still hold (error
   streams, dead-letter outbox, entries logged meanwhile by old-definition publishers,
   re-routed under the new definition), delete their keys, release the leases.

Clients keep running across a migration (issue 23.4). Before it takes the leases, the
migration marks every partition ``migrating`` (:func:`keys.definition`) and sends a notice on
the old partitions' live channels. ``apply.lua`` (operation ``appended``) then appends nothing for any
publisher, and after the migration nothing for a publisher whose definition is not the
stored one (a fingerprint per partition; ``dropped`` for a partition the migration removed):
the publisher waits, reads the new definition, re-keys the refused messages and sends them
again (:func:`sow_redis.publish.append.append`), so nothing is stored under the old layout and
nothing is lost. A subscriber that gets the notice waits for the migration to end, then
subscribes to the new partitions and re-reads the records (a ``recovery`` with cause
``migration``); one that keeps bookmarks in a bookmark store ends with one line saying why.
A migration that fails stores the old definition's fingerprints back.

Publishers without the right to run scripts (the ACL ``publisher`` role) are fenced by a
transaction instead: each chunk's XADDs go in ``MULTI``/``EXEC`` under ``WATCH`` of the
partitions' definitions (:func:`sow_redis.publish.append._append_raw`). The partitions are marked
before the leases are taken, so workers kept busy by publishers drain and free them. Queries
during a migration may see a partial SOW.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import orjson
from redis.exceptions import WatchError

from . import keys
from .apply.applier import apply_batch
from .apply.scripts import Scripts
from .config import shape_changes
from .connection import Client, Fields, StreamEntry
from .errors import ConfigError, FencedError, MessageError, SowError
from .model.chains import sow_key as chain_sow_key
from .model.events import topic_migrating
from .model.messages import parse, partition_for
from .model.records import decode as decode_record
from .model.topic import TopicConfig
from .partition_state import read_cursor
from .registry import (
    apply_topics,
    holdings,
    load_topics,
    registry_problems,
    store_fingerprints,
    store_topics,
)
from .settings import Settings
from .streamids import parse as parse_id

CHUNK = 1000
"""Records or log entries per pipeline round trip."""


@dataclass(frozen=True)
class Migration:
    """Outcome of one topic's migration.

    Attributes:
        topic: the topic name.
        changes: the shape changes, like ``'partitions' 8 → 4``.
        drained: queued log entries applied under the old definition first.
        moved: records re-published and applied under the new definition.
        rejected: records the new definition could not take (in the error stream, with reason).
        records: records the topic holds afterwards (fewer than ``moved`` when records got
            one SOW key under the new definition).
    """

    topic: str
    changes: tuple[str, ...]
    drained: int
    moved: int
    rejected: int
    records: int

    def summary(self) -> str:
        """One line: ``migrated topic 'orders' ('partitions' 8 → 4): moved 200 record(s), …``."""
        merged = self.moved - self.records
        return (f"migrated topic '{self.topic}' ({', '.join(self.changes)}): moved {self.moved} "
                f"record(s), rejected {self.rejected}"
                + (f" ({merged} merged into another record's new SOW key)" if merged > 0 else "")
                + (f"; applied {self.drained} queued message(s) first" if self.drained else ""))


class _Leases:
    """The leases of partitions ``0..n-1`` of a topic, held by one migration owner."""

    def __init__(self, r: Client, scripts: Scripts, topic: str, n: int, settings: Settings) -> None:
        self.r, self.scripts, self.topic, self.settings = r, scripts, topic, settings
        self.owner = f"migrate:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.fences: dict[int, int] = {}
        self.renewed = time.monotonic()
        # a worker holds a lease for at most one job budget (plus linger); a dead one's lease
        # runs out after lease_ms
        patience = 2 * settings.lease_ms / 1000 + 2 * settings.job_budget_s + 1
        deadline = time.monotonic() + patience
        waiting = list(range(n))
        while waiting:
            waiting = [p for p in waiting if not self._take(p)]
            if waiting and time.monotonic() > deadline:
                self.release()
                raise SowError(f"topic '{topic}': partition(s) {waiting} stayed leased by "
                               f"another process for {patience:g} s; nothing was changed, "
                               "try again")
            if waiting:
                time.sleep(0.05)

    def _take(self, p: int) -> bool:
        fence = self.scripts.lease_acquire(keys.lease(self.topic, p), keys.state(self.topic, p),
                                           self.owner, self.settings.lease_ms)
        if fence is None:
            return False
        if p in self.fences and fence != self.fences[p]:
            raise FencedError(f"topic '{self.topic}': lost the lease of partition {p}")
        self.fences[p] = fence
        return True

    def renew(self) -> None:
        """Extend every lease once a third of its lifetime has passed. Raises FencedError."""
        if time.monotonic() - self.renewed < self.settings.lease_ms / 3000:
            return
        for p in list(self.fences):
            if not self._take(p):
                raise FencedError(f"topic '{self.topic}': lost the lease of partition {p}")
        self.renewed = time.monotonic()

    def release(self) -> None:
        for p in self.fences:
            self.scripts.lease_release(keys.lease(self.topic, p), self.owner)


def _drain(r: Client, scripts: Scripts, topic: TopicConfig, p: int, leases: _Leases,
           settings: Settings) -> int:
    """Apply partition ``p``'s log under ``topic`` until drained. Returns entries consumed."""
    total, cursor = 0, None
    while True:
        n, cursor = apply_batch(r, scripts, topic, p, leases.fences[p], settings.batch_size,
                                cursor)
        if n == 0:
            return total
        total += n
        leases.renew()


def _read_hash(r: Client, key: str) -> dict[bytes, bytes]:
    return dict(r.hscan_iter(key, count=CHUNK))


def _clear_layout(r: Client, topic: str, partitions: int, n_indexes: int) -> None:
    """Delete the records, expiry sets, hash-index members and indexes, chain tables."""
    pipe = r.pipeline(transaction=False)
    for p in range(partitions):
        # one key per DEL: a cluster's pipeline sends no multi-key command
        for k in (keys.records(topic, p), keys.expiry(topic, p), keys.index_members(topic, p),
                  keys.chain(topic, p), *[keys.index(topic, p, n) for n in range(n_indexes)],
                  *[keys.range_numbers(topic, p, n) for n in range(n_indexes)]):
            pipe.delete(k)
    pipe.execute()


def _carry_chains(r: Client, old: TopicConfig, new: TopicConfig,
                  chains: dict[int, dict[bytes, bytes]],
                  records: dict[int, dict[bytes, bytes]]) -> None:
    """Copy the chain tables into the new partitions: every identifier of a chain goes where
    the chain's record goes. A chain without a record (deleted) has no partition_by value to
    place it by; it is kept only when the new topic has one partition."""
    out: dict[int, dict[bytes, bytes]] = {}
    for p, table in chains.items():
        where: dict[bytes, int | None] = {}
        for ident, head in table.items():
            if head not in where:
                raw = records[p].get(chain_sow_key(old, head.decode()).encode())
                if new.partitions == 1:
                    where[head] = 0
                elif raw is None:
                    where[head] = None
                else:
                    try:
                        where[head] = partition_for(orjson.loads(raw.partition(b"\n")[2]), new,
                                                    "")
                    except MessageError:
                        where[head] = None
            part = where[head]
            if part is not None:
                out.setdefault(part, {})[ident] = head
    for p, table in out.items():
        items = list(table.items())
        for i in range(0, len(items), CHUNK):
            r.hset(keys.chain(new.name, p), mapping=dict(items[i:i + CHUNK]))


def _reject(r: Client, topic: str, p: int, sow_key: str, rec_sid: str, data: bytes, reason: str,
            detail: str) -> None:
    r.xadd(keys.errors(topic), {
        "reason": reason, "detail": f"migration to the new definition: {detail}",
        "id": rec_sid, "partition": str(p), "cmd": "publish", "data": data, "sow_key": sow_key,
    })


def _republish(r: Client, old: TopicConfig, new: TopicConfig, rows: list[tuple[int, Any]],
               now_ms: int, leases: _Leases) -> tuple[dict[tuple[int, str], int], int]:
    """Append a ``publish`` entry per record to its new partition's log.

    Returns:
        ((new partition, log stream id) → wanted absolute expiry ms (0 = none), records
        rejected before reaching a log). Stream ids are per stream: two partitions' logs may
        hand out the same id.
    """
    wanted: dict[tuple[int, str], int] = {}
    rejected = 0
    for i in range(0, len(rows), CHUNK):
        pipe = r.pipeline(transaction=False)
        sent = []
        for p, rec in rows[i:i + CHUNK]:
            supplied = rec.sow_key if new.publisher_keys else None
            try:
                part = parse(rec.data, new, supplied).partition
            except MessageError as exc:
                _reject(r, new.name, p, rec.sow_key, rec.stream_id, rec.data, exc.reason,
                        exc.detail)
                rejected += 1
                continue
            entry: Fields = {"cmd": "publish", "data": rec.data}
            if supplied:
                entry["sow_key"] = supplied
            if rec.expiry_ms:
                # close to the wanted time; set exactly after the apply (_restore_expiry)
                entry["expiration"] = repr(max(rec.expiry_ms - now_ms, 1) / 1000)
            elif new.expiration_policy == "override":
                entry["expiration"] = "0"  # AMPS: 0 = never expire
            pipe.xadd(keys.log(new.name, part), entry)
            sent.append((part, rec.expiry_ms))
        for (part, exp), sid in zip(sent, pipe.execute()):
            wanted[(part, sid.decode() if isinstance(sid, bytes) else sid)] = exp
        leases.renew()
    return wanted, rejected


def _apply_rejections(r: Client, topic: str, starts: dict[int, str],
                      entries: Iterable[tuple[int, str]]) -> int:
    """How many of the log ``entries`` (partition, stream id) the apply path rejected
    (partition error streams after the ids in ``starts``)."""
    mine = set(entries)
    n = 0
    for p, start in starts.items():
        errors = cast("list[StreamEntry]",
                      r.xrange(keys.partition_errors(topic, p), min="(" + start))
        for _eid, f in errors:
            if (p, f.get(b"id", b"").decode()) in mine:
                n += 1
    return n


def _restore_expiry(r: Client, topic: TopicConfig, wanted: dict[tuple[int, str], int]) -> int:
    """Give each applied record its absolute expiry back (0 = none). Only records still
    written by our entry (same stream id) are touched; one changed meanwhile (expired, or
    published again) is left alone: each chunk is written under WATCH and re-read on a change.

    Returns:
        The number of records whose expiry was set.
    """
    by_part: dict[int, dict[str, int]] = {}
    for (p, sid), exp in wanted.items():
        by_part.setdefault(p, {})[sid] = exp
    fixed = 0
    for p, exps in by_part.items():
        rec_key, exp_key = keys.records(topic.name, p), keys.expiry(topic.name, p)
        todo = []
        for k, v in r.hscan_iter(rec_key, count=CHUNK):
            rec = decode_record(k, v)
            want = exps.get(rec.stream_id)
            if want is not None and want != rec.expiry_ms:
                todo.append(k)
        for i in range(0, len(todo), CHUNK):
            chunk = todo[i:i + CHUNK]
            while True:
                with r.pipeline(transaction=True) as pipe:  # one slot: WATCH works on a cluster too
                    try:
                        pipe.watch(rec_key)
                        raws = cast("list[bytes | None]", pipe.hmget(rec_key, chunk))
                        recs = [decode_record(k, v) for k, v in zip(chunk, raws) if v]
                        pipe.multi()
                        n = 0
                        for rec in recs:
                            want = exps.get(rec.stream_id)
                            if want is None or want == rec.expiry_ms:
                                continue
                            pipe.hset(rec_key, rec.sow_key, b"%d:%d:%s\n%s" % (
                                rec.seq, want, rec.stream_id.encode(), rec.data))
                            if want:
                                pipe.zadd(exp_key, {rec.sow_key: want})
                            else:
                                pipe.zrem(exp_key, rec.sow_key)
                            n += 1
                        pipe.execute()
                        fixed += n
                        break
                    except WatchError:
                        continue
    return fixed


def _drop_partitions(r: Client, old: TopicConfig, new: TopicConfig) -> None:
    """Empty partitions ``new.partitions..old.partitions-1`` into the new layout, then delete
    their keys: error entries go to the topic-level error stream, dead-letter outbox entries
    to a kept partition's outbox, log entries not applied (appended by an old-definition
    publisher during the migration) are re-routed under the new definition."""
    name = old.name
    for p in range(new.partitions, old.partitions):
        for _eid, f in cast("list[StreamEntry]", r.xrange(keys.partition_errors(name, p))):
            r.xadd(keys.errors(name), cast("Fields", f))
        for _eid, f in cast("list[StreamEntry]", r.xrange(keys.dead_letters(name, p))):
            r.xadd(keys.dead_letters(name, p % new.partitions), cast("Fields", f))
        cursor = read_cursor(r, name, p)
        unapplied = cast("list[StreamEntry]", r.xrange(keys.log(name, p), min="(" + cursor))
        for sid, f in unapplied:
            supplied = f.get(b"sow_key")
            try:
                data = f[b"data"]
                part = parse(data, new, supplied.decode() if supplied else None).partition
            except (KeyError, MessageError) as exc:
                reason, detail = ((exc.reason, exc.detail) if isinstance(exc, MessageError)
                                  else ("bad_command", "entry without data"))
                _reject(r, name, p, (supplied or b"").decode(), sid.decode(),
                        f.get(b"data", b""), reason, detail)
                continue
            r.xadd(keys.log(name, part), cast("Fields", f))
        r.delete(keys.log(name, p), keys.state(name, p), keys.acks(name, p),
                 keys.dead_letters(name, p), keys.partition_errors(name, p),
                 keys.job_marker(name, p), keys.lease(name, p), keys.changes(name, p),
                 keys.change_times(name, p), keys.trusted(name, p))
        # a publisher still holding the old definition is refused here, reads the new one
        r.set(keys.definition(name, p), keys.DEFINITION_DROPPED)


def _fence(r: Client, old: TopicConfig, partitions: int) -> None:
    """Before the leases are taken: mark partitions ``0..partitions-1`` ``migrating``
    (:func:`keys.definition`: from now on ``apply.lua`` (operation ``appended``) appends nothing for any
    publisher; they wait and re-key their messages under the new definition), and tell the
    subscribers of the old partitions' channels (:func:`events.topic_migrating`: they
    follow the new layout once the migration ends, see :mod:`sow_redis.feed.subscriber`)."""
    pipe = r.pipeline(transaction=False)
    for p in range(partitions):
        pipe.set(keys.definition(old.name, p), keys.DEFINITION_MIGRATING)
    pipe.execute()
    notice = topic_migrating(old.name)
    for p in range(old.partitions):
        r.spublish(keys.partition_channel(old.name, p), notice)


def _unfence(r: Client, old: TopicConfig, new: TopicConfig) -> None:
    """A migration that did not happen: publishers go on under the old definition (its
    fingerprints stored back; partitions only the new layout would have had, unmarked)."""
    store_fingerprints(r, [old])
    for p in range(old.partitions, new.partitions):
        r.delete(keys.definition(old.name, p))


def changes_to_move(old: TopicConfig, new: TopicConfig) -> list[str]:
    """The shape changes (:func:`config.shape_changes`, ``hash_index`` and ``index`` included: an index
    added or changed covers only records written after it, so ``--migrate`` rebuilds it)."""
    return shape_changes(old, new)


def migrate_topic(r: Client, old: TopicConfig, new: TopicConfig,
                  settings: Settings | None = None) -> Migration:
    """Change a stored topic from ``old`` to ``new`` and move everything it holds (steps in
    the module docstring). Stores ``new`` in the registry.

    Raises:
        SowError: a partition stayed leased by a worker (nothing changed);
        FencedError: a lease was lost during the migration (workers then resume it under
            whichever definition is stored: run the migration again).
    """
    settings = settings or Settings.from_env()
    scripts = Scripts(r)
    changes = tuple(changes_to_move(old, new))
    # publishers first (nothing more is appended), so that busy workers drain what was and
    # free the leases
    _fence(r, old, max(old.partitions, new.partitions))
    try:
        leases = _Leases(r, scripts, old.name, max(old.partitions, new.partitions), settings)
    except BaseException:
        _unfence(r, old, new)
        raise
    stored = False
    try:
        drained = sum(_drain(r, scripts, old, p, leases, settings)
                      for p in range(old.partitions))
        records = {p: _read_hash(r, keys.records(old.name, p)) for p in range(old.partitions)}
        chains = ({p: _read_hash(r, keys.chain(old.name, p)) for p in range(old.partitions)}
                  if old.chaining else {})
        rows = sorted(((p, decode_record(k, v)) for p, recs in records.items()
                       for k, v in recs.items()), key=lambda row: parse_id(row[1].stream_id))
        _clear_layout(r, old.name, max(old.partitions, new.partitions),
                      max(old.n_indexes, new.n_indexes))
        if old.chaining and new.chaining and old.chain_fields == new.chain_fields:
            _carry_chains(r, old, new, chains, records)
        starts = {}
        for p in range(new.partitions):
            last = cast("list[StreamEntry]",
                        r.xrevrange(keys.partition_errors(new.name, p), count=1))
            starts[p] = last[0][0].decode() if last else "0-0"
        sec, usec = r.time()
        wanted, rejected = _republish(r, old, new, rows, int(sec) * 1000 + int(usec) // 1000,
                                      leases)
        for p in range(new.partitions):
            _drain(r, scripts, new, p, leases, settings)
        failed = _apply_rejections(r, new.name, starts, wanted)
        _restore_expiry(r, new, wanted)
        store_topics(r, [new])
        stored = True
        _drop_partitions(r, old, new)
    finally:
        if not stored:
            _unfence(r, old, new)
        leases.release()
    after = holdings(r, new).records
    return Migration(old.name, changes, drained, len(wanted) - failed, rejected + failed, after)


def apply_with_migration(r: Client, topics: list[TopicConfig], settings: Settings | None = None,
                         source: str = "<config>") -> tuple[int, list[Migration]]:
    """Store ``topics`` like :func:`registry.apply_topics`, migrating each stored topic whose
    shape, ``hash_index`` or ``index`` changes and that holds anything (:func:`migrate_topic`) first.

    Returns:
        (the new registry version, the migrations done, in file order).

    Raises:
        ConfigError: a problem against the registry (``dead_letter`` target); nothing stored.
        SowError, FencedError: see :func:`migrate_topic`.
    """
    problems = registry_problems(r, topics, source, migrate=True)
    if problems:
        raise ConfigError(problems)
    stored = load_topics(r)
    done = []
    for t in topics:
        old = stored.get(t.name)
        if old is not None and changes_to_move(old, t) and holdings(r, old):
            done.append(migrate_topic(r, old, t, settings))
    return apply_topics(r, topics, source), done
