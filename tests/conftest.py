"""Fixtures: a real redis-server per test session on a free port (never the shared 6379), and
a 3-primary Redis Cluster (one replica each) with its plain control Redis.

The core modules (:data:`CORE`) run every test that takes ``url``, ``r``, ``sow``,
``backend_url`` or ``lonely_url`` twice: on one server (``[server]``) and on the cluster
(``[cluster]``; ``SOW_CONTROL_URL`` is set for the test, so ``Sow(url)``, ``cli_env`` and
the workers it starts use the control Redis). Tests that need a server of their own (kill or
restart it) take none of these fixtures and run once. ``client(url)`` gives a client of
either kind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from redis import Redis

from sow_redis.client import Sow
from sow_redis.connection import connect, is_cluster_url
from sow_redis.server import free_port, spawn_cluster, spawn_redis

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"

# short lease / marker lifetimes so takeover tests run in seconds
FAST = {"SOW_LEASE_MS": "1000", "SOW_MARKER_TTL_MS": "1500", "SOW_SWEEP_INTERVAL_S": "0.2"}


def _own_redis(folder: Path):
    """Yields ``redis://127.0.0.1:<free port>/0`` of a redis-server without persistence whose
    files go to ``folder``, then terminates it (a fixture's body)."""
    port = free_port()
    proc = spawn_redis(port, folder, persist=False)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


CORE = {"test_publish", "test_query", "test_expiration", "test_chaining", "test_subscribe",
        "test_workers", "test_write_through", "test_apply_load", "test_integrity",
        "test_migrate_live"}
"""Test modules whose data-plane tests run on one server and on the cluster."""

PLANE_FIXTURES = {"url", "r", "sow", "backend_url", "lonely_url"}

CONTROL: dict[str, str] = {}
"""Cluster URL → the URL of its control Redis (rq), for :func:`cli_env`."""


def pytest_generate_tests(metafunc):
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module in CORE and PLANE_FIXTURES & set(metafunc.fixturenames):
        metafunc.parametrize("plane", ["server", "cluster"], indirect=True)


@pytest.fixture
def plane(request):
    """``"server"`` or ``"cluster"``: the data plane of this test (only core modules run on
    both)."""
    return getattr(request, "param", "server")


def client(url: str):
    """A client (bytes replies) of a server or cluster URL."""
    return connect(url) if is_cluster_url(url) else Redis.from_url(url)


def control(url: str):
    """A client of the control Redis (rq) of data URL ``url``: the cluster's control Redis,
    or the server itself."""
    return client(CONTROL.get(url, url))


def _own_cluster(folder: Path, replicas: int):
    """Yields ``(cluster URL, control URL, LocalCluster)`` of a 3-primary cluster with ``replicas`` replicas
    each and a plain control redis-server, without persistence, then stops them."""
    cluster = spawn_cluster(3, replicas, folder / "cluster")
    port = free_port()
    control = spawn_redis(port, folder / "control", persist=False)
    curl = f"redis://127.0.0.1:{port}/0"
    CONTROL[cluster.url] = curl
    try:
        yield cluster.url, curl, cluster
    finally:
        CONTROL.pop(cluster.url, None)
        control.terminate()
        control.wait(timeout=10)
        cluster.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """``redis://127.0.0.1:<free port>/0`` of a redis-server started for this test session."""
    yield from _own_redis(tmp_path_factory.mktemp("redis"))


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """``(redis+cluster://127.0.0.1:<port>, control URL, LocalCluster)`` of a 3-primary Redis
    Cluster with one replica each (cluster-node-timeout 2000 ms) and its control Redis,
    started for this test session."""
    yield from _own_cluster(tmp_path_factory.mktemp("cluster"), replicas=1)


def _plane_url(plane, request, monkeypatch, server_fixture: str, cluster_fixture: str) -> str:
    if plane == "cluster":
        data, control, _c = request.getfixturevalue(cluster_fixture)
        monkeypatch.setenv("SOW_CONTROL_URL", control)
        return data
    monkeypatch.delenv("SOW_CONTROL_URL", raising=False)
    return request.getfixturevalue(server_fixture)


@pytest.fixture(scope="module")
def lonely_server(tmp_path_factory):
    yield from _own_redis(tmp_path_factory.mktemp("lonely"))


@pytest.fixture(scope="module")
def lonely_cluster(tmp_path_factory):
    yield from _own_cluster(tmp_path_factory.mktemp("lonely-cluster"), replicas=0)


@pytest.fixture
def lonely_url(plane, request, monkeypatch):
    """The URL of a redis-server (or 3-primary cluster, no replicas) of the test module (one
    per module, not ``redis_server``) on which no worker ever runs: published entries stay in
    the log until applied inline."""
    return _plane_url(plane, request, monkeypatch, "lonely_server", "lonely_cluster")


@pytest.fixture
def url(plane, request, monkeypatch):
    """The data URL of this test: the session's server, or the session's cluster."""
    return _plane_url(plane, request, monkeypatch, "redis_server", "redis_cluster")


@pytest.fixture
def r(url):
    return client(url)


@pytest.fixture
def topic_name():
    """A unique topic name per test."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["redis", "memory"])
def backend_url(request, plane):
    """Runs a test on the real server (or cluster) and on memory://."""
    if request.param == "redis":
        return request.getfixturevalue("url")
    if plane == "cluster":
        pytest.skip("memory:// has no data plane to vary: it runs with [server]")
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture
def sow(backend_url):
    """A Sow in inline mode (publishes applied in process before returning, by the workers'
    code; no worker process runs) on the real server and on memory://."""
    return Sow(backend_url, inline=True)


def cli_env(url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, SOW_REDIS_URL=url, **FAST, **extra)
    if url in CONTROL:
        env.setdefault("SOW_CONTROL_URL", CONTROL[url])
    else:
        env.pop("SOW_CONTROL_URL", None)
    return env


def start_worker(url: str, *args: str, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "worker", *args],
                            env=cli_env(url, **extra), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def run_cli(url: str, *args: str, input: bytes | None = None, check: bool = True,
            timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "sow_redis.cli", *args], env=cli_env(url, **extra),
                          input=input, capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"sow-redis {' '.join(args)} failed: {proc.stderr.decode()}")
    return proc


