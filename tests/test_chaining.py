"""The chaining key generator: one test per rule of seeds/003 (AMPS User Guide, "Chaining Key
Generator"), the two-chain rejection, validation mode, partition_by and restart persistence."""

from __future__ import annotations

import time

import orjson
import pytest
from redis import Redis

from sow_redis import keys
from sow_redis.apply import chaining
from sow_redis.client import Sow
from sow_redis.config import parse_topics
from sow_redis.errors import ConfigError
from sow_redis.model import sowkey
from sow_redis.ops.server import free_port, spawn_redis
from sow_redis.settings import Settings

SEED_MESSAGES = [
    {"DocumentNumber": 1, "Status": "Started"},
    {"DocumentNumber": 2, "ParentDocument": 1, "Order": "Antivenom"},
    {"DocumentNumber": 3, "ParentDocument": 2, "Order": "Sandwich"},
    {"DocumentNumber": 4, "ParentDocument": 1, "Status": "Pending"},
]


def docs_cfg(name, extra="key_generator = { type = \"chaining\" }"):
    return f'[[topic]]\nname = "{name}"\nkey = ["/DocumentNumber", "/ParentDocument"]\n{extra}\n'


def objs(sow, topic):
    return sorted((r.obj() for r in sow.sow(topic)), key=lambda o: orjson.dumps(o, option=orjson.OPT_SORT_KEYS))


def chain(sow, topic, ident):
    return chaining.chain_of(sow.r, sow.topic(topic), ident)


# -- the seed's sample case -------------------------------------------------------------
def test_seed_sample_delta_publish_gives_the_one_record(sow, topic_name):
    sow.apply_config(docs_cfg(topic_name))
    for m in SEED_MESSAGES:
        res = sow.delta_publish(topic_name, m)
        assert res.published == 1 and not res.rejected
    assert objs(sow, topic_name) == [
        {"DocumentNumber": 4, "ParentDocument": 1, "Order": "Sandwich", "Status": "Pending"}]
    (rec,) = sow.sow(topic_name)
    assert rec.sow_key == sowkey.generate(topic_name, ["1"])  # the head's key
    assert chain(sow, topic_name, "3")["ids"] == ["1", "2", "3", "4"]


def test_seed_sample_in_one_batch_matches_one_by_one(sow, topic_name):
    sow.apply_config(docs_cfg(topic_name))
    sow.delta_publish(topic_name, SEED_MESSAGES)  # one log batch: chains resolve within it
    assert objs(sow, topic_name) == [
        {"DocumentNumber": 4, "ParentDocument": 1, "Order": "Sandwich", "Status": "Pending"}]


def test_default_key_generator_keeps_four_records(sow, topic_name):
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/DocumentNumber"]\n')
    sow.delta_publish(topic_name, SEED_MESSAGES)
    assert len(sow.sow(topic_name)) == 4  # the seed's "four distinct records"


def test_publish_along_a_chain_replaces_the_one_record(sow, topic_name):
    sow.apply_config(docs_cfg(topic_name))
    sow.publish(topic_name, SEED_MESSAGES)
    assert objs(sow, topic_name) == [{"DocumentNumber": 4, "ParentDocument": 1, "Status": "Pending"}]


# -- one rule per sentence ----------------------------------------------------------------
def test_primary_not_in_a_chain_without_secondary_starts_a_chain(sow, topic_name):
    sow.apply_config(docs_cfg(topic_name))
    sow.publish(topic_name, [{"DocumentNumber": 1}, {"DocumentNumber": 7}])
    assert chain(sow, topic_name, "1") == {
        "head": "1", "sow_key": sowkey.generate(topic_name, ["1"]), "partition": 0, "ids": ["1"]}
    assert chain(sow, topic_name, "7")["ids"] == ["7"]
    assert len(sow.sow(topic_name)) == 2


def test_secondary_in_a_chain_updates_it_and_adds_the_primary(sow, topic_name):
    sow.apply_config(docs_cfg(topic_name))
    sow.publish(topic_name, {"DocumentNumber": 1, "v": "a"})
    sow.delta_publish(topic_name, {"DocumentNumber": 2, "ParentDocument": 1, "w": "b"})
    assert chain(sow, topic_name, "2")["head"] == "1"
    # a later message can chain to the identifier the update added
    sow.delta_publish(topic_name, {"DocumentNumber": 3, "ParentDocument": 2, "x": "c"})
    assert objs(sow, topic_name) == [
        {"DocumentNumber": 3, "ParentDocument": 2, "v": "a", "w": "b", "x": "c"}]


