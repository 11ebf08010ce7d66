"""Paging (skip_n with top_n) and select lists of sow queries (issue 25; AMPS skip_n and
select)."""

from __future__ import annotations

import random
import threading
import time

import orjson
import pytest

from sow_redis.client import Sow
from sow_redis.errors import FilterSyntaxError
from conftest import command_calls, run_cli


def _config(name: str) -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = 3\n'


def test_pages_cover_every_match_once_in_order(sow, topic_name):
    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": i, "px": (i * 7) % 23, "o": {"a": i, "b": -i}}
                             for i in range(50)])
    every = [r.obj()["id"] for r in sow.sow(topic_name, "/px > 3", order_by="/px, /id")]
    pages = []
    for start in range(0, 60, 7):
        pages += [r.obj()["id"] for r in sow.sow(topic_name, "/px > 3", order_by="/px, /id",
                                                  skip_n=start, top_n=7)]
    assert pages == every and len(every) == 41
    by_key = sorted(r.sow_key for r in sow.sow(topic_name))  # a page without order-by
    assert [r.sow_key for r in sow.sow(topic_name, skip_n=45)] == by_key[45:]
    assert [r.sow_key for r in sow.sow(topic_name, skip_n=0, top_n=3)] == by_key[:3]
    assert len(sow.sow(topic_name, top_n=3)) == 3  # no page: the first 3 read
    assert sow.sow(topic_name, skip_n=50) == []
    with pytest.raises(ValueError, match="skip_n must be 0 or more"):
        sow.sow(topic_name, skip_n=-1)


def test_pages_visit_every_record_once_while_records_change(sow, topic_name):
    """Pages without order-by come in SOW-key order, so pages taken one after the other
    while every record is being updated (a publisher thread) visit each record once."""
    sow.apply_config(_config(topic_name))
    n, size = 240, 17
    sow.publish(topic_name, [{"id": i, "px": 0} for i in range(n)], wait=True)
    stop, updates = threading.Event(), [0]

    def update() -> None:
        rnd = random.Random(7)
        while not stop.is_set() and updates[0] < 20_000:
            batch = [{"id": rnd.randrange(n), "px": rnd.randrange(1000)} for _ in range(20)]
            sow.publish(topic_name, batch, wait=True)
            updates[0] += len(batch)

    writer = threading.Thread(target=update, daemon=True)
    writer.start()
    try:
        pages, skip, deadline = [], 0, time.monotonic() + 60
        while time.monotonic() < deadline:
            page = sow.sow(topic_name, "/px >= 0", skip_n=skip, top_n=size)
            pages.append([r.sow_key for r in page])
            if len(page) < size:
                break
            skip += size
            time.sleep(0.02)  # let updates land between the pages
    finally:
        stop.set()
        writer.join(timeout=30)
    seen = [k for page in pages for k in page]
    print(f"{len(pages)} pages, {len(seen)} records, {updates[0]} updates meanwhile")
    assert updates[0] > 0 and len(pages) == n // size + 1
    assert seen == sorted(seen) and len(seen) == len(set(seen)) == n
    assert sorted(seen) == sorted(r.sow_key for r in sow.sow(topic_name))


def test_select_lists_keep_only_the_named_fields(sow, topic_name):
    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": 1, "px": 5, "o": {"a": 1, "b": 2}, "n": None}])
    (rec,) = sow.sow(topic_name, select=["/id", "/o/b", "/n", "/missing"])
    assert rec.obj() == {"id": 1, "o": {"b": 2}, "n": None}
    with pytest.raises(ValueError, match="field path"):
        sow.sow(topic_name, select=["id"])
    # a select list as AMPS writes it: comma-separated, alone or among others
    want = {"id": 1, "o": {"b": 2}}
    assert [r.obj() for r in sow.sow(topic_name, select="/id, /o/b")] == [want]
    assert [r.obj() for r in sow.sow(topic_name, select=["/id,/o/b", "/n"])] == [{**want,
                                                                                "n": None}]
    with pytest.raises(ValueError, match="field path"):
        sow.sow(topic_name, select="/id,")