def wait_until(pred, timeout_s: float, what: str, step: float = 0.01) -> float:
    """Seconds until ``pred()`` is true (Redis errors count as false); fails the test after
    ``timeout_s`` seconds, naming ``what``."""
    from redis.exceptions import RedisError

    t0 = time.monotonic()
    while True:
        try:
            if pred():
                return time.monotonic() - t0
        except RedisError:
            pass
        assert time.monotonic() - t0 < timeout_s, f"timeout after {timeout_s} s: {what}"
        time.sleep(step)


# -- Spark (tests/test_spark*.py) ---------------------------------------------------------
SPARK_TEST_MASTER = os.environ.get("SOW_TEST_SPARK", "standalone")
"""Where the Spark tests' shared session runs: ``standalone`` (default: a Spark standalone
master and two workers of 1 core and 1 GB, started once per run) or ``local`` (``local[2]``
in this process's JVM)."""

# Spark binds to the host name's address unless told: loopback only, for this run's drivers
# (also the CLI's, in subprocesses) and the standalone cluster's daemons
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def executor_python(folder: Path) -> str:
    """An interpreter for Spark's Python workers that cannot import this checkout: the
    virtualenv's Python with ``-S`` (no site: the editable install's path hook is not read)
    and its site-packages on ``PYTHONPATH`` for the dependencies only. ``sow_redis`` then
    comes from the zip the driver ships (spark/session.py), as on a real cluster."""
    import sysconfig

    site = sysconfig.get_paths()["purelib"]
    path = folder / "executor-python"
    path.write_text('#!/bin/sh\n# sow_redis tests: the executors\' Python, without the '
                    'editable sow_redis\nPYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}'
                    f'{site}" exec {sys.executable} -S "$@"\n')
    path.chmod(0o755)
    return str(path)


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory):
    """A :class:`sow_redis.spark.standalone.StandaloneCluster`: master and two workers (1
    core, 1 GB each) on loopback ports, for this test session."""
    from sow_redis.spark.standalone import start_standalone

    cluster = start_standalone(tmp_path_factory.mktemp("spark-standalone"), workers=2,
                               cores=1, memory="1g")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def spark(request, tmp_path_factory):
    """The test session's SparkSession: on the standalone cluster (the package shipped to
    executors whose Python cannot import this checkout), or ``local[2]`` with
    ``SOW_TEST_SPARK=local``."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from sow_redis.spark.session import get_session

    if SPARK_TEST_MASTER == "local":
        session = get_session("local[2]", "sow-redis-tests")
    else:
        cluster = request.getfixturevalue("spark_standalone")
        saved = os.environ.get("PYSPARK_PYTHON")
        os.environ["PYSPARK_PYTHON"] = executor_python(tmp_path_factory.mktemp("spark-py"))
        try:
            session = get_session(cluster.master_url, "sow-redis-tests")
        finally:
            if saved is None:
                os.environ.pop("PYSPARK_PYTHON", None)
            else:
                os.environ["PYSPARK_PYTHON"] = saved
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
