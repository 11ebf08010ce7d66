"""``sow-redis config import-amps`` (issue 13 item 5): every AMPS SOW configuration example
in the seeds translates into TOML that loads and gives the same topics, each element of a
``<SOW><Topic>`` is translated as documented, and each element not translated is listed
with its path."""

from __future__ import annotations

import re

import pytest
from conftest import SHARED, run_cli

from sow_redis.config import parse_topics
from sow_redis.errors import ConfigError
from sow_redis.model.topic import parse_duration_ms
from sow_redis.ops.amps_import import amps_interval, import_amps, to_toml

SEEDS = sorted((SHARED / "seeds").glob("*.txt"))


def _examples() -> dict[str, str]:
    """Each ``<SOW>…</SOW>`` block of the seed texts (with the ``<Modules>`` block right before
    it, if any), by ``<seed number>-<index>``."""
    out = {}
    for seed in SEEDS:
        text = seed.read_text(errors="replace")
        for i, block in enumerate(re.findall(r"(?:<Modules>.*?</Modules>\s*)?<SOW>.*?</SOW>",
                                             text, re.S)):
            out[f"{seed.name[:3]}-{i}"] = block
    return out


EXAMPLES = _examples()

# What each seed example must give, read from the AMPS texts by hand: per translated topic
# (name, key, message type, expiration, hash indexes, (chain primary, secondary) or None),
# and the element paths listed as not translated.
EXPECTED = {
    "000-0": ([("ORDERS", ("/55", "/109"), "fix", "30s", (), None)],
              ["SOW/Topic[ORDERS]/FileName"]),
    "000-1": ([("ORDERS", ("/55", "/109"), "fix", "enabled", (), None)],
              ["SOW/Topic[ORDERS]/FileName"]),
    "003-0": ([("Orders", (), "json", "disabled", (),
                ("/DocumentNumber", ("/ParentDocument", "/RelatedDocument"))),
               ("ExternalOrders", (), "fix", "disabled", (), ("/11", ("/41",)))],
              ["SOW/Topic[Orders]/FileName", "SOW/Topic[Orders]/KeyGenerator/Options/FileName",
               "SOW/Topic[ExternalOrders]/FileName",
               "SOW/Topic[ExternalOrders]/KeyGenerator/Options/FileName"]),
    "004-0": ([], ["SOW/Topic[custom-keyed-sow]/FileName",
                   "SOW/Topic[custom-keyed-sow]: KeyGenerator module 'key-generator'"]),
    "004-1": ([("ORDERS", ("/55", "/109"), "fix", "30s", (), None)],
              ["SOW/Topic[ORDERS]/FileName"]),
    "004-2": ([("ORDERS", ("/55", "/109"), "fix", "enabled", (), None)],
              ["SOW/Topic[ORDERS]/FileName"]),
    "004-3": ([("ORDERS", ("/invoice", "/customerId"), "json", "disabled", (("/region",),),
                None),
               ("ALERTS", ("/alert/id",), "xml", "disabled", (), None)],
              ["SOW/Topic[ORDERS]/FileName", "SOW/Topic[ORDERS]/SlabSize",
               "SOW/Topic[ALERTS]/FileName"]),
}


def _summary(t):
    chain = (t.chain_primary, t.chain_secondary) if t.chaining else None
    return (t.name, t.key, t.message_type, t.expiration, t.hash_index, chain)


def test_every_sow_example_of_the_seeds_is_covered():
    print(sorted(EXAMPLES))
    assert sorted(EXAMPLES) == sorted(EXPECTED)


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_every_seed_example_translates_into_the_same_topics(example):
    xml = EXAMPLES[example]
    want_topics, want_skipped = EXPECTED[example]
    imported = import_amps(xml)
    text = to_toml(imported, f"seeds/{example}")
    topics = parse_topics(text) if imported.topics else []
    print(text, *imported.skipped, sep="\n")
    assert [_summary(t) for t in topics] == want_topics
    # every element of every <Topic> is either translated or listed, one line each
    assert len(imported.skipped) == len(want_skipped)
    for line, want in zip(imported.skipped, want_skipped):
        assert line.startswith(want), (line, want)
    assert len(topics) + sum("topic skipped" in s for s in imported.skipped) == \
        xml.count("<Topic>")
    for t in topics:
        if t.chaining:
            assert t.partitions == 1  # a chain stays in one partition


