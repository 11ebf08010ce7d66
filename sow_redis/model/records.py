"""The stored form of a SOW record.

Each partition's records hash maps a SOW key to ``<seq>:<expiry ms>:<stream id>\\n<data>``:
the partition change sequence of the last change, the expiry time in milliseconds since the
epoch on the Redis server clock (``0`` = never), the log stream id that last changed it, and
the message bytes (JSON object text).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from .values import JSONObject

MAX_EXPIRY_MS = 253_402_300_799_999
"""The latest expiry a reader reports, in ms since the epoch: 9999-12-31T23:59:59.999Z (the last
instant a ``datetime`` holds). A message's expiration is at most 100 years
(:data:`sow_redis.model.messages.MAX_EXPIRATION_S`), so only a record written before that bound (or
behind sow_redis's back) holds a later one: it reads as this value (never due in practice),
not as a number that no JSON encoder or clock can hold."""


def expiry_of(value: object) -> int:
    """A stored or published expiry (ms since the epoch; int, float or their text) as an int
    from 0 to :data:`MAX_EXPIRY_MS`: 0 (none) for what is no number, later times clamped."""
    if type(value) is int and 0 <= value <= MAX_EXPIRY_MS:
        return value
    try:
        ms = float(value.decode() if isinstance(value, bytes) else value)  # type: ignore[arg-type]
    except (TypeError, ValueError, UnicodeDecodeError):
        return 0
    if ms != ms or ms <= 0:
        return 0
    return MAX_EXPIRY_MS if ms > MAX_EXPIRY_MS else int(ms)


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

