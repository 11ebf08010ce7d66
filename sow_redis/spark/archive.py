"""``sow-redis spark archive`` (transaction log and change feed to Parquet, optionally
trimming what was archived) and ``sow-redis spark rebuild`` (a SOW from a snapshot plus the
archived and the live log).

**Archive** ``OUT``, one Spark task per partition:

* ``OUT/log``: every entry of every partition log: ``partition``, ``id`` (stream id), ``ms``
  (its time, ms since the epoch, Redis server clock), ``cmd``, ``data`` (message bytes),
  ``sow_key`` (the key the publisher computed, field ``k``, else the publisher-supplied one),
  ``keys`` / ``filter`` (``sow_delete`` by keys / by filter), ``expiration`` (seconds),
  ``applied`` (the entry was at or below the partition's applied cursor when archived) and
  ``fields`` (every stream field, byte for byte: what a rebuild appends again);
* ``OUT/changes``: the change feed (the topic keeps one unless ``change_retention = 0``): one
  row per change: ``partition``, ``seq``, ``op``, ``sow_key``, ``reason`` (removals),
  ``data`` (JSON text), ``expiry_ms``, ``stream_id`` (the log entry that made it), ``ms``
  (time of its atomic call);
* ``OUT/_sow_partitions``: ``partition``, ``cursor`` (applied cursor at the archive),
  ``last_id`` (last log entry archived), ``entries``, ``changes``.

With ``trim``, each partition's log then loses the entries that are archived *and* applied:
``XTRIM MINID`` just above ``min(cursor, last archived id)`` (an unapplied entry is never
removed; entries appended after the archive read are kept). The change feed is not trimmed
(its own retention does that; bookmarks read it).

**Rebuild** from an export (:func:`sow_redis.spark.snapshot.export`: each record exactly, and
each partition's ``seq`` and applied ``cursor``), one Spark task per partition, holding the
partition's lease (the workers' fencing token) throughout:

1. the partition's records, expiry set, hash-index members and indexes are replaced by the
   snapshot's records (same SOW keys, data, change sequences, stream ids, expiries; index
   members from :func:`sow_redis.model.messages.index_members`, as the publisher computes them);
2. the log is rewritten to hold, in stream-id order, the entries after the snapshot's cursor:
   the archived ones (``--log``) and those still in the live log (a live entry wins over its
   archived copy), with their original stream ids (so expiries computed from them come out
   the same);
3. the state gets the snapshot's ``seq`` and ``cursor``; the workers' apply path
   (:func:`sow_redis.apply.applier.apply_batch` under the held token) applies the log from there.

For a chaining topic, step 1 also replaces each partition's chain table by the export's
(``OUT/_sow_chains``, read with the records), so the log entries after the snapshot chain to
the same heads as they did (a modification naming an order of the snapshot keeps its SOW
key). An export made before chain tables were exported has none: the chain table is then
left as it is, with a warning.

The result equals the SOW the original went through, records, expiries, indexes, chain tables
and change sequences included, as long as nothing but the log changed it after the snapshot
(the expirer's removals are not in the log: a record that expired in between is restored and
then expires again at once, with its own change sequence). The change feed is left as it is.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import orjson

from .. import keys
from ..apply.applier import apply_batch
from ..apply.scripts import Scripts
from ..connection import Client, StreamEntry, connect
from ..errors import SowError
from ..model.events import parse_block
from ..model.messages import decode, index_members
from ..model.rangeindex import NUMBER, stored_members
from ..model.topic import TopicConfig
from ..settings import Settings
from ..streamids import compare, ms_of, parse, reached
from .snapshot import CHAINS_DIR, CHAINS_SCHEMA, PARTITIONS_DIR

if TYPE_CHECKING:  # pyspark is the optional [spark] extra
    from pyspark.sql import Row, SparkSession

_log = logging.getLogger(__name__)

READ_CHUNK = 10_000
"""Log or change-feed entries per XRANGE while archiving."""

WRITE_CHUNK = 2_000
"""Records or log entries per pipeline while rebuilding."""

LOG_SCHEMA = ("partition int, id string, ms long, cmd string, data binary, sow_key string, "
              "keys string, filter string, expiration string, applied boolean, "
              "fields map<string, binary>")
CHANGES_SCHEMA = ("partition int, seq long, op string, sow_key string, reason string, "
                  "data string, expiry_ms long, stream_id string, ms long")


@dataclass
class ArchiveResult:
    """What an archive wrote: log entries, change-feed rows, log entries trimmed."""

    entries: int = 0
    changes: int = 0
    trimmed: int = 0


@dataclass
class RebuildResult:
    """What a rebuild did: records restored from the snapshot, log entries after the
    snapshot taken from the archive and from the live log, entries the apply path consumed,
    records the topic holds afterwards, chain identifiers restored (chaining topics)."""

    restored: int = 0
    archived: int = 0
    live: int = 0
    applied: int = 0
    records: int = 0
    chain_ids: int = 0


def _text(v: bytes | None) -> str | None:
    return None if v is None else v.decode(errors="replace")


def read_log(url: str, topic: str, p: int) -> Iterator[tuple[Any, ...]]:
    """Executor side: partition ``p``'s log as :data:`LOG_SCHEMA` rows, then one summary row
    ``(p, None, …)`` whose ``fields`` hold ``cursor`` and ``last_id``."""
    r = connect(url)
    cursor = (cast("bytes | None", r.hget(keys.state(topic, p), "cursor")) or b"0-0").decode()
    log_key, start, last = keys.log(topic, p), "-", ""
    while True:
        chunk = cast("list[StreamEntry]", r.xrange(log_key, start, "+", count=READ_CHUNK))
        for sid_b, f in chunk:
            sid = sid_b.decode()
            fields = {k.decode(): v for k, v in f.items()}
            yield (p, sid, ms_of(sid), _text(f.get(b"cmd")) or "publish", f.get(b"data"),
                   _text(f.get(b"k") or f.get(b"sow_key")), _text(f.get(b"keys")),
                   _text(f.get(b"filter")), _text(f.get(b"expiration")),
                   reached(cursor, sid), fields)
            last = sid
        if len(chunk) < READ_CHUNK:
            break
        start = "(" + chunk[-1][0].decode()
    yield (p, None, None, None, None, None, None, None, None, None,
           {"cursor": cursor.encode(), "last_id": last.encode()})


def read_changes(url: str, topic: str, p: int) -> Iterator[tuple[Any, ...]]:
    """Executor side: partition ``p``'s change feed as :data:`CHANGES_SCHEMA` rows."""
    r = connect(url)
    key, start = keys.changes(topic, p), "-"
    while True:
        chunk = cast("list[StreamEntry]", r.xrange(key, start, "+", count=READ_CHUNK))
        for _sid, f in chunk:
            try:
                block = parse_block(f[b"block"])
            except (KeyError, ValueError):
                continue
            for ev in block["events"]:
                yield (p, ev["seq"], ev["op"], ev["sow_key"], ev.get("reason"),
                       orjson.dumps(ev["data"]).decode(), ev["expiry_ms"], ev["id"],
                       block["ms"])
        if len(chunk) < READ_CHUNK:
            break
        start = "(" + chunk[-1][0].decode()


