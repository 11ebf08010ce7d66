"""``sow-redis spark load``: a bulk load of JSON Lines, Parquet or FIX logs into a SOW topic.

1. Spark reads the inputs (files, folders, globs) and numbers the rows in input order (or
   orders them by ``order_by`` columns).
2. Executors validate each row and build its log entry with the publisher's own code
   (:func:`sow_redis.publisher.prepare`: the same SOW keys, canonical values and FIX parsing
   as ``sow-redis publish``); a row it refuses becomes an error-stream entry with its reason.
3. Rows go to one Spark partition per topic partition, sorted by their order, and each task
   appends its rows to the partition's transaction log in batches with ``lua/load_batch.lua``,
   which records ``<load id>:<batch number>`` in the same atomic call: a retried task (or a
   re-run of the same load) appends nothing twice.
4. Each task then applies its partition with the workers' own path (lease, fencing token,
   ``apply_log.lua`` / ``apply.lua``), so a load and running workers never corrupt each other.

The resulting SOW is the one that publishing the same messages in the same order gives.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..config import TopicConfig
from .chains import ChainResult

APPLY_BATCH = 2000
"""Log entries per apply call when a load task applies its partition (the workers' apply
path with a larger batch: a load's entries are all there already)."""

TEXT_FORMATS = {"json", "jsonl", "ndjson", "fix", "txt", "log"}


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


def input_format(inputs: list[str], fmt: str | None) -> str:
    """``text`` or ``parquet``, from ``fmt`` or the inputs' extensions."""
    if fmt:
        return "parquet" if fmt == "parquet" else "text"
    exts = {os.path.splitext(i.rstrip("/"))[1].lstrip(".").lower() for i in inputs}
    if exts == {"parquet"}:
        return "parquet"
    if exts <= TEXT_FORMATS | {""}:
        return "text"
    raise ValueError(f"cannot tell the format of {inputs!r}: give --format json|fix|parquet")


def default_load_id(topic: str, inputs: list[str]) -> str:
    """A load id that is the same for the same inputs (names, sizes, modification times)."""
    h = hashlib.sha256(topic.encode())
    for path in sorted(inputs):
        h.update(path.encode())
        try:
            st = os.stat(path)
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
        except OSError:
            pass
    return h.hexdigest()[:16]


def prepare_rows(topic_json: bytes, rows: Iterable[tuple[bytes | str, int]],
                 separator: bytes | None = None) -> Iterator[tuple[int, tuple[int, Any, Any]]]:
    """Executor side of step 2: ``(line, order)`` → ``(partition, (order, fields, reject))``
    with ``fields`` the log entry (None when refused or skipped) and ``reject`` ``(reason,
    detail, data)`` or None; skipped FIX messages come as ``(-1, (order, None, None))``."""
    from ..errors import MessageError
    from ..publisher import prepare

    topic = TopicConfig.from_json(topic_json)
    skip = frozenset(topic.skip_msg_types)
    for line, order in rows:
        data = line.encode() if isinstance(line, str) else bytes(line)
        if not data.strip():
            continue
        try:
            got = prepare(topic, ("publish", data, None), separator, skip)
        except MessageError as exc:
            yield 0, (order, None, (exc.reason, exc.detail, data))
            continue
        except Exception as exc:
            yield 0, (order, None, ("bad_message", f"{type(exc).__name__}: {exc}", data))
            continue
        if got is None:
            yield -1, (order, None, None)
            continue
        p, fields = got
        yield p, (order, fields, None)


def write_partition(url: str, topic_json: bytes, load_id: str, batch_size: int, apply: bool,
                    p: int, rows: Iterable[tuple[int, Any, Any]]) -> Iterator[dict[str, int]]:
    """Executor side of steps 3 and 4 for topic partition ``p``: append its rows in order,
    batch by batch, exactly once; then apply the partition. Yields one count dict."""
    from ..client import Sow
    from ..scripts import Scripts
    from ..settings import Settings

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
    last = ""
    for i in range(0, len(ordered), batch_size):
        chunk = ordered[i:i + batch_size]
        entries = [fields for _o, fields, _rej in chunk if fields is not None]
        rejects = [rej for _o, _f, rej in chunk if rej is not None]
        n, sid = scripts.load_batch(topic.name, p, f"{load_id}:{i // batch_size}", entries,
                                    rejects)
        if n >= 0:
            out["appended"] += n
            out["rejected"] += len(rejects)
            last = sid or last
    if apply:
        out["applied"] = sow.handoff(topic, {p: last or "0-0"}, timeout=3600)
    yield out


def input_rows(spark: Any, inputs: list[str], fmt: str | None = None,
               order_by: list[str] | None = None) -> Any:
    """Step 1: an RDD of ``(line, order)`` rows of ``inputs`` (JSON text lines; a Parquet
    row as its JSON object), ``order`` increasing in publish order (input order, or
    ``order_by`` then input order).

    Raises:
        ValueError: the format cannot be told; Spark's AnalysisException for unreadable input.
    """
    from pyspark.sql import functions as F

    kind = input_format(inputs, fmt)
    if kind == "parquet":
        df = spark.read.parquet(*inputs)
        order_cols = [F.col(c) for c in (order_by or [])]
        df = df.select(F.to_json(F.struct(*df.columns)).alias("value"), *order_cols)
    elif not order_by:
        # the RDD text reader: lines as bytes, in file order (inputs sorted, then each
        # folder's / glob's listing), no Row objects between the JVM and Python
        lines = spark.sparkContext.textFile(",".join(sorted(inputs)), use_unicode=False)
        return lines.mapPartitionsWithIndex(
            lambda i, it: ((line, (i << 33) + j) for j, line in enumerate(it)))
    else:
        df = spark.read.text(sorted(inputs) if len(inputs) > 1 else inputs)
        order_cols = [F.get_json_object("value", f"$.{c.lstrip('/')}").alias(c)
                      for c in (order_by or [])]
        df = df.select("value", *order_cols)
    df = df.withColumn("_order", F.monotonically_increasing_id())
    if order_by:
        ordered = df.orderBy(*order_by, "_order").select("value").rdd.zipWithIndex()
        return ordered.map(lambda x: (x[0][0], x[1]))
    else:
        return df.select("value", "_order").rdd.map(lambda x: (x[0], x[1]))


def load(spark: Any, url: str, topic: TopicConfig, inputs: list[str], fmt: str | None = None,
         order_by: list[str] | None = None, load_id: str | None = None,
         batch_size: int = 5000, apply: bool = True,
         separator: bytes | None = None) -> LoadResult:
    """Load ``inputs`` into ``topic`` (see the module docstring).

    Args:
        fmt: ``json``, ``fix`` or ``parquet`` (default: from the file extensions).
        order_by: columns (Parquet) or top-level JSON fields giving the publish order
            (default: input order).
        load_id: the id of this load for exactly-once appends (default: from the inputs'
            names, sizes and times: loading the same files again appends nothing).
        apply: apply each partition in its task (False: leave the entries to the workers).
        separator: FIX field separator of the input (default: the topic's).

    Raises:
        ValueError: the format cannot be told; Spark's AnalysisException for unreadable input.
    """
    rows = input_rows(spark, inputs, fmt, order_by)
    lid = load_id or default_load_id(topic.name, inputs)
    return load_rows(url, topic, rows, lid, batch_size, apply, separator, spark)


def load_rows(url: str, topic: TopicConfig, rows: Any, load_id: str, batch_size: int = 5000,
              apply: bool = True, separator: bytes | None = None,
              spark: Any = None) -> LoadResult:
    """Steps 2–4 for an RDD of ``(line, order)`` rows (a file load, or one micro-batch of
    ``sow-redis spark stream``), appended exactly once under ``load_id``. On a chaining
    topic the rows' chains are resolved first (:func:`sow_redis.spark.chains.
    resolve_prepared`, written to the chain table; ``spark``: the session, default the
    active one), so the apply path finds every identifier's head in the table."""
    topic_json = topic.to_json()
    prepared = rows.mapPartitions(lambda it: prepare_rows(topic_json, it, separator))
    chains = None
    if topic.chaining:
        from pyspark.sql import SparkSession

        from .chains import resolve_prepared

        prepared = prepared.cache()
        session = spark or SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
        chains = resolve_prepared(session, url, topic, prepared)
    try:
        # one job: prepare (map side), one shuffle to the topic's partitions, write + apply;
        # skipped FIX messages travel to partition 0's task only to be counted there
        keyed = prepared.partitionBy(topic.partitions, lambda p: max(p, 0))

        def task(index: int, it: Iterator[tuple[int, Any]]) -> Iterator[dict[str, int]]:
            return write_partition(url, topic_json, load_id, batch_size, apply, index,
                                   (row for _p, row in it))

        counts = keyed.mapPartitionsWithIndex(task).collect()
    finally:
        if topic.chaining:
            prepared.unpersist()
    return LoadResult(rows=sum(c["rows"] for c in counts),
                      appended=sum(c["appended"] for c in counts),
                      rejected=sum(c["rejected"] for c in counts),
                      skipped=sum(c["skipped"] for c in counts),
                      applied=sum(c["applied"] for c in counts), chains=chains)
