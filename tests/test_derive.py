"""Views and conflated topics (issue 26.3-4; AMPS View and ConflatedTopic): definitions,
the deriver that keeps them, and what their subscribers see."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest

from sow_redis.client import Sow
from sow_redis.config import parse_topics, to_toml
from sow_redis.derive import Deriver
from sow_redis.errors import ConfigError, DerivedTopicError
from sow_redis.model.aggregate import Aggregation
from conftest import run_cli, wait_until

PROJECTION = ["/sym", "COUNT(/id) AS /orders", "SUM(/qty) AS /qty", "AVG(/px) AS /avg_px",
              "MIN(/px) AS /lo", "MAX(/px) AS /hi"]


def _config(name: str, interval: str = "300ms") -> str:
    quoted = ", ".join(f'"{p}"' for p in PROJECTION)
    return (f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = 4\n'
            f'[[view]]\nname = "{name}_by_sym"\nunderlying = "{name}"\n'
            f'projection = [{quoted}]\ngrouping = ["/sym"]\nfilter = "/qty > 0"\n'
            f'[[conflated_topic]]\nname = "{name}_c"\nunderlying = "{name}"\n'
            f'interval = "{interval}"\n')


class _Running:
    """A deriver in a thread for the length of a with block."""

    def __init__(self, sow: Sow) -> None:
        self.deriver = Deriver(sow)
        self.thread = threading.Thread(target=self.deriver.run, daemon=True)

    def __enter__(self) -> Deriver:
        self.thread.start()
        return self.deriver

    def __exit__(self, *exc: object) -> None:
        self.deriver.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


def _rows(sow: Sow, name: str) -> dict:
    return {rec.sow_key: rec.obj() for rec in sow.sow(name)}


def _recomputed(sow: Sow, name: str) -> dict:
    agg = Aggregation(PROJECTION, ["/sym"], domain=f"{name}_by_sym")
    for rec in sow.sow(name, "/qty > 0"):
        agg.upsert(rec.sow_key, rec.obj())
    return dict(agg.rows())


def test_definitions_parse_check_and_round_trip():
    topics = parse_topics(_config("o"))
    assert [(t.name, t.kind, t.underlying) for t in topics] == [
        ("o", "topic", ""), ("o_by_sym", "view", "o"), ("o_c", "conflated_topic", "o")]
    assert topics[2].interval_ms == 300 and topics[1].grouping == ("/sym",)
    assert parse_topics(to_toml(topics)) == topics
    with pytest.raises(ConfigError) as info:
        parse_topics('[[conflated_topic]]\nname = "c"\nunderlying = "o"\ninterval = "1ms"\n'
                     '[[view]]\nname = "v"\nunderlying = "o"\nprojection = ["/px"]\n'
                     'grouping = ["/sym"]\n')
    assert info.value.problems == [
        "<config>: view #1 'v': projection item '/px' is not an aggregate and not a grouping "
        "field",
        "<config>: conflated_topic #1 'c': 'interval' must be at least 10 ms",
    ]


def test_join_definitions():
    with pytest.raises(ConfigError) as info:
        parse_topics('[[view]]\nname = "v"\nunderlying = ["a", "b"]\n'
                     'projection = ["COUNT(/a/id) AS /n"]\ngrouping = ["/a/sym"]\n'
                     '[[view]]\nname = "w"\nunderlying = "a"\njoin = "/id"\n'
                     'projection = ["COUNT(/id) AS /n"]\ngrouping = ["/sym"]\n')
    assert info.value.problems == [
        "<config>: view #1 'v': a view of two topics needs 'join': the field path they are "
        'joined on, like "/id"',
        "<config>: view #2 'w': 'join' needs two underlying topics"]
    (v,) = parse_topics('[[view]]\nname = "v"\nunderlying = ["a", "b"]\njoin = "/id"\n'
                        'projection = ["COUNT(/a/id) AS /n"]\ngrouping = ["/a/sym"]\n')
    assert (v.underlying, v.joined, v.join) == ("a", "b", ("/id", "/id"))


def test_the_registry_checks_underlying_and_filter(url, topic_name, plane):
    if plane == "cluster":
        pytest.skip("a registry check: on the server plane")
    sow = Sow(url)
    with pytest.raises(ConfigError) as info:
        sow.apply_config(f'[[view]]\nname = "{topic_name}_v"\nunderlying = "{topic_name}"\n'
                         'projection = ["COUNT(/id) AS /n"]\ngrouping = ["/sym"]\n'
                         'filter = "/px >"\n')
    lines = info.value.problems
    assert len(lines) == 2 and "neither in this file nor in the registry" in lines[0]
    assert "'filter'" in lines[1]


def test_publishers_cannot_write_to_derived_topics(url, topic_name, plane):
    sow = Sow(url)
    sow.apply_config(_config(topic_name))
    with pytest.raises(DerivedTopicError, match=f"publish to '{topic_name}' instead"):
        sow.publish(f"{topic_name}_by_sym", {"sym": "X"})
    with pytest.raises(DerivedTopicError):
        sow.sow_delete(f"{topic_name}_c", "1=1")
    if plane == "cluster":
        return  # the CLI's one line: on the server plane
    out = run_cli(url, "publish", "-t", f"{topic_name}_c", input=b'{"id": 1}\n', check=False)
    err = out.stderr.decode().strip().splitlines()
    assert out.returncode == 1 and len(err) == 1 and "is a conflated topic of" in err[0], err


@pytest.mark.slow
def test_a_view_equals_a_recompute_after_10000_random_operations(sow, topic_name):
    """10,000 operations on the real server and on the cluster (about 45 s there; 500 on
    memory://, whose Lua runs about five times slower)."""
    sow.apply_config(_config(topic_name))
    count = 500 if sow.url.startswith("memory://") else 10_000
    rng = random.Random(5)

    def order(i: int) -> dict:
        return {"id": i, "sym": rng.choice(["MSFT", "IBM", "ORCL", "SAP", None]),
                "qty": rng.randint(-50, 500), "px": rng.choice([rng.randint(1, 400) / 4, 3])}

    sow.publish(topic_name, [order(i) for i in range(100)])
    started = time.monotonic()
    with _Running(sow):
        for n in range(count):
            i = rng.randrange(300)
            roll = rng.random()
            if roll < 0.5:
                sow.publish(topic_name, order(i))
            elif roll < 0.85:
                sow.delta_publish(topic_name, {"id": i, "qty": rng.randint(-50, 500)})
            elif roll < 0.98:
                sow.sow_delete(topic_name, f"/id = {i}")
            else:
                sow.sow_delete(topic_name, f"/sym = '{rng.choice(['MSFT', 'IBM'])}'")
            if n == count // 2:  # the view is being kept meanwhile
                assert _rows(sow, f"{topic_name}_by_sym")
        wait_until(lambda: _rows(sow, f"{topic_name}_by_sym") == _recomputed(sow, topic_name),
                   30, "the view equal to the recompute")
    view = _rows(sow, f"{topic_name}_by_sym")
    print(f"\n{count} operations in {time.monotonic() - started:.1f} s; view: "
          f"{sorted(((r['sym'], r['orders']) for r in view.values()), key=str)}")
    assert 2 <= len(view) <= 5


def test_a_stop_requested_before_run_stops_the_deriver_at_once(sow, topic_name):
    """The CLI hands its start-up's stop event to the deriver: a SIGTERM between connecting
    and :meth:`Deriver.run` (a test that saw ``--nice`` applied and stopped it at once) stops
    it; the deriver's own event lost it, and the process ran on (2026-11-28)."""
    from sow_redis.stopping import StopEvent

    sow.apply_config(_config(topic_name))
    stop = StopEvent()
    deriver = Deriver(sow, stop=stop)
    stop.request()  # what the signal handler does
    thread = threading.Thread(target=deriver.run, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and deriver.followers == {}


def test_a_settling_deriver_freezes_its_state_and_frees_a_dropped_follower(sow, topic_name,
                                                                          monkeypatch):
    """``Deriver(settle=True)`` (the CLI's): once a view's initial records are in, the objects
    alive (its follower among them) are frozen out of later collections (gc.freeze); when
    the follower is dropped (its definition changed), the next settle frees it with its
    aggregation and subscription, whose reference cycles a frozen heap would keep for good
    (without the unfreeze in settle_heap both stay alive: checked). Only a drop walks the
    whole heap (unfreezes it first); a follower that becomes ready walks what is new."""
    import gc
    import weakref

    import sow_redis.derive as derive
    from sow_redis.derive import settle_heap

    unfreezes = []
    real_unfreeze = gc.unfreeze
    monkeypatch.setattr(derive.gc, "unfreeze", lambda: (unfreezes.append(1), real_unfreeze()))

    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": i, "sym": "AB"[i % 2], "qty": 1, "px": i}
                             for i in range(200)])
    view = f"{topic_name}_by_sym"
    deriver = Deriver(sow, settle=True)
    try:
        def ready() -> bool:
            deriver.loop()
            f = deriver.followers.get(view)
            return f is not None and f.ready

        wait_until(ready, 60, "the view's initial records")
        first = deriver.followers[view]
        assert not any(o is first for o in gc.get_objects())  # frozen, not in a generation
        assert gc.get_freeze_count() > 0 and unfreezes == []  # became ready: not a drop
        sow.publish(topic_name, [{"id": 0, "sym": "C", "qty": 1, "px": 0}])

        def written() -> bool:
            deriver.loop()
            return deriver.followers[view].writer is not None  # still the first follower

        wait_until(written, 60, "the first row written by the follower's writer")
        gone = weakref.ref(first)
        gone_agg, gone_sub = weakref.ref(first.agg), weakref.ref(first.sub)
        del first
        # the view's definition changes: the deriver drops its follower and follows anew
        sow.apply_config(_config(topic_name).replace('filter = "/qty > 0"',
                                                     'filter = "/qty >= 1"'))
        deriver._next_renew = 0.0
        wait_until(lambda: ready() and gone() is gone_agg() is gone_sub() is None, 30,
                   "the dropped follower, its aggregation and subscription freed, the new one "
                   "ready")
        assert unfreezes == [1]  # the drop's settle, and the new follower's did not unfreeze
        wait_until(lambda: _rows(sow, view) == _recomputed(sow, topic_name), 30,
                   "the view equal to the recompute")
        print(f"\nfrozen after the second settle: {gc.get_freeze_count()} objects")
    finally:
        for follower in deriver.followers.values():
            follower.close()
        real_unfreeze()
    settle_heap()  # the helper alone: freezes, and unfreezes what it froze before
    assert gc.get_freeze_count() > 0
    real_unfreeze()
    assert gc.get_freeze_count() == 0


