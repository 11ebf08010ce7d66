"""Aggregated subscriptions (issue 26.5; AMPS aggregated subscriptions): an ad-hoc projection
and grouping over a topic, computed from the query and kept current from the changes; after
any sequence of changes the rows equal the rows computed afresh from the SOW."""

from __future__ import annotations

import random
import threading

import pytest

from sow_redis.model.aggregate import Aggregation, ProjectionError, parse_projection
from conftest import command_calls, random_record, run_cli

PROJECTION = ["/sym", "COUNT(/id) AS /orders", "SUM(/qty) AS /qty", "AVG(/px) AS /avg_px",
              "MIN(/px) AS /lo", "MAX(/px) AS /hi"]


def _config(name: str) -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = 4\n'


def _recompute(records: list[dict], projection=PROJECTION, grouping=("/sym",)) -> dict:
    agg = Aggregation(projection, list(grouping), "x")
    for i, rec in enumerate(records):
        agg.upsert(str(i), rec)
    return {tuple(sorted((k, str(v)) for k, v in row.items())): row for _, row in agg.rows()}


def test_rows_of_a_projection():
    agg = Aggregation(PROJECTION, ["/sym"], "x")
    agg.upsert("a", {"id": 1, "sym": "MSFT", "qty": 10, "px": 2.5})
    agg.upsert("b", {"id": 2, "sym": "MSFT", "qty": 5, "px": 3})
    agg.upsert("c", {"id": 3, "sym": "IBM", "qty": 7})
    rows = sorted((row for _, row in agg.rows()), key=lambda r: r["sym"])
    assert rows == [
        {"sym": "IBM", "orders": 1, "qty": 7, "avg_px": None, "lo": None, "hi": None},
        {"sym": "MSFT", "orders": 2, "qty": 15, "avg_px": 2.75, "lo": 2.5, "hi": 3},
    ]
    # moving b to IBM changes both rows; removing c then a empties MSFT: an oof row
    changed = agg.upsert("b", {"id": 2, "sym": "IBM", "qty": 1, "px": 1})
    assert [(kind, row["sym"], row["orders"]) for kind, _, row in changed] == [
        ("publish", "MSFT", 1), ("publish", "IBM", 2)]
    assert [(k, r["orders"]) for k, _, r in agg.remove("a")] == [("oof", 1)]
    assert agg.remove("a") == []


@pytest.mark.parametrize(("projection", "grouping", "message"), [
    (["COUNT(/id) AS /n"], [], "needs a grouping"),
    (["/px", "COUNT(/id) AS /n"], ["/sym"], "not an aggregate and not a grouping field"),
    (["MEDIAN(/px) AS /m"], ["/sym"], "unknown function 'MEDIAN'"),
    (["SUM(/px)"], ["/sym"], r"FUNC\(/path\) AS /name"),
    (["/sym"], ["/sym"], "has no aggregate"),
    (["COUNT(/id) AS /n", "SUM(/q) AS /n"], ["/sym"], "the same field"),
    (["COUNT(id) AS /n"], ["/sym"], "field path must look like"),
])
def test_projection_errors_are_one_line(projection, grouping, message):
    with pytest.raises(ProjectionError, match=message) as info:
        parse_projection(projection, grouping)
    assert "\n" not in str(info.value)


