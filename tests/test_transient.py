"""Transient topics and the recovery point (issue 25, item 2; AMPS SOW ``Durability`` and
``RecoveryPoint``, seeds/004): a transient topic's log is kept, and a partition whose SOW
was lost (records and state gone, log kept) is rebuilt from it by the workers' code when it
is next applied, from the topic's ``recovery_point``. Run on a server and on the cluster
(``plane``), on a Redis no worker serves (``lonely_url``): this process applies, with the
workers' code (:func:`sow_redis.apply.jobs.apply_here`)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from conftest import run_cli, start_worker, wait_until

from sow_redis import keys
from sow_redis.apply.jobs import _trim, apply_here, lagging_partitions
from sow_redis.apply.scripts import Scripts
from sow_redis.client import Sow
from sow_redis.config import parse_topics, to_toml
from sow_redis.errors import ConfigError
from sow_redis.model.topic import TopicConfig
from sow_redis.rebuild import drop_sow
from sow_redis.settings import Settings

PARTS = 2


def cfg(name: str, extra: str = 'persistence = "transient"\n') -> str:
    return (f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = {PARTS}\n'
            f'hash_index = [["/sym"]]\nexpiration = "enabled"\n' + extra)


def setup(url: str, name: str, extra: str = 'persistence = "transient"\n'
          ) -> tuple[Sow, TopicConfig, Settings]:
    settings = Settings.from_env(redis_url=url)
    sow = Sow(settings=settings, inline=True)
    sow.apply_config(cfg(name, extra))
    return sow, sow.topic(name), settings


def snapshot(r, t: TopicConfig) -> dict:
    """Everything a partition's SOW holds, but the change seqs (a rebuild gives new ones):
    records (expiry, stream id, data), expiry set, index members, hash indexes."""
    out = {}
    for p in range(t.partitions):
        recs = {}
        for k, v in r.hgetall(keys.records(t.name, p)).items():
            head, body = v.split(b"\n", 1)
            recs[k] = (head.split(b":")[1:], body)
        out[p] = (recs, r.zrange(keys.expiry(t.name, p), 0, -1, withscores=True),
                  r.hgetall(keys.index_members(t.name, p)),
                  [r.zrange(keys.index(t.name, p, n), 0, -1) for n in range(len(t.hash_index))])
    return out


def lose_sow(r, t: TopicConfig) -> None:
    """What a Redis that kept no RDB/AOF of the SOW keys, or a FLUSH of them, leaves: every
    SOW key of every partition gone, the log (and the change feed) kept."""
    for p in range(t.partitions):
        for k in [keys.records(t.name, p), keys.state(t.name, p), keys.expiry(t.name, p),
                  keys.index_members(t.name, p), keys.acks(t.name, p), keys.chain(t.name, p),
                  *(keys.index(t.name, p, n) for n in range(len(t.hash_index)))]:
            r.delete(k)


def rebuild(r, t: TopicConfig, settings: Settings) -> int:
    return apply_here(r, t, list(range(t.partitions)), settings, timeout=10)


def publish_mix(sow: Sow, name: str) -> None:
    sow.publish(name, [{"id": i, "sym": "ABC"[i % 3], "px": i} for i in range(30)])
    sow.delta_publish(name, [{"id": i, "px": 100 + i, "sym": "Z"} for i in range(0, 12, 2)])
    assert sow.sow_delete(name, filter="/id < 5") == 5
    sow.publish(name, {"id": 40, "sym": "E", "px": 1}, expiration=3600)
    sow.publish(name, {"id": 41, "sym": "E", "px": 2}, expiration=0)


def test_a_transient_topic_rebuilt_after_its_records_are_removed(lonely_url, topic_name):
    """Publish, delta_publish, sow_delete and expiring publishes, applied; the SOW keys of
    every partition removed (the log kept): the workers' code rebuilds records, expiry
    times, index members and indexes equal to what the SOW held, replays the applied
    entries without change events (the feed gets no new block), and the change seqs go on
    after the feed's last one, so the next change follows it."""
    sow, t, settings = setup(lonely_url, topic_name)
    r = sow.r
    publish_mix(sow, topic_name)
    before = snapshot(r, t)
    assert sum(len(recs) for recs, *_ in before.values()) == 27
    assert any(exp for _recs, exp, *_ in before.values())  # id 40's expiry is in it
    feed = {p: r.xlen(keys.changes(topic_name, p)) for p in range(PARTS)}
    seqs = {p: int(r.hget(keys.state(topic_name, p), "seq")) for p in range(PARTS)}
    logs = {p: r.xlen(keys.log(topic_name, p)) for p in range(PARTS)}

    lose_sow(r, t)
    assert sow.sow(topic_name) == []
    assert lagging_partitions(r, t) == list(range(PARTS))  # a worker's sweep finds them
    assert rebuild(r, t, settings) == sum(logs.values())
    assert snapshot(r, t) == before
    assert {p: r.xlen(keys.changes(topic_name, p)) for p in range(PARTS)} == feed
    for p in range(PARTS):
        state = r.hgetall(keys.state(topic_name, p))
        assert int(state[b"seq"]) > seqs[p]
        assert state[b"rebuild_to"] == r.xrevrange(keys.log(topic_name, p), count=1)[0][0]
    got = {x.obj()["id"]: x.obj() for x in sow.sow(topic_name)}
    assert got[6] == {"id": 6, "sym": "Z", "px": 106} and 3 not in got and len(got) == 27

    # applied again with its cursor in place: nothing is rebuilt, nothing changes
    assert rebuild(r, t, settings) == 0 and snapshot(r, t) == before
    # the next change is live again, with the seq after the replayed ones
    sow.publish(topic_name, {"id": 7, "sym": "A", "px": 0})
    grown = [p for p in range(PARTS) if r.xlen(keys.changes(topic_name, p)) == feed[p] + 1]
    assert len(grown) == 1 and all(r.xlen(keys.changes(topic_name, p)) == feed[p]
                                   for p in range(PARTS) if p not in grown)
    last_block = r.xrevrange(keys.changes(topic_name, grown[0]), count=1)[0][0]
    assert int(last_block.split(b"-")[0]) > seqs[grown[0]]


