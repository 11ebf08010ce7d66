"""The FIX message type: the parser (fuzzed against simplefix), FIX topics end to end, and the
real order logs of ../shared/data/fix (read from there, never copied) kept one record per
order with its latest state, checked against an independent grouping by tag 37 OrderID."""

from __future__ import annotations

import orjson
import pytest
import simplefix
from conftest import SHARED, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from sow_redis.config import parse_topics
from sow_redis.errors import ConfigError, MessageError
from sow_redis.model import fix

FIX_DIR = SHARED / "data" / "fix"
IREACH = FIX_DIR / "Ireach_test_logs.fix.txt"  # ';'-separated, trace prefix
KODBON = FIX_DIR / "FIX.4.2-KOD-BON.messages.current.log"  # SOH, timestamp prefix


# -- parser -------------------------------------------------------------------------------
def test_prefix_and_framing_tags_are_dropped():
    line = (b"2020/03/02-06:14:36,393 INFO :: TracingIncomingMessage[X]: "
            b"8=FIX.4.4;9=40;35=D;11=A#1;55=LLOYLN;38=1000;10=105;")
    assert fix.decode(line, b";") == {"35": "D", "11": "A#1", "55": "LLOYLN", "38": "1000"}
    soh = b"2018/02/23 19:16:24.428523 8=FIX.4.2\x019=5\x0135=F\x0111=X\x0141=Y\x0110=1\x01"
    assert fix.decode(soh) == {"35": "F", "11": "X", "41": "Y"}


def test_a_field_ending_in_8_is_not_the_start_of_the_message():
    assert fix.decode(b"35=j|58=FIX rejected|11=A", b"|") == {
        "35": "j", "58": "FIX rejected", "11": "A"}
    assert fix.strip_prefix(b"x 58=FIX.4.2|8=FIX.4.4|35=0") == b"8=FIX.4.4|35=0"


def test_repeated_tags_become_lists_and_encode_back():
    obj = fix.decode(b"35=D|453=2|448=A|452=1|448=B|452=3", b"|")
    assert obj == {"35": "D", "453": "2", "448": ["A", "B"], "452": ["1", "3"]}
    assert fix.decode(fix.encode(obj, b"|"), b"|") == obj


def test_data_field_may_contain_the_separator():
    msg = b"35=B|95=7|96=a|b=c|d|58=x"
    assert fix.decode_pairs(msg, b"|") == [("35", "B"), ("95", "7"), ("96", "a|b=c|d"),
                                           ("58", "x")]


@pytest.mark.parametrize("line,where", [
    (b"35=D|xx=A", "field 2 'xx=A': the tag is not a number"),
    (b"35=D|11", "field 2 '11': not tag=value"),
    (b"35=D|11=", "field 2 '11=': empty value"),
    (b"garbage without fields", "not tag=value"),
    (b"35=B|95=9|96=abc|58=x", "data field is not 9 bytes long"),
])
def test_bad_fix_names_the_field(line, where):
    with pytest.raises(MessageError) as ei:
        fix.decode(line, b"|")
    assert ei.value.reason == "bad_fix" and where in ei.value.detail


def test_separator_names():
    assert fix.separator("SOH") == fix.separator("\\x01") == fix.separator("\x01") == b"\x01"
    assert fix.separator(";") == b";" and fix.separator("|") == b"|"
    for bad in ("=", "7", ";;", ""):
        with pytest.raises(ValueError):
            fix.separator(bad)


_LENGTH_AND_DATA = set(simplefix.FixParser().raw_len_tags + simplefix.FixParser().raw_data_tags)
_tags = st.integers(min_value=1, max_value=99999).filter(
    lambda t: t not in _LENGTH_AND_DATA and t not in (8, 9, 10))  # 8, 9, 10 frame the message
_values = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E,
                                         blacklist_characters="|;"), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(fields=st.lists(st.tuples(_tags, _values), min_size=1, max_size=25),
       raw=st.one_of(st.none(), st.binary(min_size=1, max_size=20).filter(
           lambda b: b"\n" not in b)))
