"""Topic configuration validation, SOW key rules, Lua script headers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sow_redis import keys
from sow_redis.apply.scripts import script_names, script_source
from sow_redis.config import parse_topics
from sow_redis.errors import ConfigError
from sow_redis.model import sowkey


def test_valid_config_defaults():
    (t,) = parse_topics('[[topic]]\nname = "orders"\nkey = ["/orderId", "/customer/id"]\n')
    assert t.key == ("/orderId", "/customer/id")
    assert t.domain == "orders" and t.partitions == 8 and t.message_type == "json"
    assert t.key_parts == (("orderId",), ("customer", "id"))


def test_invalid_config_reports_every_problem_with_file_topic_field():
    text = '''
[[topic]]
name = "ok"
key = ["/a"]

[[topic]]
name = "bad"
key = ["nope"]
partitions = 0
message_type = "protobuf"
hash_index = [[]]
colour = "red"

[[topic]]
name = "ok"
'''
    with pytest.raises(ConfigError) as e:
        parse_topics(text, source="sow.toml")
    p = e.value.problems
    assert "sow.toml: topic #2 'bad': 'key': field path must look like /name or /a/b, got 'nope'" in p
    assert "sow.toml: topic #2 'bad': 'partitions' must be an integer from 1 to 1024" in p
    assert any("'message_type' must be one of json" in x for x in p)
    assert any("'hash_index': an index needs at least one field path" in x for x in p)
    assert "sow.toml: topic #2 'bad': unknown field 'colour'" in p
    assert ("sow.toml: topic #3 'ok': topic defined twice (also topic #1, message_type json)"
            in p)
    assert len(p) == 6


def test_config_not_toml_and_empty():
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_topics("[[topic]\nname=", "x.toml")
    with pytest.raises(ConfigError, match=r"no \[\[topic\]\] table"):
        parse_topics("", "x.toml")


def test_invalid_config_stores_nothing(sow):
    from sow_redis.registry import load_topics

    before = load_topics(sow.r)
    with pytest.raises(ConfigError):
        sow.apply_config('[[topic]]\nname = "fine1"\nkey=["/a"]\n[[topic]]\nname = "x y"\n')
    assert load_topics(sow.r) == before


def test_generated_keys_follow_seed_004():
    k = sowkey.generate("orders", ["1"])
    assert k == sowkey.generate("orders", ["1"])           # same values + domain: same key
    assert k != sowkey.generate("orders", ["2"])           # different values: different keys
    assert k != sowkey.generate("other", ["1"])            # different domain: different key
    assert sowkey.generate("d", ["a", "bc"]) != sowkey.generate("d", ["ab", "c"])
    assert re.fullmatch(r"[0-9a-f]{32}", k)


def test_user_keys_base64_only():
    assert sowkey.is_valid_user_key("QUJD+/09==")
    for bad in ("", "a b", "a:b", "ü", "a,b", "x" * 513):
        assert not sowkey.is_valid_user_key(bad)


def test_partition_keys_share_one_hash_tag():
    ks = keys.partition_keys("orders", 3, 2) + [keys.log("orders", 3), keys.lease("orders", 3)]
    tag = keys.partition_tag("orders", 3)
    assert {k[: k.index("}") + 1] for k in ks} == {tag}
    assert tag.startswith("{sow:orders:3:") and len(tag) == len("{sow:orders:3:}") + 4


def test_partitions_are_spread_evenly_over_the_hash_slots():
    """Partition p of a topic lies in slot (CRC16(topic) + p × 16384 × 0.618…) mod 16384 (Redis's
    own key hash agrees), so 3 primaries owning equal slot ranges get even shares."""
    import random

    from redis.crc import key_slot

    rng = random.Random(5)
    worst = {}
    for _ in range(200):
        name = "t%d" % rng.randrange(10**9)
        for p in range(48):
            assert key_slot(keys.log(name, p).encode()) == keys.partition_slot(name, p)
        for n in (4, 12, 48):
            per_node = [0, 0, 0]
            for p in range(n):
                per_node[keys.partition_slot(name, p) * 3 // keys.SLOTS] += 1
            worst[n] = max(worst.get(n, 0), max(per_node))
    print("busiest of 3 primaries, worst of 200 topics:", worst)
    # by hash alone (before): 4, 9 and 26 at worst for the same counts
    assert worst == {4: 2, 12: 5, 48: 18}


def test_each_slot_has_the_first_salt_in_order_with_its_crc():
    """A partition's salt (the 4 characters of its hash tag) is, for every one of the 16,384
    values of the CRC16's low 14 bits, the first salt in alphabet order with that value: the
    salts' halves find the same as a search of every salt in order (the keys of every stored
    topic depend on it)."""
    import binascii
    import itertools

    first: dict[int, str] = {}
    for combo in itertools.product(keys._SALT_ALPHABET, repeat=keys._SALT_LEN):
        salt = bytes(combo)
        first.setdefault(binascii.crc_hqx(salt, 0) & (keys.SLOTS - 1), salt.decode())
        if len(first) == keys.SLOTS:
            break
    assert len(first) == keys.SLOTS
    assert [keys._salt(low) for low in range(keys.SLOTS)] == [first[low] for low in range(
        keys.SLOTS)]
    assert keys.partition_tag("orders", 3) == "{sow:orders:3:%s}" % keys._salt(
        (binascii.crc_hqx(b"sow:orders:3:\0\0\0\0", 0) ^ keys.partition_slot("orders", 3))
        & (keys.SLOTS - 1))


@pytest.mark.parametrize("name", script_names())
def test_lua_headers_match_keys_and_argv_used(name):
    src = script_source(name)
    if src.startswith("#!lua"):  # script flags (delete_now.lua: allow-oom) come first
        src = src.split("\n", 1)[1]
    header, _, body = src.partition("]]")
    assert header.startswith("--[[") and "Input:" in header and "Output:" in header
    for kind in ("KEYS", "ARGV"):
        used = {int(n) for n in re.findall(kind + r"\[(\d+)\]", body)}
        documented = {int(n) for n in re.findall(kind + r"\[(\d+)\]", header)}
        assert used <= documented, f"{name}: {kind} {sorted(used - documented)} not in header"
    assert "..\"}" not in body and "keys." not in body  # scripts never build key names


INCLUDES = sorted(p.stem for p in (Path(__file__).parent.parent / "sow_redis" / "apply" / "lua"
                                   / "include").glob("*.lua"))


@pytest.mark.parametrize("name", INCLUDES)
def test_lua_includes_document_the_arguments_they_read(name):
    """An operation's own arguments (``ARGV[OP + i]``, include partition) are documented in
    its include's header; no include reads KEYS by position but include partition."""
    header, _, body = script_source(f"include/{name}").partition("]]")
    used = {int(n) for n in re.findall(r"ARGV\[OP \+ (\d+)\]", body)}
    documented = {int(n) for n in re.findall(r"ARGV\[OP \+ (\d+)", header)}
    assert used <= documented, f"{name}: ARGV[OP + {sorted(used - documented)}] not in header"
    if name != "partition":
        assert not re.findall(r"KEYS\[\d", body), name
    assert "..\"}" not in body and "keys." not in body


