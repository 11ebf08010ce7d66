"""Drop a transient topic's SOW so the workers rebuild it from its log (``sow-redis rebuild``,
:meth:`sow_redis.client.Sow.rebuild`; AMPS SOW ``Durability`` transient and
``RecoveryPoint``, seeds/004; docs/failures.md, "Persistent and transient topics").

Dropping a partition's SOW removes its applied cursor (the mark of a SOW that exists, see
``apply/lua/rebuild.lua``) under the partition's lease, so no worker applies it meanwhile;
the fencing token stays, so a worker that held the lease before is refused. The next worker
that takes the partition removes what is left of its records and re-applies the log from
the topic's ``recovery_point``.
"""

from __future__ import annotations

import time
from typing import cast

from . import keys
from .apply.jobs import OWNER
from .apply.scripts import Scripts
from .connection import Client
from .errors import SowError
from .model.topic import TopicConfig
from .settings import Settings
from .streamids import ZERO

LEASE_POLL_S = 0.05
"""Seconds between two tries at a partition another process leases."""


def drop_sow(r: Client, topic: TopicConfig, settings: Settings, timeout_s: float
             ) -> dict[int, str]:
    """Drop the SOW of every partition of transient ``topic``, each under its lease (waiting
    up to ``timeout_s`` seconds in all for the partitions a worker holds).

    Returns:
        partition → the stream id of its log's last entry when it was dropped (``0-0``: an
        empty log): the rebuild replays the log up to it without change events.

    Raises:
        SowError: the topic is persistent; or partitions stayed leased by another process
            for ``timeout_s`` seconds (the message names them and those already dropped,
            which the workers rebuild).
    """
    if not topic.transient:
        raise SowError(f"topic '{topic.name}' is persistent: its SOW cannot be rebuilt from its "
                       "log (persistence = \"transient\" keeps the log for that)")
    scripts = Scripts(r)
    deadline = time.monotonic() + timeout_s
    waiting = list(range(topic.partitions))
    horizons: dict[int, str] = {}
    while True:
        for p in list(waiting):
            lease = keys.lease(topic.name, p)
            if scripts.lease_acquire(lease, keys.state(topic.name, p), OWNER,
                                     settings.lease_ms) is None:
                continue
            try:
                last = cast("list[tuple[bytes, object]]",
                            r.xrevrange(keys.log(topic.name, p), count=1))
                r.hdel(keys.state(topic.name, p), "cursor")
            finally:
                scripts.lease_release(lease, OWNER)
            horizons[p] = last[0][0].decode() if last else ZERO
            waiting.remove(p)
        if not waiting:
            return horizons
        if time.monotonic() >= deadline:
            raise SowError(f"topic '{topic.name}': partition(s) {waiting} stayed leased by "
                           f"another process for {timeout_s:g} s and were not dropped; "
                           f"dropped {sorted(horizons) or 'none'} (the workers rebuild them)")
        time.sleep(LEASE_POLL_S)
