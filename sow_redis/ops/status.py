"""Per-topic status and statistics: records, log length and lag per partition, expiry, and the
per-topic SOW statistics of ``sow-redis stats`` (AMPS's per-topic SOW statistics: inserts,
updates, deletes, expiries and queries, from counters the Lua scripts keep in the same atomic
calls that make the changes)."""

from __future__ import annotations

from redis.exceptions import ResponseError

from .. import keys
from ..connection import Client, server_ms
from ..feed.live import topic_subscribers
from ..model.expiry import MAX_EXPIRY_MS
from ..model.topic import TopicConfig
from ..model.values import JSONObject
from ..partition_state import read_partitions


def topic_status(r: Client, topic: TopicConfig) -> JSONObject:
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


COUNTERS = {"inserts": "n_insert", "updates": "n_update", "deletes": "n_delete",
            "expiries": "n_expire"}
"""Figure → field of a partition's state hash (kept by the Lua scripts)."""


def topic_stats(r: Client, topic: TopicConfig) -> JSONObject:
    """The figures of one topic, read now (rates need two readings: :func:`with_rates`).

    Returns:
        ``topic``, ``partitions``, ``records``, ``log_entries``, ``lag`` (log entries not yet
        applied, counted up to 100,000 per partition), ``lag_age_ms`` (age of the oldest of
        them, ms; 0 when none), ``errors``, ``with_expiry``, ``next_due_ms`` (earliest expiry,
        ms since the epoch on the Redis server clock, up to year 9999; None when none), ``chain_ids``
        (identifiers in chain tables), ``subscribers`` (of the topic's sharded channels),
        ``change_feed_blocks`` (blocks the change feed holds), ``counters`` (``inserts``,
        ``updates``, ``deletes``, ``expiries``, ``queries`` since the topic was created) and
        ``time_ms`` (server clock of the reading).
    """
    states = read_partitions(r, topic.name, topic.partitions)
    pipe = r.pipeline(transaction=False)
    for st in states:
        pipe.hmget(keys.state(topic.name, st.partition), list(COUNTERS.values()))
        pipe.xrange(keys.log(topic.name, st.partition), min="(" + st.cursor, count=1)
        pipe.zcard(keys.expiry(topic.name, st.partition))
        pipe.zrangebyscore(keys.expiry(topic.name, st.partition), "-inf", MAX_EXPIRY_MS,
                           start=0, num=1, withscores=True)
        pipe.xlen(keys.changes(topic.name, st.partition))
    pipe.hget(keys.topic_stats(topic.name), "n_query")
    res = pipe.execute()
    subscribers = topic_subscribers(r, [topic.name])[topic.name]
    now = server_ms(r)
    counters = dict.fromkeys(COUNTERS, 0)
    oldest: list[int] = []
    with_expiry = blocks = 0
    dues: list[int] = []
    for i in range(len(states)):
        vals, first, n_exp, head, n_blocks = res[5 * i: 5 * i + 5]
        for name, v in zip(COUNTERS, vals):
            counters[name] += int(v or 0)
        if first:
            oldest.append(int(first[0][0].split(b"-")[0]))
        with_expiry += n_exp
        if head:
            dues.append(int(head[0][1]))
        blocks += n_blocks
    counters["queries"] = int(res[-1] or 0)
    return {
        "topic": topic.name,
        "partitions": topic.partitions,
        "records": sum(s.records for s in states),
        "log_entries": sum(s.log for s in states),
        "lag": sum(s.pending for s in states),
        "lag_age_ms": max(0, now - min(oldest)) if oldest else 0,
        "errors": error_count(r, topic),
        "with_expiry": with_expiry,
        "next_due_ms": min(dues) if dues else None,
        "chain_ids": sum(s.chain_ids for s in states),
        "subscribers": subscribers,
        "change_feed_blocks": blocks,
        "counters": counters,
        "time_ms": now,
    }


def with_rates(before: JSONObject, after: JSONObject) -> JSONObject:
    """``after`` with ``per_second``: each counter's rate between the two readings."""
    dt_s = max(1e-3, (after["time_ms"] - before["time_ms"]) / 1000)
    out = dict(after)
    out["per_second"] = {k: round((after["counters"][k] - before["counters"][k]) / dt_s, 1)
                         for k in after["counters"]}
    return out


def log_appended(r: Client, topic: TopicConfig) -> int:
    """Log entries ever appended to the topic's partitions: the sum of each log stream's
    ``entries-added`` (``XINFO STREAM``, Redis ≥ 7.0; trimming does not lower it). A partition
    whose log does not exist yet counts 0. Its rate is the topic's rate in (entries/s); with
    :func:`topic_stats`' ``lag``, ``log_appended - lag`` counts the entries the workers have
    passed (applied or rejected), exact while no partition is behind by more than
    :data:`~sow_redis.partition_state.PENDING_COUNT_MAX`."""
    pipe = r.pipeline(transaction=False)
    for p in range(topic.partitions):
        pipe.xinfo_stream(keys.log(topic.name, p))
    total = 0
    for info in pipe.execute(raise_on_error=False):
        if isinstance(info, ResponseError):  # no such key: nothing appended to it yet
            continue
        total += int(info.get("entries-added") or 0)
    return total


def partition_table(r: Client, topic: TopicConfig) -> list[JSONObject]:
    """Per partition, for the dashboard's SOW page: ``partition``, ``records``, ``log``
    (entries in its log stream), ``cursor`` (stream id of the last entry applied, ``0-0``
    before any), ``pending`` (entries after the cursor, counted up to
    :data:`~sow_redis.partition_state.PENDING_COUNT_MAX`), ``owner`` (the lease holder's id
    ``<host>:<pid>:<random>``, None while no job holds the partition) and ``lease_left_ms``
    (milliseconds until that lease lapses; None without an owner)."""
    states = read_partitions(r, topic.name, topic.partitions)
    pipe = r.pipeline(transaction=False)
    for st in states:
        pipe.get(keys.lease(topic.name, st.partition))
        pipe.pttl(keys.lease(topic.name, st.partition))
    res = pipe.execute()
    out = []
    for i, st in enumerate(states):
        owner, ttl = res[2 * i], int(res[2 * i + 1])
        out.append({
            "partition": st.partition, "records": st.records, "log": st.log,
            "cursor": st.cursor, "pending": st.pending,
            "owner": None if owner is None else owner.decode(errors="replace"),
            "lease_left_ms": None if owner is None or ttl < 0 else ttl,
        })
    return out
