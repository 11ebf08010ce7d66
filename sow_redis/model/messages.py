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

import json
import math
from dataclasses import dataclass

import orjson

from ..errors import MessageError
from .chains import chain_values
from .rangeindex import member_at as range_member_at
from .sowkey import generate, index_hash, is_valid_user_key, partition_of, partition_of_key
from .topic import TopicConfig
from .values import JSON, JSONObject, canonical, get_path

COMMANDS = ("publish", "delta_publish", "sow_delete")


@dataclass
class Parsed:
    """A message ready to apply: the decoded object, its SOW key and partition."""

    obj: JSONObject
    sow_key: str
    partition: int


def check_size(data: bytes, topic: TopicConfig) -> None:
    """Raises MessageError ``too_large`` for a message over ``max_message_bytes``."""
    if len(data) > topic.max_message_bytes:
        raise MessageError(
            "too_large", f"{len(data)} bytes > max_message_bytes {topic.max_message_bytes}"
        )


MAX_DEPTH = 254
"""Deepest nesting of objects and arrays a message may have: what the JSON encoder (orjson
3.x, "Recursion limit reached") can write back when a worker merges a delta or builds an
event. Deeper messages are rejected ``too_deep``."""

INT_MIN, INT_MAX = -(2**63), 2**64 - 1
"""Integers JSON messages may hold: the 64-bit range the decoder keeps exact (signed 64-bit
and unsigned 64-bit). The decoder turns a longer integer literal into a float, so
``123456789012345678901234567890`` and ``…891`` would be one value (one SOW key): such a
message is rejected ``number_out_of_range`` (send the number as a string)."""

_SCAN = bytes(48 if 48 <= c <= 57 else 91 if c in b"{[" else 32 for c in range(256))
"""Byte map for the cheap scans: digits → ``0``, ``{`` and ``[`` → ``[``, the rest → space."""
_LONG_DIGITS = b"0" * 19  # the shortest integer outside the range has 19 digits (-2^63 - 1)


class _OutOfRange(Exception):
    pass


def _int_in_range(text: str) -> int:
    if len(text) > 21 or not INT_MIN <= int(text) <= INT_MAX:
        raise _OutOfRange(text)
    return 0


def _exact_integer_check(data: bytes) -> None:
    try:
        json.loads(data, parse_int=_int_in_range)
    except _OutOfRange as exc:
        text = str(exc)
        shown = text if len(text) <= 40 else f"{text[:20]}…({len(text)} digits)"
        raise MessageError("number_out_of_range", f"integer {shown} is outside the 64-bit range "
                           f"({INT_MIN} … {INT_MAX}): send it as a string") from None
    except (ValueError, RecursionError):
        pass  # orjson accepted the text: its verdict stands


def _depth_check(obj: object) -> None:
    try:
        orjson.dumps(obj)
    except TypeError:
        raise MessageError("too_deep", f"objects and arrays nested deeper than {MAX_DEPTH} "
                           "levels") from None


def check_integers(data: bytes) -> None:
    """Reject a JSON text holding an integer literal outside ``INT_MIN … INT_MAX``.

    Cheap unless ``data`` has a run of 19 or more digits (one byte translation and one
    substring search); only then the text is parsed again by the standard library to see
    every integer literal exactly (a 19-digit nanosecond timestamp takes that slow path, a
    few microseconds; scripts/bench_decode.py).

    Raises:
        MessageError: ``number_out_of_range``.
    """
    if _LONG_DIGITS in data.translate(_SCAN):
        _exact_integer_check(data)


def _decode_error(exc: Exception) -> MessageError:
    text = str(exc)
    if "infinity" in text:
        return MessageError("number_out_of_range", f"number beyond the double range: {text}")
    if "depth limit" in text:
        return MessageError("too_deep", f"objects and arrays nested deeper than {MAX_DEPTH} "
                            f"levels: {text}")
    return MessageError("bad_json", text)


def loads(data: bytes) -> JSON:
    """Decode JSON text (orjson) with the checks every message gets: nesting depth (exact
    check only for a text over ``2 * MAX_DEPTH`` bytes with over ``MAX_DEPTH`` brackets) and
    the integer range (see :func:`check_integers`).

    Raises:
        MessageError: ``bad_json``, ``too_deep``, ``number_out_of_range``.
    """
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise _decode_error(exc) from None
    scan = data.translate(_SCAN)
    if len(data) > 2 * MAX_DEPTH and scan.count(b"[") > MAX_DEPTH:
        _depth_check(obj)  # before the integer check: the stdlib parser recurses
    if _LONG_DIGITS in scan and _may_hold_long_integer(obj, len(data)):
        _exact_integer_check(data)
    return obj


_FLOAT_FROM_LONG = float(2 ** 63)
"""orjson turns an integer literal outside the 64-bit range into a float of at least this
magnitude; an integer inside it stays an int."""

