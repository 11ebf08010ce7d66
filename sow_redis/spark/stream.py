"""``sow-redis spark stream``: Structured Streaming from a folder of JSON Lines (or FIX log)
files into a SOW topic, exactly once.

Each micro-batch goes through the bulk load's path (:func:`sow_redis.spark.load.load_rows`:
the publisher's key code, ``apply.lua`` (operation ``load``): the workers' apply code) under the load id
``stream:<checkpoint id>:<batch id>``, as one split: the batch id and the load's position
are recorded in Redis in the same atomic call that appends and applies the rows, so a
restarted query that replays a batch (Spark replays the batches its checkpoint did not
commit) changes nothing. Files are taken in the order Spark
discovers them (modification time); rows keep their order within a file.

The checkpoint id (:func:`checkpoint_id`) is a random id written into the checkpoint folder
(``_sow_stream_id``) when the query starts on a checkpoint with no batch in it: Spark numbers
the batches of a new checkpoint from 0 again, so a deleted and recreated checkpoint (or
another query on the same path) gets a new id and its batches are never taken for the old
ones, while a restart on the same checkpoint reads the id back and replays nothing twice.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import keys
from ..connection import Client, connect
from ..model.topic import TopicConfig
from .load import LoadResult, load_rows

if TYPE_CHECKING:  # pyspark is the optional [spark] extra
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

ID_FILE = "_sow_stream_id"
"""The file in a checkpoint folder that holds the checkpoint's id (:func:`checkpoint_id`)."""


def checkpoint_id(spark: SparkSession, checkpoint: str, topic: str) -> str:
    """The id of a stream's ``checkpoint`` (any file system Spark can write to, through
    Hadoop's FileSystem API), which the load ids of its batches carry.

    A checkpoint with no batch in it (none yet, deleted, or never started: Spark's
    ``offsets`` log is empty or absent) gets a new random id, written to ``ID_FILE``
    (replacing one there); a checkpoint with batches keeps the id of that file. A
    checkpoint with batches and no such file was written before these ids existed: its id
    is then the one those versions used (a hash of the topic and the path), written to the
    file, so a restart on it stays exactly once."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a driver's context has its JVM gateway
    path = jvm.org.apache.hadoop.fs.Path
    root = path(checkpoint)
    fs = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    offsets, id_file = path(root, "offsets"), path(root, ID_FILE)
    started = fs.exists(offsets) and len(fs.listStatus(offsets)) > 0
    if started and fs.exists(id_file):
        stream = fs.open(id_file)
        try:
            got = str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")).strip()
        finally:
            stream.close()
        if got:
            return got
    if started:  # a checkpoint of an earlier version
        sid = hashlib.sha256(f"{topic}\0{checkpoint}".encode()).hexdigest()[:12]
    else:
        sid = uuid.uuid4().hex
    out = fs.create(id_file, True)
    try:
        out.write(bytearray(sid.encode() + b"\n"))
    finally:
        out.close()
    return sid


def batch_loader(url: str, topic: TopicConfig, stream_id: str,
                 separator: bytes | None = None,
                 on_batch: Callable[[int, LoadResult], None] | None = None
                 ) -> Callable[[DataFrame, int], None]:
    """The ``foreachBatch`` function of a stream into ``topic`` whose checkpoint has the id
    ``stream_id`` (:func:`checkpoint_id`)."""
    clients: list[Client] = []  # the driver's client, made at the first batch

    def each(df: DataFrame, batch_id: int) -> None:
        # start-up time: pyspark (the optional [spark] extra) loads once Spark runs
        from pyspark.sql import functions as F

        # one split, whatever the partitioning of the batch: a replayed batch lines up with
        # its first run (lua/include/apply_load.lua applies a load's splits exactly once)
        ordered = df.select("value").coalesce(1).withColumn(
            "_order", F.monotonically_increasing_id())
        rows = ordered.rdd.map(lambda x: (x[0], x[1]))
        res = load_rows(url, topic, rows, f"stream:{stream_id}:{batch_id}",
                        separator=separator)
        if not clients:
            clients.append(connect(url))
        forget_batches(clients[0], topic, stream_id, batch_id - 1)
        if on_batch is not None:
            on_batch(batch_id, res)

    return each


def forget_batches(r: Client, topic: TopicConfig, stream_id: str, before: int) -> int:
    """Remove from every partition's loads hash (:func:`sow_redis.keys.loads`) the positions
    of the batches of stream ``stream_id`` numbered below ``before``. Spark never replays a
    batch once a later one runs (a micro-batch starts after the one before it committed), so
    only the newest batches' positions keep a replay exactly once; without this a stream kept
    two fields per partition for every micro-batch it ever ran (172,800 a day at a 1 s
    trigger). The stream's current and previous batch are kept (``before`` = batch id - 1).

    Returns:
        The number of fields removed.
    """
    prefix = f"stream:{stream_id}:".encode()
    pipe = r.pipeline(transaction=False)
    for p in range(topic.partitions):
        pipe.hkeys(keys.loads(topic.name, p))
    drop: dict[int, list[bytes]] = {}
    for p, fields in enumerate(pipe.execute()):
        for field in fields:
            if not field.startswith(prefix):
                continue
            number = field[len(prefix):].split(b":", 1)[0]
            if number.isdigit() and int(number) < before:
                drop.setdefault(p, []).append(field)
    if drop:
        pipe = r.pipeline(transaction=False)
        for p, fields in drop.items():
            pipe.hdel(keys.loads(topic.name, p), *fields)
        pipe.execute()
    return sum(len(fields) for fields in drop.values())


def stream(spark: SparkSession, url: str, topic: TopicConfig, directory: str, checkpoint: str,
           once: bool = False, trigger_s: float = 1.0, separator: bytes | None = None,
           on_batch: Callable[[int, LoadResult], None] | None = None) -> StreamingQuery:
    """Start the streaming query (returns it); with ``once``, process what the folder holds
    (``availableNow``) and wait for the end."""
    reader = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(directory)
    stream_id = checkpoint_id(spark, checkpoint, topic.name)
    writer = reader.writeStream.foreachBatch(
        batch_loader(url, topic, stream_id, separator, on_batch)).option(
        "checkpointLocation", checkpoint)
    writer = writer.trigger(availableNow=True) if once else writer.trigger(
        processingTime=f"{trigger_s} seconds")
    query = writer.start()
    if once:
        query.awaitTermination()
    return query
