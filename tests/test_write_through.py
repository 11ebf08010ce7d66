"""Write-through (issue 10: publish → subscriber latency): a publisher applies the plain
publishes it appended to a caught-up partition in its own write (lua/apply_appended.lua),
while workers apply deltas and everything behind them. Both may apply the same partition at
once; each log entry must still be applied exactly once and in log order."""

from __future__ import annotations

import random
import threading
import time

import pytest
from conftest import start_worker

from sow_redis.feed.live import ShardListener
from sow_redis import keys
from sow_redis.apply import apply_batch
from sow_redis.client import Sow
from sow_redis.errors import ConflictError
from sow_redis.events import events_of
from sow_redis.ops import Upsert
from sow_redis.publisher import _write_through, append, wait_applied
from sow_redis.scripts import Scripts
from sow_redis.settings import Settings


def cfg(name: str, partitions: int) -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = {partitions}\n'


def test_a_worker_batch_whose_head_was_written_through_is_planned_again(lonely_url, topic_name):
    """apply.lua refuses a batch the cursor lies inside (SOW_CONFLICT), so a worker never
    applies a plan made before a write-through moved the cursor; a batch wholly behind the
    cursor is 'applied before' and skipped."""
    sow = Sow(settings=Settings.from_env(redis_url=lonely_url, write_through=False))
    sow.apply_config(cfg(topic_name, 1))
    t = sow.topic(topic_name)
    r = sow.r
    scripts = Scripts(r)
    fence = scripts.lease_acquire(keys.lease(topic_name, 0), keys.state(topic_name, 0), "w", 5000)
    res = append(r, t, [("publish", b'{"id": 1, "v": 1}', None),
                        ("delta_publish", b'{"id": 1, "w": 2}', None)])
    first, last = sorted(res.last_ids.values())[0], res.last_ids[0]
    ids = [sid.decode() for sid, _ in r.xrange(keys.log(topic_name, 0))]
    assert ids[-1] == last
    # the worker's plan for both entries, made before the write-through below
    plan = [Upsert(ids[0], "k1", b'{"id": 1, "v": 1}', None, False, None, ""),
            Upsert(ids[1], "k1", b'{"id": 1, "v": 1, "w": 2}', None, True, None, "")]
    wt = _write_through(r)
    # the head publish is written through; the delta is left: the job marker is set
    assert r.evalsha(*wt.call(t, 0, 2, 1000)) == [1, ids[0].encode(), 1]
    assert r.exists(keys.job_marker(topic_name, 0))
    with pytest.raises(ConflictError, match="inside the batch"):
        scripts.apply(t, 0, fence, ids[0], ids[1], [], plan)
    assert scripts.apply(t, 0, fence, ids[0], ids[0], [], plan[:1]) == (-1, ids[0])
    # planned again from the cursor: only the delta is left, applied once
    assert apply_batch(r, scripts, t, 0, fence, 100) == (1, ids[1])
    assert [x.obj() for x in sow.sow(topic_name)] == [{"id": 1, "v": 1, "w": 2}]
    assert r.hget(keys.state(topic_name, 0), "seq") == b"2"
    assert first == ids[0] or first == ids[1]


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
    through = _write_through(sow.r).applied
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