def test_a_restarted_deriver_makes_the_view_whole_again(sow, topic_name):
    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": i, "sym": "A", "qty": 1, "px": i} for i in range(5)])
    with _Running(sow):
        wait_until(lambda: _rows(sow, f"{topic_name}_by_sym") == _recomputed(sow, topic_name),
                   60, "the view built")
    # changes while no deriver runs: a new group, a group gone
    sow.publish(topic_name, [{"id": i, "sym": "B", "qty": 2, "px": 1} for i in range(5)])
    assert [r["sym"] for r in _rows(sow, f"{topic_name}_by_sym").values()] == ["A"]
    with _Running(sow):
        wait_until(lambda: _rows(sow, f"{topic_name}_by_sym") == _recomputed(sow, topic_name),
                   60, "the view whole again")
    assert [r["sym"] for r in _rows(sow, f"{topic_name}_by_sym").values()] == ["B"]


def test_a_view_subscriber_gets_an_oof_when_a_group_disappears(sow, topic_name):
    """A view is subscribable like any topic: a group emptied by a sow_delete, or by its
    last record leaving the view's filter, reaches an --oof subscriber as an oof message of
    the group's row (issue 26.4)."""
    sow.apply_config(_config(topic_name))
    view = f"{topic_name}_by_sym"
    sow.publish(topic_name, [{"id": 1, "sym": "A", "qty": 5, "px": 1},
                             {"id": 2, "sym": "B", "qty": 5, "px": 2},
                             {"id": 3, "sym": "C", "qty": 5, "px": 3}], wait=True)
    with _Running(sow):
        wait_until(lambda: _rows(sow, view) == _recomputed(sow, topic_name), 60,
                   "the view built")
        sub = sow.sow_and_subscribe(view, oof=True)
        try:
            first = [sub.get(timeout=10) for _ in range(4)]
            assert [m["kind"] for m in first] == ["sow"] * 3 + ["group_end"]
            row_key = {m["data"]["sym"]: m["sow_key"] for m in first[:3]}
            assert sow.sow_delete(topic_name, "/id = 2") == 1
            gone = sub.get(timeout=30)
            assert gone is not None and (gone["kind"], gone["reason"], gone["sow_key"]) == (
                "oof", "deleted", row_key["B"]) and gone["data"]["sym"] == "B", gone
            sow.publish(topic_name, {"id": 3, "sym": "C", "qty": 0, "px": 3}, wait=True)
            left = sub.get(timeout=30)  # qty 0: out of the view's filter, group C empty
            assert left is not None and (left["kind"], left["sow_key"]) == (
                "oof", row_key["C"]) and left["data"]["sym"] == "C", left
        finally:
            sub.close()
    assert [r["sym"] for r in _rows(sow, view).values()] == ["A"]


