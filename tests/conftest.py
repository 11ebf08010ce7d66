"""Fixtures: a real redis-server per test session on a free port (never the shared 6379)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from redis import Redis

from sow_redis.client import Sow
from sow_redis.server import free_port, spawn_redis

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


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """``redis://127.0.0.1:<free port>/0`` of a redis-server started for this test session."""
    yield from _own_redis(tmp_path_factory.mktemp("redis"))


@pytest.fixture(scope="module")
def lonely_url(tmp_path_factory):
    """The URL of a redis-server of the test module (one per module, not ``redis_server``) on
    which no worker ever runs: published entries stay in the log until applied inline."""
    yield from _own_redis(tmp_path_factory.mktemp("lonely"))


@pytest.fixture
def url(redis_server):
    return redis_server


@pytest.fixture
def r(redis_server):
    return Redis.from_url(redis_server)


@pytest.fixture
def topic_name():
    """A unique topic name per test."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["redis", "memory"])
def backend_url(request, redis_server):
    """Runs a test on the real server and on memory://."""
    if request.param == "redis":
        return redis_server
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture
def sow(backend_url):
    """A Sow in inline mode (publishes applied in process before returning, by the workers'
    code; no worker process runs) on the real server and on memory://."""
    return Sow(backend_url, inline=True)


def cli_env(url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, SOW_REDIS_URL=url, **FAST, **extra)
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
