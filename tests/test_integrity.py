"""Nothing in the transaction log is taken on trust (issue 23, item 1): an entry is applied only
if its SOW key, partition and index members are what the topic's definition gives for its
data; anything else goes to the error stream with its reason, whoever wrote it. Each case
writes the entry as any client with the right to XADD could (the ACL ``publisher`` role),
then lets a worker drain the partition."""

from __future__ import annotations

import orjson

from sow_redis import keys
from sow_redis.apply.jobs import drain_partition
from sow_redis.client import Sow
from sow_redis.model.entries import make_entry
from sow_redis.model.messages import index_members, key_of, partition_for
from sow_redis.settings import Settings


def _topic(sow: Sow, name: str, extra: str = "", partitions: int = 1):
    sow.apply_config(f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = {partitions}\n'
                     f"{extra}")
    return sow.topic(name)


def _drain(sow: Sow, t, p: int = 0) -> int:
    n, drained = drain_partition(sow.r, t, p, Settings(), linger_ms=0)
    assert drained
    return n


def _reasons(sow: Sow, name: str) -> list[str]:
    return [e["reason"] for e in sow.errors(name)]


def test_a_forged_key_is_rejected_not_stored(url, topic_name):
    """A publish whose ``k`` is not the SOW key of its data: rejected as ``forged_key``; the
    record is not stored under that key (nor under its own)."""
    sow = Sow(url)
    t = _topic(sow, topic_name)
    good = orjson.dumps({"id": 1, "v": 1})
    sow.r.xadd(keys.log(t.name, 0), make_entry("publish", good, None, None,
                                               key_of({"id": 1}, t)))
    sow.r.xadd(keys.log(t.name, 0), make_entry("publish", b'{"id": 2, "v": 2}', None, None,
                                               "forgedkey"))
    sow.r.xadd(keys.log(t.name, 0), {"cmd": "publish", "data": b'{"a":"\xff"}', "k": "ffdata"})
    sow.r.xadd(keys.log(t.name, 0), {"cmd": "delta_publish", "data": b'{"id": 1, "w": 3}',
                                     "k": "forgedkey"})
    assert _drain(sow, t) == 4
    recs = {rec.sow_key: rec.obj() for rec in sow.sow(t.name)}
    print(f"records {recs}, rejected {_reasons(sow, t.name)}")
    assert recs == {key_of({"id": 1}, t): {"id": 1, "v": 1}}
    assert sorted(_reasons(sow, t.name)) == ["bad_json", "forged_key", "forged_key"]
    assert sow.r.hget(keys.records(t.name, 0), "forgedkey") is None


def test_a_key_of_another_partition_is_rejected(url, topic_name):
    """A correct ``k`` written to the log of a partition its data does not belong to: one SOW
    key must never live in two partitions."""
    sow = Sow(url)
    t = _topic(sow, topic_name, partitions=2)
    msg = next({"id": i} for i in range(100) if partition_for({"id": i}, t,
                                                               key_of({"id": i}, t)) == 0)
    sow.publish(t.name, [msg], wait=True)
    forged = make_entry("publish", orjson.dumps({**msg, "v": "x"}), None, None, key_of(msg, t))
    sow.r.xadd(keys.log(t.name, 1), forged)
    assert _drain(sow, t, 1) == 1
    assert sow.r.hlen(keys.records(t.name, 1)) == 0
    assert [rec.obj() for rec in sow.sow(t.name)] == [msg]
    assert _reasons(sow, t.name) == ["wrong_partition"]


