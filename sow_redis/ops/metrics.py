"""Prometheus metrics of a SOW: ``sow-redis metrics --port P`` (prometheus-client).

Two sources, neither on the data path:

* at each scrape, the figures of ``sow-redis stats`` for every topic
  (:func:`sow_redis.ops.status.topic_stats`): gauges ``sow_records``, ``sow_lag_entries``,
  ``sow_lag_age_seconds``, ``sow_errors``, ``sow_records_with_expiry``,
  ``sow_next_due_timestamp_seconds``, ``sow_chain_ids``, ``sow_subscribers``,
  ``sow_change_feed_blocks``, and the counters ``sow_inserts_total``, ``sow_updates_total``,
  ``sow_deletes_total``, ``sow_expiries_total``, ``sow_queries_total`` (kept by the Lua scripts
  in the same atomic calls as the changes);
* the topics' change blocks, read from their change feeds (polled every
  :data:`FEED_POLL_S` seconds; see :mod:`sow_redis.model.events`), from which the histograms come
  (a topic with ``change_retention = 0`` has no feed, so no histograms; the endpoint does not
  subscribe, so it is neither counted as a subscriber nor keeps a topic with
  ``idle_expiration`` in use):

  - ``sow_publish_to_applied_seconds``: per change, the block's server time minus the time of
    the log entry that caused it (publish → visible in the SOW);
  - ``sow_apply_batch_seconds``: per block (one apply call), its server time minus the time of
    its oldest log entry (how long a batch's first entry waited until the batch was applied);
  - ``sow_expiry_lag_seconds``: per expired record, the time of its delete event minus its due
    time: the lateness of expiration, which Redis itself cannot report.

All times are the Redis server clock (stream ids and ``TIME``). Every metric has a ``topic``
label.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .. import keys
from ..connection import Client
from ..model.events import ChangeBlock, parse_block
from ..registry import load_topics
from .status import topic_stats

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds (histogram buckets of the latencies)."""

GAUGES = {
    "records": ("sow_records", "Records in the SOW."),
    "lag": ("sow_lag_entries", "Log entries not applied yet (counted up to 100,000 per "
                               "partition)."),
    "errors": ("sow_errors", "Entries in the topic's error streams."),
    "with_expiry": ("sow_records_with_expiry", "Records with an expiry."),
    "chain_ids": ("sow_chain_ids", "Identifiers in the chain tables (chaining topics)."),
    "subscribers": ("sow_subscribers", "Subscribers of the topic's change blocks."),
    "change_feed_blocks": ("sow_change_feed_blocks", "Change blocks held by the change feed."),
}

COUNTERS = {
    "inserts": ("sow_inserts", "Records inserted."),
    "updates": ("sow_updates", "Records updated (publish or delta_publish of a stored key)."),
    "deletes": ("sow_deletes", "Records removed by sow_delete."),
    "expiries": ("sow_expiries", "Records removed by expiration."),
    "queries": ("sow_queries", "SOW queries run."),
}


class StatsCollector:
    """Reads every topic's figures at scrape time (a prometheus-client custom collector)."""

    def __init__(self, r: Client) -> None:
        self.r = r

    def collect(self) -> Iterator[Metric]:
        gauges = {k: GaugeMetricFamily(name, doc, labels=["topic"])
                  for k, (name, doc) in GAUGES.items()}
        lag_age = GaugeMetricFamily("sow_lag_age_seconds",
                                    "Age of the oldest log entry not applied yet.",
                                    labels=["topic"])
        next_due = GaugeMetricFamily("sow_next_due_timestamp_seconds",
                                     "Earliest expiry of a record (Unix time, Redis clock).",
                                     labels=["topic"])
        counters = {k: CounterMetricFamily(name, doc, labels=["topic"])
                    for k, (name, doc) in COUNTERS.items()}
        try:
            topics = load_topics(self.r)
            for name in sorted(topics):
                st = topic_stats(self.r, topics[name])
                for k, g in gauges.items():
                    g.add_metric([name], st[k])
                lag_age.add_metric([name], st["lag_age_ms"] / 1000)
                if st["next_due_ms"] is not None:
                    next_due.add_metric([name], st["next_due_ms"] / 1000)
                for k, c in counters.items():
                    c.add_metric([name], st["counters"][k])
        except Exception as exc:  # a scrape reports what it has; the endpoint stays up
            log.warning("metrics: reading the topics failed: %s", exc)
        yield from gauges.values()
        yield lag_age
        yield next_due
        yield from counters.values()


