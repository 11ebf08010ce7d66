"""The deriver's fast path (issue 26, views): its subscription takes the changes of a block as
one ``changes`` message (``Subscriber(batches=True)``, decoded by ``plain_changes``) and a
view's aggregation takes them in one loop (``Aggregation.take_changes``). Each step must give
what the general path gives (``parse_block``, one message per change, ``upsert_keys`` /
``remove_keys``): random changes, good and bad, go through both and are compared."""

from __future__ import annotations

import json
import random
import re
import time

import msgpack
import orjson
import pytest
from conftest import random_record

from sow_redis import derive, keys
from sow_redis.feed.changes import current_seqs
from sow_redis.feed.subscriber import Subscriber
from sow_redis.model.aggregate import Aggregation
from sow_redis.model.events import parse_block, plain_changes

VIEW = ["/g", "COUNT(/id) AS /count", "SUM(/qty) AS /qty", "AVG(/px) AS /avg_px",
        "MIN(/px) AS /lo", "MAX(/px) AS /hi", "MAX(/n) AS /n"]


# -- decoding ------------------------------------------------------------------------------
def test_plain_changes_agree_with_parse_block():
    """On random blocks of 8 and 7 fields per change (MessagePack and JSON) mixing good
    changes with bad ones (unknown op, a SOW key or data not UTF-8 or not ASCII, data that is
    no JSON object, odd expiries and seqs, previous states of every kind): plain_changes gives
    the changes parse_block gives, or None; None whenever parse_block finds an error, and
    for anything that is no change block; never None for a block of good changes."""
    rnd = random.Random(26)
    good_ops = ["publish", "delta_publish", "sow_delete"]
    good_keys = ["k1", "k2", "x" * 40]
    good_datas = ['{"a":1,"b":[1,2]}', '{"k":"v"}', "{}"]
    bad_ops, bad_keys = ["nope", ""], ["é", "k\udcff"]
    bad_datas = ["[1]", "7", "NaN", "{bad", "[" * 600, '{"a":"\udcff"}', "", OVERFLOW]
    previous = ["", "null", '{"a":0}', "[1]", '~[{"b":0},["a"]]', "~junk", "junk"]
    plain = 0
    for trial in range(600):
        width = rnd.choice([7, 8])
        first = rnd.randrange(1, 1000)
        count = rnd.randrange(1, 6)
        clean = rnd.random() < 0.5
        arr: list = ["t", rnd.choice([0, 2]), first, first + count - 1, 1_700_000_000_000]
        for n in range(count):
            def odd() -> bool:  # each field of a change of an unclean block by itself
                return not clean and rnd.random() < 0.06  # noqa: B023

            change = [rnd.choice(bad_ops if odd() else good_ops),
                      rnd.choice(bad_keys if odd() else good_keys),
                      rnd.choice([None, "9", first, first + n + 1]) if odd() else first + n,
                      f"{n}-0", rnd.choice(["", "deleted", "expired"]),
                      rnd.choice([-5, 2**62, "12", 1.5]) if odd() else
                      rnd.choice([0, 1_800_000_000_000]),
                      rnd.choice(bad_datas if odd() else good_datas)]
            arr += change + ([rnd.choice(previous)] if width == 8 else [])
        packed = msgpack.packb(arr, use_bin_type=False, unicode_errors="surrogateescape")
        utf8 = not any("\udcff" in x for x in arr if isinstance(x, str))
        for raw in (packed, orjson.dumps(arr)) if utf8 else (packed,):
            block = parse_block(raw)
            got = plain_changes(raw)
            # the view's decoder: the same block or None, each record's fields as orjson's
            fields = plain_changes(raw, DECODE)
            if got is None and fields is not None:  # its one other text: a field not read
                assert OVERFLOW in arr, (trial, arr)  # out of a double's range
            assert got is None or fields is not None, (trial, arr)
            if got is not None and fields is not None:
                assert fields[:3] == got[:3]
                assert [(k, None if r is None else _fields(r)) for k, r in fields[3]] == [
                    (k, None if r is None else [r.get(n) for n in FIELDS])
                    for k, r in got[3]]
            if clean:
                assert got is not None, (trial, arr)
            if got is None:
                continue
            plain += 1
            events = block["events"]
            assert not any("error" in ev for ev in events), (trial, arr)
            assert [ev["seq"] for ev in events] == list(range(first, first + count))
            assert got == (block["partition"], block["first"], block["last"], [
                (ev["sow_key"], None if ev["op"] == "sow_delete" else ev["data"])
                for ev in events]), (trial, arr)
    assert plain > 300
    for junk in (b"junk", b"[1,2]", orjson.dumps({"topic": "t", "op": "topic_removed"}),
                 msgpack.packb(["t", 0, 6, 7, 1, "publish", "k1", 6, "3-0", "", 0, "{}"])):
        assert plain_changes(junk) is None


