"""The previous state in the change feed (issue 26.1): on a topic with
``change_previous = true`` every publish and delta_publish change carries the record as it
was before (``previous``; None when there was none), on every write path of apply.lua (the
bulk write of plain publishes, the worker's planned ops, an expiring topic), on the real
server and on memory://; blocks written before the field existed still parse."""

from __future__ import annotations

import msgpack
import orjson
import pytest

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.model.events import ChangeEvent, parse_block


def _config(name: str, previous: bool = True, expiration: str | None = None) -> str:
    text = f'[[topic]]\nname = "{name}"\nkey = ["/k"]\npartitions = 1\n'
    if previous:
        text += "change_previous = true\n"
    if expiration:
        text += f'expiration = "{expiration}"\n'
    return text


def _events(sow: Sow, name: str) -> list[ChangeEvent]:
    out: list[ChangeEvent] = []
    for _sid, fields in sow.r.xrange(keys.changes(name, 0)):
        out += parse_block(fields[b"block"])["events"]
    return out


def _seen(events: list[ChangeEvent]) -> list[tuple[str, object, object]]:
    """(op, data, previous or "-" when the event has none) of each change."""
    return [(e["op"], e["data"], e.get("previous", "-")) for e in events]


@pytest.mark.parametrize("expiration", [None, "1h"])
def test_each_change_carries_the_record_before_it(sow, topic_name, expiration):
    sow.apply_config(_config(topic_name, expiration=expiration))
    sow.publish(topic_name, {"k": 1, "v": 1})
    # one call, three writes of one key: the bulk write keeps only the last per key, the
    # events still chain each write to the one before it
    sow.publish(topic_name, [{"k": 1, "v": 2}, {"k": 2, "v": 20}, {"k": 1, "v": 3}])
    sow.delta_publish(topic_name, {"k": 1, "w": 4})
    sow.sow_delete(topic_name, keys=[sow.sow(topic_name, "/k = 1")[0].sow_key])
    sow.publish(topic_name, {"k": 1, "v": 5})
    assert _seen(_events(sow, topic_name)) == [
        ("publish", {"k": 1, "v": 1}, None),
        ("publish", {"k": 1, "v": 2}, {"k": 1, "v": 1}),
        ("publish", {"k": 2, "v": 20}, None),
        ("publish", {"k": 1, "v": 3}, {"k": 1, "v": 2}),
        ("delta_publish", {"k": 1, "v": 3, "w": 4}, {"k": 1, "v": 3}),
        ("sow_delete", {"k": 1, "v": 3, "w": 4}, "-"),  # data: the removed record
        ("publish", {"k": 1, "v": 5}, None),
    ]


def test_a_topic_without_the_option_records_no_previous_state(sow, topic_name):
    sow.apply_config(_config(topic_name, previous=False))
    sow.publish(topic_name, {"k": 1, "v": 1})
    sow.publish(topic_name, {"k": 1, "v": 2})
    assert _seen(_events(sow, topic_name)) == [
        ("publish", {"k": 1, "v": 1}, "-"), ("publish", {"k": 1, "v": 2}, "-")]


def test_a_record_that_expired_has_no_previous_state(sow, topic_name):
    sow.apply_config(_config(topic_name, expiration="1h"))
    sow.publish(topic_name, {"k": 1, "v": 1}, expiration=0.05)
    import time

    time.sleep(0.1)  # due, not yet removed: the next write of the key removes it first
    sow.publish(topic_name, {"k": 1, "v": 2})
    seen = _seen(_events(sow, topic_name))
    assert seen[0] == ("publish", {"k": 1, "v": 1}, None)
    assert seen[-1] == ("publish", {"k": 1, "v": 2}, None), seen
    assert ("sow_delete", {"k": 1, "v": 1}, "-") in seen


