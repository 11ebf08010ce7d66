"""Hostile input bounds (issue 12 item 4), each reported in one line: message size, JSON
nesting depth, invalid UTF-8, number of keys in a ``--keys`` list, filter length and
nesting, LIKE regular expressions; and Lua receives values only as arguments, never in the
script text."""

from __future__ import annotations

import hashlib
import re
import time

import pytest
from conftest import ROOT, run_cli

from sow_redis.client import Sow
from sow_redis.errors import FilterSyntaxError, KeyListError, MessageError, UnknownTopicError
from sow_redis.model import messages
from sow_redis.model.sowkey import MAX_KEYS
from sow_redis.query.filter import MAX_DEPTH, MAX_FILTER_CHARS, compile_filter


def _err_line(proc) -> str:
    err = proc.stderr.decode()
    assert proc.returncode not in (0, None), err
    assert "Traceback" not in err and "internal error" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def small(lonely_url, topic_name):
    """A topic with max_message_bytes = 1024 on a server without workers (inline applies)."""
    sow = Sow(lonely_url, inline=True)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\npartitions = 2\n'
                     "max_message_bytes = 1024\n")
    return sow


# -- message size -------------------------------------------------------------------------------
def test_message_size_bound(small, topic_name, lonely_url, tmp_path):
    fits = b'{"k":1,"v":"%s"}' % (b"x" * (1024 - 14))
    assert len(fits) == 1024
    over = fits.replace(b'"k":1', b'"k":22')
    res = small.publish(topic_name, [fits, over])
    assert res.published == 1
    (rej,) = res.rejected
    print(f"API: {rej.reason}: {rej.detail}")
    assert (rej.position, rej.reason, rej.detail) == (2, "too_large",
                                                        "1025 bytes > max_message_bytes 1024")
    # the CLI never holds a huge line in memory: read past in chunks, rejected too_large
    big = tmp_path / "big.jsonl"
    with big.open("wb") as fh:
        fh.write(b'{"k": 3}\n{"k": 4, "v": "')
        for _ in range(64):  # 64 MiB on one line
            fh.write(b"y" * (1 << 20))
        fh.write(b'"}\n{"k": 5}\n')
    out = run_cli(lonely_url, "publish", "-t", topic_name, str(big), check=False)
    err = out.stderr.decode()
    print(err.strip().splitlines()[-1], "|", out.stdout.decode().strip())
    assert out.returncode == 3
    size = len(b'{"k": 4, "v": "') + 64 * (1 << 20) + 2
    assert f"rejected line 2: too_large: {size} bytes > max_message_bytes 1024" in err
    assert "published 2 message(s)" in out.stdout.decode()


# -- JSON nesting depth -------------------------------------------------------------------------
def test_json_nesting_bound(small, topic_name):
    def nested(n: int) -> bytes:
        return b'{"k":1,"x":' + b"[" * (n - 1) + b"]" * (n - 1) + b"}"

    assert messages.loads(nested(messages.MAX_DEPTH))
    with pytest.raises(MessageError) as exc:
        messages.loads(nested(messages.MAX_DEPTH + 1))
    print(f"{exc.value.reason}: {exc.value.detail}")
    assert exc.value.reason == "too_deep" and str(messages.MAX_DEPTH) in exc.value.detail
    # a million brackets: rejected in one line, no RecursionError
    with pytest.raises(MessageError) as exc:
        messages.loads(b"[" * 1_000_000 + b"]" * 1_000_000)
    assert exc.value.reason == "too_deep"


# -- invalid UTF-8 ------------------------------------------------------------------------------
def test_invalid_utf8_in_messages_is_rejected_bad_json(small, topic_name, lonely_url):
    lines = b'{"k": 1, "v": "\xff\xfe"}\n{"k": 2}\n{"k\xc3": 3}\n'
    out = run_cli(lonely_url, "publish", "-t", topic_name, input=lines, check=False)
    err = out.stderr.decode()
    assert out.returncode == 3, err
    assert "rejected line 1: bad_json: str is not valid UTF-8" in err
    assert "rejected line 3: bad_json: str is not valid UTF-8" in err
    assert "published 1 message(s)" in out.stdout.decode()


def test_invalid_utf8_in_every_cli_argument_is_one_line(small, topic_name, lonely_url):
    """Undecodable bytes in a topic, filter, key list, order-by, delete data or SOW key:
    one line naming what is wrong (Python passes them on as lone surrogates)."""
    import os
    import subprocess
    import sys

    bad = os.fsdecode(b"\xff")
    cases = {
        "topic": (("sow", "-t", topic_name + bad), "is not a topic name"),
        "filter path": (("sow", "-t", topic_name, "-f", f"/v{bad} = 1"),
                        "unexpected character"),
        "keys": (("sow", "-t", topic_name, "--keys", f"a{bad},b"), "is not a SOW key"),
        "sow-delete keys": (("sow-delete", "-t", topic_name, "--keys", f"a{bad}"),
                            "is not a SOW key"),
        "sow-delete data": (("sow-delete", "-t", topic_name, "--data", f'{{"k": "{bad}"}}'),
                            "bad_json: str is not valid UTF-8"),
        "publish --sow-key": (("publish", "-t", topic_name, "--sow-key", f"k{bad}"),
                              "sow-key"),
    }
    env = dict(os.environ, SOW_REDIS_URL=lonely_url)
    for what, (args, expected) in cases.items():
        out = subprocess.run([sys.executable, "-m", "sow_redis.cli", *args], env=env,
                             input=b'{"k": 1}\n', capture_output=True, timeout=60)
        line = _err_line(out)
        print(f"{what}: {line}")
        assert expected in line, (what, line)
    # the Python API: the same errors
    with pytest.raises(UnknownTopicError):
        small.sow(topic_name + bad)