# -- decoding the fields a view reads ------------------------------------------------------
AGG = Aggregation(VIEW, ["/g"], "x")
DECODE, FIELDS = AGG.decode_inputs, AGG.fields


def _fields(inputs) -> list:
    return [getattr(inputs, f"f{i}") for i in range(len(FIELDS))]


OVERFLOW = '{"a":1e400}'
"""A record orjson refuses (a number beyond a double's range) whose fields the view's
decoder takes: msgspec does not check the range of a number it skips."""

_BEYOND = re.compile(r"-?\d+(?:\.\d+)?[eE]\+?[1-9]\d{2,}")


def _orjson_fields(data) -> object:
    """The view's fields of ``data`` as orjson gives them, or ValueError (no JSON object); a
    number beyond a double's range in a field the view does not read counts as 0."""
    try:
        record = orjson.loads(data)
    except (ValueError, RecursionError):
        try:  # 0 or 1 for those numbers: a field the view reads would differ
            text = data.decode() if isinstance(data, bytes) else data
            zero, one = (orjson.loads(_BEYOND.sub(n, text)) for n in ("0", "1"))
        except (ValueError, RecursionError):
            return ValueError
        if not (type(zero) is type(one) is dict and text != _BEYOND.sub("0", text)) or [
                zero.get(n) for n in FIELDS] != [one.get(n) for n in FIELDS]:
            return ValueError
        record = zero
    return [record.get(n) for n in FIELDS] if type(record) is dict else ValueError


EDGE_TEXTS = [
    '{"g":1,"g":2}', '{"px":1,"px":[1]}', '{"g":123456789012345678901234567890}',
    '{"n":18446744073709551615}', '{"n":18446744073709551616}', '{"n":-9223372036854775808}',
    '{"n":-9223372036854775809}', '{"g":1e400}', '{"g":1.5e-400}', '{"g":NaN}', '{"g":1} x',
    ' {"g":1} ', "[1]", "7", '"g"', "null", "{}", "", '{"g":"\\ud800"}', '{"x":"\\ud800"}',
    '{"x":"\\q","g":1}', '{"x":"a\\u0001b","g":1}', '{"x":01,"g":1}', '{"x":1.,"g":1}',
    '{"x":' + "[" * 5000 + "]" * 5000 + ',"g":1}', '{"g":' + "[" * 5000 + "]" * 5000 + "}",
    '{"G":1,"gg":2,"g ":3}', '{"x":"\udcff","g":2}', b'{"g":1,"x":"\xff"}',
    b'{"g":1,"x":"\xed\xa0\x80"}', b'{"g":"\xc3\xa9"}', '{"g":"\u00e9","id":[1,{"a":2}]}',
    '{"px":{"a":18446744073709551616}}', '{"qty":[1,18446744073709551616]}', OVERFLOW,
    '{"g":1,"x":[1e400]}', '{"px":1e400}', '{"g":2,"px":-1.5E+999}']


