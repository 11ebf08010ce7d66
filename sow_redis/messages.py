"""Message parsing and key computation shared by publishers and workers.

A transaction-log entry (one stream entry of ``{sow:T:p}:log``) has the fields:

=============  ===========================================================================
``cmd``        ``publish`` | ``delta_publish`` | ``sow_delete``
``data``       the message (JSON object text); for ``sow_delete`` by data, the message whose
               record is removed
``sow_key``    publisher-supplied SOW key (topics without key fields)
``keys``       ``sow_delete`` by SOW keys: comma-separated keys
``filter``     ``sow_delete`` by content filter (``1=1`` removes everything)
``expiration`` message lifetime in seconds (decimal allowed); ``0`` = never expire (AMPS)
=============  ===========================================================================

In a JSON Lines file a line may be an *envelope* that carries per-message options:
``{"$sow": {"expiration": 30, "sow_key": "QUJD"}, "data": {...the message...}}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from .chaining import chain_values
from .config import TopicConfig
from .errors import MessageError
from .sowkey import generate, index_hash, is_valid_user_key, partition_of, partition_of_key
from .values import canonical, get_path

COMMANDS = ("publish", "delta_publish", "sow_delete")


@dataclass
class Parsed:
    """A message ready to apply: the decoded object, its SOW key and partition."""

    obj: dict[str, Any]
    sow_key: str
    partition: int


def check_size(data: bytes, topic: TopicConfig) -> None:
    """Raises MessageError ``too_large`` for a message over ``max_message_bytes``."""
    if len(data) > topic.max_message_bytes:
        raise MessageError(
            "too_large", f"{len(data)} bytes > max_message_bytes {topic.max_message_bytes}"
        )


def decode(data: bytes, topic: TopicConfig) -> dict[str, Any]:
    """Decode one message of ``topic``.

    Raises:
        MessageError: ``too_large`` (over ``max_message_bytes``), ``bad_json``, ``not_object``.
    """
    check_size(data, topic)
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise MessageError("bad_json", str(exc)) from None
    if not isinstance(obj, dict):
        raise MessageError("not_object", f"a message must be a JSON object, got {type(obj).__name__}")
    return obj


def _values(obj: dict[str, Any], paths: tuple[str, ...], parts: tuple[tuple[str, ...], ...],
            what: str) -> list[str]:
    out = []
    for path, p in zip(paths, parts):
        v = obj.get(p[0]) if len(p) == 1 else get_path(obj, p)
        if type(v) is not str:
            v = canonical(v)
        if v is None:
            raise MessageError(f"missing_{what}", f"{what.replace('_', ' ')} {path} is missing or null")
        out.append(v)
    return out


def key_of(obj: dict[str, Any], topic: TopicConfig, supplied: str | None = None) -> str:
    """The SOW key of a decoded message (not for chaining topics: their key needs the chain
    table, see :mod:`sow_redis.chaining`).

    Raises:
        MessageError: ``missing_key_field``; ``missing_sow_key`` / ``bad_sow_key`` on topics
            without key fields (the key must be supplied, Base64 characters only).
    """
    if topic.publisher_keys:
        if not supplied:
            raise MessageError("missing_sow_key", f"topic '{topic.name}' has no key fields: give a SOW key")
        if not is_valid_user_key(supplied):
            raise MessageError("bad_sow_key", f"SOW key {supplied!r} has characters outside Base64")
        return supplied
    return generate(topic.domain, _values(obj, topic.key, topic.key_parts, "key_field"))


def partition_for(obj: dict[str, Any], topic: TopicConfig, sow_key: str) -> int:
    """Partition of a message: with ``partition_by``, the hash of those field values; otherwise
    derived from the SOW key (so every update of one record lands in one partition)."""
    if topic.partitions == 1:
        return 0
    if topic.partition_by:
        vals = _values(obj, topic.partition_by, topic.partition_parts, "partition_field")
        return partition_of(vals, topic.partitions)
    return partition_of_key(sow_key, topic.partitions)


def parse(data: bytes, topic: TopicConfig, supplied_key: str | None = None,
          obj: dict[str, Any] | None = None) -> Parsed:
    """Decode a message, compute its SOW key and partition. Raises MessageError.

    Args:
        obj: the message already decoded from ``data`` (its size is still checked).

    On a chaining topic the SOW key is left ``""`` (the worker resolves the chain); the
    message must carry the primary or a secondary field.
    """
    if obj is None:
        obj = decode(data, topic)
    else:
        check_size(data, topic)
    if topic.chaining:
        if supplied_key:
            raise MessageError("bad_sow_key", f"topic '{topic.name}' uses the chaining key "
                               "generator: its SOW keys come from the chains, not publishers")
        chain_values(obj, topic)
        return Parsed(obj, "", partition_for(obj, topic, ""))
    key = key_of(obj, topic, supplied_key)
    return Parsed(obj, key, partition_for(obj, topic, key))


def index_members(obj: dict[str, Any], topic: TopicConfig, sow_key: str) -> str:
    """Comma-separated hash-index members of a record, one per ``hash_index`` ("" if none).

    A record lacking a field of an index gets no member in that index (an empty slot).
    """
    if not topic.hash_index:
        return ""
    members = []
    for parts in topic.index_parts:
        vals = [canonical(get_path(obj, p)) for p in parts]
        members.append("" if None in vals else f"{index_hash(vals)}:{sow_key}")  # type: ignore[arg-type]
    return ",".join(members)


ENVELOPE_PREFIX = b'{"$sow"'


def unwrap(line: bytes) -> tuple[bytes, dict[str, Any]]:
    """Split an envelope line into (message bytes, options); other lines pass through.

    Raises:
        MessageError: ``bad_envelope`` (not an object with ``$sow`` options and ``data``).
    """
    if not line.startswith(ENVELOPE_PREFIX):
        return line, {}
    try:
        env = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise MessageError("bad_json", str(exc)) from None
    opts, data = env.get("$sow"), env.get("data")
    if not isinstance(opts, dict) or not isinstance(data, dict) or set(env) != {"$sow", "data"}:
        raise MessageError("bad_envelope", 'envelope must be {"$sow": {options}, "data": {message}}')
    unknown = set(opts) - {"expiration", "sow_key"}
    if unknown:
        raise MessageError("bad_envelope", f"unknown envelope option(s): {', '.join(sorted(unknown))}")
    return orjson.dumps(data), opts


def check_expiration(value: Any) -> float | None:
    """A message expiration in seconds (None when absent).

    Raises:
        MessageError: ``bad_expiration`` (not a number >= 0).
    """
    if value is None or value == b"" or value == "":
        return None
    try:
        secs = float(value.decode() if isinstance(value, bytes) else value)
    except (TypeError, ValueError):
        raise MessageError("bad_expiration", f"expiration must be seconds >= 0, got {value!r}") from None
    if not secs >= 0 or secs == float("inf"):
        raise MessageError("bad_expiration", f"expiration must be seconds >= 0, got {value!r}")
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
    return str(int(stream_id.split("-", 1)[0]) + ttl)


def merge(base: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    """AMPS delta_publish merge: fields in ``delta`` replace those in ``base``, nested objects
    merge recursively, other fields stay. Returns a new dict; inputs are not changed."""
    out = dict(base)
    for k, v in delta.items():
        old = out.get(k)
        out[k] = merge(old, v) if isinstance(v, dict) and isinstance(old, dict) else v
    return out
