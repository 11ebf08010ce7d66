"""The storage contract, run on the real redis-server and on memory:// (same Lua scripts)."""

from __future__ import annotations

import orjson
import pytest

from sow_redis import keys
from sow_redis.errors import FilterSyntaxError, MessageError, UnknownTopicError
from sow_redis.model import sowkey


def cfg(name: str, extra: str = "", key: str = '["/orderId"]') -> str:
    return f'[[topic]]\nname = "{name}"\nkey = {key}\n{extra}\n'


def objs(records):
    return sorted((r.obj() for r in records), key=lambda o: orjson.dumps(o, option=orjson.OPT_SORT_KEYS))


def test_publish_inserts_then_replaces_whole_record(sow, topic_name):
    sow.apply_config(cfg(topic_name))
    sow.publish(topic_name, [{"orderId": 1, "sym": "IBM", "price": 120, "qty": 5},
                             {"orderId": 2, "sym": "MSFT", "price": 120}])
    sow.publish(topic_name, {"orderId": 2, "price": 95})
    got = objs(sow.sow(topic_name))
    # seeds/004: "AMPS replaces the entire record with the contents of the update"
    assert got == [{"orderId": 1, "sym": "IBM", "price": 120, "qty": 5}, {"orderId": 2, "price": 95}]


def test_publishing_same_messages_twice_leaves_sow_unchanged(sow, topic_name):
    sow.apply_config(cfg(topic_name))
    msgs = [{"orderId": i % 7, "v": i} for i in range(50)]
    sow.publish(topic_name, msgs)
    first = {r.sow_key: r.data for r in sow.sow(topic_name)}
    sow.publish(topic_name, msgs)
    second = {r.sow_key: r.data for r in sow.sow(topic_name)}
    assert first == second and len(first) == 7


def test_delta_publish_merges_nested_and_keeps_other_fields(sow, topic_name):
    sow.apply_config(cfg(topic_name))
    sow.publish(topic_name, {"orderId": 1, "px": 10, "qty": 5, "o": {"a": 1, "b": {"c": 1, "d": 2}}})
    sow.delta_publish(topic_name, {"orderId": 1, "px": 11, "o": {"b": {"d": 3}, "e": [1]}})
    assert objs(sow.sow(topic_name)) == [
        {"orderId": 1, "px": 11, "qty": 5, "o": {"a": 1, "b": {"c": 1, "d": 3}, "e": [1]}}]
    # a delta for a key not in the SOW inserts it as is
    sow.delta_publish(topic_name, {"orderId": 2, "px": 1})
    assert {"orderId": 2, "px": 1} in objs(sow.sow(topic_name))


def test_delta_then_publish_in_one_batch_keeps_order(sow, topic_name):
    sow.apply_config(cfg(topic_name))
    from sow_redis.publish.append import append

    t = sow.topic(topic_name)
    res = append(sow.r, t, [
        ("publish", b'{"orderId":1,"a":1,"b":1}', None),
        ("delta_publish", b'{"orderId":1,"b":2}', None),
        ("publish", b'{"orderId":1,"c":3}', None),
        ("delta_publish", b'{"orderId":1,"d":4}', None),
    ])
    sow.handoff(t, res.last_ids, True, 10)
    assert objs(sow.sow(topic_name)) == [{"orderId": 1, "c": 3, "d": 4}]


def test_same_key_domain_same_key_across_topics(sow, topic_name):
    a, b, c = topic_name + "a", topic_name + "b", topic_name + "c"
    sow.apply_config(cfg(a, 'key_domain = "orders"') + cfg(b, 'key_domain = "orders"') + cfg(c))
    for t in (a, b, c):
        sow.publish(t, {"orderId": 42, "t": t})
    ka, kb, kc = (sow.sow(t)[0].sow_key for t in (a, b, c))
    assert ka == kb == sowkey.generate("orders", ["42"])
    assert kc != ka  # default key domain is the topic name
    sow.publish(a, {"orderId": 43})
    assert len({r.sow_key for r in sow.sow(a)}) == 2


