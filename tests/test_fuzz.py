"""Property-based fuzzing (issue 12 item 4) of the filter parser, the JSON and FIX message
paths (publisher and worker) and the config loader: every input gives a result or one clear
error of sow_redis's own (a :class:`~sow_redis.errors.SowError` with a one-line message), never
another exception.

CI runs at most 300 examples per test; ``SOW_FUZZ_EXAMPLES=5000 pytest tests/test_fuzz.py``
runs more locally.
"""

from __future__ import annotations

import json
import os
import uuid

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sow_redis.config import parse_topics
from sow_redis.errors import ConfigError, FilterEvalError, FilterSyntaxError, MessageError
from sow_redis.query.filter import compile_filter

EXAMPLES = int(os.environ.get("SOW_FUZZ_EXAMPLES", "300"))
"""Examples per fuzz test (CI: 300; more with SOW_FUZZ_EXAMPLES)."""


def fuzz(examples: int = EXAMPLES):
    """Hypothesis settings of these tests: no deadline (a loaded CI machine is slow), no
    health checks about slow data generation."""
    return settings(max_examples=min(examples, EXAMPLES) if "SOW_FUZZ_EXAMPLES" not in os.environ
                    else EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


def one_line(exc: Exception) -> None:
    text = str(exc)
    assert text and "\n" not in text and "\r" not in text, repr(text)


# every character, lone surrogates included (what undecodable argv bytes become)
any_text = st.text(st.characters(blacklist_categories=()), max_size=80)

json_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=6) | st.sampled_from(
                               ["k", "s", "a", "$sow", "data"]), kids, max_size=4),
                           max_leaves=12)
records = st.dictionaries(st.sampled_from(["a", "b", "s", "n", "x"]), json_values, max_size=5)


# -- the filter parser --------------------------------------------------------------------------
FILTER_TOKENS = [
    "/a", "/b", "/s", "/a/b", "/n/0", "/", "//", "/1x", "=", "!=", "<>", "<", "<=", ">", ">=",
    "AND", "OR", "NOT", "(", ")", "((", "))", "IN", "BETWEEN", "LIKE", "IS", "NULL", "TRUE",
    "FALSE", "+", "-", "*", "%", ",", "'x'", "'a''b'", "'", '"', '"y"', "''", "'(a+)+$'",
    "'(?<=a)b'", "'\\1'", "'['", "1", "0", "-1.5e308", "1e999", "0x10", "9" * 30, "UPPER",
    "LOWER", "LEN", "ABS", "COALESCE", "EVAL", "__import__", "'os.system'", ";", "\\", "\n",
]


@fuzz()
@given(st.lists(st.sampled_from(FILTER_TOKENS), max_size=25) | any_text.map(lambda t: [t]),
       st.lists(records, min_size=1, max_size=3))
def test_filter_parser_gives_a_filter_or_a_one_line_syntax_error(tokens, recs):
    text = " ".join(tokens)
    try:
        f = compile_filter(text)
    except FilterSyntaxError as exc:
        one_line(exc)
        return
    for rec in recs:
        try:
            got = f.evaluate(rec)
        except FilterEvalError as exc:
            one_line(exc)
            continue
        assert f(rec) is (got is True)
    assert f.equality_terms() is None or isinstance(f.equality_terms(), dict)


# -- the JSON message path: publisher -----------------------------------------------------------
def _topic(extra: str = "", message_type: str = "json"):
    (t,) = parse_topics('[[topic]]\nname = "t"\npartitions = 4\n'
                        + ('key = ["/k"]\nhash_index = [["/s"], ["/s", "/a"]]\n'
                           if message_type == "json" else 'message_type = "fix"\n'
                           'key = ["/11"]\n') + extra)
    return t


JSON_TOPIC = _topic("max_message_bytes = 4096\nexpiration = \"enabled\"\n")
KEYLESS = parse_topics('[[topic]]\nname = "u"\n')[0]


