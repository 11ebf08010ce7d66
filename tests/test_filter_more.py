"""Filter functions and array semantics added for issue 25 (AMPS: INSTR, CONCAT, BEGINS WITH,
ENDS WITH; a comparison on an array field matches when any element does)."""

from __future__ import annotations

import pytest

from sow_redis.errors import FilterSyntaxError
from sow_redis.query.filter import compile_filter

REC = {"sym": "MSFT.O", "tags": ["x", "y"], "px": [1, 5, 9], "legs": [{"id": 1}], "n": None,
       "venue": "XNAS", "empty": []}


@pytest.mark.parametrize(("text", "expected"), [
    ("/tags = 'y'", True),
    ("/tags = 'z'", False),
    ("/tags != 'x'", True),              # any element differs
    ("/px > 8", True),
    ("/px > 9", False),
    ("/px BETWEEN 2 AND 4", False),
    ("/px IN (5, 7)", True),
    ("/tags IN ('q', 'x')", True),
    ("/tags LIKE '^y$'", True),
    ("/empty = 'x'", False),
    ("/tags NOT IN ('x', 'y')", False),
    ("/sym BEGINS WITH ('MS', 'IB')", True),
    ("/sym BEGINS WITH ('IB')", False),
    ("/sym NOT BEGINS WITH ('IB')", True),
    ("/sym ENDS WITH ('.O', '.N')", True),
    ("/sym NOT ENDS WITH ('.O')", False),
    ("/tags ENDS WITH ('y')", True),
    ("/n BEGINS WITH ('a')", None),
    ("INSTR(/sym, '.') = 5", True),
    ("INSTR(/sym, 'Z') = 0", True),
    ("INSTR(/n, 'Z') = 0", None),
    ("CONCAT(/venue, ':', /sym) = 'XNAS:MSFT.O'", True),
    ("CONCAT(/venue, /n) = 'XNAS'", None),
    ("concat(/venue, 1) = 'XNAS1'", True),
])
def test_functions_and_arrays(text, expected):
    f = compile_filter(text)
    assert f.evaluate(REC) is expected, text  # three-valued: TRUE, FALSE or UNKNOWN
    assert f(REC) is (expected is True), text


@pytest.mark.parametrize(("text", "message"), [
    ("INSTR(/sym)", "INSTR takes 2 arguments, got 1"),
    ("CONCAT(/sym)", "CONCAT takes at least 2 arguments, got 1"),
    ("/sym BEGINS WITH 'MS'", "column"),
])
def test_errors_are_one_line(text, message):
    with pytest.raises(FilterSyntaxError, match=message) as info:
        compile_filter(text)
    assert "\n" not in str(info.value)


def test_a_query_matches_array_elements(sow, topic_name):
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\n')
    sow.publish(topic_name, [{"id": 1, "tags": ["x", "y"]}, {"id": 2, "tags": ["z"]},
                             {"id": 3, "tags": "y"}])
    assert sorted(r.obj()["id"] for r in sow.sow(topic_name, "/tags = 'y'")) == [1, 3]
    assert sorted(r.obj()["id"] for r in sow.sow(
        topic_name, "/tags BEGINS WITH ('z') OR INSTR(CONCAT(/id, '!'), '1') = 1")) == [1, 2]
