"""SOW message expiration: one test per rule of seeds/004 and 000 ("SOW Message Expiration",
"Recovery and Expiration") and the RabbitMQ TTL semantics of seeds/001 (policy "min")."""

from __future__ import annotations

import time

import pytest
from conftest import run_cli

from sow_redis import keys
from sow_redis.connection import server_ms
from sow_redis.expirer import Expirer
from sow_redis.model import sowkey


def cfg(name, extra=""):
    return f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = 2\n{extra}\n'


def expire(sow, topic):
    """One burst of an expirer serving only ``topic`` (the session's server holds other tests'
    topics, whose records may fall due at any moment); returns the number of records removed."""
    return Expirer(sow.r, sow.settings, topics=[topic]).run(burst=True)


def drain(sow, topic):
    """Apply everything in a topic's log in process (the workers' code)."""
    from sow_redis.apply.jobs import drain_partition

    t = sow.topic(topic)
    for p in range(t.partitions):
        while not drain_partition(sow.r, t, p, sow.settings, budget_s=60, linger_ms=0)[1]:
            pass


def until_due(sow, topic, lifetime_s):
    """Polls the Redis server clock (the clock ``expire.lua`` compares with) until every record
    of ``topic`` due within ``lifetime_s`` seconds from now is due, instead of sleeping a fixed
    "lifetime + margin": records with a longer lifetime are left out (still to come)."""
    now = server_ms(sow.r)
    due = [int(score) for p in range(sow.topic(topic).partitions)
           for _, score in sow.r.zrange(keys.expiry(topic, p), 0, -1, withscores=True)
           if score <= now + lifetime_s * 1000]
    until_past(sow, max(due, default=now))


def until_past(sow, ms):
    """Polls the Redis server clock until it is past ``ms``."""
    while server_ms(sow.r) <= ms:
        time.sleep(0.005)


def ids(sow, topic):
    return sorted(r.obj()["id"] for r in sow.sow(topic))


def test_default_off_keeps_message_expiration_but_never_expires(sow, topic_name):
    sow.apply_config(cfg(topic_name))
    sow.publish(topic_name, {"id": 1}, expiration=0.1)
    (rec,) = sow.sow(topic_name)
    assert rec.expiry_ms > 0  # kept on the record
    until_past(sow, rec.expiry_ms)
    assert expire(sow, topic_name) == 0
    assert ids(sow, topic_name) == [1]


def test_topic_default_lifetime(sow, topic_name):
    # 2 s: a lifetime of 300 ms ran out before the first query on a busy machine
    sow.apply_config(cfg(topic_name, 'expiration = "2s"'))
    sow.publish(topic_name, [{"id": 1}, {"id": 2}])
    (r1, _) = sorted(sow.sow(topic_name), key=lambda r: r.obj()["id"])
    assert r1.expiry_ms == int(r1.stream_id.split("-")[0]) + 2000
    assert expire(sow, topic_name) == 0 and ids(sow, topic_name) == [1, 2]
    until_due(sow, topic_name, 2.0)
    assert expire(sow, topic_name) == 2
    assert ids(sow, topic_name) == []


def test_message_expiration_overrides_topic(sow, topic_name):
    sow.apply_config(cfg(topic_name, 'expiration = "10s"'))
    sow.publish(topic_name, {"id": 1}, expiration=0.1)
    sow.publish(topic_name, {"id": 2})
    t2 = topic_name + "b"
    sow.apply_config(cfg(t2, 'expiration = "100ms"'))
    sow.publish(t2, {"id": 3}, expiration=30)
    until_due(sow, topic_name, 0.1)
    until_past(sow, server_ms(sow.r) + 100)  # past t2's default lifetime too
    expire(sow, topic_name)
    assert ids(sow, topic_name) == [2]
    assert ids(sow, t2) == [3]


def test_zero_means_never_expire(sow, topic_name):
    sow.apply_config(cfg(topic_name, 'expiration = "100ms"'))
    sow.publish(topic_name, {"id": 1}, expiration=0)
    sow.publish(topic_name, {"id": 2})
    until_due(sow, topic_name, 0.1)
    expire(sow, topic_name)
    (rec,) = sow.sow(topic_name)
    assert rec.obj() == {"id": 1} and rec.expiry_ms == 0


def test_enabled_expires_only_messages_with_their_own_expiration(sow, topic_name):
    sow.apply_config(cfg(topic_name, 'expiration = "enabled"'))
    sow.publish(topic_name, {"id": 1})
    sow.publish(topic_name, {"id": 2}, expiration=0.1)
    until_due(sow, topic_name, 0.1)
    assert expire(sow, topic_name) == 1
    assert ids(sow, topic_name) == [1]


