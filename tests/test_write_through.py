"""Write-through (issue 10: publish → subscriber latency): a publisher applies the plain
publishes it appended to a caught-up partition in its own write (lua/include/apply_appended.lua),
while workers apply deltas and everything behind them. Both may apply the same partition at
once; each log entry must still be applied exactly once and in log order."""

from __future__ import annotations

import random
import threading
import time

import pytest
from conftest import start_worker

from sow_redis import keys
from sow_redis.apply.applier import apply_batch
from sow_redis.apply.jobs import QUEUE_KEY, drain_partition
from sow_redis.apply.ops import Upsert
from sow_redis.apply.scripts import Scripts
from sow_redis.client import Sow
from sow_redis.connection import is_cluster
from sow_redis.errors import ConflictError
from sow_redis.feed.live import ShardListener
from sow_redis.model.events import events_of
from sow_redis.model.messages import key_of
from sow_redis.publish.append import append, wait_applied
from sow_redis.publish.through import write_through as _write_through
from sow_redis.settings import Settings


def cfg(name: str, partitions: int) -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = {partitions}\n'


def test_a_write_through_applies_only_its_own_entries_of_a_caught_up_partition(
        lonely_url, topic_name):
    """apply.lua (appended) appends its entries itself and applies them only when the log held
    no unapplied entry before them: entries another client appended (here a publish and a
    delta) are left to the workers, and so are the call's own, behind them (job marker set).
    apply.lua refuses a batch the cursor lies inside (SOW_CONFLICT); a batch wholly behind the
    cursor is 'applied before' and skipped."""
    sow = Sow(settings=Settings.from_env(redis_url=lonely_url, write_through=False))
    sow.apply_config(cfg(topic_name, 1))
    t = sow.topic(topic_name)
    r = sow.r
    scripts = Scripts(r)
    fence = scripts.lease_acquire(keys.lease(topic_name, 0), keys.state(topic_name, 0), "w", 5000)
    append(r, t, [("publish", b'{"id": 1, "v": 1}', None),
                  ("delta_publish", b'{"id": 1, "w": 2}', None)])
    ids = [sid.decode() for sid, _ in r.xrange(keys.log(topic_name, 0))]
    wt = _write_through(r)
    assert wt is not None
    own = {"cmd": "publish", "data": b'{"id": 2, "v": 3}', "k": key_of({"id": 2}, t, None)}
    applied, last, marked, error, log_len = r.evalsha(*wt.call(t, 0, [own], 1000, "j1"))
    assert (applied, marked, error, log_len) == (0, 1, b"", 3)
    assert r.exists(keys.job_marker(topic_name, 0))
    assert [sid for sid, _ in r.xrange(keys.log(topic_name, 0))][-1] == last
    assert sow.sow(topic_name) == []  # nothing applied by the write-through
    # the worker's plan for the first two entries; the head is applied on its own first
    plan = [Upsert(ids[0], "k1", b'{"id": 1, "v": 1}'),
            Upsert(ids[1], "k1", b'{"id": 1, "v": 1, "w": 2}', delta=True)]
    assert scripts.apply(t, 0, fence, ids[0], ids[0], [], plan[:1]) == (1, ids[0])
    with pytest.raises(ConflictError, match="inside the batch"):
        scripts.apply(t, 0, fence, ids[0], ids[1], [], plan)
    assert scripts.apply(t, 0, fence, ids[0], ids[0], [], plan[:1]) == (-1, ids[0])
    # planned again from the cursor: the delta and the write-through's entry, applied once
    assert apply_batch(r, scripts, t, 0, fence, 100) == (2, last.decode())
    got = sorted((x.obj() for x in sow.sow(topic_name)), key=lambda o: o["id"])
    assert got[1:] == [{"id": 1, "w": 2}, {"id": 2, "v": 3}]  # got[0]: plan[:1]'s hand key
    assert r.hget(keys.state(topic_name, 0), "seq") == b"3"


