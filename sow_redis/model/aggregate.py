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
paths their ``AS`` names. Sums are exact (a group's floats are added as whole multiples of
2**-s, the place of the last significand bit of the least of them, and rounded once: int /
int is correctly rounded), so a row kept current equals the row computed afresh from the same
records.

:class:`Aggregation` takes each record as it is published (:meth:`~Aggregation.upsert`) or
removed (:meth:`~Aggregation.remove`) and says which rows changed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from math import frexp, inf
from operator import itemgetter
from typing import Any

import msgspec
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


_INT_MIN, _INT_MAX = -(2 ** 63), 2 ** 64 - 1
"""The integers orjson decodes as integers (beyond them: a float)."""

_TWO_53 = 9007199254740992.0
"""2**53: a float's ``frexp`` mantissa times this is its 53-bit significand, exactly."""


def _units(st: list[Any], fs: int, sc: int, fac: int, number: float) -> int:
    """``number`` (a finite float) in the units of the float sum ``st[fs]``: 2**-``st[sc]``,
    ``st[fac]`` being 2.0**``st[sc]`` (inf beyond the float range). The common case is one
    product, exact (a power of two), that is a whole number; otherwise the units are made
    fine enough first (``st[sc]`` grows to the position of the float's last significand
    bit, by ``frexp``, and ``st[fs]`` is rescaled with it; the units never coarsen, so a
    float once added can always be taken out). The floats of a group, of like magnitude,
    so sum to a small integer (a few 30-bit digits), not one of 1,100 bits as in units of
    2**-1074, the least subnormal."""
    unit: float = number * st[fac]
    if unit.is_integer():  # not inf (beyond the floats in these units), nor nan
        return int(unit)
    mantissa, exponent = frexp(number)  # number = mantissa * 2**exponent, 0.5 <= |m| < 1
    whole = int(mantissa * _TWO_53)  # number = whole * 2**(exponent - 53)
    shift: int = exponent + st[sc] - 53
    if shift >= 0:
        return whole << shift
    st[fs] <<= -shift
    st[sc] -= shift
    st[fac] = 2.0 ** st[sc] if st[sc] < 1024 else inf
    return whole


_SUMS = ("num", "isum", "fsum", "floats", "scale", "factor")

_MEASURES = {"COUNT": ("count",), "SUM": _SUMS, "AVG": _SUMS, "MIN": ("num", "min"),
             "MAX": ("num", "max")}
"""The running totals each function reads, per input: ``count`` (values present), ``num``
(numeric values), ``isum`` (their integers' sum), ``fsum`` (their floats' sum in units of
2**-``scale``, :func:`_units`), ``floats`` (how many are floats), ``scale`` (0 until a float
needs more), ``factor`` (2.0**scale), ``min``, ``max`` (None while there is no number). A SUM
and an AVG of one path share theirs."""

_INITIAL: dict[str, int | float | None] = {"min": None, "max": None, "factor": 1.0}
"""A group's first running totals that are not 0."""

_EXTREMES = (("min", "<", "min"), ("max", ">", "max"))


class _Group:
    """One group: its grouping values, its members (SOW key → its input values, one per
    distinct aggregate path) and its running totals (``state``: one slot per measure of
    :data:`_MEASURES` that the projection reads, in :attr:`Aggregation._slots` order)."""

    __slots__ = ("members", "state", "values")

    def __init__(self, values: tuple[JSON, ...], state: list[int | float | None]) -> None:
        self.values = values
        self.members: dict[str, tuple[JSON, ...]] = {}
        self.state = state


def _extreme(pick: Callable[[Iterable[int | float]], int | float],
             members: dict[str, tuple[JSON, ...]], j: int, numbers: int) -> int | float | None:
    """The least or greatest (``pick``) number among the members' input ``j``, ``numbers`` of
    which are numbers; None when none is."""
    if numbers == len(members):  # all are: no test of each
        return pick(map(itemgetter(j), members.values())) if numbers else None
    found = [v for other in members.values() if type(v := other[j]) is int or type(v) is float]
    return pick(found) if found else None


