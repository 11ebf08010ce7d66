"""The typed shapes of the read path (issue 24, mypy --strict on model/ and query/): each filter
grammar rule has a compiler method taking (tokens, sub-expressions), and sort_records takes any
iterable of items (pure Python)."""

from __future__ import annotations

import inspect
import re
from importlib import resources

import pytest

from sow_redis.query import filter as filter_mod
from sow_redis.query.filter import compile_filter
from sow_redis.query.orderby import parse_order_by, sort_records


def _grammar_rules() -> set[str]:
    text = resources.files("sow_redis.query").joinpath("filter.lark").read_text(encoding="utf-8")
    return set(re.findall(r"->\s*(\w+)", text))


def test_every_grammar_rule_has_a_compiler_method_of_tokens_and_expressions() -> None:
    rules = _grammar_rules()
    assert {"compare", "arith", "func", "neg", "group", "and_", "or_"} <= rules
    for rule in sorted(rules):
        method = getattr(filter_mod._Compiler, rule, None)
        assert method is not None, rule
        params = list(inspect.signature(method).parameters)
        assert len(params) == 3, (rule, params)  # self, kept tokens, compiled sub-expressions


@pytest.mark.parametrize("text, record, expected", [
    ("-/a + 2 * /b - /c % 4 = 3", {"a": 1, "b": 3, "c": 6}, True),  # neg, arith (tokens between)
    ("abs(-/a) = 1 AND coalesce(/x, /a) = 1", {"a": 1}, True),      # func with its name token
    ("(/a IS NULL) OR NOT (/b IS NOT NULL)", {"b": None}, True),    # NULL tokens, group
    ("+/a BETWEEN 1 AND 2 AND /s LIKE '^x' AND /n NOT IN (1, 2)", {"a": 1, "s": "xy", "n": 3},
     True),
])
def test_rules_with_tokens_and_expressions_evaluate(text: str, record: dict[str, object],
                                                    expected: bool) -> None:
    assert compile_filter(text)(record) is expected


def test_sort_records_takes_any_iterable() -> None:
    items = ({"a": n} for n in (3, 1, 2))
    assert sort_records(items, parse_order_by("/a")) == [{"a": 1}, {"a": 2}, {"a": 3}]
