"""Shape changes of topics that hold data: refused, or migrated with --migrate (issue 7.4).

Real redis-server (fixtures ``url`` / ``r``); publishes are applied in process with the
workers' code (``jobs.drain_partition``), or left queued to stand for unapplied messages.
"""

from __future__ import annotations

import pytest
from conftest import run_cli

from sow_redis import keys
from sow_redis.apply.jobs import drain_partition
from sow_redis.client import Sow
from sow_redis.errors import ConfigError, SowError
from sow_redis.model.records import decode as decode_record
from sow_redis.registry import get_topic, holdings
from sow_redis.settings import Settings


def cfg(name: str, extra: str = "", key: str = '["/id"]') -> str:
    return f'[[topic]]\nname = "{name}"\nkey = {key}\n{extra}\n'


def client(url: str) -> Sow:
    """A client whose publishes stay queued until drained (no write-through): the tests
    migrate topics holding unapplied entries."""
    return Sow(settings=Settings.from_env(redis_url=url, write_through=False))


def drain(sow: Sow, name: str) -> None:
    t = sow.topic(name)
    for p in range(t.partitions):
        while not drain_partition(sow.r, t, p, sow.settings, budget_s=60, linger_ms=0)[1]:
            pass


def stored(r, name: str, partitions: int) -> dict[str, object]:
    """SOW key → Record over partitions 0..partitions-1, read straight from Redis."""
    out = {}
    for p in range(partitions):
        for k, v in r.hgetall(keys.records(name, p)).items():
            out[k.decode()] = decode_record(k, v)
    return out


def by_id(sow: Sow, name: str) -> dict[int, dict]:
    recs = sow.sow(name)
    objs = {rec.obj()["id"]: rec.obj() for rec in recs}
    assert len(objs) == len(recs), "one record per id"
    return objs


def test_fewer_partitions_refused_then_migrated_losing_nothing(url, r, topic_name, tmp_path):
    sow = client(url)
    sow.apply_config(cfg(topic_name, 'partitions = 8\nhash_index = [["/g"]]'))
    sow.publish(topic_name, [{"id": i, "g": i % 5, "v": 0} for i in range(200)])
    drain(sow, topic_name)
    # queued, never applied: 60 updates and 20 new ids (no worker runs in this test)
    sow.publish(topic_name, [{"id": i, "g": i % 5, "v": 1} for i in range(60)]
                + [{"id": i, "g": i % 5, "v": 1} for i in range(200, 220)])
    held = holdings(r, get_topic(r, topic_name))
    assert (held.records, held.queued) == (200, 80)
    queued_high = sum(r.xlen(keys.log(topic_name, p)) for p in range(4, 8))
    before = stored(r, topic_name, 8)
    print(f"queued in partitions 4-7 (log entries): {queued_high}")
    assert queued_high > 0

    path = tmp_path / "sow.toml"
    path.write_text(cfg(topic_name, 'partitions = 4\nhash_index = [["/g"]]'))
    with pytest.raises(ConfigError) as e:
        sow.apply_config(str(path))
    assert e.value.problems == [
        f"{path}: topic '{topic_name}': 'partitions' 8 → 4 would strand 200 stored record(s) "
        f"and 80 queued message(s); run 'sow-redis config apply --migrate {path}' to move them"]
    proc = run_cli(url, "config", "apply", str(path), check=False)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"error: {path}: topic '{topic_name}': 'partitions' 8 → 4")
    assert get_topic(r, topic_name).partitions == 8          # registry unchanged
    assert stored(r, topic_name, 8) == before                 # records unchanged
    assert holdings(r, get_topic(r, topic_name)).queued == 80

    proc = run_cli(url, "config", "apply", "--migrate", str(path))
    out = proc.stdout.decode()
    print(out)
    assert (f"migrated topic '{topic_name}' ('partitions' 8 → 4): moved 220 record(s), "
            "rejected 0; applied 80 queued message(s) first") in out
    t = get_topic(r, topic_name)
    assert t.partitions == 4
    objs = by_id(sow, topic_name)
    assert sorted(objs) == list(range(220))
    assert all(objs[i]["v"] == (1 if i < 60 or i >= 200 else 0) for i in objs)
    # nothing left in the dropped partitions, nothing queued
    assert not any(r.exists(k) for p in range(4, 8) for k in (
        keys.records(topic_name, p), keys.log(topic_name, p), keys.state(topic_name, p),
        keys.index(topic_name, p, 0), keys.lease(topic_name, p)))
    assert holdings(r, t).queued == 0
    # key lookup and hash index (every record has its member in its new partition)
    assert [x.obj()["id"] for x in sow.sow(topic_name, "/id = 7")] == [7]
    assert sum(r.zcard(keys.index(topic_name, p, 0)) for p in range(4)) == 220
    assert sorted(x.obj()["id"] for x in sow.sow(topic_name, "/g = 2")) == list(range(2, 220, 5))
    # a later publish updates the migrated record (same key, same partition), no duplicate
    sow.publish(topic_name, {"id": 5, "g": 1, "v": 2})
    drain(sow, topic_name)
    objs = by_id(sow, topic_name)
    assert len(objs) == 220 and objs[5] == {"id": 5, "g": 1, "v": 2}
    assert 5 not in [x.obj()["id"] for x in sow.sow(topic_name, "/g = 0")]
    assert sorted(x.obj()["id"] for x in sow.sow(topic_name, "/g = 1")) == \
        sorted([5, *range(1, 220, 5)])


