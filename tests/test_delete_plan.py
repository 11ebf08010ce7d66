"""A sow_delete by filter follows the plan a sow query of the same filter reads by: a filter
that pins the topic's key fields (``/id = 5``, ``/id IN (1, 2)``) is appended only to the
partitions of those SOW keys, and the worker's plan reads those records instead of scanning
its partition; a delete by SOW keys goes only to the keys' partitions. Any other filter, a
topic with ``partition_by``, publisher keys or a chaining key generator: every partition."""

from __future__ import annotations

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.model.sowkey import generate, partition_of_key
from sow_redis.query.filter import compile_filter
from sow_redis.query import sow as query_sow
from sow_redis.query.sow import filter_partitions, key_partitions


def _config(name: str, extra: str = "") -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = 4\n{extra}'


def _no_scan(*args: object, **kw: object) -> None:
    raise AssertionError("a pinned delete scanned its partition")


def _logs(sow: Sow, name: str) -> list[int]:
    return [sow.r.xlen(keys.log(name, p)) for p in range(4)]


def test_a_filter_pinning_the_key_fields_names_the_partitions_of_its_keys():
    sow = Sow("memory://")
    sow.apply_config(_config("t") + _config("by", 'partition_by = ["/g"]\n')
                     + '[[topic]]\nname = "pk"\npartitions = 4\n')
    t = sow.topic("t")
    part = {i: partition_of_key(generate(t.domain, [str(i)]), 4) for i in range(1, 4)}
    assert filter_partitions(t, compile_filter("/id = 1")) == [part[1]]
    assert filter_partitions(t, compile_filter("/id IN (1, 2, 3)")) == sorted(set(part.values()))
    assert filter_partitions(t, compile_filter("/id = 1 AND /id = 1")) == [part[1]]
    for other in ("/id = 1 OR /id = 2", "/id = 1 AND /x > 2", "/id > 1", "/x = 1",
                  "NOT /id = 1", "1 = 1"):
        assert filter_partitions(t, compile_filter(other)) is None, other
    assert filter_partitions(sow.topic("by"), compile_filter("/id = 1")) is None
    assert filter_partitions(sow.topic("pk"), compile_filter("/id = 1")) is None
    assert key_partitions(t, [generate(t.domain, ["1"])]) == [part[1]]
    assert key_partitions(sow.topic("by"), ["x"]) is None


def test_a_sow_delete_pinned_to_a_key_is_appended_to_its_partition_only(sow, topic_name,
                                                                         monkeypatch):
    sow.apply_config(_config(topic_name))
    t = sow.topic(topic_name)
    sow.publish(topic_name, [{"id": i, "v": i} for i in range(20)] + [{"id": "21", "v": 21}])
    before = _logs(sow, topic_name)
    home = partition_of_key(generate(t.domain, ["5"]), 4)
    with monkeypatch.context() as m:  # the plan (inline: the workers' code) reads no scan
        m.setattr(query_sow, "scan_partition", _no_scan)
        assert sow.sow_delete(topic_name, "/id = 5") == 1
        grew = [after - n for after, n in zip(_logs(sow, topic_name), before)]
        assert grew == [int(p == home) for p in range(4)], grew
        # the key's canonical value: a number filter removes the record stored with "21"
        assert sow.sow_delete(topic_name, "/id IN (21, 7, 99)") == 2
        assert sow.sow_delete(topic_name, "/id = 5") == 0  # gone already
    left = sorted(r.obj()["id"] for r in sow.sow(topic_name))
    assert left == [i for i in range(20) if i not in (5, 7)]
    # any other filter: every partition, and it still finds its records by a scan
    before = _logs(sow, topic_name)
    assert sow.sow_delete(topic_name, "/id = 6 OR /id = 8") == 2
    assert [a - b for a, b in zip(_logs(sow, topic_name), before)] == [1, 1, 1, 1]
    # by SOW keys: only the keys' partitions
    key = generate(t.domain, ["9"])
    before = _logs(sow, topic_name)
    assert sow.sow_delete(topic_name, keys=[key]) == 1
    grew = [after - n for after, n in zip(_logs(sow, topic_name), before)]
    assert grew == [int(p == partition_of_key(key, 4)) for p in range(4)], grew
    assert len(sow.sow(topic_name)) == 15


def test_with_partition_by_a_pinned_delete_goes_to_every_partition(sow, topic_name):
    """The partition of a record follows ``/g``, not its key: the delete must reach all."""
    sow.apply_config(_config(topic_name, 'partition_by = ["/g"]\n'))
    sow.publish(topic_name, [{"id": i, "g": i * 7} for i in range(12)])
    before = _logs(sow, topic_name)
    assert sow.sow_delete(topic_name, "/id = 5") == 1
    assert [a - b for a, b in zip(_logs(sow, topic_name), before)] == [1, 1, 1, 1]
    assert sorted(r.obj()["id"] for r in sow.sow(topic_name)) == [i for i in range(12) if i != 5]


def test_the_acks_of_old_deletes_go_while_deletes_never_pause(sow, topic_name):
    """The acks hash (records removed per sow_delete entry, read by its client) expires an
    hour after the last delete; under deletes that never pause that long, the fields of
    entries older than an hour go each time the hash reaches 1,000 fields (and a field that
    is no stream id, which only a foreign write makes)."""
    sow.apply_config(_config(topic_name))
    t = sow.topic(topic_name)
    sow.publish(topic_name, [{"id": i} for i in range(10)])
    for i, by_keys in ((1, False), (2, True)):  # a planned delete; delete_now.lua (keys)
        key = generate(t.domain, [str(i)])
        acks = keys.acks(topic_name, partition_of_key(key, 4))
        sow.r.delete(acks)
        old = {f"{1_600_000_000_000 + n}-0": 1 for n in range(998)}  # ids of 2020
        sow.r.hset(acks, mapping={**old, "junk": "x"})
        removed = (sow.sow_delete(topic_name, keys=[key]) if by_keys
                   else sow.sow_delete(topic_name, f"/id = {i}"))
        assert removed == 1  # counted before the old fields went
        left = sow.r.hgetall(acks)
        assert len(left) == 1 and list(left.values()) == [b"1"], (by_keys, len(left))
        assert 0 < sow.r.pttl(acks) <= 3_600_000
        sow.r.hset(acks, mapping=dict(list(old.items())[:10]))  # under 1,000: kept
        assert sow.sow_delete(topic_name, f"/id = {i + 5}") == 1
        assert sow.r.hlen(acks) in (11, 12)  # 12: the key of i + 5 shares the partition
