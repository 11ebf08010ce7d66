"""Subscriptions (issue 10): plain subscribe, out-of-focus notices, sow_and_subscribe under
concurrent publishing, bookmark replay, the change feed's retention, recovery of lost blocks,
and the SOW-backed bookmark store of seeds/002."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import orjson
import pytest
from conftest import ROOT, cli_env, client, command_calls, run_cli, start_worker

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.errors import BookmarkError
from sow_redis.feed.bookmark import Bookmark
from sow_redis.feed.bookmark_store import STORE_TOPIC, list_bookmarks
from sow_redis.feed.changes import current_seqs
from sow_redis.feed.live import ShardListener, topic_subscribers


def _topic(sow, name, extra="", partitions=2):
    sow.apply_config(f'[[topic]]\nname = "{name}"\nkey = ["/k"]\npartitions = {partitions}\n'
                     f"{extra}")
    return sow.topic(name)


def _drain(sub, idle=0.3):
    out = []
    while (m := sub.get(timeout=idle)) is not None:
        out.append(m)
    return out


# -- semantics --------------------------------------------------------------------------------
def test_plain_subscription_gets_publishes_only_and_oof_gets_each_reason(sow, topic_name):
    t = _topic(sow, topic_name, 'expiration = "enabled"\n')
    sow.publish(t.name, [{"k": 2, "px": 60}, {"k": 3, "px": 70}])
    with sow.subscribe(t.name, "/px > 10") as plain, \
            sow.subscribe(t.name, "/px > 10", oof=True) as oof:
        sow.publish(t.name, {"k": 1, "px": 50})
        sow.delta_publish(t.name, {"k": 1, "px": 5})  # no longer matches: match
        sow.sow_delete(t.name, filter="/k = 2")  # deleted
        sow.publish(t.name, {"k": 3, "px": 71}, expiration=0.05)
        sow.publish(t.name, {"k": 4, "px": 1})  # never matches: nothing
        time.sleep(0.1)
        sow.publish(t.name, {"k": 3, "px": 72})  # k=3 was due: expired first, then published
        got_plain, got_oof = _drain(plain), _drain(oof)
    # events are ordered per partition (two partitions here; on a cluster their events come
    # from two nodes): compare each record's events in turn
    got_plain.sort(key=lambda m: m["data"]["k"])
    got_oof.sort(key=lambda m: m["data"]["k"])
    print("plain:", [(m["kind"], m["data"]) for m in got_plain])
    print("oof:", [(m["kind"], m.get("reason"), m["data"]) for m in got_oof])
    assert [(m["kind"], m["data"]) for m in got_plain] == [
        ("publish", {"k": 1, "px": 50}), ("publish", {"k": 3, "px": 71}),
        ("publish", {"k": 3, "px": 72})]
    assert [(m["kind"], m.get("reason"), m["data"]) for m in got_oof] == [
        ("publish", None, {"k": 1, "px": 50}), ("oof", "match", {"k": 1, "px": 5}),
        ("oof", "deleted", {"k": 2, "px": 60}),
        ("publish", None, {"k": 3, "px": 71}), ("oof", "expired", {"k": 3, "px": 71}),
        ("publish", None, {"k": 3, "px": 72})]
    assert all(m["bookmark"] and m["sow_key"] for m in got_oof)


def test_without_bookmarks_the_same_messages_carry_none(sow, topic_name):
    """``bookmarks=False`` (the deriver's subscriptions): the same live messages, in the same
    order, without a ``bookmark`` each; the subscriber's own position still moves."""
    from sow_redis.feed.subscriber import Subscriber

    t = _topic(sow, topic_name)
    sow.publish(t.name, {"k": 1, "px": 50})
    subs = [Subscriber(sow.r, t, filter="/px > 10", oof=True, bookmarks=b) for b in (True, False)]
    try:
        sow.publish(t.name, [{"k": 2, "px": 60}, {"k": 3, "px": 70}])
        sow.delta_publish(t.name, {"k": 2, "px": 5})
        sow.sow_delete(t.name, filter="/k = 3")
        with_bm, without = (_drain(sub) for sub in subs)
        assert len(with_bm) == 4 and all(m["bookmark"] for m in with_bm)
        assert not any("bookmark" in m for m in without)
        assert [{k: v for k, v in m.items() if k != "bookmark"} for m in with_bm] == without
        assert subs[0].bookmark == subs[1].bookmark != str(Bookmark.epoch(2))
    finally:
        for sub in subs:
            sub.close()


def test_oof_for_a_removed_record_never_received_before(sow, topic_name):
    t = _topic(sow, topic_name)
    sow.publish(t.name, {"k": 1, "px": 50})
    with sow.subscribe(t.name, "/px > 10", oof=True) as sub:
        sow.sow_delete(t.name, filter="/k = 1")
        got = _drain(sub)
    assert [(m["kind"], m["reason"], m["data"]) for m in got] == [
        ("oof", "deleted", {"k": 1, "px": 50})]


def test_sow_and_subscribe_query_then_group_end_then_live(sow, topic_name):
    t = _topic(sow, topic_name)
    sow.publish(t.name, [{"k": i, "px": i * 10} for i in range(6)])
    with sow.sow_and_subscribe(t.name, "/px >= 20", top_n=3, order_by="/px DESC",
                               oof=True) as sub:
        head = [sub.get(1) for _ in range(4)]
        sow.publish(t.name, {"k": 9, "px": 90})
        sow.delta_publish(t.name, {"k": 5, "px": 0})
        live = _drain(sub)
    assert [(m["kind"], m.get("data", {}).get("k")) for m in head] == [
        ("sow", 5), ("sow", 4), ("sow", 3), ("group_end", None)]
    assert head[-1]["count"] == 3
    # k 9 and k 5 may lie in two partitions: on a cluster their events come from two nodes,
    # in either order (only per-partition order is promised)
    assert sorted((m["kind"], m.get("reason") or "", m["data"]["k"]) for m in live) == [
        ("oof", "match", 5), ("publish", "", 9)]
    with sow.sow_and_subscribe(t.name, "/px > 1000") as empty:
        assert [m["kind"] for m in _drain(empty)] == ["group_end"]


def test_bookmark_replay_across_a_restart_then_live(sow, topic_name):
    t = _topic(sow, topic_name, partitions=3)
    sow.publish(t.name, [{"k": i, "v": 1} for i in range(10)])
    with sow.subscribe(t.name, bookmark="EPOCH") as sub:
        first = _drain(sub)
        mark = sub.bookmark
    assert [m["kind"] for m in first] == ["publish"] * 10 + ["completed"]
    assert first[-1]["bookmark"] == mark
    sow.publish(t.name, [{"k": i, "v": 2} for i in range(5)])  # while no subscriber runs
    with sow.subscribe(t.name, bookmark=mark) as again:
        replay = _drain(again)
        sow.publish(t.name, {"k": 0, "v": 3})
        live = _drain(again)
    assert [(m["kind"], m.get("data", {}).get("v")) for m in replay] == (
        [("publish", 2)] * 5 + [("completed", None)])
    assert sorted(m["data"]["k"] for m in replay[:-1]) == [0, 1, 2, 3, 4]
    assert [(m["kind"], m["data"]) for m in live] == [("publish", {"k": 0, "v": 3})]
    with sow.subscribe(t.name, bookmark="NOW") as now:
        assert [m["kind"] for m in _drain(now)] == ["completed"]


def test_a_replay_from_a_bookmark_is_read_as_it_is_taken(url, plane, topic_name):
    """A subscription from a bookmark 5,000 changes behind (500 change blocks) reads the
    change feed as its messages are taken, about 1,000 ahead (``REPLAY_STEP``): Redis's
    command statistics show at most 3 ``XRANGE`` calls for the first message (2 pages of 64
    blocks, and the bookmark's resolving), 6 more for the rest of the feed; the messages are every change once, in order, then
    ``completed``, then live."""
    from sow_redis.feed.subscriber import REPLAY_STEP

    if plane == "cluster":
        pytest.skip("the command statistics of one server: on the server plane")
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, partitions=1)
    for chunk in range(500):  # one change block per publish of 10
        sow.publish(t.name, [{"k": chunk * 10 + i, "v": 1} for i in range(10)])

    def xranges() -> int:
        return command_calls(sow.r, "xrange")["xrange"]

    before = xranges()
    with sow.subscribe(t.name, bookmark="EPOCH") as sub:
        first = sub.get(5)
        assert first is not None and first["seq"] == 1
        early = xranges() - before
        got = [first]
        while got[-1]["kind"] != "completed":
            got.append(sub.get(5))
        late = xranges() - before
        sow.publish(t.name, {"k": 0, "v": 2})
        live = sub.get(5)
    print(f"XRANGE calls: {early} for the first message, {late} for all 5,000")
    assert REPLAY_STEP == 1000 and early <= 3 and late - early >= 6
    assert [m["seq"] for m in got[:-1]] == list(range(1, 5001))
    assert live is not None and (live["seq"], live["data"]) == (5001, {"k": 0, "v": 2})


