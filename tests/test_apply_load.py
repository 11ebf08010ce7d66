"""The bulk load's apply (lua/include/apply_load.lua, sow_redis.spark.load.write_split), without Spark:
batches apply in the load's order whatever order the splits finish in, exactly once on a
retry or a rerun, never ahead of unapplied publishes or during a shape migration; and the
bulk mode of the apply (one write per SOW key and batch) gives what applying message by
message gives."""

from __future__ import annotations

import orjson
import pytest

from sow_redis import keys
from sow_redis.apply.scripts import LoadStatus, Scripts, pack_load_batch
from sow_redis.client import Sow
from sow_redis.model.events import events_of
from sow_redis.publish.append import append, prepare
from sow_redis.spark.load import finish_load, prepare_rows, write_split


def _topic(sow: Sow, name: str, partitions: int = 2) -> object:
    sow.apply_config(f'[[topic]]\nname = "{name}"\nkey = ["/k"]\nkey_domain = "d"\n'
                     'hash_index = [["/g"]]\nindex = ["/v", "/g"]\n'
                     f"partitions = {partitions}\n")
    return sow.topic(name)


def _rows(split: int, n: int) -> list[tuple[bytes, int]]:
    """n messages of split ``split``: keys 0..9 again and again, the group moving."""
    return [(orjson.dumps({"k": i % 10, "g": f"g{(split * n + i) % 3}", "v": split * n + i}),
             split * n + i) for i in range(n)]


def _write(url: str, t: object, load_id: str, batch: int, splits: int, split: int,
           rows: list[tuple[bytes, int]]) -> dict[str, int]:
    """write_split of ``rows`` (split ``split`` of ``splits``); its counts."""
    return next(write_split(url, t.to_json(), load_id, batch, splits, split,
                            prepare_rows(t.to_json(), iter(rows))))


def _feed(sow: Sow, t: object, p: int) -> list[dict]:
    return [ev for _id, f in sow.r.xrange(keys.changes(t.name, p))
            for ev in events_of(f[b"block"])]


def _state(sow: Sow, t: object) -> tuple[dict, list, list]:
    """(records by key, every partition's feed of (seq, key, v), each index's members)."""
    recs = {r.sow_key: r.obj() for r in sow.sow(t.name)}
    feed = [[(e["seq"], e["sow_key"], e["data"]["v"]) for e in _feed(sow, t, p)]
            for p in range(t.partitions)]
    idx = [sorted(sow.r.zrange(keys.index(t.name, p, j), 0, -1)) for p in range(t.partitions)
           for j in range(t.n_indexes)]  # the hash index, then the range indexes
    idx += [sorted(sow.r.zrange(keys.range_numbers(t.name, p, j), 0, -1, withscores=True))
            for p in range(t.partitions) for j in range(t.n_indexes)]  # their numbers
    return recs, feed, idx


def test_splits_apply_in_order_whatever_order_they_finish_in(url, topic_name):
    sow = Sow(url, inline=True)
    loaded = _topic(sow, topic_name + "_l")
    published = _topic(sow, topic_name + "_p")
    splits = [_rows(s, 40) for s in range(3)]
    # split 2 finishes first, then split 1, then split 0 (batches of 7 per partition)
    outs = {s: _write(url, loaded, "L", 7, 3, s, splits[s]) for s in (2, 1, 0)}
    done = finish_load(url, loaded, "L", 3)
    pub = append(sow.r, published, (("publish", line, None) for sp in splits for line, _o in sp))
    sow.handoff(published.name, pub.last_ids)
    print({s: (c["applied"], c["staged"]) for s, c in outs.items()}, done)
    assert outs[2]["applied"] == outs[1]["applied"] == 0  # staged: split 0 was not there
    assert outs[2]["staged"] > 0 and outs[1]["staged"] > 0
    assert outs[0]["applied"] == 120 and done["applied"] == 0  # split 0's task applied all
    a, b = _state(sow, loaded), _state(sow, published)
    assert a == b and len(a[0]) == 10 and sum(len(f) for f in a[1]) == 120
    assert {r["k"]: r["v"] for r in a[0].values()} == {k: 110 + k for k in range(10)}
    for p in range(2):
        assert not sow.r.exists(keys.load_staged(loaded.name, p))
        assert sow.r.hget(keys.loads(loaded.name, p), "L") == b"3:0"


