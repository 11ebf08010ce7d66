"""The stored form of a SOW record.

Each partition's records hash maps a SOW key to ``<seq>:<expiry ms>:<stream id>\\n<data>``:
the partition change sequence of the last change, the expiry time in milliseconds since the
epoch on the Redis server clock (``0`` = never), the log stream id that last changed it, and
the message bytes (JSON object text).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True)
class Record:
    """One SOW record as read from Redis."""

    sow_key: str
    seq: int
    expiry_ms: int
    stream_id: str
    data: bytes

    def obj(self) -> dict[str, Any]:
        """The message decoded as a JSON object."""
        return orjson.loads(self.data)


def decode(sow_key: str | bytes, raw: bytes) -> Record:
    """Record from a stored value."""
    head, _, data = raw.partition(b"\n")
    seq, exp, sid = head.split(b":", 2)
    key = sow_key.decode() if isinstance(sow_key, bytes) else sow_key
    return Record(key, int(seq), int(exp), sid.decode(), data)


def seq_of(raw: bytes | None) -> str:
    """The ``seq`` text of a stored value, ``"0"`` for an absent record (apply.lua's CAS form)."""
    if raw is None:
        return "0"
    return raw[: raw.index(b":")].decode()
