"""Historical SOW (issue 25.1; AMPS SOW History): as-of queries, sow_delete keeping history,
sow_and_subscribe from a point in time, and the window's bounds."""

from __future__ import annotations

import datetime as dt
import json
import random
import time

import orjson
import pytest

from sow_redis.client import Sow
from sow_redis.config import parse_topics
from sow_redis.errors import BookmarkError, ConfigError
from conftest import command_calls, run_cli, wait_until


def _config(name: str, history: bool = True) -> str:
    text = f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = 3\n'
    return text + ('history = { window = "1h", granularity = "1s" }\n' if history else "")


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def _state(sow: Sow, name: str, **kw: object) -> dict:
    return {r.obj()["id"]: r.obj() for r in sow.sow(name, **kw)}


def test_history_configuration():
    (t,) = parse_topics(_config("h"))
    assert t.history_ms == 3_600_000 and t.change_previous
    assert t.change_retention_count == 100_000_000
    with pytest.raises(ConfigError, match="cannot go with change_retention = 0"):
        parse_topics(_config("h") + "change_retention = 0\n")
    with pytest.raises(ConfigError, match="window longer than 0"):
        parse_topics('[[topic]]\nname = "h"\nkey = ["/id"]\nhistory = { granularity = "1s" }\n')


def test_as_of_queries_equal_a_model_at_every_point(sow, topic_name):
    """Random publishes, delta_publishes and sow_deletes; the state after each step is
    recorded with its time; an as-of query at each recorded time equals that state."""
    sow.apply_config(_config(topic_name))
    rng = random.Random(3)
    model: dict[int, dict] = {}
    points: list[tuple[str, dict]] = []
    for step in range(120):
        i = rng.randrange(25)
        roll = rng.random()
        if roll < 0.55:
            rec = {"id": i, "v": step, "g": rng.choice("ab")}
            sow.publish(topic_name, rec)
            model[i] = rec
        elif roll < 0.8 and i in model:
            sow.delta_publish(topic_name, {"id": i, "w": step})
            model[i] = {**model[i], "w": step}
        elif i in model:
            sow.sow_delete(topic_name, f"/id = {i}")
            del model[i]
        if step % 10 == 9:
            time.sleep(0.003)
            points.append((_iso(int(time.time() * 1000)), dict(model)))
            time.sleep(0.003)
    for when, expected in points:
        assert _state(sow, topic_name, as_of=when) == expected, when
    # filters, order and paging apply to the past as to the present
    when, expected = points[len(points) // 2]
    got = [r.obj()["id"] for r in sow.sow(topic_name, "/g = 'a'", order_by="/id DESC",
                                          top_n=3, as_of=when)]
    assert got == sorted((i for i, r in expected.items() if r["g"] == "a"), reverse=True)[:3]
    assert _state(sow, topic_name, as_of="EPOCH") == {}
    # read in batches (an iterator), the past is the same
    for when, expected in points[::4]:
        batched = sow.sow(topic_name, as_of=when, batch_size=3)
        assert not isinstance(batched, list)
        assert {r.obj()["id"]: r.obj() for r in batched} == expected, when
    print(f"\n{len(points)} points checked; {len(model)} records now")


def test_sow_delete_leaves_history_and_errors_are_one_line(sow, topic_name):
    sow.apply_config(_config(topic_name) + f'[[topic]]\nname = "{topic_name}_plain"\n'
                     'key = ["/id"]\n')
    sow.publish(topic_name, [{"id": 1, "v": 1}, {"id": 2, "v": 2}])
    time.sleep(0.005)
    before = _iso(int(time.time() * 1000))
    time.sleep(0.005)
    sow.sow_delete(topic_name, "1=1")
    assert sow.sow(topic_name) == []
    assert _state(sow, topic_name, as_of=before) == {1: {"id": 1, "v": 1}, 2: {"id": 2, "v": 2}}
    with pytest.raises(BookmarkError, match="keeps no history"):
        sow.sow(f"{topic_name}_plain", as_of=before)
    with pytest.raises(BookmarkError, match="not an ISO-8601 time"):
        sow.sow(topic_name, as_of="2026-13-45T99:00:00")


def test_sow_and_subscribe_as_of_then_every_change_then_live(sow, topic_name):
    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": 1, "v": 0}, {"id": 2, "v": 0}])
    time.sleep(0.005)
    when = _iso(int(time.time() * 1000))
    time.sleep(0.005)
    sow.publish(topic_name, {"id": 1, "v": 1})
    sow.sow_delete(topic_name, "/id = 2")
    with sow.sow_and_subscribe(topic_name, oof=True, as_of=when) as sub:
        got = [sub.get(5) for _ in range(6)]
        sow.publish(topic_name, {"id": 3, "v": 3})
        live = sub.get(5)
    kinds = [(m["kind"], m.get("data"), m.get("reason")) for m in got]
    assert sorted(kinds[:2], key=str) == [("sow", {"id": 1, "v": 0}, None),
                                          ("sow", {"id": 2, "v": 0}, None)]
    assert kinds[2][0] == "group_end" and got[2]["count"] == 2
    assert sorted(kinds[3:5], key=str) == sorted(
        [("publish", {"id": 1, "v": 1}, None), ("oof", {"id": 2, "v": 0}, "deleted")], key=str)
    assert kinds[5][0] == "completed"  # the replay caught up: live from here
    assert live is not None and (live["kind"], live["data"]) == ("publish", {"id": 3, "v": 3})


def test_an_as_of_older_than_the_window_names_the_oldest_point_kept(sow, topic_name):
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 1\n'
                     'change_retention = "100ms"\nhistory = { window = "100ms" }\n')
    sow.publish(topic_name, {"id": 0, "v": 0})
    time.sleep(0.01)
    early = _iso(int(time.time() * 1000))
    time.sleep(0.3)
    for v in range(1, 140):  # the feed is trimmed by age every 64 changes
        sow.publish(topic_name, {"id": v % 5, "v": v})
    with pytest.raises(BookmarkError) as info:
        sow.sow(topic_name, as_of=early)
    text = str(info.value)
    assert "older than the change feed" in text and "starts at" in text, text
    assert "resync" not in text and "\n" not in text