def test_an_aggregated_subscription_stays_equal_to_a_recompute(sow, topic_name):
    """Concurrent publish, delta_publish and sow_delete on 4 partitions while the
    subscription keeps its rows; at the end they equal the rows computed from the SOW."""
    sow.apply_config(_config(topic_name))
    rng = random.Random(11)

    def order(i: int) -> dict:
        return {"id": i, "sym": rng.choice(["MSFT", "IBM", "ORCL", None]),
                "qty": rng.randint(1, 500), "px": rng.choice([rng.randint(1, 99) / 4, 7])}

    sow.publish(topic_name, [order(i) for i in range(50)])
    rows: dict[str, dict] = {}
    with sow.aggregate(topic_name, PROJECTION, ["/sym"], "/qty > 20") as sub:
        def publisher() -> None:
            for _ in range(150 if sow.url.startswith("memory://") else 500):  # fakeredis: slow
                i = rng.randrange(80)
                roll = rng.random()
                if roll < 0.5:
                    sow.publish(topic_name, order(i))
                elif roll < 0.85:
                    sow.delta_publish(topic_name, {"id": i, "qty": rng.randint(1, 500)})
                else:
                    sow.sow_delete(topic_name, f"/id = {i}")

        worker = threading.Thread(target=publisher)
        worker.start()
        kinds: dict[str, int] = {}
        while True:
            msg = sub.get(2.0)
            if msg is None:
                if not worker.is_alive():
                    break
                continue
            kinds[msg["kind"]] = kinds.get(msg["kind"], 0) + 1
            if msg["kind"] in ("sow", "publish"):
                rows[msg["sow_key"]] = msg["data"]
            elif msg["kind"] == "oof":
                rows.pop(msg["sow_key"], None)
        worker.join()
    expected = _recompute([r.obj() for r in sow.sow(topic_name, "/qty > 20")])
    got = {tuple(sorted((k, str(v)) for k, v in row.items())): row for row in rows.values()}
    assert got == expected
    print(f"\nmessages by kind: {kinds}; {len(rows)} groups at the end")
    assert kinds.get("publish", 0) > 100 and kinds.get("group_end") == 1


def test_cli_aggregated_subscription(url, topic_name, plane):
    if plane == "cluster":
        pytest.skip("the CLI: on the server plane")
    from sow_redis.client import Sow

    Sow(url).apply_config(_config(topic_name))
    run_cli(url, "publish", "-t", topic_name, "--wait",
            input=b'{"id":1,"sym":"A","px":2}\n{"id":2,"sym":"A","px":4}\n{"id":3,"sym":"B","px":1}\n')
    server = Sow(url).r  # the query part in batches: each partition copied, no HGETALL

    def calls() -> dict[str, int]:
        return command_calls(server, "copy", "hgetall")

    before = calls()
    out = run_cli(url, "sow-and-subscribe", "-t", topic_name, "--grouping", "/sym",
                  "--projection", "/sym", "--projection", "AVG(/px) AS /avg",
                  "--projection", "COUNT(/id) AS /n", "--count", "3", "--timeout", "5")
    after = calls()
    assert (after["copy"] - before["copy"], after["hgetall"] - before["hgetall"]) == (4, 0)
    import orjson

    lines = [orjson.loads(x) for x in out.stdout.splitlines()]
    assert sorted((m["data"]["sym"], m["data"]["avg"], m["data"]["n"]) for m in lines
                  if m["kind"] == "sow") == [("A", 3.0, 2), ("B", 1.0, 1)]
    assert lines[-1]["kind"] == "group_end" and lines[-1]["count"] == 2
    bad = run_cli(url, "sow-and-subscribe", "-t", topic_name, "--grouping", "/sym",
                  "--projection", "MEDIAN(/px) AS /m", "--count", "1", check=False)
    err = bad.stderr.decode().strip().splitlines()
    assert bad.returncode == 1 and len(err) == 1 and "unknown function 'MEDIAN'" in err[0], err


def test_float_sums_are_exact_and_rounded_once():
    """Floats summed as integers of 2**-1074 give what exact rational sums give: one
    rounding of the true sum (here where naive float addition is off), subnormals and
    values near the float range included; AVG too; int-only SUM stays an int."""
    from fractions import Fraction

    rnd = random.Random(5)
    values = [0.1, 0.2, 0.3, 1e16, 1.0, -1e16, 5e-324, -2.5e-310, 1.7e308, -1.7e308]
    values += [rnd.uniform(-1e6, 1e6) for _ in range(200)]
    agg = Aggregation(["/g", "SUM(/v) AS /sum", "AVG(/v) AS /avg", "SUM(/i) AS /isum",
                       "AVG(/i) AS /iavg"], ["/g"], "x")
    for n, v in enumerate(values):
        agg.upsert(str(n), {"g": 1, "v": v, "i": n})
    for n in range(0, len(values), 7):  # replace some, remove some: totals go down too
        agg.upsert(str(n), {"g": 1, "v": values[n] / 3, "i": -n})
        values[n] /= 3
    for n in range(3, len(values), 11):
        agg.remove(str(n))
    kept = {n: v for n, v in enumerate(values) if n < 3 or (n - 3) % 11}
    ints = {n: (-n if n % 7 == 0 else n) for n in kept}
    [(_, row)] = agg.rows()
    exact = sum(Fraction(v) for v in kept.values())
    assert row["sum"] == float(exact) != sum(kept.values())
    assert row["avg"] == float(exact / len(kept))
    assert row["isum"] == sum(ints.values()) and type(row["isum"]) is int
    assert row["iavg"] == float(Fraction(sum(ints.values()), len(ints)))