# -- wrong shapes and types (issues 8.10, 7.12, 7.5) ------------------------------------
@pytest.mark.parametrize("line, problem", [
    ('key = "/orderId"',
     "'key' must be a list of field paths like [\"/orderId\"], got a string"),
    ('hash_index = ["/sym"]',
     "'hash_index' must be a list of lists of field paths like [[\"/region\"]], got an array "
     "of strings"),
    ("expiration = inf", "'expiration' must be a duration, \"enabled\" or \"disabled\": a "
     "duration must be a finite number, got inf"),
    ("idle_expiration = inf", "'idle_expiration': a duration must be a finite number, got inf"),
    ("expiration = nan", "got nan"),
    ("expiration = 1e16", "a duration can be at most 100 years (36525d), got 1e+16"),
    ('expiration = "36526d"', "at most 100 years"),
    ("idle_expiration = 3155760001", "at most 100 years"),
    ("max_message_bytes = 9999999999", "'max_message_bytes' must be an integer from 16 to"),
])
def test_wrong_shape_one_line_naming_file_topic_field(line, problem):
    with pytest.raises(ConfigError) as e:
        parse_topics(f'[[topic]]\nname = "orders"\n{line}\n', source="sow.toml")
    assert len(e.value.problems) == 1
    assert e.value.problems[0].startswith("sow.toml: topic #1 'orders': ")
    assert problem in e.value.problems[0]