_WALK_MAX_BYTES = 65_536
"""Texts up to this size are walked for such floats (faster than parsing again); longer ones
with a long digit run are parsed again at once."""


def _may_hold_long_integer(obj: JSON, size: int) -> bool:
    """Whether decoded ``obj`` may come from an integer literal outside the 64-bit range: it
    holds a float of magnitude ≥ 2^63 (or the text is too long to walk). A 19-digit integer
    inside the range (a nanosecond timestamp) thus costs a walk of the object, not a second
    parse (scripts/bench_decode.py)."""
    if size > _WALK_MAX_BYTES:
        return True
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, float) and not -_FLOAT_FROM_LONG < v < _FLOAT_FROM_LONG:
            return True
    return False


def decode(data: bytes, topic: TopicConfig) -> JSONObject:
    """Decode one message of ``topic`` (publisher and worker alike).

    Raises:
        MessageError: ``too_large`` (over ``max_message_bytes``), ``bad_json``, ``not_object``,
            ``too_deep`` (over :data:`MAX_DEPTH`), ``number_out_of_range`` (an integer outside
            :data:`INT_MIN` … :data:`INT_MAX`).
    """
    check_size(data, topic)
    obj = loads(data)
    if not isinstance(obj, dict):
        raise MessageError("not_object", f"a message must be a JSON object, got {type(obj).__name__}")
    return obj


def _encode_reason(text: str) -> str:
    if "Dict key must be" in text:
        return "bad_key_type"
    if "Recursion limit" in text:
        return "too_deep"
    if "64-bit" in text:
        return "number_out_of_range"
    return "bad_message"