def test_workers_rebuild_a_lost_sow_when_it_is_lost_and_when_they_start(url, topic_name):
    """``sow-redis worker``: a running worker's sweep finds a partition of a transient topic
    without its applied cursor (no new entry needed) and rebuilds it; a worker started on a
    Redis whose transient topic lost its SOW (records and state, as a restart without RDB/AOF
    for them leaves it) finds it at its first sweep. Both rebuild the records as they were."""
    sow, t, _settings = setup(url, topic_name)
    r = sow.r
    publish_mix(sow, topic_name)
    outs = []
    worker = start_worker(url)
    try:  # the worker runs: it applies a publish (not inline), then the SOW is lost
        Sow(settings=Settings.from_env(redis_url=url, write_through=False)).publish(
            topic_name, {"id": 50, "sym": "W", "px": 5}, wait=True, timeout=30)
        time.sleep(0.6)  # a sweep (every 0.5 s) after the publish: the worker knows the logs
        before = snapshot(r, t)
        lose_sow(r, t)
        wait_until(lambda: snapshot(r, t) == before, 30, "the running worker rebuilt it")
        out = run_cli(url, "rebuild", "-t", topic_name, "--wait", "--timeout", "30")
        assert out.stdout.decode() == (
            f"topic '{topic_name}': dropped the SOW of {PARTS} partition(s); rebuilt 28 "
            "record(s) from its log (recovery point epoch)\n")
        assert snapshot(r, t) == before
    finally:
        worker.terminate()
        outs.append(worker.communicate(timeout=30)[0])
    lose_sow(r, t)
    worker = start_worker(url)
    try:
        wait_until(lambda: snapshot(r, t) == before, 30, "the worker rebuilt it at its start")
    finally:
        worker.terminate()
        outs.append(worker.communicate(timeout=30)[0])
    for out, times in zip(outs, (2, 1)):  # the lost SOW (and sow-redis rebuild); at start
        assert out.count(b"the SOW was lost; rebuilding it") == times * PARTS, \
            out.decode()[-2000:]