def test_fix_fields_that_are_not_utf8_read_as_latin1(lonely_url, topic_name):
    sow = Sow(lonely_url, inline=True)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nmessage_type = "fix"\n'
                     'key = ["/11"]\n')
    res = sow.publish(topic_name, [b"8=FIX.4.4\x0135=D\x0111=A\xff1\x0155=IB\xc3\x01"])
    assert res.published == 1
    assert [x.obj() for x in sow.sow(topic_name)] == [{"35": "D", "11": "A\xff1", "55": "IB\xc3"}]


# -- keys in a --keys list ----------------------------------------------------------------------
def test_key_list_bound(lonely_url, topic_name):
    sow = Sow(lonely_url, inline=True)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\npartitions = 4\n')  # publisher keys
    sow.publish(topic_name, {"v": 1}, sow_key="a")
    sow.publish(topic_name, {"v": 2}, sow_key="b")
    many = [f"k{i}" for i in range(MAX_KEYS)]
    assert sow.sow(topic_name, keys=[*many[:-2], "a", "b"]) and len(
        sow.sow(topic_name, keys=[*many[:-1], "b"])) == 1
    with pytest.raises(KeyListError) as exc:
        sow.sow(topic_name, keys=[*many, "a"])
    print(exc.value)
    assert str(exc.value) == (f"{MAX_KEYS + 1} SOW keys given; at most {MAX_KEYS} per query or "
                              "sow_delete (split the list)")
    with pytest.raises(KeyListError):
        sow.sow_delete(topic_name, keys=[*many, "a"])
    # a key holding a comma used to split into two keys in the delete's log entry
    with pytest.raises(KeyListError, match="SOW key 1 'a,b' is not a SOW key"):
        sow.sow_delete(topic_name, keys=["a,b"])
    with pytest.raises(KeyListError, match="not one string"):
        sow.sow(topic_name, keys="a")  # type: ignore[arg-type]
    assert sorted(x.sow_key for x in sow.sow(topic_name)) == ["a", "b"]
    assert sow.sow_delete(topic_name, keys=["a", *many[: MAX_KEYS - 1]]) == 1
    line = _err_line(run_cli(lonely_url, "sow", "-t", topic_name, "--keys",
                             ",".join([*many, "b"]), check=False))
    assert f"at most {MAX_KEYS}" in line


# -- filter length and nesting ------------------------------------------------------------------
def test_filter_length_and_nesting_bounds(lonely_url, topic_name):
    head = "/a = 1"
    longest = head + " " * (MAX_FILTER_CHARS - len(head))
    assert compile_filter(longest)({"a": 1})
    too_long = longest + " "
    t0 = time.perf_counter()
    with pytest.raises(FilterSyntaxError) as exc:
        compile_filter(too_long)
    print(f"{exc.value} ({(time.perf_counter() - t0) * 1e3:.2f} ms)")
    assert str(exc.value).startswith(f"filter is {MAX_FILTER_CHARS + 1} characters long; "
                                     f"at most {MAX_FILTER_CHARS}")
    assert len(str(exc.value)) < 400  # quoted cut, one line
    deep = "(" * MAX_DEPTH + "/a = 1" + ")" * MAX_DEPTH
    with pytest.raises(FilterSyntaxError, match=f"deeper than {MAX_DEPTH} levels"):
        compile_filter(deep)
    assert compile_filter("(" * (MAX_DEPTH - 2) + "/a = 1" + ")" * (MAX_DEPTH - 2))({"a": 1})
    Sow(lonely_url).apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/a"]\n')
    line = _err_line(run_cli(lonely_url, "sow", "-t", topic_name, "-f", deep, check=False))
    assert "deeper than" in line
    # Linux takes at most 128 KiB in one argument: the longer filter goes in-process
    from click.testing import CliRunner

    from sow_redis.cli import main

    for cmd in ("sow", "sow-delete"):
        res = CliRunner().invoke(main, ["--redis-url", lonely_url, cmd, "-t", topic_name, "-f",
                                        too_long])
        assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
        assert f"filter is {MAX_FILTER_CHARS + 1} characters long" in res.output