def test_a_page_of_the_change_feed_holds_about_1000_changes_whatever_its_blocks(
        url, topic_name):
    """The feed is read a page at a time of the blocks that start within the next 1,000
    changes (``PAGE_CHANGES``; a block's stream id is its first seq): 20 blocks of 1,000
    changes take one block per ``XRANGE`` (the 19 after the first in one before), and
    the changes 2,501 … 4,000 read the two blocks holding them and no later one (17 more
    before)."""
    from sow_redis.feed.changes import PAGE_CHANGES, blocks_after

    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, partitions=1)
    for c in range(20):  # one change block per publish of 1,000
        sow.publish(t.name, [{"k": c * 1000 + i, "v": 1} for i in range(1000)])
    pages: list[list[int]] = []
    xrange = sow.r.xrange

    def spy(*args, **kwargs):
        got = xrange(*args, **kwargs)
        pages.append([int(sid.split(b"-")[0]) for sid, _fields in got])
        return got

    sow.r.xrange = spy
    blocks = list(blocks_after(sow.r, t, 0, 0, 20_000))
    assert [(b["first"], b["last"]) for b in blocks] == [
        (1 + 1000 * i, 1000 * (i + 1)) for i in range(20)]
    print(f"blocks per XRANGE: {[len(page) for page in pages]}")
    # the first block comes by XREVRANGE (the one holding change 1), each other by an XRANGE
    assert PAGE_CHANGES == 1000 and len(pages) == 19 and all(len(pg) == 1 for pg in pages)
    pages.clear()
    blocks = list(blocks_after(sow.r, t, 0, 2500, 4000))
    assert [b["first"] for b in blocks] == [2001, 3001] and pages == [[3001]]


