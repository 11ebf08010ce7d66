"""Every Redis key and channel name sow_redis uses, built here and nowhere else.

All keys of one partition share the hash tag ``{sow:<topic>:<p>:<salt>}`` (:func:`partition_tag`)
so one Lua call can touch them on a Redis Cluster (ARCHITECTURE §2). Lua scripts never build
key names.

The salt (4 characters of ``0-9a-v``) places a topic's partitions evenly over the 16,384 hash
slots, so a cluster's primaries, which own contiguous slot ranges, get even shares of the
partitions: partition ``p`` goes to slot ``(CRC16(topic) + floor(p × 16384 × 0.618…)) mod
16384`` (a golden-ratio sequence: evenly spread for any partition count, and the same slot
for a partition whatever the count). Without it a partition's slot is a hash of its name: 48
partitions fell 16–26 on the busiest of 3 primaries, which bounds a cluster's throughput;
with it, 16–18 (docs/benchmarks.md, scale-out). The salt is found, not stored: CRC16 (XMODEM,
Redis's key hash) is linear, so ``CRC16(prefix + salt) = CRC16(prefix + 4 zero bytes) XOR
CRC16(salt)``, and the first 4-character salt whose CRC16 has the wanted low 14 bits gives
the slot (found from the salts' two halves, by the same linearity). Any client can compute it
the same way (or ask ``sow-redis keys``).
"""

from __future__ import annotations

import binascii
import functools
import itertools

REGISTRY = "sow:registry"
"""HASH topic name → topic definition (JSON), written by ``config apply``."""

REGISTRY_VERSION = "sow:registry:version"
"""Counter bumped on every registry change."""

REGISTRY_CHANNEL = "sow:registry:changed"
"""Pub/sub channel announcing a registry change (payload: the new version)."""

LAST_USED = "sow:last_used"
"""HASH topic name → last publish / query / config time (ms, Redis server clock), for
``idle_expiration``."""


SWEEP_LEASE = "sow:sweep"
"""STRING: the owner id of the worker process that sweeps all partitions now (one sweeper at
a time, ``SET NX PX``; see :mod:`sow_redis.apply.jobs`)."""


SLOTS = 16384
"""Hash slots of a Redis Cluster."""

_SALT_ALPHABET = b"0123456789abcdefghijklmnopqrstuv"
_SALT_LEN = 4
_GOLDEN = 0.6180339887498949


@functools.lru_cache(maxsize=1)
def _salt_halves() -> tuple[list[tuple[int, str]], dict[int, str]]:
    """The salts' two halves: each first half in alphabet order with the low 14 bits of the
    CRC16 of it followed by zero bytes, and per such value of a second half (zero bytes then
    it) the first second half with it. CRC16 is linear, so a salt's is the XOR of its
    halves'."""
    half = _SALT_LEN // 2
    pairs = [bytes(combo) for combo in itertools.product(_SALT_ALPHABET, repeat=half)]
    zeros = b"\0" * half
    heads = [(binascii.crc_hqx(p + zeros, 0) & (SLOTS - 1), p.decode()) for p in pairs]
    tails: dict[int, str] = {}
    for p in pairs:
        tails.setdefault(binascii.crc_hqx(zeros + p, 0) & (SLOTS - 1), p.decode())
    return heads, tails


@functools.lru_cache(maxsize=SLOTS)
def _salt(low: int) -> str:
    """The first salt (in alphabet order) whose CRC16 has the low 14 bits ``low``: the first
    half in order for which some second half completes it, with the first such second half
    (every value has one; ``tests/test_config_keys.py`` compares all 16,384 with a search of every
    salt in order). About 16 lookups, where a table of all took 40 ms to build, once per
    process: every command line and worker pays it."""
    heads, tails = _salt_halves()
    for head, first in heads:
        second = tails.get(low ^ head)
        if second is not None:
            return first + second
    raise AssertionError(f"no salt has the CRC16 low bits {low}")  # pragma: no cover


def partition_slot(topic: str, p: int) -> int:
    """The hash slot of partition ``p`` of ``topic`` (see the module's docstring)."""
    return (binascii.crc_hqx(topic.encode(), 0) + int(p * SLOTS * _GOLDEN)) % SLOTS


@functools.lru_cache(maxsize=65536)
def partition_tag(topic: str, p: int) -> str:
    """The hash tag of every key of partition ``p`` of ``topic``: ``{sow:<topic>:<p>:<salt>}``,
    in slot :func:`partition_slot`."""
    prefix = "sow:%s:%d:" % (topic, p)
    zeros = binascii.crc_hqx(prefix.encode() + b"\0" * _SALT_LEN, 0)
    return "{" + prefix + _salt((zeros ^ partition_slot(topic, p)) & (SLOTS - 1)) + "}"