def test_composite_key(sow, topic_name):
    sow.apply_config(cfg(topic_name, key='["/invoice", "/customer/id"]'))
    sow.publish(topic_name, [{"invoice": 1, "customer": {"id": "a"}, "v": 1},
                             {"invoice": 1, "customer": {"id": "b"}, "v": 2},
                             {"invoice": 1, "customer": {"id": "a"}, "v": 3}])
    assert objs(sow.sow(topic_name)) == [
        {"invoice": 1, "customer": {"id": "a"}, "v": 3},
        {"invoice": 1, "customer": {"id": "b"}, "v": 2}]


def test_publisher_supplied_sow_keys(sow, topic_name):
    sow.apply_config(cfg(topic_name, key="[]"))
    sow.publish(topic_name, {"blob": 1}, sow_key="QUJD")
    sow.publish(topic_name, {"blob": 2}, sow_key="QUJD")
    sow.publish(topic_name, {"blob": 3}, sow_key="REVG+/==")
    got = {r.sow_key: r.obj() for r in sow.sow(topic_name)}
    assert got == {"QUJD": {"blob": 2}, "REVG+/==": {"blob": 3}}
    res = sow.publish(topic_name, [{"blob": 4}], sow_key="bad key!")
    assert [(x.reason, x.position) for x in res.rejected] == [("bad_sow_key", 1)]
    res = sow.publish(topic_name, [{"blob": 4}])
    assert [x.reason for x in res.rejected] == ["missing_sow_key"]
    assert len(sow.sow(topic_name)) == 2


def test_each_bad_input_kind_is_rejected_with_reason(sow, topic_name):
    sow.apply_config(cfg(topic_name, "max_message_bytes = 64"))
    res = sow.publish(topic_name, [b'{"orderId": 1', b'[1,2]', b'{"x": 1}', b'{"orderId": null}',
                                   orjson.dumps({"orderId": 9, "pad": "x" * 100}), b"",
                                   b'{"orderId": 5}'])
    assert [(x.position, x.reason) for x in res.rejected] == [
        (1, "bad_json"), (2, "not_object"), (3, "missing_key_field"), (4, "missing_key_field"),
        (5, "too_large"), (6, "empty")]
    assert res.published == 1
    assert objs(sow.sow(topic_name)) == [{"orderId": 5}]


def test_bad_entries_reaching_worker_go_to_error_stream(sow, topic_name):
    """A raw producer (any Redis client) writes bad entries: they land in the error stream
    with reason and original bytes, and the partition keeps moving."""
    sow.apply_config(cfg(topic_name, "partitions = 1"))
    t = sow.topic(topic_name)
    log = keys.log(topic_name, 0)
    sow.r.xadd(log, {"cmd": "publish", "data": b"{not json"})
    sow.r.xadd(log, {"cmd": "publish", "data": b'{"no": "key"}'})
    sow.r.xadd(log, {"cmd": "frobnicate", "data": b'{"orderId": 1}'})
    sow.r.xadd(log, {"cmd": "sow_delete", "filter": "/a = = 1"})
    last = sow.r.xadd(log, {"cmd": "publish", "data": b'{"orderId": 7, "ok": true}'})
    sow.handoff(t, {0: last.decode()}, True, 10)
    assert objs(sow.sow(topic_name)) == [{"orderId": 7, "ok": True}]
    errs = sow.errors(topic_name)
    assert [e["reason"] for e in errs] == ["bad_json", "missing_key_field", "bad_command", "bad_filter"]
    assert errs[0]["data"] == "{not json"
    assert errs[2]["cmd"] == "frobnicate"


def test_message_in_wrong_partition_is_rejected(sow, topic_name):
    sow.apply_config(cfg(topic_name, "partitions = 4"))
    t = sow.topic(topic_name)
    data = b'{"orderId": 1}'
    right = sowkey.partition_of_key(sowkey.generate(topic_name, ["1"]), 4)
    wrong = (right + 1) % 4
    sid = sow.r.xadd(keys.log(topic_name, wrong), {"cmd": "publish", "data": data})
    sow.handoff(t, {wrong: sid.decode()}, True, 10)
    assert sow.sow(topic_name) == []
    assert [e["reason"] for e in sow.errors(topic_name)] == ["wrong_partition"]