# -- LIKE ---------------------------------------------------------------------------------------
def test_like_patterns_cannot_backtrack():
    """RE2: a pattern that backtracks catastrophically in a backtracking engine runs in time
    linear in the text; constructs RE2 lacks are one-line syntax errors."""
    f = compile_filter("/s LIKE '^(a+)+$'")
    text = "a" * 100_000 + "b"
    t0 = time.perf_counter()
    assert f({"s": text}) is False
    print(f"(a+)+$ on 100,001 characters: {(time.perf_counter() - t0) * 1e3:.1f} ms")
    with pytest.raises(FilterSyntaxError, match="backreference"):
        compile_filter(r"/s LIKE '(a)\1'")


# -- Lua gets values only as arguments ----------------------------------------------------------
def test_lua_scripts_are_static_files_and_values_travel_as_argv():
    """Statically: scripts are read from sow_redis/apply/lua/*.lua (includes pasted in), never
    formatted; only scripts.py hands scripts to Redis; no Lua script compiles text."""
    pkg = ROOT / "sow_redis"
    users = {p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py")
             if re.search(r"register_script|script_load|\.eval\(|evalsha|fcall|function_load",
                          p.read_text())}
    assert users == {"apply/scripts.py"}, users
    src = (pkg / "apply" / "scripts.py").read_text()
    assert src.count("register_script(") == 1
    assert "r.register_script(expanded_source(name)) for name in script_names()" in src
    assert re.findall(r"\.eval\(([^,]*),", src) == ['"if cmsgpack then return 1 end return 0"']
    for lua in (pkg / "apply" / "lua").rglob("*.lua"):
        text = re.sub(r"--\[\[.*?\]\]|--[^\n]*", "", lua.read_text(), flags=re.S)
        assert not re.search(r"\b(loadstring|load|dofile|loadfile)\s*\(", text), lua.name


def test_redis_caches_only_the_bundled_scripts_whatever_the_values(tmp_path):
    """Dynamically: a workload whose values are Lua code, through publish, delta_publish,
    sow_delete by filter / keys / data, hash indexes, expiry with dead letters and chaining,
    leaves exactly the bundled scripts (and the cmsgpack probe) in the server's script
    cache: no value ever became script text."""
    from redis import Redis

    from sow_redis.apply.scripts import expanded_source, script_names
    from sow_redis.expirer import Expirer
    from sow_redis.ops.server import spawn_redis_on_free_port

    port, proc = spawn_redis_on_free_port(tmp_path, persist=False)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        r = Redis.from_url(url)
        deadline = time.monotonic() + 10
        while True:
            try:
                r.ping()
                break
            except Exception:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        r.script_flush()
        sow = Sow(url, inline=True)
        sow.apply_config(
            '[[topic]]\nname = "dl"\n'
            '[[topic]]\nname = "t"\nkey = ["/k"]\npartitions = 2\nhash_index = [["/s"]]\n'
            'expiration = "enabled"\ndead_letter = "dl"\n'
            '[[topic]]\nname = "c"\nmessage_type = "fix"\nkey = ["/11", "/41"]\n'
            'key_generator = { type = "chaining" }\n')
        evil = ["]]..redis.call('FLUSHALL')..[[", "') redis.call('SET','pwned','1') --",
                "\"; return redis.call('KEYS','*') --", "%s%d{}\\x00", "local x = 1"]
        for i, v in enumerate(evil):
            sow.delta_publish("t", {"k": v, "extra": v})
            sow.publish("t", {"k": v, "s": v, "i": i}, expiration=0.01 if i == 0 else None)
        sow.sow_delete("t", filter="/i = 1 AND /s LIKE 'pwned'")
        sow.sow_delete("t", keys=[sow.sow("t", f"/i = {2}")[0].sow_key])
        sow.sow_delete("t", data={"k": evil[3]})
        time.sleep(0.05)
        Expirer(sow.r, sow.settings, topics=["t"], inline=True).run(burst=True)
        sow.publish("c", [b"8=FIX.4.4\x0135=D\x0111=" + v.encode() + b"\x0155=X\x01"
                          for v in evil[1:]])
        assert r.get("pwned") is None and r.dbsize() > 5
        ours = {hashlib.sha1(expanded_source(n).encode()).hexdigest() for n in script_names()}
        probe = hashlib.sha1(b"if cmsgpack then return 1 end return 0").hexdigest()
        used = {sha for sha, there in zip(sorted(ours), r.script_exists(*sorted(ours))) if there}
        cached = int(r.info("memory")["number_of_cached_scripts"])
        print(f"script cache: {cached} scripts = {len(used)} bundled scripts used + probe; "
              f"records left: {len(sow.sow('t'))}, dead letters: {len(sow.sow('dl'))}")
        assert len(used) >= 3 and r.script_exists(probe) == [True]
        assert cached == len(used) + 1
        assert [x.obj()["k"] for x in sow.sow("t", order_by="/i")] == [evil[4]]
        assert len(sow.sow("dl")) == 1
    finally:
        proc.terminate()
        proc.wait(timeout=10)
