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
paths their ``AS`` names. Sums are exact (floats are added as whole multiples of 2**-1074, the
least subnormal, which every finite float is, and rounded once), so a row kept current equals
the row computed afresh from the same records.

:class:`Aggregation` takes each record as it is published (:meth:`~Aggregation.upsert`) or
removed (:meth:`~Aggregation.remove`) and says which rows changed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

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


_SCALE_BITS = 1074
"""A float is summed as the integer count of 2**-1074 (the least subnormal) it holds: exact
for every finite float, and an integer sum is much cheaper than a ``Fraction`` sum."""


def _scaled(number: float) -> int:
    """``number`` in units of 2**-1074 (exact). Raises OverflowError / ValueError for an
    infinity / NaN (as ``Fraction`` does)."""
    n, d = number.as_integer_ratio()  # d is a power of two, at most 2**1074
    return n << (_SCALE_BITS + 1 - d.bit_length())


def _reader(paths: list[tuple[str, ...]]) -> Callable[[JSONObject], tuple[JSON, ...]]:
    """A function giving a record's values at ``paths`` as a tuple (a missing field: None):
    ``map(record.get, …)`` when every path is one step, :func:`get_path` otherwise."""
    if all(len(p) == 1 for p in paths):
        steps = [p[0] for p in paths]
        if len(steps) == 1:
            step = steps[0]
            return lambda record: (record.get(step),)
        return lambda record: tuple(map(record.get, steps))
    return lambda record: tuple([get_path(record, p) for p in paths])


_COUNT, _SUM, _MIN, _MAX = range(4)


@dataclass
class _Group:
    """The members of one group (SOW key → its input values, one per distinct aggregate
    path) and the running totals of its aggregates."""

    values: tuple[JSON, ...]
    members: dict[str, tuple[JSON, ...]] = field(default_factory=dict)
    counts: list[int] = field(default_factory=list)
    int_sums: list[int] = field(default_factory=list)
    float_sums: list[int] = field(default_factory=list)  # in units of 2**-1074 (_scaled)
    floats: list[int] = field(default_factory=list)
    extremes: list[int | float | None] = field(default_factory=list)