def test_decode_inputs_decodes_the_fields_as_orjson_does():
    """``decode_inputs`` (msgspec, only the fields the view reads) gives each of them as
    ``orjson.loads`` does, of the same type, and refuses (ValueError, RecursionError)
    exactly the texts orjson refuses or that are no object: random records of every value
    type (as text and as bytes) and edge texts (duplicate fields, integers beyond 64 bits at
    the top and nested, arrays and objects, invalid UTF-8 as bytes and as surrogates, bad
    escapes, trailing text, deep nesting, numbers out of range, names near a field's). The
    one difference: a number beyond a double's range in a field the view does not read
    (:data:`OVERFLOW`) leaves the record to the view, which orjson refuses whole."""
    assert FIELDS == ["g", "id", "qty", "px", "n"]
    rnd = random.Random(5)

    def value():
        return rnd.choice([rnd.randrange(-2**70, 2**70), 2**64 - 1, 2**64, -2**63,
                           -2**63 - 1, round(rnd.uniform(-1e6, 1e6), 4),
                           rnd.uniform(-1e300, 1e300), 5e-324, -0.0, True, False, None, "x",
                           "é\u2028\"\\", "", [1, 2**65], {"a": [1, {"b": None}]},
                           rnd.random()])

    texts: list = list(EDGE_TEXTS)
    for i in range(3000):
        rec = random_record(rnd, rnd.choice([i, str(i), None, 2**66]), value)
        text = json.dumps(rec, ensure_ascii=i % 2 == 0, separators=(",", ":"))
        texts += [text, text.encode()]
    refused = 0
    for data in texts:
        want = _orjson_fields(data)
        try:
            got: object = _fields(DECODE(data))
        except (ValueError, RecursionError):
            got = ValueError
            refused += 1
        assert got == want and repr(got) == repr(want), data[:80]
    assert refused >= 15


# -- aggregation ---------------------------------------------------------------------------
@pytest.mark.parametrize(("projection", "grouping"), [
    (VIEW, ["/g"]),  # bench_views' view
    (["/g", "/h", "MIN(/v) AS /lo", "COUNT(/v) AS /n", "SUM(/w) AS /s"], ["/g", "/h"]),
    (["/a/g", "AVG(/a/v) AS /t/avg", "MAX(/a/v) AS /t/hi", "COUNT(/id) AS /t/n",
      "SUM(/a/v) AS /sum"], ["/a/g"]),
])
def test_take_changes_equals_upsert_keys_one_by_one(projection, grouping):
    """``take_changes`` on random batches of inserts, updates (numbers of each type and
    magnitude, non-numbers, nulls, missing fields, moves between groups) and removals (of
    records held and not) leaves the rows, and the rows a follower marks for its next write,
    as ``upsert_keys`` / ``remove_keys`` one change at a time do; so does ``take_inputs``
    of the fields ``decode_inputs`` decodes of the same records."""
    rnd = random.Random(" ".join(projection))
    one, many, fields = (Aggregation(projection, grouping, "x") for _ in range(3))
    # take_inputs: as take_changes, of the records' fields the projection reads (decoded by
    # decode_inputs); none for a projection of nested paths
    nested = any(len(path) > 1 for path in [*fields.spec.grouping,
                                            *(agg.path for agg in fields.spec.aggregates)])
    assert (fields.take_inputs is None) == nested
    marks = {name: (set(), set()) for name in ("one", "many", "fields")}  # (dirty, gone)

    def changed(name):
        dirty, gone = marks[name]

        def mark(entries):  # what derive._Follower.changed does
            for what, key, _row in entries:
                if what == "publish":
                    dirty.add(key)
                    gone.discard(key)
                else:
                    dirty.discard(key)
                    gone.add(key)
        return mark

    def value():
        return rnd.choice([rnd.randrange(-50, 50), round(rnd.uniform(-99, 99), 2), 0.1, 1,
                           1.0, 0.0, -0.0, True, None, "7", 5e-324, 1e300, 2.5e-310,
                           rnd.uniform(-1e6, 1e6), rnd.randrange(-50, 50)])

    def record() -> dict:
        return random_record(rnd, rnd.randrange(5), value)

    current: dict[str, dict] = {}
    for step in range(300):
        batch: list = []
        for _ in range(rnd.randrange(1, 30)):
            key = str(rnd.randrange(40))
            if rnd.random() < 0.15:
                batch.append((key, None))
                current.pop(key, None)
            else:
                rec = record() if key not in current or rnd.random() < 0.3 else dict(
                    current[key], **{rnd.choice(["v", "w", "qty", "px", "n"]): value()})
                batch.append((key, rec))
                current[key] = rec
        for key, rec in batch:
            changed("one")(one.upsert_keys(key, rec) if rec is not None
                           else one.remove_keys(key))
        many.take_changes(batch, marks["many"][0], changed("many"))
        assert marks["one"] == marks["many"], step
        assert sorted(map(repr, one.rows())) == sorted(map(repr, many.rows())), step
        assert one._of == many._of
        if not nested:
            assert fields.decode_inputs is not None and fields.take_inputs is not None
            fields.take_inputs([(key, None if rec is None else fields.decode_inputs(
                orjson.dumps(rec).decode())) for key, rec in batch], marks["fields"][0],
                changed("fields"))
            assert marks["one"] == marks["fields"], step
            assert sorted(map(repr, one.rows())) == sorted(map(repr, fields.rows())), step
        if step % 5 == 4:  # a write: the marks are taken
            for dirty, gone in marks.values():
                dirty.clear()
                gone.clear()