def test_a_chaining_topic_is_rebuilt_with_its_chains(lonely_url, topic_name):
    """A transient topic with the chaining key generator (seeds/003): the rebuild re-links
    the chains from the log, so the one record of the chain and the chain table are what
    they were."""
    settings = Settings.from_env(redis_url=lonely_url)
    sow = Sow(settings=settings, inline=True)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/DocumentNumber", '
                     '"/ParentDocument"]\nkey_generator = { type = "chaining" }\n'
                     'persistence = "transient"\n')
    t, r = sow.topic(topic_name), sow.r
    for m in [{"DocumentNumber": 1, "Status": "Started"},
              {"DocumentNumber": 2, "ParentDocument": 1, "Order": "Antivenom"},
              {"DocumentNumber": 3, "ParentDocument": 2, "Order": "Sandwich"},
              {"DocumentNumber": 4, "ParentDocument": 1, "Status": "Pending"},
              {"DocumentNumber": 9, "Status": "Alone"}]:
        sow.delta_publish(topic_name, m)
    before = snapshot(r, t), r.hgetall(keys.chain(topic_name, 0))
    assert len(before[0][0][0]) == 2 and len(before[1]) == 5
    lose_sow(r, t)
    rebuild(r, t, settings)
    assert (snapshot(r, t), r.hgetall(keys.chain(topic_name, 0))) == before


def test_a_rebuild_after_a_shape_migration(lonely_url, topic_name):
    """After ``--migrate`` (2 → 3 partitions) a rebuild from epoch replays the old layout's
    entries (those of another partition now go to the error stream) and then the records the
    migration re-published: the same records as after the migration. (Not with expiring
    records: the migration restores each absolute expiry, which its re-published entry gives
    to the millisecond only.)"""
    sow = Sow(lonely_url, inline=True)
    sow.apply_config(cfg(topic_name))
    sow.publish(topic_name, [{"id": i, "sym": "ABC"[i % 3], "px": i} for i in range(30)])
    sow.delta_publish(topic_name, [{"id": i, "px": 100 + i} for i in range(0, 12, 2)])
    assert sow.sow_delete(topic_name, filter="/id < 3") == 3
    sow.apply_config(cfg(topic_name).replace(f"partitions = {PARTS}", "partitions = 3"),
                     migrate=True)
    t, r = sow.topic(topic_name), sow.r
    before = snapshot(r, t)
    assert sum(len(recs) for recs, *_ in before.values()) == 27
    sow.rebuild(topic_name)
    assert snapshot(r, t) == before
    assert sum(r.xlen(keys.partition_errors(topic_name, p)) for p in range(3)) > 0


def test_a_bad_log_entry_is_rejected_again_not_a_crash(lonely_url, topic_name):
    """The rebuild applies through apply.lua as ever: an entry that is no message goes to
    the partition's error stream (again), and the others are rebuilt."""
    sow, t, settings = setup(lonely_url, topic_name)
    r = sow.r
    sow.publish(topic_name, [{"id": i, "sym": "A"} for i in range(6)])
    for p in range(PARTS):
        r.xadd(keys.log(topic_name, p), {"cmd": "publish", "data": b"{not json"})
    rebuild(r, t, settings)
    errors = {p: r.xlen(keys.partition_errors(topic_name, p)) for p in range(PARTS)}
    assert errors == dict.fromkeys(range(PARTS), 1)
    before = snapshot(r, t)
    lose_sow(r, t)
    rebuild(r, t, settings)
    assert snapshot(r, t) == before and len(sow.sow(topic_name)) == 6
    assert {p: r.xlen(keys.partition_errors(topic_name, p)) for p in range(PARTS)} == \
        dict.fromkeys(range(PARTS), 2)


def test_a_partition_emptied_by_deletes_or_not_applied_yet_is_not_rebuilt(lonely_url,
                                                                          topic_name):
    """The mark of a SOW that exists is its applied cursor, written with the records and set
    by config apply: a partition emptied by sow_delete keeps it (its records stay deleted),
    and so does one whose entries no worker applied yet (they are applied, not skipped,
    even from recovery point "now")."""
    sow, t, settings = setup(lonely_url, topic_name, 'persistence = "transient"\n'
                             'recovery_point = "now"\n')
    r = sow.r
    assert [r.hget(keys.state(topic_name, p), "cursor") for p in range(PARTS)] == \
        [b"0-0"] * PARTS
    pub = Sow(settings=Settings.from_env(redis_url=lonely_url, write_through=False),
              inline=False)
    pub.publish(topic_name, [{"id": i, "sym": "A"} for i in range(8)])  # appended only
    assert sow.sow(topic_name) == []
    assert rebuild(r, t, settings) == 8 and len(sow.sow(topic_name)) == 8
    assert sow.sow_delete(topic_name, filter="1=1") == 8
    rebuild(r, t, settings)
    assert sow.sow(topic_name) == []
    assert not any(r.hexists(keys.state(topic_name, p), "rebuild_to") for p in range(PARTS))
    # config apply again (up does it at every start) does not hide a lost SOW
    lose_sow(r, t)
    sow.apply_config(cfg(topic_name, 'persistence = "transient"\nrecovery_point = "now"\n'))
    assert all(not r.hexists(keys.state(topic_name, p), "cursor") for p in range(PARTS))