@pytest.mark.parametrize("method", ["publish", "delta_publish"])
def test_update_resets_lifetime(sow, topic_name, method):
    sow.apply_config(cfg(topic_name, 'expiration = "500ms"'))
    sow.publish(topic_name, {"id": 1, "v": 0})
    (first,) = sow.sow(topic_name)
    time.sleep(0.3)
    getattr(sow, method)(topic_name, {"id": 1, "v": 1})
    until_past(sow, first.expiry_ms)  # past the first lifetime, 0.2 s after the update
    assert expire(sow, topic_name) == 0
    assert [r.obj()["v"] for r in sow.sow(topic_name)] == [1]
    until_due(sow, topic_name, 0.5)
    assert expire(sow, topic_name) == 1
    assert sow.sow(topic_name) == []


def test_expiry_is_delete_processing_with_event(sow, topic_name):
    sow.apply_config(cfg(topic_name, 'expiration = "200ms"\nhash_index = [["/g"]]'))
    with sow.subscribe(topic_name, oof=True) as sub:
        sow.publish(topic_name, [{"id": 1, "g": "a"}, {"id": 2, "g": "a"}])
        sow.publish(topic_name, {"id": 3, "g": "a"}, expiration=0)
        assert [sub.get(2)["op"] for _ in range(3)] == ["publish"] * 3
        until_due(sow, topic_name, 0.2)
        # due records are never returned, even before the expirer removed them
        assert ids(sow, topic_name) == [3]
        assert expire(sow, topic_name) == 2
        evs = sorted((sub.get(2) for _ in range(2)), key=lambda e: e["data"]["id"])
    assert [(e["op"], e["reason"], e["data"]) for e in evs] == [
        ("sow_delete", "expired", {"id": 1, "g": "a"}), ("sow_delete", "expired", {"id": 2, "g": "a"})]
    assert evs[0]["sow_key"] == sowkey.generate(topic_name, ["1"]) and evs[0]["expiry_ms"] > 0
    assert [r.obj()["id"] for r in sow.sow(topic_name, "/g = 'a'")] == [3]  # index cleaned
    members = sum(sow.r.zcard(keys.index(topic_name, p, 0)) for p in range(2))
    left = sum(sow.r.zcard(keys.expiry(topic_name, p)) for p in range(2))
    assert members == 1 and left == 0


def test_update_racing_expiry_wins(sow, topic_name):
    sow.apply_config(cfg(topic_name, 'expiration = "100ms"'))
    sow.publish(topic_name, {"id": 1, "v": 0})
    until_due(sow, topic_name, 0.1)  # due, but the expirer has not run yet
    # the update's own lifetime: 30 s, so a slow machine cannot let it fall due as well
    sow.publish(topic_name, {"id": 1, "v": 1}, expiration=30)
    assert expire(sow, topic_name) == 0
    assert [r.obj()["v"] for r in sow.sow(topic_name)] == [1]


def test_overdue_records_expire_at_startup(url, sow, topic_name):
    if sow.url.startswith("memory://"):
        pytest.skip("needs a separate expirer process")
    sow.apply_config(cfg(topic_name, 'expiration = "100ms"'))
    sow.publish(topic_name, [{"id": i} for i in range(5)])
    until_due(sow, topic_name, 0.1)  # nothing running: the records are overdue
    assert sum(sow.r.hlen(keys.records(topic_name, p)) for p in range(2)) == 5
    out = run_cli(url, "expirer", "--burst", "-t", topic_name)
    assert b"expired" in out.stdout
    assert sum(sow.r.hlen(keys.records(topic_name, p)) for p in range(2)) == 0


def test_disabled_after_restart_is_not_processed(sow, topic_name):
    sow.apply_config(cfg(topic_name, 'expiration = "enabled"'))
    sow.publish(topic_name, {"id": 1}, expiration=0.1)
    sow.apply_config(cfg(topic_name, 'expiration = "disabled"'))
    until_due(sow, topic_name, 0.1)
    assert expire(sow, topic_name) == 0
    assert ids(sow, topic_name) == [1]


def test_changed_default_is_not_retroactive(sow, topic_name):
    sow.apply_config(cfg(topic_name, 'expiration = "300ms"'))
    sow.publish(topic_name, {"id": 1})
    sow.apply_config(cfg(topic_name, 'expiration = "1h"'))
    sow.publish(topic_name, {"id": 2})
    until_due(sow, topic_name, 0.3)
    assert expire(sow, topic_name) == 1
    assert ids(sow, topic_name) == [2]
    sow.apply_config(cfg(topic_name, 'expiration = "100ms"'))
    until_past(sow, server_ms(sow.r) + 100)  # the new default would have passed
    assert expire(sow, topic_name) == 0 and ids(sow, topic_name) == [2]


