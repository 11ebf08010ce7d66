"""Deltas between two versions of a record: what a delta subscription sends (AMPS
``delta_subscribe`` / ``sow_and_delta_subscribe``; issue 26.2).

A delta is the pair ``(changed, removed)`` that turns the previous record into the new one:

* ``changed``: the fields whose value differs, nested objects compared field by field, so
  that merging ``changed`` into the previous record as ``delta_publish`` merges
  (:func:`sow_redis.model.messages.merge`: nested objects merge, any other value replaces)
  gives every field of the new record;
* ``removed``: the fields the new record no longer has, as JSON Pointers (RFC 6901:
  ``/order/px``; a ``/`` in a field name is written ``~1``, a ``~`` is ``~0``).

:func:`apply_delta` applies both; ``apply_delta(previous, *delta_of(previous, new)) == new``
for any two JSON objects. An unchanged record gives ``({}, [])``.
"""

from __future__ import annotations

from .messages import merge
from .values import JSON, JSONObject


def delta_of(previous: JSONObject, new: JSONObject) -> tuple[JSONObject, list[str]]:
    """``(changed, removed)`` from ``previous`` to ``new`` (see the module docstring)."""
    changed: JSONObject = {}
    removed: list[str] = []
    _diff(previous, new, "", changed, removed)
    return changed, removed


def _diff(old: JSONObject, new: JSONObject, at: str, changed: JSONObject,
          removed: list[str]) -> None:
    for name, value in new.items():
        if name not in old:
            changed[name] = value
            continue
        before = old[name]
        if type(value) is dict and type(before) is dict:
            inner: JSONObject = {}
            _diff(before, value, f"{at}/{_escape(name)}", inner, removed)
            if inner:
                changed[name] = inner
        elif before != value or type(before) is not type(value):  # 1 == 1.0 == True
            changed[name] = value
    removed.extend(f"{at}/{_escape(name)}" for name in old if name not in new)


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _unescape(step: str) -> str:
    return step.replace("~1", "/").replace("~0", "~")


def apply_delta(previous: JSONObject, changed: JSONObject,
                removed: list[str]) -> JSONObject:
    """The record after a delta: ``changed`` merged into ``previous`` as delta_publish
    merges, then each ``removed`` JSON Pointer deleted (one that names nothing is ignored).
    Returns a new dict; the inputs are not changed."""
    out = merge(previous, changed)
    for pointer in removed:
        steps = [_unescape(s) for s in pointer.split("/")[1:]]
        parent: JSON = out
        for step in steps[:-1]:
            child = parent.get(step)
            if type(child) is not dict:
                parent = None
                break
            child = dict(child)  # copied on the way down: merge shares untouched objects
            parent[step] = child
            parent = child
        if type(parent) is dict:
            parent.pop(steps[-1], None)
    return out