def _dumps(v) -> bytes:
    """JSON text of ``v`` (the standard library: it writes integers beyond 64 bits, which a
    message may hold and the decoder must refuse)."""
    return json.dumps(v).encode()


def _mutate(data: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    out = bytearray(data)
    for pos, cut, ins in edits:
        if out:
            pos %= len(out)
        out[pos:pos + cut] = ins
    return bytes(out)


json_lines = st.one_of(
    st.binary(max_size=120),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda v, k: _dumps({"k": k, **(v if isinstance(v, dict) else {"v": v})}),
              json_values, json_scalars),
    st.builds(lambda opts, data: _dumps({"$sow": opts, "data": data}),
              st.dictionaries(st.sampled_from(["expiration", "sow_key", "x"]), json_scalars,
                              max_size=3), json_values),
    st.builds(_mutate, json_values.map(lambda v: _dumps({"k": 1, "v": v})),
              st.lists(st.tuples(st.integers(0, 200), st.integers(0, 3),
                                 st.binary(max_size=3)), min_size=1, max_size=4)),
)


@fuzz()
@given(json_lines, st.sampled_from(["publish", "delta_publish", "sow_delete"]),
       st.none() | st.text(max_size=8), st.none() | st.floats() | st.integers())
def test_json_publish_path_gives_an_entry_or_one_message_error(data, cmd, sow_key, expiration):
    from sow_redis.publish.append import prepare

    for topic in (JSON_TOPIC, KEYLESS):
        try:
            got = prepare(topic, (cmd, data, sow_key, expiration))
        except MessageError as exc:
            one_line(exc)
            assert exc.reason and exc.reason.replace("_", "").isalpha()
            continue
        assert got is not None
        p, fields = got
        assert 0 <= p < topic.partitions and fields["cmd"] == cmd


# -- the FIX message path: publisher ------------------------------------------------------------
FIX_TOPIC = _topic(message_type="fix")
FIX_TAGS = [b"8", b"9", b"10", b"35", b"11", b"41", b"55", b"95", b"96", b"0", b"x", b""]
fix_fields = st.tuples(st.sampled_from(FIX_TAGS) | st.integers(0, 10**12).map(
    lambda n: str(n).encode()), st.sampled_from([b"=", b"", b"=="]),
    st.binary(max_size=8) | st.sampled_from([b"D", b"0", b"FIX.4.4", b"3", b"\x01\x01"]))
fix_lines = st.one_of(
    st.binary(max_size=120),
    st.builds(lambda fs, sep, head: head + sep.join(t + e + v for t, e, v in fs),
              st.lists(fix_fields, max_size=12), st.sampled_from([b"\x01", b"|", b";"]),
              st.sampled_from([b"8=FIX.4.4\x01", b"", b"junk 8=FIX.4.2|", b"8=FIX"])),
)


@fuzz()
@given(fix_lines, st.sampled_from([None, b"|", b";"]))
@example(b"8=FIX.4.4\x0135=D\x0135=8\x0111=A\x01", None)  # found: two MsgTypes, TypeError
@example(b'{"35": ["0"], "11": "A"}', None)
def test_fix_publish_path_gives_an_entry_a_skip_or_one_message_error(line, sep):
    from sow_redis.publish.append import prepare

    try:
        got = prepare(FIX_TOPIC, ("publish", line, None), sep)
    except MessageError as exc:
        one_line(exc)
        assert exc.reason in ("bad_fix", "bad_json", "not_object", "missing_key_field",
                              "too_deep", "number_out_of_range", "bad_key_type", "empty",
                              "bad_envelope", "bad_sow_key", "too_large", "bad_key"), exc
        return
    if got is not None:
        data = got[1]["data"]
        assert isinstance(orjson.loads(data), dict)