@pytest.mark.parametrize("text", ['topic = ["a"]\n', "topic = [1, 2]\n", 'topic = "x"\n',
                                  "topic = [[1]]\n", "[topic]\nname = 'a'\n"])
def test_topic_not_an_array_of_tables(text):
    with pytest.raises(ConfigError) as e:
        parse_topics(text, source="sow.toml")
    assert all(p.startswith("sow.toml: ") for p in e.value.problems)


def test_longest_durations_fit_and_store_as_they_parse():
    (a, b, c) = parse_topics('[[topic]]\nname = "a"\nexpiration = "36525d"\n'
                             '[[topic]]\nname = "b"\nexpiration = 3155760000\n'
                             'idle_expiration = 1.5e3\n'
                             '[[topic]]\nname = "c"\nexpiration = 1e-3\n')
    from sow_redis.model.topic import MAX_DURATION_MS, TopicConfig

    assert a.default_ttl_ms == b.default_ttl_ms == MAX_DURATION_MS == 3_155_760_000_000
    assert b.idle_ms == 1_500_000 and c.default_ttl_ms == 1
    for t in (a, b, c):  # what workers read back from the registry parses the same
        back = TopicConfig.from_json(t.to_json())
        assert (back.default_ttl_ms, back.idle_ms) == (t.default_ttl_ms, t.idle_ms)


def test_longest_expiration_publishes(sow, topic_name):
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\nexpiration = "36525d"\n')
    res = sow.publish(topic_name, {"k": 1}, wait=True, timeout=30)
    (rec,) = sow.sow(topic_name)
    sid_ms = int(next(iter(res.last_ids.values())).split("-")[0])
    assert rec.expiry_ms == sid_ms + 3_155_760_000_000
    assert sow.errors(topic_name) == []


# Every TOML value kind; each field accepts only some of them.
KINDS = {
    "str": '"x"', "path": '"/a"', "int": "8", "float": "1.5", "inf": "inf", "-inf": "-inf",
    "nan": "nan", "bool": "true", "datetime": "1979-05-27T07:32:00Z", "date": "1979-05-27",
    "empty": "[]", "paths": '["/a"]', "ints": "[1, 2]", "nested": '[["/a"]]',
    "mixed": '[["/a"], "/b"]', "table": "{ a = 1 }", "tables": "[{ a = 1 }]",
}
ACCEPTED_TYPES = {  # kinds whose TOML type a field takes (the value may still be refused)
    "name": {"str", "path"}, "key_domain": {"str", "path"}, "message_type": {"str", "path"},
    "expiration_policy": {"str", "path"}, "dead_letter": {"str", "path"},
    "field_separator": {"str", "path"},
    "key": {"empty", "paths"}, "partition_by": {"empty", "paths"},
    "skip_msg_types": {"empty", "paths"},
    "hash_index": {"empty", "nested"},
    "partitions": {"int"}, "max_message_bytes": {"int"},
    "expiration": {"str", "path", "int", "float"},  # inf, nan: refused as values
    "idle_expiration": {"str", "path", "int", "float"},
    "key_generator": {"table"},
}