def test_recovery_point_now_starts_empty(lonely_url, topic_name):
    """``recovery_point = "now"``: the lost SOW starts empty at the log's end (AMPS
    RecoveryPoint now); what is published after it is applied."""
    sow, t, settings = setup(lonely_url, topic_name, 'persistence = "transient"\n'
                             'recovery_point = "now"\n')
    r = sow.r
    publish_mix(sow, topic_name)
    lose_sow(r, t)
    assert rebuild(r, t, settings) == 0
    assert sow.sow(topic_name) == []
    for p in range(PARTS):
        assert r.hget(keys.state(topic_name, p), "cursor") == \
            r.xrevrange(keys.log(topic_name, p), count=1)[0][0]
    sow.publish(topic_name, [{"id": 1, "sym": "A", "px": 9}, {"id": 2, "sym": "B", "px": 9}])
    assert sorted(x.obj()["id"] for x in sow.sow(topic_name)) == [1, 2]


def test_recovery_point_at_a_time_rebuilds_from_the_first_entry_at_or_after_it(lonely_url,
                                                                                topic_name):
    """``recovery_point`` an ISO-8601 time: the rebuild applies the log's entries at or
    after it, onto an empty SOW: the records published before it are gone, a delta after it
    merges into nothing (its own fields only)."""
    sow, t, settings = setup(lonely_url, topic_name)
    r = sow.r
    # the partitions the publish appended to: all ten keys may hash to one of the two (the
    # key domain is the topic's random name: 1 run in 512), the other's log then empty
    res = sow.publish(topic_name, [{"id": i, "sym": "A", "px": i} for i in range(10)])
    last_ms = max(int(sid.split("-")[0]) for sid in res.last_ids.values())
    sec, usec = r.time()
    while int(sec) * 1000 + int(usec) // 1000 <= last_ms:
        sec, usec = r.time()
    at = datetime.fromtimestamp((last_ms + 1) / 1000, UTC)
    sow.publish(topic_name, [{"id": i, "sym": "B", "px": 50 + i} for i in range(10, 14)])
    sow.delta_publish(topic_name, {"id": 3, "px": 33})
    iso = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    sow.apply_config(cfg(topic_name, f'persistence = "transient"\nrecovery_point = "{iso}"\n'))
    t = sow.topic(topic_name)
    assert t.recovery_ms == last_ms + 1
    lose_sow(r, t)
    rebuild(r, t, settings)
    got = {x.obj()["id"]: x.obj() for x in sow.sow(topic_name)}
    assert got == {**{i: {"id": i, "sym": "B", "px": 50 + i} for i in range(10, 14)},
                   3: {"id": 3, "px": 33}}


def test_the_log_of_a_transient_topic_is_kept_and_log_retention_bounds_it(lonely_url,
                                                                          topic_name):
    """Apply trims a persistent topic's applied entries past ``log_max_len``; a transient
    topic's log stays whole, or loses only applied entries older than ``log_retention``."""
    sow, t, settings = setup(lonely_url, topic_name)
    r = sow.r
    small = Settings.from_env(redis_url=lonely_url, log_max_len=2)
    sow.publish(topic_name, [{"id": i, "sym": "A"} for i in range(20)])
    lens = [r.xlen(keys.log(topic_name, p)) for p in range(PARTS)]
    for p in range(PARTS):
        _trim(r, t, p, small)
    assert [r.xlen(keys.log(topic_name, p)) for p in range(PARTS)] == lens
    sow.apply_config(cfg(topic_name, 'persistence = "transient"\nlog_retention = "1ms"\n'))
    t = sow.topic(topic_name)
    sec, usec = r.time()
    newest = max(int(r.xrevrange(keys.log(topic_name, p), count=1)[0][0].split(b"-")[0])
                 for p in range(PARTS))
    while int(sec) * 1000 + int(usec) // 1000 <= newest + 1:
        sec, usec = r.time()
    for p in range(PARTS):
        _trim(r, t, p, small)
        cursor = r.hget(keys.state(topic_name, p), "cursor")
        # everything before the cursor is older than 1 ms: the cursor's entry stays
        assert [e[0] for e in r.xrange(keys.log(topic_name, p))] == [cursor]


