"""Every log entry sees the SOW as of its own log time (issue 7.1: deltas race expiry).

An entry logged at or after a record's due time finds the record gone (the removal is
processed as an expiry first, with its event and dead letter); the expirer does not remove a
record while its partition still holds unapplied entries logged before the due time.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

import orjson
import pytest
from conftest import start_worker
from redis import Redis

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.events import events_of
from sow_redis.expirer import Expirer
from sow_redis.messages import merge
from sow_redis.publisher import append
from sow_redis.settings import Settings


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


# -- the race, against a reference model ----------------------------------------------------

RACE_SECONDS = float(os.environ.get("SOW_RACE_SECONDS", "60"))
RATE = 1000  # messages per second
KEYS = 40
TTLS_MS = (50, 100, 200, 400)


class Model:
    """Reference SOW with expiry at log time: key → (record, due ms or 0)."""

    def __init__(self):
        self.sow: dict[int, tuple[dict, int]] = {}
        self.expired = 0

    def apply(self, t_ms: int, cmd: str, obj: dict, ttl_ms: int | None) -> dict:
        k = obj["k"]
        cur = self.sow.get(k)
        if cur is not None and cur[1] and cur[1] <= t_ms:
            self.expired += 1
            cur = None
        rec = merge(cur[0], obj) if cmd == "delta_publish" and cur is not None else obj
        self.sow[k] = (rec, t_ms + ttl_ms if ttl_ms else 0)
        return rec

    def finish(self) -> dict[int, dict]:
        """After every due time has passed: the records without expiry remain."""
        self.expired += sum(1 for _rec, due in self.sow.values() if due)
        return {k: rec for k, (rec, due) in self.sow.items() if not due}


def test_delta_expiry_race_against_the_reference_model(redis_server, topic_name):
    """Issue 7.1: publish / delta_publish at 1,000 msg/s with lifetimes of 50–400 ms while two
    worker processes and an expirer run. Every change event must equal the reference model's
    record after that log entry, and the final SOW and the expiry count must match it."""
    r = Redis.from_url(redis_server)
    sow = Sow(client=r, settings=Settings.from_env(redis_url=redis_server))
    t = _topics(sow, topic_name, partitions=2)
    events: list[dict] = []
    stop = threading.Event()
    ready = threading.Event()

    def listen():
        ps = Redis.from_url(redis_server).pubsub(ignore_subscribe_messages=True)
        ps.subscribe(keys.channel(t.name))
        ready.set()
        while not stop.is_set():
            msg = ps.get_message(timeout=0.2)
            if msg:
                events.extend(events_of(msg["data"]))
        ps.close()

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    ready.wait(5)
    expirer = Expirer(Redis.from_url(redis_server), topics=[t.name])
    exp_thread = threading.Thread(target=expirer.run, daemon=True)
    exp_thread.start()
    workers = [start_worker(redis_server, SOW_LOG_MAX_LEN="100000000") for _ in range(2)]
    rng = random.Random(7)
    published = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < RACE_SECONDS:
            tick = time.monotonic()
            batch = []
            for _ in range(RATE // 100):
                k = rng.randrange(KEYS)
                cmd = "delta_publish" if rng.random() < 0.6 else "publish"
                body = {"k": k, f"f{rng.randrange(6)}": published}
                ttl = rng.choice(TTLS_MS) / 1000 if rng.random() < 0.8 else None
                batch.append((cmd, orjson.dumps(body), None, ttl))
                published += 1
            res = append(r, t, batch)
            assert not res.rejected
            from sow_redis.jobs import ensure_jobs

            ensure_jobs(r, t.name, list(res.last_ids), sow.settings)
            time.sleep(max(0.0, 0.01 - (time.monotonic() - tick)))
        # let the workers catch up and every lifetime run out, then a last expirer pass
        deadline = time.monotonic() + 60
        while any(r.hget(keys.state(t.name, p), "cursor") != r.xrevrange(
                keys.log(t.name, p), count=1)[0][0] for p in range(2)):
            assert time.monotonic() < deadline, "workers did not catch up"
            time.sleep(0.05)
        time.sleep(max(TTLS_MS) / 1000 + 0.5)
    finally:
        for w in workers:
            w.kill()
            w.wait()
        expirer.stop()
        exp_thread.join(5)
        time.sleep(0.3)
        stop.set()
        listener.join(5)

    # the reference model replays the log in id order within each partition
    model = Model()
    expected: dict[tuple[int, str], dict] = {}  # (key value, stream id): ids repeat across partitions
    for p in range(2):
        for sid, f in r.xrange(keys.log(t.name, p)):
            ms = int(sid.split(b"-")[0])
            ttl = round(float(f[b"expiration"]) * 1000) if b"expiration" in f else None
            obj = orjson.loads(f[b"data"])
            expected[obj["k"], sid.decode()] = model.apply(ms, f[b"cmd"].decode(), obj, ttl)
    final = model.finish()
    upserts = [e for e in events if e["op"] != "sow_delete"]
    per_id = Counter((e["data"]["k"], e["id"]) for e in upserts)
    lost = len(expected) - len(per_id)
    duplicated = sum(n - 1 for n in per_id.values() if n > 1)
    wrong = [e for e in upserts if e["data"] != expected[e["data"]["k"], e["id"]]]
    expired = sum(1 for e in events if e["op"] == "sow_delete" and e["reason"] == "expired")
    got = {rec.obj()["k"]: rec.obj() for rec in sow.sow(t.name)}
    print(f"\n{RACE_SECONDS:.0f} s at {RATE} msg/s: published {published}, applied "
          f"{len(per_id)}, lost {lost}, duplicated {duplicated}, wrong records {len(wrong)}, "
          f"expired events {expired} (model {model.expired}), records {len(got)} "
          f"(model {len(final)})")
    assert published == len(expected)
    assert (lost, duplicated, len(wrong)) == (0, 0, 0), wrong[:3]
    assert expired == model.expired
    assert got == final
    assert sow.errors(t.name) == []
