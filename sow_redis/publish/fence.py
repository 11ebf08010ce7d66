"""The definition fence a publisher honours (issue 23.4): what Redis refused for a definition
that is no longer (or not yet) the stored one, and waiting out a migration before going on.

Where the client may run scripts, apply.lua (``lua/include/apply_appended.lua``) compares each
partition's :func:`~sow_redis.keys.definition` with the publisher's
:attr:`~sow_redis.config.TopicConfig.fingerprint`; elsewhere the publisher fences its own
appends with ``WATCH`` of that key (:func:`raw_fence`). Either way a refused chunk appended
nothing: its items are held (:class:`Fenced`), the publisher waits (:func:`await_definition`),
reads the definition again and validates them under it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .. import keys
from ..connection import Client
from ..errors import SowError
from ..model.topic import TopicConfig
from ..registry import await_migration, get_topic
from .validate import Positioned

DEFINITION_WAIT_S = 600.0
"""Seconds a publish waits at most, in all, for a topic's definition to settle when Redis
refused its messages for a definition that is no longer (or not yet) the stored one: a shape
migration running (``config apply --migrate``), or a ``config apply`` between its writes."""


@dataclass
class Fenced:
    """What the definition fence refused in one pass of a publish: the items (position,
    item) and, per partition, why (``migrating``, ``absent``, ``dropped``, ``changed``)."""

    held: list[Positioned] = field(default_factory=list)
    why: dict[int, str] = field(default_factory=dict)

    def refuse(self, p: int, why: str, items: list[Positioned]) -> None:
        """Partition ``p`` refused ``items`` (nothing of them appended) for reason ``why``."""
        self.why[p] = why
        self.held += items


def reason(stored: bytes) -> str:
    """The fence's reason for a stored definition value that is not this publisher's
    fingerprint: ``migrating`` or ``dropped`` as stored, ``changed`` for any other."""
    why = stored.decode("utf-8", "replace")
    return why if why in (keys.DEFINITION_MIGRATING, keys.DEFINITION_DROPPED) else "changed"


def raw_fence(r: Client) -> bool:
    """True while client ``r``'s plain appends (no right to run scripts) can be fenced with
    ``WATCH``; False once its user was refused ``WATCH`` (:func:`raw_fence_off`)."""
    return not getattr(r, "_sow_raw_fence_off", False)


def raw_fence_off(r: Client) -> None:
    """Client ``r``'s user was refused ``WATCH`` (an ACL file older than the definition
    fence): its plain appends go unfenced from now on."""
    r._sow_raw_fence_off = True  # type: ignore[attr-defined]


def wait_deadline() -> float:
    """The ``time.monotonic()`` at which a publish refused now stops waiting for the topic's
    definition (:data:`DEFINITION_WAIT_S` seconds from now)."""
    return time.monotonic() + DEFINITION_WAIT_S


def await_definition(r: Client, topic: TopicConfig, why: dict[int, str],
                     deadline: float) -> TopicConfig:
    """After the definition fence refused ``topic``'s entries for the partitions of ``why``
    (see :func:`~sow_redis.publish.append.append`): wait until no shape migration holds them
    (:func:`~sow_redis.registry.await_migration`), then read the topic's definition again and
    return it. When it is unchanged and a partition had none stored (a topic stored before
    definitions were, or a key lost), store it there (``SET NX``).

    Args:
        why: partition → the script's reason (``migrating``, ``absent``, ``dropped``,
            ``changed``).
        deadline: ``time.monotonic()`` after which to give up (:func:`wait_deadline`).

    Raises:
        SowError: still refused at ``deadline`` (e.g. a migration that failed to end, or a
            stored value that is no definition of the topic: ``config apply`` stores it
            again); UnknownTopicError: the topic is no longer defined.
    """
    parts = sorted(why)
    pause = 0.02
    while True:
        if await_migration(r, topic.name, parts, max(0.0, deadline - time.monotonic())):
            fresh = _settled(r, topic, parts)
            if fresh is not None:
                return fresh
        if time.monotonic() >= deadline:
            raise SowError(
                f"topic '{topic.name}': partition(s) {parts} refused this publisher's "
                f"definition for {DEFINITION_WAIT_S:g} s "
                f"({', '.join(sorted(set(why.values())))}); if no migration runs, "
                "'sow-redis config apply' with the topic's definition stores it again")
        # unchanged in the registry, another value stored: a config apply between its two
        # writes (look again after a pause), or a value no config apply wrote (the deadline)
        time.sleep(pause)
        pause = min(0.5, pause * 2)


def _settled(r: Client, topic: TopicConfig, parts: list[int]) -> TopicConfig | None:
    """The topic's stored definition when a publish can go on with it: a new one, or the
    same one with a partition of ``parts`` that had none stored (stored there now); None
    while the registry holds ``topic`` and a partition another value."""
    fresh = get_topic(r, topic.name)
    if fresh.fingerprint != topic.fingerprint:
        return fresh
    pipe = r.pipeline(transaction=False)
    for p in parts:
        pipe.get(keys.definition(topic.name, p))
    stored = pipe.execute()
    absent = [p for p, d in zip(parts, stored) if d is None and p < fresh.partitions]
    if not absent:
        return None
    pipe = r.pipeline(transaction=False)
    for p in absent:
        pipe.set(keys.definition(topic.name, p), fresh.fingerprint, nx=True)
    pipe.execute()
    return fresh
