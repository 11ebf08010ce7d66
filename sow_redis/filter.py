"""AMPS-style content filters compiled to fast Python predicates.

A content filter is an expression in the AMPS expression language (AMPS User Guide,
"Content Filtering"), for example::

    /symbol = 'IBM' AND /qty * /price > 10000 AND /status NOT IN ('X', 'C')

:func:`compile_filter` parses the text once with a LALR parser (grammar in
``filter.lark``) and turns the tree into nested Python closures, so evaluating a
:class:`Filter` against a record does no parsing and no tree walking.

Semantics, in short:

* Field paths (``/a``, ``/a/b``, ``/55``, ``/items/0``) read a decoded JSON object with
  :func:`sow_redis.values.get_path`; a missing field or a JSON ``null`` is NULL.
* Three-valued logic as in SQL: TRUE, FALSE and UNKNOWN (``None``). A comparison, IN,
  BETWEEN, LIKE, arithmetic or function (except COALESCE) with a NULL operand is
  UNKNOWN/NULL; ``NOT UNKNOWN`` is UNKNOWN; ``UNKNOWN AND FALSE`` is FALSE;
  ``UNKNOWN OR TRUE`` is TRUE. A record matches only when the whole expression is TRUE,
  so a missing field matches neither ``/x = 1`` nor ``/x != 1``.
* Coercion: number vs string converts the string to a number (FIX topics hold every
  field as text), UNKNOWN if it does not parse; string vs string compares
  lexicographically; booleans equal only booleans, or the strings ``"true"``/``"false"``;
  any other mix of types (objects, arrays, bool vs number) is UNKNOWN.
* ``LIKE`` takes a regular expression (AMPS uses PCRE; here Python :mod:`re`) and
  searches anywhere in the text (unanchored) — use ``^``/``$`` to anchor.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable

from lark import Lark, Token, Transformer
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

from .errors import FilterSyntaxError
from .values import canonical, get_path, split_path

__all__ = ["Filter", "compile_filter"]

Evaluator = Callable[[Any], Any]
"""A compiled node: record → value (``None`` is NULL / UNKNOWN, ``True``/``False`` logic)."""


# --------------------------------------------------------------------------- values


_NUMERIC_TEXT = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*")


def _to_number(text: str) -> int | float | None:
    """Number written in ``text`` (``"42"``, ``"-1.5"``, ``"1e3"``), or None if it is not one."""
    if len(text) < 19 and text.isascii() and text.isdigit():
        return int(text)
    if _NUMERIC_TEXT.fullmatch(text) is None:
        return None
    try:
        return int(text)
    except ValueError:  # a fraction or exponent, or more digits than int() accepts
        return float(text)


def _as_number(value: Any) -> int | float | None:
    """``value`` as a number for arithmetic: numbers as-is, numeric strings parsed, else None."""
    t = type(value)
    if t is int or t is float:
        return value
    if t is str:
        return _to_number(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None


def _as_text(value: Any) -> str | None:
    """``value`` as text for LIKE and string functions: strings as-is, scalars canonical."""
    if type(value) is str:
        return value
    if value is None or isinstance(value, (dict, list)):
        return None
    return canonical(value)


_NUM, _STR, _BOOL, _OTHER = 0, 1, 2, 3


def _kind(value: Any) -> int:
    t = type(value)
    if t is int or t is float:
        return _NUM
    if t is str:
        return _STR
    if t is bool:
        return _BOOL
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, (int, float)):
        return _NUM
    if isinstance(value, str):
        return _STR
    return _OTHER


_COMPARE_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_FLIPPED = {"=": "=", "!=": "!=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_EQUALITY = (operator.eq, operator.ne)


def _compare(op: Callable[[Any, Any], bool], left: Any, right: Any) -> bool | None:
    """Three-valued comparison ``left op right`` with the filter language's coercions."""
    if left is None or right is None:
        return None
    kl, kr = _kind(left), _kind(right)
    if kl == kr:
        if kl == _NUM or kl == _STR:
            return op(left, right)
        if kl == _BOOL and op in _EQUALITY:
            return op(bool(left), bool(right))
        return None
    if kl == _NUM and kr == _STR:
        right = _to_number(right)
        return None if right is None else op(left, right)
    if kl == _STR and kr == _NUM:
        left = _to_number(left)
        return None if left is None else op(left, right)
    if op in _EQUALITY and {kl, kr} == {_BOOL, _STR}:
        return op(_as_text(left), _as_text(right))
    return None