def test_bookmarks_sort_and_bad_or_trimmed_bookmarks_are_one_line_errors(url, topic_name):
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, "change_retention = { count = 20 }\n", partitions=1)
    for i in range(100):
        sow.publish(t.name, {"k": i % 7, "v": i})
    a, b = Bookmark((3, 250)), Bookmark((12, 250))
    assert str(a) < str(b) and b.covers(a) and Bookmark.parse(str(b), 2) == b
    with pytest.raises(BookmarkError, match="not a bookmark"):
        sow.subscribe(t.name, bookmark="yesterday-ish,x")
    with pytest.raises(BookmarkError, match="has 2 positions"):
        sow.subscribe(t.name, bookmark=str(a))
    with pytest.raises(BookmarkError, match="oldest retained change is seq"):
        sow.subscribe(t.name, bookmark=str(Bookmark((1,))))
    retained = len(sow.r.xrange(keys.changes(t.name, 0)))
    times = [int(x) for x in sow.r.zrange(keys.change_times(t.name, 0), 0, -1)]
    print(f"100 changes, count retention 20: {retained} blocks retained, "
          f"{len(times)} in the time index")
    assert retained <= 40
    # the time index follows the count trim every 64 changes (FEED_UPKEEP_EVERY in
    # remove_record.lua): at seq 64 it dropped the blocks below 64 - 20 + 1
    assert max(times) == 100 and 45 <= min(times) <= 81 and len(times) == len(set(times))
    out = run_cli(url, "subscribe", "-t", t.name, "--bookmark", "000000000001", check=False)
    assert out.returncode == 1 and out.stderr.count(b"\n") == 1, out.stderr
    assert b"older than the change feed" in out.stderr


def test_change_retention_zero_publishes_without_a_feed(url, topic_name):
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, "change_retention = 0\n", partitions=1)
    with sow.subscribe(t.name) as sub:
        sow.publish(t.name, [{"k": 1}, {"k": 2}])
        got = _drain(sub)
    assert [m["data"]["k"] for m in got] == [1, 2]
    assert sow.r.exists(keys.changes(t.name, 0)) == 0


def test_a_time_bookmark_starts_at_the_first_change_after_it(url, topic_name):
    import datetime as dt

    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, partitions=1)
    sow.publish(t.name, {"k": 1, "v": "before"})
    time.sleep(0.05)
    when = dt.datetime.now(dt.UTC).isoformat()
    time.sleep(0.05)
    sow.publish(t.name, {"k": 1, "v": "after"})
    with sow.subscribe(t.name, bookmark=when) as sub:
        got = _drain(sub)
    assert [(m["kind"], m.get("data")) for m in got] == [
        ("publish", {"k": 1, "v": "after"}), ("completed", None)]


# -- recovery ---------------------------------------------------------------------------------
def test_a_lost_block_is_read_from_the_change_feed(url, topic_name):
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, partitions=1)
    reports = []
    with sow.subscribe(t.name, report=reports.append) as sub:
        sow.publish(t.name, {"k": 1, "v": 1})
        assert sub.get(2)["data"] == {"k": 1, "v": 1}
        sub._live.close()  # lose what is published now
        sow.publish(t.name, [{"k": 2, "v": 1}, {"k": 3, "v": 1}])
        sub._live = ShardListener(sow.r, [keys.partition_channel(t.name, 0)])
        sow.publish(t.name, {"k": 4, "v": 1})
        got = _drain(sub)
    assert [(m["kind"], m.get("data", {}).get("k")) for m in got] == [
        ("publish", 2), ("publish", 3), ("recovery", None), ("publish", 4)]
    assert (got[2]["after"], got[2]["to"]) == (1, 3)
    assert reports and reports[0]["how"] == "feed" and reports[0]["cause"] == "gap"


