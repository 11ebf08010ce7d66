"""The AMPS filter functions of issue 25 item 6 (sow_redis/query/filter.py): each one's
documented example (docs/queries.md, the module docstring) and its NULL and edge cases. Pure:
no server."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from conftest import wait_until

from sow_redis.errors import ConfigError, FilterSyntaxError
from sow_redis.query.filter import compile_filter


def value(expr: str, record: dict | None = None):
    """The value of a filter expression for a record (the compiled evaluator's result)."""
    return compile_filter(expr)._fn(record or {})


def match(expr: str, record: dict | None = None) -> bool:
    return compile_filter(expr)(record or {})


# -- documented examples: the filter as the docs give it, on the record they give ---------
EXAMPLES = [
    ("REVERSE(SUBSTR('fandango', 5)) == 'ogna'", {}),  # the AMPS User Guide's example
    ("SUBSTR(/sym, 1, 3) = 'IBM'", {"sym": "IBM.N"}),
    ("LENGTH(/sym) = 5", {"sym": "IBM.N"}),
    ("INSTR(/eventLevels, 'critical') != 0", {"eventLevels": "warn,critical"}),
    ("INSTR_I(/symbolList, 'MSFT') != 0", {"symbolList": "ibm,msft"}),
    ("STREQUAL_I(/couponCode, 'QED') == 1", {"couponCode": "qed"}),
    ("UPPER(/ticker) IN ('MSFT', 'IBM')", {"ticker": "ibm"}),
    ("CONCAT(/first, ' ', /last) = 'Ada Lovelace'", {"first": "Ada", "last": "Lovelace"}),
    ("TRIM(/code) = 'X1'", {"code": "  X1 "}),
    ("REPLACE(/sym, '.N', '') = 'IBM'", {"sym": "IBM.N"}),
    ("REGEXP_MATCH(/sym, '^IB')", {"sym": "IBM"}),
    ("REGEXP_REPLACE(/sym, '\\.[A-Z]+$', '') = 'IBM'", {"sym": "IBM.N"}),
    ("COALESCE(/bid, /last, 0) > 100", {"last": 101}),
    ("/cancelled IS NULL AND /qty IS NOT NULL", {"qty": 1}),
    ("ROUND(/px, 2) = 2.68", {"px": 2.675}),
    ("CEILING(/qty / 100) = 3 AND FLOOR(/qty / 100) = 2", {"qty": 250}),
    ("ABS(/px - /ref) < 0.5 AND SIGN(/px - /ref) = -1", {"px": 9.8, "ref": 10}),
    ("SQRT(/var) = 3 AND POWER(/n, 2) = 16", {"var": 9, "n": 4}),
    ("GREATEST(/bid, /ask) = 11 AND LEAST(/bid, /ask) = 10", {"bid": 10, "ask": 11}),
    ("NOW() - /ts < 60", {"ts": time.time()}),
    ("UNIX_TIMESTAMP() > 1700000000", {}),
    # as docs/queries.md's table writes them (test_every_example_of_the_docs_is_checked)
    ("INSTR(/levels, 'critical') != 0", {"levels": "warn,critical"}),
    ("STREQUAL_I(/code, 'QED') == 1", {"code": "qed"}),
    ("ABS(/px - /ref) < 0.5", {"px": 9.8, "ref": 10}),
    ("GREATEST(/bid, /ask) = 11", {"bid": 10, "ask": 11}),
]


@pytest.mark.parametrize("text, record", EXAMPLES, ids=[t for t, _r in EXAMPLES])
def test_documented_example(text, record):
    if "ts" in record:  # "a minute ago" from when the test runs, not from its collection
        record = {**record, "ts": time.time()}
    assert compile_filter(text).evaluate(record) is True


def _doc_examples() -> list[str]:
    """The examples of the function table of docs/queries.md ("example (true)" column)."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "queries.md").read_text()
    start = text.index("| function | example (true) | notes |")
    rows = text[start:text.index("\n\n", start)].splitlines()[2:]
    return [ex for row in rows for ex in re.findall(r"`([^`]+)`", row.split(" | ")[1])]


def test_every_example_of_the_docs_is_checked():
    """docs/queries.md says each example of its table is true and checked here: one that reads
    a field is in EXAMPLES as written, with its record; the others are true on any record."""
    examples = _doc_examples()
    assert len(examples) >= 20
    with_record = {text for text, _record in EXAMPLES}
    for text in examples:
        if re.search(r"/[A-Za-z_@]", re.sub(r"'[^']*'", "", text)):
            assert text in with_record, f"{text!r} is not in EXAMPLES"
        else:
            assert compile_filter(text).evaluate({}) is True, text


# -- strings ---------------------------------------------------------------------------------
@pytest.mark.parametrize("expr, expected", [
    ("SUBSTR('fandango', 5)", "ango"),  # 1-based, to the end
    ("SUBSTR('hello', 2, 3)", "ell"),
    ("SUBSTR('hello', 1, 99)", "hello"),  # a length past the end stops there
    ("SUBSTR('hello', -3)", "llo"),  # negative: from the end
    ("SUBSTR('hello', -3, 2)", "ll"),
    ("SUBSTR('hello', 0, 2)", "he"),  # 0 counts as 1
    ("SUBSTR('hello', 6)", ""),  # past the end
    ("SUBSTR('hello', -6)", ""),  # before the start
    ("SUBSTR('hello', 2, 0)", ""),
    ("SUBSTR('hello', 2, -1)", ""),
    ("SUBSTR('hello', 2.9, '2')", "el"),  # numbers truncated; numeric text read
    ("SUBSTR(12345, 2, 2)", "23"),  # a number as its text
    ("SUBSTR('héllo', 2, 1)", "é"),  # characters, not bytes
    ("SUBSTR(/missing, 1)", None),
    ("SUBSTR('abc', /missing)", None),
    ("SUBSTR('abc', 1, /missing)", None),
    ("SUBSTR('abc', 'x')", None),  # no number
    ("LENGTH('héllo')", 5), ("LEN('')", 0), ("LENGTH(12.5)", 4), ("LENGTH(/missing)", None),
    ("REVERSE('abc')", "cba"), ("REVERSE('')", ""), ("REVERSE(/missing)", None),
    ("INSTR('abcabc', 'c')", 3), ("INSTR('abc', 'x')", 0), ("INSTR('abc', '')", 1),
    ("INSTR_I('aBc', 'BC')", 2), ("INSTR_I('abc', 'x')", 0), ("INSTR_I(/missing, 'a')", None),
    ("STREQUAL_I('Straße', 'STRASSE')", 1), ("STREQUAL_I('a', 'b')", 0),
    ("STREQUAL_I('a', /missing)", None),
    ("TRIM(' \t x y \n')", "x y"), ("LTRIM('  x ')", "x "), ("RTRIM('  x ')", "  x"),
    ("TRIM('xxaxx', 'x')", "a"), ("LTRIM('0012', '0')", "12"), ("RTRIM('1.500', '0')", "1.5"),
    ("TRIM(/missing)", None), ("TRIM('a', /missing)", None),
    ("REPLACE('a-b-c', '-', '+')", "a+b+c"), ("REPLACE('abc', '', 'x')", "abc"),
    ("REPLACE('abc', 'b', '')", "ac"), ("REPLACE('abc', /missing, 'x')", None),
    ("CONCAT('a', 1, true)", "a1true"), ("CONCAT('a', /missing)", None),
    ("UPPER('straße')", "STRASSE"), ("LOWER('ABC')", "abc"),
])
def test_string_functions(expr, expected):
    assert value(expr) == expected
    assert type(value(expr)) is type(expected)


def test_regexp_match_is_like_as_a_function():
    rec = {"s": "order-42", "tags": ["x", "order-1"], "n": 123}
    assert match("REGEXP_MATCH(/s, 'order-[0-9]+')", rec)
    assert match("REGEXP_MATCH(/s, '(?i)^ORDER')", rec)
    assert not match("REGEXP_MATCH(/s, '^x')", rec)
    assert match("NOT REGEXP_MATCH(/s, '^x')", rec)
    assert match("REGEXP_MATCH(/tags, '^order')", rec)  # an array: any element
    assert match("REGEXP_MATCH(/n, '^12')", rec)  # a number as its text
    assert compile_filter("REGEXP_MATCH(/missing, 'a')").evaluate(rec) is None
    assert compile_filter("REGEXP_MATCH(/s, /missing)").evaluate(rec) is None
    with pytest.raises(FilterSyntaxError, match="lookahead"):
        compile_filter("REGEXP_MATCH(/s, 'a(?=b)')")


@pytest.mark.parametrize("expr, record, expected", [
    ("REGEXP_REPLACE('a1b22', '[0-9]+', '#')", {}, "a#b#"),
    ("REGEXP_REPLACE('2026-11-27', '(\\d+)-(\\d+)-(\\d+)', '\\3.\\2.\\1')", {}, "27.11.2026"),
    ("REGEXP_REPLACE('abc', 'x', 'y')", {}, "abc"),
    ("REGEXP_REPLACE('ab', '', '-')", {}, "-a-b-"),  # an empty match at every position
    ("REGEXP_REPLACE(/s, /p, /r)", {"s": "aXa", "p": "X", "r": "_"}, "a_a"),  # read per record
    ("REGEXP_REPLACE(/s, /p, 'x')", {"s": "a", "p": "("}, None),  # a bad pattern read: NULL
    ("REGEXP_REPLACE('ab', 'a', '\\2')", {}, None),  # a group the pattern lacks: NULL
    ("REGEXP_REPLACE(/missing, 'a', 'b')", {}, None),
    ("REGEXP_REPLACE('a', 'a', /missing)", {}, None),
    ("REGEXP_REPLACE('a', NULL, 'b')", {}, None),
])
def test_regexp_replace(expr, record, expected):
    assert value(expr, record) == expected


def test_regexp_replace_bad_pattern_is_a_syntax_error_and_huge_results_are_null():
    with pytest.raises(FilterSyntaxError, match=r"column 20: REGEXP_REPLACE pattern uses a "
                                                r"backreference"):
        compile_filter("REGEXP_REPLACE(/s, '(a)\\1', 'x') = 'y'")
    assert value("REGEXP_REPLACE(/s, '', /r)", {"s": "a" * 70_000, "r": "b" * 1000}) is None


# -- numbers ---------------------------------------------------------------------------------
@pytest.mark.parametrize("expr, expected", [
    ("ROUND(2.5)", 3), ("ROUND(-2.5)", -3), ("ROUND(0.5)", 1),  # half away from zero
    ("ROUND(2.675, 2)", 2.68), ("ROUND(1.005, 2)", 1.01),  # on the decimal text
    ("ROUND(1234.5678, 1)", 1234.6), ("ROUND(1250, -2)", 1300), ("ROUND(1249, -2)", 1200),
    ("ROUND(7, 2)", 7), ("ROUND('3.14159', '3')", 3.142), ("ROUND(5, -500)", 0),
    ("ROUND(/missing)", None), ("ROUND(1.5, /missing)", None), ("ROUND('x')", None),
    ("CEILING(1.2)", 2), ("CEIL(-1.2)", -1), ("CEILING(3)", 3), ("FLOOR(-1.2)", -2),
    ("FLOOR('7.9')", 7), ("FLOOR(/missing)", None), ("CEILING(1e400)", None),
    ("SQRT(16)", 4.0), ("SQRT(2) * SQRT(2) > 1.99", True), ("SQRT(-1)", None),
    ("SQRT(/missing)", None),
    ("POWER(2, 10)", 1024), ("POWER(2, -1)", 0.5), ("POWER(9, 0.5)", 3.0),
    ("POWER(-8, 0.5)", None), ("POWER(3, 40)", 3 ** 40), ("POWER(10, 400)", None),
    ("POWER(0, -1)", None), ("POWER(2, /missing)", None),
    ("SIGN(-3)", -1), ("SIGN(0)", 0), ("SIGN(0.1)", 1), ("SIGN('x')", None),
    ("ABS(-2.5)", 2.5),
    ("GREATEST(1, 5, 3)", 5), ("LEAST(1, 5, 3)", 1), ("GREATEST(2)", 2),
    ("GREATEST('10', 9)", 10), ("GREATEST(1, /missing)", None), ("LEAST(1, 'x')", None),
])
def test_numeric_functions(expr, expected):
    got = value(expr)
    assert got == expected
    assert type(got) is type(expected)


# -- time ------------------------------------------------------------------------------------
def test_now_is_seconds_since_the_epoch_read_at_evaluation_time():
    before = time.time()
    now = value("NOW()")
    assert isinstance(now, float) and before <= now <= time.time()
    assert abs(value("UNIX_TIMESTAMP()") - time.time()) < 1
    soon = {"at": time.time() + 0.05}
    f = compile_filter("NOW() >= /at")  # compiled once: not folded to the compile time
    assert not f(soon)
    wait_until(lambda: f(soon), 5, "NOW() to pass a time 50 ms ahead")
    assert compile_filter("NOW() > 0 AND /a = 1")({"a": 1})


# -- arity and names -------------------------------------------------------------------------
@pytest.mark.parametrize("text, message", [
    ("NOW(1) > 0", "NOW takes 0 arguments, got 1"),
    ("SUBSTR('a') = 'a'", "SUBSTR takes 2 to 3 arguments, got 1"),
    ("SUBSTR('a', 1, 2, 3) = 'a'", "SUBSTR takes 2 to 3 arguments, got 4"),
    ("REPLACE('a', 'b') = 'a'", "REPLACE takes 3 arguments, got 2"),
    ("GREATEST() = 1", "GREATEST takes at least 1 argument, got 0"),
    ("LENGTH() = 1", "LENGTH takes 1 argument, got 0"),
    ("STRFTIME('%H', /t) = '09'", "unknown function 'STRFTIME'"),
])
def test_argument_counts_and_unknown_names(text, message):
    with pytest.raises(FilterSyntaxError, match=message):
        compile_filter(text)


def test_constant_calls_fold_at_compile_time():
    f = compile_filter("LENGTH(CONCAT('ab', 'c')) = 3 AND /x = 1")
    assert f({"x": 1}) and not f({"x": 2})
    # folded: the call is a constant, so the AND chain holds only the comparison of /x
    assert compile_filter("LENGTH(CONCAT('ab', 'c')) = 3")._fn.__name__ == "<lambda>"


def test_now_is_refused_where_the_answer_must_not_depend_on_time():
    from sow_redis.client import Sow

    assert compile_filter("/a = 1").deterministic
    assert not compile_filter("/a = 1 OR NOW() > /t").deterministic
    assert not compile_filter("unix_timestamp() > 0").deterministic
    sow = Sow("memory://now-refused", inline=True)
    sow.apply_config('[[topic]]\nname = "o"\nkey = ["/k"]\n')
    sow.publish("o", {"k": 1, "t": 0})
    with pytest.raises(FilterSyntaxError, match=r"a sow_delete filter must give the same answer"):
        sow.sow_delete("o", filter="NOW() > /t")
    assert len(sow.sow("o", "NOW() > /t")) == 1  # a query may use it
    view = ('[[topic]]\nname = "o"\nkey = ["/k"]\n\n[[view]]\nname = "v"\nunderlying = "o"\n'
            'projection = ["/k", "COUNT(/k) AS /n"]\ngrouping = ["/k"]\n'
            'filter = "NOW() > /t"\n')
    with pytest.raises(ConfigError, match=r"view 'v': 'filter': the filter must give the same"):
        sow.apply_config(view)