def test_a_conflated_topic_gets_at_most_one_update_per_key_per_interval(sow, topic_name):
    sow.apply_config(_config(topic_name, interval="300ms"))
    conflated = f"{topic_name}_c"
    sow.publish(topic_name, [{"id": 1, "v": 0}, {"id": 2, "v": 0}])
    with _Running(sow):
        wait_until(lambda: len(_rows(sow, conflated)) == 2, 60, "the initial records")
        with sow.subscribe(conflated, oof=True) as sub:
            started = time.monotonic()
            for v in range(1, 61):  # 60 updates of each key in about 1.2 s
                sow.publish(topic_name, [{"id": 1, "v": v}, {"id": 2, "v": v}])
                time.sleep(0.02)
            sow.sow_delete(topic_name, "/id = 2")
            got = []
            while (msg := sub.get(1.5)) is not None:
                got.append(msg)
            elapsed = time.monotonic() - started
    per_key = Counter((m["kind"], m["data"]["id"]) for m in got)
    intervals = elapsed / 0.3 + 1
    print(f"\n{len(got)} messages in {elapsed:.1f} s for 120 updates: {dict(per_key)}")
    assert 2 <= per_key[("publish", 1)] <= intervals, per_key
    assert per_key[("publish", 2)] <= intervals and per_key[("oof", 2)] == 1
    last = [m for m in got if m["kind"] == "publish" and m["data"]["id"] == 1][-1]
    assert last["data"] == {"id": 1, "v": 60}  # the latest version
    assert _rows(sow, conflated) == {k: v for k, v in _rows(sow, topic_name).items()}