def test_a_write_through_of_a_caught_up_partition_applies_in_the_same_call(lonely_url,
                                                                           topic_name):
    """On a caught-up partition the write-through appends and applies its plain publishes in
    one call and stops before the first delta (left to the workers, job marker set)."""
    sow = Sow(settings=Settings.from_env(redis_url=lonely_url, write_through=False))
    sow.apply_config(cfg(topic_name, 1))
    t = sow.topic(topic_name)
    r = sow.r
    wt = _write_through(r)
    assert wt is not None
    entries = [{"cmd": "publish", "data": b'{"id": %d}' % i, "k": key_of({"id": i}, t, None)}
               for i in range(3)] + [{"cmd": "delta_publish", "data": b'{"id": 0, "x": 1}'}]
    applied, last, marked, error, log_len = r.evalsha(*wt.call(t, 0, entries, 1000, "j2"))
    assert (applied, marked, error, log_len) == (3, 1, b"", 4)
    assert r.xlen(keys.log(topic_name, 0)) == 4
    assert sorted(x.obj()["id"] for x in sow.sow(topic_name)) == [0, 1, 2]
    ids = [sid for sid, _ in r.xrange(keys.log(topic_name, 0))]
    assert ids[-1] == last
    assert r.hget(keys.state(topic_name, 0), "cursor") == ids[2]


def test_an_inline_publish_to_a_caught_up_partition_is_applied_in_its_own_write(
        lonely_url, topic_name):
    """Sow(inline=True) writes its publishes through as a publisher with workers does: a
    publish to a caught-up partition is applied by the write that appends it, so no drain
    follows and no lease is taken (the partition's fencing token stays); a delta_publish,
    planned in Python, is drained inline under a lease; so is every publish with
    SOW_WRITE_THROUGH off."""
    sow = Sow(lonely_url, inline=True)
    sow.apply_config(cfg(topic_name, 1))
    state = keys.state(topic_name, 0)
    fence = sow.r.hget(state, "fence")
    for i in range(10):
        assert sow.publish(topic_name, {"id": i % 3, "v": i}).settled == {0}
    assert sow.r.hget(state, "fence") == fence  # no lease taken
    assert {x.obj()["id"]: x.obj()["v"] for x in sow.sow(topic_name)} == {0: 9, 1: 7, 2: 8}
    assert sow.delta_publish(topic_name, {"id": 1, "w": 1}).settled == set()
    assert int(sow.r.hget(state, "fence")) == int(fence or 0) + 1
    assert sow.sow(topic_name, filter="/id = 1")[0].obj() == {"id": 1, "v": 7, "w": 1}
    off = Sow(settings=Settings.from_env(redis_url=lonely_url, write_through=False), inline=True)
    assert off.publish(topic_name, {"id": 2, "v": 10}).settled == set()
    assert int(sow.r.hget(state, "fence")) == int(fence or 0) + 2
    assert sow.sow(topic_name, filter="/id = 2")[0].obj() == {"id": 2, "v": 10}


def test_a_log_written_through_is_still_trimmed(lonely_url, topic_name):
    """Only an applier's pass trims a log past ``log_max_len``, and no worker passes over a
    partition whose publishes are all written through: the publisher asks for a pass once the
    log grew past the limit (inline: its own drain; with workers: an ingest job). 400
    publishes with ``log_max_len`` 20 leave fewer than 200 entries (Redis trims whole
    stream nodes of 100 entries); before, all 400 stayed."""
    settings = Settings.from_env(redis_url=lonely_url, log_max_len=20)
    inline = Sow(settings=settings, inline=True)
    inline.apply_config(cfg(topic_name, 1))
    log_key = keys.log(topic_name, 0)
    for i in range(400):
        assert inline.publish(topic_name, {"id": i % 5, "v": i}).published == 1
    assert inline.r.xlen(log_key) < 200
    assert {x.obj()["id"]: x.obj()["v"] for x in inline.sow(topic_name)} == {
        i % 5: i for i in range(395, 400)}
    if is_cluster(inline.r):
        return  # workers on a cluster need a control URL: the server plane shows them
    sow = Sow(settings=settings)
    t = sow.topic(topic_name)
    drain_partition(sow.r, t, 0, settings)  # the log as short as a pass leaves it
    before = sow.r.xlen(log_key)
    for i in range(400):
        assert sow.publish(topic_name, {"id": i % 5, "v": -i}).published == 1
    assert sow.r.xlen(log_key) == before + 400  # all written through, none trimmed yet
    assert sow.r.llen(QUEUE_KEY) >= 1 and sow.r.exists(keys.job_marker(topic_name, 0))
    drain_partition(sow.r, t, 0, settings)  # what that job does
    assert sow.r.xlen(log_key) < 200


