"""Shape migrations while publishers and subscribers keep running (issue 23.4).

Real redis-server and a real worker process. Before the definition fence, a publisher
looping over ids 0-99 across a 2 → 5 migration left 178 records for 100 ids (78 stored twice,
one copy in a wrong partition) and a subscriber across a 2 → 4 migration received 94 of the
next 200 updates. Each test prints its counts.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import orjson
import pytest
from conftest import cli_env, start_worker, wait_until

from sow_redis import keys
from sow_redis.apply.jobs import drain_partition
from sow_redis.client import Sow
from sow_redis.config import parse_topics
from sow_redis.errors import SubscriptionEnded
from sow_redis.model.messages import parse
from sow_redis.model.records import decode as decode_record
from sow_redis.publish.append import append
from sow_redis.registry import get_topic

pytestmark = pytest.mark.slow  # workers, migrations and ACL servers: the full lane


def cfg(name: str, partitions: int, extra: str = "") -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = {partitions}\n{extra}\n'


@pytest.fixture
def worker(url):
    proc = start_worker(url)
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def layout(r, name: str, partitions: int) -> dict[int, list[tuple[int, dict]]]:
    """id → [(partition, data)] of every record stored in partitions 0..partitions-1."""
    out: dict[int, list[tuple[int, dict]]] = {}
    for p in range(partitions):
        for k, v in r.hgetall(keys.records(name, p)).items():
            data = orjson.loads(decode_record(k, v).data)
            out.setdefault(data["id"], []).append((p, data))
    return out


def rejected_reasons(r, name: str, partitions: int) -> list[bytes]:
    return [f[b"reason"] for stream in keys.error_streams(name, partitions)
            for _sid, f in r.xrange(stream)]


def check_layout(r, name: str, want: dict[int, int], partitions: int, stored_upto: int = 8):
    """Every id stored once, in the partition the stored definition gives, with the last
    value published; nothing beyond the topic's partitions."""
    t = get_topic(r, name)
    assert t.partitions == partitions
    found = layout(r, name, stored_upto)
    twice = {i: places for i, places in found.items() if len(places) > 1}
    assert not twice, f"{len(twice)} id(s) stored twice, e.g. {list(twice.items())[:2]}"
    assert sorted(found) == sorted(want)
    for i, [(p, data)] in found.items():
        assert p == parse(orjson.dumps(data), t).partition, f"id {i} in partition {p}"
        assert data["v"] == want[i], f"id {i}: {data['v']} != {want[i]}"
    assert rejected_reasons(r, name, stored_upto) == []


def publish_across(url: str, topic: str, migrate, fields=lambda i: {}):
    """Publish ids 0-99 one by one with ``Sow.publish(wait=True)`` in a thread, round after
    round (``v`` = the round), call ``migrate()`` after the first round, stop two rounds
    after it. Returns ``(id → last v, publishes re-keyed under a new definition, rounds)``."""
    last: dict[int, int] = {}
    rekeyed: list[int] = []
    stop = threading.Event()
    failure: list[BaseException] = []

    def loop():
        pub, v = Sow(url), 0
        try:
            while not stop.is_set():
                v += 1
                for i in range(100):
                    res = pub.publish(topic, {"id": i, **fields(i), "v": v}, wait=True,
                                      timeout=120)
                    last[i] = v
                    if res.definition is not None:
                        rekeyed.append(i)
        except BaseException as exc:  # reported by the test
            failure.append(exc)

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        wait_until(lambda: len(last) == 100 or failure, 60, "a first round of publishes")
        migrate()
        at = max(last.values())
        wait_until(lambda: max(last.values()) >= at + 2 or failure, 120,
                   "two rounds of publishes after the migration")
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not failure, failure
    print(f"rounds: {at} at the migration's end, {max(last.values())} in all; publishes "
          f"re-keyed under the new definition: {len(rekeyed)}")
    return last, rekeyed