CHAIN_MODULE = """<Modules><Module><Name>chain</Name>
  <Library>/opt/amps/lib/libamps_id_chaining_key_generator.so</Library></Module></Modules>"""


def _config(*topics: str, extra: str = "") -> str:
    return (f"<AMPSConfig><Name>test</Name>{CHAIN_MODULE}<SOW>{''.join(topics)}{extra}</SOW>"
            "</AMPSConfig>")


def _one(topic_xml: str, extra: str = ""):
    imported = import_amps(_config(topic_xml, extra=extra))
    print(to_toml(imported), *imported.skipped, sep="\n")
    return parse_topics(to_toml(imported)), imported.skipped


def test_name_keys_key_domain_and_message_type():
    (t,), skipped = _one("<Topic><Name>ORDERS</Name><Key>/invoice</Key><Key>/customerId</Key>"
                         "<KeyDomain>shared</KeyDomain><MessageType>JSON</MessageType></Topic>")
    assert (t.name, t.key, t.key_domain, t.message_type) == \
        ("ORDERS", ("/invoice", "/customerId"), "shared", "json")
    assert t.expiration == "disabled" and t.hash_index == () and not t.chaining
    assert skipped == []
    (t,), _ = _one("<Topic><Name>fixes</Name><Key>/11</Key><MessageType>fix</MessageType>"
                   "</Topic>")
    assert t.message_type == "fix" and t.key == ("/11",) and t.key_domain == ""  # = name


@pytest.mark.parametrize(("amps", "ours", "ms"), [
    ("30s", "30s", 30_000), ("1h", "1h", 3_600_000), ("5m", "5m", 300_000),
    ("250ms", "250ms", 250), ("2d", "2d", 172_800_000), ("1w", "7d", 604_800_000),
    ("1500us", "2ms", 2), ("3000000ns", "3ms", 3), ("45", "45s", 45_000),
    ("1.5h", "1.5h", 5_400_000), (" 10S ", "10s", 10_000),
])
def test_expiration_durations(amps, ours, ms):
    assert amps_interval(amps) == ours
    (t,), skipped = _one(f"<Topic><Name>T</Name><Key>/k</Key><Expiration>{amps}</Expiration>"
                         "<MessageType>json</MessageType></Topic>")
    assert t.expiration == ours and t.default_ttl_ms == ms and skipped == []
    assert parse_duration_ms(ours) == ms


def test_expiration_enabled_disabled_and_untranslatable():
    for value, want in (("enabled", "enabled"), ("Disabled", "disabled")):
        (t,), _ = _one(f"<Topic><Name>T</Name><Key>/k</Key><Expiration>{value}</Expiration>"
                       "</Topic>")
        assert t.expiration == want
    for bad in ("soon", "10 fortnights", "100ns"):
        (t,), skipped = _one(f"<Topic><Name>T</Name><Key>/k</Key><Expiration>{bad}"
                             "</Expiration></Topic>")
        assert t.expiration == "disabled"  # left out, and said so
        assert len(skipped) == 1 and skipped[0].startswith(
            "SOW/Topic[T]/Expiration: not translated:"), skipped


def test_hash_indexes_each_with_its_keys():
    (t,), skipped = _one("<Topic><Name>T</Name><Key>/id</Key>"
                         "<HashIndex><Key>/region</Key></HashIndex>"
                         "<HashIndex><Key>/a</Key><Key>/b</Key><Unique>true</Unique></HashIndex>"
                         "<HashIndex></HashIndex></Topic>")
    assert t.hash_index == (("/region",), ("/a", "/b"))
    assert skipped == ["SOW/Topic[T]/HashIndex[2]/Unique: not translated",
                       "SOW/Topic[T]/HashIndex[3]: no Key: not translated"]