# -- the subscription ----------------------------------------------------------------------
def _subscribers(sow, name: str) -> dict[bool, Subscriber]:
    """The deriver's subscription to ``name``, with and without batches."""
    return {batches: Subscriber(sow.r, sow.topic(name), oof=True, sow=True, bookmarks=False,
                                batches=batches) for batches in (True, False)}


def _taken(sub: Subscriber, seqs: list[int]) -> tuple[dict[object, list], int]:
    """Every message ``sub`` gives until it has accounted for ``seqs`` and has nothing more:
    per partition, one entry per change (``changes`` expanded), and the number of
    ``changes`` messages."""
    out: dict[object, list] = {}
    batches = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        msg = sub.get(0.2)
        if msg is None:
            if sub.pos == seqs:
                return out, batches
            continue
        kind, p = msg["kind"], msg.get("partition")
        if kind == "changes":
            batches += 1
            out.setdefault(p, []).extend(
                ("publish", key, rec) if rec is not None else ("oof", key, None)
                for key, rec in msg["changes"])
        elif kind in ("publish", "oof"):
            out.setdefault(p, []).append(
                (kind, msg["sow_key"], msg["data"] if kind == "publish" else None))
        else:
            out.setdefault(p, []).append(
                (kind, msg.get("sow_key"), msg.get("data"), msg.get("cause"), msg.get("how")))
    raise AssertionError(f"the subscriber did not reach {seqs}: {sub.pos}")


def test_a_batched_subscription_gives_the_changes_the_per_change_one_gives(sow, topic_name):
    """Random publishes, delta_publishes, sow_deletes (by key and by filter) and expiries on
    2 partitions, after a first query: the subscription with batches gives the same changes
    in the same order per partition, most of them in ``changes`` messages."""
    from sow_redis.expirer import Expirer

    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 2\n'
                     'expiration = "enabled"\n')
    rnd = random.Random(7)
    sow.publish(topic_name, [{"id": i, "g": i % 3, "px": i / 4} for i in range(20)])
    subs = _subscribers(sow, topic_name)
    for step in range(150):
        roll, i = rnd.random(), rnd.randrange(40)
        if roll < 0.5:
            sow.publish(topic_name, [{"id": rnd.randrange(40), "g": rnd.randrange(3),
                                      "px": rnd.choice([1, 2.5, None, "x"])}
                                     for _ in range(rnd.randrange(1, 6))])
        elif roll < 0.7:
            sow.delta_publish(topic_name, {"id": i, "px": rnd.randrange(9)})
        elif roll < 0.85:
            sow.sow_delete(topic_name, f"/id = {i}")
        elif roll < 0.9:
            sow.sow_delete(topic_name, f"/g = {rnd.randrange(3)}")
        else:
            sow.publish(topic_name, {"id": i, "g": 1, "px": 0.5}, expiration=0.05)
        if step % 50 == 49:
            time.sleep(0.1)
            Expirer(sow.r, sow.settings, topics=[topic_name]).run(burst=True)
    seqs = current_seqs(sow.r, sow.topic(topic_name))
    (fast, batches), (general, none) = (_taken(subs[b], seqs) for b in (True, False))
    for sub in subs.values():
        sub.close()
    assert fast == general
    assert batches > 50 and none == 0
    assert sum(entry[0] == "oof" for changes in general.values() for entry in changes) > 20


