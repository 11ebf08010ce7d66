"""The stored form of a SOW record.

Each partition's records hash maps a SOW key to ``<seq>:<expiry ms>:<stream id>\\n<data>``:
the partition change sequence of the last change, the expiry time in milliseconds since the
epoch on the Redis server clock (``0`` = never), the log stream id that last changed it, and
the message bytes (JSON object text).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from .expiry import expiry_of
from .values import JSONObject


@dataclass(frozen=True)
class Record:
    """One SOW record as read from Redis."""

    sow_key: str
    seq: int
    expiry_ms: int
    stream_id: str
    data: bytes

    def obj(self) -> JSONObject:
        """The message decoded as a JSON object (as stored: a record written behind sow_redis's
        back may hold another JSON value; readers that cannot rule that out check)."""
        obj: JSONObject = orjson.loads(self.data)
        return obj


def decode(sow_key: str | bytes, raw: bytes, lenient: bool = False) -> Record:
    """Record from a stored value.

    Args:
        lenient: for readers (queries, subscribers): a key that is not UTF-8 (written behind
            sow_redis's back) keeps its bytes as lone surrogates (``surrogateescape``), so the
            record reads, and :func:`sow_redis.model.events.decode_change` tells a reader that its
            key cannot be shown. Without it such a key raises UnicodeDecodeError.

    Raises:
        ValueError: not a stored record (no ``<seq>:<expiry>:<id>`` header); (not ``lenient``)
            a key that is not UTF-8 (UnicodeDecodeError).
    """
    head, _, data = raw.partition(b"\n")
    seq, exp, sid = head.split(b":", 2)
    if isinstance(sow_key, bytes):
        key = sow_key.decode("utf-8", "surrogateescape" if lenient else "strict")
    else:
        key = sow_key
    expiry = int(exp) if len(exp) < 16 and exp.isdigit() else expiry_of(exp)
    return Record(key, int(seq), expiry, sid.decode(), data)

