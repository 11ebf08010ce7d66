"""Bad log entries never stop a partition; rejections are written once; events are JSON.

Issue 7 items 5, 8 and 11, issue 8 item 3. Entries are written with raw XADD, as any Redis
client may, so they bypass the publisher's checks and reach the worker as they are.
"""

from __future__ import annotations

import orjson
import pytest
from conftest import run_cli, start_worker
from redis import Redis

from sow_redis import keys
from sow_redis.apply.applier import apply_batch
from sow_redis.apply.scripts import Scripts
from sow_redis.client import Sow
from sow_redis.errors import FencedError
from sow_redis.publish.append import append, append_delete_all_partitions

DEEP = 300  # deeper than orjson encodes (254)


def nested(depth: int) -> dict:
    obj: dict = {"leaf": 1}
    for _ in range(depth):
        obj = {"n": obj}
    return obj


def deep_json(depth: int) -> bytes:
    return b'{"n":' * depth + b'{"leaf":1}' + b"}" * depth


def _topic(sow, name, extra=""):
    sow.apply_config(f'[[topic]]\nname = "{name}"\nkey = ["/k"]\npartitions = 1\n{extra}')
    return sow.topic(name)


def _xadd(sow, t, fields):
    return sow.r.xadd(keys.log(t.name, 0), fields).decode()


def _drain(sow, t, sid):
    sow.handoff(t, {0: sid}, True, 30)


def test_poison_entries_go_to_the_error_stream_and_the_partition_moves_on(sow, topic_name):
    """Each kind of poison seen in issue 7.5 is rejected with its reason; the good entries
    around them are applied, in order."""
    t = _topic(sow, topic_name, 'hash_index = [["/sym"]]')
    deep = deep_json(DEEP)
    bad = [
        # a record nested deeper than the encoder allows (a delta onto it could not be stored)
        ({"cmd": "publish", "data": b'{"k":1,"a":' + deep + b"}"}, "too_deep"),
        # a hash_index field holding such an object
        ({"cmd": "publish", "data": b'{"k":2,"sym":' + deep + b"}"}, None),
        # a key nested that deep
        ({"cmd": "publish", "data": b'{"k":' + deep + b"}"}, None),
        # sow_delete whose keys / filter hold the byte \xff
        ({"cmd": "sow_delete", "keys": b"QUJD\xff"}, "bad_encoding"),
        ({"cmd": "sow_delete", "filter": b"/k = '\xff'"}, "bad_encoding"),
        # a sow_delete by keys with a key no SOW key can be
        ({"cmd": "sow_delete", "keys": b'a"b'}, "bad_sow_key"),
        # a sow_delete filter nesting deeper than the parser recurses
        ({"cmd": "sow_delete", "filter": ("NOT " * 600 + "/k = 1").encode()}, None),
        ({"cmd": "sow_delete", "filter": " OR ".join(["/k = 1"] * 600).encode()}, None),
        ({"cmd": "frobnicate", "data": b'{"k":3}'}, "bad_command"),
    ]
    ids = []
    for i, (fields, _reason) in enumerate(bad):
        ids.append(_xadd(sow, t, fields))
        _xadd(sow, t, {"cmd": "publish", "data": b'{"k":%d,"good":true}' % (100 + i)})
    last = _xadd(sow, t, {"cmd": "publish", "data": b'{"k":999,"good":true}'})
    _drain(sow, t, last)

    got = {r.obj()["k"]: r.obj() for r in sow.sow(t.name)}
    for i in range(len(bad)):
        assert got[100 + i] == {"k": 100 + i, "good": True}
    assert got[999] == {"k": 999, "good": True}
    errors = sow.errors(t.name)
    print(f"{len(bad)} poison entries -> {len(errors)} error-stream entries: "
          f"{[(e['reason']) for e in errors]}")
    by_id = {e["id"]: e for e in errors}
    # the filter with 600 OR terms is valid AMPS: it evaluates (flat chains need no recursion)
    # or is rejected with a reason, but either way it never stops the partition
    for sid, (fields, reason) in zip(ids, bad):
        if reason is not None:
            assert by_id[sid]["reason"] == reason, by_id.get(sid)
    assert len(by_id) == len(errors), "one error entry per rejected log entry"
    assert all(e["reason"] and e["detail"] for e in errors)
    assert 1 not in got


def test_a_batch_whose_apply_call_fails_is_retried_entry_by_entry(url, topic_name, monkeypatch):
    """A Lua error caused by one entry rejects that entry only (issue 7.5: "a failing batch
    is retried entry by entry so one bad entry cannot hold back the rest")."""
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name)
    import sow_redis.apply.scripts as scripts_module

    real = scripts_module._pack_op

    def pack(op):
        # an op the script cannot run: apply.lua answers with an error reply
        packed = real(op)
        return ("bogus", *packed[1:]) if b"POISON" in getattr(op, "data", b"") else packed

    monkeypatch.setattr(scripts_module, "_pack_op", pack)
    # delta_publish: entries the worker plans into ops (plain publishes are applied by
    # apply.lua (log) without ops)
    res = sow.delta_publish(t.name, [{"k": i, "v": "POISON" if i == 3 else "ok"}
                                     for i in range(6)], wait=True)
    assert res.published == 6
    got = sorted(r.obj()["k"] for r in sow.sow(t.name))
    errors = sow.errors(t.name)
    print(f"applied {len(got)} of 6, rejected {len(errors)}: {[e['reason'] for e in errors]}")
    assert got == [0, 1, 2, 4, 5]
    assert [(e["reason"], orjson.loads(e["data"])["k"]) for e in errors] == [("apply_failed", 3)]