def test_cli_derive_burst_makes_derived_topics_whole(url, topic_name, plane):
    if plane == "cluster":
        pytest.skip("the CLI: on the server plane")
    sow = Sow(url)
    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": 1, "sym": "A", "qty": 3, "px": 2},
                             {"id": 2, "sym": "A", "qty": 1, "px": 4}], wait=False)
    from sow_redis.apply.jobs import apply_here
    from sow_redis.settings import Settings

    t = sow.topic(topic_name)
    apply_here(sow.r, t, list(range(t.partitions)), Settings.from_env(redis_url=url), 10)
    out = run_cli(url, "derive", "--burst")
    line = out.stdout.decode().strip()  # the shared server holds other tests' topics too
    assert line.startswith("derived ") and f"{topic_name}_by_sym, {topic_name}_c" in line, line
    inline = Sow(url, inline=True)
    for name in (f"{topic_name}_by_sym", f"{topic_name}_c"):  # apply what the burst wrote
        t = inline.topic(name)
        apply_here(inline.r, t, list(range(t.partitions)), inline.settings, 10)
    assert [r.obj() for r in sow.sow(f"{topic_name}_by_sym")] == [
        {"sym": "A", "orders": 2, "qty": 4, "avg_px": 3.0, "lo": 2, "hi": 4}]
    assert sorted(r.obj()["id"] for r in sow.sow(f"{topic_name}_c")) == [1, 2]