def _and3(a: Any, b: Any) -> bool | None:
    if a is False or b is False:
        return False
    if a is True and b is True:
        return True
    return None


def _int_div(a: int, b: int) -> int | float:
    return a // b if a % b == 0 else a / b


def _c_mod(a: int | float, b: int | float) -> int | float:
    """Remainder with the sign of the dividend (C / SQL ``%``), not Python's floored one."""
    if type(a) is int and type(b) is int:
        r = abs(a) % abs(b)
        return -r if a < 0 else r
    return math.fmod(a, b)


_ARITH_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": lambda a, b: _int_div(a, b) if type(a) is int and type(b) is int else a / b,
    "%": _c_mod,
}


def _arith(fn: Callable[[Any, Any], Any], left: Any, right: Any) -> int | float | None:
    a = _as_number(left)
    if a is None:
        return None
    b = _as_number(right)
    if b is None:
        return None
    try:
        result = fn(a, b)
    except (ZeroDivisionError, OverflowError, ValueError):
        return None
    if result != result:  # NaN (inf - inf)
        return None
    return result


# ------------------------------------------------------------------------ functions


def _fn_upper(value: Any) -> str | None:
    text = _as_text(value)
    return None if text is None else text.upper()


def _fn_lower(value: Any) -> str | None:
    text = _as_text(value)
    return None if text is None else text.lower()


def _fn_len(value: Any) -> int | None:
    text = _as_text(value)
    return None if text is None else len(text)


def _fn_abs(value: Any) -> int | float | None:
    number = _as_number(value)
    return None if number is None else abs(number)


# name → (min args, max args or None, implementation taking the argument values)
_FUNCTIONS: dict[str, tuple[int, int | None, Callable[..., Any]]] = {
    "upper": (1, 1, _fn_upper),
    "lower": (1, 1, _fn_lower),
    "len": (1, 1, _fn_len),
    "abs": (1, 1, _fn_abs),
    "coalesce": (1, None, None),  # special-cased: lazy, first non-NULL argument
}


# ------------------------------------------------------------------------- compiler


@dataclass(slots=True)
class _Expr:
    """A compiled sub-expression plus what the compiler needs to know about it."""

    fn: Evaluator
    pos: int  # 0-based offset of its first character in the filter text
    const: bool = False  # value does not depend on the record
    value: Any = None  # the value when const
    literal: bool = False  # a literal as written (string, number, -number, true, false, NULL)
    raw: str | None = None  # a string literal's body with only quote escapes undone (for LIKE)
    path: str | None = None  # the path text when the expression is a field path
    key: str | None = None  # single-step path: the dict key, for a fast record.get()
    terms: dict[str, list[str]] | None = None  # equality terms of a pure conjunction
    chain: str | None = None  # "and" / "or" when fn evaluates the flat chain ``members``
    members: tuple[Evaluator, ...] = ()


def _constant(value: Any, pos: int, literal: bool = False, raw: str | None = None) -> _Expr:
    return _Expr(
        fn=lambda record: value, pos=pos, const=True, value=value, literal=literal, raw=raw
    )


def _folded(fn: Evaluator, pos: int, *children: _Expr) -> _Expr:
    """An expression node, evaluated right away when every child is a constant."""
    if all(child.const for child in children):
        return _constant(fn({}), pos)
    return _Expr(fn=fn, pos=pos)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0"}


def _unquote(token: str) -> tuple[str, str]:
    """Body of a quoted string literal: (value with escapes undone, regex form).

    The value undoes a doubled quote, ``\\n \\t \\r \\0``, and ``\\<char>`` → char for a
    quote or backslash; any other ``\\x`` is kept as written. The regex form (used for a
    LIKE pattern) undoes only the quote escapes, so ``'\\d+\\.'`` stays a valid regex.
    """
    quote, body = token[0], token[1:-1]
    value: list[str] = []
    regex: list[str] = []
    i, n = 0, len(body)
    while i < n:
        ch = body[i]
        if ch == "\\" and i + 1 < n:
            nxt = body[i + 1]
            if nxt in ("'", '"', "\\"):
                value.append(nxt)
            elif nxt in _ESCAPES:
                value.append(_ESCAPES[nxt])
            else:
                value.append(ch + nxt)
            regex.append(nxt if nxt == quote else ch + nxt)
            i += 2
        elif ch == quote:  # the lexer only lets a quote through doubled
            value.append(quote)
            regex.append(quote)
            i += 2
        else:
            value.append(ch)
            regex.append(ch)
            i += 1
    return "".join(value), "".join(regex)


