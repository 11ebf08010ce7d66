"""The FIX message type: ``tag=value`` fields, stored as JSON objects keyed by tag number.

A FIX topic (``message_type = "fix"``) takes one message per line, fields separated by the
topic's ``field_separator`` (SOH by default; ``;`` and ``|`` appear in engine logs). Anything
before ``8=FIX`` on a line (a log timestamp or trace prefix) is skipped. The session framing
tags 8 BeginString, 9 BodyLength and 10 CheckSum are not part of the stored record. Field
paths are tag numbers (``/11``, ``/41``, ``/55``); values stay text, and the filter language
compares text with numbers numerically (``/38 > 500``). A tag that repeats (repeating groups)
is stored as a list of its values in message order.

Length-prefixed data fields (RawData 96 after RawDataLength 95, and the other pairs in
:data:`DATA_FIELDS`) may contain the separator; their value is taken by length.

The parser is our own: the FIX library we measured (simplefix 1.0.17, a byte-at-a-time
parser fixed to SOH) parses ~24,000 msg/s against ~176,000 for this one
(scripts/bench_chain.py), which would make the publisher the bottleneck of a FIX topic.
simplefix stays the oracle of the fuzz test (tests/test_fix.py).
"""

from __future__ import annotations

from typing import TypeAlias

import orjson

from ..errors import MessageError
from .values import JSONObject

SOH = b"\x01"
FRAMING_TAGS = frozenset({"8", "9", "10"})
"""BeginString, BodyLength, CheckSum: session framing, dropped from stored records."""

DATA_FIELDS = {str(length): str(data) for length, data in (
    (90, 91), (93, 89), (95, 96), (212, 213), (348, 349), (350, 351), (352, 353), (354, 355),
    (356, 357), (358, 359), (360, 361), (362, 363), (364, 365), (445, 446), (618, 619),
    (621, 622), (1277, 1278), (1280, 1281), (1282, 1283), (1397, 1398), (1401, 1402),
    (1403, 1404), (1468, 1469), (1525, 1527), (1578, 1579), (1620, 1621), (1664, 1665),
    (1678, 1697), (1733, 1734))}
"""Length tag → data tag of the FIX "data" fields (SecureData, Signature, RawData, XmlData,
the Encoded* texts, …): the data field's value is exactly that many bytes and may contain
the separator."""

_DATA_TAGS = frozenset(DATA_FIELDS.values())
_DATA_TAGS_B = frozenset(t.encode() for t in _DATA_TAGS)
_NAMED_SEPARATORS = {"soh": SOH, "\\x01": SOH, "\\u0001": SOH, "^a": SOH, "pipe": b"|"}

FixObject: TypeAlias = dict[str, str | list[str]]
"""A FIX message as a record object: tag → value text, or the list of a repeated tag's values."""


def separator(text: str) -> bytes:
    """The separator byte for ``"SOH"``, ``"\\x01"``, ``"^A"``, ``";"``, ``"|"`` or any one
    character other than ``=`` and digits.

    Raises:
        ValueError: anything else.
    """
    sep = _NAMED_SEPARATORS.get(text.lower(), text.encode())
    if len(sep) != 1 or sep in b"=0123456789":
        raise ValueError(f"a FIX field separator is one character other than '=' and digits "
                         f"(e.g. SOH, ';', '|'), got {text!r}")
    return sep


def strip_prefix(line: bytes) -> bytes:
    """The message from ``8=FIX`` on, skipping a log prefix; the line itself when it has no
    ``8=FIX`` (a message given without framing, e.g. ``35=D;11=A``)."""
    i = line.find(b"8=FIX")
    while i > 0 and line[i - 1:i].isdigit():  # "58=FIX…" is a field, not the start
        i = line.find(b"8=FIX", i + 1)
    return line[i:] if i > 0 else line


def _text(b: bytes) -> str:
    try:
        return b.decode()
    except UnicodeDecodeError:
        return b.decode("latin-1")


def _bad(n: int, field: bytes, why: str) -> MessageError:
    shown = _text(field[:40]) + ("…" if len(field) > 40 else "")
    return MessageError("bad_fix", f"field {n} {shown!r}: {why}")