def _drain(sub, idle: float = 0.3) -> list[dict]:
    out = []
    while (m := sub.get(timeout=idle)) is not None:
        out.append(m)
    return out


def test_a_subscriber_sees_no_replayed_event_and_resyncs_at_the_next_change(lonely_url,
                                                                          topic_name):
    """What a subscriber sees of a rebuild: none of the replayed entries' events (it got them
    before the SOW was lost); the next live change shows a gap in the seqs, which it
    recovers by re-reading the records (each rebuilt record once, as a publish), then the
    change itself. A deleted record is not announced again."""
    sow, t, settings = setup(lonely_url, topic_name)
    r = sow.r
    with sow.subscribe(topic_name, oof=True) as sub:
        sow.publish(topic_name, [{"id": i, "sym": "A", "px": i} for i in range(3)])
        sow.sow_delete(topic_name, keys=[x.sow_key for x in sow.sow(topic_name, "/id = 2")])
        assert sorted((m["kind"], m["data"]["id"]) for m in _drain(sub)) == [
            ("oof", 2), ("publish", 0), ("publish", 1), ("publish", 2)]
        lose_sow(r, t)
        rebuild(r, t, settings)
        assert _drain(sub, 0.2) == []
        sow.delta_publish(topic_name, [{"id": 0, "px": 100}, {"id": 1, "px": 101}])
        got = _drain(sub)
    print([(m["kind"], m.get("how"), (m.get("data") or {}).get("px")) for m in got])
    recoveries = [m for m in got if m["kind"] == "recovery"]
    assert recoveries and all((m["cause"], m["how"]) == ("gap", "requery") for m in recoveries)
    events = [m for m in got if m["kind"] != "recovery"]
    assert all(m["data"]["id"] in (0, 1) for m in events)  # nothing of the deleted id 2
    for i in (0, 1):  # the record re-read (at most once), then the change, or both in one
        mine = [m["data"] for m in events if m["data"]["id"] == i]
        assert 1 <= len(mine) <= 2 and mine[-1] == {"id": i, "sym": "A", "px": 100 + i}


def test_sow_rebuild_drops_the_sow_and_replays_the_log(lonely_url, topic_name):
    """``Sow.rebuild`` (inline: in this process) drops every partition's SOW under its lease
    and replays the log: the same records; with recovery point "now" an empty SOW. The
    fencing token survives the drop: a worker that held the lease before is refused."""
    sow, t, settings = setup(lonely_url, topic_name)
    r = sow.r
    publish_mix(sow, topic_name)
    before = snapshot(r, t)
    fences = [int(r.hget(keys.state(topic_name, p), "fence")) for p in range(PARTS)]
    horizons = sow.rebuild(topic_name)
    assert horizons == {p: r.xrevrange(keys.log(topic_name, p), count=1)[0][0].decode()
                        for p in range(PARTS)}
    assert snapshot(r, t) == before
    assert all(int(r.hget(keys.state(topic_name, p), "fence")) > fences[p]
               for p in range(PARTS))
    sow.apply_config(cfg(topic_name, 'persistence = "transient"\nrecovery_point = "now"\n'))
    sow.rebuild(topic_name)
    assert sow.sow(topic_name) == []