def test_cli_paging_and_select(url, topic_name):
    Sow(url).apply_config(_config(topic_name))
    run_cli(url, "publish", "-t", topic_name, "--wait",
            input=b"".join(b'{"id": %d, "px": %d, "x": "y"}\n' % (i, i) for i in range(10)))
    out = run_cli(url, "sow", "-t", topic_name, "--order-by", "/px DESC", "--skip-n", "2",
                  "--top-n", "3", "--select", "/id")
    assert [orjson.loads(x) for x in out.stdout.splitlines()] == [{"id": 7}, {"id": 6},
                                                                   {"id": 5}]
    out = run_cli(url, "sow", "-t", topic_name, "--order-by", "/px", "--top-n", "2",
                  "--select", "/id,/x")
    assert [orjson.loads(x) for x in out.stdout.splitlines()] == [{"id": 0, "x": "y"},
                                                                   {"id": 1, "x": "y"}]
    out = run_cli(url, "sow", "-t", topic_name, "--skip-n", "8")  # a page: by SOW key
    keys = sorted(r.sow_key for r in Sow(url).sow(topic_name))
    got = [r.obj() for r in Sow(url).sow(topic_name, keys=keys[8:])]
    assert sorted(orjson.loads(x)["id"] for x in out.stdout.splitlines()) == sorted(
        o["id"] for o in got) and len(got) == 2
    bad = run_cli(url, "sow", "-t", topic_name, "--select", "id", check=False)
    err = bad.stderr.decode().strip().splitlines()
    assert bad.returncode == 1 and len(err) == 1 and "--select" in err[0], err


def test_batches_hand_over_every_match_once(sow, topic_name):
    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": i, "px": i % 7} for i in range(100)])
    batches = list(sow.sow_batches(topic_name, 16, "/px > 2"))
    assert all(1 <= len(b) <= 16 for b in batches) and len(batches) >= 4
    got = sorted(r.obj()["id"] for b in batches for r in b)
    assert got == sorted(r.obj()["id"] for r in sow.sow(topic_name, "/px > 2"))
    ordered = [r.obj()["id"] for b in sow.sow_batches(topic_name, 10, order_by="/id DESC",
                                                      skip_n=5, top_n=25) for r in b]
    assert ordered == list(range(94, 69, -1))
    assert sum(len(b) for b in sow.sow_batches(topic_name, 7, skip_n=90, top_n=20)) == 10
    with pytest.raises(ValueError, match="batch_size"):
        sow.sow_batches(topic_name, 0)


def test_sow_with_a_batch_size_is_an_iterator_checked_before_it_reads(sow, topic_name):
    """``Sow.sow(..., batch_size=B)`` returns an iterator of the same records as the list;
    bad arguments raise at the call, before a record is asked for."""
    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": i, "px": i % 7, "o": {"a": i}} for i in range(100)])
    it = sow.sow(topic_name, "/px > 2", batch_size=16)
    assert iter(it) is it and not isinstance(it, list)
    assert sorted(r.sow_key for r in it) == sorted(
        r.sow_key for r in sow.sow(topic_name, "/px > 2"))
    assert list(it) == []  # one pass, as an AMPS message stream
    assert len(list(sow.sow(topic_name, top_n=5, batch_size=2))) == 5
    assert [r.obj() for r in sow.sow(topic_name, "/id < 3", order_by="/id DESC",
                                     select="/o/a", batch_size=2)] == [
        {"o": {"a": 2}}, {"o": {"a": 1}}, {"o": {"a": 0}}]
    for kw, err in (({"batch_size": 0}, ValueError), ({"top_n": -1, "batch_size": 5}, ValueError),
                    ({"filter": "/px >", "batch_size": 5}, FilterSyntaxError),
                    ({"select": "px", "batch_size": 5}, ValueError)):
        with pytest.raises(err):
            sow.sow(topic_name, **kw)


