"""AMPS-style content filters compiled to fast Python predicates.

A content filter is an expression in the AMPS expression language (AMPS User Guide,
"Content Filtering"), for example::

    /symbol = 'IBM' AND /qty * /price > 10000 AND /status NOT IN ('X', 'C')

:func:`compile_filter` parses the text once with a LALR parser (grammar in
``filter.lark``) and turns the tree into nested Python closures, so evaluating a
:class:`Filter` against a record does no parsing and no tree walking.

Semantics, in short:

* Field paths (``/a``, ``/a/b``, ``/55``, ``/items/0``) read a decoded JSON object with
  :func:`sow_redis.model.values.get_path`; a missing field or a JSON ``null`` is NULL.
* Three-valued logic as in SQL: TRUE, FALSE and UNKNOWN (``None``). A comparison, IN,
  BETWEEN, LIKE, arithmetic or function (except COALESCE) with a NULL operand is
  UNKNOWN/NULL; ``NOT UNKNOWN`` is UNKNOWN; ``UNKNOWN AND FALSE`` is FALSE;
  ``UNKNOWN OR TRUE`` is TRUE. A record matches only when the whole expression is TRUE,
  so a missing field matches neither ``/x = 1`` nor ``/x != 1``.
* Coercion: number vs string converts the string to a number (FIX topics hold every
  field as text), UNKNOWN if it does not parse; string vs string compares
  lexicographically; booleans equal only booleans, or the strings ``"true"``/``"false"``;
  any other mix of types (objects, arrays, bool vs number) is UNKNOWN.
* Arrays: a comparison, ``IN``, ``LIKE``, ``BEGINS WITH`` or ``ENDS WITH`` on a field
  holding an array is TRUE when any element satisfies it (``/tags = 'y'`` matches
  ``["x", "y"]``; FIX repeating groups are stored as lists), UNKNOWN when no element does
  but one is UNKNOWN, else FALSE.
* Functions (AMPS User Guide, "AMPS Functions"; names case-insensitive; each is NULL when an
  argument is NULL or of the wrong type, except ``COALESCE``; positions are 1-based and
  texts count characters), each with an example that holds:

  - strings: ``CONCAT(/first, ' ', /last) = 'Ada Lovelace'``; ``UPPER(/ticker) IN ('MSFT',
    'IBM')`` and ``LOWER``; ``LENGTH('IBM.N') = 5`` (``LEN`` an alias);
    ``SUBSTR('fandango', 5) = 'ango'``, ``SUBSTR(text, start[, length])`` (a negative start
    counts from the end, 0 counts as 1, past either end ``''``);
    ``REVERSE(SUBSTR('fandango', 5)) == 'ogna'``; ``INSTR(/levels, 'critical') != 0`` (the
    position of the part, 0 when absent) and the case-insensitive ``INSTR_I``;
    ``STREQUAL_I(/code, 'QED') == 1`` (1 or 0); ``TRIM('  X1 ') = 'X1'``, ``LTRIM`` /
    ``RTRIM``, with a second argument the characters to strip (``LTRIM('0012', '0')``);
    ``REPLACE('IBM.N', '.N', '') = 'IBM'`` (every occurrence, literal text);
  - regular expressions (RE2, see ``LIKE`` below): ``REGEXP_MATCH(/sym, '^IB')``, the
    function form of ``/sym LIKE '^IB'``; ``REGEXP_REPLACE('IBM.N', '\\.[A-Z]+$', '') =
    'IBM'`` (every match; ``\\1`` … in the replacement name groups; NULL when the replacement
    names a group the pattern lacks);
  - numbers: ``ABS(-2.5) = 2.5``; ``ROUND(2.675, 2) = 2.68``, ``ROUND(n[, digits])`` half
    away from zero on the number's shortest decimal text (negative digits: tens, hundreds);
    ``CEILING(2.5) = 3`` (``CEIL``) and ``FLOOR(-1.2) = -2``; ``SQRT(9) = 3`` (NULL below 0);
    ``POWER(2, 10) = 1024`` (NULL on overflow or a non-real result); ``SIGN(-3) = -1``;
    ``GREATEST(/bid, /ask)`` and ``LEAST`` of numbers;
  - time: ``NOW() - /ts < 60`` — ``NOW()`` and AMPS's ``UNIX_TIMESTAMP()`` are the current
    time in seconds since the epoch (a float with microseconds), read each time the filter
    is evaluated (never folded into a constant: a subscription's ``NOW()`` moves on); a
    filter calling them is not :attr:`Filter.deterministic` (refused for sow_delete, views);
  - NULL: ``COALESCE(/bid, /last, 0) > 100`` (the first argument that is not NULL),
    ``/x IS NULL``, ``/x IS NOT NULL``.

  ``BEGINS WITH (…)`` and ``ENDS WITH (…)`` take one or more texts. ``==`` is ``=``.
  A call whose arguments are all constants is evaluated once, when compiling; a constant
  ``REGEXP_*`` pattern is compiled once, one read from a record once per distinct pattern.
* ``LIKE`` takes a regular expression and searches anywhere in the text (unanchored) —
  use ``^``/``$`` to anchor. AMPS uses PCRE syntax; here the pattern runs on RE2
  (``google-re2``), a linear-time engine: a search takes time proportional to the text
  whatever the pattern, so no pattern can stall a query or a worker. RE2 takes the usual
  PCRE syntax (classes, ``\\d \\w \\s \\b``, ``(?i)``, alternation, counted repetition,
  named groups) but not backreferences, lookaround, atomic groups or possessive
  quantifiers: such a pattern is a :class:`FilterSyntaxError` naming the construct.
* Nesting is bounded: more than :data:`MAX_DEPTH` levels (nested ``NOT``, parentheses,
  unary signs, function calls, operators inside one another) is a
  :class:`FilterSyntaxError`. Flat ``AND`` / ``OR`` chains and ``+ - * / %`` chains are one
  level whatever their length (compiled to n-ary nodes evaluated in a loop).
"""

from __future__ import annotations

import decimal
import functools
import math
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import ClassVar, Protocol, TypeAlias, cast

import re2
from lark import Lark, Token, Tree
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
)

from ..errors import FilterEvalError, FilterSyntaxError
from ..model.rangeindex import Bound, to_number
from ..model.values import JSON, JSONObject, canonical, get_path, split_path

