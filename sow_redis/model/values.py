"""Field paths and the canonical text form of values.

A field path is an XPath-like string such as ``/orderId`` or ``/order/id`` (AMPS User
Guide ch. 7, "SOW Keys"); for FIX topics the path is a tag number (``/11``). The canonical
text of a value is what SOW keys and hash indexes are computed from (hash index values are
"always evaluated as strings", seeds/004), so ``42``, ``42.0`` and ``"42"`` index alike.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import orjson

JSON: TypeAlias = Any
"""A decoded JSON value: object, array, string, number, boolean or null, as ``orjson.loads``
returns it (a message, or a field value read from one). The one place the package leaves
data untyped: a message's shape is the topic's business, and readers index into it by field
paths (``obj["px"]``, :func:`get_path`) on hot paths, where a recursive union would ask for an
``isinstance`` at every step. What is not decoded JSON gets a precise type (or ``object`` when
a function takes whatever it is given)."""

JSONObject: TypeAlias = dict[str, JSON]
"""A decoded JSON object: a message, or a record's data."""

MISSING = None


def split_path(path: str) -> tuple[str, ...]:
    """``"/order/id"`` → ``("order", "id")``. Raises ValueError for a path not starting with ``/``."""
    if not isinstance(path, str) or not path.startswith("/") or path == "/":
        raise ValueError(f"field path must look like /name or /a/b, got {path!r}")
    parts = tuple(path[1:].split("/"))
    if any(p == "" for p in parts):
        raise ValueError(f"field path has an empty step: {path!r}")
    return parts


def select_paths(select: str | list[str] | tuple[str, ...] | None
                 ) -> list[tuple[str, ...]] | None:
    """The field paths of a select list (AMPS ``select``): a list of paths, each item may
    itself list several separated by commas (``"/a,/b/c"``, as AMPS writes a select list);
    a string is one such item. None: no select list (whole records).

    Raises:
        ValueError: an item is empty or no field path (the message names it).
    """
    if select is None:
        return None
    items = [select] if isinstance(select, str) else select
    return [split_path(part.strip()) for item in items for part in str(item).split(",")]


def select_fields(obj: JSONObject, paths: list[tuple[str, ...]]) -> JSONObject:
    """``obj`` with only the fields at ``paths`` (a select list, :func:`select_paths`):
    nested paths keep their enclosing objects; a path ``obj`` does not have is left out (a
    null field is kept)."""
    out: JSONObject = {}
    for path in paths:
        value: JSON = obj
        for step in path:
            if not isinstance(value, dict) or step not in value:
                break
            value = value[step]
        else:
            target = out
            for step in path[:-1]:
                nested = target.setdefault(step, {})
                if not isinstance(nested, dict):
                    break
                target = nested
            else:
                target[path[-1]] = value
    return out


def get_path(record: JSON, parts: tuple[str, ...]) -> JSON:
    """Value at ``parts`` in a decoded JSON object, or None when any step is missing."""
    value = record
    for step in parts:
        if isinstance(value, dict):
            value = value.get(step)
            if value is None:
                return None
        elif isinstance(value, list) and step.isdigit():
            idx = int(step)
            if idx >= len(value):
                return None
            value = value[idx]
        else:
            return None
    return value


def canonical(value: JSON) -> str | None:
    """Canonical text of a JSON value, or None for a missing / null value.

    Strings are themselves; booleans ``true``/``false``; integral numbers without a
    fraction (``42.0`` → ``"42"``); other floats in shortest round-trip form; objects and
    arrays as compact JSON with sorted keys.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 2**63:
            return str(int(value))
        return repr(value)
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
