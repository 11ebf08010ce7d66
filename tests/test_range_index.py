"""Range (memo) indexes (``index = ["/px"]``, issue 25.3): the members every write path keeps,
the plan a query takes, and the index agreeing with a scan on random data."""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import asdict

import orjson
import pytest
from conftest import run_cli, wait_until

from sow_redis import keys
from sow_redis.apply.jobs import drain_partition
from sow_redis.apply.scripts import Scripts
from sow_redis.client import Sow
from sow_redis.config import parse_topics, to_toml
from sow_redis.errors import ConfigError
from sow_redis.expirer import expire_topic
from sow_redis.model.entries import make_entry
from sow_redis.model.messages import index_members, key_of
from sow_redis.model.rangeindex import (NUMBER, Bound, lex_ranges, member, member_key,
                                        score_range, stored_members, to_number)
from sow_redis.model.topic import SHAPE_FIELDS
from sow_redis.model.values import get_path, split_path
from sow_redis.publish.through import WriteThrough
from sow_redis.query import sow as sow_module
from sow_redis.query.filter import compile_filter
from sow_redis.query.sow import range_candidates, scan_partition
from sow_redis.settings import Settings

OPS = ("<", "<=", ">", ">=", "=")


def _topic(sow, name, extra="", partitions=3):
    sow.apply_config(f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = {partitions}\n'
                     f'index = ["/px", "/s"]\n{extra}')
    return sow.topic(name)


def _value(rng: random.Random):
    """A random field value of every kind the filter coerces (or the field left out)."""
    kind = rng.randrange(14)
    if kind < 4:
        return rng.randint(-50, 50)
    if kind < 6:
        return round(rng.uniform(-50, 50), rng.choice((0, 1, 3)))
    if kind < 8:
        return rng.choice(("7", " 12 ", "-3.5", "1e1", "+4", "0", "-0", "2.50", ".5"))
    if kind < 10:
        return rng.choice(("abc", "Zed", "", "m", "ü", "a" * 80 + "z", "a" * 80 + "b", "x,y/z"))
    if kind == 10:
        return rng.choice(([1, 30], ["b", 2], [], [["x"]]))
    if kind == 11:
        return rng.choice((True, False, {"a": 1}, 2 ** 70, -(2 ** 1100), 1e300, -0.0, 0))
    if kind == 12:
        return None
    return ...  # the field is left out