def test_primary_already_in_a_chain_updates_that_chain(sow, topic_name):
    sow.apply_config(docs_cfg(topic_name))
    sow.publish(topic_name, [{"DocumentNumber": 1}, {"DocumentNumber": 2, "ParentDocument": 1}])
    sow.delta_publish(topic_name, {"DocumentNumber": 2, "Status": "Filled"})  # e.g. an exec report
    assert objs(sow, topic_name) == [{"DocumentNumber": 2, "ParentDocument": 1, "Status": "Filled"}]


def test_unknown_secondary_heads_a_new_chain_as_though_it_were_the_primary(sow, topic_name):
    sow.apply_config(docs_cfg(topic_name))
    sow.publish(topic_name, {"DocumentNumber": 5, "ParentDocument": 4, "v": 1})
    assert chain(sow, topic_name, "5")["head"] == "4"
    (rec,) = sow.sow(topic_name)
    assert rec.sow_key == sowkey.generate(topic_name, ["4"])
    # the original arriving late updates the same record
    sow.delta_publish(topic_name, {"DocumentNumber": 4, "w": 2})
    assert objs(sow, topic_name) == [{"DocumentNumber": 4, "ParentDocument": 4, "v": 1, "w": 2}]


def test_any_number_of_secondary_fields(sow, topic_name):
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/ParentDocument", '
                     '"/RelatedDocument"]\nkey_generator = { type = "chaining", '
                     'primary = "/DocumentNumber" }\n')
    assert sow.topic(topic_name).chain_fields == ("/DocumentNumber", "/ParentDocument",
                                                  "/RelatedDocument")
    sow.delta_publish(topic_name, [{"DocumentNumber": 1, "a": 1},
                                   {"DocumentNumber": 2, "RelatedDocument": 1, "b": 2},
                                   {"DocumentNumber": 3, "ParentDocument": 2, "c": 3}])
    (o,) = objs(sow, topic_name)
    assert (o["a"], o["b"], o["c"]) == (1, 2, 3)


def test_message_without_any_chaining_field_is_rejected_by_the_publisher(sow, topic_name):
    sow.apply_config(docs_cfg(topic_name))
    res = sow.publish(topic_name, [{"Status": "x"}, {"DocumentNumber": None}])
    assert res.published == 0
    assert [x.reason for x in res.rejected] == ["missing_key_field"] * 2
    res = sow.publish(topic_name, {"DocumentNumber": 1}, sow_key="QUJD")
    assert [x.reason for x in res.rejected] == ["bad_sow_key"]
    assert "chaining key generator" in res.rejected[0].detail


# -- two chains ---------------------------------------------------------------------------
def test_message_resolving_to_two_chains_is_not_applied(sow, topic_name):
    sow.apply_config(docs_cfg(topic_name))
    sow.delta_publish(topic_name, [{"DocumentNumber": 1, "s": "a"},
                                   {"DocumentNumber": 2, "s": "b"},
                                   {"DocumentNumber": 3, "ParentDocument": 2}])
    before = objs(sow, topic_name)
    # primary 3 is in chain 2, secondary 1 heads chain 1
    res = sow.delta_publish(topic_name, [{"DocumentNumber": 3, "ParentDocument": 1, "bad": 1},
                                         {"DocumentNumber": 4, "ParentDocument": 3, "ok": 1}])
    assert res.published == 2  # the publisher cannot know; the worker rejects
    (err,) = sow.errors(topic_name)
    assert err["reason"] == "two_chains"
    assert "'1'" in err["detail"] and "'2'" in err["detail"]
    assert orjson.loads(err["data"])["bad"] == 1
    # nothing of it was applied, and the partition kept moving
    after = objs(sow, topic_name)
    assert [o for o in after if "bad" in o] == []
    assert {"DocumentNumber": 4, "ParentDocument": 3, "s": "b", "ok": 1} in after
    assert len(after) == len(before) == 2
    assert chain(sow, topic_name, "1")["ids"] == ["1"]
    assert sow.r.hlen(keys.chain_conflicts(topic_name)) == 0  # validation is off


def test_validation_reports_chains_that_would_have_merged(sow, topic_name):
    sow.apply_config(docs_cfg(topic_name, 'key_generator = { type = "chaining", validation = true }'))
    sow.publish(topic_name, [{"DocumentNumber": d} for d in (1, 2, 3, 9)])
    # 5 links 1 and 2; 6 links 2 and 3: in another order all three would be one chain
    sow.publish(topic_name, [{"DocumentNumber": 1, "ParentDocument": 2},
                             {"DocumentNumber": 3, "ParentDocument": 2},
                             {"DocumentNumber": 8, "ParentDocument": 9}])
    t = sow.topic(topic_name)
    groups = chaining.conflict_groups(sow.r, t)
    assert [g["heads"] for g in groups] == [["1", "2", "3"]]
    assert len(groups[0]["messages"]) == 2
    assert chaining.chain_stats(sow.r, t) == {"ids": 5, "conflicts": 2}
    assert [e["reason"] for e in sow.errors(topic_name)] == ["two_chains"] * 2