def log(topic: str, p: int) -> str:
    """STREAM: the partition's transaction log (publish / delta_publish / sow_delete)."""
    return partition_tag(topic, p) + ":log"


def records(topic: str, p: int) -> str:
    """HASH SOW key → ``<seq>:<expiry ms>:<stream id>\\n<message bytes>``."""
    return partition_tag(topic, p) + ":rec"


def snapshot(topic: str, p: int, token: str) -> str:
    """HASH: a copy of :func:`records` taken with the partition's seq in one MULTI/EXEC (``COPY``)
    by a batched ``sow_and_subscribe``, which scans it and deletes it; ``token`` makes it that
    subscription's. It has a lifetime, renewed at each page read, so an abandoned copy goes."""
    return partition_tag(topic, p) + ":snap:" + token


def expiry(topic: str, p: int) -> str:
    """ZSET SOW key → expiry time (ms since epoch, Redis server clock)."""
    return partition_tag(topic, p) + ":exp"


def state(topic: str, p: int) -> str:
    """HASH with ``cursor`` (last applied stream id; on a transient topic also the mark of a
    SOW that exists: ``lua/rebuild.lua``), ``seq`` (change sequence), ``fence``, the change
    counters ``n_insert`` … and, after a transient topic's rebuild, ``rebuild_to`` (the log
    entry up to which it replays without change events) and ``rebuilt_ms`` (server ms)."""
    return partition_tag(topic, p) + ":state"


def lease(topic: str, p: int) -> str:
    """STRING owner id of the partition, with a PX lifetime."""
    return partition_tag(topic, p) + ":lease"


def derive_lease(topic: str) -> str:
    """STRING owner id of the deriver serving derived topic ``topic`` (a view or a conflated
    topic; :mod:`sow_redis.derive`), with a PX lifetime."""
    return "{sow:derive:%s}:lease" % topic


def derive_state(topic: str) -> str:
    """HASH of the lease of :func:`derive_lease` (field ``fence``: the fencing token
    counter); in the same slot."""
    return "{sow:derive:%s}:fence" % topic


def job_marker(topic: str, p: int) -> str:
    """STRING set while an ingest job for the partition is queued or running."""
    return partition_tag(topic, p) + ":job"


def trusted(topic: str, p: int) -> str:
    """ZSET (score 0, by member) of the ranges of log entries a caller with the right to run
    scripts appended and left unapplied (``lua/include/apply_appended.lua``): member
    ``<last id>:<first id>``, each id padded to ``<15 digits>-<10 digits>`` so members sort
    as the ids do. ``apply.lua`` (operation ``log``) applies the prepared publishes inside these ranges
    without the worker reading them; any other entry is verified by the worker first. A
    range the applied cursor passed is dropped by the apply that moved it (operations ``log``
    and ``planned``)."""
    return partition_tag(topic, p) + ":trusted"


def definition(topic: str, p: int) -> str:
    """STRING: the fingerprint of the topic definition the partition takes entries under
    (:func:`sow_redis.config.fingerprint`), written by ``config apply``; ``migrating`` while
    a shape migration holds the topic, ``dropped`` for a partition a migration removed.
    ``apply.lua`` (operation ``appended``) appends nothing for a publisher whose definition differs: the
    publisher reads the definition again, re-keys the refused messages and sends them again
    (see :func:`sow_redis.publish.append.append`)."""
    return partition_tag(topic, p) + ":def"


DEFINITION_MIGRATING = "migrating"
""":func:`definition` while a shape migration holds the partition."""

DEFINITION_DROPPED = "dropped"
""":func:`definition` of a partition beyond the count a migration reduced the topic to."""


def acks(topic: str, p: int) -> str:
    """HASH stream id of a sow_delete → number of records it removed in this partition."""
    return partition_tag(topic, p) + ":acks"


def index_members(topic: str, p: int) -> str:
    """HASH SOW key → its current hash-index members, comma-separated, one per index."""
    return partition_tag(topic, p) + ":ixm"


def dead_letters(topic: str, p: int) -> str:
    """STREAM outbox of expired records waiting to be published to the dead_letter topic."""
    return partition_tag(topic, p) + ":dead"


def chain(topic: str, p: int) -> str:
    """HASH chain identifier (canonical value of a primary or secondary field) → the chain's
    head identifier, for topics with the chaining key generator (seeds/003). The SOW key of a
    chained message is generated from its head."""
    return partition_tag(topic, p) + ":chain"