def _literal(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 4:
        return rng.choice(("-0.0", "0", "1e300", "'-0'"))
    if kind == 0:
        return str(rng.randint(-60, 60))
    if kind == 1:
        return repr(round(rng.uniform(-60, 60), 2))
    if kind == 2:
        return "'{}'".format(rng.choice(("5", "12", "-3.5", "1e1")))
    return "'{}'".format(rng.choice(("a", "abc", "Zed", "m", "", "z", "ü", "a" * 80 + "c")))


def _filters(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        f, g = rng.choice(("/px", "/s")), rng.choice(("/px", "/s"))
        a, b = _literal(rng), _literal(rng)
        op, op2 = rng.choice(OPS), rng.choice(OPS)
        out.append(rng.choice((
            f"{f} {op} {a}",
            f"{a} {op} {f}",
            f"{f} BETWEEN {a} AND {b}",
            f"{f} {op} {a} AND {g} {op2} {b}",
            f"{f} {op} {a} AND ({g} {op2} {b} OR /id < 10)",
            f"{f} {op} {a} AND {f} {op2} {b}",
        )))
    return out


def _records(rng: random.Random, n: int) -> list[dict]:
    out = []
    for i in range(n):
        msg = {"id": i}
        for field in ("px", "s"):
            v = _value(rng)
            if v is not ...:
                msg[field] = v
        out.append(msg)
    return out


def _all(sow, t) -> dict[str, dict]:
    return {rec.sow_key: rec.obj() for p in range(t.partitions)
            for rec in scan_partition(sow.r, t, p)}


def _check_members(sow, t) -> int:
    """Every range index holds exactly the members the records give (and nothing else): the
    numbers by score in the numbers' set, the rest in the lex set; the hash of index members
    keeps what stored_members says. Returns the number of members checked."""
    n = 0
    for p in range(t.partitions):
        recs = {rec.sow_key: rec.obj() for rec in scan_partition(sow.r, t, p)}
        for j, path in enumerate(t.index):
            jj = len(t.hash_index) + j
            lex = {m.decode() for m in sow.r.zrange(keys.index(t.name, p, jj), 0, -1)}
            nums = {k.decode(): s for k, s in
                    sow.r.zrange(keys.range_numbers(t.name, p, jj), 0, -1, withscores=True)}
            wanted = {k: member(get_path(obj, split_path(path)), k) for k, obj in recs.items()}
            assert lex == {m for m in wanted.values() if m and not m.startswith(NUMBER)}, \
                (p, path)
            assert nums == {k: float(m[1:]) for k, m in wanted.items()
                            if m.startswith(NUMBER)}, (p, path)
            n += len(lex) + len(nums)
        ixm = {k.decode(): v.decode() for k, v in
               sow.r.hgetall(keys.index_members(t.name, p)).items()}
        assert ixm == {k: stored_members(index_members(obj, t, k)) for k, obj in recs.items()
                       if stored_members(index_members(obj, t, k))}
    return n


def _agree(sow, t, filters: list[str]) -> tuple[int, int]:
    """Each filter: the plan reads a range index, and the query returns exactly the records
    a scan evaluating the filter on every record returns. (planned, matched) counts."""
    everything = _all(sow, t)
    planned = matched = 0
    for text in filters:
        plan = sow.explain(t.name, text)
        assert plan.kind == "range_index", (text, plan)
        planned += 1
        pred = compile_filter(text)
        want = sorted(k for k, obj in everything.items() if pred(obj))
        got = sorted(rec.sow_key for rec in sow.sow(t.name, text))
        assert got == want, text
        matched += len(got)
    return planned, matched


# -- encoding (no server) -------------------------------------------------------------------


def test_members_sort_as_the_filter_compares():
    """Numbers (and numeric texts) are scores of their value, other texts sort by code point;
    the SOW key never takes part in the order; NULL has no member."""
    rng = random.Random(7)
    nums = [rng.uniform(-1e6, 1e6) for _ in range(300)] + [0, -0.0, 1, -1, 2 ** 60,
                                                          -math.inf, math.inf, 5e-324]
    for x in nums:
        m = member(x, "k")
        assert m.startswith(NUMBER) and float(m[1:]) == float(x), x
    assert member(-0.0, "k") == member(0, "k") == "#0.0"
    texts = ["", "a", "ab", "abc", "b", "Z", "ü", "日本", "a" * 100]
    assert [member_key(m) for m in sorted(member(x, x or "-") for x in texts)] == \
        [x or "-" for x in sorted(texts)]
    assert member(" 12 ", "k") == member(12, "k") == member("12", "k") == "#12.0"
    assert member("1e1", "k") == "#10.0" and member(2 ** 70, "k") == NUMBER + repr(2.0 ** 70)
    assert [member(v, "k")[0] for v in ([1], {"a": 1}, True, 2 ** 1100)] == ["z"] * 4
    assert member(None, "k") == ""
    assert member_key(member("x", "a/b,c")) == "a/b,c"
    assert to_number(" 1e2 ") == 100.0 and to_number("1,5") is None
    # what the hash of index members keeps: numbers as "#", no entry for numbers alone
    assert stored_members("#1.5") == "" and stored_members(",#2.0") == ""
    assert stored_members("ab:k,#3.0,s61/k") == "ab:k,#,s61/k"
    assert stored_members(",z/k") == ",z/k"


def test_score_and_lex_ranges_bound_their_values():
    """A number bounds the numbers' scores and leaves no text; a text bounds the other texts
    and leaves every number (a numeric text compares with it as text); arrays and the like
    are always read."""
    assert score_range([Bound(">", 10)]) == ("10.0", "+inf")
    assert score_range([Bound(">=", 1), Bound("<=", 5.5)]) == ("1.0", "5.5")
    assert score_range([Bound(">", 5), Bound("<", 1)]) is None
    assert score_range([Bound("=", -0.0)]) == ("0.0", "0.0")
    assert score_range([Bound(">=", "abc"), Bound("<", 3)]) == ("-inf", "3.0")
    assert score_range([Bound("<", 2 ** 1100)]) == ("-inf", "+inf")
    assert lex_ranges([Bound(">", 10)]) == [(b"[z", b"(z\xff")]
    ranges = lex_ranges([Bound(">=", "abc"), Bound("<=", "abd")])
    assert ranges == [(b"[s616263", b"(s6162640"), (b"[z", b"(z\xff")]
    assert lex_ranges([Bound(">=", "b"), Bound("<", "a")]) == [(b"[z", b"(z\xff")]
    assert lex_ranges([Bound("<", "b")])[0] == (b"[s", b"(s620")
    for fn in (lex_ranges, score_range):
        with pytest.raises(ValueError, match="op must be"):
            fn([Bound("!=", 1)])


def test_range_terms_come_from_the_top_level_and_only():
    assert compile_filter("/px > 10 AND /q = 'x'").range_terms() == {
        "/px": [Bound(">", 10)], "/q": [Bound("=", "x")]}
    assert compile_filter("10 <= /px").range_terms() == {"/px": [Bound(">=", 10)]}
    assert compile_filter("/px BETWEEN 1 AND 5").range_terms() == {
        "/px": [Bound(">=", 1), Bound("<=", 5)]}
    for text in ("/px > 1 OR /q = 2", "NOT /px > 1", "/px > /q", "/px != 3",
                 "/px NOT BETWEEN 1 AND 2", "/px > NULL", "/px < true", "/px + 1 > 3"):
        assert compile_filter(text).range_terms() == {}, text


def test_config_checks_index():
    (t,) = parse_topics('[[topic]]\nname = "a"\nkey = ["/id"]\nindex = ["/px", "/t/x"]\n')
    assert t.index == ("/px", "/t/x") and t.n_indexes == 2
    assert parse_topics(to_toml([t])) == [t]  # config show → config apply
    plain = parse_topics('[[topic]]\nname = "a"\nkey = ["/id"]\n')[0]
    assert plain.fingerprint != t.fingerprint
    assert "index" not in to_toml([plain])
    # a topic without range indexes keeps the fingerprint stored before they existed
    shape = {f: v for f, v in asdict(plain).items() if f in ("name", *SHAPE_FIELDS[:-1])}
    assert SHAPE_FIELDS[-1] == "index" and plain.fingerprint == hashlib.sha1(
        orjson.dumps(shape, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
    for bad, what in (('index = "/px"', "'index' must be a list of field paths"),
                      ('index = ["px"]', "'index': field path must look like"),
                      ('index = ["/px", "/px"]', "'index': a field path is named twice")):
        with pytest.raises(ConfigError, match=what):
            parse_topics(f'[[topic]]\nname = "a"\nkey = ["/id"]\n{bad}\n')


# -- on a server and on the cluster ----------------------------------------------------------


@pytest.mark.parametrize("extra", ["", 'expiration = "1h"\n', 'hash_index = [["/id"]]\n'],
                         ids=["bulk", "per-key", "beside-a-hash-index"])
def test_range_index_agrees_with_a_scan_on_random_data(url, topic_name, monkeypatch, extra):
    """Random records (numbers, numeric and other texts, arrays, objects, booleans, NULL,
    missing) and random filters (every operator, BETWEEN, AND with an OR inside, both
    fields): each query reads the index and returns what a scan returns; then after updates
    (a key's value moving between numbers, texts, NULL and the rest), delta publishes,
    deletes by key and by filter, the same again. On a topic without expiration the batch
    writes each key once (bulk); with one, message by message; beside a hash index every key
    keeps an entry of members (write_record.lua: no shortcut for numbers alone)."""
    monkeypatch.setattr(sow_module, "MAX_INDEX_FRACTION", 2.0)  # the index even for wide ranges
    rng = random.Random(2511)
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, extra)
    sow.publish(t.name, _records(rng, 400), wait=True)
    assert _check_members(sow, t) > 500
    planned, matched = _agree(sow, t, _filters(rng, 120))
    print(f"{planned} filters planned on the index, {matched} records matched")
    assert matched > 1000
    plan = sow.explain(t.name, "/px > 40")
    read = sum(len(range_candidates(sow.r, t, p, plan)) for p in range(t.partitions))
    assert 0 < read < 120  # a few numbers above 40, the numeric texts none, arrays and such
    sow.publish(t.name, _records(rng, 150), wait=True)  # rewrites ids 0..149
    sow.delta_publish(t.name, [{"id": i, "px": _value(rng) if i % 3 else None}
                               for i in range(100, 200)], wait=True)
    sow.sow_delete(t.name, "/px > 20 AND /id < 300")
    sow.sow_delete(t.name, keys=[rec.sow_key for rec in sow.sow(t.name, "/id < 30")])
    assert len(_all(sow, t)) < 400
    _check_members(sow, t)
    _agree(sow, t, _filters(rng, 60))


def test_expiry_removes_range_members(url, topic_name):
    """Records that expire leave their range indexes too (expire.lua)."""
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, 'expiration = "1h"\n', partitions=2)
    sow.publish(t.name, [{"id": i, "px": i} for i in range(20)], wait=True)
    sow.publish(t.name, [{"id": i, "px": i} for i in range(10)], wait=True, expiration=0.05)
    scripts = Scripts(sow.r)
    wait_until(lambda: expire_topic(sow.r, scripts, t)[0] >= 0 and len(_all(sow, t)) == 10,
               5, "the ten records expired")
    assert sorted(o["id"] for o in _all(sow, t).values()) == list(range(10, 20))
    assert _check_members(sow, t) == 10
    assert sorted(rec.obj()["id"] for rec in sow.sow(t.name, "/px >= 5")) == list(range(10, 20))


def test_explain_names_the_plan(url, topic_name):
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, 'hash_index = [["/s"]]\n')
    assert sow.explain(t.name, "/px > 10").text == "index /px range (10, +inf)"
    assert sow.explain(t.name, "/px BETWEEN 1 AND 2.5 AND /q = 1").text == \
        "index /px range [1, 2.5]"
    assert sow.explain(t.name, "/s IN ('a', 'b')").text == "hash index /s"
    assert sow.explain(t.name, "/s = 'a' AND /px < 3").text == "index /s range ['a', 'a']"
    assert sow.explain(t.name, "/id = 3").text == "key /id"
    assert sow.explain(t.name, "/q > 3").text == "scan"
    assert sow.explain(t.name, "/px > 3 OR /s < 'a'").text == "scan"
    assert sow.explain(t.name).text == "scan"
    sow.publish(t.name, [{"id": i, "px": i} for i in range(30)], wait=True)
    plan = sow.explain(t.name, "/px > 4")  # 4 to 29 (read inclusive): over MAX_INDEX_FRACTION
    assert (plan.kind, plan.candidates, plan.records) == ("scan", 26, 30)
    assert plan.text == "scan (index /px range (4, +inf) holds 26 of 30 records)"
    assert len(sow.sow(t.name, "/px > 4")) == 25
    plan = sow.explain(t.name, "/px >= 25")
    assert (plan.kind, plan.candidates, plan.records) == ("range_index", 5, 30)
    # two indexed fields: the narrower range is read, whichever comes first
    sow.publish(t.name, [{"id": i, "px": i, "s": f"s{i:02d}"} for i in range(30)], wait=True)
    for text in ("/px >= 3 AND /s >= 's27'", "/s >= 's27' AND /px >= 3"):
        plan = sow.explain(t.name, text)
        assert (plan.text, plan.candidates) == ("index /s range ['s27', +inf)", 3), text
        assert sorted(rec.obj()["id"] for rec in sow.sow(t.name, text)) == [27, 28, 29]
    assert sow.explain(t.name, "/px <= 2 AND /s >= 's10'").text == "index /px range (-inf, 2]"
    out = run_cli(url, "sow", "-t", t.name, "-f", "/px >= 25", "--explain").stdout.decode()
    assert out.splitlines() == [f"{t.name}: index /px range [25, +inf)"]
    bad = run_cli(url, "sow", "-t", t.name, "-f", "/px >", "--explain", check=False)
    assert bad.returncode != 0 and len(bad.stderr.decode().strip().splitlines()) == 1
    assert b"Traceback" not in bad.stderr


def test_a_changed_index_needs_migrate_which_rebuilds_it(url, topic_name):
    """Adding a range index changes the topic's shape: refused while it holds records
    unless migrated; the migration writes the members of every record."""
    sow = Sow(url, inline=True)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 2\n')
    sow.publish(topic_name, [{"id": i, "px": i % 7, "s": str(i)} for i in range(40)],
                wait=True)
    new = f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 2\nindex = ["/px"]\n'
    with pytest.raises(ConfigError, match="'index'"):
        sow.apply_config(new)
    sow.apply_config(new, migrate=True)
    t = sow.topic(topic_name)
    assert t.index == ("/px",)
    assert _check_members(sow, t) == 40
    assert sow.explain(t.name, "/px > 5").kind == "range_index"
    assert len(sow.sow(t.name, "/px > 5")) == sum(1 for i in range(40) if i % 7 > 5)
    assert orjson.loads(t.to_json())["index"] == ["/px"]


def test_forged_range_members_are_rejected(url, topic_name):
    """A publish whose ``m`` holds range members of other values (it would hide the record
    from range queries) is rejected as ``forged_members`` (the trust rule, issue 23.1); range
    queries find every record."""
    sow = Sow(url)
    t = _topic(sow, topic_name, partitions=1)
    log_key = keys.log(t.name, 0)
    for i in range(3):
        msg = {"id": i, "px": 50 + i, "s": "abc"}
        members = index_members({**msg, "px": -1} if i == 1 else msg, t, key_of(msg, t))
        sow.r.xadd(log_key, make_entry("publish", orjson.dumps(msg), None, None,
                                       key_of(msg, t), members))
    sow.r.xadd(log_key, {"cmd": "publish", "data": b'{"id": 1, "px": 51}'})  # no k, no m
    n, drained = drain_partition(sow.r, t, 0, Settings(), linger_ms=0)
    assert (n, drained) == (4, True)
    assert sorted(rec.obj()["id"] for rec in sow.sow(t.name, "/px >= 50")) == [0, 1, 2]
    assert [e["reason"] for e in sow.errors(t.name)] == ["forged_members"]
    _check_members(sow, t)


@pytest.mark.parametrize("indexes", ['["/px"]', '["/px", "/q"]'], ids=["one", "two"])
def test_a_trusted_write_of_bad_scores_indexes_the_others(url, topic_name, indexes):
    """apply.lua's bulk path leaves the scores of number members to ZADD to check (it parses
    them all before adding any): a write-through call whose ``m`` holds scores ZADD refuses
    (NaN, a word, blanks, none; a trusted caller's entries are not verified) neither fails
    nor loses the other members: the call is done again score by score, the good numbers
    indexed, a key with a bad one holding no number (its old one removed)."""
    sow = Sow(url)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 1\n'
                     f'index = {indexes}\n')
    t = sow.topic(topic_name)
    two = len(t.index) == 2
    through = WriteThrough(sow.r)

    def write(scores: dict[int, str]) -> None:
        entries = []
        for i, score in scores.items():
            msg = {"id": i, "px": 1}
            members = f"#{score},#{i}" if two else f"#{score}"
            entries.append(make_entry("publish", orjson.dumps(msg), None, None,
                                      key_of(msg, t), members))
        reply = sow.r.execute_command("EVALSHA", *through.call(t, 0, entries, 60_000, ""))
        assert reply[0] == len(scores), reply  # every entry applied there and then

    write({i: str(i * 1.5) for i in range(6)})
    write({0: "nan", 1: "abc", 2: " 12", 3: "", 4: "7.25", 6: "-inf"})
    nums = {k.decode(): s for k, s in
            sow.r.zrange(keys.range_numbers(t.name, 0, 0), 0, -1, withscores=True)}
    wanted = {"5": 7.5, "4": 7.25, "6": -math.inf}
    assert nums == {key_of({"id": int(k)}, t): s for k, s in wanted.items()}
    assert len(sow.sow(t.name)) == 7
    if two:  # the other index's numbers are all good: every key
        assert sow.r.zcard(keys.range_numbers(t.name, 0, 1)) == 7