def test_key_change_rekeys_and_rejects_records_without_the_new_key(url, r, topic_name):
    sow = client(url)
    sow.apply_config(cfg(topic_name, "partitions = 3", key='["/a"]'))
    sow.publish(topic_name, [{"a": i, "b": f"B{i}"} for i in range(30)] + [{"a": 99}])
    drain(sow, topic_name)
    with pytest.raises(ConfigError, match=r"""'key' \["/a"\] → \["/b"\] would strand 31 """):
        sow.apply_config(cfg(topic_name, "partitions = 3", key='["/b"]'))
    sow.apply_config(cfg(topic_name, "partitions = 3", key='["/b"]'), migrate=True)
    assert get_topic(r, topic_name).key == ("/b",)
    recs = sow.sow(topic_name)
    assert sorted(x.obj()["a"] for x in recs) == list(range(30))
    assert [x.obj()["a"] for x in sow.sow(topic_name, "/b = 'B3'")] == [3]
    errs = [e for e in sow.errors(topic_name) if e["reason"] == "missing_key_field"]
    assert len(errs) == 1 and errs[0]["data"] == '{"a":99}'
    assert errs[0]["detail"].startswith("migration to the new definition: ")
    # the record's new key is the one a publish by /b computes: an update, not a duplicate
    sow.publish(topic_name, {"a": 3, "b": "B3", "new": True})
    drain(sow, topic_name)
    assert len(sow.sow(topic_name)) == 30
    assert [x.obj() for x in sow.sow(topic_name, "/b = 'B3'")] == [{"a": 3, "b": "B3", "new": True}]


def test_migration_summary_counts(url, r, topic_name):
    from sow_redis.migrate import apply_with_migration

    sow = client(url)
    sow.apply_config(cfg(topic_name, "partitions = 2", key='["/a"]'))
    # three records become one under key /b; one lacks /b
    sow.publish(topic_name, [{"a": 1, "b": 1}, {"a": 2, "b": 1}, {"a": 3, "b": 1}, {"a": 4}])
    drain(sow, topic_name)
    from sow_redis.config import parse_topics

    _v, done = apply_with_migration(r, parse_topics(cfg(topic_name, "partitions = 2",
                                                        key='["/b"]')), sow.settings)
    (m,) = done
    assert (m.moved, m.rejected, m.records) == (3, 1, 1)
    assert "moved 3 record(s), rejected 1 (2 merged into another record's new SOW key)" \
        in m.summary()


def test_expiry_kept_exactly(url, r, topic_name):
    sow = client(url)
    sow.apply_config(cfg(topic_name, 'partitions = 4\nexpiration = "1h"'))
    sow.publish(topic_name, [{"id": i} for i in range(20)])
    sow.publish(topic_name, [{"id": i} for i in range(20, 25)], expiration=0)     # never
    sow.publish(topic_name, [{"id": i} for i in range(25, 30)], expiration=3000)  # 50 min
    drain(sow, topic_name)
    before = {x.obj()["id"]: x.expiry_ms for x in sow.sow(topic_name)}
    assert sum(1 for v in before.values() if v == 0) == 5
    sow.apply_config(cfg(topic_name, 'partitions = 2\nexpiration = "1h"'), migrate=True)
    after = {x.obj()["id"]: x.expiry_ms for x in sow.sow(topic_name)}
    assert after == before
    zset = {}
    for p in range(2):
        zset.update(r.zrange(keys.expiry(topic_name, p), 0, -1, withscores=True))
    assert len(zset) == 25 and sorted(int(s) for s in zset.values()) == \
        sorted(v for v in before.values() if v)