def test_min_policy_lower_ttl_wins(sow, topic_name):
    # lifetimes long enough that a loaded machine still queries both records before either
    # is due (0.1 s and 1 s lost record 1 at load average 13)
    sow.apply_config(cfg(topic_name, 'expiration = "3s"\nexpiration_policy = "min"'))
    sow.publish(topic_name, {"id": 1}, expiration=0.5)
    sow.publish(topic_name, {"id": 2}, expiration=30)
    recs = {r.obj()["id"]: r for r in sow.sow(topic_name)}
    assert recs[1].expiry_ms == int(recs[1].stream_id.split("-")[0]) + 500
    assert recs[2].expiry_ms == int(recs[2].stream_id.split("-")[0]) + 3000
    until_past(sow, recs[1].expiry_ms)
    expire(sow, topic_name)
    assert ids(sow, topic_name) == [2]


def test_min_policy_ttl_zero_delivered_then_removed(sow, topic_name):
    sow.apply_config(cfg(topic_name, 'expiration = "1h"\nexpiration_policy = "min"'))
    sow.publish(topic_name, {"id": 1, "v": "old"})
    with sow.subscribe(topic_name, oof=True) as sub:
        sow.publish(topic_name, {"id": 1, "v": "now"}, expiration=0)
        sow.publish(topic_name, {"id": 2}, expiration=0)
        evs = [sub.get(2) for _ in range(4)]
    # ids 1 and 2 lie in different partitions: events are ordered per partition (on a
    # cluster two partitions' events come from two nodes), so compare each record's in turn
    evs.sort(key=lambda e: e["data"]["id"])
    assert [(e["op"], e.get("reason"), e["data"]) for e in evs] == [
        ("publish", None, {"id": 1, "v": "now"}), ("sow_delete", "expired", {"id": 1, "v": "now"}),
        ("publish", None, {"id": 2}), ("sow_delete", "expired", {"id": 2})]
    assert sow.sow(topic_name) == []  # never kept


def test_dead_letter_copy(sow, topic_name):
    dl = topic_name + "dl"
    sow.apply_config(cfg(topic_name, f'expiration = "100ms"\ndead_letter = "{dl}"') +
                     f'[[topic]]\nname = "{dl}"\n')
    sow.publish(topic_name, [{"id": 1, "px": 5}, {"id": 2, "px": 6}])
    sow.publish(topic_name, {"id": 3}, expiration=0)
    until_due(sow, topic_name, 0.1)
    assert expire(sow, topic_name) == 2
    drain(sow, dl)  # the dead-letter copies go through the dead-letter topic's log
    got = {r.sow_key: r.obj() for r in sow.sow(dl)}
    k1 = sowkey.generate(topic_name, ["1"])
    assert set(got) == {k1, sowkey.generate(topic_name, ["2"])}
    assert got[k1]["topic"] == topic_name and got[k1]["sow_key"] == k1
    assert got[k1]["data"] == {"id": 1, "px": 5} and got[k1]["reason"] == "expired"
    assert got[k1]["expiry_ms"] > 0
    assert ids(sow, topic_name) == [3]


def test_idle_topic_removed(sow, topic_name):
    busy = topic_name + "busy"
    sow.apply_config(cfg(topic_name, 'idle_expiration = "300ms"') +
                     cfg(busy, 'idle_expiration = "300ms"'))
    sow.publish(topic_name, {"id": 1})
    sow.publish(busy, {"id": 1})
    with sow.subscribe(busy):
        until_past(sow, int(sow.r.hget(keys.LAST_USED, topic_name)) + 300)  # idle since
        Expirer(sow.r, sow.settings).loop()
        from sow_redis.registry import load_topics

        topics = load_topics(sow.r)
        assert topic_name not in topics and busy in topics  # a subscriber keeps it in use
    assert sow.r.keys(f"{{sow:{topic_name}:*") == []
    assert ids(sow, busy) == [1]