# -- delete, partitions, persistence --------------------------------------------------------
def test_sow_delete_by_data_removes_the_chain_record(sow, topic_name):
    sow.apply_config(docs_cfg(topic_name))
    sow.publish(topic_name, SEED_MESSAGES[:3])
    assert sow.sow_delete(topic_name, data={"DocumentNumber": 9, "ParentDocument": 3}) == 1
    assert sow.sow(topic_name) == []
    assert chain(sow, topic_name, "9") is None  # a delete does not extend a chain


def test_partition_by_spreads_chains_over_partitions(sow, topic_name):
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nmessage_type = "fix"\n'
                     'key = ["/11", "/41"]\nkey_generator = { type = "chaining" }\n'
                     'partition_by = ["/55"]\npartitions = 4\n')
    msgs = []
    for n, sym in enumerate(["IBM", "MSFT", "AAPL", "ORCL", "SAP", "BMW"]):
        msgs += [f"35=D|11=o{n}a|55={sym}|38=100", f"35=G|11=o{n}b|41=o{n}a|55={sym}|38=200",
                 f"35=G|11=o{n}c|41=o{n}b|55={sym}|38=300"]
    res = sow.delta_publish(topic_name, msgs, separator="|")
    assert res.published == 18 and not res.rejected
    recs = {r.obj()["55"]: r.obj() for r in sow.sow(topic_name)}
    assert len(recs) == 6 and all(o["38"] == "300" and o["41"].endswith("b") for o in recs.values())
    t = sow.topic(topic_name)
    used = set()
    for n, sym in enumerate(["IBM", "MSFT", "AAPL", "ORCL", "SAP", "BMW"]):
        c = chaining.chain_of(sow.r, t, f"o{n}c")
        assert c["ids"] == [f"o{n}a", f"o{n}b", f"o{n}c"]
        assert c["partition"] == sowkey.partition_of([sym], 4)
        used.add(c["partition"])
    assert len(used) > 1


def test_chains_persist_across_a_redis_restart(tmp_path, topic_name):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"

    def start():
        return spawn_redis(port, tmp_path / "data", persist=True)

    proc = start()
    try:
        sow = Sow(url, inline=True)
        sow.apply_config(docs_cfg(topic_name))
        sow.delta_publish(topic_name, SEED_MESSAGES[:2])
        Redis.from_url(url).shutdown()  # AOF is written; nothing else survives
    except Exception:
        proc.kill()
        raise
    proc.wait(timeout=30)
    proc = start()
    try:
        sow = Sow(url, inline=True)  # a new worker, no cache
        sow.delta_publish(topic_name, SEED_MESSAGES[2:])
        assert objs(sow, topic_name) == [
            {"DocumentNumber": 4, "ParentDocument": 1, "Order": "Sandwich", "Status": "Pending"}]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# -- configuration ------------------------------------------------------------------------
def _problems(text):
    with pytest.raises(ConfigError) as ei:
        parse_topics(text, "c.toml")
    return ei.value.problems


def test_config_forms_of_primary_and_secondary():
    (a,) = parse_topics('[[topic]]\nname = "a"\nkey = ["/11", "/41"]\n'
                        'key_generator = { type = "chaining" }\n')
    (b,) = parse_topics('[[topic]]\nname = "b"\nkey_generator = { type = "chaining", '
                        'primary = "/11", secondary = ["/41"], validation = true }\n')
    (c,) = parse_topics('[[topic]]\nname = "c"\nkey = ["/41"]\n'
                        'key_generator = { type = "chaining", primary = "/11" }\n')
    for t in (a, b, c):
        assert (t.chain_primary, t.chain_secondary, t.partitions) == ("/11", ("/41",), 1)
    assert b.chain_validation and not a.chain_validation
    assert not b.publisher_keys


@pytest.mark.parametrize("body,expected", [
    ('key = ["/11"]\nkey_generator = { type = "chaining" }',
     "needs a primary field and at least one secondary field"),
    ('key_generator = { type = "chaining", primary = "/11" }', "at least one secondary"),
    ('key = ["/11", "/41"]\nkey_generator = { type = "chaining" }\npartitions = 4',
     "needs 'partition_by'"),
    ('key = ["/11", "/41"]\nkey_generator = { type = "chaning" }', "type must be one of"),
    ('key = ["/11", "/41"]\nkey_generator = { type = "chaining", file = "x" }',
     "unknown field 'file'"),
    ('key = ["/11", "/41"]\nkey_generator = "chaining"', "must be a table"),
    ('key = ["/11", "/11"]\nkey_generator = { type = "chaining" }', "listed twice"),
])
def test_config_errors_name_the_problem(body, expected):
    (line,) = _problems(f'[[topic]]\nname = "o"\n{body}\n')
    assert line.startswith(("c.toml: topic #1 'o': 'key_generator",
                            "c.toml: topic #1 'o': 'partitions'"))
    assert expected in line