def test_parser_agrees_with_simplefix(fields, raw):
    """Fuzz: any tag=value message (with a RawData field holding arbitrary bytes, SOH
    included) parses into the same pairs as simplefix's parser."""
    pairs = [(str(t).encode(), v.encode()) for t, v in fields]
    if raw is not None:
        i = len(pairs) // 2
        pairs[i:i] = [(b"95", str(len(raw)).encode()), (b"96", raw)]
    wire = b"8=FIX.4.4\x01" + b"".join(t + b"=" + v + b"\x01" for t, v in pairs) + b"10=000\x01"
    parser = simplefix.FixParser()
    parser.append_buffer(wire)
    expected = [(t.decode(), fix._text(v)) for t, v in parser.get_message().pairs]
    assert fix.decode_pairs(wire) == expected
    if raw is None:  # the same message in a ';' log reads the same
        assert fix.decode_pairs(wire.replace(b"\x01", b";"), b";") == expected


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60))
def test_parser_never_fails_other_than_bad_fix(data):
    try:
        fix.decode(data, b"|")
    except MessageError as exc:
        assert exc.reason == "bad_fix"


# -- configuration ------------------------------------------------------------------------
def test_fix_settings_are_checked():
    (t,) = parse_topics('[[topic]]\nname = "o"\nmessage_type = "fix"\nkey = ["/37"]\n')
    assert t.field_separator == "\x01" and t.skip_msg_types == ("0", "1", "2", "3", "4", "5", "A")
    with pytest.raises(ConfigError) as ei:
        parse_topics('[[topic]]\nname = "o"\nmessage_type = "fix"\nfield_separator = "=="\n'
                     'skip_msg_types = "0"\n[[topic]]\nname = "j"\nfield_separator = ";"\n')
    assert [p.split(": ", 2)[2][:40] for p in ei.value.problems] == [
        "'skip_msg_types' must be a list of MsgTy", "'field_separator': a FIX field separator",
        "'field_separator' applies to message_typ"]
    (named,) = parse_topics('[[topic]]\nname = "o"\nmessage_type = "fix"\nfield_separator = "SOH"\n')
    assert named.field_separator == "\x01"


# -- FIX topics end to end ----------------------------------------------------------------
def fix_cfg(name, extra=""):
    return (f'[[topic]]\nname = "{name}"\nmessage_type = "fix"\nfield_separator = "|"\n'
            f'key = ["/37"]\nhash_index = [["/55"]]\n{extra}\n')


def test_fix_topic_filters_queries_and_skips_session_messages(sow, topic_name):
    sow.apply_config(fix_cfg(topic_name))
    res = sow.publish(topic_name, [
        b"8=FIX.4.2|9=49|35=0|34=3|49=KOD|56=BON|10=162|",  # heartbeat: skipped
        b"T1 8=FIX.4.2|35=8|37=O1|11=A|55=IBM|38=1000|44=101.5|10=1|",
        b"T2 8=FIX.4.2|35=8|37=O2|11=B|55=MSFT|38=200|10=1|",
        b"35=8|37=O3|11=C|55=IBM|38=50",
        b"35=8|11=D|55=IBM",  # no key field
        b"35=8|37=|55=IBM",  # empty value
    ])
    assert (res.published, res.skipped) == (3, 1)
    assert [(x.position, x.reason) for x in res.rejected] == [(5, "missing_key_field"),
                                                              (6, "bad_fix")]
    got = {r.obj()["37"] for r in sow.sow(topic_name, "/38 > 100 AND /55 = 'IBM'")}
    assert got == {"O1"}  # text compared with a number numerically
    assert {r.obj()["37"] for r in sow.sow(topic_name, "/55 = 'IBM'")} == {"O1", "O3"}  # index
    (rec,) = sow.sow(topic_name, "/44 BETWEEN 100 AND 102")
    assert rec.obj() == {"35": "8", "37": "O1", "11": "A", "55": "IBM", "38": "1000", "44": "101.5"}