def test_sow_with_a_batch_size_reads_as_it_is_iterated(url, plane, topic_name):
    """The first record of a batched query of 3,000 records takes one HSCAN page, not the
    whole topic (Redis's command statistics count the HSCAN calls)."""
    if plane == "cluster":
        pytest.skip("the command statistics of one server: on the server plane")
    sow = Sow(url, inline=True)
    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": i} for i in range(3000)], wait=True)

    def hscans() -> int:
        return command_calls(sow.r, "hscan")["hscan"]

    before = hscans()
    it = sow.sow(topic_name, batch_size=10)
    next(it)
    first = hscans() - before
    rest = sum(1 for _ in it)
    every = hscans() - before
    print(f"\nHSCAN calls: {first} for the first record, {every} for all {rest + 1}")
    assert rest + 1 == 3000 and first == 1 and every > 3


def test_cli_batches_of_a_topic_pattern_name_their_topic(url, topic_name):
    Sow(url).apply_config(_config(topic_name + "_a") + _config(topic_name + "_b"))
    for suffix, ids in (("_a", range(5)), ("_b", range(5, 8))):
        Sow(url).publish(topic_name + suffix, [{"id": i} for i in ids], wait=True)
    out = run_cli(url, "sow", "-t", f"^{topic_name}_[ab]$", "--batch-size", "2",
                  "--select", "/id")
    lines = [orjson.loads(x) for x in out.stdout.splitlines()]
    assert sorted((x["topic"], x["data"]["id"]) for x in lines) == [
        (topic_name + "_a", i) for i in range(5)] + [(topic_name + "_b", i) for i in range(5, 8)]


def test_sow_and_subscribe_pages_and_selects(sow, topic_name):
    """The query part of a sow_and_subscribe pages as a sow query does (SOW-key order
    without order-by), and a select list trims the data of every message, live ones too."""
    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": i, "px": i, "o": {"a": i, "b": -i}} for i in range(10)],
                wait=True)
    by_key = sorted(r.sow_key for r in sow.sow(topic_name))
    with pytest.raises(ValueError, match="select list does not go with a delta"):
        sow.sow_and_subscribe(topic_name, delta=True, select="/id")
    sub = sow.sow_and_subscribe(topic_name, "/px >= 0", oof=True, skip_n=3, top_n=4,
                                select="/id,/o/b")
    try:
        first = [sub.get(timeout=10) for _ in range(5)]
        assert [m["kind"] for m in first] == ["sow"] * 4 + ["group_end"]
        assert [m["sow_key"] for m in first[:4]] == by_key[3:7]
        assert all(m["data"] == {"id": m["data"]["id"], "o": {"b": -m["data"]["id"]}}
                   for m in first[:4])
        sow.publish(topic_name, [{"id": 2, "px": 50, "o": {"a": 1, "b": 7}}], wait=True)
        sow.publish(topic_name, [{"id": 3, "px": -1, "o": {"a": 1, "b": 8}}], wait=True)
        live = [sub.get(timeout=10) for _ in range(2)]
    finally:
        sub.close()
    # two partitions: each delivers in order, not one before the other
    assert sorted(((m["kind"], m["data"]) for m in live), key=str) == [
        ("oof", {"id": 3, "o": {"b": 8}}), ("publish", {"id": 2, "o": {"b": 7}})]


def test_cli_sow_and_subscribe_pages_and_selects(url, topic_name):
    Sow(url).apply_config(_config(topic_name))
    Sow(url).publish(topic_name, [{"id": i, "px": i} for i in range(6)], wait=True)
    out = run_cli(url, "sow-and-subscribe", "-t", topic_name, "--order-by", "/px DESC",
                  "--skip-n", "1", "--top-n", "2", "--select", "/id", "--count", "3")
    lines = [orjson.loads(x) for x in out.stdout.splitlines()]
    assert [(m["kind"], m.get("data")) for m in lines] == [
        ("sow", {"id": 4}), ("sow", {"id": 3}), ("group_end", None)]
    bad = run_cli(url, "sow-and-subscribe", "-t", topic_name, "--select", "/id", "--delta",
                  check=False)
    err = bad.stderr.decode().strip().splitlines()
    assert bad.returncode == 2 and "--select does not go with --delta" in err[-1], err