def test_a_publisher_loop_keeps_running_across_a_migration(url, r, topic_name, worker):
    sow = Sow(url)
    sow.apply_config(cfg(topic_name, 2, 'hash_index = [["/g"]]'))
    last, rekeyed = publish_across(
        url, topic_name, lambda: sow.apply_config(cfg(topic_name, 5, 'hash_index = [["/g"]]'),
                                                  migrate=True), lambda i: {"g": i % 7})
    assert rekeyed, "the publisher never met the definition fence"
    check_layout(r, topic_name, last, 5)
    # the hash index follows the new layout: every g finds its ids
    for g in range(7):
        assert sorted(rec.obj()["id"] for rec in sow.sow(topic_name, f"/g = {g}")) == \
            [i for i in range(100) if i % 7 == g]


def test_cli_publish_keeps_running_across_a_migration(url, r, topic_name, worker):
    sow = Sow(url)
    sow.apply_config(cfg(topic_name, 2))
    proc = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "publish", "-t",
                             topic_name, "-", "--wait"], env=cli_env(url),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None
    want: dict[int, int] = {}
    lines = 0
    for v in range(1, 41):
        block = b"".join(orjson.dumps({"id": i, "v": v}) + b"\n" for i in range(500))
        proc.stdin.write(block)
        proc.stdin.flush()
        lines += 500
        want.update({i: v for i in range(500)})
        if v == 10:
            wait_until(lambda: sum(r.xlen(keys.log(topic_name, p)) for p in range(2)) > 0,
                       30, "the CLI appending")
            sow.apply_config(cfg(topic_name, 5), migrate=True)
        time.sleep(0.05)
    out, err = proc.communicate(timeout=180)  # closes its input
    print(err.decode())
    assert proc.returncode == 0, err.decode()
    assert f"published {lines}".encode() in err or f"{lines}".encode() in out + err
    check_layout(r, topic_name, want, 5)


@pytest.mark.parametrize("scripts", [True, False], ids=["script", "transaction"])
def test_a_publisher_holding_an_old_definition_rekeys_what_redis_refused(url, r, topic_name,
                                                                         scripts):
    sow = Sow(url)
    sow.apply_config(cfg(topic_name, 4))
    old = get_topic(r, topic_name)
    sow.publish(topic_name, [{"id": i, "v": 0} for i in range(50)], wait=True)
    sow.apply_config(cfg(topic_name, 3), migrate=True)
    assert r.get(keys.definition(topic_name, 3)) == keys.DEFINITION_DROPPED.encode()
    # a publisher that kept the 4-partition definition: Redis refuses it, it reads the
    # 3-partition one and sends again (partition 3 no longer exists)
    if not scripts:  # as the ACL publisher role: a WATCH / MULTI / EXEC fence
        from sow_redis.apply.scripts import attached
        from sow_redis.publish.append import WriteThrough

        attached(sow.r, "write_through", WriteThrough).refused = True
    res = append(sow.r, old, [("publish", {"id": i, "v": 1}, None) for i in range(50)],
                 jobs=sow.job_settings)
    assert res.published == 50 and not res.rejected
    assert res.definition is not None and res.definition.partitions == 3
    assert set(res.last_ids) <= {0, 1, 2}
    for p in range(3):
        drain_partition(r, res.definition, p, sow.settings, budget_s=60, linger_ms=0)
    assert r.xlen(keys.log(topic_name, 3)) == 0
    check_layout(r, topic_name, {i: 1 for i in range(50)}, 3)


def test_a_definition_never_stored_is_stored_by_the_first_publisher(url, r, topic_name):
    sow = Sow(url)
    sow.apply_config(cfg(topic_name, 2))
    t = get_topic(r, topic_name)
    for p in range(2):  # as stored before issue 23.4 (one key per call: two slots)
        r.delete(keys.definition(topic_name, p))
    # 64 keys: both partitions written (the partition of a key depends on the random topic
    # name: 10 keys all fell in one partition for t64a2d09e5d, 1 name in 512)
    res = sow.publish(topic_name, [{"id": i, "v": 1} for i in range(64)], wait=True)
    assert res.published == 64 and set(res.last_ids) == {0, 1}
    assert [r.get(keys.definition(topic_name, p)) for p in range(2)] == \
        [t.fingerprint.encode()] * 2
    assert len(sow.sow(topic_name)) == 64


