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

from sow_redis.client import Sow
from sow_redis.server import free_port

ROLES = ("publisher", "reader", "worker", "operator")


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("acl")
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
            break
        except Exception:
            assert time.monotonic() < deadline, "redis-server with the ACL file did not start"
            time.sleep(0.05)
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
        res = pub.publish(topic_name, [{"k": i} for i in range(10)], wait=True, timeout=30)
        assert res.published == 10
        pub.publish(topic_name, {"k": 50}, expiration=0.05, wait=True, timeout=30)
        assert len(reader.sow(topic_name)) == 11
        with reader.sow_and_subscribe(topic_name, oof=True) as sub:
            assert [sub.get(2)["kind"] for _ in range(12)][-1] == "group_end"
            time.sleep(0.1)
            out = _cli(port, "worker", "expirer", "--burst", "-t", topic_name)
            assert out.returncode == 0, out.stderr
            (oof,) = [m for m in iter(lambda: sub.get(1), None)]
            assert oof["kind"] == "oof" and oof["reason"] == "expired"
        refused = {
            "publisher reads records": lambda: Redis.from_url(_url(port, "publisher")).hgetall(
                f"{{sow:{topic_name}:0}}:rec"),
            "publisher deletes records": lambda: Redis.from_url(_url(port, "publisher")).delete(
                f"{{sow:{topic_name}:0}}:rec"),
            "publisher defines topics": lambda: Sow(_url(port, "publisher")).apply_config(
                '[[topic]]\nname = "evil"\nkey = ["/k"]\n'),
            "reader publishes": lambda: reader.publish(topic_name, {"k": 1}),
            "reader deletes": lambda: Redis.from_url(_url(port, "reader")).delete(
                f"{{sow:{topic_name}:0}}:rec"),
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
