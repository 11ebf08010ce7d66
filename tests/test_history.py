"""Historical SOW (issue 25.1; AMPS SOW History): as-of queries, sow_delete keeping history,
sow_and_subscribe from a point in time, and the window's bounds."""

from __future__ import annotations

import datetime as dt
import random
import time

import orjson
import pytest

from sow_redis.client import Sow
from sow_redis.config import parse_topics
from sow_redis.errors import BookmarkError, ConfigError
from tests.conftest import run_cli


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