def _query_part(sub) -> list[dict]:
    """The messages up to ``group_end`` (included), or up to a 10 s wait for one."""
    out = []
    while (msg := sub.get(timeout=10)) is not None:
        out.append(msg)
        if msg["kind"] == "group_end":
            break
    return out


def test_sow_and_subscribe_in_batches_meets_the_live_part_exactly(sow, topic_name, caplog):
    """``batch_size``: the query part is read one partition at a time as it is asked for
    while a publisher updates every record; the messages give each record's states in order
    (no duplicate, no older state after a newer one, no gap between the query and the live
    part), and a consumer applying them ends with exactly the SOW."""
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 8\n')
    sow.publish(topic_name, [{"id": i, "v": 0} for i in range(400)], wait=True)
    with pytest.raises(ValueError, match="batch_size must be 1 or more"):
        sow.sow_and_subscribe(topic_name, batch_size=0)
    caplog.set_level("INFO", logger="sow_redis.feed")
    sub = sow.sow_and_subscribe(topic_name, "/v < 3", oof=True, batch_size=7)
    held: dict[str, dict] = {}
    seen: dict[str, int] = {}
    order_errors = 0
    kinds: dict[str, int] = {}

    def take(msg: dict) -> None:
        nonlocal order_errors
        kinds[msg["kind"]] = kinds.get(msg["kind"], 0) + 1
        if msg["kind"] not in ("sow", "publish", "oof"):
            return
        key = msg["sow_key"]
        if msg["seq"] is not None and msg["seq"] <= seen.get(key, -1):
            order_errors += 1
        seen[key] = msg["seq"] if msg["seq"] is not None else seen.get(key, -1)
        if msg["kind"] == "oof":
            held.pop(key, None)
        else:
            held[key] = msg["data"]

    try:
        first = sub.get(timeout=10)
        assert first is not None and first["kind"] == "sow" and "bookmark" not in first
        take(first)
        for v in (1, 2, 3):  # while the query part is read; v = 3 leaves the filter
            sow.publish(topic_name, [{"id": i, "v": v} for i in range(0, 400, 3)], wait=True)
            for _ in range(40):
                msg = sub.get(timeout=10)
                assert msg is not None
                take(msg)
                if msg["kind"] == "group_end":
                    group_end = msg
        while (msg := sub.get(timeout=1)) is not None:
            take(msg)
            if msg["kind"] == "group_end":
                group_end = msg
    finally:
        sub.close()
    expected = {r.sow_key: r.obj() for r in sow.sow(topic_name, "/v < 3")}
    print(f"\nbatched sow_and_subscribe: {kinds}, {order_errors} out of order")
    assert held == expected and len(expected) == 400 - 134
    assert order_errors == 0 and kinds["group_end"] == 1
    assert group_end["count"] == kinds["sow"] and group_end["bookmark"]
    assert kinds["oof"] >= 1 and kinds["sow"] >= 266
    assert "cannot be copied" not in caplog.text  # every partition read from its copy


def test_sow_and_subscribe_in_batches_reads_one_partition_at_a_time(url, plane, topic_name):
    """The first message of a batched query part has copied one partition (Redis's command
    statistics count the COPY calls) and read one page of it; the whole query part copies
    the 8 and reads none whole, and leaves no copy behind."""
    if plane == "cluster":
        pytest.skip("the command statistics of one server: on the server plane")
    sow = Sow(url, inline=True)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 8\n')
    sow.publish(topic_name, [{"id": i} for i in range(8000)], wait=True)  # hash tables

    def calls() -> dict[str, int]:
        return command_calls(sow.r, "copy", "hscan", "hgetall")

    def spent(before: dict[str, int]) -> dict[str, int]:
        return {c: n - before[c] for c, n in calls().items()}

    before = calls()
    with sow.sow_and_subscribe(topic_name, batch_size=50) as sub:
        assert sub.get(timeout=10)["kind"] == "sow"
        first = spent(before)
        msgs = _query_part(sub)
        every = spent(before)
    print(f"\nfor the first message {first}, for the query part {every}")
    assert first == {"copy": 1, "hscan": 1, "hgetall": 0}
    assert every["copy"] == 8 and every["hgetall"] == 0 and every["hscan"] >= 8000 // 50
    assert [m["kind"] for m in msgs] == ["sow"] * 7999 + ["group_end"]
    assert msgs[-1]["count"] == 8000 and len({m["sow_key"] for m in msgs[:-1]}) == 7999
    assert list(sow.r.scan_iter(match="*:snap:*")) == []
    with sow.sow_and_subscribe(topic_name, batch_size=50) as sub:  # closed half-way
        assert sub.get(timeout=10)["kind"] == "sow"
        (copy,) = sow.r.scan_iter(match="*:snap:*")
        assert 0 < sow.r.pttl(copy) <= 600_000
    assert list(sow.r.scan_iter(match="*:snap:*")) == []  # deleted at close


