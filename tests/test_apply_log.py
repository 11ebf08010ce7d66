"""apply.lua (log) (plain publishes applied inside Redis) writes exactly what the planned path
(worker plans ops, apply.lua) writes, and hands everything else to the worker (issue 9.5).

The same log entries, with the same stream ids, are applied twice to one topic (emptied in
between): once as sow_redis's publisher writes them (SOW key ``k`` and index members ``m``
prepared), once without those fields, as another Redis client writes them, so the worker plans
every entry. Records, expiry scores,
hash indexes, sequences, the error stream and the change events must be identical.
"""

from __future__ import annotations

import orjson
import pytest

from sow_redis import keys
from sow_redis.apply.applier import PartitionApplier
from sow_redis.apply.jobs import drain_partition
from sow_redis.apply.scripts import Scripts
from sow_redis.client import Sow
from sow_redis.errors import FencedError
from sow_redis.feed.live import ShardListener
from sow_redis.model.entries import make_entry
from sow_redis.model.events import events_of
from sow_redis.model.messages import index_members, key_of
from sow_redis.settings import Settings

CONFIGS = {
    "expiring+index": 'expiration = "1h"\nhash_index = [["/sym"], ["/sym", "/side"]]\n'
                      'index = ["/v", "/side"]\n',
    "ttl0-min": 'expiration = 0\nexpiration_policy = "min"\n',
    "plain": "",
}


def _topic(sow, name, extra):
    sow.apply_config(f'[[topic]]\nname = "{name}"\nkey = ["/k"]\npartitions = 1\n{extra}')
    return sow.topic(name)


def _script():
    """A log mixing every kind of entry, with ids in order (ms 1000…): (cmd, message,
    expiration s or None); publishes carry the prepared fields on the first topic."""
    out = []
    for i in range(120):
        k = i % 17
        msg = {"k": k, "sym": "AB"[i % 2], "side": i % 3, "v": i}
        if i % 11 == 5:
            out.append(("delta_publish", {"k": k, "extra": i}, None))
        elif i % 13 == 7:
            out.append(("sow_delete", {"k": k}, None))
        elif i % 19 == 3:
            out.append(("publish", msg, 30.0))  # a message expiration: planned by the worker
        elif i % 23 == 9:
            out.append(("publish", {"k": k, "v": i}, None))  # no index fields
        else:
            out.append(("publish", msg, None))
    return out


def _write(r, t, script, prepared: bool):
    for n, (cmd, msg, exp) in enumerate(script):
        data = orjson.dumps(msg)
        key = key_of(msg, t) if prepared else ""
        members = index_members(msg, t, key) if (prepared and cmd == "publish"
                                                 and t.n_indexes) else ""
        r.xadd(keys.log(t.name, 0), make_entry(cmd, data, None, exp, key, members),
               id=f"{1000 + n}-0")


def _state(r, t):
    n = t.n_indexes
    return {
        "rec": r.hgetall(keys.records(t.name, 0)),
        "exp": r.zrange(keys.expiry(t.name, 0), 0, -1, withscores=True),
        "ixm": r.hgetall(keys.index_members(t.name, 0)),
        "idx": [r.zrange(keys.index(t.name, 0, j), 0, -1) for j in range(n)],
        "num": [r.zrange(keys.range_numbers(t.name, 0, j), 0, -1, withscores=True)
                for j in range(n)],
        # the change feed, event by event (blocks follow the calls, which differ)
        "changes": [e for _sid, f in r.xrange(keys.changes(t.name, 0))
                    for e in events_of(f[b"block"])],
        "seq": r.hget(keys.state(t.name, 0), "seq"),
        "cursor": r.hget(keys.state(t.name, 0), "cursor"),
        "errors": r.xlen(keys.errors(t.name)) + r.xlen(keys.partition_errors(t.name, 0)),
    }


def _events(pubsub):
    out = []
    while (data := pubsub.get(timeout=0.2)) is not None:
        out += events_of(data)
    return out


