"""Topic configuration validation, SOW key rules, Lua script headers."""

from __future__ import annotations

import re

import pytest

from sow_redis import keys, sowkey
from sow_redis.config import parse_topics
from sow_redis.errors import ConfigError
from sow_redis.scripts import script_names, script_source


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
message_type = "xml"
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
    assert "sow.toml: topic #3 'ok': topic defined twice" in p
    assert len(p) == 6


def test_config_not_toml_and_empty():
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_topics("[[topic]\nname=", "x.toml")
    with pytest.raises(ConfigError, match=r"no \[\[topic\]\] table"):
        parse_topics("", "x.toml")


def test_invalid_config_stores_nothing(sow):
    from sow_redis.config import load_topics

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
    assert {k[: k.index("}") + 1] for k in ks} == {"{sow:orders:3}"}


@pytest.mark.parametrize("name", script_names())
def test_lua_headers_match_keys_and_argv_used(name):
    src = script_source(name)
    header, _, body = src.partition("]]")
    assert header.startswith("--[[") and "Input:" in header and "Output:" in header
    for kind in ("KEYS", "ARGV"):
        used = {int(n) for n in re.findall(kind + r"\[(\d+)\]", body)}
        documented = {int(n) for n in re.findall(kind + r"\[(\d+)\]", header)}
        assert used <= documented, f"{name}: {kind} {sorted(used - documented)} not in header"
    assert "..\"}" not in body and "keys." not in body  # scripts never build key names
