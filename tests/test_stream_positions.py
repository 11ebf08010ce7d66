"""A Spark stream keeps each micro-batch's load position in the partitions' loads hashes for
exactly once (lua/include/apply_load.lua); positions of batches Spark can no longer replay
are removed after each batch (sow_redis.spark.stream.forget_batches), so a stream that runs
for days does not keep two fields per partition for every micro-batch."""

from __future__ import annotations

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.connection import connect
from sow_redis.spark.stream import forget_batches


def test_a_stream_forgets_the_positions_of_batches_spark_cannot_replay(url, topic_name):
    sow = Sow(url, inline=True)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\npartitions = 3\n')
    t = sow.topic(topic_name)
    r = connect(url)
    for p in range(3):
        fields = {f"stream:abc:{b}": "0:1" for b in range(6)}
        fields |= {f"stream:abc:{b}:0": "1" for b in range(6)}  # a split's, a chain batch's
        fields |= {"stream:other:1": "0:1", "load-7f": "0:3", "stream:abc:x": "?"}
        r.hset(keys.loads(topic_name, p), mapping=fields)
    assert forget_batches(r, t, "abc", 4) == 3 * 8  # batches 0-3, two fields each
    for p in range(3):
        left = sorted(f.decode() for f in r.hkeys(keys.loads(topic_name, p)))
        assert left == ["load-7f", "stream:abc:4", "stream:abc:4:0", "stream:abc:5",
                        "stream:abc:5:0", "stream:abc:x", "stream:other:1"], left
    assert forget_batches(r, t, "abc", 4) == 0