def test_cli_as_of(url, topic_name, plane):
    if plane == "cluster":
        pytest.skip("the CLI: on the server plane")
    sow = Sow(url)
    sow.apply_config(_config(topic_name))
    run_cli(url, "publish", "-t", topic_name, "--wait", input=b'{"id": 1, "v": "old"}\n')
    time.sleep(0.005)
    when = _iso(int(time.time() * 1000))
    time.sleep(0.005)
    run_cli(url, "publish", "-t", topic_name, "--wait", input=b'{"id": 1, "v": "new"}\n')
    out = run_cli(url, "sow", "-t", topic_name, "--as-of", when)
    assert [orjson.loads(x) for x in out.stdout.splitlines()] == [{"id": 1, "v": "old"}]
    bad = run_cli(url, "sow", "-t", topic_name, "--as-of", "yesterday-ish", check=False)
    err = bad.stderr.decode().strip().splitlines()
    assert bad.returncode == 1 and len(err) == 1, err


def test_blocks_of_one_millisecond_resolve_to_the_earliest(sow, topic_name):
    """Change blocks sharing a millisecond are ordered by their first seq, not as text (the
    time index orders equal scores by member text: "10" before "9")."""
    from sow_redis import keys
    from sow_redis.feed.changes import seq_at

    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 1\n')
    t = sow.topic(topic_name)
    sow.r.zadd(keys.change_times(topic_name, 0), {"5": 1000, "9": 2000, "10": 2000, "11": 3000})
    sow.r.hset(keys.state(topic_name, 0), "seq", 11)
    assert seq_at(sow.r, t, 0, 1500) == 8   # the block at seq 9 is the first at 2000
    assert seq_at(sow.r, t, 0, 2500) == 10
    assert seq_at(sow.r, t, 0, 3500) == 11


def _random_json(rng: random.Random, depth: int = 0) -> object:
    """A random JSON value: numbers (big, small, negative, exponents), text with escapes and
    non-ASCII characters, nested objects and arrays, empty ones included."""
    roll = rng.random()
    if depth < 2 and roll < 0.15:
        return {rng.choice(["a", "b", 'q"t', "é"]): _random_json(rng, depth + 1)
                for _ in range(rng.randrange(3))}
    if depth < 2 and roll < 0.3:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(3))]
    return rng.choice([rng.randint(-10**18, 10**18), rng.random() * 10 ** rng.randint(-30, 30),
                       rng.choice(["x", 'say "hi"', "back\\slash", "tab\tnew\nline", "ünï ☃",
                                   "}{][,:", ""]), True, False, None, 0, -0.0, 1e300])