@pytest.mark.parametrize("config", CONFIGS)
def test_in_redis_apply_writes_what_the_planned_path_writes(backend_url, topic_name, config,
                                                            monkeypatch):
    sow = Sow(backend_url)
    r = sow.r
    t = _topic(sow, topic_name, CONFIGS[config])
    script = _script()
    in_redis = {True: 0, False: 0}
    prepared = True
    real = PartitionApplier._settle_log_run

    def spy(self, call, run):
        applied = real(self, call, run)
        in_redis[prepared] += applied
        return applied

    monkeypatch.setattr(PartitionApplier, "_settle_log_run", spy)
    pubsub = ShardListener(r, [keys.partition_channel(t.name, 0)])
    states, events = [], []
    for prepared in (True, False):
        r.delete(*keys.all_partition_keys(t.name, 1, t.n_indexes))
        _write(r, t, script, prepared)
        n, drained = drain_partition(r, t, 0, Settings(batch_size=16), budget_s=120,
                                     linger_ms=0)
        assert (n, drained) == (len(script), True)
        states.append(_state(r, t))
        events.append(_events(pubsub))
    pubsub.close()
    prepared_publishes = sum(1 for cmd, _m, exp in script if cmd == "publish" and exp is None)
    print(f"{config}: {len(script)} entries, {in_redis[True]} applied in Redis "
          f"(of {prepared_publishes} prepared publishes), {len(events[0])} events, "
          f"{len(states[0]['rec'])} records")
    assert in_redis[False] == 0
    assert in_redis[True] > 10
    assert states[0] == states[1]
    assert states[0]["errors"] == 0
    assert events[0] == events[1]
    if backend_url.startswith("redis://"):  # memory:// has no listener count for pub/sub
        assert len(events[0]) >= len(script) - 10


def test_in_redis_apply_stops_at_an_entry_to_plan_and_resumes_after_it(url, topic_name):
    sow = Sow(url)
    t = _topic(sow, topic_name, "")
    log = keys.log(t.name, 0)
    ids = []
    for i in range(3):
        ids.append(sow.r.xadd(log, make_entry("publish", orjson.dumps({"k": i}), None, None,
                                              key_of({"k": i}, t))))
    sow.r.xadd(log, {"cmd": "publish", "data": b'{"k": 3}'})  # another client: no k
    sow.r.xadd(log, {"cmd": "publish", "data": b"not json", "k": "9"})  # claims a key: stops
    for i in range(4, 7):
        ids.append(sow.r.xadd(log, make_entry("publish", orjson.dumps({"k": i}), None, None,
                                              key_of({"k": i}, t))))
    scripts = Scripts(sow.r)
    fence = scripts.lease_acquire(keys.lease(t.name, 0), keys.state(t.name, 0), "me", 10_000)
    assert scripts.apply_log(t, 0, fence, 100, ids[1]).applied == 2  # none after `upto`
    first = scripts.apply_log(t, 0, fence, 100, ids[-1])
    assert (first.applied, first.stopped) == (1, True)
    # still stopped at the same entry
    assert scripts.apply_log(t, 0, fence, 100, ids[-1]).applied == 0
    scripts.lease_release(keys.lease(t.name, 0), "me")
    n, drained = drain_partition(sow.r, t, 0, Settings(), linger_ms=0)
    assert (n, drained) == (5, True)
    got = sorted(rec.obj()["k"] for rec in sow.sow(t.name))
    errors = sow.errors(t.name)
    print(f"records {got}, rejected {[e['reason'] for e in errors]}")
    assert got == [0, 1, 2, 3, 4, 5, 6]
    assert [e["reason"] for e in errors] == ["bad_json"]


def test_in_redis_apply_refuses_a_stale_fencing_token(url, topic_name):
    sow = Sow(url)
    t = _topic(sow, topic_name, "")
    sid = sow.r.xadd(keys.log(t.name, 0), make_entry("publish", b'{"k": 1}', None, None,
                                                     key_of({"k": 1}, t)))
    scripts = Scripts(sow.r)
    fence = scripts.lease_acquire(keys.lease(t.name, 0), keys.state(t.name, 0), "me", 10_000)
    with pytest.raises(FencedError):
        scripts.apply_log(t, 0, fence + 1, 100, sid)
    assert sow.r.hlen(keys.records(t.name, 0)) == 0
    assert scripts.apply_log(t, 0, fence, 100, sid).applied == 1