def test_sow_delete_by_filter_keys_and_data(sow, topic_name):
    sow.apply_config(cfg(topic_name))
    sow.publish(topic_name, [{"orderId": i, "status": "open" if i % 2 else "filled"} for i in range(10)])
    assert sow.sow_delete(topic_name, filter="/status = 'filled'") == 5
    assert sorted(o["orderId"] for o in objs(sow.sow(topic_name))) == [1, 3, 5, 7, 9]
    k3 = sowkey.generate(topic_name, ["3"])
    assert sow.sow_delete(topic_name, keys=[k3, "nosuchkey"]) == 1
    assert sow.sow_delete(topic_name, data={"orderId": 5, "whatever": 1}) == 1
    assert sow.sow_delete(topic_name, data={"orderId": 5}) == 0
    assert sorted(o["orderId"] for o in objs(sow.sow(topic_name))) == [1, 7, 9]
    assert sow.sow_delete(topic_name, filter="1=1") == 3
    assert sow.sow(topic_name) == []
    with pytest.raises(FilterSyntaxError):
        sow.sow_delete(topic_name, filter="/a = = 1")
    with pytest.raises(MessageError):
        sow.sow_delete(topic_name, data={"nokey": 1})


def test_query_filter_top_n_order_by_and_keys(sow, topic_name):
    sow.apply_config(cfg(topic_name))
    sow.publish(topic_name, [{"orderId": i, "px": (i * 37) % 11, "sym": "AB"[i % 2]} for i in range(20)])
    got = [r.obj()["orderId"] for r in sow.sow(topic_name, "/sym = 'A' AND /px >= 5",
                                               order_by="/px DESC, /orderId", top_n=3)]
    rows = sorted(({"orderId": i, "px": (i * 37) % 11} for i in range(0, 20, 2) if (i * 37) % 11 >= 5),
                  key=lambda o: (-o["px"], o["orderId"]))
    assert got == [o["orderId"] for o in rows[:3]]
    assert len(sow.sow(topic_name, top_n=4)) == 4
    k = [sowkey.generate(topic_name, [str(i)]) for i in (4, 2, 99)]
    assert [r.obj()["orderId"] for r in sow.sow(topic_name, keys=k)] == [4, 2]
    assert sow.sow(topic_name, "/missing = 1 OR /missing != 1") == []
    with pytest.raises(FilterSyntaxError, match="column"):
        sow.sow(topic_name, "/px > AND")
    with pytest.raises(UnknownTopicError):
        sow.sow(topic_name + "nope")


def test_hash_index_equality_reads_index_not_whole_topic(sow, topic_name, monkeypatch):
    sow.apply_config(cfg(topic_name, 'hash_index = [["/region"], ["/a", "/b"]]'))
    sow.publish(topic_name, [{"orderId": i, "region": ["eu", "us", "ap"][i % 3], "a": i % 2, "b": "x"}
                             for i in range(30)])
    sow.publish(topic_name, {"orderId": 0, "region": "us", "a": 0, "b": "x"})  # moves eu -> us
    sow.delta_publish(topic_name, {"orderId": 3, "region": "ap"})           # moves eu -> ap
    from sow_redis.query import sow as q

    def no_scan(*a, **k):
        raise AssertionError("scanned the topic instead of reading the hash index")

    monkeypatch.setattr(q, "scan_partition", no_scan)
    eu = sorted(r.obj()["orderId"] for r in sow.sow(topic_name, "/region = 'eu'"))
    assert eu == [i for i in range(30) if i % 3 == 0 and i not in (0, 3)]
    both = sorted(r.obj()["orderId"] for r in sow.sow(topic_name, "/region IN ('us', 'ap')"))
    assert both == sorted([i for i in range(30) if i % 3 != 0] + [0, 3])
    ab = sorted(r.obj()["orderId"] for r in sow.sow(topic_name, "/b = 'x' AND /a = 1"))
    assert ab == [i for i in range(30) if i % 2 == 1]
    sow.sow_delete(topic_name, keys=[sowkey.generate(topic_name, ["1"])])
    us = sorted(r.obj()["orderId"] for r in sow.sow(topic_name, "/region = 'us'"))
    assert 1 not in us and 0 in us
    # equality on the key field computes the SOW key: no scan either
    assert [r.obj() for r in sow.sow(topic_name, "/orderId = 4")] == [
        {"orderId": 4, "region": "us", "a": 0, "b": "x"}]
    assert [r.obj()["orderId"] for r in sow.sow(topic_name, "/orderId IN (4, 5, 99)")] == [4, 5]
    monkeypatch.undo()
    # a filter on other fields scans, and agrees
    assert sorted(r.obj()["orderId"] for r in sow.sow(topic_name, "/region LIKE '^e'")) == eu