def test_a_large_gap_is_recovered_from_the_feed_as_it_is_taken(url, plane, topic_name):
    """A gap of 5,000 changes (500 change blocks lost while the subscriber was not
    listening) is read from the change feed as its messages are taken, about 1,000 ahead
    (``REPLAY_STEP``), not into memory at once: Redis's command statistics show at most 2
    ``XRANGE`` calls (pages of 64 blocks) for the first message, 5 more for the rest; the
    messages are every lost change once, in order, the ``recovery``, the block that showed
    the gap, then live."""
    if plane == "cluster":
        pytest.skip("the command statistics of one server: on the server plane")
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, partitions=1)
    with sow.subscribe(t.name) as sub:
        sow.publish(t.name, {"k": -1, "v": 0})
        assert sub.get(2)["seq"] == 1
        sub._live.close()  # lose what is published now
        for chunk in range(500):  # one change block per publish of 10
            sow.publish(t.name, [{"k": chunk * 10 + i, "v": 1} for i in range(10)])
        sub._live = ShardListener(sow.r, [keys.partition_channel(t.name, 0)])
        sow.publish(t.name, {"k": 0, "v": 2})  # seq 5,002: shows the gap
        before = command_calls(sow.r, "xrange")["xrange"]
        got = [sub.get(5)]
        early = command_calls(sow.r, "xrange")["xrange"] - before
        while got[-1] is not None and got[-1].get("seq") != 5002:
            got.append(sub.get(5))
        late = command_calls(sow.r, "xrange")["xrange"] - before
        sow.publish(t.name, {"k": 1, "v": 3})
        live = sub.get(5)
    print(f"XRANGE calls: {early} for the first message, {late} for all 5,000")
    assert early <= 2 and late - early >= 5
    kinds = [m["kind"] for m in got]
    assert kinds == ["publish"] * 5000 + ["recovery", "publish"]
    assert [m["seq"] for m in got[:5000]] == list(range(2, 5002))
    assert (got[5000]["cause"], got[5000]["how"], got[5000]["after"], got[5000]["to"]) == (
        "gap", "feed", 1, 5001)
    assert got[5001]["data"] == {"k": 0, "v": 2}
    assert live is not None and (live["seq"], live["data"]) == (5003, {"k": 1, "v": 3})


def _subscribers(r, t):
    return topic_subscribers(r, [t.name])[t.name]


SUBSCRIBER = textwrap.dedent("""
    import sys, orjson
    from sow_redis.client import Sow
    topic, out_path = sys.argv[1], sys.argv[2]
    sow = Sow()
    with open(out_path, "wb") as out, sow.subscribe(topic) as sub:
        print("ready", flush=True)
        while (m := sub.get(timeout=float(sys.argv[3]))) is not None:
            out.write(orjson.dumps(m) + b"\\n")
            out.flush()
""")


@pytest.mark.faults  # Redis drops the subscriber
@pytest.mark.parametrize("retention", ["", "change_retention = { count = 50 }\n"])
def test_a_subscriber_dropped_for_its_output_buffer_recovers(lonely_url, tmp_path, topic_name,
                                                             retention, plane):
    """SIGSTOP a subscriber until Redis drops it (client-output-buffer-limit pubsub), resume
    it: every change reaches it (from the change feed, or, when the gap is older than the
    retained feed, by re-reading the records)."""
    r = client(lonely_url)
    every = {"target_nodes": "all"} if plane == "cluster" else {}  # a cluster: each node
    r.config_set("client-output-buffer-limit", "pubsub 32kb 16kb 1", **every)
    sow = Sow(lonely_url, inline=True)
    t = _topic(sow, topic_name, retention, partitions=2)
    out = tmp_path / "events.jsonl"
    # (retention: the gap is older than the 50 changes the feed keeps)
    proc = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, t.name, str(out), "3"],
                            env=cli_env(lonely_url), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        proc.send_signal(signal.SIGSTOP)
        n = 0
        # publish until Redis drops the paused subscriber (the socket buffers of the kernel
        # take several MB first), then some more
        while _subscribers(r, t) and n < 100_000:
            batch = [{"k": (n + i) % 300, "v": n + i, "pad": "x" * 1000} for i in range(200)]
            sow.publish(t.name, batch)
            n += 200
        # then more changes per partition than a count retention keeps (it counts changes,
        # in whole blocks: the gap leaves the feed only when later blocks hold the count)
        for j in range(30 if retention else 1):
            sow.publish(t.name, [{"k": i, "v": -1 - j} for i in range(10)])
            n += 10
        subs = _subscribers(r, t)
        proc.send_signal(signal.SIGCONT)
        out_, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        r.config_set("client-output-buffer-limit", "pubsub 32mb 8mb 60", **every)
    msgs = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    recoveries = [m for m in msgs if m["kind"] == "recovery"]
    view = {}
    for m in msgs:
        if m["kind"] == "publish":
            view[m["sow_key"]] = m["data"]
    sow_now = {rec.sow_key: rec.obj() for rec in sow.sow(t.name)}
    seen = [m["seq"] for m in msgs if m["kind"] == "publish"]
    print(f"published {n}; subscriber dropped by Redis (still subscribed: {subs}); "
          f"{len(msgs)} messages, recoveries {[(m['how'], m['cause']) for m in recoveries]}; "
          f"stderr: {err.decode().strip()[:200]}")
    assert subs == 0, "Redis did not drop the paused subscriber"
    assert recoveries, "no recovery reported"
    assert view == sow_now
    if retention:
        assert any(m["how"] == "requery" for m in recoveries)
    else:
        assert all(m["how"] == "feed" for m in recoveries)
        per_part = {}
        for m in msgs:
            if m["kind"] == "publish":
                per_part.setdefault(m["partition"], []).append(m["seq"])
        assert all(s == list(range(s[0], s[0] + len(s))) for s in per_part.values()), \
            "a change was lost or seen twice"
        assert len(seen) == n


