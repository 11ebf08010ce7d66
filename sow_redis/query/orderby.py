"""Order-by clauses for SOW queries: ``"/price DESC, /symbol"``.

A clause is a comma-separated list of field paths, each optionally followed by ``ASC``
(the default) or ``DESC`` (case-insensitive).

Sort order of values, ascending: numbers (numerically), then strings (lexicographically,
by code point), then booleans (false before true), then objects and arrays (by their
canonical JSON text), then NULL / missing values last. ``DESC`` reverses that order for
its key, so NULLs come first. Values are compared by their JSON type: the string
``"10"`` is a string and sorts among strings, not among numbers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TypeAlias, TypeVar

from ..errors import FilterSyntaxError
from ..model.values import JSON, canonical, get_path, split_path

__all__ = ["parse_order_by", "sort_records"]

OrderBy = list[tuple[tuple[str, ...], bool]]
"""Parsed clause: ``[(path parts, descending), …]`` in priority order."""

_ITEM = re.compile(r"\s*(?P<path>[^\s,]*)(?:\s+(?P<dir>[^\s,]+))?\s*(?P<extra>[^,]*)")


def _error(text: str, pos: int, what: str) -> FilterSyntaxError:
    shown = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace('"', '\\"')
    return FilterSyntaxError(f'order by syntax error at column {pos + 1}: {what} in "{shown}"')


def parse_order_by(text: str) -> OrderBy:
    """Parse an order-by clause.

    Args:
        text: e.g. ``"/f DESC, /g"``.

    Returns:
        ``[(("f",), True), (("g",), False)]``: each key's path parts and whether it
        sorts descending.

    Raises:
        FilterSyntaxError: (one line, 1-based column) the clause is empty, an item is
            empty, a path does not start with ``/`` or has an empty step, the direction
            is not ASC or DESC, or something follows the direction.
    """
    if not isinstance(text, str):
        raise FilterSyntaxError(f"order by must be a string, got {type(text).__name__}")
    if not text.strip():
        raise _error(text, len(text), "empty order by")
    order: OrderBy = []
    start = 0
    for chunk in text.split(","):
        m = _ITEM.fullmatch(chunk)
        assert m is not None  # the pattern matches any text without a comma
        path, direction, extra = m.group("path"), m.group("dir"), m.group("extra")
        if not path:
            raise _error(text, start + m.start("path"), "expected a field path such as /name")
        if not path.startswith("/"):
            raise _error(
                text, start + m.start("path"), f"field path must start with '/', got {path!r}"
            )
        try:
            parts = split_path(path)
        except ValueError:
            raise _error(text, start + m.start("path"), f"bad field path {path!r}") from None
        descending = False
        if direction is not None:
            word = direction.upper()
            if word not in ("ASC", "DESC"):
                raise _error(
                    text, start + m.start("dir"), f"expected ASC or DESC, got {direction!r}"
                )
            descending = word == "DESC"
        if extra:
            raise _error(text, start + m.start("extra"), f"unexpected {extra.split()[0]!r}")
        order.append((parts, descending))
        start += len(chunk) + 1
    return order


_NULL_RANK = 4

_SortKey: TypeAlias = tuple[int, int | float | str]
"""(type rank, a value comparable with the others of that rank)."""

_T = TypeVar("_T")


def _sort_key(value: JSON) -> _SortKey:
    """Ascending sort key: (type rank, comparable value); NULL ranks last."""
    if value is None:
        return (_NULL_RANK, 0)
    if isinstance(value, bool):
        return (2, int(value))
    if isinstance(value, (int, float)):
        return (0, value)
    if isinstance(value, str):
        return (1, value)
    return (3, canonical(value) or "")  # canonical() is None only for null, handled above


def sort_records(
    records: Iterable[_T], order: OrderBy, data: Callable[[_T], JSON] = lambda r: r
) -> list[_T]:
    """Stable sort of ``records`` by an order-by clause; returns a new list.

    Args:
        records: the items to sort (records, or anything ``data`` maps to a record).
        order: a parsed clause from :func:`parse_order_by`.
        data: gives the decoded JSON object of an item (default: the item itself).

    Returns:
        The items sorted by the first key, ties broken by the next keys, remaining ties
        kept in their input order. Missing values sort last for ASC keys, first for DESC.
    """
    items = list(records)
    # Stable sorts applied from the least to the most significant key give the combined
    # order; ``reverse=True`` keeps ties in input order, so mixed directions just work.
    for parts, descending in reversed(order):
        def key(r: _T, p: tuple[str, ...] = parts) -> _SortKey:
            return _sort_key(get_path(data(r), p))

        items.sort(key=key, reverse=descending)
    return items