def test_rejections_are_written_once_when_a_fenced_batch_is_redone(r, topic_name):
    """Issue 7.11: a batch refused by the fencing token writes nothing; the worker that
    redoes it writes one error entry per bad log entry."""
    sow = Sow(client=r)
    t = _topic(sow, topic_name)
    scripts = Scripts(r)
    append(r, t, [("publish", b'{"k":1}', None)])
    r.xadd(keys.log(t.name, 0), {"cmd": "publish", "data": b"not json"})
    lease, state = keys.lease(t.name, 0), keys.state(t.name, 0)
    stale = scripts.lease_acquire(lease, state, "zombie", 60_000)
    r.delete(lease)  # the lease ran out; another worker takes over with a newer token
    fresh = scripts.lease_acquire(lease, state, "worker-b", 60_000)
    assert fresh > stale
    with pytest.raises(FencedError):
        apply_batch(r, scripts, t, 0, stale, 100)
    assert sow.errors(t.name) == []
    assert apply_batch(r, scripts, t, 0, fresh, 100)[0] == 2
    assert apply_batch(r, scripts, t, 0, fresh, 100)[0] == 0
    errors = sow.errors(t.name)
    assert [e["reason"] for e in errors] == ["bad_json"]


def test_delete_events_carry_the_id_of_the_deleting_log_entry(url, topic_name):
    """Issue 8.3: the event of a sow_delete names the log entry that caused it."""
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name)
    sow.publish(t.name, [{"k": 1}, {"k": 2}, {"k": 3}], wait=True)
    with sow.subscribe(t.name, oof=True) as sub:
        by_filter = append_delete_all_partitions(sow.r, t, {"filter": "/k = 1"})
        sow.handoff(t, by_filter, True, 30)
        key2 = [r.sow_key for r in sow.sow(t.name, "/k = 2")][0]
        by_keys = append_delete_all_partitions(sow.r, t, {"keys": key2})
        sow.handoff(t, by_keys, True, 30)
        by_data = append(sow.r, t, [("sow_delete", b'{"k":3}', None)]).last_ids
        sow.handoff(t, by_data, True, 30)
        evs = [sub.get(timeout=5) for _ in range(3)]
    assert [(e["op"], e["data"]["k"], e["id"]) for e in evs] == [
        ("sow_delete", 1, by_filter[0]), ("sow_delete", 2, by_keys[0]),
        ("sow_delete", 3, by_data[0])]


def test_events_and_with_key_output_are_valid_json_whatever_the_key(url, topic_name):
    """Issue 7.8: events are built by an encoder; a raw SOW key with a newline is refused."""
    sow = Sow(url, inline=True)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\npartitions = 1\n')
    t = sow.topic(topic_name)
    with sow.subscribe(t.name) as sub:
        ok = _xadd(sow, t, {"cmd": "publish", "data": b'{"v":"a\\"b\\n"}', "sow_key": "QU+/JD=="})
        bad = _xadd(sow, t, {"cmd": "publish", "data": b'{"v":1}', "sow_key": "QUJD\n"})
        _drain(sow, t, bad)
        ev = sub.get(timeout=5)
    assert ev["sow_key"] == "QU+/JD==" and ev["data"] == {"v": 'a"b\n'} and ev["id"] == ok
    assert [e["reason"] for e in sow.errors(t.name)] == ["bad_sow_key"]
    out = run_cli(url, "sow", "-t", t.name, "--with-key").stdout.splitlines()
    assert [orjson.loads(line) for line in out] == [
        {"sow_key": "QU+/JD==", "seq": 1, "expiry_ms": 0, "data": {"v": 'a"b\n'}}]


def test_raw_redis_client_cannot_break_the_partition(redis_server, topic_name):
    """The same poison written by a plain redis-py client is rejected by a worker process."""
    r = Redis.from_url(redis_server)

    Sow(client=r).apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\npartitions = 1\n')
    r.xadd(keys.log(topic_name, 0), {"cmd": "sow_delete", "keys": b"\xff\xfe"})
    proc = start_worker(redis_server, "--burst")
    try:
        proc.wait(timeout=60)
    finally:
        proc.kill()
    done = run_cli(redis_server, "status").stdout
    assert f'"topic":"{topic_name}"' in done.decode()
    errors = Sow(client=r).errors(topic_name)
    assert [e["reason"] for e in errors] == ["bad_encoding"]
