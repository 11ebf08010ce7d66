"""Snapshots of SOW topics in Spark: ``sow-redis spark export`` (Parquet) and ``sow-redis spark
sql`` (SQL over temporary views, one per topic).

A snapshot reads each partition in one Spark task, its records and its change sequence in one
MULTI/EXEC, so each partition's rows are exactly its records as of that sequence. The rows have
the record's fields as columns (schema inferred by Spark from the JSON records) plus
``_sow_key``, ``_sow_expiry_ms`` (ms since the epoch, Redis server clock; 0 = none),
``_sow_partition``, ``_sow_seq`` (the partition's change sequence the snapshot is
consistent with), ``_sow_cursor`` (the partition's applied cursor: the last log entry the
snapshot holds), and what ``sow-redis spark rebuild`` needs to restore each record exactly:
``_sow_record_seq`` (the change sequence of the record's last change), ``_sow_stream_id`` (the
log entry that last changed it) and ``_sow_data`` (the stored message text).

An export also writes ``OUT/_sow_partitions`` (JSON rows ``partition, seq, cursor, records``,
for every partition, empty ones too; Spark skips ``_`` paths when reading OUT as Parquet).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ..config import TopicConfig

META = ("_sow_key", "_sow_expiry_ms", "_sow_partition", "_sow_seq", "_sow_cursor",
        "_sow_record_seq", "_sow_stream_id", "_sow_data")

PARTITIONS_DIR = "_sow_partitions"
"""Sub-folder of an export (and of an archive) with one JSON row per topic partition."""


def read_state(url: str, topic: str, p: int) -> tuple[int, str, dict[bytes, bytes]]:
    """Executor side: ``(seq, cursor, raw records)`` of partition ``p`` in one MULTI/EXEC."""
    from .. import keys
    from ..connection import connect

    r = connect(url)
    pipe = r.pipeline(transaction=True)
    pipe.hmget(keys.state(topic, p), ["seq", "cursor"])
    pipe.hgetall(keys.records(topic, p))
    (seq, cursor), raw = pipe.execute()
    return int(seq or 0), (cursor or b"0-0").decode(), raw


def read_partition(url: str, topic: str, p: int, exact: bool = True) -> Iterator[str]:
    """Executor side: partition ``p``'s records as JSON rows with the meta columns (without
    ``_sow_data``, ``_sow_record_seq`` and ``_sow_stream_id`` when not ``exact``); an empty
    partition yields one row ``{"_sow_partition": p, "_sow_seq": …, "_sow_cursor": …}`` with
    ``_sow_key`` null (dropped by :func:`snapshot`)."""
    import orjson

    from ..records import decode

    seq_n, cursor, raw = read_state(url, topic, p)
    yield orjson.dumps({"_sow_partition": p, "_sow_seq": seq_n, "_sow_cursor": cursor,
                        "_sow_records": len(raw)}).decode()
    for k, v in raw.items():
        rec = decode(k, v)
        meta: dict[str, object] = {"_sow_key": rec.sow_key, "_sow_expiry_ms": rec.expiry_ms,
                                   "_sow_partition": p, "_sow_seq": seq_n,
                                   "_sow_cursor": cursor}
        if exact:
            meta.update(_sow_record_seq=rec.seq, _sow_stream_id=rec.stream_id,
                        _sow_data=rec.data.decode())
        head = orjson.dumps(meta)
        body = rec.data.strip()
        yield (head[:-1] + (b"," + body[1:] if body != b"{}" else b"}")).decode()


def _rows(spark: Any, url: str, topic: TopicConfig, exact: bool) -> Any:
    name, parts = topic.name, topic.partitions
    rows = spark.sparkContext.parallelize(range(parts), parts).flatMap(
        lambda p: read_partition(url, name, p, exact))
    return spark.read.json(rows)


def snapshot(spark: Any, url: str, topic: TopicConfig, exact: bool = False) -> Any:
    """A DataFrame of the topic's records (see the module docstring; the exact-restore
    columns only with ``exact``)."""
    df = _rows(spark, url, topic, exact)
    if "_sow_key" not in df.columns:  # an empty topic
        return df.limit(0)
    return df.filter("_sow_key IS NOT NULL").drop("_sow_records")


def export(spark: Any, url: str, topic: TopicConfig, out: str) -> int:
    """Write the topic's snapshot to Parquet at ``out`` (replaced) and the partitions' state
    to ``out/_sow_partitions``; returns the rows written."""
    from pyspark.sql import functions as F

    df = _rows(spark, url, topic, True).cache()
    try:
        parts = df.filter("_sow_records IS NOT NULL").select(
            F.col("_sow_partition").alias("partition"), F.col("_sow_seq").alias("seq"),
            F.col("_sow_cursor").alias("cursor"), F.col("_sow_records").alias("records"))
        if "_sow_key" in df.columns:
            recs = df.filter("_sow_key IS NOT NULL").drop("_sow_records")
        else:
            recs = df.limit(0)
        n = recs.count()
        recs.write.mode("overwrite").parquet(out)
        parts.coalesce(1).write.mode("overwrite").json(f"{out.rstrip('/')}/{PARTITIONS_DIR}")
    finally:
        df.unpersist()
    return n


def view_name(topic: str) -> str:
    """The SQL view of a topic: its name with every character outside [A-Za-z0-9_] as ``_``
    (``/ADMIN/bookmark_store`` → ``_ADMIN_bookmark_store``)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", topic)


def sql(spark: Any, url: str, topics: list[TopicConfig], query: str) -> Any:
    """Run ``query`` over snapshot views of ``topics`` (each named by :func:`view_name`)."""
    for t in topics:
        snapshot(spark, url, t).createOrReplaceTempView(view_name(t.name))
    return spark.sql(query)