# -- the worker path: any log entry is applied or goes to the error stream -----------------------
log_fields = st.fixed_dictionaries(
    {"cmd": st.sampled_from([b"publish", b"delta_publish", b"sow_delete", b"x", b""])},
    optional={"data": json_lines | fix_lines, "sow_key": st.binary(max_size=8),
              "keys": st.binary(max_size=20), "filter": st.sampled_from(
                  [b"1=1", b"/k = 1", b"/k >", b"\xff", b"(" * 300 + b"1=1" + b")" * 300]),
              "expiration": st.sampled_from([b"0", b"1.5", b"-1", b"nan", b"1e999", b"x"]),
              "zz": st.binary(max_size=4)})


@fuzz(100)
@given(st.lists(log_fields, min_size=1, max_size=6), st.booleans())
def test_worker_applies_or_rejects_every_log_entry(entries, fix):
    """Entries written by any client (no ``k``/``m``: those are the publisher's) are each
    applied or moved to the error stream; the partition never stops."""
    from sow_redis import keys
    from sow_redis.client import Sow
    from sow_redis.partition_state import read_cursors
    from sow_redis.streamids import reached

    sow = Sow(f"memory://{uuid.uuid4().hex}", inline=True)
    topic = "f" if fix else "t"
    sow.apply_config('[[topic]]\nname = "t"\nkey = ["/k"]\npartitions = 1\n'
                     'hash_index = [["/s"]]\nexpiration = "enabled"\n'
                     '[[topic]]\nname = "f"\nmessage_type = "fix"\nkey = ["/11"]\n'
                     'partitions = 1\n')
    last = ""
    for fields in entries:
        last = sow.r.xadd(keys.log(topic, 0), fields).decode()
    sow.handoff(topic, {0: last}, True, 10)
    (cursor,) = read_cursors(sow.r, topic, {0: last}).values()
    assert reached(cursor, last)
    rejected = len(sow.errors(topic))
    assert rejected <= len(entries)
    for rec in sow.sow(topic):
        assert isinstance(rec.obj(), dict)


# -- the config loader --------------------------------------------------------------------------
TOML_LINES = [
    "[[topic]]", "[topic]", "[[topic.x]]", 'name = "t"', 'name = "a b"', "name = 1",
    'key = ["/k"]', "key = []", 'key = [["/k"]]', 'key = "/k"', "partitions = 0",
    "partitions = 1e400", "partitions = 9999999999999999999", "partitions = -1",
    'expiration = "30s"', 'expiration = "1e999s"', 'expiration = "enabled"', "expiration = nan",
    'expiration_policy = "min"', 'hash_index = [["/s"]]', "hash_index = [[]]",
    'message_type = "fix"', 'message_type = "xml"', 'field_separator = "SOH"',
    'key_generator = { type = "chaining", primary = "/11", secondary = ["/41"] }',
    'key_generator = { type = "chaining" }', 'partition_by = ["/55"]', 'dead_letter = "t"',
    "max_message_bytes = 15", 'idle_expiration = "1h"', "x = {", '"""', "= 1", "a.b.c = 1",
    "name = 'x'\nname = 'y'", "\x00", "\ufeff", "# comment", "",
]


@fuzz()
@given(st.lists(st.sampled_from(TOML_LINES), max_size=12) | any_text.map(lambda t: [t]))
def test_config_text_gives_topics_or_one_config_error(lines):
    text = "\n".join(lines)
    try:
        topics = parse_topics(text, "fuzz.toml")
    except ConfigError as exc:
        assert exc.problems
        for problem in exc.problems:
            assert problem and "\n" not in problem, repr(problem)
        return
    for t in topics:
        assert t.name and t.partitions >= 1


@fuzz(100)
@given(st.binary(max_size=200))
def test_config_file_bytes_give_topics_or_one_config_error(tmp_path_factory, raw):
    from sow_redis.config import load_file

    path = tmp_path_factory.mktemp("cfg") / "sow.toml"
    path.write_bytes(raw)
    try:
        load_file(str(path))
    except ConfigError as exc:
        assert all(p and "\n" not in p for p in exc.problems)