def _merge_terms(a: dict[str, list[str]], b: dict[str, list[str]]) -> dict[str, list[str]]:
    merged = {path: list(values) for path, values in a.items()}
    for path, values in b.items():
        if path in merged:
            allowed = set(values)
            merged[path] = [v for v in merged[path] if v in allowed]
        else:
            merged[path] = list(values)
    return merged


def _error(text: str, pos: int, what: str) -> FilterSyntaxError:
    shown = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace('"', '\\"')
    return FilterSyntaxError(f'filter syntax error at column {pos + 1}: {what} in "{shown}"')


class _Compiler(Transformer):
    """Bottom-up: turns each parse-tree node into an :class:`_Expr` holding a closure."""

    def __init__(self, text: str):
        super().__init__(visit_tokens=False)
        self.text = text

    # -- atoms ----------------------------------------------------------------

    def string(self, children: list[Token]) -> _Expr:
        (tok,) = children
        value, raw = _unquote(str(tok))
        return _constant(value, tok.start_pos, literal=True, raw=raw)

    def number(self, children: list[Token]) -> _Expr:
        (tok,) = children
        text = str(tok)
        try:
            value: int | float = int(text) if text.isdigit() else float(text)
        except ValueError:  # more digits than int() accepts
            value = float(text)
        return _constant(value, tok.start_pos, literal=True)

    def true(self, children: list[Token]) -> _Expr:
        return _constant(True, children[0].start_pos, literal=True)

    def false(self, children: list[Token]) -> _Expr:
        return _constant(False, children[0].start_pos, literal=True)

    def null(self, children: list[Token]) -> _Expr:
        return _constant(None, children[0].start_pos, literal=True)

    def path(self, children: list[Token]) -> _Expr:
        (tok,) = children
        text = str(tok)
        parts = split_path(text)
        if len(parts) == 1:
            key = parts[0]

            def get(record: Any) -> Any:
                try:
                    return record.get(key)
                except AttributeError:
                    return get_path(record, parts)

            return _Expr(fn=get, pos=tok.start_pos, path=text, key=key)
        return _Expr(fn=lambda record: get_path(record, parts), pos=tok.start_pos, path=text)

    def func(self, children: list[Any]) -> _Expr:
        name_tok, args = children[0], children[1:]
        name = str(name_tok).lower()
        if name not in _FUNCTIONS:
            raise _error(self.text, name_tok.start_pos, f"unknown function {str(name_tok)!r}")
        lo, hi, impl = _FUNCTIONS[name]
        if len(args) < lo or (hi is not None and len(args) > hi):
            want = f"{lo}" if lo == hi else f"at least {lo}"
            plural = "" if lo == 1 else "s"
            raise _error(
                self.text,
                name_tok.start_pos,
                f"{name.upper()} takes {want} argument{plural}, got {len(args)}",
            )
        pos = name_tok.start_pos
        if name == "coalesce":
            fns = [a.fn for a in args]

            def coalesce(record: Any) -> Any:
                for f in fns:
                    value = f(record)
                    if value is not None:
                        return value
                return None

            return _folded(coalesce, pos, *args)
        (arg,) = args
        af = arg.fn
        assert impl is not None
        return _folded(lambda record: impl(af(record)), pos, arg)

    # -- arithmetic -----------------------------------------------------------

    def neg(self, children: list[Any]) -> _Expr:
        sign, arg = children
        af = arg.fn

        def negate(record: Any) -> Any:
            number = _as_number(af(record))
            return None if number is None else -number

        out = _folded(negate, sign.start_pos, arg)
        if arg.literal and type(arg.value) in (int, float):
            out.literal = True
        return out

    def pos(self, children: list[Any]) -> _Expr:
        sign, arg = children
        af = arg.fn
        out = _folded(lambda record: _as_number(af(record)), sign.start_pos, arg)
        if arg.literal and type(arg.value) in (int, float):
            out.literal = True
        return out

    def arith(self, children: list[Any]) -> _Expr:
        left, op_tok, right = children
        fn = _ARITH_OPS[str(op_tok)]
        lf, rf = left.fn, right.fn
        return _folded(lambda record: _arith(fn, lf(record), rf(record)), left.pos, left, right)

    # -- predicates -----------------------------------------------------------

    def compare(self, children: list[Any]) -> _Expr:
        left, op_tok, right = children
        op_text = str(op_tok)
        if left.const and not right.const:
            left, right, op_text = right, left, _FLIPPED[op_text]
        op = _COMPARE_OPS[op_text]
        if right.const and not left.const:
            out = _Expr(fn=_compare_const(left, op, right.value), pos=min(left.pos, right.pos))
        else:
            lf, rf = left.fn, right.fn
            out = _folded(
                lambda record: _compare(op, lf(record), rf(record)), left.pos, left, right
            )
        is_literal = right.literal and right.value is not None
        if op is operator.eq and left.path is not None and is_literal:
            out.terms = {left.path: [canonical(right.value)]}
        return out

    def is_null(self, children: list[Any]) -> _Expr:
        af = children[0].fn
        return _folded(lambda record: af(record) is None, children[0].pos, children[0])

    def is_not_null(self, children: list[Any]) -> _Expr:
        af = children[0].fn
        return _folded(lambda record: af(record) is not None, children[0].pos, children[0])

    def in_(self, children: list[Any]) -> _Expr:
        left, items = children[0], children[1:]
        out = _Expr(fn=_in_list(left, items), pos=left.pos)
        if all(item.const for item in items) and left.const:
            out = _constant(out.fn({}), left.pos)
        if left.path is not None and all(i.literal and i.value is not None for i in items):
            values: list[str] = []
            for item in items:
                text = canonical(item.value)
                if text not in values:
                    values.append(text)
            out.terms = {left.path: values}
        return out

    def not_in(self, children: list[Any]) -> _Expr:
        return self._negate(self.in_(children))

    def between(self, children: list[Any]) -> _Expr:
        value, lo, hi = children
        vf, lf, hf = value.fn, lo.fn, hi.fn
        ge, le = operator.ge, operator.le

        def between(record: Any) -> bool | None:
            v = vf(record)
            if v is None:
                return None
            return _and3(_compare(ge, v, lf(record)), _compare(le, v, hf(record)))

        return _folded(between, value.pos, value, lo, hi)

    def not_between(self, children: list[Any]) -> _Expr:
        return self._negate(self.between(children))

    def like(self, children: list[Any]) -> _Expr:
        value, pattern = children
        vf = value.fn
        if pattern.const:
            if pattern.value is None:
                return _folded(lambda record: None, value.pos, value, pattern)
            source = pattern.raw if pattern.raw is not None else _as_text(pattern.value)
            if source is None:
                raise _error(self.text, pattern.pos, "LIKE pattern must be a string")
            try:
                regex = re.compile(source)
            except re.error as exc:
                what = f"invalid LIKE regular expression ({exc})"
                raise _error(self.text, pattern.pos, what) from None
            search = regex.search

            def like_const(record: Any) -> bool | None:
                v = vf(record)
                if type(v) is not str:
                    v = _as_text(v)
                    if v is None:
                        return None
                return search(v) is not None

            return _folded(like_const, value.pos, value)
        pf = pattern.fn

        def like_dynamic(record: Any) -> bool | None:
            text, source = _as_text(vf(record)), _as_text(pf(record))
            if text is None or source is None:
                return None
            try:
                return re.search(source, text) is not None
            except re.error:
                return None

        return _folded(like_dynamic, value.pos, value, pattern)

    def not_like(self, children: list[Any]) -> _Expr:
        return self._negate(self.like(children))

    # -- logic ----------------------------------------------------------------

    def and_(self, children: list[Any]) -> _Expr:
        left, right = children
        out = self._chain("and", _and_all, left, right)
        if left.terms is not None and right.terms is not None:
            out.terms = _merge_terms(left.terms, right.terms)
        return out

    def or_(self, children: list[Any]) -> _Expr:
        return self._chain("or", _or_all, *children)

    def not_(self, children: list[Any]) -> _Expr:
        return self._negate(children[0])

    # -- helpers --------------------------------------------------------------

    @staticmethod
    def _chain(
        kind: str, build: Callable[[tuple[Evaluator, ...]], Evaluator], left: _Expr, right: _Expr
    ) -> _Expr:
        """AND / OR node; ``a AND b AND c`` becomes one flat chain rather than nested pairs."""
        members = tuple(
            member
            for side in (left, right)
            for member in (side.members if side.chain == kind else (side.fn,))
        )
        out = _folded(build(members), left.pos, left, right)
        if not out.const:
            out.chain, out.members = kind, members
        return out

    @staticmethod
    def _negate(arg: _Expr) -> _Expr:
        af = arg.fn

        def negate(record: Any) -> bool | None:
            value = af(record)
            if value is True:
                return False
            if value is False:
                return True
            return None

        return _folded(negate, arg.pos, arg)