def chain_conflicts(topic: str) -> str:
    """HASH ``<partition>:<stream id>`` → JSON report of a message that resolved to two or
    more chains, kept when the topic's chaining ``validation`` is on."""
    return "{sow:%s}:chain_conflicts" % topic


def index(topic: str, p: int, n: int) -> str:
    """ZSET (all scores 0) of index ``n`` of partition ``p``: the hash indexes first
    (``hash_index``, members ``<value hash>:<SOW key>``), then the range (memo) indexes
    (``index``; index ``len(hash_index) + i`` is range index ``i``: here the values that are
    not numbers, members ``<tag><ordered hex>/<SOW key>``, the numbers in
    :func:`range_numbers`; :mod:`sow_redis.model.rangeindex`), read with ZRANGEBYLEX. In the
    partition's hash slot."""
    return partition_tag(topic, p) + ":idx:%d" % n


def range_numbers(topic: str, p: int, n: int) -> str:
    """ZSET of range index ``n`` (numbered as :func:`index`) of partition ``p``: the records
    whose field holds a number or numeric text, member the SOW key, score the value as a
    double (:mod:`sow_redis.model.rangeindex`), read with ZRANGEBYSCORE; the other values
    are in :func:`index`. In the partition's hash slot."""
    return partition_tag(topic, p) + ":idx:%d:num" % n


def changes(topic: str, p: int) -> str:
    """STREAM: the partition's change feed: one entry per atomic call that changed records,
    id ``<first seq>-0``, field ``block`` = the change block as published (events.py)."""
    return partition_tag(topic, p) + ":changes"


def change_times(topic: str, p: int) -> str:
    """ZSET first seq of a change block → its server time in ms (retention by age, and
    bookmarks given as a time)."""
    return partition_tag(topic, p) + ":changes:t"


def loads(topic: str, p: int) -> str:
    """HASH of partition ``p``'s bulk loads, for exactly once:

    * ``<load id>:<batch number>`` → last stream id: a batch appended to the log
      (``lua/load_batch.lua``, chaining topics);
    * ``<load id>`` → ``<split>:<batch>``, the next batch to apply, and ``<load id>:<split>``
      → the split's number of batches while it is staged (``lua/include/apply_load.lua``)."""
    return partition_tag(topic, p) + ":loads"


def load_staged(topic: str, p: int) -> str:
    """HASH ``<load id>:<split>:<batch>`` → a bulk-load batch (MessagePack) of partition ``p``
    prepared before the batches ahead of it were applied; removed as it is applied
    (``lua/include/apply_load.lua``)."""
    return partition_tag(topic, p) + ":loads:staged"


def errors(topic: str) -> str:
    """STREAM: topic-level rejections outside a partition's apply (dead letters the expirer
    could not forward), with reason and original bytes."""
    return "{sow:%s}:errors" % topic


def partition_errors(topic: str, p: int) -> str:
    """STREAM: log entries of partition ``p`` the workers could not apply, with reason and
    original bytes; written by apply.lua in the same atomic call that moves the cursor past
    them, so each rejected entry is written exactly once."""
    return partition_tag(topic, p) + ":errors"


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
    return partition_tag(topic, p) + ":live"


def partition_keys(topic: str, p: int, n_indexes: int, n_range: int = 0) -> list[str]:
    """The KEYS of every Lua script that works on one partition (``apply.lua``, the one apply
    entry point, ``expire.lua``, ``delete_now.lua``), in the one order the scripts read them
    (``lua/include/partition.lua``; :class:`sow_redis.apply.scripts.Partition`): records, state,
    expiry, acks, index members, dead-letter outbox, chain, errors, log, change feed, change
    feed times, lease, job marker, trusted ranges, definition, loads, staged load batches,
    then the ``n_indexes`` indexes (hash, then range), then the numbers' sorted sets of the
    last ``n_range`` of them, the range indexes (:func:`range_numbers`; last: the only parts
    whose length varies)."""
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
        lease(topic, p),
        job_marker(topic, p),
        trusted(topic, p),
        definition(topic, p),
        loads(topic, p),
        load_staged(topic, p),
    ] + [index(topic, p, n) for n in range(n_indexes)] + [
        range_numbers(topic, p, n) for n in range(n_indexes - n_range, n_indexes)]


def all_partition_keys(topic: str, partitions: int, n_indexes: int,
                       n_range: int = 0) -> list[str]:
    """Every key a topic owns (for removal of a topic)."""
    out = [errors(topic), chain_conflicts(topic), topic_stats(topic)]
    for p in range(partitions):
        out += partition_keys(topic, p, n_indexes, n_range)
    return out