def _non_finite(obj: object) -> str | None:
    """Path (``/a/0/b``) of the first NaN or infinite float in ``obj``, or None."""
    stack: list[tuple[str, object]] = [("", obj)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                return path or "/"
        elif isinstance(v, dict):
            stack += [(f"{path}/{k}", x) for k, x in v.items()]
        elif isinstance(v, (list, tuple)):
            stack += [(f"{path}/{i}", x) for i, x in enumerate(v)]
    return None


def encode(msg: object) -> bytes:
    """A message given to the Python API as bytes: bytes as they are, ``str`` as UTF-8, any
    other value (a dict) as JSON text.

    Raises:
        MessageError: ``bad_key_type`` (a dict key that is not a string), ``too_deep`` (over
            :data:`MAX_DEPTH`), ``number_out_of_range`` (an int outside 64 bits),
            ``not_finite`` (NaN or an infinite float: JSON has no such numbers, and the
            encoder would write ``null``), ``bad_message`` (anything else that cannot be
            encoded, with the encoder's words).
    """
    if isinstance(msg, bytes):
        return msg
    if isinstance(msg, (bytearray, memoryview)):
        return bytes(msg)
    if isinstance(msg, str):
        try:
            return msg.encode()
        except UnicodeEncodeError as exc:
            raise MessageError("bad_message", f"text is not valid UTF-8: {exc}") from None
    try:
        out = orjson.dumps(msg)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        raise MessageError(_encode_reason(str(exc)), str(exc)) from None
    if b"null" in out:  # NaN and infinities are written as null: look for them only then
        where = _non_finite(msg)
        if where is not None:
            raise MessageError("not_finite", f"{where}: NaN and infinite numbers are not JSON")
    return out


def _values(obj: JSONObject, paths: tuple[str, ...], parts: tuple[tuple[str, ...], ...],
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


def check_supplied_key(topic: TopicConfig, supplied: str | None) -> None:
    """The one rule for a publisher-supplied SOW key (AMPS "User-Generated SOW Keys",
    seeds/004): a topic without key fields needs one of 1-512 Base64 characters; a topic with
    key fields, or with the chaining key generator, takes none (its keys are generated).

    Raises:
        MessageError: ``missing_sow_key``, ``bad_sow_key``.
    """
    if topic.chaining:
        if supplied:
            raise MessageError("bad_sow_key", f"topic '{topic.name}' uses the chaining key "
                               "generator: its SOW keys come from the chains, not publishers")
    elif topic.publisher_keys:
        if supplied is None or supplied == "":
            raise MessageError("missing_sow_key", f"topic '{topic.name}' has no key fields: give a SOW key")
        if not is_valid_user_key(supplied):
            raise MessageError("bad_sow_key", f"SOW key {supplied!r} is not 1-512 Base64 "
                               "characters (A-Z a-z 0-9 + / =)")
    elif supplied:
        raise MessageError("bad_sow_key", f"topic '{topic.name}' has key fields "
                           f"({', '.join(topic.key)}): its SOW keys are generated from them, "
                           "a publisher cannot give one")


def key_of(obj: JSONObject, topic: TopicConfig, supplied: str | None = None) -> str:
    """The SOW key of a decoded message (not for chaining topics: their key needs the chain
    table, see :mod:`sow_redis.apply.chaining`).

    Raises:
        MessageError: ``missing_key_field``; ``missing_sow_key`` / ``bad_sow_key`` on topics
            without key fields (the key must be supplied: a string of 1-512 Base64
            characters); ``bad_sow_key`` when a key is supplied on a topic with key fields
            (its keys are generated from them; a supplied key would be silently ignored);
            see :func:`check_supplied_key`.
    """
    check_supplied_key(topic, supplied)
    if topic.publisher_keys:
        return supplied  # type: ignore[return-value]
    return generate(topic.domain, _values(obj, topic.key, topic.key_parts, "key_field"))


def partition_for(obj: JSONObject, topic: TopicConfig, sow_key: str) -> int:
    """Partition of a message: with ``partition_by``, the hash of those field values; otherwise
    derived from the SOW key (so every update of one record lands in one partition)."""
    if topic.partitions == 1:
        return 0
    if topic.partition_by:
        vals = _values(obj, topic.partition_by, topic.partition_parts, "partition_field")
        return partition_of(vals, topic.partitions)
    return partition_of_key(sow_key, topic.partitions)


def parse(data: bytes, topic: TopicConfig, supplied_key: str | None = None,
          obj: JSONObject | None = None) -> Parsed:
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
        check_supplied_key(topic, supplied_key)
        chain_values(obj, topic)
        return Parsed(obj, "", partition_for(obj, topic, ""))
    key = key_of(obj, topic, supplied_key)
    return Parsed(obj, key, partition_for(obj, topic, key))


def index_members(obj: JSONObject, topic: TopicConfig, sow_key: str) -> str:
    """Comma-separated index members of a record, one per index: each ``hash_index`` in order,
    then each range index (``index``; :func:`sow_redis.model.rangeindex.member`) in order
    ("" if the topic has none).

    A record lacking a field of an index gets no member in that index (an empty slot).
    """
    ranges = topic.range_parts
    if not topic.index_parts:  # range indexes alone, the common case: no list to build
        if len(ranges) == 1:
            return range_member_at(obj, ranges[0], sow_key)
        return ",".join([range_member_at(obj, path, sow_key) for path in ranges])
    members = []
    for parts in topic.index_parts:
        vals = [canonical(get_path(obj, p)) for p in parts]
        members.append("" if None in vals else f"{index_hash(vals)}:{sow_key}")  # type: ignore[arg-type]
    for path in ranges:
        members.append(range_member_at(obj, path, sow_key))
    return ",".join(members)


ENVELOPE_PREFIX = b'{"$sow"'


def unwrap(line: bytes) -> tuple[bytes, JSONObject]:
    """Split an envelope line into (message bytes, options); other lines pass through.

    Options: ``sow_key`` (a string; validated by :func:`key_of`), ``expiration`` (checked by
    :func:`check_expiration`); ``null`` means absent.

    Raises:
        MessageError: ``bad_json``, ``too_deep``, ``number_out_of_range`` (as :func:`loads`);
            ``bad_envelope`` (not an object with ``$sow`` options and ``data``, or an unknown
            option); ``bad_sow_key`` (a ``sow_key`` that is not a string).
    """
    if not line.startswith(ENVELOPE_PREFIX):
        return line, {}
    try:
        env = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise _decode_error(exc) from None
    opts, data = env.get("$sow"), env.get("data")
    if not isinstance(opts, dict) or not isinstance(data, dict) or set(env) != {"$sow", "data"}:
        raise MessageError("bad_envelope", 'envelope must be {"$sow": {options}, "data": {message}}')
    unknown = set(opts) - {"expiration", "sow_key"}
    if unknown:
        raise MessageError("bad_envelope", f"unknown envelope option(s): {', '.join(sorted(unknown))}")
    key = opts.get("sow_key")
    if key is not None and not isinstance(key, str):
        raise MessageError("bad_sow_key", f"envelope sow_key must be a string, got {key!r}")
    check_integers(line)  # the data is written again below: a long integer must not become a float
    try:
        return orjson.dumps(data), opts
    except TypeError:  # the line holds one more level than its data
        raise MessageError("too_deep", f"objects and arrays nested deeper than {MAX_DEPTH} "
                           "levels") from None


def merge(base: JSONObject, delta: JSONObject) -> JSONObject:
    """AMPS delta_publish merge: fields in ``delta`` replace those in ``base``, nested objects
    merge recursively, other fields stay. Returns a new dict; inputs are not changed."""
    out = dict(base)
    for k, v in delta.items():
        old = out.get(k)
        out[k] = merge(old, v) if isinstance(v, dict) and isinstance(old, dict) else v
    return out