def test_a_forged_definition_stops_a_publish_with_one_clear_line(url, r, topic_name,
                                                                monkeypatch):
    from sow_redis.publish import fence as publisher
    from sow_redis.publish.result import PublishInterrupted

    monkeypatch.setattr(publisher, "DEFINITION_WAIT_S", 0.3)
    sow = Sow(url)
    sow.apply_config(cfg(topic_name, 1))
    r.set(keys.definition(topic_name, 0), "forged")
    with pytest.raises(Exception) as e:
        sow.publish(topic_name, {"id": 1, "v": 1})
    assert not isinstance(e.value, PublishInterrupted)  # nothing was appended
    assert "refused this publisher's definition" in str(e.value)
    assert "config apply" in str(e.value)
    assert r.xlen(keys.log(topic_name, 0)) == 0
    sow.apply_config(cfg(topic_name, 1))  # stores it again
    assert sow.publish(topic_name, {"id": 1, "v": 1}, wait=True).published == 1


def test_a_subscriber_follows_a_migration_and_misses_no_update(url, r, topic_name, worker):
    sow = Sow(url)
    sow.apply_config(cfg(topic_name, 2))
    sow.publish(topic_name, [{"id": i, "v": 0} for i in range(50)], wait=True)
    got: list[dict] = []
    reports: list[dict] = []
    stop = threading.Event()
    with sow.subscribe(topic_name, oof=True, report=reports.append) as sub:
        def listen():
            while not stop.is_set():
                msg = sub.get(0.2)
                if msg is not None:
                    got.append(msg)

        thread = threading.Thread(target=listen)
        thread.start()
        try:
            sow.apply_config(cfg(topic_name, 4), migrate=True)
            for i in range(200):
                sow.publish(topic_name, {"id": i, "v": 1})
            sow.sow_delete(topic_name, filter="/id = 7")
            wait_until(lambda: any(m.get("kind") == "oof" and m.get("sow_key")
                                   and m["data"] and m["data"].get("id") == 7 for m in got),
                       60, "the delete after the migration")
        finally:
            stop.set()
            thread.join(timeout=30)
    causes = [m["cause"] for m in got if m["kind"] == "recovery"]
    assert causes == ["migration"] and [m["cause"] for m in reports] == ["migration"]
    view: dict[int, int] = {}  # the subscriber's picture of the SOW, message by message
    for m in got:
        if m["kind"] == "publish":
            view[m["data"]["id"]] = m["data"]["v"]
        elif m["kind"] == "oof" and m["data"]:
            view.pop(m["data"]["id"], None)
    updates = {m["data"]["id"] for m in got if m["kind"] == "publish" and m["data"]["v"] == 1}
    print(f"messages {len(got)}, updates with v=1 seen for {len(updates)} of 200 ids")
    assert updates == set(range(200))
    sow_now = {rec.obj()["id"]: rec.obj()["v"] for rec in sow.sow(topic_name)}
    assert view == sow_now and len(sow_now) == 199
    assert all(m["partition"] in range(4) for m in got if m["kind"] == "publish"
               and m["data"]["v"] == 1)


def test_a_bookmark_store_subscription_ends_with_one_line(url, r, topic_name):
    sow = Sow(url)
    sow.apply_config(cfg(topic_name, 2))
    sow.publish(topic_name, [{"id": i, "v": 0} for i in range(5)], wait=True)
    sub = sow.subscribe(topic_name, client_name="follower", sub_id="s1")
    try:
        sow.apply_config(cfg(topic_name, 3), migrate=True)
        with pytest.raises(SubscriptionEnded) as e:
            for _ in range(50):
                sub.get(0.1)
        assert "\n" not in str(e.value) and "--resync" in str(e.value)
    finally:
        sub.close()