@pytest.mark.parametrize("previous", [True, False])
def test_a_late_subscriber_gets_the_oof_match_of_a_record_it_never_saw(sow, topic_name,
                                                                       previous):
    """With the previous state in the change, an update that takes a record out of the
    filter is an out-of-focus notice even for a subscriber that joined after the record
    matched; without it the subscriber cannot know (the record was never in its view)."""
    sow.apply_config(_config(topic_name, previous=previous))
    sow.publish(topic_name, {"k": 1, "v": 10})
    with sow.subscribe(topic_name, "/v > 5", oof=True) as sub:
        sow.publish(topic_name, [{"k": 1, "v": 1}, {"k": 2, "v": 20}])
        got = [sub.get(10), sub.get(0.5 if not previous else 10)]
    kinds = [(m["kind"], m.get("reason"), m["data"]) if m else None for m in got]
    if previous:
        assert kinds == [("oof", "match", {"k": 1, "v": 1}), ("publish", None, {"k": 2, "v": 20})]
    else:
        assert kinds == [("publish", None, {"k": 2, "v": 20}), None]


def test_blocks_of_seven_fields_per_change_still_parse():
    """A change feed written before ``previous`` existed (7 fields per change)."""
    old = msgpack.packb(["t", 0, 4, 5, 1700000000000,
                         "publish", "k1", 4, "1-0", "", 0, '{"a":1}',
                         "sow_delete", "k2", 5, "2-0", "deleted", 0, '{"b":2}'])
    block = parse_block(old)
    assert [(e["op"], e["sow_key"], e["data"]) for e in block["events"]] == [
        ("publish", "k1", {"a": 1}), ("sow_delete", "k2", {"b": 2})]
    assert all("previous" not in e for e in block["events"])
    new = msgpack.packb(["t", 0, 6, 6, 1700000000000,
                         "publish", "k1", 6, "3-0", "", 0, '{"a":2}', '{"a":1}'])
    assert parse_block(new)["events"][0]["previous"] == {"a": 1}
    junk = orjson.dumps(["t", 0, 6, 6, 1700000000000,
                         "publish", "k1", 6, "3-0", "", 0, '{"a":2}', "[1]"])
    assert "previous" not in parse_block(junk)["events"][0]  # not an object: not recorded
    with pytest.raises(ValueError):
        parse_block(msgpack.packb(["t", 0, 6, 7, 1, "publish", "k1", 6, "3-0", "", 0, "{}"]))


def test_a_previous_state_as_stored_is_read_without_its_header():
    """Lua puts the stored record whole (``<seq>:<expiry ms>:<stream id>`` and a newline
    before the JSON) in ``previous``; the reader takes the JSON. Without a newline, or with
    something else after it, the previous state is not recorded (and the change still is)."""
    def block(previous: str) -> bytes:
        return msgpack.packb(["t", 0, 6, 6, 1700000000000,
                              "publish", "k1", 6, "3-0", "", 0, '{"a":2}', previous])

    assert parse_block(block('5:0:1700000000000-0\n{"a":1}'))["events"][0]["previous"] == {
        "a": 1}
    json_block = orjson.dumps(["t", 0, 6, 6, 1, "publish", "k1", 6, "3-0", "", 0, '{"a":2}',
                               '5:0:1-0\n{"a":{"b":1}}'])
    assert parse_block(json_block)["events"][0]["previous"] == {"a": {"b": 1}}
    # a SOW key beyond ASCII (a chained key can be a user's order id) decodes on the slower
    # path: its previous state is read there too
    wide = msgpack.packb(["t", 0, 6, 6, 1, "publish", "ordre-é", 6, "3-0", "", 0, '{"a":2}',
                          '5:0:1-0\n{"a":1}'])
    ev = parse_block(wide)["events"][0]
    assert (ev["sow_key"], ev["data"], ev["previous"]) == ("ordre-é", {"a": 2}, {"a": 1})
    for bad in ("5:0:1-0", "5:0:1-0\n[1]", "5:0:1-0\nnot json", "7"):
        ev = parse_block(block(bad))["events"][0]
        assert "previous" not in ev and ev["data"] == {"a": 2}, bad
