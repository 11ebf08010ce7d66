"""SOW expiration, the rules in one place (AMPS User Guide, SOW expiration, seeds/004 and
seeds/000; RabbitMQ's per-message TTL with its ``min`` policy, seeds/001). The Lua side is
``sow_redis/apply/lua/include/expiry.lua``.

* A message's expiration is seconds from its log time (:func:`check_expiration`: 0 to 100
  years); its record's expiry is absolute ms on the Redis server clock (:func:`expiry_for`,
  from the topic's ``expiration`` and ``expiration_policy``); 0 = never.
* A record is due once the clock reaches its expiry (:func:`is_due`): readers leave it out, a
  write at or after that time first removes it (as an expiry), and the expirer removes it.
* Expiries read back are ints from 0 to :data:`MAX_EXPIRY_MS` (:func:`expiry_of`).
"""

from __future__ import annotations

from ..errors import MessageError
from ..streamids import ms_of
from .topic import MAX_DURATION_MS, TopicConfig

MAX_EXPIRY_MS = 253_402_300_799_999
"""The latest expiry a reader reports, in ms since the epoch: 9999-12-31T23:59:59.999Z (the last
instant a ``datetime`` holds). A message's expiration is at most 100 years
(:data:`MAX_EXPIRATION_S`), so only a record written before that bound (or
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


MAX_EXPIRATION_S = MAX_DURATION_MS // 1000
"""Longest message expiration in seconds: 100 years (3,155,760,000 s), the bound of a topic's
``expiration`` (:data:`sow_redis.config.MAX_DURATION_MS`)."""


def check_expiration(value: object) -> float | None:
    """A message expiration in seconds (None when absent), from 0 to :data:`MAX_EXPIRATION_S`
    (100 years).

    Raises:
        MessageError: ``bad_expiration`` (not a finite number from 0 to 100 years in seconds;
            a boolean is not a number).
    """
    if value is None or value in (b"", ""):
        return None
    if isinstance(value, bool):
        raise MessageError("bad_expiration", f"expiration must be seconds >= 0, got the boolean "
                           f"{str(value).lower()}")
    try:
        # float() of what is no number raises TypeError, turned into bad_expiration here
        secs = float(value.decode() if isinstance(value, bytes) else value)  # type: ignore[arg-type]
    except (TypeError, ValueError, UnicodeDecodeError):
        raise MessageError("bad_expiration", f"expiration must be seconds >= 0, got {value!r}") from None
    if not secs >= 0 or secs == float("inf"):
        raise MessageError("bad_expiration", f"expiration must be seconds >= 0, got {value!r}")
    if secs > MAX_EXPIRATION_S:
        raise MessageError("bad_expiration", f"expiration can be at most 100 years "
                           f"({MAX_EXPIRATION_S} s), got {value!r}")
    return secs


def expiry_for(topic: TopicConfig, message_ttl_s: float | None, stream_id: str) -> str:
    """The apply.lua expiry field of an upsert: absolute ms on the Redis server clock (the
    log entry's id time + lifetime), ``""`` for no expiry, ``"now"`` for TTL 0 under policy min.

    Policy ``override`` (AMPS, seeds/004): the message expiration wins over the topic default;
    ``0`` means never expire. Policy ``min`` (RabbitMQ, seeds/001): the lower of topic and
    message TTL wins; a TTL of 0 is delivered to current subscribers, then removed.
    """
    default = topic.default_ttl_ms
    msg = None if message_ttl_s is None else round(message_ttl_s * 1000)
    if topic.expiration_policy == "min":
        ttls = [x for x in (default, msg) if x is not None]
        if not ttls:
            return ""
        ttl = min(ttls)
        if ttl == 0 and topic.expiration_enabled:
            return "now"
    elif msg is not None:
        if msg == 0:
            return ""
        ttl = msg
    elif default is not None:
        ttl = default
    else:
        return ""
    return str(ms_of(stream_id) + ttl)


def is_due(expiry_ms: int, at_ms: int) -> bool:
    """Whether a record with expiry ``expiry_ms`` (ms since the epoch; 0 = never) is due at
    ``at_ms`` (ms since the epoch, the Redis server clock)."""
    return 0 < expiry_ms <= at_ms