def _dumps(rng: random.Random, value: object) -> str:
    """``value`` as JSON text, compact or with random spacing around its separators."""
    text = orjson.dumps(value).decode()
    if rng.random() < 0.5:
        return text
    return json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1]),
                      separators=(rng.choice([",", " , "]), rng.choice([":", " : "])))


def test_a_reverse_delta_rebuilds_the_previous_record_exactly(r):
    """include reverse_delta on the server, 2,000 random pairs of records (spacing, escapes,
    nested values, numbers no re-encoding could keep): the previous record rebuilt from the
    new one and the delta equals the previous record; unchanged members are not carried."""
    from sow_redis.apply.scripts import script_source
    from sow_redis.model.events import _previous

    lua = script_source("include/reverse_delta") + "\nreturn reverse_delta(ARGV[1], ARGV[2])"
    rng = random.Random(25)
    names = ["id", "px", "qty", "n/a", 'k"q', "ü", "tags", "obj"]
    saved = 0
    for _ in range(2_000):
        before = {k: _random_json(rng) for k in rng.sample(names, rng.randrange(len(names)))}
        after = {k: (_random_json(rng) if rng.random() < 0.3 else v)
                 for k, v in before.items() if rng.random() < 0.9}
        after.update({k: _random_json(rng) for k in rng.sample(names, 2)})
        prev_text, data_text = _dumps(rng, before), _dumps(rng, after)
        delta = r.eval(lua, 0, prev_text, data_text)
        assert delta.startswith(b"~"), (prev_text, data_text, delta)
        recorded, rebuilt = _previous(delta, orjson.loads(data_text))
        assert recorded and rebuilt == orjson.loads(prev_text), (prev_text, data_text, delta)
        saved += len(prev_text) - len(delta)
    # not an object, or no record before: the previous text as it is
    assert r.eval(lua, 0, "null", '{"a":1}') == b"null"
    assert r.eval(lua, 0, '{"a":1', '{"a":1}') == b'{"a":1'
    assert r.eval(lua, 0, '{"a":1,"b":[1,2]}', '{"a":1,"b":[1,2],"c":3}') == b'~[{},["c"]]'
    print(f"\n2,000 deltas; {saved} bytes fewer than the previous records whole")


def test_as_of_equals_a_model_after_10000_operations_at_20_points(sow, topic_name):
    """Issue 25.1: 10,000 random publishes, delta_publishes, sow_deletes and expirations
    on the server and on the cluster (about 20 s there; 500 on memory://, whose Lua runs
    about five times slower); the SOW as of 20 random points in time equals the model's state
    at each."""
    from sow_redis.expirer import Expirer
    from sow_redis.model.messages import merge

    sow.apply_config(_config(topic_name) + 'expiration = "1h"\n')
    count = 500 if sow.url.startswith("memory://") else 10_000
    rng = random.Random(2510)
    at = set(rng.sample(range(count), 20))
    model: dict[int, dict] = {}
    points: list[tuple[str, dict]] = []
    expirer = Expirer(sow.r, sow.settings, topics=[topic_name])
    started = time.monotonic()
    for step in range(count):
        i = rng.randrange(200)
        roll = rng.random()
        if roll < 0.5:
            rec = {"id": i, "v": step, "g": rng.choice("ab"), "x": _random_json(rng)}
            sow.publish(topic_name, rec)
            model[i] = rec
        elif roll < 0.8:
            if i in model:
                change = {"id": i, "w": step, "x": _random_json(rng)}
                sow.delta_publish(topic_name, change)
                model[i] = merge(model[i], change)  # nested objects merge
        elif roll < 0.97:
            if i in model:
                sow.sow_delete(topic_name, f"/id = {i}")
                del model[i]
        else:
            sow.publish(topic_name, {"id": i, "v": step}, expiration=0.001)
            model.pop(i, None)
            wait_until(lambda: expirer.run(burst=True) or sow.sow(topic_name, keys=None,
                                                                 filter=f"/id = {i}") == [],
                       10, "the expiry")
        if step in at:
            time.sleep(0.003)
            points.append((_iso(int(time.time() * 1000)), dict(model)))
            time.sleep(0.003)
    took = time.monotonic() - started
    for when, expected in points:
        assert _state(sow, topic_name, as_of=when) == expected, when
    assert _state(sow, topic_name) == model
    print(f"\n{count} operations in {took:.1f} s; {len(points)} points checked")


