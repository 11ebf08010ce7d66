"""Snapshots of SOW topics in Spark: ``sow-redis spark export`` (Parquet) and ``sow-redis spark
sql`` (SQL over temporary views, one per topic).

A snapshot reads each partition in one Spark task, its records and its change sequence in one
MULTI/EXEC, so each partition's rows are exactly its records as of that sequence. The rows have
the record's fields as columns (schema inferred by Spark from the JSON records) plus
``_sow_key``, ``_sow_expiry_ms`` (ms since the epoch, Redis server clock; 0 = none),
``_sow_partition`` and ``_sow_seq`` (the partition's change sequence the snapshot is
consistent with).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ..config import TopicConfig

META = ("_sow_key", "_sow_expiry_ms", "_sow_partition", "_sow_seq")


def read_partition(url: str, topic: str, p: int) -> Iterator[str]:
    """Executor side: partition ``p``'s records as JSON rows with the meta columns."""
    import orjson

    from .. import keys
    from ..connection import connect
    from ..records import decode

    r = connect(url)
    pipe = r.pipeline(transaction=True)
    pipe.hget(keys.state(topic, p), "seq")
    pipe.hgetall(keys.records(topic, p))
    seq, raw = pipe.execute()
    seq_n = int(seq or 0)
    for k, v in raw.items():
        rec = decode(k, v)
        head = orjson.dumps({"_sow_key": rec.sow_key, "_sow_expiry_ms": rec.expiry_ms,
                             "_sow_partition": p, "_sow_seq": seq_n})
        body = rec.data.strip()
        yield (head[:-1] + (b"," + body[1:] if body != b"{}" else b"}")).decode()


def snapshot(spark: Any, url: str, topic: TopicConfig) -> Any:
    """A DataFrame of the topic's records (see the module docstring)."""
    name, parts = topic.name, topic.partitions
    rows = spark.sparkContext.parallelize(range(parts), parts).flatMap(
        lambda p: read_partition(url, name, p))
    return spark.read.json(rows)


def export(spark: Any, url: str, topic: TopicConfig, out: str) -> int:
    """Write the topic's snapshot to Parquet at ``out`` (replaced); returns the rows written."""
    df = snapshot(spark, url, topic).cache()
    try:
        n = df.count()
        df.write.mode("overwrite").parquet(out)
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
