"""The typed operations a worker sends to ``apply.lua`` (one definition; packed next to the
script by :meth:`sow_redis.apply.scripts.Scripts.apply`, which mirrors the script's ARGV header).

Times are absolute milliseconds since the epoch on the Redis server clock; stream ids are
``"<ms>-<n>"`` text.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Upsert:
    """``publish`` (replace) or ``delta_publish`` (``delta=True``; ``data`` is the merged
    record, merged by the worker) of one record.

    Attributes:
        expiry_ms: absolute expiry in ms, None = never expires.
        expire_now: TTL 0 under expiration policy ``min`` (RabbitMQ, seeds/001): delivered to
            the subscribers of that moment, then removed with reason ``expired``.
        expect_seq: compare-and-set: the record's ``seq`` when the worker read it (0 = absent);
            None = unchecked. A mismatch refuses the whole batch (``SOW_CONFLICT``).
        members: the record's index members, one per ``hash_index`` then ``index`` in order,
            comma-separated ("" in a slot: the record has no value for that index).
    """

    id: str
    sow_key: str
    data: bytes
    delta: bool = False
    expiry_ms: int | None = None
    expire_now: bool = False
    expect_seq: int | None = None
    members: str = ""


@dataclass(slots=True)
class Delete:
    """``sow_delete`` of one record by the log entry ``id`` (counted in the entry's acks)."""

    id: str
    sow_key: str
    expect_seq: int | None = None


@dataclass(slots=True)
class Ack:
    """Marks the ``sow_delete`` log entry ``id`` as done (its removed count starts at 0)."""

    id: str


@dataclass(slots=True)
class ChainLink:
    """Chaining key generator (seeds/003): ``ident`` joins the chain headed by ``head``."""

    id: str
    ident: str
    head: str


@dataclass(slots=True)
class Reject:
    """A log entry that cannot be applied: written to the partition's error stream by the same
    apply call that moves the cursor past it. ``cmd``, ``data`` and ``sow_key`` are the entry's
    original bytes (``data`` is the filter or key list of a ``sow_delete`` without data)."""

    id: str
    reason: str
    detail: str
    cmd: bytes = b""
    data: bytes = b""
    sow_key: bytes = b""


Op = Upsert | Delete | Ack | ChainLink
"""Anything apply.lua applies, in log order."""
