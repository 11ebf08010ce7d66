"""Subscriptions by SOW keys (issue 25 item 8; AMPS ``SowKeys`` on ``subscribe`` and
``sow_and_subscribe``): only the changes of those keys arrive, the query part returns only
those records, ``--filter`` must hold as well, and out-of-focus notices come only for them."""

from __future__ import annotations

import orjson
import pytest
from conftest import run_cli

from sow_redis.errors import KeyListError


def _setup(sow, name, n=4):
    """A topic keyed by /k with records k=1..n (px = 10·k); returns {k: SOW key}."""
    sow.apply_config(f'[[topic]]\nname = "{name}"\nkey = ["/k"]\npartitions = 2\n')
    sow.publish(name, [{"k": k, "px": 10 * k} for k in range(1, n + 1)])
    return {rec.obj()["k"]: rec.sow_key for rec in sow.sow(name)}


def _drain(sub, idle=0.3):
    out = []
    while (m := sub.get(timeout=idle)) is not None:
        out.append(m)
    return out


def _seen(msgs):
    return sorted((m["data"]["k"], m["kind"], m.get("reason"), m["data"]["px"]) for m in msgs)


def test_subscribe_by_keys_delivers_only_their_changes_and_oof(sow, topic_name):
    key = _setup(sow, topic_name)
    with sow.subscribe(topic_name, "/px > 15", oof=True, keys=[key[1], key[2]]) as sub:
        sow.publish(topic_name, {"k": 1, "px": 50})  # k1: matches now → publish
        sow.delta_publish(topic_name, {"k": 1, "px": 5})  # k1 stops matching → oof match
        sow.publish(topic_name, {"k": 3, "px": 60})  # not a subscribed key: nothing
        sow.publish(topic_name, {"k": 2, "px": 70})  # k2 → publish
        sow.publish(topic_name, {"k": 2, "px": 1})  # k2 no longer matches → oof match
        sow.publish(topic_name, {"k": 2, "px": 80})  # k2 again → publish
        sow.sow_delete(topic_name, keys=[key[2]])  # k2 deleted → oof deleted
        sow.sow_delete(topic_name, keys=[key[4]])  # another key: nothing
        got = _drain(sub)
    assert _seen(got) == [
        (1, "oof", "match", 5), (1, "publish", None, 50),
        (2, "oof", "deleted", 80), (2, "oof", "match", 1),
        (2, "publish", None, 70), (2, "publish", None, 80)]
    assert {m["sow_key"] for m in got} == {key[1], key[2]}


def test_subscribe_by_keys_without_filter_and_empty_list(sow, topic_name):
    key = _setup(sow, topic_name)
    with sow.subscribe(topic_name, keys=[key[3]]) as three, \
            sow.subscribe(topic_name, keys=[]) as none:
        for k in (1, 2, 3, 4):
            sow.publish(topic_name, {"k": k, "px": 100 + k})
        got_three, got_none = _drain(three), _drain(none, idle=0.05)
    assert _seen(got_three) == [(3, "publish", None, 103)]
    assert got_none == []


def test_sow_and_subscribe_by_keys_queries_only_those_records(sow, topic_name):
    key = _setup(sow, topic_name)
    with sow.sow_and_subscribe(topic_name, "/px > 15", oof=True,
                               keys=[key[1], key[2], key[3]]) as sub:
        first = _drain(sub, idle=0.05)
        sow.publish(topic_name, {"k": 4, "px": 99})  # not subscribed: nothing
        sow.publish(topic_name, {"k": 1, "px": 16})  # k1 now matches → publish
        sow.sow_delete(topic_name, keys=[key[3]])  # k3 was in the query result → oof
        live = _drain(sub)
    assert [m["kind"] for m in first] == ["sow", "sow", "group_end"]
    assert sorted(m["data"]["k"] for m in first[:2]) == [2, 3]
    assert first[-1]["count"] == 2
    assert _seen(live) == [(1, "publish", None, 16), (3, "oof", "deleted", 30)]


def test_subscription_keys_are_checked(sow, topic_name):
    _setup(sow, topic_name, n=1)
    with pytest.raises(KeyListError, match="not a SOW key"):
        sow.subscribe(topic_name, keys=["a,b"])
    with pytest.raises(KeyListError, match="one string"):
        sow.sow_and_subscribe(topic_name, keys="abc")


def test_cli_keys_on_subscribe_and_sow_and_subscribe(url, topic_name):
    from sow_redis.client import Sow

    sow = Sow(url, inline=True)
    key = _setup(sow, topic_name)
    out = run_cli(url, "sow-and-subscribe", "-t", topic_name, "--keys", f"{key[2]},{key[4]}",
                  "-f", "/px < 30", "--count", "2", "--timeout", "5").stdout
    lines = [orjson.loads(line) for line in out.splitlines()]
    assert [(m["kind"], m.get("data")) for m in lines] == [
        ("sow", {"k": 2, "px": 20}), ("group_end", None)]
    bad = run_cli(url, "subscribe", "-t", topic_name, "--keys", "no!key", "--timeout", "1",
                  check=False)
    assert bad.returncode == 1
    err = bad.stderr.decode().strip()
    assert "not a SOW key" in err and len(err.splitlines()) == 1 and "Traceback" not in err
    agg = run_cli(url, "sow-and-subscribe", "-t", topic_name, "--keys", key[1], "--grouping",
                  "/k", "--projection", "/k", check=False)
    assert agg.returncode == 2 and "--keys" in agg.stderr.decode()


def test_sow_and_subscribe_as_of_by_keys(sow, topic_name):
    from sow_redis.feed.bookmark import Bookmark
    from sow_redis.feed.changes import current_seqs

    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\npartitions = 2\n'
                     'history = { window = "1d" }\n')
    sow.publish(topic_name, [{"k": k, "px": 10 * k} for k in range(1, 5)])
    key = {rec.obj()["k"]: rec.sow_key for rec in sow.sow(topic_name)}
    when = str(Bookmark(tuple(current_seqs(sow.r, sow.topic(topic_name)))))  # this point
    sow.publish(topic_name, [{"k": 2, "px": 21}, {"k": 4, "px": 41}])  # after the point
    with sow.sow_and_subscribe(topic_name, as_of=when, keys=[key[2], key[3]]) as sub:
        got = _drain(sub)
    # the query as of the point (k2 still 20), then k2's change since; nothing of k1 or k4
    seen = [(m["kind"], (m.get("data") or {}).get("k"), (m.get("data") or {}).get("px"))
            for m in got if m["kind"] != "completed"]
    assert sorted(seen[:2]) == [("sow", 2, 20), ("sow", 3, 30)]
    assert seen[2:] == [("group_end", None, None), ("publish", 2, 21)]
