"""Aggregates over the records of a topic, kept current one change at a time: the engine of
aggregated subscriptions (AMPS aggregated subscriptions and views: ``Projection``,
``Grouping``; issue 26.5). Pure: no Redis.

A **projection** is a list of items, each a grouping field path (``/sym``) or an aggregate
``FUNC(/path) AS /name`` with FUNC one of (case-insensitive):

* ``COUNT``: the records of the group whose ``/path`` is present and not null;
* ``SUM`` / ``AVG``: the sum and the mean of the numeric values (JSON numbers, not booleans)
  of ``/path``; null when the group has none;
* ``MIN`` / ``MAX``: the least and greatest numeric value; null when none.

The **grouping** is a list of field paths; records with equal values there (a missing field
counts as null) form one group, whose row holds the grouping fields and the aggregates at the
paths their ``AS`` names. Sums are exact (floats are added as fractions and rounded once), so
a row kept current equals the row computed afresh from the same records.

:class:`Aggregation` takes each record as it is published (:meth:`~Aggregation.upsert`) or
removed (:meth:`~Aggregation.remove`) and says which rows changed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction

import orjson

from ..errors import SowError
from .sowkey import generate
from .values import JSON, JSONObject, canonical, get_path, split_path

FUNCTIONS = ("COUNT", "SUM", "AVG", "MIN", "MAX")
"""The aggregate functions of a projection."""

_AGGREGATE = re.compile(r"^\s*([A-Za-z]+)\s*\(\s*(\S+?)\s*\)\s+AS\s+(\S+)\s*$", re.IGNORECASE)


class ProjectionError(SowError):
    """A projection or grouping that cannot be used (one line saying which item and why)."""


@dataclass(frozen=True)
class Aggregate:
    """One ``FUNC(/path) AS /name`` item of a projection."""

    function: str
    path: tuple[str, ...]
    name: tuple[str, ...]


@dataclass(frozen=True)
class Projection:
    """A parsed projection with its grouping (see the module docstring)."""

    grouping: tuple[tuple[str, ...], ...]
    fields: tuple[tuple[str, ...], ...]
    aggregates: tuple[Aggregate, ...]


def parse_projection(projection: list[str], grouping: list[str]) -> Projection:
    """Parse a projection and its grouping.

    Raises:
        ProjectionError: an item that is neither a field path nor ``FUNC(/path) AS /name``,
            an unknown function, a plain field that is not a grouping field, no grouping, or
            two items writing the same path.
    """
    if not grouping:
        raise ProjectionError("an aggregation needs a grouping: one or more field paths")
    groups = tuple(_path(g, "grouping") for g in grouping)
    fields: list[tuple[str, ...]] = []
    aggregates: list[Aggregate] = []
    for item in projection:
        m = _AGGREGATE.match(item)
        if m is None:
            if "(" in item:
                raise ProjectionError(f"projection item {item!r}: an aggregate is "
                                      "FUNC(/path) AS /name, e.g. SUM(/qty) AS /qty")
            path = _path(item, "projection")
            if path not in groups:
                raise ProjectionError(f"projection item {item!r} is not an aggregate and not "
                                      "a grouping field")
            fields.append(path)
            continue
        function = m.group(1).upper()
        if function not in FUNCTIONS:
            raise ProjectionError(f"projection item {item!r}: unknown function {m.group(1)!r} "
                                  f"(one of {', '.join(FUNCTIONS)})")
        aggregates.append(Aggregate(function, _path(m.group(2), item),
                                    _path(m.group(3), item)))
    if not aggregates:
        raise ProjectionError("the projection has no aggregate (COUNT, SUM, AVG, MIN or MAX)")
    written = [*fields, *(a.name for a in aggregates)]
    if len(set(written)) != len(written):
        raise ProjectionError("two projection items write the same field")
    return Projection(groups, tuple(fields) or groups, tuple(aggregates))


def _path(text: str, where: str) -> tuple[str, ...]:
    try:
        return split_path(text)
    except ValueError as exc:
        raise ProjectionError(f"{where}: {exc}") from None


def _number(value: JSON) -> int | float | None:
    return value if type(value) in (int, float) else None


@dataclass
class _Group:
    """The members of one group and the running totals of its aggregates."""

    values: tuple[JSON, ...]
    members: dict[str, tuple[JSON, ...]] = field(default_factory=dict)
    counts: list[int] = field(default_factory=list)
    int_sums: list[int] = field(default_factory=list)
    float_sums: list[Fraction] = field(default_factory=list)
    floats: list[int] = field(default_factory=list)
    extremes: list[int | float | None] = field(default_factory=list)


class Aggregation:
    """The rows of a projection over a changing set of records (see the module docstring).

    Args:
        projection: the items, e.g. ``["/sym", "COUNT(/id) AS /orders", "AVG(/px) AS /px"]``.
        grouping: the grouping field paths, e.g. ``["/sym"]``.
        domain: the key domain of the rows' SOW keys (generated from the grouping values).

    Raises:
        ProjectionError: see :func:`parse_projection`.
    """

    def __init__(self, projection: list[str], grouping: list[str], domain: str) -> None:
        self.spec = parse_projection(projection, grouping)
        self.domain = domain
        self._of: dict[str, str] = {}  # record SOW key → group key
        self._groups: dict[str, _Group] = {}

    def upsert(self, sow_key: str, record: JSONObject) -> list[tuple[str, str, JSONObject]]:
        """Take a record's new version. Returns the changed rows as ``(kind, group key,
        row)``: ``publish`` for a group added or changed, ``oof`` (with its last row) for a
        group left empty (the record moved to another group)."""
        values = tuple(get_path(record, p) for p in self.spec.grouping)
        key = generate(self.domain, [_text(v) for v in values])
        out = []
        before = self._of.get(sow_key)
        if before is not None and before != key:
            out += self._leave(sow_key, before)
        group = self._groups.get(key)
        if group is None:
            n = len(self.spec.aggregates)
            group = self._groups[key] = _Group(
                values, counts=[0] * n, int_sums=[0] * n, float_sums=[Fraction(0)] * n,
                floats=[0] * n, extremes=[None] * n)
        old = group.members.pop(sow_key, None)
        if old is not None:
            self._subtract(group, old)
        inputs = tuple(get_path(record, a.path) for a in self.spec.aggregates)
        group.members[sow_key] = inputs
        self._add(group, inputs)
        self._of[sow_key] = key
        out.append(("publish", key, self.row(key)))
        return out

    def remove(self, sow_key: str) -> list[tuple[str, str, JSONObject]]:
        """Take a record's removal; the changed row as :meth:`upsert` says (``oof``, with the
        group's last row, when its group is left empty). Nothing for a record it does not
        hold."""
        key = self._of.pop(sow_key, None)
        return [] if key is None else self._leave(sow_key, key)

    def rows(self) -> list[tuple[str, JSONObject]]:
        """Every group's ``(group key, row)``."""
        return [(key, self.row(key)) for key in self._groups]

    def row(self, key: str) -> JSONObject:
        """The row of group ``key``: its grouping fields and aggregates."""
        group = self._groups[key]
        row: JSONObject = {}
        for path in self.spec.fields:
            _put(row, path, group.values[self.spec.grouping.index(path)])
        for i, agg in enumerate(self.spec.aggregates):
            _put(row, agg.name, self._value(group, i, agg.function))
        return row

    def _leave(self, sow_key: str, key: str) -> list[tuple[str, str, JSONObject]]:
        group = self._groups[key]
        if len(group.members) == 1:  # the group goes: its oof carries its last row
            row = self.row(key)
            del self._groups[key]
            return [("oof", key, row)]
        self._subtract(group, group.members.pop(sow_key))
        return [("publish", key, self.row(key))]

    def _add(self, group: _Group, inputs: tuple[JSON, ...]) -> None:
        for i, (agg, value) in enumerate(zip(self.spec.aggregates, inputs)):
            if agg.function == "COUNT":
                group.counts[i] += value is not None
                continue
            number = _number(value)
            if number is None:
                continue
            group.counts[i] += 1
            if agg.function in ("SUM", "AVG"):
                if type(number) is int:
                    group.int_sums[i] += number
                else:
                    group.float_sums[i] += Fraction(number)
                    group.floats[i] += 1
            else:
                current = group.extremes[i]
                if current is None or (number < current if agg.function == "MIN"
                                       else number > current):
                    group.extremes[i] = number

    def _subtract(self, group: _Group, inputs: tuple[JSON, ...]) -> None:
        for i, (agg, value) in enumerate(zip(self.spec.aggregates, inputs)):
            if agg.function == "COUNT":
                group.counts[i] -= value is not None
                continue
            number = _number(value)
            if number is None:
                continue
            group.counts[i] -= 1
            if agg.function in ("SUM", "AVG"):
                if type(number) is int:
                    group.int_sums[i] -= number
                else:
                    group.float_sums[i] -= Fraction(number)
                    group.floats[i] -= 1
            elif number == group.extremes[i]:  # the extreme left: find the next one
                found = [n for other in group.members.values()
                         if (n := _number(other[i])) is not None]
                pick = min if agg.function == "MIN" else max
                group.extremes[i] = pick(found) if found else None

    @staticmethod
    def _value(group: _Group, i: int, function: str) -> JSON:
        n = group.counts[i]
        if function == "COUNT":
            return n
        if function in ("MIN", "MAX"):
            return group.extremes[i]
        if n == 0:
            return None
        if function == "SUM" and group.floats[i] == 0:
            return group.int_sums[i]  # integers only: an integer, as JSON wrote them
        total = group.float_sums[i] + group.int_sums[i]
        return float(total) if function == "SUM" else float(total / n)


def _text(value: JSON) -> str:
    """A grouping value as key text: null (a missing field groups as null) and strings as
    JSON, so the string "null" is not null; numbers canonical (``42.0`` is ``42``)."""
    if value is None:
        return "null"
    if type(value) is str:
        return orjson.dumps(value).decode()
    return canonical(value) or "null"


def _put(row: JSONObject, path: tuple[str, ...], value: JSON) -> None:
    for step in path[:-1]:
        row = row.setdefault(step, {})
    row[path[-1]] = value