def test_a_record_due_at_the_point_is_not_in_the_sow_as_of_it(sow, topic_name):
    """A record past its expiry that the expirer had not removed yet at the point is left
    out of the SOW as of the point, as a query at that moment left it out."""
    from sow_redis.expirer import Expirer

    sow.apply_config(_config(topic_name) + 'expiration = "1h"\n')
    sow.publish(topic_name, {"id": 1, "v": 1}, expiration=0.3)
    sow.publish(topic_name, {"id": 2, "v": 2})
    alive = _iso(int(time.time() * 1000) + 50)
    time.sleep(0.4)
    due = _iso(int(time.time() * 1000))
    assert _state(sow, topic_name) == {2: {"id": 2, "v": 2}}  # hidden, not yet removed
    time.sleep(0.005)
    assert Expirer(sow.r, sow.settings, topics=[topic_name]).run(burst=True) == 1
    assert _state(sow, topic_name, as_of=alive) == {1: {"id": 1, "v": 1}, 2: {"id": 2, "v": 2}}
    assert _state(sow, topic_name, as_of=due) == {2: {"id": 2, "v": 2}}


@pytest.mark.parametrize("batch_size", [None, 4])
def test_sow_and_subscribe_as_of_with_concurrent_publishers_has_no_gap_or_duplicate(
        sow, topic_name, batch_size):
    """Issue 25.1: a historical sow_and_subscribe started while another thread publishes,
    delta_publishes and sow_deletes: the query gives the SOW as of the point, then every change
    after it once, in order per partition (consecutive seqs: no gap, no duplicate), through
    the replay into live; folding them gives the SOW at the end. With ``batch_size`` (issue
    25.5) the historical query is read as it is taken, while the publisher goes on."""
    import threading

    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": i, "v": 0} for i in range(30)])
    time.sleep(0.005)
    when = _iso(int(time.time() * 1000))
    time.sleep(0.005)
    sow.publish(topic_name, [{"id": i, "v": 1} for i in range(10)])  # after the point
    stop = threading.Event()

    def publisher(seed: int) -> None:
        rng = random.Random(seed)
        n = 2
        while not stop.is_set() and n < 122:  # 120 operations, however slow the machine
            i = rng.randrange(40)
            roll = rng.random()
            if roll < 0.6:
                sow.publish(topic_name, {"id": i, "v": n})
            elif roll < 0.85:
                sow.delta_publish(topic_name, {"id": i, "w": n})
            else:
                sow.sow_delete(topic_name, f"/id = {i}")
            n += 1

    # one publishing thread beside the subscriber (the fixture's Sow applies inline, under
    # the partitions' leases: two inline appliers would fence each other)
    threads = [threading.Thread(target=publisher, args=(1,))]
    for t in threads:
        t.start()
    mine: dict[str, dict] = {}
    at_point: dict[int, dict] = {}
    seqs: dict[int, list[int]] = {}
    kinds: list[str] = []
    try:
        with sow.sow_and_subscribe(topic_name, oof=True, as_of=when,
                                   batch_size=batch_size) as sub:
            deadline = time.monotonic() + 60
            while True:
                msg = sub.get(1.0)
                if (not threads[0].is_alive() or time.monotonic() > deadline) \
                        and not stop.is_set():
                    stop.set()
                    for t in threads:
                        t.join()
                if msg is None:
                    if stop.is_set():
                        break
                    continue
                kinds.append(msg["kind"])
                if msg["kind"] == "sow":
                    mine[msg["sow_key"]] = msg["data"]
                    at_point[msg["data"]["id"]] = msg["data"]
                elif msg["kind"] in ("publish", "oof"):
                    seqs.setdefault(msg["partition"], []).append(msg["seq"])
                    if msg["kind"] == "publish":
                        mine[msg["sow_key"]] = msg["data"]
                    else:
                        mine.pop(msg["sow_key"], None)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert at_point == {i: {"id": i, "v": 0} for i in range(30)}
    assert kinds.count("sow") == 30 and kinds.index("group_end") == 30
    assert "completed" in kinds and sum(map(len, seqs.values())) > 50
    for p, got in seqs.items():
        assert got == list(range(got[0], got[0] + len(got))), (p, got)
    assert mine == {rec.sow_key: rec.obj() for rec in sow.sow(topic_name)}
    print(f"\n{sum(map(len, seqs.values()))} changes after the point, in order, once each")