def _and_all(fns: tuple[Evaluator, ...]) -> Evaluator:
    if len(fns) == 2:
        f, g = fns

        def and2(record: Any) -> bool | None:
            a = f(record)
            if a is False:
                return False
            b = g(record)
            if b is False:
                return False
            if a is True and b is True:
                return True
            return None

        return and2

    def and_n(record: Any) -> bool | None:
        result: bool | None = True
        for fn in fns:
            value = fn(record)
            if value is False:
                return False
            if value is not True:
                result = None
        return result

    return and_n


def _or_all(fns: tuple[Evaluator, ...]) -> Evaluator:
    if len(fns) == 2:
        f, g = fns

        def or2(record: Any) -> bool | None:
            a = f(record)
            if a is True:
                return True
            b = g(record)
            if b is True:
                return True
            if a is False and b is False:
                return False
            return None

        return or2

    def or_n(record: Any) -> bool | None:
        result: bool | None = False
        for fn in fns:
            value = fn(record)
            if value is True:
                return True
            if value is not False:
                result = None
        return result

    return or_n


def _compare_const(left: _Expr, op: Callable[[Any, Any], bool], const: Any) -> Evaluator:
    """Fast closure for ``<expression> op <constant>`` (the common ``/path = literal``)."""
    if const is None:
        return lambda record: None
    lf, key = left.fn, left.key
    kind = _kind(const)
    if kind == _NUM:
        if key is not None:

            def cmp_key_num(record: Any) -> bool | None:
                try:
                    v = record.get(key)
                except AttributeError:
                    v = lf(record)
                t = type(v)
                if t is int or t is float:
                    return op(v, const)
                if t is str:
                    n = _to_number(v)
                    return None if n is None else op(n, const)
                return _compare(op, v, const)

            return cmp_key_num

        def cmp_num(record: Any) -> bool | None:
            v = lf(record)
            t = type(v)
            if t is int or t is float:
                return op(v, const)
            return _compare(op, v, const)

        return cmp_num
    if kind == _STR:
        if key is not None:

            def cmp_key_str(record: Any) -> bool | None:
                try:
                    v = record.get(key)
                except AttributeError:
                    v = lf(record)
                if type(v) is str:
                    return op(v, const)
                return _compare(op, v, const)

            return cmp_key_str

        def cmp_str(record: Any) -> bool | None:
            v = lf(record)
            if type(v) is str:
                return op(v, const)
            return _compare(op, v, const)

        return cmp_str
    return lambda record: _compare(op, lf(record), const)