def _next_id(sid: str) -> str:
    ms, n = parse(sid)
    return f"{ms}-{n + 1}"


def archive(spark: SparkSession, url: str, topic: TopicConfig, out: str, trim: bool = False) -> ArchiveResult:
    """Archive the topic's logs and change feed to ``out`` (replaced), optionally trimming
    the archived, applied log entries (see the module docstring).

    Raises:
        Spark and Redis errors; with ``trim``, nothing is trimmed unless the Parquet files were
        written.
    """
    name, parts, base = topic.name, topic.partitions, out.rstrip("/")
    seeds = spark.sparkContext.parallelize(range(parts), parts)
    logs = spark.createDataFrame(seeds.flatMap(lambda p: read_log(url, name, p)),
                                 LOG_SCHEMA).cache()
    try:
        entries = logs.filter("id IS NOT NULL")
        n = entries.count()
        entries.write.mode("overwrite").parquet(f"{base}/log")
        summary = {row["partition"]: (row["fields"]["cursor"].decode(),
                                      row["fields"]["last_id"].decode(), 0)
                   for row in logs.filter("id IS NULL").collect()}
        counts = {row["partition"]: row["count"]
                  for row in entries.groupBy("partition").count().collect()}
    finally:
        logs.unpersist()
    changes = spark.createDataFrame(seeds.flatMap(lambda p: read_changes(url, name, p)),
                                    CHANGES_SCHEMA).cache()
    try:
        n_changes = changes.count()
        changes.write.mode("overwrite").parquet(f"{base}/changes")
        change_counts = {row["partition"]: row["count"]
                         for row in changes.groupBy("partition").count().collect()}
    finally:
        changes.unpersist()
    meta = [(p, cursor, last, counts.get(p, 0), change_counts.get(p, 0))
            for p, (cursor, last, _n) in sorted(summary.items())]
    spark.createDataFrame(meta, "partition int, cursor string, last_id string, entries long, "
                          "changes long").coalesce(1).write.mode("overwrite").json(
        f"{base}/{PARTITIONS_DIR}")
    trimmed = 0
    if trim:
        r = connect(url)
        for p, cursor, last, _n, _c in meta:
            if not last:
                continue
            upto = cursor if compare(cursor, last) < 0 else last
            if upto == "0-0":
                continue
            # exact MINID: every entry below it goes (an approximate trim stops at node bounds)
            trimmed += int(r.xtrim(keys.log(name, p), minid=_next_id(upto), approximate=False))
    return ArchiveResult(entries=n, changes=n_changes, trimmed=trimmed)