def test_index_elements_become_range_indexes():
    """AMPS ``<Index>`` (a memo index created ahead of queries) → ``index`` (issue 25.3)."""
    (t,), skipped = _one("<Topic><Name>T</Name><Key>/id</Key><Index>/px</Index>"
                         "<Index>/time</Index><Index>/px</Index><Index></Index></Topic>")
    assert t.index == ("/px", "/time")
    assert skipped == []


def test_history_becomes_a_history_table():
    """AMPS ``<History>`` with ``Window`` and ``Granularity`` → ``history`` (issue 25.1);
    one without a Window, or with a value that is no duration, is listed, not guessed."""
    (t,), skipped = _one("<Topic><Name>T</Name><Key>/id</Key><History><Window>1w</Window>"
                         "<Granularity>1s</Granularity></History></Topic>")
    assert (t.history_window, t.history_granularity) == ("7d", "1s") and skipped == []
    (t,), skipped = _one("<Topic><Name>T</Name><Key>/id</Key><History><Granularity>1s"
                         "</Granularity></History></Topic>")
    assert t.history_window == ""
    assert skipped == ["SOW/Topic[T]/History: not translated: no Window"]
    (t,), skipped = _one("<Topic><Name>T</Name><Key>/id</Key><History><Window>enabled"
                         "</Window></History></Topic>")
    assert skipped == ["SOW/Topic[T]/History: not translated: Window and Granularity are "
                       "durations"]


def test_chaining_key_generator_primary_key_secondary_validation():
    (t,), skipped = _one("""<Topic><Name>Chains</Name><MessageType>fix</MessageType>
        <KeyGenerator><Module>chain</Module><Options><Key>/11</Key><Key>/41</Key>
          <Validation>true</Validation><FileName>x.chain</FileName></Options></KeyGenerator>
        </Topic>""")
    assert t.chaining and (t.chain_primary, t.chain_secondary) == ("/11", ("/41",))
    assert t.chain_validation and t.partitions == 1 and t.key == ()
    assert skipped == ["SOW/Topic[Chains]/KeyGenerator/Options/FileName: not translated "
                       "(the chain table lives in Redis)"]
    # Primary names the primary field; Key and Secondary are secondary fields (seeds/003)
    (t,), skipped = _one("""<Topic><Name>Docs</Name><MessageType>json</MessageType>
        <KeyGenerator><Module>chain</Module><Options><Key>/Parent</Key>
          <Primary>/Doc</Primary><Secondary>/Related</Secondary><Validation>0</Validation>
        </Options></KeyGenerator></Topic>""")
    assert (t.chain_primary, t.chain_secondary) == ("/Doc", ("/Parent", "/Related"))
    assert not t.chain_validation and skipped == []


def test_chaining_module_found_by_its_library_and_topic_keys_listed():
    xml = """<AMPSConfig><Modules><Module><Name>ids</Name>
      <Library>libamps_id_chaining_key_generator.so</Library></Module></Modules>
      <SOW><Topic><Name>C</Name><Key>/x</Key><KeyGenerator><Module>ids</Module>
        <Options><Key>/1</Key><Secondary>/2</Secondary></Options><Extra/></KeyGenerator>
      </Topic></SOW></AMPSConfig>"""
    imported = import_amps(xml)
    (t,) = parse_topics(to_toml(imported))
    assert (t.chain_primary, t.chain_secondary) == ("/1", ("/2",))
    assert imported.skipped == [
        "SOW/Topic[C]/KeyGenerator/Extra: not translated",
        "SOW/Topic[C]/Key: not translated (the KeyGenerator makes the SOW key)"]