def _join_config(name: str) -> str:
    return (f'[[topic]]\nname = "{name}_o"\nkey = ["/id"]\npartitions = 2\n'
            f'[[topic]]\nname = "{name}_f"\nkey = ["/fill"]\npartitions = 2\n'
            f'[[view]]\nname = "{name}_v"\nunderlying = ["{name}_o", "{name}_f"]\n'
            'join = ["/id", "/order"]\n'
            f'projection = ["/{name}_o/sym", "COUNT(/{name}_f/fill) AS /fills", '
            f'"SUM(/{name}_f/qty) AS /filled", "MAX(/{name}_o/qty) AS /biggest"]\n'
            f'grouping = ["/{name}_o/sym"]\nfilter = "/{name}_f/qty > 1"\n')


def test_a_view_of_two_joined_topics_equals_a_recompute(sow, topic_name):
    """Orders and fills joined on order id (an inner join, filter on the joined rows)."""
    sow.apply_config(_join_config(topic_name))
    o, f = f"{topic_name}_o", f"{topic_name}_f"
    rng = random.Random(9)

    def recompute() -> dict:
        agg = Aggregation([f"/{o}/sym", f"COUNT(/{f}/fill) AS /fills",
                           f"SUM(/{f}/qty) AS /filled", f"MAX(/{o}/qty) AS /biggest"],
                          [f"/{o}/sym"], domain=f"{topic_name}_v")
        orders = {rec.obj()["id"]: (rec.sow_key, rec.obj()) for rec in sow.sow(o)}
        for fill in sow.sow(f):
            match = orders.get(fill.obj().get("order"))
            if match is not None and fill.obj()["qty"] > 1:
                agg.upsert(f"{match[0]}|{fill.sow_key}", {o: match[1], f: fill.obj()})
        return dict(agg.rows())

    sow.publish(o, [{"id": i, "sym": rng.choice("ABC"), "qty": i} for i in range(10)])
    with _Running(sow):
        for _ in range(600):
            roll = rng.random()
            if roll < 0.3:
                sow.publish(o, {"id": rng.randrange(15), "sym": rng.choice("ABC"),
                                "qty": rng.randint(1, 50)})
            elif roll < 0.8:
                sow.publish(f, {"fill": rng.randrange(40), "order": rng.choice(
                    [rng.randrange(15), None]), "qty": rng.randint(0, 9)})
            elif roll < 0.9:
                sow.sow_delete(o, f"/id = {rng.randrange(15)}")
            else:
                sow.sow_delete(f, f"/fill = {rng.randrange(40)}")
        wait_until(lambda: _rows(sow, f"{topic_name}_v") == recompute(), 30,
                   "the joined view equal to the recompute")
    view = _rows(sow, f"{topic_name}_v")
    print(f"\njoined view: {sorted((r[o]['sym'], r['fills'], r['filled']) for r in view.values())}")
    assert len(view) == 3


