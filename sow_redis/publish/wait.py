"""After a publish: waiting until the workers applied it (read-your-writes, with the stream
ids a publish returns as its consistency token), and what a ``sow_delete`` removed."""

from __future__ import annotations

import time

from .. import keys
from ..connection import Client
from ..errors import WaitTimeout
from ..model.topic import TopicConfig
from ..partition_state import read_cursors
from ..streamids import reached


def wait_applied(r: Client, topic: TopicConfig, last_ids: dict[int, str], timeout_s: float = 60.0,
                 poll_s: float = 0.01) -> None:
    """Block until every partition's applied cursor reaches the given stream ids, polling
    after 1 ms, then at doubling intervals up to ``poll_s`` seconds (read-your-writes
    latency stays a few ms for a lone message, the polling cost stays bounded for a backlog).

    Args:
        last_ids: partition → stream id (:attr:`PublishResult.last_ids`).
        timeout_s: seconds to wait at most.
        poll_s: longest pause between two reads of the cursors, in seconds.

    Raises:
        WaitTimeout: after ``timeout_s`` seconds, naming the partitions still behind.
    """
    pending = dict(last_ids)
    pause = min(poll_s, 0.001)
    deadline = time.monotonic() + timeout_s
    while pending:
        for p, cur in read_cursors(r, topic.name, pending).items():
            if reached(cur, pending[p]):
                del pending[p]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise WaitTimeout(
                f"topic {topic.name}: partitions {sorted(pending)} not applied after "
                f"{timeout_s:g} s (are workers running? sow-redis worker)")
        time.sleep(pause)
        pause = min(poll_s, pause * 2)


def delete_counts(r: Client, topic: TopicConfig, ids: dict[int, str]) -> int:
    """Records removed by a sow_delete, summed over partitions (after :func:`wait_applied`;
    ``ids``: partition → stream id of the delete command)."""
    pipe = r.pipeline(transaction=False)
    for p, sid in ids.items():
        pipe.hget(keys.acks(topic.name, p), sid)
    return sum(int(v or 0) for v in pipe.execute())
