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
for every partition, empty ones too; Spark skips ``_`` paths when reading OUT as Parquet) and,
for a topic with the chaining key generator, ``OUT/_sow_chains``: the partitions' chain tables
(JSON rows ``partition, id, head``: chain identifier → its chain's head, seeds/003) read in the
same MULTI/EXEC as the records, and ``chains`` (the identifiers) in ``_sow_partitions``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import orjson

from .. import keys
from ..connection import connect
from ..model.records import decode
from ..model.topic import TopicConfig

if TYPE_CHECKING:  # pyspark is the optional [spark] extra
    from pyspark.sql import DataFrame, SparkSession

META = ("_sow_key", "_sow_expiry_ms", "_sow_partition", "_sow_seq", "_sow_cursor",
        "_sow_record_seq", "_sow_stream_id", "_sow_data")

PARTITIONS_DIR = "_sow_partitions"
"""Sub-folder of an export (and of an archive) with one JSON row per topic partition."""

CHAINS_DIR = "_sow_chains"
"""Sub-folder of an export of a chaining topic: its chain tables, one JSON row per identifier."""

CHAINS_SCHEMA = "partition long, id string, head string"
"""Spark schema of the :data:`CHAINS_DIR` rows (identifier → its chain's head)."""


def read_state(url: str, topic: str, p: int, chains: bool = False
               ) -> tuple[int, str, dict[bytes, bytes], dict[bytes, bytes] | None]:
    """Executor side: ``(seq, cursor, raw records, chain table or None)`` of partition ``p``
    in one MULTI/EXEC (the chain table only with ``chains``)."""
    r = connect(url)
    pipe = r.pipeline(transaction=True)
    pipe.hmget(keys.state(topic, p), ["seq", "cursor"])
    pipe.hgetall(keys.records(topic, p))
    if chains:
        pipe.hgetall(keys.chain(topic, p))
    (seq, cursor), raw, *chain = pipe.execute()
    return int(seq or 0), (cursor or b"0-0").decode(), raw, chain[0] if chains else None


def read_partition(url: str, topic: str, p: int, exact: bool = True,
                   chains: bool = False) -> Iterator[str]:
    """Executor side: partition ``p``'s records as JSON rows with the meta columns (without
    ``_sow_data``, ``_sow_record_seq`` and ``_sow_stream_id`` when not ``exact``); first one
    row ``{"_sow_partition": p, "_sow_seq": …, "_sow_cursor": …, "_sow_records": n}`` with
    ``_sow_key`` null (dropped by :func:`snapshot`), and with ``chains`` one row
    ``{"_sow_partition": p, "_sow_chain": [identifier, head]}`` per chain table entry (also
    without ``_sow_key``)."""
    seq_n, cursor, raw, chain = read_state(url, topic, p, chains)
    head_row: dict[str, object] = {"_sow_partition": p, "_sow_seq": seq_n,
                                   "_sow_cursor": cursor, "_sow_records": len(raw)}
    if chain is not None:
        head_row["_sow_chains"] = len(chain)
        for ident, head in chain.items():
            yield orjson.dumps({"_sow_partition": p,
                                "_sow_chain": [ident.decode(), head.decode()]}).decode()
    yield orjson.dumps(head_row).decode()
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


def _rows(spark: SparkSession, url: str, topic: TopicConfig, exact: bool, chains: bool = False
          ) -> DataFrame:
    name, parts = topic.name, topic.partitions
    rows = spark.sparkContext.parallelize(range(parts), parts).flatMap(
        lambda p: read_partition(url, name, p, exact, chains))
    return spark.read.json(rows)


def _records_only(df: DataFrame) -> DataFrame:
    """The record rows of :func:`_rows` (an empty DataFrame for an empty topic)."""
    if "_sow_key" not in df.columns:  # an empty topic
        return df.limit(0)
    return df.filter("_sow_key IS NOT NULL").drop(
        *(c for c in ("_sow_records", "_sow_chains", "_sow_chain") if c in df.columns))


def snapshot(spark: SparkSession, url: str, topic: TopicConfig, exact: bool = False
             ) -> DataFrame:
    """A DataFrame of the topic's records (see the module docstring; the exact-restore
    columns only with ``exact``)."""
    return _records_only(_rows(spark, url, topic, exact))


def export(spark: SparkSession, url: str, topic: TopicConfig, out: str) -> int:
    """Write the topic's snapshot to Parquet at ``out`` (replaced), the partitions' state to
    ``out/_sow_partitions`` and, for a chaining topic, its chain tables to
    ``out/_sow_chains``; returns the record rows written."""
    # start-up time: pyspark (the optional [spark] extra) loads once Spark runs
    from pyspark.sql import functions as F

    df = _rows(spark, url, topic, True, topic.chaining).cache()
    try:
        cols = [F.col("_sow_partition").alias("partition"), F.col("_sow_seq").alias("seq"),
                F.col("_sow_cursor").alias("cursor"), F.col("_sow_records").alias("records")]
        if topic.chaining:
            cols.append(F.col("_sow_chains").alias("chains"))
        parts = df.filter("_sow_records IS NOT NULL").select(*cols)
        recs = _records_only(df)
        n = recs.count()
        recs.write.mode("overwrite").parquet(out)
        base = out.rstrip("/")
        parts.coalesce(1).write.mode("overwrite").json(f"{base}/{PARTITIONS_DIR}")
        if topic.chaining:
            if "_sow_chain" in df.columns:
                chain = df.filter("_sow_chain IS NOT NULL").select(
                    F.col("_sow_partition").alias("partition"),
                    F.col("_sow_chain")[0].alias("id"), F.col("_sow_chain")[1].alias("head"))
            else:  # no identifier in any partition
                chain = spark.createDataFrame([], CHAINS_SCHEMA)
            chain.write.mode("overwrite").json(f"{base}/{CHAINS_DIR}")
    finally:
        df.unpersist()
    return n


def view_name(topic: str) -> str:
    """The SQL view of a topic: its name with every character outside [A-Za-z0-9_] as ``_``
    (``/ADMIN/bookmark_store`` → ``_ADMIN_bookmark_store``)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", topic)


def query_tables(spark: SparkSession, query: str) -> tuple[list[str], set[str]]:
    """The tables ``query`` reads, as Spark's own parser sees them (no analysis: nothing is
    looked up): ``(names, CTE names)``, each name one-part as written (other case kept) or
    dotted for a qualified name, in order of appearance, without repeats; subqueries and
    CTE bodies included.

    The names come from the parsed plan's tree text (``'UnresolvedRelation [name], …`` per
    table read, ``CTE [name, …]`` per WITH), which prints every node, subqueries too.

    Raises:
        pyspark.errors.ParseException: ``query`` is not Spark SQL.
    """
    plan = spark._jsparkSession.sessionState().sqlParser().parsePlan(query)
    tree = str(plan.treeString())
    names: dict[str, None] = {}
    for parts in re.findall(r"'UnresolvedRelation \[(.*?)\], \[", tree):
        names[".".join(p.strip() for p in parts.split(","))] = None
    # a WITH, at the top or in a subquery
    ctes = {n.strip().lower() for group in re.findall(r"(?:^|[ :+-])CTE \[(.*?)\]$", tree,
                                                      re.M) for n in group.split(",")}
    return list(names), ctes


def sql(spark: SparkSession, url: str, topics: list[TopicConfig], query: str) -> DataFrame:
    """Run ``query`` over snapshot views of the ``topics`` it names (each topic a view named
    by :func:`view_name`, matched without regard to case as Spark does): only those are
    read from Redis.

    Raises:
        pyspark.errors.ParseException: ``query`` is not Spark SQL (before any snapshot);
        ValueError: ``query`` reads a one-part table name that is no topic's view and no
            CTE of the query (before any snapshot; the message names the views);
        pyspark.errors.AnalysisException: Spark refused the query.
    """
    names, ctes = query_tables(spark, query)
    views = {view_name(t.name).lower(): t for t in topics}
    used: dict[str, TopicConfig] = {}
    for name in names:
        key = name.lower()
        if key in views:
            used[key] = views[key]
        elif "." not in name and key not in ctes:
            known = ", ".join(sorted(view_name(t.name) for t in topics)) or "none"
            raise ValueError(f"the query reads table {name!r}, which is no topic (the "
                             f"topics' views: {known})")
    for t in used.values():
        snapshot(spark, url, t).createOrReplaceTempView(view_name(t.name))
    return spark.sql(query)