def test_untranslatable_topics_and_elements_are_listed_one_line_each():
    imported = import_amps(_config(
        "<Topic><Name>A</Name><FileName>sow/%n.sow</FileName><Key>/id</Key>"
        "<SlabSize>1MB</SlabSize><Durability>persistent</Durability></Topic>",
        "<Topic><Name>X</Name><Key>/id</Key><MessageType>bson</MessageType></Topic>",
        "<Topic><Name>Custom</Name><KeyGenerator><Module>mine</Module></KeyGenerator></Topic>",
        "<Topic><Name>Lonely</Name><KeyGenerator><Module>chain</Module><Options>"
        "<Key>/1</Key></Options></KeyGenerator></Topic>",
        "<Topic><Key>/nameless</Key></Topic>",
        "<Topic><Name>A</Name><Key>/id</Key><MessageType>fix</MessageType></Topic>",
        "<Topic><Name>bad name!</Name><Key>/id</Key></Topic>",
        extra="<View><Name>V</Name><Topic>V</Topic></View><ConflatedTopic><Name>C</Name>"
              "</ConflatedTopic>"))
    skipped = imported.skipped
    print(*skipped, sep="\n")
    assert [t["name"] for t in imported.topics] == ["A"]
    assert skipped[:3] == [  # views and conflated topics: tests/test_amps_import_views.py
        "SOW/View[V]/Topic: not translated",
        "SOW/View[V]: no UnderlyingTopic: skipped",
        "SOW/ConflatedTopic[C]: no UnderlyingTopic: skipped"]
    rest = skipped[3:]
    for needle in ("SOW/Topic[A]/FileName: not translated",
                   "SOW/Topic[A]/SlabSize: not translated",
                   "SOW/Topic[X]: MessageType 'bson' is not supported (json, fix, xml): "
                   "topic skipped",
                   "SOW/Topic[Custom]: KeyGenerator module 'mine' is not the chaining key "
                   "generator: topic skipped",
                   "SOW/Topic[Lonely]: 'key_generator': the chaining key generator needs a "
                   "primary field and at least one secondary field",
                   "SOW/Topic[5]: no Name: topic skipped",
                   "SOW/Topic[A]: a topic of this name is already imported",
                   "SOW/Topic[bad name!]: 'name' must be"):
        assert sum(line.startswith(needle) for line in rest) == 1, needle
    assert len(rest) == 8
    assert all("\n" not in line for line in skipped)


def test_documentation_excerpts_with_placeholders_are_read_block_by_block():
    text = """Some prose. <AMPSConfig>\n    ...\n<Modules>\n  ...\n  <Module><Name>kc</Name>
    <Library>libamps_id_chaining_key_generator.so</Library></Module></Modules>
    <SOW>\n    ...\n    <Topic><Name>O</Name><KeyGenerator><Module>kc</Module><Options>
    <Key>/a</Key><Key>/b</Key></Options></KeyGenerator></Topic></SOW>
    more prose"""
    imported = import_amps(text)
    (t,) = parse_topics(to_toml(imported))
    assert (t.name, t.chain_primary, t.chain_secondary) == ("O", "/a", ("/b",))
    assert imported.skipped[0].startswith("(document): not well-formed XML as a whole")


def test_bad_input_is_one_clear_error(tmp_path, url):
    with pytest.raises(ConfigError, match="no <SOW> section"):
        import_amps("<AMPSConfig/>")
    with pytest.raises(ConfigError, match="not well-formed"):
        import_amps("<SOW><Topic><Name>x</Topic></SOW>")
    with pytest.raises(ConfigError, match="DOCTYPE or ENTITY"):
        import_amps('<!DOCTYPE x [<!ENTITY a "b">]><SOW></SOW>')
    for content, message in (("<SOW><Topic>", b"not well-formed"),
                             ("<SOW><Topic><Name>x</Name><MessageType>bson</MessageType>"
                              "</Topic></SOW>", b"no SOW topic could be translated")):
        f = tmp_path / "bad.xml"
        f.write_text(content)
        out = run_cli(url, "config", "import-amps", str(f), check=False, timeout=60)
        print(out.stderr.decode())
        assert out.returncode == 1 and message in out.stderr
        assert b"Traceback" not in out.stderr and out.stdout == b""
    out = run_cli(url, "config", "import-amps", str(tmp_path / "missing.xml"), check=False,
                  timeout=60)
    assert out.returncode == 1 and out.stderr.count(b"\n") == 1 and b"cannot read" in out.stderr