def test_fingerprints_follow_config_apply(url, r, topic_name):
    sow = Sow(url)
    (t,) = sow.apply_config(cfg(topic_name, 3))
    assert [r.get(keys.definition(topic_name, p)) for p in range(3)] == \
        [t.fingerprint.encode()] * 3
    (same,) = parse_topics(cfg(topic_name, 3, 'expiration = "1h"'))
    assert same.fingerprint == t.fingerprint  # not the shape: no publisher is refused
    (t2,) = parse_topics(cfg(topic_name, 3, 'hash_index = [["/g"]]'))
    assert t2.fingerprint != t.fingerprint
    sow.apply_config([t2])
    assert {r.get(keys.definition(topic_name, p)) for p in range(3)} == {t2.fingerprint.encode()}


def test_a_subscriber_away_during_a_migration_follows_when_it_reconnects(url, r, topic_name):
    sow = Sow(url)
    sow.apply_config(cfg(topic_name, 2))
    sow.publish(topic_name, [{"id": i, "v": 0} for i in range(20)], wait=True)
    with sow.subscribe(topic_name, oof=True) as sub:
        for node in ([r] if not hasattr(r, "get_nodes") else r.get_nodes()):
            target = node if hasattr(r, "get_nodes") else None
            (r.client_kill_filter(_type="pubsub", target_nodes=target) if target
             else r.client_kill_filter(_type="pubsub"))  # the notice cannot reach it
        sow.apply_config(cfg(topic_name, 3), migrate=True)
        sow.publish(topic_name, {"id": 5, "v": 1}, wait=True)
        got: list[dict] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until quiet after the recovery
            msg = sub.get(0.5)
            if msg is None and any(m["kind"] == "recovery" for m in got):
                break
            if msg is not None:
                got.append(msg)
    kinds = [m["kind"] for m in got]
    assert kinds.count("recovery") == 1
    assert [m["cause"] for m in got if m["kind"] == "recovery"] == ["migration"]
    view = {m["data"]["id"]: m["data"]["v"] for m in got if m["kind"] == "publish"}
    assert view == {i: 1 if i == 5 else 0 for i in range(20)}
    assert sub.topic.partitions == 3


def test_a_subscriber_started_during_a_migration_waits_for_the_new_layout(url, r, topic_name):
    from sow_redis.registry import store_fingerprints

    sow = Sow(url)
    sow.apply_config(cfg(topic_name, 2))
    t = get_topic(r, topic_name)
    for p in range(2):
        r.set(keys.definition(topic_name, p), keys.DEFINITION_MIGRATING)
    made = []
    def start():
        sub = sow.subscribe(topic_name)
        made.append((time.monotonic(), sub))

    thread = threading.Thread(target=start)
    started = time.monotonic()
    thread.start()
    time.sleep(0.5)
    assert not made, "the subscription started inside a migration"
    store_fingerprints(r, [t])
    thread.join(timeout=30)
    (done, sub), = made
    print(f"waited {done - started:.2f} s for the migration")
    assert done - started >= 0.5
    with sub:
        sow.publish(topic_name, {"id": 1, "v": 1})
        msg = sub.get(10)
    assert msg is not None and msg["data"] == {"id": 1, "v": 1}


def test_a_publisher_without_scripts_is_fenced_by_a_transaction(tmp_path, topic_name):
    """The ACL publisher role may not run scripts: its XADDs go in MULTI/EXEC under WATCH of
    the partitions' definitions, so a loop of its publishes across a 2 → 5 migration stores
    every id once, in its partition, with its last value."""
    from test_acl import _url, start_acl_server

    server, port = start_acl_server(tmp_path)
    try:
        op = Sow(_url(port, "operator"))
        op.apply_config(cfg(topic_name, 2))
        worker = start_worker(_url(port, "worker"))
        try:
            last, rekeyed = publish_across(
                _url(port, "publisher"), topic_name,
                lambda: op.apply_config(cfg(topic_name, 5), migrate=True))
            assert rekeyed
            check_layout(op.r, topic_name, last, 5)
        finally:
            worker.terminate()
            worker.wait(timeout=20)
    finally:
        server.terminate()
        server.wait(timeout=10)