def _forge(r, name: str, p: int, changes: list[tuple[bytes, bytes]], live: bool = True) -> None:
    """``changes`` (SOW key, data) as one block of partition ``p`` in its change feed and
    (``live``) on its channel, as a client bypassing the write path could write them."""
    first = int(r.hget(keys.state(name, p), "seq") or 0) + 1
    arr: list = [name, p, first, first + len(changes) - 1, int(time.time() * 1000)]
    for n, (key, data) in enumerate(changes):
        arr += ["publish", key, first + n, f"{first + n}-0", "", 0, data, ""]
    raw = msgpack.packb(arr, use_bin_type=False)
    r.hset(keys.state(name, p), "seq", first + len(changes) - 1)
    r.xadd(keys.changes(name, p), {"block": raw}, id=f"{first}-0")
    if live:
        r.execute_command("SPUBLISH", keys.partition_channel(name, p), raw)


def test_bad_blocks_and_gaps_reach_a_batched_subscription_as_the_per_change_one(
        url, topic_name):
    """Blocks with changes that cannot be decoded (reported, skipped), a change with a
    non-ASCII key, a message that is no block, a block missed on the channel (a gap, read
    from the change feed): both subscriptions give the same changes and the same reports."""
    from sow_redis.client import Sow

    sow = Sow(url, inline=True)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 1\n')
    sow.publish(topic_name, {"id": 1})
    reports: dict[bool, list] = {True: [], False: []}
    subs = {b: Subscriber(sow.r, sow.topic(topic_name), oof=True, sow=True, bookmarks=False,
                          batches=b, report=reports[b].append) for b in (True, False)}
    sow.publish(topic_name, [{"id": i} for i in range(5)])
    _forge(sow.r, topic_name, 0, [(b"a", b'{"id":"a"}'), (b"b", b"[1]"), (b"c", b"{bad")])
    sow.r.execute_command("SPUBLISH", keys.partition_channel(topic_name, 0), b"junk")
    _forge(sow.r, topic_name, 0, [("é".encode(), b'{"id":"e"}'), (b"d", b'{"id":"d"}')])
    sow.publish(topic_name, {"id": 2})
    _forge(sow.r, topic_name, 0, [(b"f", b'{"id":"f"}')], live=False)  # the gap
    sow.publish(topic_name, [{"id": 3}, {"id": 4}])
    # a gap the feed no longer holds: the records are read again, and a record of the
    # subscription's view that is gone (9: taken in a batch) gets its out-of-focus notice
    sow.publish(topic_name, {"id": 9})
    [nine] = [rec.sow_key for rec in sow.sow(topic_name) if rec.obj() == {"id": 9}]
    sow.r.hdel(keys.records(topic_name, 0), nine)
    sow.r.hincrby(keys.state(topic_name, 0), "seq", 1)
    sow.publish(topic_name, {"id": 10})
    seqs = current_seqs(sow.r, sow.topic(topic_name))
    (fast, batches), (general, _none) = (_taken(subs[b], seqs) for b in (True, False))
    for sub in subs.values():
        sub.close()
    assert fast == general and batches == 3  # the good blocks that follow the position
    assert ("publish", "é", {"id": "e"}) in general[0] and ("publish", "f", {"id": "f"}) in \
        general[0]
    assert [entry[4] for entry in general[0] if entry[0] == "recovery"] == ["feed", "requery"]
    assert ("oof", nine, None) in general[0]
    assert len(reports[True]) >= 3 and reports[True] == reports[False]


