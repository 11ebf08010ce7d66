"""``sow-redis spark load``: a bulk load of JSON Lines, Parquet or FIX logs into a SOW topic.

1. Spark reads the inputs (files, folders, globs) in splits and numbers the rows in input
   order (or orders them by ``order_by`` columns).
2. Executors validate each row and build its log entry with the publisher's own code
   (:func:`sow_redis.publish.append.prepare`: the same SOW keys, canonical values and FIX parsing
   as ``sow-redis publish``); a row it refuses becomes an error-stream entry with its reason.
3. Each split's task sends its rows, batch by batch per topic partition, to
   ``lua/include/apply_load.lua``, which appends a batch to the partition's transaction log and
   applies it in the same atomic call (the workers' upsert, index, sequence and change-feed
   code), in the load's order: a batch that arrives before the batches ahead of it (the
   previous split still running) is staged in Redis and applied by the call that reaches
   it. The load's position per partition makes every batch apply exactly once, whatever
   task retries or reruns. There is no shuffle and no stage barrier: a split's rows are
   applied while the next splits are prepared, and each task sends its batches from a second
   thread while it prepares the rows that follow, so Redis and the Python workers work at
   the same time.
4. After the tasks, the driver applies what is still staged (a split that finished before
   the one ahead of it) and checks that every partition reached the end of the load.

A chaining topic resolves its chains first (:mod:`sow_redis.spark.chains`), then its rows go
to one task per topic partition (a shuffle), which appends them with ``lua/load_batch.lua``
(exactly once per batch) and applies them with the workers' planning path, which a chaining
message needs. Delta publishes and deletes (``cmd``: ``spark load --delta`` / ``--delete``)
take this path too, on any topic: ``apply.lua`` (operation ``load``) applies prepared plain publishes only,
and the workers' apply code (``jobs.drain_partition``, run by each partition's task under
the partition's lease) merges and deletes exactly as ``delta-publish`` and ``sow-delete``.

On a Redis Cluster (``redis+cluster://``) every load takes the shuffle path, with the
topic's partitions grouped by the primary that owns their slot (:func:`slot_owners`): one
task per primary, which writes only to that primary (each partition's keys share one slot;
no call spans two): plain publishes as one split per partition through ``lua/apply.lua``
(operation ``load``; :func:`apply_partition`), the rest through ``lua/load_batch.lua`` and the
workers' apply code (:func:`write_partition`). ``durable`` makes each batch wait until a
replica has it (:func:`wait_replicated`), so a failover during the load loses no batch a task
went past; a task that lost its connection (a primary killed) reads what the new primary has
(the load's position, or its batch markers) and sends the missing batches again, in order.

The resulting SOW is the one that publishing the same messages in the same order gives.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

from redis import exceptions as rx

from .. import keys
from ..apply.scripts import LoadApplied, LoadStatus, Scripts, pack_load_batch
from ..client import Sow
from ..connection import Client, Fields, connect, is_cluster_url, node_for_key, reload_slot_map
from ..errors import NotDurableError, WaitTimeout
from ..model.topic import TopicConfig
from ..settings import Settings
from .chains import ChainResult, resolve_prepared
from .rows import (
    InputRow,
    Prepared,
    PreparedRow,
    RejectedRow,
    check_inputs,
    input_rows,
    local_path,
    prepare_rows,
)

if TYPE_CHECKING:  # pyspark is the optional [spark] extra
    from pyspark import RDD
    from pyspark.sql import SparkSession

T = TypeVar("T")

APPLY_BATCH = 2000
"""Log entries per apply call when a load task applies its partition (the workers' apply
path with a larger batch: a load's entries are all there already)."""

MAX_BATCHES = 4
"""Batches one apply.lua (load) call applies at most (its own and the staged ones after it):
with the default batch size, Redis is never held for more than about 20,000 messages."""

MAX_AHEAD = 8
"""A task whose split is this many splits ahead of the partition's applied position waits
(up to ``STAGE_WAIT_S``) before staging more: a slow Redis does not fill up with staged
batches."""

STAGE_WAIT_S = 60.0
"""Seconds such a task waits at most for the position to come nearer; then it stages anyway."""

SEND_AHEAD = 2
"""Batches a task prepares ahead of the one its sender thread is sending."""

REPLICA_WAIT_S = 10.0
"""Seconds a ``durable`` batch waits at most for a replica to have it."""

FAILOVER_WAIT_S = 60.0
"""Seconds a task waits at most for a partition's slot to be served again after its
primary stopped answering (Redis Cluster elects a replica after ``cluster-node-timeout``)."""


@dataclass
class LoadResult:
    """What a load did: rows read, entries appended (already appended ones not counted again),
    rows rejected (in the topic's error stream), FIX session messages skipped, entries
    applied by the load's tasks; on a chaining topic, the chain resolution that preceded the
    appends."""

    rows: int = 0
    appended: int = 0
    rejected: int = 0
    skipped: int = 0
    applied: int = 0
    chains: ChainResult | None = None


def default_load_id(topic: str, inputs: list[str], cmd: str = "publish") -> str:
    """A load id that is the same for the same inputs (names, sizes, modification times) and
    command (``publish``; ``delta_publish`` and ``sow_delete`` give other ids, so a delta
    load of files loaded before is not taken for that load)."""
    h = hashlib.sha256(topic.encode())
    if cmd != "publish":
        h.update(f"\0{cmd}\0".encode())
    for path in sorted(inputs):
        h.update(path.encode())
        try:
            st = os.stat(path)
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
        except OSError:
            pass
    return h.hexdigest()[:16]


def write_partition(url: str, topic_json: bytes, load_id: str, batch_size: int, apply: bool,
                    p: int, rows: Iterable[PreparedRow],
                    durable: bool = False) -> Iterator[dict[str, int]]:
    """Executor side of steps 3 and 4 for topic partition ``p``: append its rows in order,
    batch by batch, exactly once; then apply the partition. Yields one count dict.

    On a Redis Cluster a lost connection (the partition's primary killed) is waited out
    (at most ``FAILOVER_WAIT_S`` seconds, until the slot's new owner answers); then the
    batches the partition's loads hash no longer names (written but not replicated before
    the failover) are sent again, in order. ``durable``: each batch returns only once a
    replica has it (:func:`wait_replicated`; ``NotDurableError`` after ``REPLICA_WAIT_S``).

    Raises:
        RuntimeError: batches lost out of order (a later batch kept, an earlier one lost:
            only possible without ``durable``); redis errors after ``FAILOVER_WAIT_S``.
    """
    topic = TopicConfig.from_json(topic_json)
    sow = Sow(url, inline=True, settings=Settings.from_env(redis_url=url,
                                                           batch_size=APPLY_BATCH))
    scripts = Scripts(sow.r)
    out = {"rows": 0, "skipped": 0, "appended": 0, "rejected": 0, "applied": 0}
    ordered = []
    for row in rows:
        out["rows"] += 1
        if row[1] is None and row[2] is None:
            out["skipped"] += 1
        else:
            ordered.append(row)
    ordered.sort(key=lambda row: row[0])
    batches = -(-len(ordered) // batch_size)
    sent: dict[int, tuple[int, int]] = {}  # batch → (entries appended, rows rejected)

    def send(b: int) -> None:
        chunk = ordered[b * batch_size:(b + 1) * batch_size]
        entries = [fields for _o, fields, _rej in chunk if fields is not None]
        rejects = [rej for _o, _f, rej in chunk if rej is not None]
        n, _sid = scripts.load_batch(topic.name, p, f"{load_id}:{b}", entries, rejects)
        if n >= 0:
            sent[b] = (n, len(rejects))
        if durable:
            wait_replicated(sow.r, keys_log(topic.name, p))

    b = 0
    while True:
        while b < batches:
            try:
                send(b)
                b += 1
            except Exception as exc:
                if not _connection_lost(exc):
                    raise
                # the primary stopped answering: wait for the slot's owner (a promoted
                # replica), then resume at the first batch it does not have
                b = _resume_at(sow.r, topic.name, p, load_id, b)
                for lost in [x for x in sent if x >= b]:
                    del sent[lost]
        if not batches:
            break
        # a cluster client that retried by itself may have gone past a failover: check every
        # batch (on a server, where nothing fails over, every batch is there)
        b = _resume_at(sow.r, topic.name, p, load_id, batches - 1)
        if b >= batches:
            break
        for lost in [x for x in sent if x >= b]:
            del sent[lost]
    out["appended"] = sum(n for n, _r in sent.values())
    out["rejected"] = sum(r for _n, r in sent.values())
    if apply:
        out["applied"] = _with_failover(sow.r, lambda: sow.handoff(topic, {p: "0-0"},
                                                                   timeout=3600))
    yield out


def keys_log(topic: str, p: int) -> str:
    """The key of partition ``p``'s log (its slot is the partition's)."""
    return keys.log(topic, p)


def _connection_lost(exc: BaseException) -> bool:
    return isinstance(exc, (rx.ConnectionError, rx.TimeoutError, rx.ClusterDownError,
                            rx.TryAgainError, rx.MasterDownError)) or (
        isinstance(exc, rx.ResponseError) and str(exc).startswith(("CLUSTERDOWN", "READONLY",
                                                                   "MOVED", "LOADING")))


def _reconnect(r: Client, deadline: float) -> None:
    """Until the slot map is read again and answers (a cluster client), or ``deadline``."""
    while True:
        try:
            reload_slot_map(r)
            r.ping()
            return
        except (rx.RedisError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _with_failover(r: Client, fn: Callable[[], T]) -> T:
    """``fn()``, called again (it must be idempotent) after a lost connection, for at most
    ``FAILOVER_WAIT_S`` seconds."""
    deadline = time.monotonic() + FAILOVER_WAIT_S
    while True:
        try:
            return fn()
        except Exception as exc:
            if not _connection_lost(exc) or time.monotonic() > deadline:
                raise
            _reconnect(r, deadline)


def _resume_at(r: Client, topic: str, p: int, load_id: str, upto: int) -> int:
    """After a lost connection while batch ``upto`` of partition ``p`` was sent: the first
    batch (≤ ``upto``) whose marker the slot's owner does not have. A failover keeps a prefix
    of what the old primary had (replication is in order), so every batch after it is
    missing too and is sent again, in order.

    Raises:
        RuntimeError: a batch missing before one that is there (should not happen).
    """
    deadline = time.monotonic() + FAILOVER_WAIT_S
    _reconnect(r, deadline)
    markers = [f"{load_id}:{b}" for b in range(upto + 1)]
    have = _with_failover(r, lambda: r.hmget(keys.loads(topic, p), markers))
    first = next((b for b, v in enumerate(have) if v is None), upto + 1)
    if any(v is not None for v in have[first:]):
        raise RuntimeError(f"load {load_id} of topic {topic}: partition {p} lost batch {first} "
                           "in a failover but kept a later one; load again with --durable")
    return first


def wait_replicated(r: Client, key: str, timeout_s: float = REPLICA_WAIT_S) -> None:
    """Return once a replica of the node that owns ``key`` has everything that node had
    written when this was called (its ``master_repl_offset``, against each replica's
    acknowledged offset in ``INFO replication``): ``WAIT 1`` that needs no particular
    connection. A single server without replicas: after ``timeout_s`` seconds.

    Raises:
        NotDurableError: no replica reached the offset within ``timeout_s`` seconds.
    """
    client, where = node_for_key(r, key)
    target = int(client.info("replication")["master_repl_offset"])
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.info("replication")
        offsets = [int(v["offset"]) for k, v in info.items()
                   if k.startswith("slave") and isinstance(v, dict) and "offset" in v]
        if any(o >= target for o in offsets):
            return
        if time.monotonic() > deadline:
            raise NotDurableError(f"no replica of {where} confirmed the load's writes within "
                                  f"{timeout_s:g} s")
        time.sleep(0.002)


def slot_owners(url: str, topic: str, partitions: int) -> dict[int, int]:
    """Topic partition → index of the primary that owns its slot (primaries numbered in
    order of their ``host:port``) on a Redis Cluster; every partition → 0 on a server."""
    r = connect(url)  # no command sent for a server; a cluster client reads the slot map
    try:
        owner = {p: node_for_key(r, keys.log(topic, p))[1] for p in range(partitions)}
    finally:
        r.close()
    names = sorted(set(owner.values()))
    return {p: names.index(n) for p, n in owner.items()}


class _SplitWriter:
    """Sends one split's batches to ``lua/include/apply_load.lua`` (executor side of step 3) and keeps
    the counts."""

    def __init__(self, url: str, topic: TopicConfig, load_id: str, splits: int, split: int,
                 timeout: float) -> None:
        self.topic, self.load_id, self.timeout = topic, load_id, timeout
        self.splits, self.split = splits, split
        self.sow = Sow(url, inline=True, settings=Settings.from_env(redis_url=url,
                                                                    batch_size=APPLY_BATCH))
        self.scripts = Scripts(self.sow.r)
        self.counts = {"rows": 0, "skipped": 0, "appended": 0, "rejected": 0, "applied": 0,
                       "staged": 0}
        self._queue: queue.Queue[tuple[int, int, bool, list[Fields], list[RejectedRow]] | None] = (
            queue.Queue(maxsize=SEND_AHEAD))
        self._sender: threading.Thread | None = None
        self._failed: BaseException | None = None

    def submit(self, p: int, batch: int, last: bool, entries: list[Fields],
               rejects: list[RejectedRow]) -> None:
        """:meth:`send` from a thread of its own, in the order submitted, so the task goes on
        preparing rows while Redis applies (a socket wait releases the GIL); blocks when
        ``SEND_AHEAD`` batches wait. Raises what an earlier send raised."""
        if self._failed is not None:
            raise self._failed
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_queued, daemon=True,
                                            name=f"sow-load-split-{self.split}")
            self._sender.start()
        self._queue.put((p, batch, last, entries, rejects))

    def close(self) -> None:
        """Wait until every submitted batch was sent; raise what a send raised."""
        if self._sender is not None:
            self._queue.put(None)
            self._sender.join()
            self._sender = None
        if self._failed is not None:
            raise self._failed

    def _send_queued(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._failed is None:
                try:
                    self.send(*item)
                except BaseException as exc:  # handed to the task's thread by close/submit
                    self._failed = exc

    def send(self, p: int, batch: int, last: bool, entries: list[Fields],
             rejects: list[RejectedRow]) -> None:
        """Batch ``batch`` of this split in partition ``p``: applied, staged or (applied
        before) nothing, as :func:`apply_load` says."""
        packed = pack_load_batch(entries, rejects)
        deadline = time.monotonic() + self.timeout
        while True:
            got = self.scripts.apply_load(self.topic, p, self.load_id, self.splits, self.split,
                                          batch, last, packed, MAX_BATCHES)
            self._count(got)
            if got.status == LoadStatus.STAGED:
                self.counts["staged"] += 1
                self._wait_if_far_ahead(p, got.next[0])
            if got.status in (LoadStatus.APPLIED, LoadStatus.STAGED,
                              LoadStatus.APPLIED_BEFORE):
                return
            self._make_way(p, got.status, deadline)

    def apply_staged(self, p: int) -> tuple[int, int]:
        """Apply the staged batches that follow the partition's position (later splits that
        finished first); the position after."""
        deadline = time.monotonic() + self.timeout
        while True:
            got = self.scripts.apply_load(self.topic, p, self.load_id, self.splits, -1, 0,
                                          False, b"", MAX_BATCHES)
            self._count(got)
            if got.status == LoadStatus.APPLIED:
                if got.applied == 0 and got.rejected == 0:
                    return got.next
            else:
                self._make_way(p, got.status, deadline)

    def _count(self, got: LoadApplied) -> None:
        self.counts["appended"] += got.applied
        self.counts["applied"] += got.applied
        self.counts["rejected"] += got.rejected

    def _make_way(self, p: int, status: LoadStatus, deadline: float) -> None:
        """Entries in the log ahead of the load (publishes not applied yet): apply them with
        the workers' path; a shape migration: wait for it."""
        if status == LoadStatus.SPLITS_CHANGED:
            raise RuntimeError(f"load {self.load_id} of topic {self.topic.name} ran before "
                               f"with another number of splits than {self.splits}: give this "
                               "run another --load-id (its rows are applied again) or the "
                               "same inputs and Spark settings")
        if status == LoadStatus.DEFINITION_CHANGED:
            raise RuntimeError(f"topic {self.topic.name} was changed (config apply) while "
                               f"load {self.load_id} ran: its rows are keyed under the old "
                               "definition; run the load again (nothing of this batch was "
                               "applied)")
        if status == LoadStatus.LOG_BACKLOG:
            self.counts["applied"] += self.sow.handoff(
                self.topic, {p: "0-0"}, timeout=max(1.0, deadline - time.monotonic()))
        elif time.monotonic() < deadline:
            time.sleep(0.1)
        else:
            raise WaitTimeout(f"topic {self.topic.name}: partition {p} stayed in a shape "
                              f"migration for {self.timeout:g} s")

    def _wait_if_far_ahead(self, p: int, applied_split: int) -> None:
        """Staged while ``MAX_AHEAD`` splits or more are ahead: wait for the apply to come
        nearer (at most ``STAGE_WAIT_S``), so staged batches do not pile up in Redis."""
        until = time.monotonic() + STAGE_WAIT_S
        while self.split - applied_split >= MAX_AHEAD and time.monotonic() < until:
            time.sleep(0.05)
            pos = self.sow.r.hget(keys.loads(self.topic.name, p), self.load_id)
            text = pos.decode() if isinstance(pos, bytes) else str(pos or "0:0")
            applied_split = int(text.split(":")[0])


def write_split(url: str, topic_json: bytes, load_id: str, batch_size: int, splits: int,
                split: int, prepared: Iterable[Prepared],
                timeout: float = 3600.0) -> Iterator[dict[str, int]]:
    """Executor side of step 3 for input split ``split`` of ``splits`` (rows from
    :func:`prepare_rows`, in order): each partition's entries in batches of ``batch_size``
    to ``lua/include/apply_load.lua``,
    each rejected row with the next batch sent, every partition's last batch (empty when the
    split has no row there) flagged, sent from a second thread while the rows that follow are
    prepared; then the staged batches after this split's. Yields one count dict (``staged``:
    batches left for the call that reaches them).

    Raises:
        RuntimeError: the load ran before with another number of splits; WaitTimeout: a
        shape migration held a partition for ``timeout`` seconds; Redis errors.
    """
    topic = TopicConfig.from_json(topic_json)
    w = _SplitWriter(url, topic, load_id, splits, split, timeout)
    bufs: list[list[Fields]] = [[] for _ in range(topic.partitions)]
    sent = [0] * topic.partitions
    rejects: list[RejectedRow] = []
    try:
        for p, (_order, fields, reject) in prepared:
            w.counts["rows"] += 1
            if p < 0:
                w.counts["skipped"] += 1
            elif reject is not None:
                rejects.append(reject)
            else:
                buf = bufs[p]
                buf.append(cast("Fields", fields))  # neither skipped nor rejected: an entry
                if len(buf) >= batch_size:
                    w.submit(p, sent[p], False, buf, rejects)
                    sent[p] += 1
                    bufs[p], rejects = [], []
        for p in range(topic.partitions):
            w.submit(p, sent[p], True, bufs[p], rejects)
            rejects = []
    finally:
        w.close()  # also when preparing failed: no sender thread outlives the task
    for p in range(topic.partitions):
        w.apply_staged(p)
    yield w.counts


def finish_load(url: str, topic: TopicConfig, load_id: str, splits: int,
                timeout: float = 3600.0) -> dict[str, int]:
    """Step 4: apply what is still staged of ``load_id`` in every partition; counts.

    Raises:
        RuntimeError: a partition did not reach the end of the load's ``splits`` splits
            (a split's batches are missing: the load did not complete; run it again).
    """
    w = _SplitWriter(url, topic, load_id, splits, -1, timeout)
    for p in range(topic.partitions):
        at = w.apply_staged(p)
        if at != (splits, 0):
            raise RuntimeError(f"load {load_id} of topic {topic.name}: partition {p} stopped "
                               f"at split {at[0]} batch {at[1]} of {splits} splits; run the "
                               "same load again to complete it")
    return w.counts


def load(spark: SparkSession, url: str, topic: TopicConfig, inputs: list[str], fmt: str | None = None,
         order_by: list[str] | None = None, load_id: str | None = None,
         batch_size: int = 5000, apply: bool = True,
         separator: bytes | None = None, cmd: str = "publish",
         durable: bool = False) -> LoadResult:
    """Load ``inputs`` into ``topic`` (see the module docstring).

    Args:
        fmt: ``json``, ``fix`` or ``parquet`` (default: from the file extensions).
        order_by: columns (Parquet) or top-level JSON fields giving the publish order
            (default: input order).
        load_id: the id of this load for exactly-once appends (default: from the inputs'
            names, sizes and times: loading the same files again appends nothing).
        apply: apply each partition in its task (False: leave the entries to the workers).
        separator: FIX field separator of the input (default: the topic's).
        cmd: what each row is: ``publish`` (replaces the record), ``delta_publish`` (merged
            into it) or ``sow_delete`` (removes the record a publish of the row would
            update); the same as ``sow-redis publish`` / ``delta-publish`` / ``sow-delete
            --data`` of each row in order.
        durable: each batch waits until a replica has it (Redis Cluster or a server with
            replicas; see the module docstring).

    Raises:
        ValueError: the format cannot be told; Spark's AnalysisException for unreadable input.
    """
    rows = input_rows(spark, inputs, fmt, order_by)
    lid = load_id or default_load_id(topic.name, inputs, cmd)
    return load_rows(url, topic, rows, lid, batch_size, apply, separator, spark, cmd, durable)


def load_rows(url: str, topic: TopicConfig, rows: RDD[InputRow], load_id: str, batch_size: int = 5000,
              apply: bool = True, separator: bytes | None = None,
              spark: SparkSession | None = None, cmd: str = "publish", durable: bool = False) -> LoadResult:
    """Steps 2–4 for an RDD of ``(line, order)`` rows (a file load, or one micro-batch of
    ``sow-redis spark stream``), appended exactly once under ``load_id``. On a chaining
    topic the rows' chains are resolved first (:func:`sow_redis.spark.chains.
    resolve_prepared`, written to the chain table; ``spark``: the session, default the
    active one), so the apply path finds every identifier's head in the table.

    Plain publishes (``cmd`` ``publish``) of a topic without chaining take
    ``lua/include/apply_load.lua`` (steps 3 and 4), which applies prepared publishes only. Delta
    publishes and deletes, like chaining topics, go to one task per topic partition (a
    shuffle) that appends them with ``lua/load_batch.lua`` (exactly once per batch) and
    then drains the partition with the workers' own apply code (:meth:`Sow.handoff` inline:
    ``jobs.drain_partition`` under the partition's lease), so they merge and delete exactly
    as the workers do.

    On a Redis Cluster (and with ``durable``) every load takes the second path, one task per
    primary (:func:`slot_owners`), each writing its primary's partitions only."""
    topic_json = topic.to_json()
    cluster = is_cluster_url(url)
    if not topic.chaining and apply and cmd == "publish" and not cluster and not durable:
        splits = rows.getNumPartitions()

        def task(split: int, it: Iterable[InputRow]) -> Iterator[dict[str, int]]:
            return write_split(url, topic_json, load_id, batch_size, splits, split,
                               prepare_rows(topic_json, it, separator))

        counts = rows.mapPartitionsWithIndex(task).collect()
        counts.append(finish_load(url, topic, load_id, splits))
        return _result(counts, None)
    prepared = rows.mapPartitions(lambda it: prepare_rows(topic_json, it, separator, cmd))
    chains = None
    if topic.chaining:
        # start-up time: pyspark (the optional [spark] extra) loads once Spark runs
        from pyspark.sql import SparkSession

        prepared = prepared.cache()
        session = spark or SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
        chains = resolve_prepared(session, url, topic, prepared)
    try:
        # one job: prepare (map side), one shuffle to the topic's partitions, write + apply;
        # skipped FIX messages travel to partition 0's task only to be counted there
        if cluster:  # one task per primary: the partitions whose slot it owns
            owner = slot_owners(url, topic.name, topic.partitions)
            keyed = prepared.partitionBy(max(owner.values()) + 1,
                                         lambda p: owner[max(p, 0)])

            def task_o(_i: int, it: Iterable[Prepared]) -> Iterator[dict[str, int]]:
                return write_owned(url, topic_json, load_id, batch_size, apply, it, durable,
                                   cmd)

            counts = keyed.mapPartitionsWithIndex(task_o).collect()
        else:
            keyed = prepared.partitionBy(topic.partitions, lambda p: max(p, 0))

            def task_p(index: int, it: Iterable[Prepared]) -> Iterator[dict[str, int]]:
                return write_partition(url, topic_json, load_id, batch_size, apply, index,
                                       (row for _p, row in it), durable)

            counts = keyed.mapPartitionsWithIndex(task_p).collect()
    finally:
        if topic.chaining:
            prepared.unpersist()
    return _result(counts, chains)


def write_owned(url: str, topic_json: bytes, load_id: str, batch_size: int, apply: bool,
                rows: Iterable[Prepared],
                durable: bool = False, cmd: str = "publish") -> Iterator[dict[str, int]]:
    """Executor side on a Redis Cluster: the rows of the topic partitions one primary owns
    (``(partition, row)``; skipped FIX messages as partition -1), each partition written in
    turn: plain publishes of a topic without chaining by :func:`apply_partition`
    (``lua/apply.lua``, operation ``load``: appended and applied in one call), the rest by
    :func:`write_partition`. Yields one count dict."""
    topic = TopicConfig.from_json(topic_json)
    by_p: dict[int, list[PreparedRow]] = {}
    for p, row in rows:
        by_p.setdefault(p, []).append(row)
    out = {"rows": 0, "skipped": 0, "appended": 0, "rejected": 0, "applied": 0}
    skipped = by_p.pop(-1, [])
    out["rows"] += len(skipped)
    out["skipped"] += len(skipped)
    direct = cmd == "publish" and apply and not topic.chaining
    for p in sorted(by_p):
        got = (apply_partition(url, topic, load_id, batch_size, p, by_p[p], durable) if direct
               else next(write_partition(url, topic_json, load_id, batch_size, apply, p,
                                         by_p[p], durable)))
        for k in out:
            out[k] += got.get(k, 0)
    yield out


def apply_partition(url: str, topic: TopicConfig, load_id: str, batch_size: int, p: int,
                    rows: list[PreparedRow], durable: bool = False
                    ) -> dict[str, int]:
    """Plain publishes of topic partition ``p`` (all of the load's rows there, one split) in
    order, batch by batch, to ``lua/apply.lua`` (operation ``load``): each batch appended and applied in one
    atomic call, exactly once (the load's position in the partition's loads hash). After a
    lost connection (the primary killed) the task waits for the slot's new owner and goes on
    from the position that owner has, so batches written but not replicated before the
    failover are applied again, in order, and no batch twice. ``durable``: each batch returns
    once a replica has it. A count dict."""
    w = _SplitWriter(url, topic, load_id, 1, 0, 3600.0)
    rows.sort(key=lambda row: row[0])
    w.counts["rows"] = len(rows)
    batches = max(1, -(-len(rows) // batch_size))
    before: dict[int, dict[str, int]] = {}
    b = 0
    while b < batches:
        chunk = rows[b * batch_size:(b + 1) * batch_size]
        before[b] = dict(w.counts)
        try:
            w.send(p, b, b == batches - 1,
                   [fields for _o, fields, _rej in chunk if fields is not None],
                   [rej for _o, _f, rej in chunk if rej is not None])
            if durable:
                wait_replicated(w.sow.r, keys_log(topic.name, p))
            b += 1
        except Exception as exc:
            if not _connection_lost(exc):
                raise
            deadline = time.monotonic() + FAILOVER_WAIT_S
            _reconnect(w.sow.r, deadline)
            pos = _with_failover(w.sow.r, lambda: w.sow.r.hget(keys.loads(topic.name, p),
                                                               load_id))
            text = pos.decode() if isinstance(pos, bytes) else str(pos or "0:0")
            split, batch = (int(x) for x in text.split(":"))
            b = batches if split >= 1 else batch  # the first batch the new owner lacks
            if b in before:  # it was sent before: its counts (and the later ones') go
                w.counts = before[b]
    _with_failover(w.sow.r, lambda: w.apply_staged(p))
    return w.counts


def _result(counts: list[dict[str, int]], chains: ChainResult | None) -> LoadResult:
    return LoadResult(rows=sum(c.get("rows", 0) for c in counts),
                      appended=sum(c["appended"] for c in counts),
                      rejected=sum(c["rejected"] for c in counts),
                      skipped=sum(c.get("skipped", 0) for c in counts),
                      applied=sum(c["applied"] for c in counts), chains=chains)


__all__ = ["LoadResult", "apply_partition", "check_inputs", "default_load_id", "finish_load",
           "input_rows", "keys_log", "load", "load_rows", "local_path", "prepare_rows",
           "slot_owners", "wait_replicated", "write_owned", "write_partition", "write_split"]