def test_chaining_topic_migrates_with_its_chains(url, r, topic_name):
    sow = client(url)
    base = (f'[[topic]]\nname = "{topic_name}"\nkey = ["/id", "/orig"]\n'
            'key_generator = {{ type = "chaining" }}\n')
    sow.apply_config(base.format())
    sow.publish(topic_name, [{"id": "A1", "sym": "X", "q": 1}, {"id": "B1", "sym": "Y", "q": 1},
                             {"id": "A2", "orig": "A1", "sym": "X", "q": 2}])
    drain(sow, topic_name)
    assert len(sow.sow(topic_name)) == 2
    sow.apply_config(base.format() + 'partition_by = ["/sym"]\npartitions = 4\n', migrate=True)
    t = get_topic(r, topic_name)
    assert t.partitions == 4
    # a replace of the migrated chain that names its first identifier still updates it
    sow.publish(topic_name, {"id": "A3", "orig": "A1", "sym": "X", "q": 3})
    drain(sow, topic_name)
    recs = sorted((x.obj() for x in sow.sow(topic_name)), key=lambda o: o["id"])
    assert [o["id"] for o in recs] == ["A3", "B1"] and recs[0]["q"] == 3


@pytest.mark.parametrize("change", [
    ('partitions = 3', 'partitions = 2', "'partitions' 3 → 2"),
    ('', 'key_domain = "elsewhere"', "'key_domain'"),
    ('', 'message_type = "fix"', "'message_type' \"json\" → \"fix\""),
    ('partitions = 2', 'partitions = 2\npartition_by = ["/g"]', "'partition_by' [] → [\"/g\"]"),
    ('', 'key_generator = { type = "chaining", secondary = ["/orig"] }\npartitions = 1',
     "'key_generator'"),
])
def test_each_shape_field_refused_with_data_free_without(backend_url, topic_name, change):
    sow = Sow(backend_url)
    before, after, what = change
    sow.apply_config(cfg(topic_name + "e", before))
    sow.apply_config(cfg(topic_name + "e", after))      # no data: changes freely
    assert sow.topic(topic_name + "e").to_json() != b""
    sow.apply_config(cfg(topic_name, before))
    sow.publish(topic_name, {"id": 1, "g": 1})           # queued (or applied on memory://)
    with pytest.raises(ConfigError) as e:
        sow.apply_config(cfg(topic_name, after))
    assert what in e.value.problems[0] and "--migrate" in e.value.problems[0]
    assert len(e.value.problems) == 1
    # other fields change freely even with data
    sow.apply_config(cfg(topic_name, before + '\nmax_message_bytes = 4096'))


def test_migration_waits_for_a_busy_partition_then_gives_up_changing_nothing(url, r, topic_name):
    sow = Sow(settings=Settings.from_env(redis_url=url, lease_ms=200, job_budget_s=0.1))
    sow.apply_config(cfg(topic_name, "partitions = 2"))
    sow.publish(topic_name, [{"id": i} for i in range(10)])
    drain(sow, topic_name)
    r.set(keys.lease(topic_name, 1), "some-worker", px=60_000)
    with pytest.raises(SowError, match=r"partition\(s\) \[1\] stayed leased"):
        sow.apply_config(cfg(topic_name, "partitions = 1"), migrate=True)
    assert get_topic(r, topic_name).partitions == 2
    assert len(sow.sow(topic_name)) == 10
    assert r.get(keys.lease(topic_name, 0)) is None        # our lease given back
    old = get_topic(r, topic_name)  # publishers go on under it: its fingerprints are back
    assert [r.get(keys.definition(topic_name, p)) for p in range(2)] == \
        [old.fingerprint.encode()] * 2
    assert sow.publish(topic_name, {"id": 10}).published == 1  # the migration applies it
    r.delete(keys.lease(topic_name, 1))
    sow.apply_config(cfg(topic_name, "partitions = 1"), migrate=True)
    assert len(sow.sow(topic_name)) == 11 and get_topic(r, topic_name).partitions == 1


def test_migrate_rebuilds_a_changed_hash_index(url, r, topic_name):
    sow = client(url)
    sow.apply_config(cfg(topic_name, "partitions = 2"))
    sow.publish(topic_name, [{"id": i, "g": i % 2} for i in range(10)])
    drain(sow, topic_name)
    # an index added to a topic holding data would miss the older records: refused
    with pytest.raises(ConfigError, match="'hash_index' \\[\\] → \\[\\[\"/g\"\\]\\]"):
        sow.apply_config(cfg(topic_name, 'partitions = 2\nhash_index = [["/g"]]'))
    sow.apply_config(cfg(topic_name, 'partitions = 2\nhash_index = [["/g"]]'), migrate=True)
    assert sorted(x.obj()["id"] for x in sow.sow(topic_name, "/g = 1")) == [1, 3, 5, 7, 9]
    assert sum(r.zcard(keys.index(topic_name, p, 0)) for p in range(2)) == 10