def test_an_expired_record_leaves_its_group_and_the_conflated_topic(sow, topic_name):
    from sow_redis.expirer import Expirer

    sow.apply_config(_config(topic_name).replace(
        "partitions = 4\n", 'partitions = 4\nexpiration = "enabled"\n', 1))
    sow.publish(topic_name, [{"id": 1, "sym": "A", "qty": 5, "px": 1},
                             {"id": 2, "sym": "B", "qty": 5, "px": 2}])
    with _Running(sow):
        wait_until(lambda: _rows(sow, f"{topic_name}_by_sym") == _recomputed(sow, topic_name)
                   and len(_rows(sow, f"{topic_name}_c")) == 2, 60, "the view built")
        sow.publish(topic_name, {"id": 3, "sym": "B", "qty": 5, "px": 3}, expiration=0.2)
        wait_until(lambda: {r["sym"]: r["orders"] for r in
                            _rows(sow, f"{topic_name}_by_sym").values()} == {"A": 1, "B": 2},
                   60, "the view with the short-lived record")
        time.sleep(0.3)  # due now: a query leaves it out, the expirer removes it
        assert Expirer(sow.r, sow.settings, topics=[topic_name]).run(burst=True) == 1
        wait_until(lambda: len(_rows(sow, f"{topic_name}_c")) == 2, 60, "removed from c")
        wait_until(lambda: _rows(sow, f"{topic_name}_by_sym") == _recomputed(sow, topic_name),
                   60, "the view after the expiry")
    groups = {r["sym"]: r["orders"] for r in _rows(sow, f"{topic_name}_by_sym").values()}
    assert groups == {"A": 1, "B": 1}


def test_a_follower_behind_for_100ms_writes_every_50ms_then_every_5ms_again(monkeypatch):
    """The window a step takes messages for: FLUSH_S (5 ms) while the follower keeps up or
    has been behind for less than BACKLOG_S, FLUSH_MAX_S (50 ms) after that, FLUSH_S again
    once a step took all that arrived. A fake clock moving 1 ms per reading: a step reads it
    once per 64 messages (and at its start), so a 5 ms window takes 320 messages, a 50 ms one
    3,200."""
    from sow_redis import derive

    class Clock:
        now = 0.0

        @classmethod
        def monotonic(cls) -> float:
            cls.now += 0.001
            return cls.now

    monkeypatch.setattr(derive, "time", Clock)
    arriving = [True]

    class Sub:
        def get(self, timeout: float):
            return {"kind": "publish"} if arriving[0] else None

    follower = object.__new__(derive._Follower)
    follower.sub, follower.behind_since = Sub(), None
    follower.take = lambda msg: None
    flushes = []
    follower.flush = lambda: flushes.append(Clock.now)
    sizes = [follower.step() for _ in range(30)]
    print(sizes)
    assert sizes[0] == 320 and sizes[-1] == 3200
    behind_for = 0.0
    for n in sizes:  # 5 ms windows until the follower has been behind for 100 ms
        assert n == (3200 if behind_for >= derive.BACKLOG_S - 1e-9 else 320)
        behind_for += (n // 64 + 1) * 0.001
    assert len(flushes) == 30  # a write after every step
    arriving[0] = False
    assert follower.step() == 0 and follower.behind_since is None
    arriving[0] = True
    assert follower.step() == 320  # caught up: 5 ms windows again


def test_the_writer_merges_waiting_rows_and_reports_a_failed_write():
    """A row or removal handed over while a write runs replaces what waited for its key;
    drain waits for every row; an error of a write is raised at the next put or drain."""
    from sow_redis.derive import _Writer

    gate, calls = threading.Event(), []

    def write(rows, gone):
        calls.append((dict(rows), set(gone)))
        gate.wait(10)
        if rows.get("boom"):
            raise RuntimeError("refused")

    w = _Writer(write, "t")
    w.put({"a": {"n": 1}}, set())
    wait_until(lambda: len(calls) == 1, 10, "the first write")
    w.put({"b": {"n": 1}, "c": {"n": 1}}, set())  # wait while the first write runs
    w.put({"b": {"n": 2}}, {"c"})  # b's latest row, c removed
    w.put({"c": {"n": 3}}, {"d"})  # c written again, d removed
    gate.set()
    w.drain()
    assert calls == [({"a": {"n": 1}}, set()),
                     ({"b": {"n": 2}, "c": {"n": 3}}, {"d"})]
    w.put({"boom": {"n": 1}}, set())
    with pytest.raises(RuntimeError, match="refused"):
        w.drain()
    w.put({"e": {"n": 1}}, set())  # the writer goes on after reporting it
    w.close()
    assert calls[-1] == ({"e": {"n": 1}}, set())
