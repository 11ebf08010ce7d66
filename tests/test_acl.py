"""Redis ACL users of deploy/acl/users.acl (issue 12 item 5): each role does its job through
sow_redis and is refused outside it; a refusal reaches a CLI user as one line, without the
password."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import FAST, ROOT
from redis import Redis
from redis.exceptions import NoPermissionError

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.ops.server import free_port

ROLES = ("publisher", "reader", "worker", "operator")


def start_acl_server(folder) -> tuple[subprocess.Popen, int]:
    """A redis-server on a free loopback port loaded with deploy/acl/users.acl (password of
    each role: ``<role>-s3cret``), answering the operator: ``(process, port)``."""
    acl = (ROOT / "deploy" / "acl" / "users.acl").read_text()
    for role in ROLES:
        acl = acl.replace(f"<{role}-password>", f"{role}-s3cret")
    (folder / "users.acl").write_text(acl)
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(folder),
                             "--aclfile", str(folder / "users.acl")],
                            stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            Redis(port=port, username="operator", password="operator-s3cret").ping()
            return proc, port
        except Exception:
            assert time.monotonic() < deadline, "redis-server with the ACL file did not start"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory):
    proc, port = start_acl_server(tmp_path_factory.mktemp("acl"))
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def _url(port: int, role: str) -> str:
    return f"redis://{role}:{role}-s3cret@127.0.0.1:{port}/0"


def _cli(port: int, role: str, *args: str, input: bytes | None = None):
    import os

    env = dict(os.environ, SOW_REDIS_URL=_url(port, role), **FAST)
    return subprocess.run([sys.executable, "-m", "sow_redis.cli", *args], env=env, input=input,
                          capture_output=True, timeout=60)


def test_each_role_does_its_job_and_nothing_else(acl_server, topic_name):
    port = acl_server
    Sow(_url(port, "operator")).apply_config(
        f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\npartitions = 2\n'
        'expiration = "enabled"\n')
    import os

    env = dict(os.environ, SOW_REDIS_URL=_url(port, "worker"), **FAST)
    worker = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "worker"], env=env,
                              stderr=subprocess.PIPE)
    try:
        pub, reader = Sow(_url(port, "publisher")), Sow(_url(port, "reader"))
        res = pub.publish(topic_name, [{"k": i} for i in range(5)], wait=True, timeout=30)
        assert res.published == 5
        out = _cli(port, "publisher", "publish", "-t", topic_name, "--wait",
                   input=b"".join(b'{"k": %d}\n' % i for i in range(5, 10)))
        assert out.returncode == 0, out.stderr
        # lives 2 s: long enough to be in the snapshot below on a busy machine
        pub.publish(topic_name, {"k": 50}, expiration=2.0, wait=True, timeout=30)
        assert len(reader.sow(topic_name)) == 11
        admin = Redis.from_url(_url(port, "operator"))
        copies = admin.info("commandstats").get("cmdstat_copy", {}).get("calls", 0)
        with reader.sow_and_subscribe(topic_name, batch_size=3) as sub:  # copies, scans
            batched = [sub.get(2) for _ in range(12)]
        assert [m["kind"] for m in batched] == ["sow"] * 11 + ["group_end"]
        # the reader may copy (not read each partition whole), and leaves no copy behind
        assert admin.info("commandstats")["cmdstat_copy"]["calls"] - copies == 2  # partitions
        assert list(admin.scan_iter(match="*:snap:*")) == []
        with reader.sow_and_subscribe(topic_name, oof=True) as sub:
            assert [sub.get(2)["kind"] for _ in range(12)][-1] == "group_end"
            (due,) = [x.expiry_ms for x in reader.sow(topic_name, "/k = 50")]
            from sow_redis.connection import server_ms

            while server_ms(reader.r) <= due:  # until the record is due (server clock)
                time.sleep(0.05)
            out = _cli(port, "worker", "expirer", "--burst", "-t", topic_name)
            assert out.returncode == 0, out.stderr
            (oof,) = [m for m in iter(lambda: sub.get(1), None)]
            assert oof["kind"] == "oof" and oof["reason"] == "expired"
        refused = {
            "publisher reads records": lambda: Redis.from_url(_url(port, "publisher")).hgetall(
                keys.records(topic_name, 0)),
            "publisher deletes records": lambda: Redis.from_url(_url(port, "publisher")).delete(
                keys.records(topic_name, 0)),
            "publisher defines topics": lambda: Sow(_url(port, "publisher")).apply_config(
                '[[topic]]\nname = "evil"\nkey = ["/k"]\n'),
            "reader publishes": lambda: reader.publish(topic_name, {"k": 1}),
            "reader deletes": lambda: Redis.from_url(_url(port, "reader")).delete(
                keys.records(topic_name, 0)),
            "worker flushes": lambda: Redis.from_url(_url(port, "worker")).flushall(),
            "worker reconfigures": lambda: Redis.from_url(_url(port, "worker")).config_set(
                "maxmemory-policy", "allkeys-lru"),
        }
        outcomes = {}
        for what, fn in refused.items():
            try:
                fn()
                outcomes[what] = "ALLOWED"
            except NoPermissionError:
                outcomes[what] = "refused"
        print(outcomes)
        assert set(outcomes.values()) == {"refused"}
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_a_refusal_reaches_a_cli_user_as_one_line_without_the_password(acl_server, topic_name):
    port = acl_server
    Sow(_url(port, "operator")).apply_config(
        f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\n')
    for role, args, stdin in (("reader", ("publish", "-t", topic_name), b'{"k": 1}\n'),
                              ("publisher", ("sow", "-t", topic_name), None),
                              ("reader", ("sow-delete", "-t", topic_name, "-f", "1=1"), None)):
        out = _cli(port, role, *args, input=stdin)
        err = out.stderr.decode()
        print(role, args[0], "->", err.strip())
        assert out.returncode == 1 and err.count("\n") == 1, err
        assert "s3cret" not in err + out.stdout.decode() and "Traceback" not in err
        assert "refused" in err or "permission" in err.lower()
    wrong = f"redis://reader:wrong-s3cret@127.0.0.1:{port}/0"
    import os

    out = subprocess.run([sys.executable, "-m", "sow_redis.cli", "sow", "-t", topic_name],
                         env=dict(os.environ, SOW_REDIS_URL=wrong), capture_output=True,
                         timeout=60)
    err = out.stderr.decode()
    assert out.returncode == 1 and err.count("\n") == 1 and "s3cret" not in err, err


# -- the ACL patterns against the key templates of sow_redis/keys.py ----------------------------
TOPIC = "a.b-c/d_1"
"""A topic name using every kind of character a name may hold (A-Z a-z 0-9 _ . - /)."""

KEY_BUILDERS = {
    "log", "records", "expiry", "state", "lease", "job_marker", "acks", "index_members",
    "dead_letters", "chain", "chain_conflicts", "index", "range_numbers", "changes",
    "change_times", "loads", "load_staged", "trusted", "definition",
    "errors", "partition_errors", "topic_stats", "REGISTRY", "REGISTRY_VERSION", "LAST_USED",
    "SWEEP_LEASE", "derive_lease", "derive_state", "snapshot"}
"""Every key template of keys.py (functions and constants), each checked below."""

EXPECTED: dict[str, dict[str, str]] = {
    # role → key template → rights on its keys ("" = none); the rest of a role's row is ""
    "publisher": {"log": "W", "job_marker": "RW", "state": "R", "definition": "R",
                  "REGISTRY": "R",
                  "REGISTRY_VERSION": "R", "LAST_USED": "RW"},
    "reader": {**{k: "R" for k in KEY_BUILDERS}, "topic_stats": "RW", "LAST_USED": "RW",
               "snapshot": "RW"},
    "worker": {k: "RW" for k in KEY_BUILDERS},
    "operator": {k: "RW" for k in KEY_BUILDERS},
}
"""What each role may do with each key sow_redis builds (deploy/acl/README.md says why)."""

CHANNELS = {"publisher": set(), "reader": {"channel", "live", "REGISTRY_CHANNEL"},
            "worker": {"channel", "live", "REGISTRY_CHANNEL"},
            "operator": {"channel", "live", "REGISTRY_CHANNEL"}}
"""Pub/sub channels each role may use (the registry channel carries only a version number)."""


def _acl_rules() -> dict[str, list[str]]:
    out = {}
    for line in (ROOT / "deploy" / "acl" / "users.acl").read_text().splitlines():
        words = line.split()
        assert words[0] == "user", line
        out[words[1]] = words[2:]
    return out


def _glob(pattern: str, text: str) -> bool:
    """Redis glob match for patterns of ``*`` and ``?`` only (asserted by the caller)."""
    import re

    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, text, re.S) is not None


def _rights(rules: list[str], key: str) -> str:
    """R / W / RW / '' that a user's root key patterns (not its selectors) give on ``key``."""
    got = set()
    depth = 0
    for rule in rules:
        depth += rule.count("(")
        if depth == 0 and "~" in rule and not rule.startswith("&"):
            perms, pattern = rule.split("~", 1)
            assert not set(pattern) & set("[]\\"), f"pattern {pattern!r}: extend _glob"
            flags = {"": "RW", "%R": "R", "%W": "W", "%RW": "RW"}[perms]
            if _glob(pattern, key):
                got |= set(flags)
        elif depth == 0 and rule == "allkeys":
            got |= {"R", "W"}
        depth -= rule.count(")")
    return "R" * ("R" in got) + "W" * ("W" in got)