def test_publishers_record_use_at_most_every_tenth_of_idle_expiration(sow, topic_name):
    """A publish records the topic's use (LAST_USED) only for a topic with idle_expiration,
    and at most every min(1 s, idle_expiration / 10) per client: a steady publisher does not
    pay a round trip per publish for it."""
    quiet = topic_name + "q"
    sow.apply_config(cfg(topic_name, 'idle_expiration = "2s"') + cfg(quiet))
    sow.r.hdel(keys.LAST_USED, topic_name, quiet)  # config apply records it too
    sow.publish(quiet, {"id": 1})
    assert sow.r.hget(keys.LAST_USED, quiet) is None
    sow.publish(topic_name, {"id": 1})
    first = sow.r.hget(keys.LAST_USED, topic_name)
    assert first is not None
    time.sleep(0.01)
    sow.publish(topic_name, {"id": 2})  # within 200 ms of the first: not recorded again
    assert sow.r.hget(keys.LAST_USED, topic_name) == first
    time.sleep(0.25)
    sow.publish(topic_name, {"id": 3})
    assert int(sow.r.hget(keys.LAST_USED, topic_name)) >= int(first) + 250


def test_idle_expiration_must_be_positive():
    from sow_redis.config import parse_topics
    from sow_redis.errors import ConfigError

    with pytest.raises(ConfigError, match="'idle_expiration' must be > 0"):
        parse_topics(cfg("x", 'idle_expiration = "0s"'))
    with pytest.raises(ConfigError, match="'expiration' must be a duration"):
        parse_topics(cfg("x", 'expiration = "soon"'))


def test_bad_expiration_rejected(sow, topic_name):
    sow.apply_config(cfg(topic_name, 'expiration = "enabled"'))
    res = sow.publish(topic_name, [b'{"$sow": {"expiration": -1}, "data": {"id": 1}}',
                                   b'{"$sow": {"expiration": 5}, "data": {"id": 2}}',
                                   b'{"$sow": {"colour": 5}, "data": {"id": 3}}'])
    assert [(x.position, x.reason) for x in res.rejected] == [(1, "bad_expiration"), (3, "bad_envelope")]
    (rec,) = sow.sow(topic_name)
    assert rec.obj() == {"id": 2} and rec.expiry_ms == int(rec.stream_id.split("-")[0]) + 5000


def test_cli_expiration_stats_and_with_key(url, r, topic_name, tmp_path):
    from conftest import start_worker

    conf = tmp_path / "sow.toml"
    conf.write_text(cfg(topic_name, 'expiration = "1h"'))
    run_cli(url, "config", "apply", str(conf))
    w = start_worker(url)
    try:
        run_cli(url, "publish", "-t", topic_name, "--wait", "--expiration", "60",
                input=b'{"id": 1}\n{"id": 2}\n')
        run_cli(url, "publish", "-t", topic_name, "--wait", "--expiration", "0",
                input=b'{"id": 3}\n')
    finally:
        w.terminate()
        w.wait(timeout=30)
    import orjson

    rows = [orjson.loads(x) for x in run_cli(url, "sow", "-t", topic_name, "--with-key").stdout.splitlines()]
    exp = {x["data"]["id"]: x["expiry_ms"] for x in rows}
    assert exp[3] == 0 and exp[1] > 0
    st = [orjson.loads(x) for x in run_cli(url, "stats", "--json", "--interval", "0.1",
                                           "-t", topic_name).stdout.splitlines()]
    (mine,) = [x for x in st if x["topic"] == topic_name]
    assert mine["records"] == 3 and mine["with_expiry"] == 2
    assert mine["next_due_ms"] == min(exp[1], exp[2])


def test_undefined_dead_letter_topic_keeps_copies_until_defined(sow, topic_name):
    dl = topic_name + "dl"
    # config apply refuses an undefined dead_letter; the topic can still vanish later (e.g.
    # by its idle_expiration), which is what this test stands for
    sow.apply_config(cfg(topic_name, f'expiration = "100ms"\ndead_letter = "{dl}"')
                     + f'[[topic]]\nname = "{dl}"\n')
    from sow_redis.expirer import remove_topic

    remove_topic(sow.r, sow.topic(dl))
    sow.publish(topic_name, {"id": 1})
    until_due(sow, topic_name, 0.1)
    assert expire(sow, topic_name) == 1  # the expirer survives the missing topic
    outbox = sum(sow.r.xlen(keys.dead_letters(topic_name, p)) for p in range(2))
    assert outbox == 1
    sow.apply_config(f'[[topic]]\nname = "{dl}"\n')
    sow.publish(topic_name, {"id": 2})
    until_due(sow, topic_name, 0.1)
    assert expire(sow, topic_name) == 1
    drain(sow, dl)
    assert sorted(r.obj()["data"]["id"] for r in sow.sow(dl)) == [1, 2]