def test_sow_and_subscribe_in_batches_without_copy_or_losing_the_copy(url, plane, topic_name):
    """An ACL user without COPY reads each partition whole (the same messages); a copy
    deleted by another client while it is scanned gives a ``recovery`` message (cause
    ``snapshot``) and the partition read again whole: every record still comes."""
    if plane == "cluster":
        pytest.skip("an ACL user of one server: on the server plane")
    admin = Sow(url, inline=True)
    admin.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 2\n')
    admin.publish(topic_name, [{"id": i} for i in range(2000)], wait=True)  # hash tables
    user = f"nocopy{topic_name}"
    admin.r.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                        commands=["+@all", "-copy"])
    try:
        port = url.rsplit(":", 1)[1].split("/")[0]
        limited = Sow(f"redis://{user}:pw@127.0.0.1:{port}/0", inline=True)
        with limited.sow_and_subscribe(topic_name, batch_size=10) as sub:
            msgs = _query_part(sub)
        assert [m["kind"] for m in msgs] == ["sow"] * 2000 + ["group_end"]
        assert sorted(m["data"]["id"] for m in msgs[:-1]) == list(range(2000))
    finally:
        admin.r.acl_deluser(user)
    with admin.sow_and_subscribe(topic_name, batch_size=10) as sub:
        first = [sub.get(timeout=10) for _ in range(5)]
        (copy,) = admin.r.scan_iter(match="*:snap:*")
        admin.r.delete(copy)
        rest = []
        while (msg := sub.get(timeout=1)) is not None:
            rest.append(msg)
    kinds = [m["kind"] for m in first + rest]
    recovery = [m for m in rest if m["kind"] == "recovery"]
    print(f"\ncopy deleted while scanned: {len(kinds)} messages, {recovery}")
    assert len(recovery) == 1 and recovery[0]["cause"] == "snapshot"
    got = {m["data"]["id"] for m in first + rest if m["kind"] == "sow"}
    assert got == set(range(2000)) and kinds[-1] == "group_end"


def test_cli_batches_of_sow_and_subscribe_and_of_the_past(url, topic_name):
    Sow(url).apply_config(_config(topic_name) + f'[[topic]]\nname = "{topic_name}_h"\n'
                          'key = ["/id"]\nhistory = { window = "1h" }\n')
    Sow(url).publish(topic_name, [{"id": i, "px": i} for i in range(6)], wait=True)
    out = run_cli(url, "sow-and-subscribe", "-t", topic_name, "--batch-size", "2",
                  "-f", "/px > 1", "--select", "/id", "--count", "5")
    lines = [orjson.loads(x) for x in out.stdout.splitlines()]
    assert [m["kind"] for m in lines] == ["sow"] * 4 + ["group_end"]
    assert sorted(m["data"]["id"] for m in lines[:4]) == [2, 3, 4, 5]
    assert lines[-1]["count"] == 4
    Sow(url).publish(f"{topic_name}_h", [{"id": 1, "v": 1}], wait=True)
    time.sleep(0.005)
    mark = Sow(url).sow_and_subscribe(f"{topic_name}_h", batch_size=1)
    try:
        bookmark = [m for m in (mark.get(timeout=10), mark.get(timeout=10))
                    if m["kind"] == "group_end"][0]["bookmark"]
    finally:
        mark.close()
    Sow(url).publish(f"{topic_name}_h", [{"id": 1, "v": 2}, {"id": 2, "v": 2}], wait=True)
    past = run_cli(url, "sow", "-t", f"{topic_name}_h", "--as-of", bookmark, "--batch-size", "1")
    assert [orjson.loads(x) for x in past.stdout.splitlines()] == [{"id": 1, "v": 1}]
    # the historical query part in batches, then the change after the point, then live
    out = run_cli(url, "sow-and-subscribe", "-t", f"{topic_name}_h", "--as-of", bookmark,
                  "--batch-size", "1", "--count", "5")
    lines = [orjson.loads(x) for x in out.stdout.splitlines()]
    assert [m["kind"] for m in lines] == ["sow", "group_end", "publish", "publish",
                                          "completed"], lines
    assert lines[0]["data"] == {"id": 1, "v": 1} and lines[0]["bookmark"] == bookmark
    assert lines[1]["count"] == 1 and lines[1]["bookmark"] == bookmark
    assert sorted(m["data"]["id"] for m in lines[2:4]) == [1, 2]