# -- sow_and_subscribe under concurrent publishing -------------------------------------------
PUBLISHER = textwrap.dedent("""
    import random, sys
    from sow_redis.client import Sow
    from sow_redis.publish.append import append
    topic, n, nkeys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sow = Sow()
    t = sow.topic(topic)
    rng = random.Random(11)
    def items():
        for i in range(n):
            k = rng.randrange(nkeys)
            x = rng.random()
            if x < 0.6:
                yield ("publish", {"k": k, "v": i, "side": "buy" if i % 2 else "sell"}, None)
            elif x < 0.9:
                yield ("delta_publish", {"k": k, "d": i}, None)
            else:
                yield ("sow_delete", {"k": k}, None)
    res = append(sow.r, t, items(), jobs=sow.settings)
    assert res.published == n, res.rejected[:3]
    sow.handoff(t, res.last_ids, wait=True, timeout=300)
    print("done", flush=True)
""")


@pytest.mark.slow
def test_sow_and_subscribe_while_another_process_publishes(url, topic_name):
    """100,000 publishes, delta_publishes and sow_deletes over 1,000 keys from another process
    while sow_and_subscribe runs: its final view equals the SOW; no change is seen twice or
    out of order for a key."""
    n, nkeys = 100_000, 1_000
    sow = Sow(url)
    t = _topic(sow, topic_name, partitions=4)
    workers = [start_worker(url), start_worker(url)]
    pub = subprocess.Popen([sys.executable, "-c", PUBLISHER, t.name, str(n), str(nkeys)],
                           env=cli_env(url), stdout=subprocess.PIPE, cwd=ROOT)
    view: dict[str, dict] = {}
    last_seq: dict[str, int] = {}
    twice = out_of_order = 0
    counts: dict[str, int] = {}
    try:
        time.sleep(0.3)  # the publisher is running
        with sow.sow_and_subscribe(t.name, oof=True) as sub:
            done_at = None
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                m = sub.get(timeout=0.5)
                if m is None:
                    if done_at is None and pub.poll() is not None:
                        done_at = time.monotonic()
                    if done_at is not None and Bookmark(tuple(sub.pos)).covers(
                            Bookmark(tuple(current_seqs(sow.r, t)))):
                        break
                    continue
                kind = m["kind"]
                counts[kind] = counts.get(kind, 0) + 1
                if kind in ("sow", "publish", "oof"):
                    key = m["sow_key"]
                    if key in last_seq and m["seq"] <= last_seq[key]:
                        if m["seq"] == last_seq[key]:
                            twice += 1
                        else:
                            out_of_order += 1
                    last_seq[key] = m["seq"]
                    if kind == "oof":
                        view.pop(key, None)
                    else:
                        view[key] = m["data"]
        assert pub.wait(timeout=240) == 0
    finally:
        for p in (pub, *workers):
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)
    sow_now = {rec.sow_key: rec.obj() for rec in sow.sow(t.name)}
    print(f"{n} changes over {nkeys} keys; subscriber messages {counts}; view {len(view)} "
          f"records, SOW {len(sow_now)}; seen twice {twice}, out of order {out_of_order}")
    assert counts.get("group_end") == 1
    assert twice == 0 and out_of_order == 0
    assert view == sow_now