def test_registry_round_trip_keeps_the_generator():
    from sow_redis.model.topic import TopicConfig

    (t,) = parse_topics('[[topic]]\nname = "o"\nmessage_type = "fix"\nfield_separator = ";"\n'
                        'key = ["/11", "/41"]\npartition_by = ["/55"]\npartitions = 8\n'
                        'key_generator = { type = "chaining", validation = true }\n')
    u = TopicConfig.from_json(t.to_json())
    assert u == t and u.chain_parts == (("11",), ("41",)) and u.partitions == 8


def test_chain_ops_are_atomic_with_the_record(sow, topic_name):
    """A batch that fails in apply.lua (stale fencing token) writes no chain entry."""
    from sow_redis.apply.jobs import drain_partition
    from sow_redis.errors import FencedError

    if sow.url.startswith("memory://"):
        pytest.skip("fencing is exercised on the real server")
    sow.apply_config(docs_cfg(topic_name))
    t = sow.topic(topic_name)
    from sow_redis.publish.append import append

    append(sow.r, t, [("publish", orjson.dumps(m), None) for m in SEED_MESSAGES])
    sow.r.hincrby(keys.state(topic_name, 0), "fence", 5)  # a newer owner took over
    from sow_redis.apply.applier import apply_batch
    from sow_redis.apply.scripts import Scripts

    with pytest.raises(FencedError):
        apply_batch(sow.r, Scripts(sow.r), t, 0, fence=1, batch_size=100)
    assert sow.r.hlen(keys.chain(topic_name, 0)) == 0
    assert sow.r.hlen(keys.records(topic_name, 0)) == 0
    time.sleep(0)  # the new owner applies everything once
    settings = Settings.from_env(redis_url=sow.url)
    drain_partition(sow.r, t, 0, settings, budget_s=30, linger_ms=0)
    assert sow.r.hlen(keys.chain(topic_name, 0)) == 4


def test_cli_chains_reports_ids_chain_and_would_merge(url, topic_name):
    from conftest import run_cli

    sow = Sow(url, inline=True)
    sow.apply_config(docs_cfg(topic_name, 'key_generator = { type = "chaining", validation = true }'))
    sow.publish(topic_name, SEED_MESSAGES + [{"DocumentNumber": 7},
                                             {"DocumentNumber": 7, "ParentDocument": 3}])
    rep = orjson.loads(run_cli(url, "chains", "-t", topic_name).stdout)
    assert rep == {"topic": topic_name, "ids": 5, "conflicts": 1, "validation": True,
                   "would_merge": [{"heads": ["1", "7"], "messages": rep["would_merge"][0]["messages"]}]}
    one = orjson.loads(run_cli(url, "chains", "-t", topic_name, "--id", "4").stdout)
    assert one["head"] == "1" and one["ids"] == ["1", "2", "3", "4"]
    missing = run_cli(url, "chains", "-t", topic_name, "--id", "nope", check=False)
    assert missing.returncode == 1
    assert missing.stderr.decode().strip() == f"Error: topic '{topic_name}': 'nope' is in no chain"


def test_chain_conflict_reports_keep_the_newest_past_their_bound(r, topic_name, monkeypatch):
    """A feed that keeps sending conflicting messages (validation on) does not grow the
    reports without bound: past CONFLICTS_MAX (by a tenth) the oldest go, by stream id, and
    a field of another form first."""
    from sow_redis import keys
    from sow_redis.apply import applier
    from sow_redis.model.topic import TopicConfig

    monkeypatch.setattr(applier, "CONFLICTS_MAX", 10)
    topic = TopicConfig(name=topic_name, key=["/id"])
    name = keys.chain_conflicts(topic_name)
    r.hset(name, mapping={**{f"{n % 4}:{1000 + n}-{n % 3}": "{}" for n in range(30)},
                          "junk": "x"})
    seg = applier._Segment("9-0", "9-0", conflicts=[("2:5000-0", b"{}")])
    applier._write_conflicts(r, topic, seg)
    kept = sorted(f.decode() for f in r.hkeys(name))
    assert kept == sorted(["2:5000-0"] + [f"{n % 4}:{1000 + n}-{n % 3}" for n in range(21, 30)])
    applier._write_conflicts(r, topic, applier._Segment("9-1", "9-1",
                                                         conflicts=[("0:6000-0", b"{}")]))
    assert r.hlen(name) == 11  # within the tenth: nothing removed
