"""``sow-redis spark stream``: Structured Streaming from a folder of JSON Lines (or FIX log)
files into a SOW topic, exactly once.

Each micro-batch goes through the bulk load's path (:func:`sow_redis.spark.load.load_rows`:
the publisher's key code, ``apply_load.lua``: the workers' apply code) under the load id
``stream:<checkpoint id>:<batch id>``, as one split: the batch id and the load's position
are recorded in Redis in the same atomic call that appends and applies the rows, so a
restarted query that replays a batch (Spark replays the batches its checkpoint did not
commit) changes nothing. Files are taken in the order Spark
discovers them (modification time); rows keep their order within a file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from ..config import TopicConfig
from .load import LoadResult, load_rows


def batch_loader(url: str, topic: TopicConfig, checkpoint: str,
                 separator: bytes | None = None,
                 on_batch: Callable[[int, LoadResult], None] | None = None
                 ) -> Callable[[Any, int], None]:
    """The ``foreachBatch`` function of a stream into ``topic`` with this ``checkpoint``."""
    stream_id = hashlib.sha256(f"{topic.name}\0{checkpoint}".encode()).hexdigest()[:12]

    def each(df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        # one split, whatever the partitioning of the batch: a replayed batch lines up with
        # its first run (lua/apply_load.lua applies a load's splits exactly once)
        ordered = df.select("value").coalesce(1).withColumn(
            "_order", F.monotonically_increasing_id())
        rows = ordered.rdd.map(lambda x: (x[0], x[1]))
        res = load_rows(url, topic, rows, f"stream:{stream_id}:{batch_id}",
                        separator=separator)
        if on_batch is not None:
            on_batch(batch_id, res)

    return each


def stream(spark: Any, url: str, topic: TopicConfig, directory: str, checkpoint: str,
           once: bool = False, trigger_s: float = 1.0, separator: bytes | None = None,
           on_batch: Callable[[int, LoadResult], None] | None = None) -> Any:
    """Start the streaming query (returns it); with ``once``, process what the folder holds
    (``availableNow``) and wait for the end."""
    reader = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(directory)
    writer = reader.writeStream.foreachBatch(
        batch_loader(url, topic, checkpoint, separator, on_batch)).option(
        "checkpointLocation", checkpoint)
    writer = writer.trigger(availableNow=True) if once else writer.trigger(
        processingTime=f"{trigger_s} seconds")
    query = writer.start()
    if once:
        query.awaitTermination()
    return query
