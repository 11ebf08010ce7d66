"""Aggregated subscriptions (AMPS aggregated subscriptions; issue 26.5): an ad-hoc aggregate
over a topic, computed from a ``sow_and_subscribe`` query and kept current from its changes,
without defining a view.

The messages are those of a ``sow_and_subscribe`` (:mod:`sow_redis.feed.subscriber`), with
rows in place of records: first one ``sow`` message per group (``data``: the row, see
:mod:`sow_redis.model.aggregate`; ``sow_key``: generated from the grouping values), then
``group_end`` (``count``: the groups), then for each change of the topic that changes a row a
``publish`` message with the new row, and an ``oof`` message when a group is left empty
(``reason``: that of the removal that emptied it, ``data``: the row before). Recovery and
error messages pass through as they are.
"""

from __future__ import annotations

from collections import deque

from ..model.aggregate import Aggregation
from ..model.values import JSONObject
from .reader import Message, MessageReader
from .subscriber import Subscriber

QUERY_BATCH = 1000
"""Records the query part of an aggregated subscription reads at a time (``batch_size`` of
its ``sow_and_subscribe``): the records are folded into their groups as they come, so the
client holds the groups and one batch, not a decoded message per record (1,000,000 records
read whole took 1.3 GiB before the first row)."""


class AggregatedSubscriber(MessageReader):
    """The rows of ``aggregation`` over the records ``sub`` delivers.

    Args:
        sub: a ``sow_and_subscribe`` subscriber with out-of-focus notices (removals and
            records leaving the filter take records out of their groups), its query part
            best read in batches (:data:`QUERY_BATCH`).
        aggregation: the projection and grouping (:class:`~sow_redis.model.aggregate.Aggregation`).
    """

    def __init__(self, sub: Subscriber, aggregation: Aggregation) -> None:
        self.sub, self.aggregation, self.topic = sub, aggregation, sub.topic
        self._ready: deque[Message] = deque()

    def get(self, timeout: float = 1.0) -> Message | None:
        """The next message, or None when the subscription gave none for ``timeout`` s."""
        while not self._ready:
            msg = self.sub.get(timeout)
            if msg is None:
                return None
            self._take(msg)
        return self._ready.popleft()

    def _take(self, msg: Message) -> None:
        kind = msg["kind"]
        agg = self.aggregation
        if kind == "sow":
            agg.upsert(msg["sow_key"], msg["data"])
        elif kind == "group_end":
            rows = agg.rows()
            self._ready.extend({"kind": "sow", "topic": self.topic.name, "sow_key": key,
                                "bookmark": msg.get("bookmark"), "data": row}
                               for key, row in rows)
            self._ready.append({**msg, "count": len(rows)})
        elif kind == "publish":
            self._rows(msg, agg.upsert(msg["sow_key"], msg["data"]))
        elif kind == "oof":
            self._rows(msg, agg.remove(msg["sow_key"]))
        else:
            self._ready.append(msg)

    def _rows(self, msg: Message, changed: list[tuple[str, str, JSONObject]]) -> None:
        for kind, key, row in changed:
            out: Message = {"kind": kind, "topic": self.topic.name, "sow_key": key,
                            "bookmark": msg.get("bookmark"), "data": row}
            if kind == "oof":
                out["reason"] = msg.get("reason", "match") if msg["kind"] == "oof" else "match"
            self._ready.append(out)

    def close(self) -> None:
        """Close the underlying subscription."""
        self.sub.close()
