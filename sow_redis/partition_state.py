"""Readers of a topic's partition state: records, log length, applied cursor and the entries
not yet applied, read for every partition in two pipelined round trips. One definition, used
by ``status``, the config registry's shape-change check and ``--migrate``; and the readers of
one field of a partition's state hash (written by ``apply.lua`` / ``expire.lua``): the applied
``cursor`` (stream id) and the change ``seq`` (the ``seq`` of its last change event)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from . import keys
from .connection import Client
from .streamids import ZERO

PENDING_COUNT_MAX = 100_000
"""Unapplied log entries counted per partition at most."""


@dataclass(frozen=True)
class PartitionState:
    """One partition: ``records`` stored, ``log`` entries in its stream (applied ones until
    trimmed), ``cursor`` (last applied stream id, ``0-0`` before any), ``pending`` entries
    after the cursor (at most :data:`PENDING_COUNT_MAX`), ``chain_ids`` in its chain table."""

    partition: int
    records: int
    log: int
    cursor: str
    pending: int
    chain_ids: int


def read_partitions(r: Client, topic: str, partitions: int) -> list[PartitionState]:
    """The state of partitions ``0 … partitions-1`` of ``topic``."""
    pipe = r.pipeline(transaction=False)
    for p in range(partitions):
        pipe.hlen(keys.records(topic, p))
        pipe.xlen(keys.log(topic, p))
        pipe.hget(keys.state(topic, p), "cursor")
        pipe.hlen(keys.chain(topic, p))
    res = pipe.execute()
    cursors = [(res[4 * p + 2] or ZERO.encode()) for p in range(partitions)]
    pipe = r.pipeline(transaction=False)
    for p in range(partitions):
        pipe.xrange(keys.log(topic, p), min=b"(" + cursors[p], count=PENDING_COUNT_MAX)
    pending = [len(x) for x in pipe.execute()]
    return [PartitionState(p, res[4 * p], res[4 * p + 1], cursors[p].decode(), pending[p],
                           res[4 * p + 3]) for p in range(partitions)]


def read_cursor(r: Client, topic: str, p: int) -> str:
    """Partition ``p``'s applied cursor: the stream id of the last log entry applied,
    ``0-0`` before anything was applied."""
    c = cast("bytes | None", r.hget(keys.state(topic, p), "cursor"))
    return c.decode() if c else ZERO


def read_cursors(r: Client, topic: str, partitions: Iterable[int]) -> dict[int, str]:
    """partition → applied cursor (as :func:`read_cursor`), in one pipelined round trip."""
    parts = list(partitions)
    pipe = r.pipeline(transaction=False)
    for p in parts:
        pipe.hget(keys.state(topic, p), "cursor")
    return {p: c.decode() if c else ZERO for p, c in zip(parts, pipe.execute())}


def count_pending(r: Client, topic: str, p: int, cap: int) -> int:
    """Log entries of partition ``p`` after its applied cursor, counted up to ``cap`` (two
    round trips; reads at most ``cap`` entries)."""
    cursor = read_cursor(r, topic, p)
    return len(cast("list[object]", r.xrange(keys.log(topic, p), min="(" + cursor, count=cap)))


def read_seq(r: Client, topic: str, p: int) -> int:
    """Partition ``p``'s change sequence number: the ``seq`` of its latest change event
    (publish, delete or expiry), ``0`` before any."""
    s = r.hget(keys.state(topic, p), "seq")
    return int(s) if s else 0