# -- the bookmark store (seeds/002) ---------------------------------------------------------
def test_bookmark_store_persists_every_n_flushes_on_close_and_resumes_after_the_last(
        url, topic_name):
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, partitions=2)
    sow.publish(t.name, [{"k": i, "v": 0} for i in range(25)])
    client = f"c{topic_name}"
    with sow.subscribe(t.name, client_name=client, sub_id="s1", persist_every=10) as sub:
        got = [sub.get(1) for _ in range(13)]  # 12 processed (the 13th is in hand)
        time.sleep(0.3)  # the background writer
        stored = list_bookmarks(sow.r, client, "s1")
        assert len(stored) == 1 and stored[0]["persisted"] == "true"
        mid = Bookmark.parse(stored[0]["bookmark"], 2)
        # written after the 10th processed message, by a background thread that writes the
        # most recent bookmark of that moment
        assert 10 <= sum(mid.seqs) <= 12
    # closing processed the 13th and flushed
    final = Bookmark.parse(list_bookmarks(sow.r, client, "s1")[0]["bookmark"], 2)
    assert sum(final.seqs) == 13
    rest_expected = {m["data"]["k"] for m in got}
    with sow.subscribe(t.name, client_name=client, sub_id="s1") as again:
        rest = _drain(again)
    assert [m["kind"] for m in rest] == ["publish"] * 12 + ["completed"]
    keys_seen = {m["data"]["k"] for m in rest[:-1]}
    assert keys_seen.isdisjoint(rest_expected) and len(keys_seen | rest_expected) == 25
    record = sow.sow(STORE_TOPIC, f"/clientName = '{client}'")[0].obj()
    assert set(record) == {"clientName", "subId", "bookmark", "persisted"}


def test_bookmark_store_out_of_order_processing_keeps_the_oldest_in_process(url, topic_name):
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, partitions=1)
    sow.publish(t.name, [{"k": i} for i in range(5)])
    client = f"c{topic_name}"
    with sow.subscribe(t.name, client_name=client, sub_id="s", auto_processed=False,
                       persist_every=1) as sub:
        msgs = [sub.get(1) for _ in range(5)]
        for i in (0, 2, 3):  # handler threads finish 0, 2, 3; 1 and 4 still running
            sub.processed(msgs[i])
        time.sleep(0.3)
        assert Bookmark.parse(list_bookmarks(sow.r, client, "s")[0]["bookmark"], 1).seqs == (
            msgs[0]["seq"],)
        sub.processed(msgs[1])
        time.sleep(0.3)
        assert Bookmark.parse(list_bookmarks(sow.r, client, "s")[0]["bookmark"], 1).seqs == (
            msgs[3]["seq"],)


KILLED = textwrap.dedent("""
    import sys, time, orjson
    from sow_redis.client import Sow
    topic, client, every, delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    with Sow(inline=True).subscribe(topic, client_name=client, sub_id="s",
                                    persist_every=every) as sub:
        while (m := sub.get(timeout=2)) is not None:
            if m["kind"] == "publish":
                time.sleep(delay)  # the work of the handler
                sys.stdout.write(orjson.dumps(m["data"]).decode() + "\\n")
                sys.stdout.flush()
""")


@pytest.mark.faults  # the subscriber is killed (-9)
def test_kill_9_between_persists_misses_nothing(url, topic_name):
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, partitions=2)
    sow.publish(t.name, [{"k": i} for i in range(200)])
    client = f"c{topic_name}"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, t.name, client, "7", "0.005"],
                            env=cli_env(url), stdout=subprocess.PIPE, cwd=ROOT)
    first = []
    while len(first) < 53:
        first.append(orjson.loads(proc.stdout.readline()))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first += [orjson.loads(line) for line in proc.stdout.read().splitlines()]
    proc2 = subprocess.run([sys.executable, "-c", KILLED, t.name, client, "7", "0"],
                           env=cli_env(url), capture_output=True, cwd=ROOT, timeout=60)
    second = [orjson.loads(line) for line in proc2.stdout.splitlines()]
    seen = {d["k"] for d in first} | {d["k"] for d in second}
    again = len(first) + len(second) - len(seen)
    print(f"first run printed {len(first)} then kill -9; the second printed {len(second)}; "
          f"distinct {len(seen)} of 200, seen again {again}")
    assert seen == set(range(200))
    assert again <= 7 * 2 + 2  # at most what followed the last persisted bookmark


def test_cli_subscribe_with_the_bookmark_store_and_bookmarks_command(url, topic_name):
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, partitions=1)
    sow.publish(t.name, [{"k": i} for i in range(5)])
    out = run_cli(url, "subscribe", "-t", t.name, "--client-name", "cli", "--sub-id",
                  topic_name, "--count", "3", "--timeout", "5")
    assert [orjson.loads(x)["data"]["k"] for x in out.stdout.splitlines()] == [0, 1, 2]
    rec = orjson.loads(run_cli(url, "bookmarks", "--client-name", "cli", "--sub-id",
                               topic_name).stdout)
    assert rec["subId"] == topic_name and Bookmark.parse(rec["bookmark"], 1).seqs == (3,)
    out = run_cli(url, "subscribe", "-t", t.name, "--client-name", "cli", "--sub-id",
                  topic_name, "--timeout", "1")
    assert [orjson.loads(x).get("data", {}).get("k") for x in out.stdout.splitlines()] == [
        3, 4, None]