def test_keys_only_changes_and_min_max_under_replacement():
    """upsert_keys / remove_keys say what changed without building rows (the deriver reads
    each changed row once); MIN / MAX stay exact when a member holding the extreme is
    replaced by a beating, equal or worse value, or removed."""
    proj = ["/g", "MIN(/v) AS /lo", "MAX(/v) AS /hi", "COUNT(/v) AS /n"]
    agg = Aggregation(proj, ["/g"], "x")
    rnd = random.Random(8)
    current: dict[str, dict] = {}
    for step in range(3000):
        key = str(rnd.randrange(40))
        if rnd.random() < 0.1:
            changed = agg.remove_keys(key)
            current.pop(key, None)
        else:
            rec = {"g": rnd.randrange(3), "v": rnd.choice([rnd.randrange(50), None, 25, 24.5])}
            changed = agg.upsert_keys(key, rec)
            current[key] = rec
            assert changed[-1][0] == "publish" and changed[-1][2] is None
        assert all(row is not None for kind, _k, row in changed if kind == "oof")
        if step % 100 == 99:
            fresh = Aggregation(proj, ["/g"], "x")
            for k, rec in current.items():
                fresh.upsert(k, rec)
            assert sorted(map(str, (r for _, r in agg.rows()))) == \
                sorted(map(str, (r for _, r in fresh.rows())))


def test_updates_of_changing_types_equal_a_recompute():
    """Updates that change a value's type (1, 1.0, true, "1", null, missing) or only some
    fields, moves between groups (grouped by values of those types too) and removals: after
    every 50 of 4,000 random changes the rows equal the rows computed afresh from the same
    records; a MIN / MAX tie of 1 and 1.0 may show either, and so may a group of 1 and 1.0
    (one group: one key), so those compare as numbers."""
    proj = ["/g", "COUNT(/v) AS /n", "SUM(/v) AS /sum", "AVG(/v) AS /avg", "MIN(/v) AS /lo",
            "MAX(/v) AS /hi", "SUM(/w) AS /wsum", "MAX(/w) AS /whi", "COUNT(/s) AS /sn"]
    values = [1, 1.0, True, False, "1", None, 2, 2.5, -3, 0, 0.0]
    rnd = random.Random(26)
    agg = Aggregation(proj, ["/g"], "x")
    current: dict[str, dict] = {}

    def rows(a: Aggregation) -> list[str]:
        out = []
        for _, row in a.rows():
            row = dict(row)
            for name in ("lo", "hi", "whi", "g"):
                if type(row[name]) in (int, float):
                    row[name] = float(row[name])
            out.append(repr(sorted(row.items(), key=lambda kv: kv[0])))
        return sorted(out)

    for step in range(4000):
        key = str(rnd.randrange(30))
        roll = rnd.random()
        if roll < 0.1:
            agg.remove_keys(key)
            current.pop(key, None)
            continue
        rec = dict(current.get(key, {}))
        if roll < 0.2 or not rec:
            rec["g"] = rnd.choice([1, 1.0, True, "1", None, 2])
        for field in ("v", "w", "s"):
            if rnd.random() < 0.5:
                choice = rnd.choice([*values, "missing"])
                if choice == "missing":
                    rec.pop(field, None)
                else:
                    rec[field] = choice
        agg.upsert_keys(key, rec)
        current[key] = rec
        if step % 50 == 49:
            fresh = Aggregation(proj, ["/g"], "x")
            for k, r in current.items():
                fresh.upsert(k, r)
            assert rows(agg) == rows(fresh), f"step {step}"