def _in_list(left: _Expr, items: list[_Expr]) -> Evaluator:
    """Closure for ``left IN (items…)``: TRUE on a match, else UNKNOWN if any NULL/UNKNOWN."""
    lf = left.fn
    eq = operator.eq
    if all(item.const for item in items):
        consts = [item.value for item in items]
        strs = frozenset(c for c in consts if type(c) is str)
        nums = frozenset(c for c in consts if type(c) in (int, float))
        only_strs = len(strs) == len(consts)
        only_nums = len(nums) == len(consts)

        def in_consts(record: Any) -> bool | None:
            v = lf(record)
            if v is None:
                return None
            t = type(v)
            if t is str and only_strs:
                return v in strs
            if (t is int or t is float) and only_nums:
                return v in nums
            result: bool | None = False
            for c in consts:
                r = _compare(eq, v, c)
                if r is True:
                    return True
                if r is None:
                    result = None
            return result

        return in_consts
    fns = [item.fn for item in items]

    def in_exprs(record: Any) -> bool | None:
        v = lf(record)
        if v is None:
            return None
        result: bool | None = False
        for fn in fns:
            r = _compare(eq, v, fn(record))
            if r is True:
                return True
            if r is None:
                result = None
        return result

    return in_exprs


# --------------------------------------------------------------------------- public


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    grammar = resources.files(__package__).joinpath("filter.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", lexer="contextual", maybe_placeholders=False)