def _built_keys() -> dict[str, list[str]]:
    """Template name → keys keys.py builds for TOPIC (partitions 0 and 7, indexes 0 and 3)."""
    import inspect

    from sow_redis import keys

    out: dict[str, list[str]] = {}
    for name in KEY_BUILDERS:
        obj = getattr(keys, name)
        if isinstance(obj, str):
            out[name] = [obj]
            continue
        params = list(inspect.signature(obj).parameters)
        if params == ["topic", "p", "token"]:  # a key of one subscription's own
            out[name] = [obj(TOPIC, p, "0f3a9c") for p in (0, 7)]
            continue
        args = [(TOPIC,), (TOPIC, 0), (TOPIC, 7)] if params != ["topic", "p", "n"] else [
            (TOPIC, 0, 0), (TOPIC, 7, 3)]
        out[name] = [obj(*a[:len(params)]) for a in args if len(a) == len(params)]
    return out


def test_every_key_template_of_keys_py_is_in_the_acl_table():
    """A key template added to keys.py must be given rights here (and in users.acl)."""
    import inspect

    from sow_redis import keys

    builders = {name for name, fn in inspect.getmembers(keys, inspect.isfunction)
                if fn.__module__ == keys.__name__ and not name.startswith("_")}
    lists = {"partition_keys", "all_partition_keys", "error_streams"}
    channels = {"channel", "partition_channel"}
    placement = {"partition_tag", "partition_slot"}  # the tag itself, not a key
    assert builders - lists - channels - placement == {k for k in KEY_BUILDERS if not k.isupper()}
    consts = {name for name, v in vars(keys).items() if name.isupper() and isinstance(v, str)}
    values = {"DEFINITION_MIGRATING", "DEFINITION_DROPPED"}  # values of a key, not keys
    assert consts - {"REGISTRY_CHANNEL"} - values == {k for k in KEY_BUILDERS if k.isupper()}
    # the list builders return only keys of the single templates
    singles = {k for ks in _built_keys().values() for k in ks}
    built = {k for p in (0, 7) for k in keys.partition_keys(TOPIC, p, 4, 2)} | set(
        keys.all_partition_keys(TOPIC, 8, 4, 2)) | set(keys.error_streams(TOPIC, 8))
    assert built <= singles | {f(TOPIC, p, n) for p in range(8) for n in range(4)
                               for f in (keys.index, keys.range_numbers)} | {
        f(TOPIC, p) for p in range(8) for f in (keys.records, keys.state, keys.expiry,
                                                  keys.acks, keys.index_members,
                                                  keys.dead_letters, keys.chain, keys.log,
                                                  keys.partition_errors, keys.changes,
                                                  keys.change_times, keys.lease,
                                                  keys.job_marker, keys.loads,
                                                  keys.load_staged, keys.trusted,
                                                  keys.definition)}