def _take_lease(scripts: Scripts, topic: str, p: int, owner: str, lease_ms: int,
                patience_s: float) -> int:
    deadline = time.monotonic() + patience_s
    while True:
        fence = scripts.lease_acquire(keys.lease(topic, p), keys.state(topic, p), owner,
                                      lease_ms)
        if fence is not None:
            return int(fence)
        if time.monotonic() > deadline:
            raise SowError(f"topic '{topic}': partition {p} stayed leased by another process "
                           f"for {patience_s:g} s; stop its workers and try again")
        time.sleep(0.05)


def rebuild_partition(url: str, topic_json: bytes, p: int, state: tuple[int, str],
                      rows: Iterable[tuple[str, Row]],
                      chains: bool = False) -> Iterator[dict[str, int]]:
    """Executor side of a rebuild of partition ``p`` (steps 1–3 of the module docstring).

    Args:
        state: ``(seq, cursor)`` the snapshot is consistent with.
        rows: ``("s", snapshot row)``, ``("l", archived log row)`` and ``("c", chain table
            row)`` items.
        chains: replace the partition's chain table by the ``("c", …)`` rows (the export
            has chain tables).

    Yields one count dict.
    """
    topic = TopicConfig.from_json(topic_json)
    name = topic.name
    seq, cursor = state
    r = connect(url)
    scripts = Scripts(r)
    settings = Settings.from_env()
    owner = f"rebuild:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    fence = _take_lease(scripts, name, p, owner, settings.lease_ms,
                        2 * settings.lease_ms / 1000 + 2 * settings.job_budget_s + 1)
    out = {"restored": 0, "archived": 0, "live": 0, "applied": 0, "chain_ids": 0}
    try:
        snap, archived, chain = _sort_rows(rows, cursor)
        out["chain_ids"] = _restore_records(r, topic, p, snap, chain if chains else None)
        out["restored"] = len(snap)
        out["live"], out["archived"] = _rewrite_log(r, name, p, (seq, cursor), archived)
        applied_cursor = None
        while True:
            n, applied_cursor = apply_batch(r, scripts, topic, p, fence, settings.batch_size,
                                            applied_cursor)
            if n == 0:
                break
            out["applied"] += n
            _take_lease(scripts, name, p, owner, settings.lease_ms, 0)  # renew
    finally:
        scripts.lease_release(keys.lease(name, p), owner)
    yield out