class Aggregation:
    """The rows of a projection over a changing set of records (see the module docstring).

    Each record's input values are read once per distinct aggregate path; an update within
    its group touches only the aggregates of the values that changed (a value of another
    type counts as changed: ``1``, ``1.0`` and ``true`` aggregate apart).

    The work of one change is done by code generated for the projection (as ``dataclasses``
    does for a class: :class:`_Code`), with no loop over its aggregates: a deriver takes every
    change of its underlying topic, and the loops over plans took most of its CPU.

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
        # grouping values (str, int) → group key; the value itself for one grouping field
        self._keys: dict[JSON, str] = {}
        self._single = len(self.spec.grouping) == 1
        self._paths = list(dict.fromkeys(a.path for a in self.spec.aggregates))
        # (measure, input) → its index in a group's state
        self._slots: dict[tuple[str, int], int] = {}
        for agg in self.spec.aggregates:
            j = self._paths.index(agg.path)
            for measure in _MEASURES[agg.function]:
                self._slots.setdefault((measure, j), len(self._slots))
        self._initial = [_INITIAL.get(m, 0) for m, _j in self._slots]
        read = [*self.spec.grouping, *self._paths]
        self.fields: list[str] = ([] if any(len(p) > 1 for p in read)
                                  else list(dict.fromkeys(p[0] for p in read)))
        """The top-level fields the projection reads, when it reads no nested path: what
        :attr:`decode_inputs` decodes of a record."""
        self.source = _Code(self).source
        """The code generated for this projection (``upsert``, ``take_changes``, ``add``,
        ``take_out``, ``row``; ``decode_inputs`` and ``take_inputs`` for one that reads no
        nested path)."""
        scope: dict[str, Any] = {
            "_keys": self._keys, "_of": self._of, "_groups": self._groups, "_key": self._key,
            "_enter": self._enter, "_extreme": _extreme, "get_path": get_path, "_put": _put,
            "_units": _units, "_leave": self._leave}
        if self.fields:
            inputs = msgspec.defstruct(
                "Inputs", [(f"f{i}", Any, None) for i in range(len(self.fields))],
                rename={f"f{i}": name for i, name in enumerate(self.fields)}, gc=False)
            scope |= {"_decode": msgspec.json.Decoder(inputs).decode,
                      "_slow": partial(_inputs_of, inputs, self.fields)}
        exec(compile(self.source, f"<aggregation {domain}>", "exec"), scope)
        self._add: Callable[[list[int | float | None], tuple[JSON, ...]], None] = scope["add"]
        self._take_out: Callable[[list[int | float | None], dict[str, tuple[JSON, ...]],
                                  tuple[JSON, ...]], None] = scope["take_out"]
        # the generated functions themselves, not methods calling them: one call less
        self.upsert_keys: Callable[[str, JSONObject],
                                   list[tuple[str, str, JSONObject | None]]] = scope["upsert"]
        """``upsert_keys(sow_key, record)``: :meth:`upsert` without making the rows of the
        groups that stay: ``publish`` entries carry None (read the row with :attr:`row` when
        it is needed, e.g. once after many changes); an ``oof`` carries the group's last
        row."""
        self.take_changes: Callable[[list[tuple[str, JSONObject | None]], set[str],
                                     Callable[[list[tuple[str, str, JSONObject | None]]], object]],
                                    None] = scope["take_changes"]
        """``take_changes(changes, dirty, changed)``: the changes ``[(sow_key, record or None
        for a removal), …]`` in order, as ``changed(upsert_keys(sow_key, record))`` (or
        ``changed(remove_keys(sow_key))``) for each would do, but with the group key of an
        update within a group added to the set ``dirty`` in place of a call of ``changed``
        (with ``[("publish", key, None)]``): one loop, no call per change (a deriver takes
        every change of its underlying topic)."""
        self.decode_inputs: Callable[[str | bytes], Any] | None = scope.get("decode_inputs")
        """``decode_inputs(data)``: of a record's JSON text, only the fields the projection
        reads (:attr:`fields`), as attributes ``f0``, ``f1``, … (None when missing), decoded
        as ``orjson.loads`` decodes them: ``msgspec`` skips the other fields, which took the
        decoding of ``bench_views.py``'s 15-field records from 5.3 to 1.9 µs per change
        (``plain_changes`` of the blocks). Raises ValueError (or RecursionError) for text
        that is no JSON object, as orjson does, but for one case: a number beyond a double's
        range (``1e400``) in a field the projection does not read, which orjson refuses and
        msgspec skips unchecked (no publisher writes one: it comes only from a client writing
        the change feed itself). None when the projection reads a nested path.
        :attr:`take_inputs` takes what it gives."""
        self.take_inputs: Callable[[list[tuple[str, Any]], set[str],
                                    Callable[[list[tuple[str, str, JSONObject | None]]], object]],
                                   None] | None = scope.get("take_inputs")
        """:attr:`take_changes` of changes whose records :attr:`decode_inputs` decoded."""
        self.row: Callable[[str], JSONObject] = scope["row"]
        """``row(key)``: the row of group ``key``, its grouping fields and aggregates (raises
        KeyError when no group has that key now)."""

    def upsert(self, sow_key: str, record: JSONObject) -> list[tuple[str, str, JSONObject]]:
        """Take a record's new version. Returns the changed rows as ``(kind, group key,
        row)``: ``publish`` for a group added or changed, ``oof`` (with its last row) for a
        group left empty (the record moved to another group)."""
        return self._filled(self.upsert_keys(sow_key, record))

    def _enter(self, sow_key: str, key: str, values: tuple[JSON, ...], inputs: tuple[JSON, ...],
               before: str | None) -> list[tuple[str, str, JSONObject | None]]:
        """A record new to group ``key`` (new, or leaving group ``before``): the generated
        ``upsert``'s path for all but an update within a group."""
        out = [] if before is None else self._leave(sow_key, before)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(values, list(self._initial))
        group.members[sow_key] = inputs
        self._add(group.state, inputs)
        self._of[sow_key] = key
        out.append(("publish", key, None))
        return out

    def _filled(self, changed: list[tuple[str, str, JSONObject | None]]
                ) -> list[tuple[str, str, JSONObject]]:
        return [(kind, key, self.row(key) if row is None else row) for kind, key, row in changed]

    def _key(self, values: tuple[JSON, ...]) -> str:
        """The group key (a generated SOW key) of grouping ``values``; remembered for values
        that are strings and integers (not booleans: ``True == 1``), at most 100,000."""
        simple = all(type(v) is str or type(v) is int for v in values)
        cached = values[0] if self._single else values
        key = self._keys.get(cached) if simple else None
        if key is None:
            key = generate(self.domain, [_text(v) for v in values])
            if simple:
                if len(self._keys) >= 100_000:
                    self._keys.clear()
                self._keys[cached] = key
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

    def _leave(self, sow_key: str, key: str) -> list[tuple[str, str, JSONObject | None]]:
        group = self._groups[key]
        if len(group.members) == 1:  # the group goes: its oof carries its last row
            row = self.row(key)
            del self._groups[key]
            return [("oof", key, row)]
        inputs = group.members.pop(sow_key)
        self._take_out(group.state, group.members, inputs)
        return [("publish", key, None)]


