"""Per-topic status: records, log length and lag per partition."""

from __future__ import annotations

from typing import Any

from . import keys
from .config import TopicConfig
from .connection import Client
from .partition_state import read_partitions


def topic_status(r: Client, topic: TopicConfig) -> dict[str, Any]:
    """``{"topic", "records", "log_entries", "pending", "partitions": [{p, records, log, pending}]}``.

    ``pending`` counts log entries after the applied cursor (not yet applied; counted up to
    100,000 per partition).
    """
    states = read_partitions(r, topic.name, topic.partitions)
    parts = [{"partition": x.partition, "records": x.records, "log": x.log,
              "pending": x.pending} for x in states]
    pending = [x.pending for x in states]
    return {
        "topic": topic.name,
        "records": sum(x["records"] for x in parts),
        "log_entries": sum(x["log"] for x in parts),
        "pending": sum(pending),
        "errors": error_count(r, topic),
        "partitions": parts,
    }


def error_count(r: Client, topic: TopicConfig) -> int:
    """Entries in the topic's error streams (topic level plus one per partition)."""
    pipe = r.pipeline(transaction=False)
    for stream in keys.error_streams(topic.name, topic.partitions):
        pipe.xlen(stream)
    return sum(pipe.execute())


def expiry_stats(r: Client, topic: TopicConfig) -> dict[str, Any]:
    """``{"topic", "records", "with_expiry", "next_due_ms", "next_due", "expiration", "policy"}``.

    ``next_due_ms`` is the earliest expiry (ms since the epoch, Redis server clock), ``next_due``
    the same in ISO 8601 UTC; both None when no record has an expiry.
    """
    import datetime as _dt

    pipe = r.pipeline(transaction=False)
    for p in range(topic.partitions):
        pipe.hlen(keys.records(topic.name, p))
        pipe.zcard(keys.expiry(topic.name, p))
        pipe.zrange(keys.expiry(topic.name, p), 0, 0, withscores=True)
    res = pipe.execute()
    firsts = [int(x[0][1]) for x in res[2::3] if x]
    nxt = min(firsts) if firsts else None
    return {
        "topic": topic.name,
        "records": sum(res[0::3]),
        "with_expiry": sum(res[1::3]),
        "next_due_ms": nxt,
        "next_due": None if nxt is None else _dt.datetime.fromtimestamp(
            nxt / 1000, _dt.UTC).isoformat(timespec="milliseconds"),
        "expiration": topic.expiration,
        "policy": topic.expiration_policy,
    }
