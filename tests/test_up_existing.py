"""`sow-redis up` on a Redis that already answers (issue 27, defect 6): on an existing Redis
Cluster (with its control Redis) it starts no server, runs the workers and the expirer
against it, and stops them on Ctrl-C; it no longer ends in an internal error about URL
schemes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from conftest import client, run_cli, wait_until

from sow_redis import keys
from sow_redis.ops.server import free_port

pytestmark = pytest.mark.cluster


def test_up_runs_workers_and_the_expirer_on_an_existing_cluster(redis_cluster, tmp_path):
    url, control, _c = redis_cluster
    topic = f"t{uuid.uuid4().hex[:10]}"
    conf = tmp_path / "sow.toml"
    conf.write_text(f'[[topic]]\nname = "{topic}"\nkey = ["/id"]\npartitions = 3\n'
                    'expiration = "enabled"\n')
    env = dict(os.environ)
    for name in ("SOW_REDIS_URL", "SOW_CONTROL_URL", "SOW_REDIS_CONFIG"):
        env.pop(name, None)
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        up = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "--redis-url", url,
                               "--control-url", control, "--config", str(conf), "up",
                               "--workers", "2", "--data-dir", str(tmp_path / "data")],
                              env=env, stdout=out, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        wait_until(lambda: b"2 worker(s), the expirer and the deriver running" in log.read_bytes()
                   or up.poll() is not None, 60, "up ready")
        text = log.read_text()
        print(text)
        assert up.poll() is None, text
        assert "internal error" not in text and "started redis-server" not in text
        assert f"using the Redis Cluster at {url} (control Redis {control})" in text
        assert f"applied {conf}" in text
        # the workers apply (--wait), the expirer removes what falls due
        pub = run_cli(url, "publish", "-t", topic, "--wait", "--timeout", "60",
                      "--expiration", "3", input=b"".join(b'{"id": %d}\n' % i
                                                           for i in range(30)),
                      SOW_CONTROL_URL=control)
        assert b"published 30 message(s)" in pub.stdout and b"(applied)" in pub.stdout
        r = client(url)

        def stored() -> int:
            return sum(r.hlen(keys.records(topic, p)) for p in range(3))

        assert stored() == 30
        took = wait_until(lambda: stored() == 0, 15, "the expirer removed the due records")
        print(f"expired {took:.2f} s after the publish returned (lifetime 3 s)")
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=60)
    text = log.read_text()
    assert up.returncode == 0, text
    assert text.rstrip().endswith("stopped")


@pytest.mark.parametrize("answers", [False, True])
def test_up_on_a_cluster_url_without_a_cluster_is_one_line(tmp_path, redis_server, answers):
    """Nothing answers at the cluster URL, or a plain server (not in cluster mode) does."""
    env = dict(os.environ)
    env.pop("SOW_CONTROL_URL", None)
    node = redis_server.split("//")[1].split("/")[0] if answers else f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "sow_redis.cli", "--redis-url",
                          f"redis+cluster://{node}", "--control-url", redis_server, "up",
                          "--data-dir", str(tmp_path)], env=env, capture_output=True, timeout=60)
    err = out.stderr.decode()
    print(f"{time.monotonic() - started:.1f} s: {err}")
    assert out.returncode == 1 and len(err.strip().splitlines()) == 1, err
    assert "internal error" not in err and err.startswith("Error: ")
    assert ("does not answer as a Redis Cluster" if answers else "no Redis Cluster node answers"
            ) in err