class ChangeObserver:
    """Fills the latency histograms from the change blocks of every topic."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.publish_to_applied = Histogram(
            "sow_publish_to_applied_seconds",
            "Per change: time from its log entry to the apply call that made it.",
            ["topic"], buckets=LATENCY_BUCKETS, registry=registry)
        self.batch = Histogram(
            "sow_apply_batch_seconds",
            "Per apply call (change block): time from its oldest log entry to the call.",
            ["topic"], buckets=LATENCY_BUCKETS, registry=registry)
        self.expiry_lag = Histogram(
            "sow_expiry_lag_seconds",
            "Per expired record: time from its due time to its delete event.",
            ["topic"], buckets=LATENCY_BUCKETS, registry=registry)

    def observe(self, block: ChangeBlock) -> None:
        topic, at = block["topic"], block["ms"]
        oldest = None
        for ev in block["events"]:
            if ev.get("reason") == "expired":
                if ev["expiry_ms"] > 0:
                    self.expiry_lag.labels(topic).observe(max(0.0, (at - ev["expiry_ms"]) / 1000))
                continue
            logged = int(ev["id"].split("-", 1)[0])
            self.publish_to_applied.labels(topic).observe(max(0.0, (at - logged) / 1000))
            oldest = logged if oldest is None else min(oldest, logged)
        if oldest is not None:
            self.batch.labels(topic).observe(max(0.0, (at - oldest) / 1000))



FEED_POLL_S = 0.5
"""Seconds between two reads of the change feeds (the histograms use the blocks' own times,
so the poll interval does not change what they show)."""

TOPICS_EVERY_S = 5.0
"""Seconds between two reads of the topic registry (new topics are followed from then)."""

FEED_READ_COUNT = 1000
"""Blocks read per partition and poll at most."""


class FeedFollower:
    """Reads the blocks appended to every topic's change feed since it began following it."""

    def __init__(self, r: Client) -> None:
        self.r = r
        self._after: dict[str, bytes] = {}  # feed stream → id of the last block read
        self._streams: list[str] = []
        self._loaded = float("-inf")

    def poll(self) -> list[ChangeBlock]:
        """The blocks appended since the last poll (each feed's first poll only notes where
        it ends)."""
        if time.monotonic() - self._loaded >= TOPICS_EVERY_S:
            self._streams = [keys.changes(t.name, p) for t in load_topics(self.r).values()
                             if t.change_retention_count > 0 for p in range(t.partitions)]
            self._loaded = time.monotonic()
            # forget removed topics (one created again under the name starts its feed anew)
            followed = set(self._streams)
            self._after = {k: v for k, v in self._after.items() if k in followed}
        new = [s for s in self._streams if s not in self._after]
        if new:
            pipe = self.r.pipeline(transaction=False)
            for s in new:
                pipe.xrevrange(s, count=1)
            for s, last in zip(new, pipe.execute()):
                self._after[s] = last[0][0] if last else b"0-0"
        pipe = self.r.pipeline(transaction=False)
        for s in self._streams:
            pipe.xread({s: self._after[s]}, count=FEED_READ_COUNT)
        out: list[ChangeBlock] = []
        for s, reply in zip(self._streams, pipe.execute()):
            for _name, entries in reply or []:
                for sid, f in entries:
                    self._after[s] = sid
                    try:
                        out.append(parse_block(f[b"block"]))
                    except (ValueError, KeyError, TypeError):
                        continue
        return out


def serve(r: Client, port: int, bind: str = "127.0.0.1",
          stop: threading.Event | None = None) -> None:
    """Serve the metrics on ``http://bind:port/metrics`` until ``stop`` is set (or forever),
    following every topic's change feed."""

    registry = CollectorRegistry()
    registry.register(StatsCollector(r))
    observer = ChangeObserver(registry)
    server, thread = start_http_server(port, addr=bind, registry=registry)
    stop = stop or threading.Event()
    follower = FeedFollower(r)
    try:
        while not stop.is_set():
            try:
                for block in follower.poll():
                    observer.observe(block)
            except Exception as exc:  # Redis unreachable: the endpoint stays up, tries again
                log.warning("metrics: reading the change feeds failed (%s); retrying", exc)
            stop.wait(FEED_POLL_S)
    finally:
        server.shutdown()
        thread.join(timeout=5)