def test_write_through_and_workers_apply_a_mixed_stream_exactly_once(url, topic_name):
    """20,000 publishes and delta_publishes over 200 keys from Sow.publish (write-through on)
    while two worker processes run: the final SOW equals the model, every log entry has
    exactly one change event, and both paths applied a share."""
    n, nkeys, parts = 20_000, 200, 4
    sow = Sow(url)
    sow.apply_config(cfg(topic_name, parts))
    r = sow.r
    events: dict[tuple[int, str], int] = {}
    sub = ShardListener(r, [keys.partition_channel(topic_name, p) for p in range(parts)])
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            data = sub.get(timeout=0.2)
            if data is not None:
                for ev in events_of(data):
                    key = (ev["partition"], ev["id"])
                    events[key] = events.get(key, 0) + 1

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    workers = [start_worker(url) for _ in range(2)]
    rng = random.Random(11)
    model: dict[int, dict] = {}
    started = time.monotonic()
    try:
        i = 0
        while i < n:
            size = min(rng.choice([1, 1, 3, 10, 50]), n - i)
            batch_pub, batch_delta = [], []
            for _ in range(size):
                k = rng.randrange(nkeys)
                if rng.random() < 0.7:
                    batch_pub.append({"id": k, "v": i})
                else:
                    batch_delta.append({"id": k, f"f{i}": 1})
                i += 1
            # publishes first, then deltas: the model applies them in that order too
            for body in batch_pub:
                model[body["id"]] = dict(body)
            for body in batch_delta:
                model.setdefault(body["id"], {}).update(body)
            if batch_pub:
                sow.publish(topic_name, batch_pub)
            if batch_delta:
                sow.delta_publish(topic_name, batch_delta)
            if size >= 10:
                time.sleep(0.001)
        last = {p: r.xrevrange(keys.log(topic_name, p), count=1)[0][0].decode()
                for p in range(parts)}
        wait_applied(r, sow.topic(topic_name), last, timeout_s=90)
        deadline = time.monotonic() + 10
        while sum(events.values()) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        stop.set()
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=30)
    listener.join(timeout=5)
    elapsed = time.monotonic() - started
    wt = _write_through(sow.r)
    assert wt is not None
    through = wt.applied
    got = {x.obj()["id"]: x.obj() for x in sow.sow(topic_name)}
    logged = sum(r.xlen(keys.log(topic_name, p)) for p in range(parts))
    duplicated = sum(c - 1 for c in events.values() if c > 1)
    wrong = [k for k in model if got.get(k) != model[k]]
    print(f"\nwrite-through + 2 workers: {n} messages in {elapsed:.1f} s, {through} applied by "
          f"the publisher, {n - through} by the workers; events for {len(events)} entries, "
          f"duplicated {duplicated}, wrong records {len(wrong)}")
    assert logged == n and len(events) == n and duplicated == 0
    assert not wrong and len(got) == len(model)
    assert 0 < through < n


def test_trusted_ranges_the_cursor_passed_go_after_a_planned_apply(lonely_url, topic_name):
    """A delta appended by a publisher's write is recorded as a trusted range and applied by
    the planned path (apply.lua planned); the range must go once the cursor passed it. Only
    apply.lua (log) dropped ranges before, which a delta never reaches: a range stayed for
    nearly every delta that followed a write-through publish (168 after 500 deltas among
    167 publishes)."""
    sow = Sow(lonely_url, inline=True)
    sow.apply_config(cfg(topic_name, 1))
    sow.publish(topic_name, [{"id": i} for i in range(10)])
    for i in range(300):
        sow.delta_publish(topic_name, {"id": i % 10, "v": i})
        sow.publish(topic_name, {"id": 10 + i % 10, "w": i})  # written through
    assert sow.r.zcard(keys.trusted(topic_name, 0)) == 0
    cursor = sow.r.hget(keys.state(topic_name, 0), "cursor")
    assert cursor == sow.r.xrevrange(keys.log(topic_name, 0), count=1)[0][0]
    assert {r.obj()["id"]: r.obj().get("v") for r in sow.sow(topic_name)
            if r.obj()["id"] < 10} == {i: 290 + i for i in range(10)}