# -- the view follower ---------------------------------------------------------------------
def _follower(sow, name: str, batches: bool) -> tuple[derive._ViewFollower, dict]:
    """A view follower of ``name`` whose writes go to a dict (SOW key → row) instead."""
    follower = derive._ViewFollower(sow, sow.topic(name))
    follower.sub._batches = follower.sub._batches and batches
    table: dict = {}

    def write(upserts, removals):
        for key in removals - set(upserts):
            table.pop(key, None)
        table.update(upserts)

    follower.write = write
    return follower, table


def _caught_up(sow, follower: derive._Follower, underlying: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not follower.step(0.05) and follower.ready and \
                follower.sub.pos == current_seqs(sow.r, sow.topic(underlying)):
            if follower.writer is not None:
                follower.writer.drain()
            return
    raise AssertionError("the follower did not catch up")


def test_a_view_fed_in_batches_equals_the_per_change_one_and_a_recompute(sow, topic_name):
    """Two followers of one view without a filter, one with the batches and one without, in
    rounds of random publishes, delta_publishes (numbers, floats, strings, nulls, missing
    fields), sow_deletes and expiries: after each round both wrote the same rows, equal to
    the rows computed afresh from the topic's records (150 operations a round; 40 on
    memory://, whose Lua runs about five times slower)."""
    from sow_redis.expirer import Expirer

    view = f"{topic_name}_v"
    quoted = ", ".join(f'"{p}"' for p in VIEW)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 3\n'
                     f'expiration = "enabled"\n[[view]]\nname = "{view}"\n'
                     f'underlying = "{topic_name}"\nprojection = [{quoted}]\n'
                     'grouping = ["/g"]\n')
    rnd = random.Random(11)

    def number():
        return rnd.choice([rnd.randrange(100), round(rnd.uniform(0, 1000), 4), 0.1, -0.0,
                           None, "7", True, 1e300, 5e-324, rnd.uniform(-1e9, 1e9)])

    def order(i: int) -> dict:
        rec = {"id": i, "g": rnd.choice([1, 2, 3, "x", None, 2.0]), "qty": number(),
               "px": number(), "n": rnd.randrange(1000)}
        if rnd.random() < 0.1:
            del rec[rnd.choice(["qty", "px", "g"])]
        return rec

    sow.publish(topic_name, [order(i) for i in range(50)])
    followers = {b: _follower(sow, view, b) for b in (True, False)}
    per_round = 40 if sow.url.startswith("memory://") else 150
    for round_ in range(4):
        for _ in range(per_round):
            roll, i = rnd.random(), rnd.randrange(120)
            if roll < 0.45:
                sow.publish(topic_name, [order(rnd.randrange(120))
                                         for _ in range(rnd.randrange(1, 8))])
            elif roll < 0.75:
                sow.delta_publish(topic_name, {"id": i, rnd.choice(["qty", "px", "g"]):
                                               number()})
            elif roll < 0.9:
                sow.sow_delete(topic_name, f"/id = {i}")
            elif roll < 0.93:
                sow.sow_delete(topic_name, f"/g = {rnd.randrange(1, 4)}")
            else:
                sow.publish(topic_name, order(i), expiration=0.05)
        time.sleep(0.1)
        Expirer(sow.r, sow.settings, topics=[topic_name]).run(burst=True)
        for follower, _table in followers.values():
            _caught_up(sow, follower, topic_name)
        fresh = Aggregation(VIEW, ["/g"], domain=view)
        for rec in sow.sow(topic_name):
            fresh.upsert(rec.sow_key, rec.obj())
        fast_rows, general_rows = followers[True][1], followers[False][1]
        assert fast_rows == general_rows == dict(fresh.rows()), f"round {round_}"
    for follower, _table in followers.values():
        follower.close()
