"""Tests for sow_redis.query.orderby: order-by parsing and record sorting (pure Python)."""

from __future__ import annotations

import pytest

from sow_redis.errors import FilterSyntaxError
from sow_redis.query.orderby import parse_order_by, sort_records

# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, expected",
    [
        ("/f DESC, /g", [(("f",), True), (("g",), False)]),
        ("/f", [(("f",), False)]),
        ("/f ASC", [(("f",), False)]),
        ("/f asc", [(("f",), False)]),
        ("/f desc", [(("f",), True)]),
        ("/f Desc", [(("f",), True)]),
        ("/order/id DESC", [(("order", "id"), True)]),
        ("/55", [(("55",), False)]),
        ("/items/0 DESC", [(("items", "0"), True)]),
        ("  /a  DESC ,/b,  /c asc  ", [(("a",), True), (("b",), False), (("c",), False)]),
        ("/a,/b", [(("a",), False), (("b",), False)]),
        ("/a\tDESC", [(("a",), True)]),
    ],
)
def test_parse_order_by(text: str, expected: list) -> None:
    assert parse_order_by(text) == expected


@pytest.mark.parametrize(
    "text, column, what",
    [
        ("", 1, "empty order by"),
        ("   ", 4, "empty order by"),
        ("/a,", 4, "expected a field path"),
        ("/a, ,/b", 5, "expected a field path"),
        (", /a", 1, "expected a field path"),
        ("a", 1, "field path must start with '/'"),
        ("/a, b DESC", 5, "field path must start with '/'"),
        ("/a UP", 4, "expected ASC or DESC, got 'UP'"),
        ("/a, /b DOWN", 8, "expected ASC or DESC, got 'DOWN'"),
        ("/a DESC x", 9, "unexpected 'x'"),
        ("/a//b", 1, "bad field path"),
        ("/", 1, "bad field path"),
    ],
)
def test_parse_order_by_errors(text: str, column: int, what: str) -> None:
    with pytest.raises(FilterSyntaxError) as info:
        parse_order_by(text)
    message = str(info.value)
    assert f"column {column}: {what}" in message, message
    assert "\n" not in message


def test_parse_order_by_rejects_non_strings() -> None:
    with pytest.raises(FilterSyntaxError):
        parse_order_by(None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- sorting


def ids(records: list[dict]) -> list:
    return [r["id"] for r in records]


def test_sort_numbers_ascending_and_descending() -> None:
    recs = [{"id": i, "v": v} for i, v in enumerate([3, 1.5, 10, -2, 7])]
    assert ids(sort_records(recs, parse_order_by("/v"))) == [3, 1, 0, 4, 2]
    assert ids(sort_records(recs, parse_order_by("/v DESC"))) == [2, 4, 0, 1, 3]


def test_sort_strings_lexicographically() -> None:
    recs = [{"id": i, "v": v} for i, v in enumerate(["b", "a", "B", "10", "9"])]
    assert [r["v"] for r in sort_records(recs, parse_order_by("/v"))] == ["10", "9", "B", "a", "b"]


def test_numbers_sort_before_strings_and_missing_last_ascending() -> None:
    recs = [
        {"id": "s", "v": "abc"},
        {"id": "missing"},
        {"id": "n", "v": 5},
        {"id": "null", "v": None},
        {"id": "n2", "v": 1},
        {"id": "b", "v": True},
        {"id": "o", "v": {"k": 1}},
    ]
    expected = ["n2", "n", "s", "b", "o", "missing", "null"]
    assert ids(sort_records(recs, parse_order_by("/v"))) == expected


def test_missing_first_descending() -> None:
    recs = [{"id": "n", "v": 5}, {"id": "missing"}, {"id": "s", "v": "x"}, {"id": "n2", "v": 9}]
    assert ids(sort_records(recs, parse_order_by("/v DESC"))) == ["missing", "s", "n2", "n"]


def test_mixed_directions() -> None:
    recs = [
        {"id": 1, "sym": "IBM", "px": 10},
        {"id": 2, "sym": "AAPL", "px": 5},
        {"id": 3, "sym": "IBM", "px": 30},
        {"id": 4, "sym": "AAPL", "px": 50},
        {"id": 5, "sym": "MSFT", "px": 20},
        {"id": 6, "sym": "IBM", "px": 20},
    ]
    assert ids(sort_records(recs, parse_order_by("/sym, /px DESC"))) == [4, 2, 3, 6, 1, 5]
    assert ids(sort_records(recs, parse_order_by("/sym DESC, /px"))) == [5, 1, 6, 3, 2, 4]
    assert ids(sort_records(recs, parse_order_by("/px DESC, /sym"))) == [4, 3, 6, 5, 1, 2]


def test_three_keys_with_missing_values() -> None:
    recs = [
        {"id": 1, "a": 1, "b": "x", "c": 3},
        {"id": 2, "a": 1, "b": "x", "c": 1},
        {"id": 3, "a": 1, "c": 2},
        {"id": 4, "a": 0, "b": "y"},
        {"id": 5, "a": 1, "b": "y", "c": 0},
    ]
    # /a ASC; within a=1: /b DESC puts missing first, then y, then x; /c ASC breaks x ties.
    assert ids(sort_records(recs, parse_order_by("/a, /b DESC, /c"))) == [4, 3, 5, 2, 1]


def test_sort_is_stable_in_both_directions() -> None:
    recs = [{"id": i, "k": i % 2} for i in range(6)]
    assert ids(sort_records(recs, parse_order_by("/k"))) == [0, 2, 4, 1, 3, 5]
    assert ids(sort_records(recs, parse_order_by("/k DESC"))) == [1, 3, 5, 0, 2, 4]
    missing = [{"id": i} for i in range(4)]
    assert ids(sort_records(missing, parse_order_by("/k DESC"))) == [0, 1, 2, 3]


def test_sort_nested_paths_and_array_index() -> None:
    recs = [
        {"id": 1, "o": {"p": [3, 9]}},
        {"id": 2, "o": {"p": [1, 8]}},
        {"id": 3, "o": {"p": [2]}},
    ]
    assert ids(sort_records(recs, parse_order_by("/o/p/0"))) == [2, 3, 1]
    assert ids(sort_records(recs, parse_order_by("/o/p/1 DESC"))) == [3, 1, 2]


def test_sort_with_data_accessor_and_no_mutation() -> None:
    items = [("k1", {"v": 2}), ("k2", {"v": 1}), ("k3", {"v": 3})]
    original = list(items)
    out = sort_records(items, parse_order_by("/v DESC"), data=lambda item: item[1])
    assert [k for k, _ in out] == ["k3", "k1", "k2"]
    assert items == original
    assert out is not items


def test_int_and_float_compare_numerically() -> None:
    recs = [{"id": "a", "v": 2}, {"id": "b", "v": 1.5}, {"id": "c", "v": 2.25}]
    assert ids(sort_records(recs, parse_order_by("/v"))) == ["b", "a", "c"]


def test_empty_order_keeps_input() -> None:
    recs = [{"id": 2}, {"id": 1}]
    assert ids(sort_records(recs, [])) == [2, 1]