def test_a_historical_query_in_batches_reads_a_partition_as_it_is_taken(url, topic_name, plane):
    """``sow_and_subscribe(as_of=…, batch_size=…)`` and ``sow(as_of=…, batch_size=…)``
    (issue 25.5): the first message reads one partition, from a copy (Redis's command
    statistics: 1 ``COPY`` of 3, no ``HGETALL``), the query part all 3, and what comes is
    the SOW as of the point, each message with the query's bookmark; a subscriber closed
    half-way reads no more, and no copy is left behind."""
    if plane == "cluster":
        pytest.skip("Redis's command statistics: on the server plane")
    sow = Sow(url, inline=True)
    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": i, "v": 0} for i in range(60)], wait=True)
    time.sleep(0.005)
    when = _iso(int(time.time() * 1000))
    time.sleep(0.005)
    sow.publish(topic_name, [{"id": i, "v": 1} for i in range(0, 60, 2)], wait=True)
    sow.sow_delete(topic_name, "/id > 49")
    sow.publish(topic_name, [{"id": i, "v": 2} for i in range(100, 110)], wait=True)

    def calls() -> dict[str, int]:
        return command_calls(sow.r, "copy", "hgetall", "hscan")

    def since(before: dict[str, int]) -> dict[str, int]:
        return {c: n - before[c] for c, n in calls().items()}

    before = calls()
    with sow.sow_and_subscribe(topic_name, as_of=when, batch_size=5) as sub:
        first = sub.get(5)
        assert first is not None and first["kind"] == "sow"
        assert since(before)["copy"] == 1
        got = [first]
        while got[-1]["kind"] != "group_end":
            got.append(sub.get(5))
        used = since(before)
    assert used["copy"] == 3 and used["hgetall"] == 0 and used["hscan"] >= 3, used
    marks = {m["bookmark"] for m in got}
    assert len(marks) == 1 and marks != {None}
    assert sorted(m["data"]["id"] for m in got[:-1]) == list(range(60))
    assert all(m["data"]["v"] == 0 for m in got[:-1]) and got[-1]["count"] == 60
    before = calls()
    with sow.sow_and_subscribe(topic_name, as_of=when, batch_size=5) as sub:
        assert sub.get(5)["kind"] == "sow"
    assert since(before)["copy"] == 1  # closed half-way: the other partitions were never read
    batched = sow.sow(topic_name, as_of=when, batch_size=4)
    assert sorted((r.obj()["id"], r.obj()["v"]) for r in batched) == [(i, 0) for i in range(60)]
    before = calls()  # sorted before the first batch: read whole, no copy needed
    ordered = sow.sow(topic_name, as_of=when, batch_size=4, order_by="/id DESC")
    assert [r.obj()["id"] for r in ordered] == list(range(59, -1, -1))
    assert since(before)["copy"] == 0
    assert sow.r.keys("*:snap:*") == []
    with pytest.raises(ValueError, match="batch_size must be 1 or more"):
        sow.sow_and_subscribe(topic_name, as_of=when, batch_size=0)


def test_a_historical_query_in_batches_survives_its_copy_going(url, topic_name, plane,
                                                               monkeypatch):
    """A copy deleted while a historical query in batches scans it (another client, or its
    lifetime): the rest of that partition comes from the partition read whole, and the result
    is still exactly the SOW as of the point, each record once, also when records changed
    meanwhile."""
    import sow_redis.feed.history as history

    if plane == "cluster":
        pytest.skip("deleting the copy by name: on the server plane")
    sow = Sow(url, inline=True)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 1\n'
                     'history = { window = "1h" }\n')
    sow.publish(topic_name, [{"id": i, "v": 0, "pad": "x" * 100} for i in range(400)], wait=True)
    time.sleep(0.005)
    when = _iso(int(time.time() * 1000))
    time.sleep(0.005)
    sow.publish(topic_name, [{"id": i, "v": 1} for i in range(0, 400, 3)], wait=True)
    real_scan, pages = history.scan_page, []

    def scan_then_lose(r, copy, cursor, size):
        pages.append(copy)
        if len(pages) == 2:  # after the first page: the copy goes, then records change
            r.delete(copy)
            sow.publish(topic_name, [{"id": i, "v": 2} for i in range(1, 400, 3)], wait=True)
            sow.sow_delete(topic_name, "/id < 20")
        return real_scan(r, copy, cursor, size)

    monkeypatch.setattr(history, "scan_page", scan_then_lose)
    got = [(r.obj()["id"], r.obj()["v"]) for r in sow.sow(topic_name, as_of=when, batch_size=50)]
    assert len(pages) >= 2
    assert sorted(got) == [(i, 0) for i in range(400)]  # each once, as of the point
    assert sow.r.keys("*:snap:*") == []