def type_problems(text: str, accepted: bool, source: str = "<config>") -> list[str] | None:
    """None if the value's type is ``accepted`` (parse_topics may still refuse the value
    itself, e.g. a negative duration: only a ConfigError is allowed); else the problems of the
    ConfigError that parse_topics must raise for ``text``."""
    if accepted:
        try:
            parse_topics(text, source=source)
        except ConfigError:
            pass
        return None
    with pytest.raises(ConfigError) as e:
        parse_topics(text, source=source)
    return e.value.problems


@pytest.mark.parametrize("field", sorted(ACCEPTED_TYPES))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_field_refuses_every_wrong_type(field, kind):
    name = "" if field == "name" else 'name = "t"\n'
    text = f'[[topic]]\n{name}{field} = {KINDS[kind]}\n'
    problems = type_problems(text, kind in ACCEPTED_TYPES[field], source="f.toml")
    if problems is not None:
        # one line naming the field (a float inf / nan passes the type check of a duration
        # and is then refused as a value)
        assert any(p.startswith("f.toml: topic #1") and f"'{field}'" in p
                   for p in problems), problems


KEY_GENERATOR_ACCEPTED = {"type": {"str", "path"}, "primary": {"str", "path", "empty", "paths"},
                          "secondary": {"empty", "paths"}, "validation": {"bool"}}


@pytest.mark.parametrize("sub", sorted(KEY_GENERATOR_ACCEPTED))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_key_generator_fields_refuse_wrong_types(sub, kind):
    chaining = "" if sub == "type" else 'type = "chaining", '
    text = (f'[[topic]]\nname = "t"\nkey = ["/x", "/y"]\n'
            f'key_generator = {{ {chaining}{sub} = {KINDS[kind]} }}\n')
    problems = type_problems(text, kind in KEY_GENERATOR_ACCEPTED[sub])
    if problems is not None:
        assert any(f"'key_generator.{sub}' must be" in p for p in problems), problems


def _toml(v):
    """TOML inline text of a Python value (strings as JSON text: valid TOML basic strings)."""
    import json
    import math

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) \
            else repr(v)
    if isinstance(v, (int, str)):
        return json.dumps(v, ensure_ascii=False) if isinstance(v, str) else str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(x)}" for k, x in v.items()) + " }"


def test_any_value_in_any_field_is_a_topic_or_a_config_error():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from sow_redis.model.topic import TopicConfig

    text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12)
    specials = st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e16, 2**63 - 1,
                                -1, 0, 0.5, "/a", "/11", "30s", "36526d", "enabled", "chaining",
                                "fix", "min", "", "SOH", "1e400"])
    scalars = (specials | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats()
               | text)
    values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=3)
                          | st.dictionaries(st.sampled_from(["type", "primary", "secondary",
                                                             "validation", "x"]), kids,
                                            max_size=3), max_leaves=6)
    fields = st.dictionaries(st.sampled_from(sorted(ACCEPTED_TYPES)), values, max_size=4)

    @settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
    @given(fields, st.none() | values)
    def check(table, whole):
        body = "".join(f"{k} = {_toml(v)}\n" for k, v in table.items())
        if "name" not in table:
            body = 'name = "t"\n' + body
        # sometimes the whole "topic" entry is an arbitrary value instead of a table
        doc = "[[topic]]\n" + body if whole is None else f"topic = {_toml(whole)}\n"
        try:
            topics = parse_topics(doc)
        except ConfigError as exc:
            assert exc.problems and all(isinstance(p, str) for p in exc.problems)
            return
        for t in topics:  # stored and read back by workers: every derived value computes
            back = TopicConfig.from_json(t.to_json())
            assert back == t
            _ = (back.default_ttl_ms, back.idle_ms, back.partition_parts, back.index_parts)

    check()


def test_invalid_utf8_file_one_line(url, tmp_path):
    from conftest import run_cli

    path = tmp_path / "bad.toml"
    path.write_bytes(b'[[topic]]\nname = "\xff\xfe"\n')
    proc = run_cli(url, "config", "apply", str(path), check=False)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "Traceback" not in err
    assert err == (f"error: {path}: not UTF-8 text (TOML files are UTF-8): invalid byte 0xff "
                   "at offset 18\n")


