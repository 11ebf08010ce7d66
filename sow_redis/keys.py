"""Every Redis key and channel name sow_redis uses, built here and nowhere else.

All keys of one partition share the hash tag ``{sow:<topic>:<p>}`` so one Lua call can
touch them on a Redis Cluster (ARCHITECTURE §2). Lua scripts never build key names.
"""

from __future__ import annotations

REGISTRY = "sow:registry"
"""HASH topic name → topic definition (JSON), written by ``config apply``."""

REGISTRY_VERSION = "sow:registry:version"
"""Counter bumped on every registry change."""

REGISTRY_CHANNEL = "sow:registry:changed"
"""Pub/sub channel announcing a registry change (payload: the new version)."""

LAST_USED = "sow:last_used"
"""HASH topic name → last publish / query / config time (ms, Redis server clock), for
``idle_expiration``."""


def _tag(topic: str, p: int) -> str:
    return "{sow:%s:%d}" % (topic, p)


def log(topic: str, p: int) -> str:
    """STREAM: the partition's transaction log (publish / delta_publish / sow_delete)."""
    return _tag(topic, p) + ":log"


def records(topic: str, p: int) -> str:
    """HASH SOW key → ``<seq>:<expiry ms>:<stream id>\\n<message bytes>``."""
    return _tag(topic, p) + ":rec"


def expiry(topic: str, p: int) -> str:
    """ZSET SOW key → expiry time (ms since epoch, Redis server clock)."""
    return _tag(topic, p) + ":exp"


def state(topic: str, p: int) -> str:
    """HASH with ``cursor`` (last applied stream id), ``seq`` (change sequence), ``fence``."""
    return _tag(topic, p) + ":state"


def lease(topic: str, p: int) -> str:
    """STRING owner id of the partition, with a PX lifetime."""
    return _tag(topic, p) + ":lease"


def job_marker(topic: str, p: int) -> str:
    """STRING set while an ingest job for the partition is queued or running."""
    return _tag(topic, p) + ":job"


def acks(topic: str, p: int) -> str:
    """HASH stream id of a sow_delete → number of records it removed in this partition."""
    return _tag(topic, p) + ":acks"


def index_members(topic: str, p: int) -> str:
    """HASH SOW key → its current hash-index members, comma-separated, one per index."""
    return _tag(topic, p) + ":ixm"


def dead_letters(topic: str, p: int) -> str:
    """STREAM outbox of expired records waiting to be published to the dead_letter topic."""
    return _tag(topic, p) + ":dead"


def chain(topic: str, p: int) -> str:
    """HASH chain identifier (canonical value of a primary or secondary field) → the chain's
    head identifier, for topics with the chaining key generator (seeds/003). The SOW key of a
    chained message is generated from its head."""
    return _tag(topic, p) + ":chain"


def chain_conflicts(topic: str) -> str:
    """HASH ``<partition>:<stream id>`` → JSON report of a message that resolved to two or
    more chains, kept when the topic's chaining ``validation`` is on."""
    return "{sow:%s}:chain_conflicts" % topic


def index(topic: str, p: int, n: int) -> str:
    """ZSET (all scores 0) of ``<value hash>:<SOW key>`` members for hash index ``n``."""
    return _tag(topic, p) + ":idx:%d" % n


def changes(topic: str, p: int) -> str:
    """STREAM: the partition's change feed: one entry per atomic call that changed records,
    id ``<first seq>-0``, field ``block`` = the change block as published (events.py)."""
    return _tag(topic, p) + ":changes"


def change_times(topic: str, p: int) -> str:
    """ZSET first seq of a change block → its server time in ms (retention by age, and
    bookmarks given as a time)."""
    return _tag(topic, p) + ":changes:t"


def loads(topic: str, p: int) -> str:
    """HASH ``<load id>:<batch number>`` → last stream id: the bulk-load batches appended to
    partition ``p``'s log (``lua/load_batch.lua``: each exactly once)."""
    return _tag(topic, p) + ":loads"


def errors(topic: str) -> str:
    """STREAM: topic-level rejections outside a partition's apply (dead letters the expirer
    could not forward), with reason and original bytes."""
    return "{sow:%s}:errors" % topic


def partition_errors(topic: str, p: int) -> str:
    """STREAM: log entries of partition ``p`` the workers could not apply, with reason and
    original bytes; written by apply.lua in the same atomic call that moves the cursor past
    them, so each rejected entry is written exactly once."""
    return _tag(topic, p) + ":errors"


def error_streams(topic: str, partitions: int) -> list[str]:
    """Every error stream of a topic: the topic-level one, then one per partition."""
    return [errors(topic)] + [partition_errors(topic, p) for p in range(partitions)]


def topic_stats(topic: str) -> str:
    """HASH: topic-level counters of ``sow-redis stats`` (``n_query``: SOW queries run)."""
    return "{sow:%s}:stats" % topic


def channel(topic: str) -> str:
    """Plain pub/sub channel of topic-level notices (``topic_removed``); the change blocks
    go on the partitions' sharded channels (:func:`partition_channel`)."""
    return "sow:%s" % topic


def partition_channel(topic: str, p: int) -> str:
    """Sharded pub/sub channel (SPUBLISH / SSUBSCRIBE) of partition ``p``'s change blocks: in
    the partition's hash slot, so on a Redis Cluster only the node that holds the partition
    carries them."""
    return _tag(topic, p) + ":live"


def partition_keys(topic: str, p: int, n_indexes: int) -> list[str]:
    """The KEYS of ``apply.lua`` and ``expire.lua`` for one partition, in the scripts' order
    (lua/include/remove_record.lua ``partition_context``)."""
    return [
        records(topic, p),
        state(topic, p),
        expiry(topic, p),
        acks(topic, p),
        index_members(topic, p),
        dead_letters(topic, p),
        chain(topic, p),
        partition_errors(topic, p),
        log(topic, p),
        changes(topic, p),
        change_times(topic, p),
    ] + [index(topic, p, n) for n in range(n_indexes)]


def all_partition_keys(topic: str, partitions: int, n_indexes: int) -> list[str]:
    """Every key a topic owns (for removal of a topic)."""
    out = [errors(topic), chain_conflicts(topic), topic_stats(topic)]
    for p in range(partitions):
        out += partition_keys(topic, p, n_indexes)
        out += [lease(topic, p), job_marker(topic, p), loads(topic, p)]
    return out