__all__ = ["MAX_DEPTH", "MAX_FILTER_CHARS", "Filter", "check_deterministic", "compile_filter"]

MAX_DEPTH = 200
"""Deepest nesting a filter may have (levels of the parse tree; a flat AND / OR chain is one
level). Keeps compiling and evaluating far from Python's recursion limit."""

MAX_FILTER_CHARS = 131_072
"""Longest filter text in characters (128 Ki). Parsing takes about 8 µs per character
(a 5,000-term ``OR`` chain of 60,000 characters compiles in about 0.4 s), so a longer text
could hold a query or a subscriber for seconds; a sow_delete filter also travels in every
partition's log. Longer is a :class:`FilterSyntaxError` before anything is parsed."""

Evaluator: TypeAlias = Callable[[JSON], JSON]
"""A compiled node: record (a decoded JSON object) → value (a JSON value: ``None`` is NULL /
UNKNOWN, ``True``/``False`` logic)."""

Comparison: TypeAlias = Callable[[JSON, JSON], bool]
"""A comparison operator (``operator.eq``, …) applied to two non-NULL values."""

Arithmetic: TypeAlias = Callable[[float, float], float]
"""An arithmetic operator applied to two numbers (ints or floats)."""


# --------------------------------------------------------------------------- values


_to_number = to_number  # the one definition, shared with the range index's members