def test_dead_letter_must_be_defined(sow, topic_name):
    from sow_redis.registry import load_topics

    before = load_topics(sow.r)
    with pytest.raises(ConfigError) as e:
        sow.apply_config(f'[[topic]]\nname = "{topic_name}"\ndead_letter = "nowhere"\n')
    assert e.value.problems == [
        f"<config>: topic '{topic_name}': 'dead_letter' names topic 'nowhere', which is "
        "neither in this file nor in the registry"]
    assert load_topics(sow.r) == before
    with pytest.raises(ConfigError, match="'dead_letter' cannot be the topic itself"):
        sow.apply_config(f'[[topic]]\nname = "{topic_name}"\ndead_letter = "{topic_name}"\n')
    # defined in the same file, or already in the registry
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\ndead_letter = "{topic_name}x"\n'
                     f'[[topic]]\nname = "{topic_name}x"\n')
    sow.apply_config(f'[[topic]]\nname = "{topic_name}y"\ndead_letter = "{topic_name}x"\n')
    assert load_topics(sow.r)[f"{topic_name}y"].dead_letter == f"{topic_name}x"


def test_dead_letter_undefined_cli_one_line(url, topic_name, tmp_path):
    from conftest import run_cli

    path = tmp_path / "sow.toml"
    path.write_text(f'[[topic]]\nname = "{topic_name}"\ndead_letter = "nowhere"\n')
    proc = run_cli(url, "config", "apply", str(path), check=False)
    assert proc.returncode == 1 and proc.stderr.decode() == (
        f"error: {path}: topic '{topic_name}': 'dead_letter' names topic 'nowhere', which is "
        "neither in this file nor in the registry\n")
    proc = run_cli(url, "config", "show")
    assert topic_name not in proc.stdout.decode()


def test_topic_names_are_validated_whole():
    """A trailing newline is not part of a valid name (the check's `$` matched before it)."""
    from sow_redis.config import parse_topics

    with pytest.raises(ConfigError, match="name"):
        parse_topics('[[topic]]\nname = "orders\\n"\nkey = ["/k"]\n')
    with pytest.raises(ConfigError, match="dead_letter"):
        parse_topics('[[topic]]\nname = "orders"\nkey = ["/k"]\ndead_letter = "dl\\n"\n')


def test_a_name_defined_for_two_message_types_is_refused_in_one_line():
    """AMPS scopes a topic by name and message type; sow_redis by name alone (issue 25.7):
    a json and an xml topic of one name are one clear problem naming both definitions."""
    text = ('[[topic]]\nname = "alerts"\nkey = ["/id"]\n\n'
            '[[topic]]\nname = "alerts"\nkey = ["/id"]\nmessage_type = "xml"\n\n'
            '[[topic]]\nname = "alerts"\nkey = ["/n"]\n')
    with pytest.raises(ConfigError) as e:
        parse_topics(text, source="sow.toml")
    assert e.value.problems == [
        "sow.toml: topic #2 'alerts': topic defined twice (also topic #1, message_type json; "
        "this one message_type xml): sow_redis scopes topics by name alone, not by name and "
        "message type as AMPS does: rename one",
        "sow.toml: topic #3 'alerts': topic defined twice (also topic #1, message_type json)"]


def test_the_configuration_guide_has_one_row_per_topic_field():
    """docs/configuration.md's topic table shows every [[topic]] field the parser takes,
    each once, and no other (issue 25: the configuration guide shows each option once)."""
    import re
    from pathlib import Path

    from sow_redis.config import _SHAPES

    text = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
    start = text.index("| field | meaning | default |")
    rows = text[start:text.index("\n\n", start)].splitlines()[2:]
    fields = [m.group(1) for row in rows if (m := re.match(r"\| `([a-z_]+)` \|", row))]
    assert len(fields) == len(rows)
    assert sorted(fields) == sorted(_SHAPES), set(fields) ^ set(_SHAPES)