class _Code:
    """The source of an :class:`Aggregation`'s per-change functions, one block per input
    (distinct aggregate path) with a line per running total it feeds (``st[i]``: slot ``i``
    of the group's state):

    * ``upsert(sow_key, record)``: ``upsert_keys``; an update within the record's group in
      place (a number replaced by a number in one pass: a COUNT stays, a SUM moves by the
      difference, a MIN / MAX searches the members only when the value that held it got
      worse; any other change of a value as its removal after its addition), anything else
      by ``Aggregation._enter``;
    * ``take_changes(changes, dirty, changed)``: ``upsert``'s body in a loop over changes,
      an update within a group marked in ``dirty`` (``Aggregation.take_changes``);
    * ``decode_inputs(data)`` and ``take_inputs(changes, dirty, changed)``, for a projection
      of top-level fields: a record's fields as attributes, and ``take_changes`` of those;
    * ``add(st, inputs)`` / ``take_out(st, members, inputs)``: a member's input values counted
      in / taken out of the totals (``members`` no longer holding it: a MIN / MAX it held is
      found again among them);
    * ``row(key)``: the row of a group.
    """

    def __init__(self, agg: Aggregation) -> None:
        self.slots, self.spec, self.paths = agg._slots, agg.spec, agg._paths
        self.inputs = len(agg._paths)
        paths = [*agg.spec.grouping, *agg._paths]
        ngroups = len(agg.spec.grouping)
        reads = [self._read(p) for p in paths]
        self.groups = reads[:ngroups]
        body = reads[ngroups:]
        self.fields = agg.fields
        inputs = [f"record.f{self.fields.index(p[0])}" for p in paths] if self.fields else []
        self.source = "\n".join([
            "def upsert(sow_key, record):",
            *_indented(self._upsert(self.groups, body, agg._single, ["return _enter({})"],
                                    "return [('publish', key, None)]"), 1), "",
            *self._take("take_changes", self.groups, body, agg._single), "",
            *(self._take("take_inputs", inputs[:ngroups], inputs[ngroups:], agg._single)
              + ["", *self._decode(), ""] if self.fields else []),
            "def add(st, inputs):", f"    {self._unpack('v')} = inputs",
            *[line for j in range(self.inputs) for line in self._add(j, f"v{j}", 1)], "",
            "def take_out(st, members, inputs):", f"    {self._unpack('v')} = inputs",
            *[line for j in range(self.inputs) for line in self._take_out(j, f"v{j}", 1)], "",
            *self._row(), ""])

    def _take(self, name: str, groups: list[str], reads: list[str], single: bool) -> list[str]:
        """``take_changes`` (records read by ``groups`` and ``reads``, the expressions of the
        grouping values and inputs)."""
        return [f"def {name}(changes, dirty, changed):",
                "    mark = dirty.add",
                "    for sow_key, record in changes:",
                "        if record is None:",
                "            before = _of.pop(sow_key, None)",
                "            if before is not None:",
                "                changed(_leave(sow_key, before))",
                "            continue",
                *_indented(self._upsert(groups, reads, single,
                                        ["changed(_enter({}))", "continue"], "mark(key)"), 2)]

    def _decode(self) -> list[str]:
        """``decode_inputs(data)``: the fields the projection reads, by msgspec, falling back
        to orjson (``_slow``) for any value orjson might decode otherwise: text given as bytes
        (a MessagePack bin: msgspec does not check the UTF-8 of the fields it skips), an array
        or object (their integers), an integer beyond 64 bits (orjson makes it a float)."""
        lines = ["def decode_inputs(data):",
                 "    if type(data) is not str:",
                 "        return _slow(data)",
                 "    r = _decode(data)"]
        for i in range(len(self.fields)):
            lines += [f"    v = r.f{i}",
                      "    t = type(v)",
                      "    if t is dict or t is list or (t is int and not "
                      f"{_INT_MIN} <= v <= {_INT_MAX}):",
                      "        return _slow(data)"]
        return [*lines, "    return r"]

    @staticmethod
    def _read(path: tuple[str, ...]) -> str:
        """The expression of a record's value at ``path`` (None when missing)."""
        return f"record.get({path[0]!r})" if len(path) == 1 else f"get_path(record, {path!r})"

    def _unpack(self, prefix: str) -> str:
        return ", ".join(f"{prefix}{j}" for j in range(self.inputs)) + ","

    def _slot(self, measure: str, j: int) -> int | None:
        return self.slots.get((measure, j))

    def _units(self, j: int) -> str:
        """The start of a call of :func:`_units` for input ``j`` (the number and ``)`` to
        follow)."""
        slot = self._slot
        return f"u = _units(st, {slot('fsum', j)}, {slot('scale', j)}, {slot('factor', j)}, "

    def _upsert(self, group_reads: list[str], reads: list[str], single: bool,
                enter: list[str], done: str) -> list[str]:
        """The body of an upsert of ``record`` as ``sow_key`` (its grouping values and inputs
        read by the expressions ``group_reads`` and ``reads``): ``enter`` (its ``{}`` the
        arguments of ``_enter``) for all but an update within a group, ``done`` after one."""
        groups = [f"g{k}" for k in range(len(group_reads))]
        values = f"({', '.join(groups)},)"
        simple = " and ".join(f"(type({g}) is str or type({g}) is int)" for g in groups)
        lines = [f"{g} = {read}" for g, read in zip(groups, group_reads)]
        if single:  # the one grouping value is the cache's key: no tuple
            lines.append(f"key = _keys.get(g0) if {simple} else None")
        else:
            lines += [f"values = {values}",
                      f"key = _keys.get(values) if {simple} else None"]
        arguments = f"sow_key, key, {values if single else 'values'}, inputs, before"
        lines += ["if key is None:", f"    key = _key({values if single else 'values'})",
                  *[f"v{j} = {read}" for j, read in enumerate(reads)],
                  f"inputs = ({self._unpack('v')})",
                  "before = _of.get(sow_key)",
                  "if before != key:",
                  *_indented([line.format(arguments) for line in enter], 1),
                  "group = _groups[key]",
                  "members = group.members",
                  "old = members[sow_key]",
                  "members[sow_key] = inputs",
                  "st = group.state"]
        for j in range(self.inputs):
            lines += self._replace(j, f"v{j}", 0)
        lines.append(done)
        return lines

    def _replace(self, j: int, new: str, depth: int) -> list[str]:
        """Input ``j`` of a member replaced by ``new`` (``old[j]`` before)."""
        if all(measure == "count" for measure, at in self.slots if at == j):
            body = [f"o = old[{j}]",  # a COUNT only: whether it is null
                    "if o is None:",
                    f"    if {new} is not None:",
                    f"        st[{self._slot('count', j)}] += 1",
                    f"elif {new} is None:",
                    f"    st[{self._slot('count', j)}] -= 1"]
            return _indented(body, depth)
        body = [f"o = old[{j}]",
                "to = type(o)",
                f"if to is type({new}) and (to is float or to is int):  # the common case",
                f"    if o != {new}:",
                *self._same_type(j, new, 2),
                f"elif o is not {new} and (to is not type({new}) or o != {new}):",
                f"    tn = type({new})",
                "    if (to is int or to is float) and (tn is int or tn is float):",
                *self._numbers(j, new, 2),
                "    else:  # added first, so a beating MIN / MAX needs no search",
                *self._add(j, new, 2),
                *self._take_out(j, "o", 2)]
        return _indented(body, depth)

    def _same_type(self, j: int, n: str, depth: int) -> list[str]:
        """Input ``j``: the number ``o`` replaced by another number ``n`` of its type
        ``to``."""
        lines = []
        if (fs := self._slot("fsum", j)) is not None:
            lines += ["if to is float:  # _units' common case inline (inf is no integer)",
                      f"    f = st[{self._slot('factor', j)}]",
                      f"    a = {n} * f",
                      "    b = o * f",
                      "    if a.is_integer() and b.is_integer():",
                      f"        st[{fs}] += int(a) - int(b)",
                      "    else:  # finer units first (u first: _units may rescale the sum)",
                      f"        {self._units(j)}{n})",
                      f"        st[{fs}] += u",
                      f"        {self._units(j)}o)",
                      f"        st[{fs}] -= u",
                      "else:",
                      f"    st[{self._slot('isum', j)}] += {n} - o"]
        return _indented(lines + self._extremes(j, n), depth)

    def _numbers(self, j: int, n: str, depth: int) -> list[str]:
        """Input ``j``: the number ``o`` replaced by the number ``n`` of the other type (an
        int by a float or a float by an int)."""
        lines = []
        if (fs := self._slot("fsum", j)) is not None:
            si, fc = self._slot("isum", j), self._slot("floats", j)
            lines += ["if to is int:",
                      f"    st[{si}] -= o",
                      f"    {self._units(j)}{n})",
                      f"    st[{fs}] += u",
                      f"    st[{fc}] += 1",
                      "else:",
                      f"    {self._units(j)}o)",
                      f"    st[{fs}] -= u",
                      f"    st[{fc}] -= 1",
                      f"    st[{si}] += {n}"]
        return _indented(lines + self._extremes(j, n), depth)

    def _extremes(self, j: int, n: str) -> list[str]:
        """Input ``j``'s MIN / MAX after the number ``o`` was replaced by the number ``n`` (of
        another value): ``n`` when it beats the extreme, found again among the members when
        ``o`` held it (an equal value of another type did not)."""
        lines = []
        for measure, op, pick in _EXTREMES:
            if (at := self._slot(measure, j)) is not None:
                lines += [f"cur = st[{at}]",
                          f"if {n} {op} cur:",
                          f"    st[{at}] = {n}",
                          "elif o == cur and to is type(cur):",
                          f"    st[{at}] = {self._search(pick, j)}"]
        return lines or ["pass"]

    def _search(self, pick: str, j: int) -> str:
        return f"_extreme({pick}, members, {j}, st[{self._slot('num', j)}])"

    def _add(self, j: int, v: str, depth: int) -> list[str]:
        """Input ``j``'s value ``v`` counted in the totals."""
        return self._count(j, v, depth, "+=")

    def _take_out(self, j: int, v: str, depth: int) -> list[str]:
        """Input ``j``'s value ``v`` taken out of the totals."""
        return self._count(j, v, depth, "-=")

    def _count(self, j: int, v: str, depth: int, op: str) -> list[str]:
        lines = []
        if (at := self._slot("count", j)) is not None:
            lines.append(f"st[{at}] {op} 1")
        extremes = []
        for measure, cmp, pick in _EXTREMES:
            if (at := self._slot(measure, j)) is None:
                continue
            if op == "+=":
                extremes += [f"cur = st[{at}]",
                             f"if cur is None or {v} {cmp} cur:",
                             f"    st[{at}] = {v}"]
            else:  # it held the extreme: found again (an equal value of another type did not)
                extremes += [f"cur = st[{at}]",
                             f"if {v} == cur and t is type(cur):",
                             f"    st[{at}] = {self._search(pick, j)}"]
        # every input with a SUM, AVG, MIN or MAX counts its numbers (first: a search for
        # a MIN / MAX reads it)
        number = [f"    st[{self._slot('num', j)}] {op} 1", *_indented(extremes, 1)]
        if (fs := self._slot("fsum", j)) is not None:
            si, fc = self._slot("isum", j), self._slot("floats", j)
            lines += [f"t = type({v})",
                      "if t is int:",
                      f"    st[{si}] {op} {v}",
                      *number,
                      "elif t is float:",  # _units' common case inline
                      f"    a = {v} * st[{self._slot('factor', j)}]",
                      "    if a.is_integer():",
                      f"        st[{fs}] {op} int(a)",
                      "    else:  # u first: _units may rescale st[fs]",
                      f"        {self._units(j)}{v})",
                      f"        st[{fs}] {op} u",
                      f"    st[{fc}] {op} 1",
                      *number]
        elif extremes:
            lines += [f"t = type({v})", "if t is int or t is float:", *number]
        if not lines:
            return []
        return _indented([f"if {v} is not None:", *_indented(lines, 1)], depth)

    def _row(self) -> list[str]:
        items = [(path, f"values[{self.spec.grouping.index(path)}]")
                 for path in self.spec.fields]
        items += [(agg.name, self._value(agg)) for agg in self.spec.aggregates]
        lines = ["def row(key):", "    group = _groups[key]", "    st = group.state",
                 "    values = group.values"]
        if all(len(path) == 1 for path, _value in items):
            fields = ", ".join(f"{path[0]!r}: {value}" for path, value in items)
            return [*lines, f"    return {{{fields}}}"]
        return [*lines, "    row = {}", *[f"    _put(row, {path!r}, {value})"
                                          for path, value in items], "    return row"]

    def _value(self, agg: Aggregate) -> str:
        """The expression of an aggregate's value in a row (as exact as the totals: a SUM of
        floats rounded once, an integer SUM an integer, as JSON wrote them)."""
        j = self.paths.index(agg.path)
        if agg.function == "COUNT":
            return f"st[{self._slot('count', j)}]"
        if agg.function in ("MIN", "MAX"):
            return f"st[{self._slot(agg.function.lower(), j)}]"
        num, si = self._slot("num", j), self._slot("isum", j)
        fs, fc, sc = self._slot("fsum", j), self._slot("floats", j), self._slot("scale", j)
        # int / int is correctly rounded: the exact sum (or mean) rounded once
        total = f"(st[{fs}] + (st[{si}] << st[{sc}]))"
        if agg.function == "SUM":
            return (f"(None if st[{num}] == 0 else st[{si}] if st[{fc}] == 0 "
                    f"else {total} / (1 << st[{sc}]))")
        return (f"(None if st[{num}] == 0 else st[{si}] / st[{num}] if st[{fc}] == 0 "
                f"else {total} / (st[{num}] << st[{sc}]))")


def _inputs_of(inputs: type, fields: list[str], data: str | bytes) -> Any:
    """``decode_inputs``' way for what msgspec might decode otherwise: ``orjson.loads``,
    then the fields.

    Raises:
        ValueError: no JSON object.
    """
    record = orjson.loads(data)
    if type(record) is not dict:
        raise ValueError("not a JSON object")
    return inputs(*map(record.get, fields))


def _indented(lines: list[str], depth: int) -> list[str]:
    return ["    " * depth + line for line in lines]


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