def test_acl_key_patterns_give_each_role_exactly_its_rights_on_what_keys_py_builds():
    rules = _acl_rules()
    assert set(rules) == set(ROLES)
    wrong = []
    for role in ROLES:
        for name, ks in _built_keys().items():
            want = EXPECTED[role].get(name, "")
            for k in ks:
                if (got := _rights(rules[role], k)) != want:
                    wrong.append(f"{role} {name} {k}: {got or '-'} (want {want or '-'})")
    print(f"{len(ROLES)} roles x {len(KEY_BUILDERS)} key templates checked")
    assert not wrong, "\n".join(wrong)


def test_acl_channel_patterns_follow_keys_py():
    from sow_redis import keys

    names = {"channel": keys.channel(TOPIC), "live": keys.partition_channel(TOPIC, 3),
             "REGISTRY_CHANNEL": keys.REGISTRY_CHANNEL}
    for role, words in _acl_rules().items():
        pats = [w[1:] for w in words if w.startswith("&")]
        allowed = {n for n, ch in names.items()
                   if "allchannels" in words or any(_glob(p, ch) for p in pats)}
        assert allowed >= CHANNELS[role], (role, allowed)
        if role in ("publisher", "reader"):
            assert allowed == CHANNELS[role], (role, allowed)


def test_the_server_agrees_with_the_table(acl_server):
    """ACL DRYRUN on the redis-server loaded with users.acl: the commands each role sends
    for its job are allowed, a sample outside it is refused (same verdicts as the table)."""
    from sow_redis import keys

    op = Redis(port=acl_server, username="operator", password="operator-s3cret")
    t, p = TOPIC, 3
    allowed = {
        "publisher": [("XADD", keys.log(t, p), "*", "cmd", "publish"),
                      ("SET", keys.job_marker(t, p), "x", "NX", "PX", "1000"),
                      ("HGET", keys.state(t, p), "cursor"), ("HGETALL", keys.REGISTRY),
                      ("HGET", keys.REGISTRY, t), ("HSET", keys.LAST_USED, t, "1"),
                      ("MULTI",), ("SADD", "rq:queues", "rq:queue:sow"),
                      ("WATCH", keys.definition(t, p)), ("MGET", keys.definition(t, p)),
                      ("RPUSH", "rq:queue:sow", "j"), ("HSET", "rq:job:j", "f", "v"),
                      ("INFO", "server")],
        "reader": [("HSCAN", keys.records(t, p), "0"), ("HMGET", keys.records(t, p), "k"),
                   ("ZRANGEBYLEX", keys.index(t, p, 0), "-", "+"),
                   ("XRANGE", keys.changes(t, p), "-", "+"), ("HGETALL", keys.REGISTRY),
                   ("HINCRBY", keys.topic_stats(t), "n_query", "1"),
                   ("HSET", keys.LAST_USED, t, "1"), ("SUBSCRIBE", keys.channel(t)),
                   ("SSUBSCRIBE", keys.partition_channel(t, p)),
                   ("PUBSUB", "SHARDNUMSUB", keys.partition_channel(t, p))],
        "worker": [("XREAD", "STREAMS", keys.log(t, p), "0"),
                   ("SET", keys.lease(t, p), "w", "NX", "PX", "1000"),
                   ("HDEL", keys.REGISTRY, t), ("DEL", keys.records(t, p)),
                   ("SUBSCRIBE", keys.REGISTRY_CHANNEL), ("CLIENT", "LIST")],
    }
    refused = {
        "publisher": [("HGETALL", keys.records(t, p)), ("XRANGE", keys.log(t, p), "-", "+"),
                      ("DEL", keys.records(t, p)), ("HSET", keys.REGISTRY, t, "{}"),
                      ("HSET", keys.state(t, p), "cursor", "9-9"),
                      ("SUBSCRIBE", keys.channel(t)),
                      ("SSUBSCRIBE", keys.partition_channel(t, p)), ("FLUSHALL",), ("KEYS", "*"),
                      # issue 23 item 8: least privilege on the control plane and scripts
                      ("EVAL", "while true do end", "0"), ("EVALSHA", "0" * 40, "0"),
                      ("FCALL", "f", "0"), ("SCRIPT", "FLUSH"), ("FUNCTION", "FLUSH"),
                      ("DEL", "rq:workers:sow"), ("SREM", "rq:workers:sow", "w"),
                      ("SADD", "rq:workers:sow", "fake"), ("SADD", "rq:workers", "fake"),
                      ("HSET", "rq:worker:fake", "state", "busy"),
                      ("DEL", "rq:queue:sow"), ("LREM", "rq:queue:sow", "0", "j"),
                      ("HGETALL", "rq:job:j"), ("DEL", "rq:job:j"),
                      ("SET", keys.SWEEP_LEASE, "me"), ("SET", keys.lease(t, p), "me"),
                      # the definition fence: read, never written by a publisher
                      ("SET", keys.definition(t, p), "forged"),
                      ("WATCH", keys.records(t, p))],
        "reader": [("XADD", keys.log(t, p), "*", "a", "b"), ("DEL", keys.records(t, p)),
                   ("HSET", keys.records(t, p), "k", "v"), ("HSET", keys.REGISTRY, t, "{}"),
                   ("PUBLISH", keys.channel(t), "x"),
                   ("SPUBLISH", keys.partition_channel(t, p), "x"), ("KEYS", "*"), ("FLUSHALL",)],
        "worker": [("FLUSHALL",), ("CONFIG", "SET", "appendonly", "no"), ("KEYS", "*"),
                   ("SHUTDOWN",), ("GET", "other:key"), ("ACL", "LIST")],
    }
    for role, cmds in allowed.items():
        for cmd in cmds:
            got = op.execute_command("ACL", "DRYRUN", role, *cmd)
            assert got == b"OK", (role, cmd, got)
    for role, cmds in refused.items():
        for cmd in cmds:
            got = op.execute_command("ACL", "DRYRUN", role, *cmd)
            assert got != b"OK", (role, cmd)
    print(f"DRYRUN: {sum(map(len, allowed.values()))} allowed, "
          f"{sum(map(len, refused.values()))} refused as the table says")