def test_sow_rebuild_on_every_backend(sow, topic_name):
    """The same on memory:// (fakeredis's Lua has no cmsgpack: the change feed's last block
    is JSON) as on Redis: the records come back, the seqs go on after the feed's."""
    sow.apply_config(cfg(topic_name))
    t, r = sow.topic(topic_name), sow.r
    publish_mix(sow, topic_name)
    before = snapshot(r, t)
    seqs = [int(r.hget(keys.state(topic_name, p), "seq")) for p in range(PARTS)]
    drop_sow(r, t, sow.settings, 5)
    scripts = Scripts(r)
    for p in range(PARTS):  # rebuild.lua itself: the seq is the feed's last block's last seq
        r.hdel(keys.state(topic_name, p), "seq")
        fence = scripts.lease_acquire(keys.lease(topic_name, p), keys.state(topic_name, p),
                                      "test", 5000)
        started, cursor, horizon = scripts.rebuild(t, p, fence)
        assert (started, cursor) == (True, "0-0") and horizon != "0-0"
        assert int(r.hget(keys.state(topic_name, p), "seq")) == seqs[p]
        scripts.lease_release(keys.lease(topic_name, p), "test")
    rebuild(r, t, sow.settings)
    assert snapshot(r, t) == before


def test_cli_rebuild(lonely_url, topic_name):
    """``sow-redis rebuild -t T``: one line saying what it did; the workers (here: this
    process) rebuild. A persistent topic, or a partition leased by another process for
    --timeout seconds, is one error line, exit status 1."""
    sow, t, settings = setup(lonely_url, topic_name)
    r = sow.r
    publish_mix(sow, topic_name)
    before = snapshot(r, t)
    out = run_cli(lonely_url, "rebuild", "-t", topic_name).stdout.decode()
    assert out == (f"topic '{topic_name}': dropped the SOW of {PARTS} partition(s); the "
                   "workers rebuild it from its log (recovery point epoch)\n")
    assert lagging_partitions(r, t) == list(range(PARTS))
    rebuild(r, t, settings)
    assert snapshot(r, t) == before
    r.set(keys.lease(topic_name, 1), "elsewhere:1:x", px=10_000)
    bad = run_cli(lonely_url, "rebuild", "-t", topic_name, "--timeout", "0.1", check=False)
    err = bad.stderr.decode()
    assert bad.returncode == 1 and err.count("\n") == 1, err
    assert "partition(s) [1] stayed leased by another process for 0.1 s" in err
    assert "dropped [0]" in err
    r.delete(keys.lease(topic_name, 1))
    sow.apply_config(cfg(topic_name, ""))
    bad = run_cli(lonely_url, "rebuild", "-t", topic_name, check=False)
    assert bad.returncode == 1
    assert bad.stderr.decode() == (f"Error: topic '{topic_name}' is persistent: its SOW cannot "
                                   "be rebuilt from its log (persistence = \"transient\" keeps "
                                   "the log for that)\n")


@pytest.mark.parametrize("extra, problem", [
    ('persistence = "durable"', "'persistence' must be \"persistent\" or \"transient\""),
    ('recovery_point = "now"', "'recovery_point' applies to a transient topic only"),
    ('log_retention = "1d"', "'log_retention' applies to a transient topic only"),
    ('persistence = "transient"\nrecovery_point = "yesterday"', "'recovery_point': not"),
    ('persistence = "transient"\nrecovery_point = 5', "'recovery_point' must be \"epoch\""),
    ('persistence = "transient"\nlog_retention = "0s"', "'log_retention' must be > 0"),
])
def test_config_errors_name_the_topic_and_field(extra, problem):
    with pytest.raises(ConfigError) as exc:
        parse_topics(f'[[topic]]\nname = "q"\nkey = ["/id"]\n{extra}\n', "sow.toml")
    (line,) = str(exc.value).splitlines()
    assert line.startswith("sow.toml: topic #1 'q': ") and problem in line


def test_config_round_trip_and_shape():
    (t,) = parse_topics(cfg("q", 'persistence = "transient"\nrecovery_point = '
                             '"2026-11-27T06:00:00+01:00"\nlog_retention = "7d"\n'))
    assert (t.transient, t.recovery_ms, t.log_retention_ms) == (True, 1_795_755_600_000,
                                                                 604_800_000)
    assert parse_topics(to_toml([t])) == [t] and TopicConfig.from_json(t.to_json()) == t
    (p,) = parse_topics(cfg("q", ""))
    assert (p.persistence, p.recovery_point, p.transient) == ("persistent", "epoch", False)
    assert "persistence" not in to_toml([p])
    assert p.fingerprint == t.fingerprint  # not a shape field: no migration