def _sort_rows(rows: Iterable[tuple[str, Row]], cursor: str
               ) -> tuple[list[Row], dict[str, dict[str, bytes]], dict[str, str]]:
    """The items of :func:`rebuild_partition` by kind.

    Returns:
        ``(snapshot rows, archived log entries after ``cursor`` (stream id → fields),
        chain table (identifier → head))``.
    """
    snap: list[Row] = []
    archived: dict[str, dict[str, bytes]] = {}
    chain: dict[str, str] = {}
    for kind, row in rows:
        if kind == "s":
            snap.append(row)
        elif kind == "c":
            chain[row["id"]] = row["head"]
        elif not reached(cursor, row["id"]):
            archived[row["id"]] = {k: bytes(v) for k, v in row["fields"].items()}
    return snap, archived, chain


def _restore_records(r: Client, topic: TopicConfig, p: int, snap: list[Row],
                     chain: dict[str, str] | None) -> int:
    """Step 1: replace partition ``p``'s records, expiry set, index members and indexes by
    the snapshot rows ``snap`` (and its chain table by ``chain``, unless None), in
    pipelines (``MULTI``) of :data:`WRITE_CHUNK` records.

    Returns:
        The chain identifiers written (0 when ``chain`` is None).
    """
    name, n_idx = topic.name, topic.n_indexes
    pipe = r.pipeline(transaction=True)
    pipe.delete(keys.records(name, p), keys.expiry(name, p), keys.index_members(name, p),
                keys.acks(name, p), *(keys.index(name, p, j) for j in range(n_idx)),
                *(keys.range_numbers(name, p, j) for j in range(len(topic.hash_index), n_idx)))
    chain_ids = 0
    if chain is not None:
        pipe.delete(keys.chain(name, p))
        items = list(chain.items())
        for i in range(0, len(items), WRITE_CHUNK):
            pipe.hset(keys.chain(name, p), mapping=dict(items[i:i + WRITE_CHUNK]))
        chain_ids = len(items)
    for i, row in enumerate(snap):
        key, data = row["_sow_key"], row["_sow_data"].encode()
        exp = int(row["_sow_expiry_ms"] or 0)
        pipe.hset(keys.records(name, p), key, b"%d:%d:%s\n%s" % (
            int(row["_sow_record_seq"]), exp, row["_sow_stream_id"].encode(), data))
        if exp:
            pipe.zadd(keys.expiry(name, p), {key: exp})
        members = index_members(decode(data, topic), topic, key) if n_idx else ""
        kept = stored_members(members)
        if kept:
            pipe.hset(keys.index_members(name, p), key, kept)
        for j, m in enumerate(members.split(",") if members else ()):
            if m.startswith(NUMBER) and j >= len(topic.hash_index):
                pipe.zadd(keys.range_numbers(name, p, j), {key: float(m[1:])})
            elif m:
                pipe.zadd(keys.index(name, p, j), {m: 0})
        if i % WRITE_CHUNK == WRITE_CHUNK - 1:
            pipe.execute()
    pipe.execute()
    return chain_ids