def test_cli_batches_in_every_format_but_a_table(url, topic_name):
    """``sow --batch-size`` prints what the same query prints without it, in JSON Lines with
    and without ``--with-key``, and as XML; ``--format table`` is one usage line."""
    Sow(url).apply_config(_config(topic_name))
    Sow(url).publish(topic_name, [{"id": i, "px": i % 4} for i in range(30)], wait=True)
    for extra in ((), ("--with-key",), ("--format", "xml"), ("-f", "/px = 2", "--top-n", "3")):
        whole = run_cli(url, "sow", "-t", topic_name, *extra).stdout.splitlines()
        batched = run_cli(url, "sow", "-t", topic_name, "--batch-size", "4", *extra)
        assert sorted(batched.stdout.splitlines()) == sorted(whole) and whole, extra
    assert len(whole) == 3
    bad = run_cli(url, "sow", "-t", topic_name, "--batch-size", "4", "--format", "table",
                  check=False)
    err = bad.stderr.decode().strip().splitlines()
    assert bad.returncode == 2 and "does not go with --format table" in err[-1], err


def test_sow_and_subscribe_in_batches_replaces_a_copy_left_at_its_name(sow, topic_name,
                                                                      monkeypatch):
    """A copy tried again after a reply lost in a disconnection finds the first try's copy at
    its name (COPY ... REPLACE): here a stale hash of other records stands there, and the
    query part still gives exactly the partition's records."""
    import uuid

    from sow_redis import keys

    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 1\n')
    sow.publish(topic_name, [{"id": i} for i in range(50)], wait=True)
    token = uuid.UUID(int=7)
    monkeypatch.setattr("sow_redis.feed.snapshot.uuid.uuid4", lambda: token)
    sow.r.hset(keys.snapshot(topic_name, 0, token.hex), mapping={"stale": "0:0:0-1\n{}"})
    with sow.sow_and_subscribe(topic_name, batch_size=8) as sub:
        msgs = _query_part(sub)
    assert [m["kind"] for m in msgs] == ["sow"] * 50 + ["group_end"]
    assert sorted(m["data"]["id"] for m in msgs[:-1]) == list(range(50))


def test_sow_and_subscribe_in_batches_leaves_out_due_records(sow, topic_name):
    """On a topic with expiration, a batched query part leaves out the records already due
    (the expirer has not removed them: none runs here), as the query part read whole does."""
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 2\n'
                     'expiration = "enabled"\n')
    sow.publish(topic_name, [{"id": i} for i in range(600)], wait=True)  # hash tables
    sow.publish(topic_name, [{"id": 1000 + i} for i in range(40)], expiration=0.05, wait=True)
    time.sleep(0.2)
    for batch_size in (7, None):
        with sow.sow_and_subscribe(topic_name, batch_size=batch_size) as sub:
            msgs = _query_part(sub)
        assert sorted(m["data"]["id"] for m in msgs[:-1]) == list(range(600)), batch_size
        assert msgs[-1]["kind"] == "group_end" and msgs[-1]["count"] == 600