class Aggregation:
    """The rows of a projection over a changing set of records (see the module docstring).

    Each record's input values are read once per distinct aggregate path; an update within
    its group touches only the aggregates of the values that changed (a value of another
    type counts as changed: ``1``, ``1.0`` and ``true`` aggregate apart).

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
        self._group_of = _reader(list(self.spec.grouping))
        paths = list(dict.fromkeys(a.path for a in self.spec.aggregates))
        self._inputs_of = _reader(paths)
        self._fields = [(p, self.spec.grouping.index(p)) for p in self.spec.fields]
        code = {"COUNT": _COUNT, "SUM": _SUM, "AVG": _SUM, "MIN": _MIN, "MAX": _MAX}
        # per input (distinct path): its index and the aggregates that read it (index, code)
        plans: list[list[tuple[int, int]]] = [[] for _ in paths]
        for i, agg in enumerate(self.spec.aggregates):
            plans[paths.index(agg.path)].append((i, code[agg.function]))
        self._slots = list(enumerate(plans))
        self._keys: dict[tuple[JSON, ...], str] = {}  # grouping values (str, int) → group key

    def upsert(self, sow_key: str, record: JSONObject) -> list[tuple[str, str, JSONObject]]:
        """Take a record's new version. Returns the changed rows as ``(kind, group key,
        row)``: ``publish`` for a group added or changed, ``oof`` (with its last row) for a
        group left empty (the record moved to another group)."""
        return self._filled(self.upsert_keys(sow_key, record))

    def upsert_keys(self, sow_key: str,
                    record: JSONObject) -> list[tuple[str, str, JSONObject | None]]:
        """:meth:`upsert` without making the rows of the groups that stay: ``publish``
        entries carry None (read the row with :meth:`row` when it is needed, e.g. once after
        many changes); an ``oof`` carries the group's last row."""
        values = self._group_of(record)
        key = self._key(values)
        inputs = self._inputs_of(record)
        before = self._of.get(sow_key)
        if before == key:  # an update within its group: only what changed
            same = self._groups[key]
            old = same.members[sow_key]
            same.members[sow_key] = inputs
            self._replace(same, old, inputs)
            return [("publish", key, None)]
        out = [] if before is None else self._leave(sow_key, before)
        group = self._groups.get(key)
        if group is None:
            n = len(self.spec.aggregates)
            group = self._groups[key] = _Group(
                values, counts=[0] * n, int_sums=[0] * n,
                float_sums=[0] * n, floats=[0] * n, extremes=[None] * n)
        group.members[sow_key] = inputs
        for j, plan in self._slots:
            self._add(group, plan, inputs[j])
        self._of[sow_key] = key
        out.append(("publish", key, None))
        return out

    def _filled(self, changed: list[tuple[str, str, JSONObject | None]]
                ) -> list[tuple[str, str, JSONObject]]:
        return [(kind, key, self.row(key) if row is None else row) for kind, key, row in changed]

    def _key(self, values: tuple[JSON, ...]) -> str:
        """The group key (a generated SOW key) of grouping ``values``; remembered for values
        that are strings and integers (not booleans: ``True == 1``), at most 100,000."""
        simple = True
        for v in values:
            if type(v) is not str and type(v) is not int:
                simple = False
                break
        key = self._keys.get(values) if simple else None
        if key is None:
            key = generate(self.domain, [_text(v) for v in values])
            if simple:
                if len(self._keys) >= 100_000:
                    self._keys.clear()
                self._keys[values] = key
        return key

    def remove(self, sow_key: str) -> list[tuple[str, str, JSONObject]]:
        """Take a record's removal; the changed row as :meth:`upsert` says (``oof``, with the
        group's last row, when its group is left empty). Nothing for a record it does not
        hold."""
        return self._filled(self.remove_keys(sow_key))

    def remove_keys(self, sow_key: str) -> list[tuple[str, str, JSONObject | None]]:
        """:meth:`remove` as :meth:`upsert_keys` says (a ``publish`` carries None)."""
        key = self._of.pop(sow_key, None)
        return [] if key is None else self._leave(sow_key, key)

    def rows(self) -> list[tuple[str, JSONObject]]:
        """Every group's ``(group key, row)``."""
        return [(key, self.row(key)) for key in self._groups]

    def row(self, key: str) -> JSONObject:
        """The row of group ``key``: its grouping fields and aggregates.

        Raises:
            KeyError: no group has that key (now).
        """
        group = self._groups[key]
        row: JSONObject = {}
        for path, at in self._fields:
            _put(row, path, group.values[at])
        for i, agg in enumerate(self.spec.aggregates):
            _put(row, agg.name, self._value(group, i, agg.function))
        return row

    def _leave(self, sow_key: str, key: str) -> list[tuple[str, str, JSONObject | None]]:
        group = self._groups[key]
        if len(group.members) == 1:  # the group goes: its oof carries its last row
            row = self.row(key)
            del self._groups[key]
            return [("oof", key, row)]
        inputs = group.members.pop(sow_key)
        for j, plan in self._slots:
            self._take_out(group, plan, j, inputs[j])
        return [("publish", key, None)]

    def _replace(self, group: _Group, old: tuple[JSON, ...], new: tuple[JSON, ...]) -> None:
        """A member's inputs ``old`` replaced by ``new`` (already in ``group.members``): a
        number replaced by a number in one pass (the deriver's common case: its COUNT stays,
        a SUM moves by the difference, a MIN / MAX searches the members only when the value
        that held it got worse), any other change as a removal and an addition."""
        for j, plan in self._slots:
            o, n = old[j], new[j]
            to, tn = type(o), type(n)
            if o is n or (to is tn and o == n):
                continue
            if (to is not int and to is not float) or (tn is not int and tn is not float):
                self._add(group, plan, n)  # first, so a beating MIN / MAX needs no search
                self._take_out(group, plan, j, o)
                continue
            for i, code in plan:
                if code == _SUM:
                    if to is int:
                        group.int_sums[i] -= o
                    else:
                        group.float_sums[i] -= _scaled(o)
                        group.floats[i] -= 1
                    if tn is int:
                        group.int_sums[i] += n
                    else:
                        group.float_sums[i] += _scaled(n)
                        group.floats[i] += 1
                elif code != _COUNT:  # MIN / MAX (a COUNT stays)
                    current = group.extremes[i]
                    if n < current if code == _MIN else n > current:
                        group.extremes[i] = n
                    elif o == current and to is type(current) and not (
                            n == current and tn is to):
                        found = [v for other in group.members.values()
                                 if (v := _number(other[j])) is not None]
                        group.extremes[i] = (min if code == _MIN else max)(found)

    @staticmethod
    def _add(group: _Group, plan: list[tuple[int, int]], value: JSON) -> None:
        """Count ``value`` in the aggregates ``plan`` of ``group``."""
        if value is None:
            return
        kind = type(value)
        number = kind is int or kind is float
        counts = group.counts
        for i, code in plan:
            if code == _COUNT:
                counts[i] += 1
            elif not number:
                continue
            elif code == _SUM:
                counts[i] += 1
                if kind is int:
                    group.int_sums[i] += value
                else:
                    group.float_sums[i] += _scaled(value)
                    group.floats[i] += 1
            else:
                counts[i] += 1
                current = group.extremes[i]
                if current is None or (value < current if code == _MIN
                                       else value > current):
                    group.extremes[i] = value

    @staticmethod
    def _take_out(group: _Group, plan: list[tuple[int, int]], j: int, value: JSON) -> None:
        """Take ``value`` (a member's input ``j``, no longer among ``group.members``' current
        values) out of the aggregates ``plan`` of ``group``: a MIN / MAX it held is found
        again among the members."""
        if value is None:
            return
        kind = type(value)
        number = kind is int or kind is float
        counts = group.counts
        for i, code in plan:
            if code == _COUNT:
                counts[i] -= 1
            elif not number:
                continue
            elif code == _SUM:
                counts[i] -= 1
                if kind is int:
                    group.int_sums[i] -= value
                else:
                    group.float_sums[i] -= _scaled(value)
                    group.floats[i] -= 1
            else:
                counts[i] -= 1
                current = group.extremes[i]
                if value != current or kind is not type(current):
                    continue  # it was not the extreme (an equal value of another type, too)
                found = [n for other in group.members.values()
                         if (n := _number(other[j])) is not None]
                pick = min if code == _MIN else max
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
        if group.floats[i] == 0:  # integers only: a SUM is an integer, as JSON wrote them
            return group.int_sums[i] if function == "SUM" else group.int_sums[i] / n
        # exact, rounded once (int / int is correctly rounded, as float(Fraction) is)
        total = group.float_sums[i] + (group.int_sums[i] << _SCALE_BITS)
        return total / (1 << _SCALE_BITS) if function == "SUM" else total / (n << _SCALE_BITS)


def _text(value: JSON) -> str:
    """A grouping value as key text: null (a missing field groups as null) and strings as
    JSON, so the string "null" is not null; numbers canonical (``42.0`` is ``42``)."""
    if value is None:
        return "null"
    if type(value) is str:
        return orjson.dumps(value).decode()
    return canonical(value) or "null"


def _put(row: JSONObject, path: tuple[str, ...], value: JSON) -> None:
    if len(path) == 1:
        row[path[0]] = value
        return
    for step in path[:-1]:
        row = row.setdefault(step, {})
    row[path[-1]] = value
