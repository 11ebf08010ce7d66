"""Range (memo) index members, the score range and the lexicographic ranges a comparison reads.

A range index (``index = ["/px"]`` in a ``[[topic]]``; AMPS ``Index``, a memo index, AMPS
User Guide ch. 7 "SOW Indexing", seeds/004) is two sorted sets per partition and field:

* **numbers** (:func:`sow_redis.keys.range_numbers`): member the SOW key, score the value as
  a double: a JSON number, or a text that reads as a number under the filter's coercion
  (:func:`to_number`; FIX topics hold every field as text). The classic Redis secondary
  index: a write is one ``ZADD`` (it replaces the key's old score), read with
  ``ZRANGEBYSCORE``;
* **the rest** (:func:`sow_redis.keys.index`, every score 0, read with ``ZRANGEBYLEX``):
  member ``<tag><payload>/<SOW key>`` with tag ``s`` + the hex of a text's UTF-8 bytes (at
  most :data:`MAX_TEXT_BYTES`; code point order = UTF-8 byte order, as the filter compares
  texts), or tag ``z`` and no payload: a value the index cannot order (array, object,
  boolean, an integer beyond a double), always a candidate.

NULL or missing has no member, which no comparison matches. A record's member as the write
path passes it (:func:`member`) is ``#<score>`` for a number (the SOW key is the member), the
lex member otherwise; the hash of index members per SOW key keeps each number as ``#``
alone and holds no entry for a key whose members are all numbers or empty
(:func:`stored_members`; ``lua/include/write_record.lua``). The separator ``/`` sorts below
every hex digit, so a shorter payload sorts before its extensions and the SOW key never takes
part in the order of payloads. Both encodings are monotone (``a <= b`` gives
``enc(a) <= enc(b)``) but not injective (rounding to a double, truncated texts), so every
range is read inclusive and the query evaluates the whole filter on each candidate record:
the index only narrows the records read, it never decides a match.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass

from .values import JSON, JSONObject, get_path

__all__ = ["MAX_TEXT_BYTES", "NUMBER", "Bound", "lex_ranges", "member", "member_at",
           "member_key", "score_range", "stored_members", "to_number"]

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


NUMBER = "#"
"""Tag of a number's member as the write path passes it (``#<score>``) and as the hash of
index members keeps it (``#``)."""

_FLOAT_MAX = sys.float_info.max
"""The largest double: an integer within it is a double's score without :func:`_score`."""


def _score(x: int | float) -> str | None:
    """The double of ``x`` as a sorted-set score (None: NaN, or an integer beyond a double)."""
    try:
        f = float(x)
    except OverflowError:
        return None
    if f != f:
        return None
    return repr(f + 0.0)  # -0.0 + 0.0 is 0.0: -0 equals 0


def _text_hex(text: str) -> str:
    return text.encode("utf-8", "surrogatepass")[:MAX_TEXT_BYTES].hex()


def member(value: JSON, sow_key: str) -> str:
    """The range-index member of a record whose indexed field holds ``value``: ``#<score>``
    for a number or numeric text, ``s<hex>/<SOW key>`` for another text, ``z/<SOW key>``
    for a value the index cannot order, "" for NULL or missing (no member)."""
    t = type(value)
    if t is float:  # the common cases first, without _score's call (one per message)
        if value == value:  # not NaN
            return NUMBER + repr(value + 0.0)
        score = None
    elif t is int and -_FLOAT_MAX < value < _FLOAT_MAX:
        return NUMBER + repr(float(value))
    elif value is None:
        return ""
    elif t is int:
        score = _score(value)
    elif t is str:
        n = to_number(value)
        if n is None:
            return f"s{_text_hex(value)}{SEP}{sow_key}"
        score = _score(n)
    else:
        score = None
    return f"z{SEP}{sow_key}" if score is None else NUMBER + score


def member_at(record: JSONObject, path: tuple[str, ...], sow_key: str) -> str:
    """:func:`member` of the value at ``path`` (split) in ``record``: a top-level field read
    without :func:`get_path`'s loop (a publisher computes one per message and range index)."""
    return member(record.get(path[0]) if len(path) == 1 else get_path(record, path), sow_key)


def stored_members(members: str) -> str:
    """What the hash of index members keeps of a record's comma-separated ``members`` (hash
    indexes' and range indexes' as :func:`sow_redis.model.messages.index_members` gives
    them): each number as ``#`` alone, and "" (no entry) when no member is left but numbers
    and empty slots. The Lua write path keeps the same (``write_record.lua``)."""
    slots = [NUMBER if m.startswith(NUMBER) else m for m in members.split(",")]
    return ",".join(slots) if any(m and m != NUMBER for m in slots) else ""


def member_key(m: bytes | str) -> str:
    """The SOW key a lex member (``s…/key``, ``z/key``) names."""
    text = m.decode() if isinstance(m, bytes) else m
    return text.split(SEP, 1)[1]


@dataclass(frozen=True, slots=True)
class Bound:
    """One side of a comparison on an indexed field: the field compares ``op`` to ``value``
    (``op`` one of ``>``, ``>=``, ``<``, ``<=``, ``=``). The index reads a strict bound as the
    inclusive one: a few more candidates (equal values), none lost."""

    op: str
    value: int | float | str


_LOWER = (">", ">=", "=")
_UPPER = ("<", "<=", "=")


def _check(bound: Bound) -> None:
    if bound.op not in _LOWER + _UPPER:
        raise ValueError(f"range bound op must be >, >=, <, <= or =, got {bound.op!r}")


def score_range(bounds: list[Bound]) -> tuple[str, str] | None:
    """The inclusive ``ZRANGEBYSCORE`` ``(min, max)`` of the numbers' sorted set whose members
    are the candidates of a record satisfying every bound; None when none can.

    Only a number literal limits it: a text literal compares with a numeric text as text,
    which the order by number cannot narrow (and the numbers themselves, compared with a
    numeric text literal by number, share the set).

    Raises:
        ValueError: a bound whose op is not ``>``, ``>=``, ``<``, ``<=`` or ``=``.
    """
    lo, hi = -math.inf, math.inf
    for bound in bounds:
        _check(bound)
        v = bound.value
        if isinstance(v, str) or isinstance(v, bool):
            continue
        score = _score(v)
        if score is None:
            continue  # NaN or beyond a double: no limit (every number a candidate)
        f = float(score)
        if bound.op in _LOWER:
            lo = max(lo, f)
        if bound.op in _UPPER:
            hi = min(hi, f)
    if lo > hi:
        return None
    return (repr(lo) if lo > -math.inf else "-inf", repr(hi) if hi < math.inf else "+inf")


def lex_ranges(bounds: list[Bound]) -> list[tuple[bytes, bytes]]:
    """The ``ZRANGEBYLEX`` ``(min, max)`` pairs of the lex sorted set whose members are the
    candidates of a record satisfying every bound: the texts' range (none when a number
    literal bounds the field: a text that is no number never compares true with one), then
    every ``z`` member.

    Raises:
        ValueError: a bound whose op is not ``>``, ``>=``, ``<``, ``<=`` or ``=``.
    """
    lo: str | None = None
    hi: str | None = None
    empty = False
    for bound in bounds:
        _check(bound)
        if not isinstance(bound.value, str):
            empty = True
            continue
        payload = _text_hex(bound.value)
        if bound.op in _LOWER:
            lo = payload if lo is None else max(lo, payload)
        if bound.op in _UPPER:
            hi = payload if hi is None else min(hi, payload)
    if lo is not None and hi is not None and lo > hi:
        empty = True
    out: list[tuple[bytes, bytes]] = []
    if not empty:
        low = b"[s" + (lo.encode() if lo is not None else b"")
        high = b"(s" + hi.encode() + b"0" if hi is not None else b"(t"
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
