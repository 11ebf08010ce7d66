"""``sow-redis up``: the embedded default deployment.

Starts a local ``redis-server`` (AOF on, data under ``--data-dir``, settings of
``deploy/redis.conf``: ``maxmemory-policy noeviction``) when none answers at a local
``--redis-url``, applies the topic configuration, runs N worker processes and the expirer, and stops them all
cleanly on Ctrl-C (SIGINT) or SIGTERM: workers finish their current job, then the
redis-server started here is shut down (AOF flushed).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import click

from .errors import SowError
from .settings import Settings

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", ""}
REDIS_START_TIMEOUT_S = 10.0


def _ping(url: str) -> bool:
    from redis import Redis
    from redis.exceptions import ConnectionError as RedisConnectionError

    try:
        return bool(Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except (RedisConnectionError, OSError):
        return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_redis(port: int, data_dir: str | Path, persist: bool = True,
                timeout_s: float = REDIS_START_TIMEOUT_S) -> subprocess.Popen[bytes]:
    """Start a ``redis-server`` on 127.0.0.1:``port`` with data and log in ``data_dir`` and
    wait until it answers. ``persist``: AOF on with ``deploy/redis.conf``; else nothing is
    written to disk (tests, benchmarks). The server runs in its own session, so a Ctrl-C on
    the terminal does not reach it before its clients are stopped.

    Raises:
        SowError: redis-server is not installed, or it did not answer within ``timeout_s``
            seconds (the process is stopped then).
    """
    exe = shutil.which("redis-server")
    if exe is None:
        raise SowError("redis-server is not installed (apt-get install redis-server)")
    d = Path(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    conf = Path(__file__).resolve().parent.parent / "deploy" / "redis.conf"
    args = [exe] + ([str(conf)] if persist and conf.exists() else []) + [
        "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d.resolve()),
        "--appendonly", "yes" if persist else "no", "--save", "", "--daemonize", "no",
        "--maxmemory-policy", "noeviction", "--logfile", str((d / "redis.log").resolve()),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + timeout_s
    while not _ping(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)
            raise SowError(f"redis-server did not start on port {port}; see {d}/redis.log")
        time.sleep(0.02)
    return proc


def start_redis(url: str, data_dir: str) -> subprocess.Popen[bytes]:
    """Start redis-server for a local URL with AOF persistence in ``data_dir/redis-<port>``.

    Raises:
        SowError: the URL is not local, or as :func:`spawn_redis`.
    """
    u = urlparse(url)
    if u.hostname not in LOCAL_HOSTS and u.hostname is not None:
        raise SowError(f"no Redis answers at {url}, and it is not local: start it there")
    port = u.port or 6379
    return spawn_redis(port, Path(data_dir, f"redis-{port}"))


RESTART_MIN_S = 0.5
"""Pause in seconds before the second restart of a child that keeps dying; it doubles per
quick death (the first restart is immediate)."""

RESTART_MAX_S = 30.0
"""Longest pause in seconds before restarting a child process or the redis-server."""

HEALTHY_S = 10.0
"""A child that ran this many seconds before it died is restarted at once."""

REDIS_RESTART_TIMEOUT_S = 120.0
"""Seconds a restarted redis-server may take to load its AOF and answer."""


class _Child:
    """One supervised process of ``up``: its command, label and restart schedule."""

    def __init__(self, label: str, args: list[str], env: dict[str, str]):
        self.label, self.args, self.env = label, args, env
        self.quick_deaths = 0
        self.restart_at: float | None = None
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.started = time.monotonic()
        return subprocess.Popen(self.args, env=self.env, start_new_session=True)

    def check(self) -> None:
        """Schedule a restart when the process died (capped exponential backoff for a child
        that dies quickly again and again); restart it when its time has come."""
        now = time.monotonic()
        if self.restart_at is None and self.proc.poll() is not None:
            if now - self.started >= HEALTHY_S:
                self.quick_deaths = 0
            delay = 0.0 if self.quick_deaths == 0 else min(
                RESTART_MAX_S, RESTART_MIN_S * 2 ** (self.quick_deaths - 1))
            self.quick_deaths += 1
            self.restart_at = now + delay
            click.echo(f"{self.label} exited ({self.proc.returncode}); restarting in "
                       f"{delay:.1f} s", err=True)
        if self.restart_at is not None and now >= self.restart_at:
            self.restart_at = None
            self.proc = self._spawn()


def _respawn_redis(url: str, data_dir: str) -> subprocess.Popen[bytes]:
    """Start the redis-server of ``up`` again, on the same port and data dir (AOF).

    Raises:
        SowError: as :func:`spawn_redis`.
    """
    port = urlparse(url).port or 6379
    return spawn_redis(port, Path(data_dir, f"redis-{port}"), timeout_s=REDIS_RESTART_TIMEOUT_S)


def run_up(settings: Settings, workers: int, data_dir: str, apply_config: bool = True) -> None:
    """Run redis (if needed) + config + ``workers`` worker processes until interrupted.

    Supervision: a worker or expirer that dies is restarted (at once, then after
    ``RESTART_MIN_S`` doubling to ``RESTART_MAX_S`` while it keeps dying within
    ``HEALTHY_S``); a redis-server started here that dies is started again on the same port
    and data dir, which reloads its AOF. Each event is one line on stderr.
    """
    redis_proc = None
    if not _ping(settings.redis_url):
        redis_proc = start_redis(settings.redis_url, data_dir)
        click.echo(f"started redis-server at {settings.redis_url} (data in {data_dir})", err=True)
    children: list[_Child] = []
    stopping = False

    def stop(*_a: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    try:
        if apply_config and os.path.exists(settings.config_path):
            from .client import Sow

            Sow(settings=settings).apply_config(settings.config_path)
            click.echo(f"applied {settings.config_path}", err=True)
        env = dict(os.environ, SOW_REDIS_URL=settings.redis_url)
        cli = [sys.executable, "-m", "sow_redis.cli"]
        for i in range(workers):
            children.append(_Child(f"worker {i}", cli + ["worker", "--name", f"sow-{i}"], env))
        children.append(_Child("expirer", cli + ["expirer"], env))
        click.echo(f"{workers} worker(s) and the expirer running; Ctrl-C stops everything",
                   err=True)
        redis_deaths, redis_retry_at = 0, 0.0
        while not stopping:
            if redis_proc is not None and redis_proc.poll() is not None \
                    and time.monotonic() >= redis_retry_at:
                click.echo(f"redis-server at {settings.redis_url} exited ({redis_proc.returncode});"
                           f" restarting it (data in {data_dir})", err=True)
                try:
                    redis_proc = _respawn_redis(settings.redis_url, data_dir)
                    redis_deaths = 0
                    click.echo(f"redis-server restarted at {settings.redis_url}", err=True)
                except SowError as exc:
                    redis_deaths += 1
                    delay = min(RESTART_MAX_S, RESTART_MIN_S * 2 ** (redis_deaths - 1))
                    redis_retry_at = time.monotonic() + delay
                    click.echo(f"{exc}; retrying in {delay:.1f} s", err=True)
            for child in children:
                child.check()
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    finally:
        procs = [c.proc for c in children]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        if redis_proc is not None:
            from redis import Redis

            try:
                Redis.from_url(settings.redis_url).shutdown(save=False)
            except Exception:  # noqa: BLE001 - it may already be gone
                pass
            try:
                redis_proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                redis_proc.kill()
        click.echo("stopped", err=True)
