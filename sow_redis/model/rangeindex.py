"""Range (memo) index members and the lexicographic ranges a comparison reads.

A range index (``index = ["/px"]`` in a ``[[topic]]``; AMPS ``Index``, a memo index, AMPS
User Guide ch. 7 "SOW Indexing", seeds/004) is one sorted set per partition and field, every
score 0, read with ZRANGEBYLEX. A record's member, one per index, is::

    <tag><payload>/<SOW key>

* ``n`` + 16 hex digits: a JSON number, as the bits of its IEEE-754 double with the sign
  flipped (negative numbers: every bit flipped), so hex order is numeric order;
* ``t`` + the same 16 digits: a text that reads as a number under the filter's coercion
  (:func:`to_number`; FIX topics hold every field as text), ordered by that number;
* ``s`` + the hex of the text's UTF-8 bytes (at most :data:`MAX_TEXT_BYTES`): any other
  text, ordered as the filter compares texts (code point order = UTF-8 byte order);
* ``z``: a value the index cannot order (array, object, boolean, NaN, an integer beyond a
  double): always a candidate;
* no member (an empty slot): NULL or missing, which no comparison matches.

The separator ``/`` sorts below every hex digit, so a shorter payload sorts before its
extensions and the SOW key never takes part in the order of payloads. The encoding is
monotone (``a <= b`` gives ``enc(a) <= enc(b)``) but not injective (rounding to a double,
truncated texts), so every range is read inclusive and the query evaluates the whole filter
on each candidate record: the index only narrows the records read, it never decides a match.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from .values import JSON

__all__ = ["MAX_TEXT_BYTES", "Bound", "lex_ranges", "member", "member_key", "to_number"]

MAX_TEXT_BYTES = 64
"""Longest text prefix (UTF-8 bytes) a ``s`` member holds; longer texts are cut (monotone)."""

SEP = "/"

_NUMERIC_TEXT = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*")


def to_number(text: str) -> int | float | None:
    """Number written in ``text`` (``"42"``, ``"-1.5"``, ``"1e3"``), or None if it is not one.

    The content filter's coercion of a text compared with a number (AMPS User Guide,
    "Content Filtering"); :mod:`sow_redis.query.filter` uses this very function.
    """
    if len(text) < 19 and text.isascii() and text.isdigit():
        return int(text)
    if _NUMERIC_TEXT.fullmatch(text) is None:
        return None
    try:
        return int(text)
    except ValueError:  # a fraction or exponent, or more digits than int() accepts
        return float(text)


def _num_hex(x: int | float) -> str | None:
    """16 hex digits ordered as the number (None: NaN, or an integer beyond a double)."""
    try:
        f = float(x)
    except OverflowError:
        return None
    if f != f:
        return None
    if f == 0.0:
        f = 0.0  # -0.0 equals 0.0
    (bits,) = struct.unpack(">Q", struct.pack(">d", f))
    bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | 0x8000000000000000
    return "%016x" % bits


def _text_hex(text: str) -> str:
    return text.encode("utf-8", "surrogatepass")[:MAX_TEXT_BYTES].hex()


def _payload(value: JSON) -> str | None:
    """Tag and payload of a non-NULL value; ``"z"`` when the index cannot order it."""
    t = type(value)
    if t is int or t is float:
        h = _num_hex(value)
        return "z" if h is None else "n" + h
    if t is str:
        n = to_number(value)
        if n is None:
            return "s" + _text_hex(value)
        h = _num_hex(n)
        return "z" if h is None else "t" + h
    return "z"


def member(value: JSON, sow_key: str) -> str:
    """The range-index member of a record whose indexed field holds ``value`` ("" for NULL or
    missing: no member)."""
    if value is None:
        return ""
    p = _payload(value)
    return f"{p}{SEP}{sow_key}" if p else ""


def member_key(m: bytes | str) -> str:
    """The SOW key a member names."""
    text = m.decode() if isinstance(m, bytes) else m
    return text.split(SEP, 1)[1]


@dataclass(frozen=True, slots=True)
class Bound:
    """One side of a comparison on an indexed field: the field compares ``op`` to ``value``
    (``op`` one of ``>``, ``>=``, ``<``, ``<=``, ``=``). The index reads a strict bound as the
    inclusive one: a few more candidates (equal values), none lost."""

    op: str
    value: int | float | str


# Per bucket the lowest and highest payload (None: unbounded) and whether it is empty.
_Span = tuple[str | None, str | None, bool]


_LOWER = (">", ">=", "=")
_UPPER = ("<", "<=", "=")


def _narrow(span: _Span, op: str, payload: str | None) -> _Span:
    lo, hi, empty = span
    if payload is None:  # a literal this bucket can never satisfy
        return lo, hi, True
    if op in _LOWER:
        lo = payload if lo is None else max(lo, payload)
    if op in _UPPER:
        hi = payload if hi is None else min(hi, payload)
    if lo is not None and hi is not None and lo > hi:
        empty = True
    return lo, hi, empty


def _bucket_payloads(value: int | float | str) -> dict[str, str | bool | None]:
    """What a literal limits in each bucket: a payload, None (no record of that bucket can
    satisfy it) or True (every record of that bucket may satisfy it)."""
    if isinstance(value, str):
        n = to_number(value)  # numbers compare with the literal read as a number
        nh = None if n is None else _num_hex(n)
        # a numeric text compares with a text literal as text, but sorts by number: all
        return {"n": nh, "t": True, "s": _text_hex(value)}
    h = _num_hex(value)
    if h is None:
        return {"n": True, "t": True, "s": None}
    return {"n": h, "t": h, "s": None}


def lex_ranges(bounds: list[Bound]) -> list[tuple[bytes, bytes]]:
    """The ZRANGEBYLEX ``(min, max)`` pairs whose members are the candidates of a record
    satisfying every bound (their union; the ``z`` members always included).

    Raises:
        ValueError: a bound whose op is not ``>``, ``>=``, ``<``, ``<=`` or ``=``.
    """
    spans: dict[str, _Span] = {b: (None, None, False) for b in "nts"}
    for bound in bounds:
        if bound.op not in _LOWER + _UPPER:
            raise ValueError(f"range bound op must be >, >=, <, <= or =, got {bound.op!r}")
        for bucket, limit in _bucket_payloads(bound.value).items():
            if limit is True:
                continue
            spans[bucket] = _narrow(spans[bucket], bound.op, limit if isinstance(limit, str)
                                    else None)
    out: list[tuple[bytes, bytes]] = []
    for bucket, (lo, hi, empty) in spans.items():
        if empty:
            continue
        tag = bucket.encode()
        low = b"[" + tag + (lo.encode() if lo is not None else b"")
        high = (b"(" + tag + hi.encode() + b"0" if hi is not None
                else b"(" + bytes([tag[0] + 1]))
        out.append((low, high))
    out.append((b"[z", b"(z" + b"\xff"))
    return out


def describe(bounds: list[Bound]) -> str:
    """The range of values the bounds leave, for a query plan: ``(10, +inf)`` (``>`` 10),
    ``[10, 20]`` (BETWEEN 10 AND 20), ``['a', 'm')``; the tightest bound of each side."""
    lo: Bound | None = None
    hi: Bound | None = None
    for b in bounds:
        if b.op in _LOWER and (lo is None or _gt(b.value, lo.value)):
            lo = b
        if b.op in _UPPER and (hi is None or _gt(hi.value, b.value)):
            hi = b
    left = "(-inf" if lo is None else ("(" if lo.op == ">" else "[") + repr(lo.value)
    right = "+inf)" if hi is None else repr(hi.value) + (")" if hi.op == "<" else "]")
    return f"{left}, {right}"


def _gt(a: int | float | str, b: int | float | str) -> bool:
    try:
        return a > b  # type: ignore[operator]
    except TypeError:  # a text and a number: shown as given first
        return False