def _rewrite_log(r: Client, name: str, p: int, state: tuple[int, str],
                 archived: dict[str, dict[str, bytes]]) -> tuple[int, int]:
    """Steps 2 and 3: partition ``p``'s log rewritten to hold the entries after the
    snapshot's cursor, archived ones then the live ones (which win), in stream-id order with
    their own ids; then its state gets the snapshot's ``(seq, cursor)``.

    Returns:
        ``(live entries, archived entries not in the live log)``.
    """
    seq, cursor = state
    log_key = keys.log(name, p)
    live = {sid.decode(): {k.decode(): v for k, v in f.items()}
            for sid, f in cast("list[StreamEntry]", r.xrange(log_key, "(" + cursor, "+"))}
    merged = {**archived, **live}
    ids = sorted(merged, key=lambda s: tuple(int(x) for x in s.split("-")))
    pipe = r.pipeline(transaction=True)
    pipe.delete(log_key)
    for i, sid in enumerate(ids):
        pipe.xadd(log_key, merged[sid], id=sid)  # type: ignore[arg-type]
        if i % WRITE_CHUNK == WRITE_CHUNK - 1:
            pipe.execute()
    pipe.hset(keys.state(name, p), mapping={"seq": seq, "cursor": cursor})
    pipe.execute()
    assert not ids or compare(ids[0], cursor) > 0
    return len(live), len(set(archived) - set(live))


def rebuild(spark: SparkSession, url: str, topic: TopicConfig, snapshot: str,
            log: str | None = None) -> RebuildResult:
    """Rebuild the topic's SOW from an export at ``snapshot`` plus the archived log at
    ``log`` (an archive's folder) and the live log (see the module docstring).

    Raises:
        ValueError: ``snapshot`` is not an export of this topic's partitions (no
            ``_sow_partitions``, or other partitions); Spark's AnalysisException for an
            unreadable path; SowError when a partition stays leased by a running worker.
    """
    snap_base = snapshot.rstrip("/")
    try:
        meta = spark.read.json(f"{snap_base}/{PARTITIONS_DIR}").collect()
    except Exception as exc:
        raise ValueError(f"{snapshot} is not a sow-redis spark export ({PARTITIONS_DIR} "
                         f"unreadable: {type(exc).__name__})") from None
    states = {int(m["partition"]): (int(m["seq"]), str(m["cursor"])) for m in meta}
    if set(states) != set(range(topic.partitions)):
        raise ValueError(f"{snapshot} holds partitions {sorted(states)}, topic "
                         f"{topic.name!r} has {topic.partitions}")
    snap = spark.read.parquet(snapshot)
    items = snap.rdd.map(lambda row: (int(row["_sow_partition"]), ("s", row))) if (
        "_sow_key" in snap.columns) else spark.sparkContext.emptyRDD()
    if log:
        archived = spark.read.parquet(f"{log.rstrip('/')}/log").select("partition", "id",
                                                                      "fields")
        items = items.union(archived.rdd.map(lambda row: (int(row["partition"]), ("l", row))))
    chains = topic.chaining and bool(meta) and all(
        m.asDict().get("chains") is not None for m in meta)
    if chains:
        table = spark.read.schema(CHAINS_SCHEMA).json(f"{snap_base}/{CHAINS_DIR}")
        items = items.union(table.rdd.map(lambda row: (int(row["partition"]), ("c", row))))
    elif topic.chaining:
        _log.warning("topic %s: the export %s holds no chain tables (made before they were "
                     "exported): the chain tables are left as they are", topic.name, snapshot)
    topic_json, parts = topic.to_json(), topic.partitions
    keyed = items.partitionBy(parts, lambda p: p)

    def task(p: int, it: Iterable[tuple[int, tuple[str, Row]]]) -> Iterator[dict[str, int]]:
        return rebuild_partition(url, topic_json, p, states[p], (v for _p, v in it), chains)

    counts = keyed.mapPartitionsWithIndex(task).collect()
    r = connect(url)
    records = sum(int(r.hlen(keys.records(topic.name, p))) for p in range(parts))
    return RebuildResult(restored=sum(c["restored"] for c in counts),
                         archived=sum(c["archived"] for c in counts),
                         live=sum(c["live"] for c in counts),
                         applied=sum(c["applied"] for c in counts), records=records,
                         chain_ids=sum(c["chain_ids"] for c in counts))