class Filter:
    """A compiled content filter: call it with a record (a decoded JSON object).

    Attributes:
        text: the filter text it was compiled from.
    """

    __slots__ = ("text", "_fn", "_terms")

    def __init__(self, text: str, fn: Evaluator, terms: dict[str, list[str]] | None):
        self.text = text
        self._fn = fn
        self._terms = terms

    def __call__(self, record: dict) -> bool:
        """True only when the filter evaluates to TRUE for ``record`` (not FALSE or UNKNOWN)."""
        return self._fn(record) is True

    def evaluate(self, record: dict) -> bool | None:
        """Three-valued result for ``record``: True, False, or None for UNKNOWN."""
        value = self._fn(record)
        return value if value is True or value is False else None

    def equality_terms(self) -> dict[str, list[str]] | None:
        """Equality constraints when the filter is a pure conjunction of equalities.

        Returns ``{path: [canonical value, …]}`` when the whole filter is an AND chain
        whose every member is ``path = literal``, ``literal = path`` or
        ``path IN (literal, …)`` (a path named twice gets the intersection of its value
        lists); None otherwise. A record matching the filter has, at each path, a value
        that equals one of the listed ones under the filter's comparison rules; the
        query planner still re-checks the full filter.
        """
        if self._terms is None:
            return None
        return {path: list(values) for path, values in self._terms.items()}

    def __repr__(self) -> str:
        return f"Filter({self.text!r})"


@functools.lru_cache(maxsize=1024)
def compile_filter(text: str) -> Filter:
    """Parse and compile a content filter (cached: the same text returns the same Filter).

    Args:
        text: the filter, e.g. ``"/symbol = 'IBM' AND /qty > 100"``.

    Returns:
        A :class:`Filter`; calling it with a record returns True when the record matches.

    Raises:
        FilterSyntaxError: the text does not parse, a LIKE regular expression is invalid,
            a function is unknown or gets the wrong number of arguments. The message is
            one line naming the 1-based column.
    """
    if not isinstance(text, str):
        raise FilterSyntaxError(f"filter must be a string, got {type(text).__name__}")
    if not text.strip():
        raise _error(text, len(text), "empty filter")
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc) from None
    try:
        expr = _Compiler(text).transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, FilterSyntaxError):
            raise exc.orig_exc from None
        raise
    return Filter(text, expr.fn, expr.terms)


def _syntax_error(text: str, exc: UnexpectedInput) -> FilterSyntaxError:
    """One-line FilterSyntaxError for a lark parse exception."""
    if isinstance(exc, UnexpectedCharacters):
        return _error(text, exc.pos_in_stream, f"unexpected character {exc.char!r}")
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        history = getattr(exc, "token_history", None) or []
        last = history[-1] if history else None
        if last is not None and last.type == "FUNC_NAME" and str(tok) != "(":
            what = f"unexpected name {str(last)!r} (field paths start with '/')"
            return _error(text, last.start_pos or 0, what)
        if tok.type == "$END":
            return _error(text, len(text), "unexpected end of filter")
        return _error(text, tok.start_pos or 0, f"unexpected {str(tok)!r}")
    if isinstance(exc, UnexpectedEOF):
        return _error(text, len(text), "unexpected end of filter")
    pos = getattr(exc, "pos_in_stream", None) or 0
    return _error(text, pos, "invalid syntax")