def test_cli_publish_fix_file_and_format_fix(url, tmp_path, topic_name):
    conf = tmp_path / "fix.toml"
    conf.write_text(fix_cfg(topic_name))
    run_cli(url, "config", "apply", str(conf))
    src = tmp_path / "in.log"
    src.write_bytes(b"2018/02/23 19:14:25 8=FIX.4.2;9=1;35=A;34=1;10=1;\n"
                    b"2018/02/23 19:14:26 8=FIX.4.2;9=1;35=8;37=O1;55=IBM;38=5;10=1;\n"
                    b"junk line\n")
    out = run_cli(url, "publish", "-t", topic_name, "--separator", ";", str(src), check=False)
    assert out.returncode == 3  # a line rejected
    assert b"published 1 message(s)" in out.stdout and b"skipped 1" in out.stdout
    assert b"rejected line 3: bad_fix: field 1 'junk line': not tag=value" in out.stderr
    run_cli(url, "worker", "--burst")
    out = run_cli(url, "sow", "-t", topic_name, "--format", "fix")
    assert out.stdout == b"35=8|37=O1|55=IBM|38=5\n"
    out = run_cli(url, "sow", "-t", topic_name)
    assert orjson.loads(out.stdout) == {"35": "8", "37": "O1", "55": "IBM", "38": "5"}
    bad = run_cli(url, "publish", "-t", topic_name, "--separator", "==", input=b"", check=False)
    assert bad.returncode == 2 and b"--separator" in bad.stderr


# -- the real logs ------------------------------------------------------------------------
def raw_messages(path, sep):
    """Independent reading of a log: split at the first '8=FIX', then on the separator."""
    out = []
    for line in path.read_bytes().splitlines():
        body = line[line.index(b"8=FIX"):]
        fields = [f.decode() for f in body.split(sep) if f]
        out.append({t: v for t, _, v in (f.partition("=") for f in fields)
                    if t not in ("8", "9", "10")})
    return out


def expected_orders(msgs):
    """Group order messages by 37 OrderID without any chain logic: a message without 37 is
    assigned through the OrderID that messages carrying 37 give its 11 or 41."""
    order_of = {}
    for m in msgs:
        if "37" in m:
            for tag in ("11", "41"):
                if tag in m:
                    order_of.setdefault(m[tag], m["37"])
    merged, last = {}, {}
    for m in msgs:
        if m["35"] in ("0", "1", "2", "3", "4", "5", "A"):
            continue
        oid = m.get("37") or order_of.get(m.get("11")) or order_of[m["41"]]
        merged[oid] = {**merged.get(oid, {}), **m}
        last[oid] = m
    return merged, last


@pytest.fixture(scope="module")
def real_logs():
    if not IREACH.exists() or not KODBON.exists():
        pytest.skip("../shared/data/fix is not beside the project")
    return raw_messages(IREACH, b";"), raw_messages(KODBON, b"\x01")


@pytest.mark.parametrize("cmd", ["delta_publish", "publish"])
def test_real_fix_logs_keep_one_record_per_order(sow, topic_name, real_logs, cmd):
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nmessage_type = "fix"\n'
                     'key = ["/11", "/41"]\nkey_generator = { type = "chaining", '
                     'validation = true }\n')
    publish = getattr(sow, cmd)
    r1 = publish(topic_name, IREACH.read_bytes().splitlines(), separator=";")
    r2 = publish(topic_name, KODBON.read_bytes().splitlines())
    assert (r1.published, r1.skipped, r1.rejected) == (330, 0, [])
    assert (r2.published, r2.skipped, r2.rejected) == (2408, 78, [])  # 74 heartbeats, 2 logons…
    assert sow.errors(topic_name) == []
    merged, last = expected_orders(real_logs[0] + real_logs[1])
    assert len(merged) == 40 + 602
    records = [r.obj() for r in sow.sow(topic_name)]
    assert len(records) == len(merged)
    if cmd == "delta_publish":  # the order's latest state: every field's newest value
        got = {o["37"]: o for o in records}
        assert set(got) == set(merged)
        for oid, exp in merged.items():
            assert got[oid] == exp, oid
    else:  # publish replaces: the record is the order's last message
        assert sorted(map(orjson.dumps, records)) == sorted(map(orjson.dumps, last.values()))
    # the longest Ireach chain is one record reachable from every one of its ClOrdIDs
    from sow_redis.apply.chaining import chain_of

    t = sow.topic(topic_name)
    longest = max((chain_of(sow.r, t, m["11"]) for m in real_logs[0] if m["35"] == "D"),
                  key=lambda c: len(c["ids"]))
    assert len(longest["ids"]) >= 10
    assert sow.r.hlen(f"{{sow:{topic_name}}}:chain_conflicts") == 0
