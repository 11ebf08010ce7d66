"""A cluster URL may name several seed nodes, ``redis+cluster://h1:p1,h2:p2``: a client
(the Python API, the CLI, a worker) starts from the first that answers, so it starts while
a seed node is down (redis-py's ``startup_nodes``)."""

from __future__ import annotations

import pytest
from conftest import run_cli
from redis.exceptions import ConnectionError as RedisConnectionError

from sow_redis.client import Sow
from sow_redis.connection import connect
from sow_redis.errors import BadURLError
from sow_redis.ops.server import free_port

pytestmark = pytest.mark.cluster


def test_a_cluster_url_with_a_dead_first_seed_starts_from_the_next(redis_cluster, topic_name):
    data, control, _cluster = redis_cluster
    live = data.split("://", 1)[1]
    dead = f"127.0.0.1:{free_port()}"
    url = f"redis+cluster://{dead},{live}"
    r = connect(url)
    assert r.ping() and len(r.get_primaries()) == 3  # the whole cluster, from the 2nd seed
    sow = Sow(url, control_url=control, inline=True)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/id"]\npartitions = 4\n')
    assert sow.publish(topic_name, [{"id": i} for i in range(10)]).published == 10
    assert len(Sow(data, control_url=control).sow(topic_name)) == 10
    out = run_cli(url, "--control-url", control, "sow", "-t", topic_name, "-f", "/id = 3")
    assert out.returncode == 0 and out.stdout == b'{"id":3}\n', out.stderr


def test_a_cluster_url_whose_seeds_are_all_down_or_malformed_is_one_clear_error():
    dead = f"redis+cluster://127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    with pytest.raises(RedisConnectionError, match="no node of the Redis Cluster at"):
        connect(dead)
    out = run_cli(dead, "--control-url", "redis://127.0.0.1:1/0", "sow", "-t", "t",
                  check=False)
    err = out.stderr.decode().strip().splitlines()
    assert out.returncode == 1 and len(err) == 1 and err[0].startswith(
        f"Error: cannot reach Redis at {dead}: no node of the Redis Cluster"), err
    for bad, why in (("redis+cluster://127.0.0.1:7000,127.0.0.1:x", "'127.0.0.1:x'"),
                     ("redis+cluster://u:secret@127.0.0.1:7000,", "''")):
        with pytest.raises(BadURLError, match=f"seed node {why} is not host:port") as info:
            connect(bad)
        assert "secret" not in str(info.value)
        out = run_cli(bad, "--control-url", "redis://127.0.0.1:1/0", "sow", "-t", "t",
                      check=False)
        err = out.stderr.decode().strip().splitlines()
        assert out.returncode != 0 and len(err) == 1 and f"seed node {why}" in err[0], err
        assert "secret" not in out.stderr.decode() and "Traceback" not in out.stderr.decode()


def test_up_and_down_tell_a_cluster_url_by_its_first_seed():
    """`up` and `down` compare the URL of a running `up` with the one given (its pidfile):
    a cluster URL with seeds reads as its first node (urllib.parse takes no list of nodes:
    this raised ValueError before)."""
    from sow_redis.ops.server import _same_redis

    seeds = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001"
    assert _same_redis(seeds, "redis+cluster://localhost:7000")
    assert _same_redis(seeds, seeds + ",127.0.0.1:7002")
    assert not _same_redis(seeds, "redis+cluster://127.0.0.1:7001,127.0.0.1:7000")
