"""Every log entry sees the SOW as of its own log time (issue 7.1: deltas race expiry).

An entry logged at or after a record's due time finds the record gone (the removal is
processed as an expiry first, with its event and dead letter); the expirer does not remove a
record while its partition still holds unapplied entries logged before the due time.
The 60 s race of worker processes and the expirer against a reference model is
``test_faults.py::test_expirer_and_workers_race_for_60s``.
"""

from __future__ import annotations

import time

import pytest

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.expirer import Expirer
from sow_redis.publish.append import append


def _topics(sow, name, partitions=1):
    sow.apply_config(f'''
[[topic]]
name = "{name}"
key = ["/k"]
partitions = {partitions}
expiration = "enabled"
dead_letter = "{name}_dl"

[[topic]]
name = "{name}_dl"
partitions = 1
''')
    return sow.topic(name)


def _wait_due(r, due_ms):
    from sow_redis.connection import server_ms

    while server_ms(r) <= due_ms:
        time.sleep(0.01)


@pytest.fixture
def inline(url):
    return Sow(url, inline=True)


def test_delta_after_due_time_does_not_revive_expired_fields(inline, topic_name):
    """The issue's reproduction: publish with a 1 s lifetime, no expirer, a delta 2 s later
    holds only its own fields; the old record expired first (event + dead letter)."""
    t = _topics(inline, topic_name)
    inline.publish(t.name, {"k": 1, "a": "old"}, expiration=0.2, wait=True)
    rec = inline.r.hget(keys.records(t.name, 0), inline.sow(t.name)[0].sow_key)
    due = int(rec.split(b":", 2)[1])
    _wait_due(inline.r, due)
    with inline.subscribe(t.name, oof=True) as sub:
        inline.delta_publish(t.name, {"k": 1, "b": "new"}, wait=True)
        evs = [sub.get(timeout=5) for _ in range(2)]
    assert [r.obj() for r in inline.sow(t.name)] == [{"k": 1, "b": "new"}]
    assert [(e["op"], e.get("reason"), e["data"]) for e in evs] == [
        ("sow_delete", "expired", {"k": 1, "a": "old"}),
        ("delta_publish", None, {"k": 1, "b": "new"})]
    # the dead letter is forwarded by the expirer (its outbox was filled by the worker)
    Expirer(inline.r, topics=[t.name]).loop()
    inline.handoff(t.name + "_dl", {0: "0-1"})  # applies partition 0 of the dead-letter log
    dl = [r.obj() for r in inline.sow(t.name + "_dl")]
    assert [(d["reason"], d["data"]) for d in dl] == [("expired", {"k": 1, "a": "old"})]


def test_expirer_waits_for_entries_logged_before_the_due_time(inline, topic_name):
    """A delta logged before the due time but not yet applied keeps its base: the expirer
    leaves the record until the delta is applied."""
    t = _topics(inline, topic_name)
    inline.publish(t.name, {"k": 1, "a": "base"}, expiration=0.3, wait=True)
    key = inline.sow(t.name)[0].sow_key
    due = int(inline.r.hget(keys.records(t.name, 0), key).split(b":", 2)[1])
    # logged before the due time, applied after it
    logged = append(inline.r, t, [("delta_publish", b'{"k":1,"b":"delta"}', None, 30)])
    _wait_due(inline.r, due)
    assert Expirer(inline.r, topics=[t.name]).loop()[0] == 0
    assert inline.r.hexists(keys.records(t.name, 0), key)
    inline.handoff(t, logged.last_ids)
    recs = [r.obj() for r in inline.sow(t.name)]
    assert recs == [{"k": 1, "a": "base", "b": "delta"}]


def test_sow_delete_logged_after_due_time_finds_the_record_expired(inline, topic_name):
    t = _topics(inline, topic_name)
    inline.publish(t.name, [{"k": 1}, {"k": 2}], expiration=0.2, wait=True)
    due = max(r.expiry_ms for r in inline.sow(t.name))
    _wait_due(inline.r, due)
    with inline.subscribe(t.name, oof=True) as sub:
        assert inline.sow_delete(t.name, filter="1=1") == 0
        inline.publish(t.name, {"k": 3}, wait=True)
        evs = [sub.get(timeout=2) for _ in range(3)]
    # the filter delete scans what is stored; both records expired before it, not deleted
    assert sorted((e["op"], e.get("reason"), e["data"]["k"]) for e in evs) == [
        ("publish", None, 3), ("sow_delete", "expired", 1), ("sow_delete", "expired", 2)]