def test_a_reader_queries_a_topic_with_idle_expiration(acl_server, topic_name):
    """A query records the topic's use (sow:last_used) for idle_expiration: the reader may."""
    port = acl_server
    Sow(_url(port, "operator"), inline=True).apply_config(
        f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\nidle_expiration = "1h"\n')
    Sow(_url(port, "operator"), inline=True).publish(topic_name, [{"k": 1}, {"k": 2}])
    got = Sow(_url(port, "reader")).sow(topic_name, "/k > 1")
    assert [x.obj() for x in got] == [{"k": 2}]


def test_the_reader_runs_the_read_commands_of_the_cli(acl_server, topic_name):
    port = acl_server
    op = Sow(_url(port, "operator"), inline=True)
    op.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\npartitions = 2\n'
                    'hash_index = [["/s"]]\n')
    op.publish(topic_name, [{"k": i, "s": "x" if i % 2 else "y"} for i in range(6)])
    from sow_redis import keys

    sid = op.r.xadd(keys.log(topic_name, 0), {"cmd": "publish", "data": "not json"})
    op.handoff(topic_name, {0: sid.decode()})  # applied here: one entry in the error stream
    outs = {}
    for args in (("sow", "-t", topic_name, "-f", "/s = 'x'"), ("stats", "--json"), ("status",),
                 ("errors", "-t", topic_name), ("sow", "-t", topic_name, "--keys", "a,b")):
        out = _cli(port, "reader", *args)
        assert out.returncode == 0, (args, out.stderr)
        outs[args[0] + " " + args[-1]] = len(out.stdout.splitlines())
    print(outs)
    assert outs["sow /s = 'x'"] == 3 and outs[f"errors {topic_name}"] == 1
    assert outs["sow a,b"] == 0