# -- statistics (issue 13 item 2: counters kept by the Lua scripts) -------------------------
def test_stats_figures_of_a_known_workload(url, topic_name):
    from sow_redis.expirer import Expirer

    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, 'expiration = "enabled"\nhash_index = [["/g"]]\n', 2)
    sow.publish(t.name, [{"k": i, "g": "a"} for i in range(10)])  # 10 inserts
    sow.publish(t.name, [{"k": i, "g": "b"} for i in range(4)])  # 4 updates
    sow.delta_publish(t.name, {"k": 5, "x": 1})  # 1 update
    sow.sow_delete(t.name, filter="/k IN (8, 9)")  # 2 deletes
    sow.publish(t.name, [{"k": 20 + i} for i in range(3)], expiration=0.05)  # 3 inserts
    time.sleep(0.1)
    Expirer(sow.r, topics=[t.name]).loop()  # 3 expiries
    for _ in range(4):
        sow.sow(t.name, "/g = 'a'")
    with sow.subscribe(t.name):
        out = run_cli(url, "stats", "--json", "--interval", "0.1", "-t", t.name)
    (st,) = [orjson.loads(x) for x in out.stdout.splitlines()]
    print(st)
    assert st["counters"] == {"inserts": 13, "updates": 5, "deletes": 2, "expiries": 3,
                              "queries": 4}
    assert st["records"] == 8 and st["partitions"] == 2 and st["lag"] == 0
    assert st["subscribers"] == 1 and st["errors"] == 0 and st["with_expiry"] == 0
    assert st["change_feed_blocks"] >= 2 and set(st["per_second"]) == set(st["counters"])
    sow.r.xadd(keys.log(t.name, 0), {"cmd": "publish", "data": b'{"k": 99}'})
    time.sleep(0.05)
    (st,) = [orjson.loads(x) for x in run_cli(url, "stats", "--json", "--interval", "0.1",
                                              "-t", t.name).stdout.splitlines()]
    assert st["lag"] == 1 and st["lag_age_ms"] >= 50
    table = run_cli(url, "stats", "--interval", "0.1", "-t", t.name).stdout.decode()
    assert t.name in table and "ins/s" in table


def test_a_feed_left_ahead_of_the_partition_sequence_is_started_anew(url, topic_name):
    """A change feed whose ids are above the partition's sequence (a partition re-created
    under an old feed) never stops the apply: the feed starts anew."""
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, partitions=1)
    sow.r.xadd(keys.changes(t.name, 0), {"block": b"stale"}, id="1000-0")
    sow.publish(t.name, [{"k": 1}, {"k": 2}])
    assert sorted(r.obj()["k"] for r in sow.sow(t.name)) == [1, 2]
    ids = [sid for sid, _f in sow.r.xrange(keys.changes(t.name, 0))]
    assert ids == [b"1-0"] and sow.errors(t.name) == []


@pytest.mark.serial  # 70 publishes within the 1 s retention: bound to wall-clock time
def test_the_change_feed_is_trimmed_by_age(url, topic_name):
    """``change_retention`` as a duration: blocks older than it leave the feed and its time
    index (checked every 64 changes of a partition: FEED_UPKEEP_EVERY in remove_record.lua)."""
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name, 'change_retention = "1s"\n', partitions=1)
    for i in range(60):
        sow.publish(t.name, {"k": i % 7, "v": i})
    time.sleep(1.2)
    for i in range(60, 130):  # crosses seq 64 and 128
        sow.publish(t.name, {"k": i % 7, "v": i})
    blocks = sow.r.xrange(keys.changes(t.name, 0))
    times = [int(x) for x in sow.r.zrange(keys.change_times(t.name, 0), 0, -1)]
    print(f"130 changes, age retention 1 s: feed from seq {blocks[0][0]!r}, "
          f"time index from {min(times)}")
    assert blocks[0][0] == b"61-0" and min(times) == 61 and max(times) == 130
    with pytest.raises(BookmarkError, match="oldest retained change is seq"):
        sow.subscribe(t.name, bookmark=str(Bookmark((10,))))