def _reference_rows(projection: list[str], grouping: list[str],
                    records: dict[str, dict]) -> list[str]:
    """The rows of ``records``, computed afresh the plain way (no running totals, no generated
    code): exact sums with Fraction, MIN / MAX of the numbers; each row as sorted text, the
    numbers of MIN, MAX and the grouping values as floats (a tie of 1 and 1.0 may show either,
    and 1 and 1.0 group alike)."""
    from fractions import Fraction

    from sow_redis.model.aggregate import _text
    from sow_redis.model.values import get_path, split_path

    spec = parse_projection(projection, grouping)
    groups: dict[tuple, list[dict]] = {}
    for rec in records.values():
        values = tuple(get_path(rec, g) for g in spec.grouping)
        groups.setdefault(tuple(_text(v) for v in values), []).append(rec)
    out = []
    for members in groups.values():
        row: dict = {}
        for path in spec.fields:
            row["/".join(path)] = get_path(members[0], path)
        for agg in spec.aggregates:
            values = [get_path(m, agg.path) for m in members]
            numbers = [v for v in values if type(v) in (int, float)]
            if agg.function == "COUNT":
                value = sum(v is not None for v in values)
            elif agg.function in ("MIN", "MAX"):
                value = (min if agg.function == "MIN" else max)(numbers) if numbers else None
            elif not numbers:
                value = None
            else:
                exact = sum(Fraction(v) for v in numbers)
                if agg.function == "AVG":
                    value = float(exact / len(numbers))
                elif all(type(v) is int for v in numbers):
                    value = int(exact)
                else:
                    value = float(exact)
            row["/".join(agg.name)] = value
        out.append(row)
    return sorted(_comparable(row, spec) for row in out)


def _comparable(row: dict, spec) -> str:
    loose = {"/".join(a.name) for a in spec.aggregates if a.function in ("MIN", "MAX")}
    loose |= {"/".join(p) for p in spec.fields}
    return repr(sorted((k, float(v) if k in loose and type(v) in (int, float) else v)
                       for k, v in row.items()))


def _flat(row: dict, prefix: str = "") -> dict:
    """A row with nested names (``/t/avg``) as ``{"t/avg": …}``."""
    out = {}
    for k, v in row.items():
        if type(v) is dict:
            out.update(_flat(v, f"{prefix}{k}/"))
        else:
            out[prefix + k] = v
    return out


@pytest.mark.parametrize(("projection", "grouping"), [
    (["/g", "COUNT(/id) AS /count", "SUM(/qty) AS /qty", "AVG(/px) AS /avg_px",
      "MIN(/px) AS /lo", "MAX(/px) AS /hi", "MAX(/n) AS /n"], ["/g"]),  # bench_views' view
    (["/g", "/h", "MIN(/v) AS /lo", "COUNT(/v) AS /n", "SUM(/w) AS /s"], ["/g", "/h"]),
    (["/a/g", "AVG(/a/v) AS /t/avg", "MAX(/a/v) AS /t/hi", "COUNT(/id) AS /t/n",
      "SUM(/a/v) AS /sum"], ["/a/g"]),
    (["/g", "MAX(/v) AS /hi", "SUM(/v) AS /s", "COUNT(/w) AS /c"], ["/g"]),
])
def test_generated_aggregation_equals_a_plain_recompute(projection, grouping):
    """The code an Aggregation generates for its projection (one or more grouping fields,
    nested paths, inputs shared by several aggregates or read by one) keeps the rows equal to
    the rows computed the plain way from the same records, through 3,000 random inserts,
    updates (numbers of the same and of another type, non-numbers, nulls, missing fields,
    moves between groups) and removals, checked every 25."""
    rnd = random.Random(" ".join(projection))
    agg = Aggregation(projection, grouping, "x")
    spec = agg.spec
    current: dict[str, dict] = {}

    def value():
        return rnd.choice([rnd.randrange(-50, 50), round(rnd.uniform(-99, 99), 2), 0.1, 1, 1.0,
                           True, None, "7", 5e-324, 1e300, rnd.randrange(-50, 50)])

    def record(key: str) -> dict:
        rec = random_record(rnd, key, value)
        if rnd.random() < 0.05:
            rec.pop("id")
        return rec

    for step in range(3000):
        key = str(rnd.randrange(40))
        if rnd.random() < 0.1:
            agg.remove_keys(key)
            current.pop(key, None)
        else:
            rec = record(key) if key not in current or rnd.random() < 0.3 else dict(
                current[key], **{rnd.choice(["v", "w", "qty", "px", "n"]): value()})
            agg.upsert_keys(key, rec)
            current[key] = rec
        if step % 25 == 24:
            got = sorted(_comparable(_flat(row), spec) for _, row in agg.rows())
            assert got == _reference_rows(projection, grouping, current), f"step {step}"