def test_a_retried_split_and_a_rerun_apply_nothing_twice(url, topic_name):
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name)
    rows = _rows(0, 50) + [(b"not json", 50)]
    first = _write(url, t, "R", 8, 1, 0, rows)
    again = _write(url, t, "R", 8, 1, 0, rows)
    finish_load(url, t, "R", 1)
    seqs = sum(int(sow.r.hget(keys.state(t.name, p), "seq") or 0) for p in range(2))
    logs = sum(sow.r.xlen(keys.log(t.name, p)) for p in range(2))
    print(first, again, "seq sum", seqs, "log entries", logs)
    assert (first["applied"], first["rejected"]) == (50, 1)
    assert (again["applied"], again["rejected"], again["staged"]) == (0, 0, 0)
    assert seqs == logs == 50
    assert [e["reason"] for e in sow.errors(t.name)] == ["bad_json"]


def test_a_load_applies_unapplied_publishes_first_and_waits_out_a_migration(url, topic_name):
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, partitions=1)
    early = append(sow.r, t, [("publish", b'{"k": 1, "g": "a", "v": -1}', None)])
    assert early.published == 1  # in the log, not applied (no handoff)
    scripts = Scripts(sow.r)
    _p, fields = prepare(t, ("publish", b'{"k": 1, "g": "b", "v": 7}', None))
    packed = pack_load_batch([fields], [])
    got = scripts.apply_load(t, 0, "B", 1, 0, 0, True, packed, 4)
    assert got.status == LoadStatus.LOG_BACKLOG and got.applied == 0
    assert sow.r.xlen(keys.log(t.name, 0)) == 1  # nothing written
    sow.r.set(keys.lease(t.name, 0), "migrate:test")
    assert scripts.apply_load(t, 0, "B", 1, 0, 0, True, packed, 4).status == LoadStatus.MIGRATING
    sow.r.delete(keys.lease(t.name, 0))
    out = list(write_split(url, t.to_json(), "B", 10, 1, 0, iter([(0, (0, fields, None))])))
    print(out)
    assert out[0]["appended"] == 1 and out[0]["applied"] == 2  # the publish, then the load
    assert [r.obj()["v"] for r in sow.sow(t.name)] == [7]
    assert [(e["seq"], e["data"]["v"]) for e in _feed(sow, t, 0)] == [(1, -1),
                                                                                    (2, 7)]


def test_an_incomplete_load_says_where_it_stopped(url, topic_name):
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name)
    _write(url, t, "I", 5, 2, 1, _rows(1, 10))
    with pytest.raises(RuntimeError, match="stopped at split 0 batch 0 of 2 splits"):
        finish_load(url, t, "I", 2)
    with pytest.raises(RuntimeError, match="another number of splits than 3"):
        finish_load(url, t, "I", 3)
    with pytest.raises(RuntimeError, match="another number of splits than 3"):
        _write(url, t, "I", 5, 3, 0, _rows(0, 10))  # raised by the task's sender thread
    assert sow.sow(t.name) == []  # split 1 stays staged until split 0 comes
    _write(url, t, "I", 5, 2, 0, _rows(0, 10))
    finish_load(url, t, "I", 2)
    assert {r.obj()["k"]: r.obj()["v"] for r in sow.sow(t.name)} == {k: 10 + k for k in range(10)}


def test_the_bulk_apply_equals_message_by_message(url, topic_name):
    """apply.lua (log) writes each SOW key once per batch (bulk mode, a topic without expiration);
    apply.lua (the worker's planned ops: a topic with expiration planned by the worker) writes
    message by message. Same records, index members, feed and insert/update counts."""
    sow = Sow(url, inline=True)
    bulk = _topic(sow, topic_name + "_b")
    sow.apply_config(f'[[topic]]\nname = "{topic_name}_m"\nkey = ["/k"]\nkey_domain = "d"\n'
                     'hash_index = [["/g"]]\nindex = ["/v", "/g"]\n'
                     'partitions = 2\nexpiration = "enabled"\n')
    one = sow.topic(topic_name + "_m")
    msgs = [orjson.dumps({"k": i % 7, "g": ["x", "y", None][i % 3] if i % 5 else None, "v": i})
            for i in range(300)]
    for t in (bulk, one):
        res = append(sow.r, t, (("publish", m, None) for m in msgs))
        sow.handoff(t.name, res.last_ids)
    a, b = _state(sow, bulk), _state(sow, one)
    stats = [[sow.r.hmget(keys.state(t.name, p), "n_insert", "n_update") for p in range(2)]
             for t in (bulk, one)]
    print(len(a[0]), [len(f) for f in a[1]], stats)
    assert a == b and len(a[0]) == 7 and sum(len(f) for f in a[1]) == 300
    assert stats[0] == stats[1]