def test_a_channel_the_server_unsubscribed_counts_as_a_lost_connection():
    """When a partition's slot moves (failover, resharding) Redis unsubscribes the listeners
    of its sharded channel (an ``sunsubscribe`` they did not ask for): the listener raises a
    connection error, so the subscriber subscribes again and recovers from the change feed.
    Both read paths: the listener's own (replies parsed by the connection's hiredis reader)
    and redis-py's ``get_message`` (``memory://``)."""
    import hiredis
    from redis.exceptions import ConnectionError as RedisConnectionError

    from sow_redis.feed.live import ChannelMoved, _Replies

    assert issubclass(ChannelMoved, RedisConnectionError)
    replies = _Replies(hiredis.Reader(), sock=None)
    replies.reader.feed(b"*3\r\n$10\r\nssubscribe\r\n$1\r\nc\r\n:1\r\n"
                        b"*3\r\n$8\r\nsmessage\r\n$1\r\nc\r\n$2\r\nx1\r\n*3\r\n$8\r\nsmes")
    assert replies.take() == b"x1"  # the confirmation skipped
    assert replies.take() is None  # the next reply is not complete yet
    replies.reader.feed(b"sage\r\n$1\r\nc\r\n$2\r\nx2\r\n"
                        b"*3\r\n$12\r\nsunsubscribe\r\n$1\r\nc\r\n:0\r\n")
    assert replies.take() == b"x2"
    with pytest.raises(ChannelMoved, match="unsubscribed"):
        replies.take()
    with pytest.raises(ChannelMoved, match="unsubscribed"):
        ShardListener._payload({"type": "sunsubscribe", "channel": b"{sow:t:0}:live", "data": 0})
    assert ShardListener._payload({"type": "smessage", "channel": b"c", "data": b"x"}) == b"x"
    assert ShardListener._payload({"type": "ssubscribe", "channel": b"c", "data": 1}) is None


def test_a_listener_whose_connection_is_killed_raises_a_connection_error(url):
    """A killed pub/sub connection (``CLIENT KILL``, a server restart) reaches the listener's
    caller as a connection error, which the subscriber answers by subscribing again; and a
    listener keeps its client alive (a collected client closes its pool's connections)."""
    if url.startswith("memory://"):
        pytest.skip("memory:// has no connections to kill")
    from redis.exceptions import ConnectionError as RedisConnectionError

    from sow_redis.connection import is_cluster

    r = client(url)
    chans = [keys.partition_channel("killed", p) for p in range(3)]
    listener = ShardListener(client(url), chans)  # its client referenced by it only
    import gc

    gc.collect()
    r.spublish(chans[1], b"one")
    assert listener.get(timeout=5) == b"one"
    assert listener._replies is not None  # the listener's own read path
    nodes = [r.get_redis_connection(n) for n in r.get_primaries()] if is_cluster(r) else [r]
    killed = sum(node.client_kill_filter(_type="pubsub") for node in nodes)
    print(f"pub/sub connections killed: {killed}")
    assert killed >= 1
    with pytest.raises(RedisConnectionError):
        for _ in range(50):
            listener.get(timeout=0.1)
    listener.close()


@pytest.mark.parametrize("oof", [True, False])
def test_the_lean_rendering_of_a_subscription_of_all_equals_the_general_one(sow, topic_name,
                                                                          oof):
    """A subscription with no filter, no SOW keys and no delta (the deriver's) renders each
    change by a lean path (``_message_of_all``): on 2,000 random changes (publish,
    delta_publish, removals deleted / expired / without a reason, with and without a
    previous record) it gives the messages of the general path (``_message``), in the same
    key order, and keeps the same out-of-focus view."""
    import random

    from sow_redis.feed.subscriber import Subscriber

    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 2\n')
    lean = Subscriber(sow.r, sow.topic(topic_name), oof=oof, bookmarks=False)
    general = Subscriber(sow.r, sow.topic(topic_name), oof=oof, bookmarks=False)
    try:
        assert lean._render == lean._message_of_all
        rnd = random.Random(4)
        for seq in range(1, 2001):
            p = rnd.randrange(2)
            op = rnd.choice(["publish", "publish", "delta_publish", "sow_delete"])
            ev = {"topic": topic_name, "partition": p, "op": op,
                  "sow_key": str(rnd.randrange(30)), "seq": seq, "id": f"{seq}-0",
                  "expiry_ms": rnd.choice([0, 1_800_000_000_000]),
                  "data": {"id": rnd.randrange(30), "v": rnd.random()}}
            if op == "sow_delete" and rnd.random() < 0.8:
                ev["reason"] = rnd.choice(["deleted", "expired"])
            if op != "sow_delete" and rnd.random() < 0.5:
                ev["previous"] = rnd.choice([None, {"id": 1, "v": 0.5}])
            got, want = lean._message_of_all(p, ev), general._message(p, ev)
            assert got == want and list(got or ()) == list(want or ()), ev
        assert lean._view == general._view
    finally:
        lean.close()
        general.close()