def decode_pairs(msg: bytes, sep: bytes = SOH) -> list[tuple[str, str]]:
    """The ``(tag, value)`` pairs of one message (no log prefix), in order.

    Empty fields (a doubled or trailing separator) are ignored.

    Raises:
        MessageError: ``bad_fix`` naming the field: not ``tag=value``, a tag that is not a
            number, an empty value, a data field shorter than its length field says.
    """
    fields = msg.split(sep)
    pairs: list[tuple[str, str]] = []
    for n, f in enumerate(fields, 1):
        if not f:
            continue
        tag, eq, value = f.partition(b"=")
        if not eq:
            raise _bad(n, f, "not tag=value")
        if not tag.isdigit():
            raise _bad(n, f, "the tag is not a number")
        if tag in _DATA_TAGS_B:
            return _decode_slow(msg, sep)
        if not value:
            raise _bad(n, f, "empty value")
        pairs.append((tag.decode(), _text(value)))
    return pairs



def _decode_slow(msg: bytes, sep: bytes) -> list[tuple[str, str]]:
    """Field by field, taking data fields by the length given in the preceding length field."""
    pairs: list[tuple[str, str]] = []
    pos, n, data_len = 0, 0, -1
    size = len(msg)
    while pos < size:
        if msg[pos:pos + 1] == sep:
            pos += 1
            continue
        n += 1
        eq = msg.find(b"=", pos)
        end = msg.find(sep, pos)
        if eq < 0 or (0 <= end < eq):
            raise _bad(n, msg[pos:end if end >= 0 else size], "not tag=value")
        tag = msg[pos:eq]
        if not tag.isdigit():
            raise _bad(n, msg[pos:end if end >= 0 else size], "the tag is not a number")
        t = tag.decode()
        if t in _DATA_TAGS and data_len >= 0:
            stop = eq + 1 + data_len
            if stop > size or (stop < size and msg[stop:stop + 1] != sep):
                raise _bad(n, msg[pos:stop], f"data field is not {data_len} bytes long")
            value = msg[eq + 1:stop]
            pos = stop + 1
        else:
            stop = end if end >= 0 else size
            value = msg[eq + 1:stop]
            pos = stop + 1
        if not value:
            raise _bad(n, msg[eq - len(tag):stop], "empty value")
        data_len = int(value) if t in DATA_FIELDS and value.isdigit() else -1
        pairs.append((t, _text(value)))
    return pairs


def to_object(pairs: list[tuple[str, str]]) -> FixObject:
    """A record object: tag → value, framing tags dropped, repeated tags as lists."""
    obj: FixObject = {}
    for tag, value in pairs:
        if tag in FRAMING_TAGS:
            continue
        old = obj.get(tag)
        if old is None:
            obj[tag] = value
        elif isinstance(old, list):
            old.append(value)
        else:
            obj[tag] = [old, value]
    return obj


def decode(line: bytes, sep: bytes = SOH) -> FixObject:
    """One FIX line (log prefix allowed) as a record object. Raises MessageError."""
    return to_object(decode_pairs(strip_prefix(line), sep))


def encode(obj: JSONObject, sep: bytes = SOH) -> bytes:
    """A record object back to ``tag=value`` fields joined by ``sep`` (no framing tags: a FIX
    engine adds 8, 9 and 10 when it sends the message). Lists give repeated fields; nested
    values are written as JSON text."""
    out = []
    for tag, value in obj.items():
        for v in value if isinstance(value, list) else (value,):
            if isinstance(v, str):
                text = v.encode()
            elif isinstance(v, (dict, list, bool)) or v is None:
                text = orjson.dumps(v)
            else:
                text = str(v).encode()
            out.append(tag.encode() + b"=" + text)
    return sep.join(out)


def to_message(line: bytes, sep: bytes, skip_msg_types: tuple[str, ...] | frozenset[str]
               ) -> tuple[bytes, FixObject | None] | None:
    """A published FIX line as ``(JSON bytes stored in the log, the decoded object)``, or None
    when its MsgType (35) is one the topic skips (session-level messages by default).

    A line that is already a JSON object (``{...}``, e.g. from the Python API) is taken as
    the decoded form and passes through as ``(line, None)``: the common JSON checks decode it.

    Raises:
        MessageError: ``bad_fix`` (see :func:`decode_pairs`; also a MsgType (35) given more
            than once).
    """
    if line[:1] == b"{":
        if skip_msg_types:
            try:
                mt = orjson.loads(line).get("35")
            except (orjson.JSONDecodeError, AttributeError):
                return line, None  # reported with its reason by the common JSON checks
            if isinstance(mt, str) and mt in skip_msg_types:
                return None
        return line, None
    obj = decode(line, sep)
    if not obj:
        raise MessageError("bad_fix", "no tag=value fields")
    mt = obj.get("35")
    if isinstance(mt, list):
        raise MessageError("bad_fix", f"MsgType (35) given {len(mt)} times")
    if mt in skip_msg_types:
        return None
    return orjson.dumps(obj), obj
