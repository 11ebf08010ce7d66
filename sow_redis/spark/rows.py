"""Rows of a bulk load: the inputs checked before Spark starts, read into ordered rows
(step 1 of :mod:`sow_redis.spark.load`) and prepared into log entries (step 2), shared by
the load and the chain resolution (:mod:`sow_redis.spark.chains`) that precedes it on a
chaining topic.

A prepared row is ``(partition, (order, fields, reject))``: ``fields`` the log entry the
publisher would append (None when refused or skipped), ``reject`` ``(reason, detail, data)``
or None; a skipped FIX session message comes as ``(-1, (order, None, None))``.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TypeAlias

from ..connection import Fields
from ..errors import MessageError
from ..model.topic import TopicConfig
from ..publish.append import prepare

if TYPE_CHECKING:  # pyspark is the optional [spark] extra
    from pyspark import RDD
    from pyspark.sql import SparkSession

RejectedRow: TypeAlias = "tuple[str, str, bytes]"
"""A row the publisher's checks refuse: ``(reason, detail, the row's bytes)``, for the
topic's error stream."""

PreparedRow: TypeAlias = "tuple[int, Fields | None, RejectedRow | None]"
"""``(order, log entry fields or None, rejection or None)``: both None for a skipped FIX
session message."""

Prepared: TypeAlias = "tuple[int, PreparedRow]"
"""``(topic partition, prepared row)``; partition -1 for a skipped FIX session message."""

InputRow: TypeAlias = "tuple[bytes | str, int]"
"""``(line, order)``: one message's text and its place in publish order."""

SPLIT_BYTES = 12 << 20
"""Bytes of text input per split at most (Spark's ``minPartitions`` from the inputs' size, so
the same inputs always give the same splits: a rerun of a load lines up with its first run):
small splits let the apply of one overlap the preparation of the next from the first
seconds of a load."""


TEXT_FORMATS = {"json", "jsonl", "ndjson", "fix", "txt", "log"}


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


def local_path(path: str) -> str | None:
    """The local file system path of an input or folder (``file:`` URIs too); None for a URI
    of another file system (``hdfs://``, ``s3a://``, …), which only Spark can look at."""
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", path)
    if scheme is None or len(scheme.group(1)) == 1:  # a path, or a drive letter
        return path
    if scheme.group(1).lower() == "file":
        return re.sub(r"^file:(//[^/]*)?", "", path) or "/"
    return None


def check_inputs(inputs: list[str], fmt: str | None = None) -> None:
    """What can be known before Spark starts: each local input (file, folder or glob) names
    something readable, and the format can be told.

    Raises:
        ValueError: one line naming the first input that does not exist (or a glob that
            matches nothing, or a file that cannot be read), or the format that cannot be
            told.
    """
    for given in inputs:
        path = local_path(given)
        if path is None or "{" in path:  # another file system; a Hadoop {a,b} glob
            continue
        if glob.has_magic(path):
            if not glob.glob(path):
                raise ValueError(f"no input matches {given!r}")
        elif not os.path.exists(path):
            raise ValueError(f"input not found: {given!r}")
        elif not os.access(path, os.R_OK):
            raise ValueError(f"input not readable: {given!r}")
    input_format(inputs, fmt)



def prepare_rows(topic_json: bytes, rows: Iterable[InputRow],
                 separator: bytes | None = None, cmd: str = "publish"
                 ) -> Iterator[Prepared]:
    """Executor side of step 2: ``(line, order)`` → ``(partition, (order, fields, reject))``
    with ``fields`` the log entry of command ``cmd`` (``publish``, ``delta_publish`` or
    ``sow_delete``: delete the record a publish of the line would update; None when refused
    or skipped) and ``reject`` ``(reason, detail, data)`` or None; skipped FIX messages come
    as ``(-1, (order, None, None))``."""
    topic = TopicConfig.from_json(topic_json)
    skip = frozenset(topic.skip_msg_types)
    for line, order in rows:
        data = line.encode() if isinstance(line, str) else bytes(line)
        if not data.strip():
            continue
        try:
            got = prepare(topic, (cmd, data, None), separator, skip)
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



def _min_splits(inputs: list[str]) -> int:
    """``minPartitions`` of a text load: one split per ``SPLIT_BYTES`` of the inputs (files,
    folders, globs) as they are now."""
    size = 0
    for pattern in inputs:
        for path in glob.glob(pattern) or [pattern]:
            if os.path.isdir(path):
                size += sum(os.path.getsize(os.path.join(d, f))
                            for d, _s, files in os.walk(path) for f in files)
            elif os.path.isfile(path):
                size += os.path.getsize(path)
    return max(2, -(-size // SPLIT_BYTES))


def input_rows(spark: SparkSession, inputs: list[str], fmt: str | None = None,
               order_by: list[str] | None = None) -> RDD[InputRow]:
    """Step 1: an RDD of ``(line, order)`` rows of ``inputs`` (JSON text lines; a Parquet
    row as its JSON object), ``order`` increasing in publish order (input order, or
    ``order_by`` then input order).

    Raises:
        ValueError: the format cannot be told; Spark's AnalysisException for unreadable input.
    """
    # start-up time: pyspark loads once a Spark session runs (check_inputs runs before)
    from pyspark.sql import functions as F

    kind = input_format(inputs, fmt)
    if kind == "parquet":
        df = spark.read.parquet(*inputs)
        order_cols = [F.col(c) for c in (order_by or [])]
        df = df.select(F.to_json(F.struct(*df.columns)).alias("value"), *order_cols)
    elif not order_by:
        # the RDD text reader: lines as bytes, in file order (inputs sorted, then each
        # folder's / glob's listing), no Row objects between the JVM and Python
        lines = spark.sparkContext.textFile(",".join(sorted(inputs)),
                                            minPartitions=_min_splits(inputs),
                                            use_unicode=False)
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