def test_cli_writes_the_toml_lists_what_it_skipped_and_the_result_applies(tmp_path, url,
                                                                        topic_name):
    src = tmp_path / "amps.xml"
    src.write_text(_config(
        f"<Topic><Name>{topic_name}</Name><FileName>sow/%n.sow</FileName><Key>/id</Key>"
        "<MessageType>json</MessageType><Expiration>1h</Expiration>"
        "<HashIndex><Key>/region</Key></HashIndex></Topic>",
        f"<Topic><Name>{topic_name}_chain</Name><MessageType>fix</MessageType><KeyGenerator>"
        "<Module>chain</Module><Options><Key>/11</Key><Key>/41</Key></Options></KeyGenerator>"
        "</Topic>"))
    out_toml = tmp_path / "sow.toml"
    out = run_cli(url, "config", "import-amps", str(src), "-o", str(out_toml))
    err = out.stderr.decode().splitlines()
    print(out_toml.read_text(), *err, sep="\n")
    assert err == [f"{src}: SOW/Topic[{topic_name}]/FileName: not translated (AMPS storage or "
                   "tuning setting)", f"wrote 2 topic(s) to {out_toml}"]
    # stdout when no -o: the same TOML
    assert run_cli(url, "config", "import-amps", str(src)).stdout.decode() == \
        out_toml.read_text()
    applied = run_cli(url, "config", "apply", str(out_toml))
    assert f"{topic_name}, {topic_name}_chain" in applied.stdout.decode()
    run_cli(url, "publish", "-t", topic_name, input=b'{"id": 1, "region": "eu"}\n'
            b'{"id": 1, "region": "us"}\n')
    run_cli(url, "worker", "--burst")
    rows = run_cli(url, "sow", "-t", topic_name).stdout.decode().splitlines()
    assert len(rows) == 1 and '"us"' in rows[0]


def test_durability_and_recovery_point():
    """``Durability`` transient → ``persistence``, with its ``RecoveryPoint`` (epoch, now, an
    AMPS timestamp in UTC); persistent is the default; a bookmark, another durability, or a
    recovery point of a persistent topic are listed (seeds/004, "Durability")."""
    (t,), skipped = _one("<Topic><Name>T</Name><Key>/k</Key><Durability>Transient</Durability>"
                         "<RecoveryPoint>20261127T060000</RecoveryPoint></Topic>")
    assert (t.persistence, t.recovery_point, skipped) == \
        ("transient", "2026-11-27T06:00:00Z", [])
    assert t.recovery_ms == 1_795_759_200_000
    for point in ("NOW", "epoch"):
        (t,), _ = _one(f"<Topic><Name>T</Name><Key>/k</Key><Durability>transient</Durability>"
                       f"<RecoveryPoint>{point}</RecoveryPoint></Topic>")
        assert (t.persistence, t.recovery_point) == ("transient", point.lower())
    (t,), skipped = _one("<Topic><Name>T</Name><Key>/k</Key><Durability>persistent</Durability>"
                         "<RecoveryPoint>now</RecoveryPoint></Topic>")
    assert (t.persistence, t.recovery_point) == ("persistent", "epoch")
    assert skipped == ["SOW/Topic[T]/RecoveryPoint: not translated: applies to a transient "
                       "topic only"]
    (t,), skipped = _one("<Topic><Name>T</Name><Key>/k</Key><Durability>transient</Durability>"
                         "<RecoveryPoint>1|42|</RecoveryPoint></Topic>")
    assert (t.persistence, t.recovery_point) == ("transient", "epoch")
    assert len(skipped) == 1 and skipped[0].startswith("SOW/Topic[T]/RecoveryPoint: not")
    (t,), skipped = _one("<Topic><Name>T</Name><Key>/k</Key><Durability>mmap</Durability>"
                         "</Topic>")
    assert t.persistence == "persistent" and skipped == [
        "SOW/Topic[T]/Durability: not translated: 'mmap' is neither persistent nor transient"]