def _as_number(value: JSON) -> int | float | None:
    """``value`` as a number for arithmetic: numbers as-is, numeric strings parsed, else None."""
    t = type(value)
    if t is int or t is float:
        number: int | float = value  # typed: a test of ``t`` does not narrow ``value``
        return number
    if t is str:
        return _to_number(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None


def _as_text(value: JSON) -> str | None:
    """``value`` as text for LIKE and string functions: strings as-is, scalars canonical."""
    if type(value) is str:
        return value
    if value is None or isinstance(value, (dict, list)):
        return None
    return canonical(value)


_NUM, _STR, _BOOL, _OTHER = 0, 1, 2, 3


def _kind(value: object) -> int:
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


_COMPARE_OPS: dict[str, Comparison] = {
    "=": operator.eq,
    "==": operator.eq,
    "!=": operator.ne,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_FLIPPED = {"=": "=", "==": "==", "!=": "!=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_EQUALITY = (operator.eq, operator.ne)


def _compare(op: Comparison, left: JSON, right: JSON) -> bool | None:
    """Three-valued comparison ``left op right`` with the filter language's coercions; an
    array on either side compares element by element (TRUE when any element does)."""
    if left is None or right is None:
        return None
    if type(left) is list:
        return _any(left, lambda item: _compare(op, item, right))
    if type(right) is list:
        return _any(right, lambda item: _compare(op, left, item))
    kl, kr = _kind(left), _kind(right)
    if kl == kr:
        if kl in (_NUM, _STR):
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


def _any(items: list[JSON], test: Callable[[JSON], bool | None]) -> bool | None:
    """Three-valued ANY over an array's elements: TRUE when a test is TRUE, else UNKNOWN when
    one is UNKNOWN, else FALSE (an empty array: FALSE)."""
    result: bool | None = False
    for item in items:
        r = test(item)
        if r is True:
            return True
        if r is None:
            result = None
    return result


def _and3(a: object, b: object) -> bool | None:
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


_ARITH_OPS: dict[str, Arithmetic] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": lambda a, b: _int_div(a, b) if type(a) is int and type(b) is int else a / b,
    "%": _c_mod,
}


def _arith(fn: Arithmetic, left: JSON, right: JSON) -> int | float | None:
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
#
# Every function here but COALESCE, NOW and UNIX_TIMESTAMP is NULL when an argument is NULL
# (the caller checks, see _Compiler.func), and NULL when an argument has the wrong type (an
# object or array where a text or number is wanted, text that is no number where a number is
# wanted). Texts count characters (Unicode code points); positions are 1-based as in AMPS.


def _fn_upper(value: JSON) -> str | None:
    text = _as_text(value)
    return None if text is None else text.upper()


def _fn_lower(value: JSON) -> str | None:
    text = _as_text(value)
    return None if text is None else text.lower()


def _fn_length(value: JSON) -> int | None:
    text = _as_text(value)
    return None if text is None else len(text)


def _fn_reverse(value: JSON) -> str | None:
    text = _as_text(value)
    return None if text is None else text[::-1]


def _fn_abs(value: JSON) -> int | float | None:
    number = _as_number(value)
    return None if number is None else abs(number)


def _integral(fn: Callable[[float], int]) -> Callable[[JSON], int | None]:
    """CEILING / FLOOR: the whole number as an int (NULL for infinity or not a number)."""

    def whole(value: JSON) -> int | None:
        number = _as_number(value)
        if number is None or type(number) is int:
            return number
        try:
            return fn(number)
        except (OverflowError, ValueError):  # inf, nan
            return None

    return whole


def _fn_sqrt(value: JSON) -> float | None:
    number = _as_number(value)
    if number is None or number < 0 or number != number:
        return None
    try:
        return math.sqrt(number)
    except OverflowError:  # an int too large for a float
        return None


def _fn_sign(value: JSON) -> int | None:
    number = _as_number(value)
    if number is None or number != number:
        return None
    return (number > 0) - (number < 0)


def _fn_concat(values: list[JSON]) -> str | None:
    texts = [_as_text(v) for v in values]
    return None if any(x is None for x in texts) else "".join(x for x in texts if x is not None)


def _fn_instr(values: list[JSON]) -> int | None:
    text, search = _as_text(values[0]), _as_text(values[1])
    return None if text is None or search is None else text.find(search) + 1


def _fn_instr_i(values: list[JSON]) -> int | None:
    text, search = _as_text(values[0]), _as_text(values[1])
    if text is None or search is None:
        return None
    return text.casefold().find(search.casefold()) + 1


def _fn_strequal_i(values: list[JSON]) -> int | None:
    a, b = _as_text(values[0]), _as_text(values[1])
    return None if a is None or b is None else int(a.casefold() == b.casefold())


def _whole(value: JSON) -> int | None:
    """A position or count argument: a number (or numeric text) truncated toward zero."""
    number = _as_number(value)
    if number is None or type(number) is int:
        return number
    if number != number or number in (math.inf, -math.inf):
        return None
    return int(number)


def _fn_substr(values: list[JSON]) -> str | None:
    """``SUBSTR(text, start[, length])``: from the 1-based ``start`` (a negative start counts
    from the end, 0 counts as 1), ``length`` characters or to the end; ``''`` when the start
    is past either end or the length is below 1."""
    text, start = _as_text(values[0]), _whole(values[1])
    if text is None or start is None:
        return None
    count = _whole(values[2]) if len(values) > 2 else len(text)
    if count is None:
        return None
    begin = start - 1 if start > 0 else (0 if start == 0 else len(text) + start)
    if count < 1 or begin < 0 or begin >= len(text):
        return ""
    return text[begin:begin + count]


def _fn_replace(values: list[JSON]) -> str | None:
    text, search, by = (_as_text(v) for v in values)
    if text is None or search is None or by is None:
        return None
    return text.replace(search, by) if search else text


def _trim(method: Callable[[str, str | None], str]) -> Callable[[list[JSON]], str | None]:
    """TRIM / LTRIM / RTRIM: white space, or any of the characters of the second argument."""

    def trim(values: list[JSON]) -> str | None:
        text = _as_text(values[0])
        chars = _as_text(values[1]) if len(values) > 1 else None
        if text is None or (len(values) > 1 and chars is None):
            return None
        return method(text, chars)

    return trim


def _fn_round(values: list[JSON]) -> int | float | None:
    """``ROUND(n[, digits])``: half away from zero (as C ``round``, not Python's half-even) on
    the shortest decimal text of ``n``; ``digits`` below 0 rounds to tens, hundreds, …"""
    number = _as_number(values[0])
    digits = _whole(values[1]) if len(values) > 1 else 0
    if number is None or digits is None or number != number:
        return None
    if number in (math.inf, -math.inf):
        return None
    if (type(number) is int and digits >= 0) or digits > 340:  # beyond a double's digits
        return number
    if digits < -400:
        return 0
    exact = decimal.Decimal(repr(number)).quantize(
        decimal.Decimal(1).scaleb(-digits), rounding=decimal.ROUND_HALF_UP,
        context=_DECIMALS)
    return int(exact) if digits <= 0 else float(exact)


_DECIMALS = decimal.Context(prec=1000, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)


def _fn_power(values: list[JSON]) -> int | float | None:
    """``POWER(base, exponent)``: exact for an int base and an int exponent 0..64, else a
    float; NULL when the result overflows or is not a real number."""
    base, exp = _as_number(values[0]), _as_number(values[1])
    if base is None or exp is None:
        return None
    if type(base) is int and type(exp) is int and 0 <= exp <= 64:
        exact: int = base ** exp
        return exact
    try:
        result = math.pow(base, exp)
    except (OverflowError, ValueError, ZeroDivisionError):
        return None
    return None if result != result or result in (math.inf, -math.inf) else result


def _extreme(pick: Callable[[list[int | float]], int | float]
             ) -> Callable[[list[JSON]], int | float | None]:
    """GREATEST / LEAST of numbers (numeric text read as a number; NULL if any is none)."""

    def extreme(values: list[JSON]) -> int | float | None:
        numbers = [_as_number(v) for v in values]
        if any(n is None or n != n for n in numbers):
            return None
        return pick([n for n in numbers if n is not None])

    return extreme


_UNARY: dict[str, Callable[[JSON], JSON]] = {
    "upper": _fn_upper,
    "lower": _fn_lower,
    "length": _fn_length,
    "len": _fn_length,
    "reverse": _fn_reverse,
    "abs": _fn_abs,
    "ceiling": _integral(math.ceil),
    "ceil": _integral(math.ceil),
    "floor": _integral(math.floor),
    "sqrt": _fn_sqrt,
    "sign": _fn_sign,
}
"""Functions of one argument (NULL in, NULL out)."""

_NARY: dict[str, Callable[[list[JSON]], JSON]] = {
    "concat": _fn_concat,
    "instr": _fn_instr,
    "instr_i": _fn_instr_i,
    "strequal_i": _fn_strequal_i,
    "substr": _fn_substr,
    "replace": _fn_replace,
    "trim": _trim(str.strip),
    "ltrim": _trim(str.lstrip),
    "rtrim": _trim(str.rstrip),
    "round": _fn_round,
    "power": _fn_power,
    "greatest": _extreme(max),
    "least": _extreme(min),
}
"""Functions of several arguments: NULL when any argument is NULL, else the function of the
argument values (a list)."""

_ARITY: dict[str, tuple[int, int | None]] = {
    **{name: (1, 1) for name in _UNARY},
    "concat": (2, None), "instr": (2, 2), "instr_i": (2, 2), "strequal_i": (2, 2),
    "substr": (2, 3), "replace": (3, 3), "trim": (1, 2), "ltrim": (1, 2), "rtrim": (1, 2),
    "round": (1, 2), "power": (2, 2), "greatest": (1, None), "least": (1, None),
    # built by _Compiler methods (lazy, evaluated per record, or compiling a pattern once)
    "coalesce": (1, None), "now": (0, 0), "unix_timestamp": (0, 0),
    "regexp_match": (2, 2), "regexp_replace": (3, 3),
}
"""Every function name (lower case) → (fewest arguments, most or None for any number)."""


# ----------------------------------------------------------------------------- LIKE


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is a FilterSyntaxError, not a log line on stderr
_RE2_OPTIONS.never_capture = True  # LIKE only asks "is there a match": no group extraction

# RE2 error texts for PCRE constructs it leaves out on purpose (they need backtracking).
_UNSUPPORTED_GROUPS = {
    "(?=": "a lookahead (?=...)",
    "(?!": "a negative lookahead (?!...)",
    "(?<=": "a lookbehind (?<=...)",
    "(?<!": "a negative lookbehind (?<!...)",
    "(?>": "an atomic group (?>...)",
    "(?P": "a named backreference or subroutine (?P=name) / (?P>name)",
    "(?(": "a conditional (?(...)...)",
    "(?R": "a recursive pattern (?R)",
    "(?|": "a branch reset group (?|...)",
    "(?#": "a comment group (?#...)",
}
_UNSUPPORTED_NOTE = (
    "LIKE runs on RE2, a linear-time engine without backreferences, lookaround, atomic "
    "groups or possessive quantifiers"
)


def _like_error_what(message: str) -> str:
    """What to say about a pattern RE2 rejected (``message`` is RE2's error text)."""
    prefix, _, arg = message.partition(": ")
    if prefix == "invalid perl operator":
        construct = _UNSUPPORTED_GROUPS.get(arg)
        if construct is None and arg[2:3].isdigit():
            construct = "a subroutine call (?N)"
        if construct is not None:
            return f"LIKE pattern uses {construct}, which is not supported ({_UNSUPPORTED_NOTE})"
    if prefix == "invalid escape sequence" and len(arg) == 2:
        if arg[1] in "123456789kg":
            construct = f"a backreference {arg}"
        elif arg[1] == "Z":
            construct = "\\Z (use \\z or $ for the end of the text)"
        else:
            construct = f"the escape {arg}"
        return f"LIKE pattern uses {construct}, which is not supported ({_UNSUPPORTED_NOTE})"
    if prefix == "bad repetition operator" and len(arg) >= 2 and arg[-1] == "+" and (
        arg[-2] in "*+?}"
    ):
        return (
            f"LIKE pattern uses a possessive quantifier {arg}, which is not supported "
            f"({_UNSUPPORTED_NOTE})"
        )
    return f"invalid LIKE regular expression ({message})"


class _Regex(Protocol):
    """What LIKE uses of a compiled RE2 pattern (google-re2 ships no type information)."""

    def search(self, text: str) -> object:
        """The first match in ``text``, or None."""


def _re2_compile(source: str) -> _Regex:
    """Compile ``source`` with RE2. Raises ValueError(what) with a one-line description."""
    try:
        regex: _Regex = re2.compile(source, _RE2_OPTIONS)
    except re2.error as exc:
        raise ValueError(_re2_error_what(exc)) from None
    return regex


def _re2_error_what(exc: re2.error) -> str:
    """RE2's complaint about a pattern, as one line (see :func:`_like_error_what`)."""
    raw = exc.args[0] if exc.args else "invalid pattern"
    message = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    return _like_error_what(message.replace("\n", " "))


_UNANCHORED = getattr(getattr(re2, "_Anchor", None), "UNANCHORED", None)


def _searcher(regex: _Regex) -> Callable[[str], bool]:
    """``text → bool``: does ``regex`` match anywhere in the text (time linear in its length).

    Calls the compiled RE2 object directly (one UTF-8 encode, no span bookkeeping: about
    0.5 µs a search against 1.3–2.6 µs through ``regex.search``); falls back to the public
    ``search`` if a google-re2 release no longer has that object.
    """
    low = getattr(regex, "_regexp", None)
    # (anchor, UTF-8 text, start, end) → spans of the match and its groups, (-1, -1) for none
    match: Callable[[object, bytes, int, int], list[tuple[int, int]]] | None = getattr(
        low, "Match", None)
    if match is None or _UNANCHORED is None:
        search = regex.search
        return lambda text: search(text) is not None

    def found(text: str) -> bool:
        data = text.encode("utf-8", "surrogatepass")
        return match(_UNANCHORED, data, 0, len(data))[0][0] >= 0

    return found


@functools.lru_cache(maxsize=256)
def _dynamic_searcher(source: str) -> Callable[[str], bool] | None:
    """Searcher for a pattern read from a record (``/s LIKE /p``); None if it is invalid."""
    try:
        return _searcher(_re2_compile(source))
    except ValueError:
        return None


_REPLACE_OPTIONS = re2.Options()
_REPLACE_OPTIONS.log_errors = False  # REGEXP_REPLACE keeps groups: \\1 in the replacement

_MAX_REPLACED_CHARS = 64 * 1024 * 1024
"""REGEXP_REPLACE is NULL when its result could exceed this many characters (text length + 1
times the replacement's length: an empty-matching pattern replaces at every position)."""


class _Replacer(Protocol):
    """What REGEXP_REPLACE uses of a compiled RE2 pattern."""

    def sub(self, repl: str, text: str) -> str:
        """``text`` with every match replaced by ``repl`` (``\\1`` … name groups)."""


def _re2_replacer(source: str) -> _Replacer:
    """Compile a REGEXP_REPLACE pattern. Raises ValueError(what) as :func:`_re2_compile`."""
    try:
        regex: _Replacer = re2.compile(source, _REPLACE_OPTIONS)
    except re2.error as exc:
        raise ValueError(_re2_error_what(exc).replace("LIKE", "REGEXP_REPLACE")) from None
    return regex


@functools.lru_cache(maxsize=256)
def _dynamic_replacer(source: str) -> _Replacer | None:
    """Replacer for a pattern read from a record; None if it is invalid."""
    try:
        return _re2_replacer(source)
    except ValueError:
        return None


def _substitute(regex: _Replacer, repl: str, text: str) -> str | None:
    """``regex.sub(repl, text)``; NULL for a replacement naming a missing group, or a result
    that could be longer than :data:`_MAX_REPLACED_CHARS`."""
    if (len(text) + 1) * max(len(repl), 1) > _MAX_REPLACED_CHARS:
        return None
    try:
        return regex.sub(repl, text)
    except (re2.error, ValueError, IndexError):
        return None


def _nary_call(impl: Callable[[list[JSON]], JSON], pos: int, args: list[_Expr]) -> _Expr:
    """A call of a :data:`_NARY` function: NULL as soon as an argument is NULL, else
    ``impl`` of the argument values; folded to a constant when every argument is one."""
    afs = tuple(a.fn for a in args)
    if len(afs) == 2:
        f, g = afs

        def call2(record: JSON) -> JSON:
            a = f(record)
            if a is None:
                return None
            b = g(record)
            return None if b is None else impl([a, b])

        return _folded(call2, pos, *args)

    def call_n(record: JSON) -> JSON:
        values = [f(record) for f in afs]
        for value in values:
            if value is None:
                return None
        return impl(values)

    return _folded(call_n, pos, *args)


# ------------------------------------------------------------------------- compiler


@dataclass(slots=True)
class _Expr:
    """A compiled sub-expression plus what the compiler needs to know about it."""

    fn: Evaluator
    pos: int  # 0-based offset of its first character in the filter text
    const: bool = False  # value does not depend on the record
    value: JSON = None  # the value when const
    literal: bool = False  # a literal as written (string, number, -number, true, false, NULL)
    raw: str | None = None  # a string literal's body with only quote escapes undone (for LIKE)
    path: str | None = None  # the path text when the expression is a field path
    key: str | None = None  # single-step path: the dict key, for a fast record.get()
    terms: dict[str, list[str]] | None = None  # equality terms of a pure conjunction
    ranges: tuple[tuple[str, Bound], ...] = ()  # (path, bound) a TRUE result implies
    chain: str | None = None  # "and" / "or" when fn evaluates the flat chain ``members``
    members: tuple[Evaluator, ...] = ()


def _constant(value: JSON, pos: int, literal: bool = False, raw: str | None = None) -> _Expr:
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


def _merge_terms(parts: list[dict[str, list[str]]]) -> dict[str, list[str]]:
    """Equality terms of a conjunction of ``parts``: a path named in several parts keeps the
    values common to all of them (linear in the total number of terms)."""
    merged: dict[str, list[str]] = {}
    for part in parts:
        for path, values in part.items():
            if path in merged:
                allowed = set(values)
                merged[path] = [v for v in merged[path] if v in allowed]
            else:
                merged[path] = list(values)
    return merged


_SHOWN_MAX = 200
"""Longest filter text a nesting or evaluation error quotes whole (such filters tend to be
machine-made and long: longer ones are cut in the middle)."""


def _shown(text: str, cut: bool = False) -> str:
    """``text`` for quoting on one line of an error message: escapes backslashes, line
    breaks and double quotes; with ``cut``, a text longer than _SHOWN_MAX characters keeps
    only its start and end around ``…``."""
    if cut and len(text) > _SHOWN_MAX:
        half = _SHOWN_MAX // 2
        text = f"{text[:half]} … {text[-half:]}"
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace('"', '\\"')


def _error(text: str, pos: int, what: str) -> FilterSyntaxError:
    return FilterSyntaxError(f'filter syntax error at column {pos + 1}: {what} in "{_shown(text)}"')


_Rule: TypeAlias = Callable[[list[Token], list[_Expr]], _Expr]
"""A rule method of :class:`_Compiler`: (the node's kept tokens, its compiled sub-expressions),
each in order → the node's expression."""


class _Compiler:
    """Bottom-up: turns each parse-tree node into an :class:`_Expr` holding a closure.

    :meth:`compile` walks the tree with an explicit stack (no recursion); each rule method
    (named as the grammar's rule) gets the node's kept tokens (operators, literals, names) and
    its already compiled sub-expressions, each in order.
    """

    def __init__(self, text: str) -> None:
        self.text = text

    def compile(self, tree: Tree[Token]) -> _Expr:
        """Compile a parse tree (nesting already checked by :func:`_check_depth`)."""
        done: list[_Expr] = []  # compiled sub-expressions, in order
        todo: list[tuple[Tree[Token], bool]] = [(tree, False)]
        while todo:
            node, children_done = todo.pop()
            if children_done:
                tokens = [child for child in node.children if isinstance(child, Token)]
                n = len(node.children) - len(tokens)
                exprs = done[len(done) - n:]
                del done[len(done) - n:]
                rule: _Rule = getattr(self, str(node.data))
                done.append(rule(tokens, exprs))
            else:
                todo.append((node, True))
                todo.extend((child, False) for child in reversed(node.children)
                            if isinstance(child, Tree))
        (expr,) = done
        return expr

    def group(self, _tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        """Parentheses: the inner expression (kept as a node only to count nesting)."""
        return exprs[0]

    # -- atoms ----------------------------------------------------------------

    def string(self, tokens: list[Token], _exprs: list[_Expr]) -> _Expr:
        (tok,) = tokens
        value, raw = _unquote(str(tok))
        return _constant(value, (tok.start_pos or 0), literal=True, raw=raw)

    def number(self, tokens: list[Token], _exprs: list[_Expr]) -> _Expr:
        (tok,) = tokens
        text = str(tok)
        try:
            value: int | float = int(text) if text.isdigit() else float(text)
        except ValueError:  # more digits than int() accepts
            value = float(text)
        return _constant(value, (tok.start_pos or 0), literal=True)

    def true(self, tokens: list[Token], _exprs: list[_Expr]) -> _Expr:
        return _constant(True, (tokens[0].start_pos or 0), literal=True)

    def false(self, tokens: list[Token], _exprs: list[_Expr]) -> _Expr:
        return _constant(False, (tokens[0].start_pos or 0), literal=True)

    def null(self, tokens: list[Token], _exprs: list[_Expr]) -> _Expr:
        return _constant(None, (tokens[0].start_pos or 0), literal=True)

    def path(self, tokens: list[Token], _exprs: list[_Expr]) -> _Expr:
        (tok,) = tokens
        text = str(tok)
        parts = split_path(text)
        if len(parts) == 1:
            key = parts[0]

            def get(record: JSON) -> JSON:
                try:
                    return record.get(key)
                except AttributeError:
                    return get_path(record, parts)

            return _Expr(fn=get, pos=(tok.start_pos or 0), path=text, key=key)
        return _Expr(fn=lambda record: get_path(record, parts), pos=(tok.start_pos or 0), path=text)

    def func(self, tokens: list[Token], args: list[_Expr]) -> _Expr:
        (name_tok,) = tokens
        name = str(name_tok).lower()
        pos = name_tok.start_pos or 0
        if name not in _ARITY:
            raise _error(self.text, pos, f"unknown function {str(name_tok)!r}")
        lo, hi = _ARITY[name]
        if len(args) < lo or (hi is not None and len(args) > hi):
            want = (f"{lo}" if lo == hi else f"at least {lo}" if hi is None
                    else f"{lo} to {hi}")
            plural = "" if want in ("1", "at least 1") else "s"
            raise _error(self.text, pos,
                         f"{name.upper()} takes {want} argument{plural}, got {len(args)}")
        special = self._SPECIAL.get(name)
        if special is not None:
            return special(self, pos, args)
        if name in _NARY:
            return _nary_call(_NARY[name], pos, args)
        (arg,) = args
        af, impl = arg.fn, _UNARY[name]
        return _folded(lambda record: impl(af(record)), pos, arg)

    def _coalesce(self, pos: int, args: list[_Expr]) -> _Expr:
        """``COALESCE(a, b, …)``: the first argument that is not NULL (lazy), else NULL."""
        fns = [a.fn for a in args]

        def coalesce(record: JSON) -> JSON:
            for f in fns:
                value = f(record)
                if value is not None:
                    return value
            return None

        return _folded(coalesce, pos, *args)

    def _now(self, pos: int, _args: list[_Expr]) -> _Expr:
        """``NOW()`` / ``UNIX_TIMESTAMP()``: the current time in seconds since the epoch (a
        float, microseconds), read each time the filter is evaluated: never a constant."""
        clock = time.time
        return _Expr(fn=lambda record: clock(), pos=pos)

    def _regexp_match(self, pos: int, args: list[_Expr]) -> _Expr:
        """``REGEXP_MATCH(text, pattern)``: the function form of ``text LIKE pattern``."""
        return self.like([], args)

    def _regexp_replace(self, pos: int, args: list[_Expr]) -> _Expr:
        """``REGEXP_REPLACE(text, pattern, replacement)``: every match of the RE2 pattern
        replaced (``\\1`` … in the replacement name groups); a constant pattern is compiled
        once, one read from a record per distinct text (cached)."""
        value, pattern, by = args
        if pattern.const:
            if pattern.value is None:
                return _folded(lambda record: None, pos, *args)
            source = pattern.raw if pattern.raw is not None else _as_text(pattern.value)
            if source is None:
                raise _error(self.text, pattern.pos, "REGEXP_REPLACE pattern must be a string")
            try:
                regex = _re2_replacer(source)
            except ValueError as exc:
                raise _error(self.text, pattern.pos, str(exc)) from None
            vf, bf = value.fn, by.fn
            found = _searcher(cast("_Regex", regex))  # no match (common): no substitution

            def replace_const(record: JSON) -> str | None:
                text, repl = _as_text(vf(record)), _as_text(bf(record))
                if text is None or repl is None:
                    return None
                return _substitute(regex, repl, text) if found(text) else text

            return _folded(replace_const, pos, value, by)
        vf, pf, bf = value.fn, pattern.fn, by.fn

        def replace_dynamic(record: JSON) -> str | None:
            text, source, repl = _as_text(vf(record)), _as_text(pf(record)), _as_text(bf(record))
            if text is None or source is None or repl is None:
                return None
            regex = _dynamic_replacer(source)
            return None if regex is None else _substitute(regex, repl, text)

        return _folded(replace_dynamic, pos, *args)

    _SPECIAL: ClassVar[dict[str, Callable[[_Compiler, int, list[_Expr]], _Expr]]] = {
        "coalesce": _coalesce, "now": _now, "unix_timestamp": _now,
        "regexp_match": _regexp_match, "regexp_replace": _regexp_replace,
    }

    # -- arithmetic -----------------------------------------------------------

    def neg(self, tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        (sign,), (arg,) = tokens, exprs
        af = arg.fn

        def negate(record: JSON) -> int | float | None:
            number = _as_number(af(record))
            return None if number is None else -number

        out = _folded(negate, sign.start_pos or 0, arg)
        if arg.literal and type(arg.value) in (int, float):
            out.literal = True
        return out

    def pos(self, tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        (sign,), (arg,) = tokens, exprs
        af = arg.fn
        out = _folded(lambda record: _as_number(af(record)), sign.start_pos or 0, arg)
        if arg.literal and type(arg.value) in (int, float):
            out.literal = True
        return out

    def arith(self, operators: list[Token], operands: list[_Expr]) -> _Expr:
        """``a op b op c …`` (flat, same precedence): evaluated left to right."""
        first = operands[0].fn
        steps = tuple(
            (_ARITH_OPS[str(op_tok)], operand.fn)
            for op_tok, operand in zip(operators, operands[1:])
        )
        if len(steps) == 1:
            ((fn, rf),) = steps

            def arith2(record: JSON) -> int | float | None:
                return _arith(fn, first(record), rf(record))

            return _folded(arith2, operands[0].pos, *operands)

        def arith_n(record: JSON) -> JSON:
            value = first(record)
            for fn, rf in steps:
                if value is None:
                    return None
                value = _arith(fn, value, rf(record))
            return value

        return _folded(arith_n, operands[0].pos, *operands)

    # -- predicates -----------------------------------------------------------

    def compare(self, tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        (op_tok,), (left, right) = tokens, exprs
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
            out.terms = {left.path: [canonical(right.value) or ""]}
        if op_text in _RANGE_OPS and left.path is not None and _rangeable(right):
            out.ranges = ((left.path, Bound(op_text, right.value)),)
        return out

    def is_null(self, _tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        af = exprs[0].fn
        return _folded(lambda record: af(record) is None, exprs[0].pos, exprs[0])

    def is_not_null(self, _tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        af = exprs[0].fn
        return _folded(lambda record: af(record) is not None, exprs[0].pos, exprs[0])

    def in_(self, _tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        left, items = exprs[0], exprs[1:]
        out = _Expr(fn=_in_list(left, items), pos=left.pos)
        if all(item.const for item in items) and left.const:
            out = _constant(out.fn({}), left.pos)
        if left.path is not None and all(i.literal and i.value is not None for i in items):
            values: list[str] = []
            for item in items:
                text = canonical(item.value) or ""
                if text not in values:
                    values.append(text)
            out.terms = {left.path: values}
        return out

    def not_in(self, tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        return self._negate(self.in_(tokens, exprs))

    def between(self, _tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        value, lo, hi = exprs
        vf, lf, hf = value.fn, lo.fn, hi.fn
        ge, le = operator.ge, operator.le

        def between(record: JSON) -> bool | None:
            v = vf(record)
            if v is None:
                return None
            low, high = lf(record), hf(record)
            if type(v) is list:  # one element within the bounds
                return _any(v, lambda item: _and3(_compare(ge, item, low),
                                                  _compare(le, item, high)))
            return _and3(_compare(ge, v, low), _compare(le, v, high))

        out = _folded(between, value.pos, value, lo, hi)
        if value.path is not None and _rangeable(lo) and _rangeable(hi) and not out.const:
            out.ranges = ((value.path, Bound(">=", lo.value)), (value.path, Bound("<=", hi.value)))
        return out

    def not_between(self, tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        return self._negate(self.between(tokens, exprs))

    def like(self, _tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        value, pattern = exprs
        vf = value.fn
        if pattern.const:
            if pattern.value is None:
                return _folded(lambda record: None, value.pos, value, pattern)
            source = pattern.raw if pattern.raw is not None else _as_text(pattern.value)
            if source is None:
                raise _error(self.text, pattern.pos, "LIKE pattern must be a string")
            try:
                search = _searcher(_re2_compile(source))
            except ValueError as exc:
                raise _error(self.text, pattern.pos, str(exc)) from None

            def like_text(v: JSON) -> bool | None:
                text = _as_text(v)
                return None if text is None else search(text)

            def like_const(record: JSON) -> bool | None:
                v = vf(record)
                if type(v) is not str:
                    if type(v) is list:
                        return _any(v, like_text)
                    v = _as_text(v)
                    if v is None:
                        return None
                return search(v)

            return _folded(like_const, value.pos, value)
        pf = pattern.fn

        def like_dynamic(record: JSON) -> bool | None:
            text, source = _as_text(vf(record)), _as_text(pf(record))
            if text is None or source is None:
                return None
            search = _dynamic_searcher(source)
            return None if search is None else search(text)

        return _folded(like_dynamic, value.pos, value, pattern)

    def not_like(self, tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        return self._negate(self.like(tokens, exprs))

    def begins_with(self, _tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        return self._affix(exprs, str.startswith)

    def not_begins_with(self, tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        return self._negate(self.begins_with(tokens, exprs))

    def ends_with(self, _tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        return self._affix(exprs, str.endswith)

    def not_ends_with(self, tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        return self._negate(self.ends_with(tokens, exprs))

    def _affix(self, exprs: list[_Expr], test: Callable[[str, str], bool]) -> _Expr:
        """``value BEGINS WITH (a, b, …)`` / ``ENDS WITH``: TRUE when the value's text starts
        (ends) with any of the texts; UNKNOWN when it is NULL or every text is NULL; an array
        value when any element does."""
        value, items = exprs[0], exprs[1:]
        vf, fns = value.fn, [item.fn for item in items]

        def one(v: JSON, affixes: list[str | None]) -> bool | None:
            text = _as_text(v)
            if text is None:
                return None
            result: bool | None = False
            for affix in affixes:
                if affix is None:
                    result = None
                elif test(text, affix):
                    return True
            return result

        def affix(record: JSON) -> bool | None:
            v = vf(record)
            if v is None:
                return None
            affixes = [_as_text(f(record)) for f in fns]
            if type(v) is list:
                return _any(v, lambda item: one(item, affixes))
            return one(v, affixes)

        return _folded(affix, value.pos, value, *items)

    # -- logic ----------------------------------------------------------------

    def and_(self, _tokens: list[Token], children: list[_Expr]) -> _Expr:
        out = self._chain("and", _and_all, children)
        out.ranges = tuple(r for child in children for r in child.ranges)
        if all(child.terms is not None for child in children):
            out.terms = _merge_terms([child.terms for child in children if child.terms])
        return out

    def or_(self, _tokens: list[Token], children: list[_Expr]) -> _Expr:
        return self._chain("or", _or_all, children)

    def not_(self, _tokens: list[Token], exprs: list[_Expr]) -> _Expr:
        return self._negate(exprs[0])

    # -- helpers --------------------------------------------------------------

    @staticmethod
    def _chain(
        kind: str, build: Callable[[tuple[Evaluator, ...]], Evaluator], children: list[_Expr]
    ) -> _Expr:
        """AND / OR node over all its operands, evaluated in one loop; a parenthesised chain
        of the same kind (``a AND (b AND c)``) is merged into it."""
        members = tuple(
            member
            for side in children
            for member in (side.members if side.chain == kind else (side.fn,))
        )
        out = _folded(build(members), children[0].pos, *children)
        if not out.const:
            out.chain, out.members = kind, members
        return out

    @staticmethod
    def _negate(arg: _Expr) -> _Expr:
        af = arg.fn

        def negate(record: JSON) -> bool | None:
            value = af(record)
            if value is True:
                return False
            if value is False:
                return True
            return None

        return _folded(negate, arg.pos, arg)


_RANGE_OPS = frozenset(("<", "<=", ">", ">=", "="))


def _rangeable(e: _Expr) -> bool:
    """A literal number or text a range index can bound (not NULL, not a boolean)."""
    return e.const and type(e.value) in (int, float, str)


def _and_all(fns: tuple[Evaluator, ...]) -> Evaluator:
    if len(fns) == 2:
        f, g = fns

        def and2(record: JSON) -> bool | None:
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

    def and_n(record: JSON) -> bool | None:
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

        def or2(record: JSON) -> bool | None:
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

    def or_n(record: JSON) -> bool | None:
        result: bool | None = False
        for fn in fns:
            value = fn(record)
            if value is True:
                return True
            if value is not False:
                result = None
        return result

    return or_n


def _compare_const(left: _Expr, op: Comparison, const: JSON) -> Evaluator:
    """Fast closure for ``<expression> op <constant>`` (the common ``/path = literal``)."""
    if const is None:
        return lambda record: None
    kind = _kind(const)
    if kind == _NUM:
        return _compare_number(left, op, const)
    if kind == _STR:
        return _compare_text(left, op, const)
    lf = left.fn
    return lambda record: _compare(op, lf(record), const)


def _compare_number(left: _Expr, op: Comparison, const: int | float) -> Evaluator:
    """:func:`_compare_const` for a number: a number read compares at once, text as a number."""
    lf, key = left.fn, left.key
    if key is not None:

        def cmp_key_num(record: JSON) -> bool | None:
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

    def cmp_num(record: JSON) -> bool | None:
        v = lf(record)
        t = type(v)
        if t is int or t is float:
            return op(v, const)
        return _compare(op, v, const)

    return cmp_num


def _compare_text(left: _Expr, op: Comparison, const: str) -> Evaluator:
    """:func:`_compare_const` for a string: a string read compares at once."""
    lf, key = left.fn, left.key
    if key is not None:

        def cmp_key_str(record: JSON) -> bool | None:
            try:
                v = record.get(key)
            except AttributeError:
                v = lf(record)
            if type(v) is str:
                return op(v, const)
            return _compare(op, v, const)

        return cmp_key_str

    def cmp_str(record: JSON) -> bool | None:
        v = lf(record)
        if type(v) is str:
            return op(v, const)
        return _compare(op, v, const)

    return cmp_str


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

        def in_consts(record: JSON) -> bool | None:
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

    def in_exprs(record: JSON) -> bool | None:
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
        deterministic: False when it calls ``NOW()`` / ``UNIX_TIMESTAMP()``: its result for
            a record depends on when it is evaluated, so it is refused where the same answer
            must come every time (a ``sow_delete`` filter, applied per partition and again
            after a worker restart; a view's filter), as AMPS refuses non-deterministic
            functions there.
    """

    __slots__ = ("_fn", "_ranges", "_terms", "deterministic", "text")

    def __init__(self, text: str, fn: Evaluator, terms: dict[str, list[str]] | None,
                 ranges: tuple[tuple[str, Bound], ...] = (), deterministic: bool = True) -> None:
        self.text = text
        self._fn = fn
        self._terms = terms
        self._ranges = ranges
        self.deterministic = deterministic

    def __call__(self, record: JSONObject) -> bool:
        """True only when the filter evaluates to TRUE for ``record`` (not FALSE or UNKNOWN).

        Raises:
            FilterEvalError: evaluation failed unexpectedly (never a hang: LIKE runs in
                linear time and nesting is bounded at compile time).
        """
        try:
            return self._fn(record) is True
        except Exception as exc:
            raise self._eval_error(exc) from exc

    def evaluate(self, record: JSONObject) -> bool | None:
        """Three-valued result for ``record``: True, False, or None for UNKNOWN.

        Raises:
            FilterEvalError: as :meth:`__call__`.
        """
        try:
            value = self._fn(record)
        except Exception as exc:
            raise self._eval_error(exc) from exc
        return value if value is True or value is False else None

    def _eval_error(self, exc: Exception) -> FilterEvalError:
        if isinstance(exc, RecursionError):
            what = f"nests too deeply to evaluate (limit {MAX_DEPTH} levels)"
        else:
            what = f"failed: {type(exc).__name__}: {exc}"
        detail = " ".join(f"filter evaluation {what}".split())
        return FilterEvalError(f'{detail} in "{_shown(self.text, cut=True)}"')

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

    def range_terms(self) -> dict[str, list[Bound]]:
        """Range constraints a match implies: ``{path: [Bound, …]}`` from the comparisons
        (``<``, ``<=``, ``>``, ``>=``, ``=``) of a field path with a number or text literal and
        from ``path BETWEEN literal AND literal``, that are the filter itself or members of its
        top-level AND chain (a record matching the filter satisfies each of them under the
        filter's coercions, or holds an array at that path). Empty when there is none (an
        OR, NOT, or a comparison of two fields gives none). The query planner reads a range
        index with them and still evaluates the whole filter on every candidate.
        """
        out: dict[str, list[Bound]] = {}
        for path, bound in self._ranges:
            out.setdefault(path, []).append(bound)
        return out

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
            a function is unknown or gets the wrong number of arguments, the text is longer
            than :data:`MAX_FILTER_CHARS` or nests deeper than :data:`MAX_DEPTH`. The message
            is one line naming the 1-based column.
    """
    if not isinstance(text, str):
        raise FilterSyntaxError(f"filter must be a string, got {type(text).__name__}")
    if len(text) > MAX_FILTER_CHARS:
        raise FilterSyntaxError(f"filter is {len(text)} characters long; at most "
                                f"{MAX_FILTER_CHARS}: \"{_shown(text, cut=True)}\"")
    if not text.strip():
        raise _error(text, len(text), "empty filter")
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc) from None
    except RecursionError:  # the LALR parser is iterative; kept as a guard
        raise _depth_error(text) from None
    _check_depth(text, tree)
    try:
        expr = _Compiler(text).compile(tree)
    except RecursionError:  # constant folding evaluates nested closures
        raise _depth_error(text) from None
    clocks = tree.scan_values(lambda v: isinstance(v, Token) and v.type == "FUNC_NAME"
                              and v.lower() in _NON_DETERMINISTIC)
    return Filter(text, expr.fn, expr.terms, expr.ranges, deterministic=next(iter(clocks), None) is None)


_NON_DETERMINISTIC = frozenset({"now", "unix_timestamp"})
"""Functions whose value depends on when they are evaluated (see :attr:`Filter.deterministic`)."""


def check_deterministic(flt: Filter, where: str) -> None:
    """Raise FilterSyntaxError (one line naming ``where``) when ``flt`` calls ``NOW()`` or
    ``UNIX_TIMESTAMP()``."""
    if not flt.deterministic:
        raise FilterSyntaxError(
            f"{where} must give the same answer whenever it is evaluated: NOW() and "
            f"UNIX_TIMESTAMP() are not allowed there (AMPS: non-deterministic functions) in "
            f'"{_shown(flt.text, cut=True)}"')


def _depth_error(text: str) -> FilterSyntaxError:
    shown = _shown(text, cut=True)
    return FilterSyntaxError(
        f"filter nests deeper than {MAX_DEPTH} levels (nested NOT, parentheses, unary signs, "
        f'functions or operators; flat AND / OR chains are not limited) in "{shown}"'
    )


def _check_depth(text: str, tree: Tree[Token]) -> None:
    """Raise FilterSyntaxError when the parse tree is more than MAX_DEPTH levels deep.

    Iterative (explicit stack), so any depth is measured without recursion.
    """
    todo: list[tuple[Tree[Token], int]] = [(tree, 1)]
    while todo:
        node, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise _depth_error(text)
        todo.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))


def _syntax_error(text: str, exc: UnexpectedInput) -> FilterSyntaxError:
    """One-line FilterSyntaxError for a lark parse exception."""
    if isinstance(exc, UnexpectedCharacters):
        return _error(text, exc.pos_in_stream or 0, f"unexpected character {exc.char!r}")
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        history = getattr(exc, "token_history", None) or []
        last = history[-1] if history else None
        if last is not None and last.type == "FUNC_NAME" and str(tok) != "(":
            what = f"unexpected name {str(last)!r} (field paths start with '/')"
            return _error(text, last.start_pos or 0, what)
        if tok.type == "$END":
            return _error(text, len(text), "unexpected end of filter")
        return _error(text, (tok.start_pos or 0) or 0, f"unexpected {str(tok)!r}")
    if isinstance(exc, UnexpectedEOF):
        return _error(text, len(text), "unexpected end of filter")
    pos = getattr(exc, "pos_in_stream", None) or 0
    return _error(text, pos, "invalid syntax")