def test_change_events_on_pubsub(sow, topic_name):
    sow.apply_config(cfg(topic_name))
    with sow.subscribe(topic_name, oof=True) as sub, \
            sow.subscribe(topic_name, "/px > 10", oof=True) as big:
        sow.publish(topic_name, [{"orderId": 1, "px": 5}, {"orderId": 2, "px": 50}])
        sow.delta_publish(topic_name, {"orderId": 1, "px": 20})
        sow.sow_delete(topic_name, filter="/orderId = 2")
        evs = [sub.get(2) for _ in range(4)]
        assert sub.get(0.2) is None
        bigs = [big.get(2) for _ in range(3)]
        assert big.get(0.2) is None
    # Only per-partition order is promised (docs/cluster-and-scaling.md, "What changes on a
    # cluster"): orders 1 and 2 may lie in two partitions, so each order's events are checked
    # in order.
    def per_order(events):
        return {oid: [e["op"] for e in events if e["data"]["orderId"] == oid] for oid in (1, 2)}

    assert per_order(evs) == {1: ["publish", "delta_publish"], 2: ["publish", "sow_delete"]}
    one = [e for e in evs if e["data"]["orderId"] == 1]
    two = [e for e in evs if e["data"]["orderId"] == 2]
    assert one[1]["data"] == {"orderId": 1, "px": 20}
    assert two[1]["reason"] == "deleted" and two[1]["topic"] == topic_name
    assert one[0]["sow_key"] == sowkey.generate(topic_name, ["1"])
    assert [e["seq"] for e in one] == sorted(e["seq"] for e in one)
    assert per_order(bigs) == {1: ["delta_publish"], 2: ["publish", "sow_delete"]}


def test_unknown_topic_publish_is_an_error(sow, topic_name):
    with pytest.raises(UnknownTopicError, match="config apply"):
        sow.publish(topic_name, {"orderId": 1})


def test_deletes_by_key_register_the_scripts_once_per_client(sow, topic_name, monkeypatch):
    """A sow_delete by SOW keys runs delete_now.lua through the client's one Scripts
    (registering the bundled scripts costs about a round trip): three deletes, no new one."""
    from sow_redis.apply import scripts

    sow.apply_config(cfg(topic_name))
    sow.publish(topic_name, [{"orderId": i} for i in range(4)])
    made: list[object] = []
    real_init = scripts.Scripts.__init__

    def counting_init(self, r):
        made.append(self)
        real_init(self, r)

    def key_of(i: int) -> list[str]:
        return [r.sow_key for r in sow.sow(topic_name) if r.obj()["orderId"] == i]

    assert sow.sow_delete(topic_name, keys=key_of(0)) == 1  # the client's scripts made here
    monkeypatch.setattr(scripts.Scripts, "__init__", counting_init)
    for i in (1, 2, 3):
        assert sow.sow_delete(topic_name, keys=key_of(i)) == 1
    assert made == [] and scripts.scripts_of(sow.r) is scripts.scripts_of(sow.r)
    assert [r.obj() for r in sow.sow(topic_name)] == []
