"""Redis stream ids (``<ms>-<seq>``, e.g. ``"1700000000000-3"``): parsing and ordering.

Stream ids order by the pair ``(ms, seq)`` as integers, not as text: ``"10-0"`` comes after
``"9-5"`` and ``"5-10"`` after ``"5-9"`` (Redis docs, "Streams": entry IDs). ``ms`` is the
Redis server clock in milliseconds since the epoch when the entry was appended. An id without
``-seq`` (``"5"``) means ``seq`` 0, as XRANGE reads it. The Lua scripts compare ids with
their own ``id_parts`` (Lua cannot import this module); both follow this rule.
"""

from __future__ import annotations

ZERO = "0-0"
"""The id before every entry: a partition's applied cursor before anything was applied."""


def parse(sid: str | bytes) -> tuple[int, int]:
    """``(ms, seq)`` of a stream id (text or bytes); ``"5"`` is ``(5, 0)``.

    Raises:
        ValueError: not ``<digits>[-<digits>]``.
    """
    s = sid.decode(errors="replace") if isinstance(sid, bytes) else sid
    ms, dash, seq = s.partition("-")
    # isascii: int() would also take other Unicode digits, which no stream id holds
    if not (ms.isdigit() and ms.isascii() and (seq.isdigit() and seq.isascii() if dash else True)):
        raise ValueError(f"not a stream id: {s!r} (expected <ms>-<seq>)")
    return int(ms), int(seq) if dash else 0


def ms_of(sid: str | bytes) -> int:
    """The millisecond part of a stream id (server clock when it was appended).

    Raises:
        ValueError: as :func:`parse`.
    """
    return parse(sid)[0]


def compare(a: str | bytes, b: str | bytes) -> int:
    """``-1``, ``0`` or ``1`` as stream id ``a`` comes before, is, or comes after ``b``.

    Raises:
        ValueError: as :func:`parse`.
    """
    pa, pb = parse(a), parse(b)
    return (pa > pb) - (pa < pb)


def reached(cursor: str | bytes | None, sid: str | bytes) -> bool:
    """Whether an applied ``cursor`` (None: nothing applied yet) is at or after ``sid``.

    Raises:
        ValueError: as :func:`parse`.
    """
    return cursor is not None and parse(cursor) >= parse(sid)
