"""Redis Cluster specifics (issue 12.1): cluster URLs, the control plane on a plain Redis, the
data spread over the nodes, and ``sow-redis up --cluster``. The core behaviour on a cluster
is tested by the core modules, which run on one server and on the session's cluster
(conftest ``plane``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import orjson
import pytest
from conftest import FAST, ROOT, client, run_cli, wait_until
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.connection import check_url, connect_pair, control_of, redact
from sow_redis.errors import BadURLError, ControlURLError

pytestmark = pytest.mark.cluster


def _env_without_control(url: str) -> dict[str, str]:
    env = dict(os.environ, SOW_REDIS_URL=url, **FAST)
    env.pop("SOW_CONTROL_URL", None)
    return env


@pytest.mark.parametrize("url, says", [
    ("redis+cluster://127.0.0.1:70000", "Port out of range"),
    ("redis+cluster://127.0.0.1:7000/2", "only database 0"),
    ("redis+cluster://127.0.0.1:7000?ssl_ca_cert=x", "unknown option 'ssl_ca_cert'"),
])
def test_bad_cluster_urls_are_one_line_errors_without_connecting(url, says):
    with pytest.raises(BadURLError) as exc:
        check_url(url)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_cluster_url_password_is_masked():
    url = "redis+cluster://user:s3cret@127.0.0.1:70000"
    with pytest.raises(BadURLError) as exc:
        check_url(url)
    assert "s3cret" not in str(exc.value) and "***" in str(exc.value)
    assert redact(url) == "redis+cluster://user:***@127.0.0.1:70000"


def test_a_cluster_needs_a_plain_control_url():
    with pytest.raises(ControlURLError, match="--control-url"):
        connect_pair("redis+cluster://127.0.0.1:7000")
    with pytest.raises(ControlURLError, match="cannot run on a Redis Cluster"):
        connect_pair("redis://127.0.0.1:7000/0", "redis+cluster://127.0.0.1:7001")


@pytest.mark.parametrize("args", [["sow", "-t", "x"], ["worker", "--burst"], ["dashboard"]])
def test_cli_cluster_without_control_url_is_one_line(args):
    out = subprocess.run([sys.executable, "-m", "sow_redis.cli", *args], check=False,
                         env=_env_without_control("redis+cluster://127.0.0.1:7000"),
                         capture_output=True, timeout=60)
    err = out.stderr.decode().strip()
    print(err)
    assert out.returncode == 1 and len(err.splitlines()) == 1
    assert "--control-url" in err and "Traceback" not in err


def test_control_plane_on_its_own_redis_data_spread_over_the_primaries(redis_cluster,
                                                                      topic_name):
    """A publish through the CLI with workers: rq's keys are on the control Redis only; the
    cluster holds the data only, each partition's keys in its own slot, on every primary."""
    from conftest import start_worker

    url, curl, cluster = redis_cluster
    sow = Sow(url, control_url=curl)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\npartitions = 12\n')
    worker = start_worker(url)
    try:
        lines = b"".join(orjson.dumps({"k": i, "v": i}) + b"\n" for i in range(3000))
        out = run_cli(url, "publish", "-t", topic_name, "--wait", "--timeout", "60", input=lines)
        assert b"published 3000" in out.stdout
        got = sorted(r.obj()["k"] for r in sow.sow(topic_name))
        assert got == list(range(3000))
        # registered (past start-up, with its signal handlers) before the warm stop: the
        # publisher's write-through may have applied everything while it was still starting
        wait_until(lambda: Redis.from_url(curl).scard("rq:workers:sow") >= 1, 60,
                   "the worker registered")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, worker.stdout.read().decode()[-4000:]
    control = Redis.from_url(curl)
    assert control.exists("rq:queue:sow") or control.keys("rq:*")  # rq lives here
    per_node = {}
    for port in cluster.ports:
        node = Redis(host="127.0.0.1", port=port)
        if node.execute_command("ROLE")[0] != b"master":
            continue
        assert node.keys("rq:*") == []  # and never on the cluster
        per_node[port] = len(node.keys(f"{{sow:{topic_name}:*}}:rec"))
    print("record hashes per primary:", per_node)
    # the partitions' hash tags spread them evenly (keys.partition_slot): 4 ± 1 per primary
    assert sum(per_node.values()) == 12 and all(3 <= n <= 5 for n in per_node.values())
    assert control_of(sow.r) is not sow.r
    assert control.keys(f"*{topic_name}*") == [b"rq:queue:sow"] or all(
        k.startswith(b"rq:") for k in control.keys(f"*{topic_name}*"))


def test_up_cluster_starts_a_cluster_a_control_redis_and_workers_and_stops_them(tmp_path,
                                                                                 topic_name):
    conf = tmp_path / "sow.toml"
    conf.write_text(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\npartitions = 6\n')
    env = dict(os.environ, SOW_REDIS_CONFIG=str(conf), **FAST)
    env.pop("SOW_CONTROL_URL", None)
    p = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "up", "--cluster", "3",
                          "--replicas", "1", "--workers", "2", "--data-dir",
                          str(tmp_path / "data")], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    urls = {}
    try:
        for _ in range(2):
            line = p.stdout.readline().decode().strip()
            name, _, value = line.partition("=")
            urls[name] = value
        assert set(urls) == {"SOW_REDIS_URL", "SOW_CONTROL_URL"}, urls
        data = client(urls["SOW_REDIS_URL"])
        nodes = [addr.split("@")[0].rsplit(":", 1) for addr in data.cluster_nodes()]
        roles = [flags for info in data.cluster_nodes().values()
                 for flags in [info["flags"]]]
        print("nodes:", nodes, roles)
        assert len(nodes) == 6 and sum("master" in f for f in roles) == 3
        control = Redis.from_url(urls["SOW_CONTROL_URL"])
        deadline = time.monotonic() + 60
        while control.scard("rq:workers:sow") < 2:
            assert time.monotonic() < deadline and p.poll() is None, "workers not registered"
            time.sleep(0.1)
        cli_env = dict(env, SOW_REDIS_URL=urls["SOW_REDIS_URL"],
                       SOW_CONTROL_URL=urls["SOW_CONTROL_URL"])
        out = subprocess.run([sys.executable, "-m", "sow_redis.cli", "publish", "-t", topic_name,
                              "--wait", "--timeout", "60"], check=True, env=cli_env,
                             input=b'{"k": 1}\n{"k": 2}\n{"k": 3}\n', capture_output=True,
                             timeout=120)
        assert b"published 3" in out.stdout
        out = subprocess.run([sys.executable, "-m", "sow_redis.cli", "sow", "-t", topic_name,
                              "--order-by", "/k"], check=True, env=cli_env,
                             capture_output=True, timeout=120)
        assert out.stdout.splitlines() == [b'{"k": 1}', b'{"k": 2}', b'{"k": 3}']
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0
    assert b"stopped" in p.stderr.read()
    for host, port in nodes:  # every node and the control Redis are gone
        with pytest.raises(RedisConnectionError):
            Redis(host=host, port=int(port), socket_connect_timeout=0.5).ping()
    with pytest.raises(RedisConnectionError):
        Redis.from_url(urls["SOW_CONTROL_URL"], socket_connect_timeout=0.5).ping()


def test_registry_and_keys_of_one_partition_share_a_slot():
    from redis.cluster import key_slot

    for p in range(8):
        slots = {key_slot(k.encode()) for k in keys.partition_keys("orders", p, 2)
                 + [keys.lease("orders", p), keys.job_marker("orders", p)]}
        assert len(slots) == 1