def test_forged_index_members_are_rejected(url, topic_name):
    """A publish with the right key but index members of other values (it would hide the
    record from index queries) is rejected as ``forged_members``; index queries find every
    record."""
    sow = Sow(url)
    t = _topic(sow, topic_name, 'hash_index = [["/sym"]]\n')
    log_key = keys.log(t.name, 0)
    for i in range(3):
        msg = {"id": i, "sym": "IBM"}
        members = index_members(msg, t, key_of(msg, t))
        if i == 1:
            members = index_members({"id": i, "sym": "XXX"}, t, key_of(msg, t))
        sow.r.xadd(log_key, make_entry("publish", orjson.dumps(msg), None, None,
                                       key_of(msg, t), members))
    sow.r.xadd(log_key, {"cmd": "publish", "data": b'{"id": 1, "sym": "IBM"}'})  # no k, no m
    assert _drain(sow, t) == 4
    found = sorted(rec.obj()["id"] for rec in sow.sow(t.name, "/sym = 'IBM'"))
    print(f"IBM records found by the index: {found}; rejected {_reasons(sow, t.name)}")
    assert found == [0, 1, 2]
    assert _reasons(sow, t.name) == ["forged_members"]


def test_a_key_on_a_chaining_topic_is_rejected(url, topic_name):
    """On a chaining topic the SOW key is the chain's, resolved by the workers: an entry that
    claims one would skip chain resolution."""
    sow = Sow(url)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\npartitions = 1\n'
                     'key = ["/DocumentNumber", "/ParentDocument"]\n'
                     'key_generator = { type = "chaining" }\n')
    t = sow.topic(topic_name)
    sow.r.xadd(keys.log(t.name, 0), {"cmd": "publish", "data": b'{"DocumentNumber": "A"}',
                                     "k": "forgedkey"})
    sow.r.xadd(keys.log(t.name, 0), {"cmd": "publish", "data": b'{"DocumentNumber": "B"}'})
    assert _drain(sow, t) == 2
    assert [rec.obj()["DocumentNumber"] for rec in sow.sow(t.name)] == ["B"]
    assert _reasons(sow, t.name) == ["forged_key"]


def test_a_forged_entry_before_a_write_through_is_not_applied_by_it(url, topic_name):
    """The publisher's write-through applies only the entries its own call appends to a
    caught-up partition: a forged entry appended before them holds them back for the workers,
    which reject it and apply the rest."""
    sow = Sow(url)
    t = _topic(sow, topic_name)
    sow.r.xadd(keys.log(t.name, 0), make_entry("publish", b'{"id": 9}', None, None, "forgedkey"))
    sow.publish(t.name, [{"id": 1}, {"id": 2}])
    assert sow.r.hlen(keys.records(t.name, 0)) == 0  # nothing applied by the write-through
    assert _drain(sow, t) == 3
    assert sorted(rec.obj()["id"] for rec in sow.sow(t.name)) == [1, 2]
    assert _reasons(sow, t.name) == ["forged_key"]


def test_entries_of_a_trusted_appender_are_applied_unread_others_are_verified(
        url, topic_name, monkeypatch):
    """A publisher that may run scripts appends through apply.lua (appended), which records the
    entries it leaves unapplied as a trusted range: a worker applies them without reading
    them (no verification in Python). An entry appended with a plain XADD, even a correct
    one, is read and verified first. Ranges the cursor passed are dropped."""
    from sow_redis.apply import applier as apply_mod
    from sow_redis.publish.append import append

    calls = []
    real = apply_mod.verified_prepared

    def spy(e, topic, p):
        calls.append(e.id)
        return real(e, topic, p)

    monkeypatch.setattr(apply_mod, "verified_prepared", spy)
    sow = Sow(url)
    t = _topic(sow, topic_name)
    res = append(sow.r, t, [("publish", {"id": i, "v": i}, None) for i in range(100)])
    assert res.published == 100
    assert sow.r.zcard(keys.trusted(t.name, 0)) == 1
    assert _drain(sow, t) == 100
    assert calls == []  # applied unread
    assert sow.r.zcard(keys.trusted(t.name, 0)) == 0
    sid = sow.r.xadd(keys.log(t.name, 0), make_entry(
        "publish", b'{"id": 7, "v": "raw"}', None, None, key_of({"id": 7}, t))).decode()
    assert _drain(sow, t) == 1
    assert calls == [sid]
    assert {r.obj()["id"]: r.obj()["v"] for r in sow.sow(t.name)}[7] == "raw"
    assert sow.errors(t.name) == []
