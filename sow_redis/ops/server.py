"""``sow-redis up``: the embedded default deployment.

Starts a local ``redis-server`` (AOF on, data under ``--data-dir``, settings of
``deploy/redis.conf``: ``maxmemory-policy noeviction``) when none answers at a local
``--redis-url``, applies the topic configuration, runs N worker processes and the expirer, and stops them all
cleanly on Ctrl-C (SIGINT) or SIGTERM: workers finish their current job, then the
redis-server started here is shut down (AOF flushed).

Once the config is applied and the processes are started, the supervisor writes the pidfile
``<data-dir>/up.pid`` (its pid, the Redis URL, the worker pids: one line each) and removes it
when it stops. ``up --detach`` (:func:`start_detached`) runs the supervisor in the background
(output in ``<data-dir>/up.log``) and returns once it is ready; ``down``
(:func:`stop_detached`) stops the one of a data dir.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlparse

import click
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from rq import Worker

from ..client import Sow
from ..connection import (
    Client,
    connect,
    connect_primaries,
    control_url_for,
    first_seed_url,
    is_cluster_url,
    redact,
    tls_options,
)
from ..errors import SowError
from ..settings import Settings

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", ""}
REDIS_START_TIMEOUT_S = 10.0


def _ping(url: str) -> bool:

    if url.startswith(("redis+cluster://", "rediss+cluster://")):
        url = url.replace("+cluster://", "://", 1)  # the node it names
    try:
        return bool(Redis.from_url(url, socket_connect_timeout=0.5, **tls_options(url)).ping())
    except (RedisConnectionError, OSError):
        return False


def stop_processes(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """SIGTERM every process still running, then wait for each up to ``timeout_s`` seconds;
    one that has not ended by then is killed (SIGKILL) and waited for."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_cluster_port(taken: Sequence[int] = ()) -> int:
    """A port for a Redis Cluster node on 127.0.0.1: free right now, and so is its cluster
    bus port (port + 10000), neither of them one of ``taken``'s ports or bus ports (a node
    whose bus port another node listens on does not start: "Address already in use")."""
    used = set(taken) | {p + 10000 for p in taken}
    while True:
        port = free_port()
        if port + 10000 > 65535 or port in used or port + 10000 in used:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port


def spawn_redis(port: int, data_dir: str | Path, persist: bool = True,
                timeout_s: float = REDIS_START_TIMEOUT_S,
                appendfsync: str | None = None, extra: list[str] | None = None
                ) -> subprocess.Popen[bytes]:
    """Start a ``redis-server`` on 127.0.0.1:``port`` with data and log in ``data_dir`` and
    wait until it answers. ``persist``: AOF on with ``deploy/redis.conf``; else nothing is
    written to disk (tests, benchmarks). ``appendfsync`` (with ``persist``): ``always``,
    ``everysec`` or ``no`` instead of the config file's (``everysec``); see docs/failures.md
    for what each mode keeps when Redis dies. ``extra``: more
    ``--option value`` arguments (e.g. cluster mode). The server runs in its own session, so a
    Ctrl-C on the terminal does not reach it before its clients are stopped.

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
    ] + (["--appendfsync", appendfsync] if persist and appendfsync else []) + (extra or [])
    log = d / "redis.log"
    logged = log.stat().st_size if log.exists() else 0
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + timeout_s
    while not _ping(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)
            taken = log.exists() and b"Address already in use" in log.read_bytes()[logged:]
            raise (PortTakenError if taken else SowError)(
                f"redis-server did not start on port {port}; see {d}/redis.log")
        time.sleep(0.02)
    return proc


class PortTakenError(SowError):
    """A redis-server could not listen on its port (or its cluster bus port): another process
    took it after :func:`free_port` found it free (an outgoing connection's ephemeral port
    can be any free one)."""


PORT_TRIES = 5
"""Ports :func:`spawn_redis_on_free_port` and :func:`spawn_cluster` try per server."""


def spawn_redis_on_free_port(data_dir: str | Path, persist: bool = True,
                             extra: list[str] | None = None, appendfsync: str | None = None
                             ) -> tuple[int, subprocess.Popen[bytes]]:
    """:func:`spawn_redis` on a :func:`free_port`; on another free port when that one was
    taken meanwhile (up to :data:`PORT_TRIES` ports). ``persist``, ``extra``,
    ``appendfsync``: as :func:`spawn_redis`.

    Returns:
        ``(port, process)``.

    Raises:
        SowError: as :func:`spawn_redis`, or every port tried was taken.
    """
    return _spawn_on_a_free_port(free_port, lambda _port: Path(data_dir), persist, extra,
                                 appendfsync)


def _spawn_on_a_free_port(pick: Callable[[], int], folder: Callable[[int], Path],
                          persist: bool, extra: list[str] | None,
                          appendfsync: str | None = None
                          ) -> tuple[int, subprocess.Popen[bytes]]:
    """:func:`spawn_redis` on the port ``pick()`` gives, in ``folder(port)``; on the next one
    ``pick()`` gives while one was taken meanwhile (:data:`PORT_TRIES` in all; the last try's
    error is the one raised)."""
    for attempt in range(PORT_TRIES):
        port = pick()
        try:
            return port, spawn_redis(port, folder(port), persist=persist,
                                     appendfsync=appendfsync, extra=extra)
        except PortTakenError:
            if attempt == PORT_TRIES - 1:
                raise
    raise AssertionError("unreachable: the last try returns or raises")


CLUSTER_NODE_TIMEOUT_MS = 2000
"""``cluster-node-timeout`` in milliseconds of the clusters :func:`spawn_cluster` starts: a
primary that does not answer this long is failed over to its replica."""


@dataclass
class LocalCluster:
    """A Redis Cluster of local redis-server processes (:func:`spawn_cluster`).

    Attributes:
        url: ``redis+cluster://127.0.0.1:<port of the first primary>``.
        ports: every node's port, primaries first (as ``redis-cli --cluster create`` got them).
        procs: port → the node's process.
        primaries: the number of primaries.
    """

    url: str
    ports: list[int]
    procs: dict[int, subprocess.Popen[bytes]]
    primaries: int

    def node_url(self, port: int) -> str:
        """``redis://127.0.0.1:<port>/0`` of one node (plain client, no redirections)."""
        return f"redis://127.0.0.1:{port}/0"

    def stop(self) -> None:
        """Terminate every node (SIGTERM) and wait for them (nodes already gone are skipped)."""
        stop_processes(list(self.procs.values()), timeout_s=10)


def _cluster_ok(ports: list[int], replicas: int) -> bool:
    """Whether every node answers ``cluster_state:ok``, knows every other node and sees
    ``replicas`` replicas of each primary, and every replica is in sync with its primary."""

    for port in ports:
        try:
            r = Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5)
            fields = r.cluster("info")  # parsed: {"cluster_state": "ok", …}
            if fields.get("cluster_state") != "ok" or int(
                    fields.get("cluster_known_nodes", 0)) != len(ports):
                return False
            nodes = r.cluster("nodes")
            n_replicas = sum("slave" in info["flags"] for info in nodes.values())
            if n_replicas != len(ports) // (1 + replicas) * replicas:
                return False
            repl = r.info("replication")
            if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                return False  # a replica that never synced cannot be promoted
        except (RedisError, OSError):
            return False
    return True


def spawn_cluster(primaries: int, replicas: int, data_dir: str | Path, persist: bool = False,
                  node_timeout_ms: int = CLUSTER_NODE_TIMEOUT_MS,
                  timeout_s: float = 60.0) -> LocalCluster:
    """Start a Redis Cluster of ``primaries`` primaries with ``replicas`` replicas each on free
    loopback ports (system ``redis-server --cluster-enabled yes``, one folder per node under
    ``data_dir``), join them with ``redis-cli --cluster create … --cluster-replicas R
    --cluster-yes``, and wait until every node reports ``cluster_state:ok``.

    Raises:
        SowError: ``primaries`` < 3 (the least Redis Cluster accepts), redis-server or
            redis-cli missing, a node that does not start, or a cluster not ready within
            ``timeout_s`` seconds (every node started is stopped then).
    """
    if primaries < 3:
        raise SowError(f"a Redis Cluster needs at least 3 primaries, not {primaries}")
    if replicas < 0:
        raise SowError(f"--replicas must be 0 or more, not {replicas}")
    cli = shutil.which("redis-cli")
    if cli is None:
        raise SowError("redis-cli is not installed (apt-get install redis-tools)")
    node = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(node_timeout_ms), "--repl-diskless-sync-delay", "0"]
    ports: list[int] = []
    cluster = LocalCluster(url="", ports=ports, procs={}, primaries=primaries)
    try:
        while len(ports) < primaries * (1 + replicas):
            # each node's port and bus port clear of the nodes' started so far
            port, proc = _spawn_on_a_free_port(lambda: free_cluster_port(ports),
                                               lambda p: Path(data_dir, f"node-{p}"),
                                               persist, node)
            cluster.procs[port] = proc
            ports.append(port)
        cluster.url = f"redis+cluster://127.0.0.1:{ports[0]}"
        out = subprocess.run(
            [cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            check=False, capture_output=True, timeout=timeout_s)
        if out.returncode != 0:
            raise SowError("redis-cli --cluster create failed: "
                           + " ".join(out.stdout.decode(errors="replace").split()[-30:]))
        deadline = time.monotonic() + timeout_s
        while not _cluster_ok(ports, replicas):
            if time.monotonic() > deadline:
                raise SowError(f"the cluster on ports {ports} was not ready after "
                               f"{timeout_s:g} s; see {data_dir}/node-*/redis.log")
            time.sleep(0.1)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_redis(url: str, data_dir: str) -> subprocess.Popen[bytes]:
    """Start redis-server for a local URL with AOF persistence in ``data_dir/redis-<port>``.

    Raises:
        SowError: the URL is not local, or as :func:`spawn_redis`.
    """
    u = urlparse(url)
    if u.hostname not in LOCAL_HOSTS and u.hostname is not None:
        raise SowError(f"no Redis answers at {redact(url)}, and it is not local: start it there")
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

    def __init__(self, label: str, args: list[str], env: dict[str, str]) -> None:
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


def redis_warnings(url: str) -> list[str]:
    """What is unsafe in how the Redis at ``url`` is configured for a SOW (the records are
    the data: deploy/redis.conf): an eviction policy other than ``noeviction`` (Redis would
    drop records under memory pressure), or no persistence at all (neither AOF nor RDB
    snapshots: a restart loses everything). [] when it cannot be asked (e.g. CONFIG is
    renamed or refused by the ACL)."""
    try:
        primaries = connect_primaries(url, socket_timeout_s=2)
    except (RedisError, OSError):
        return []
    return [w for name, node in primaries for w in _config_warnings(
        node, redact(url) if name is None else f"{redact(url)} (primary {name})")]


def _config_warnings(r: Client, where: str) -> list[str]:
    """:func:`redis_warnings` of one server (client ``r``, named ``where`` in the lines)."""

    try:
        cfg = r.config_get("maxmemory-policy", "appendonly", "save")
    except (RedisError, OSError):
        return []
    out = []
    policy = cfg.get("maxmemory-policy", "noeviction")
    if policy != "noeviction":
        out.append(f"Redis at {where} runs with maxmemory-policy {policy}: it may evict SOW "
                   "records under memory pressure; use noeviction (deploy/redis.conf)")
    if cfg.get("appendonly", "no") != "yes" and not (cfg.get("save") or "").strip():
        out.append(f"Redis at {where} has no persistence (appendonly no, no save points): a "
                   "restart loses the SOW; use appendonly yes (deploy/redis.conf)")
    return out


def run_up(settings: Settings, workers: int, data_dir: str, apply_config: bool = True,
           cluster: tuple[int, int] | None = None) -> None:
    """Run redis (if needed) + config + ``workers`` worker processes until interrupted; the
    pidfile (:func:`write_pidfile`) exists while they run.

    ``cluster=(N, R)``: start a Redis Cluster of N primaries with R replicas each
    (:func:`spawn_cluster`, data in ``data_dir/cluster``) and a plain redis-server as control
    plane (``data_dir/control``), on free loopback ports, instead of using ``--redis-url``;
    print both URLs; stop them all at the end (not restarted when one dies: a cluster fails
    a dead primary over to its replica).

    Supervision: a worker or expirer that dies is restarted (at once, then after
    ``RESTART_MIN_S`` doubling to ``RESTART_MAX_S`` while it keeps dying within
    ``HEALTHY_S``); a redis-server started here that dies is started again on the same port
    and data dir, which reloads its AOF. Each event is one line on stderr.
    """
    redis_proc: _LocalRedis | None = None
    local_cluster: LocalCluster | None = None
    control_proc: subprocess.Popen[bytes] | None = None
    if cluster is not None:
        local_cluster, control_proc, settings = _start_cluster(cluster, data_dir, settings)
    else:
        redis_proc = _start_or_check_redis(settings, data_dir)
    for warning in redis_warnings(settings.redis_url) if local_cluster is None else []:
        click.echo(f"warning: {warning}", err=True)
    children: list[_Child] = []
    stopping = False

    def stop(*_a: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    try:
        if apply_config and os.path.exists(settings.config_path):
            Sow(settings=settings).apply_config(settings.config_path)
            click.echo(f"applied {settings.config_path}", err=True)
        _spawn_children(children, settings, workers)
        click.echo(f"{workers} worker(s), the expirer and the deriver running; Ctrl-C stops "
                   "everything", err=True)
        write_pidfile(data_dir, settings.redis_url, [c.proc.pid for c in children[:workers]])
        while not stopping:
            if redis_proc is not None:
                redis_proc.check()
            for child in children:
                child.check()
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    finally:
        remove_pidfile(data_dir)
        stop_processes([c.proc for c in children], timeout_s=15)
        if redis_proc is not None:
            redis_proc.shutdown()
        if local_cluster is not None:
            local_cluster.stop()
        if control_proc is not None:
            _terminate(control_proc)
        click.echo("stopped", err=True)


def _start_cluster(cluster: tuple[int, int], data_dir: str, settings: Settings
                   ) -> tuple[LocalCluster, subprocess.Popen[bytes], Settings]:
    """``up --cluster N R``: start the Redis Cluster and its control Redis; print both URLs.

    Returns:
        The cluster, the control Redis's process and ``settings`` naming both.

    Raises:
        SowError: as :func:`spawn_cluster` and :func:`spawn_redis` (the cluster is stopped
            when the control Redis does not start).
    """
    local_cluster = spawn_cluster(cluster[0], cluster[1], Path(data_dir, "cluster"),
                                  persist=True)
    cport = free_port()
    try:
        control_proc = spawn_redis(cport, Path(data_dir, "control"))
    except BaseException:
        local_cluster.stop()
        raise
    settings = replace(settings, redis_url=local_cluster.url,
                       control_url=f"redis://127.0.0.1:{cport}/0")
    click.echo(f"started a Redis Cluster of {cluster[0]} primaries with {cluster[1]} "
               f"replica(s) each (ports {' '.join(map(str, local_cluster.ports))}; data in "
               f"{data_dir}/cluster) and a control Redis", err=True)
    click.echo(f"SOW_REDIS_URL={local_cluster.url}")
    click.echo(f"SOW_CONTROL_URL={settings.control_url}")
    sys.stdout.flush()
    return local_cluster, control_proc, settings


def _start_or_check_redis(settings: Settings, data_dir: str) -> _LocalRedis | None:
    """Start a local redis-server when none answers at ``settings.redis_url``; check that a
    cluster URL answers as a Redis Cluster.

    Returns:
        The redis-server started here, None when one already answered.

    Raises:
        SowError: no node of a cluster URL answers, or it does not answer as a cluster; as
            :func:`start_redis`.
    """
    url = settings.redis_url
    if not _ping(url):
        if is_cluster_url(url):
            raise SowError(f"no Redis Cluster node answers at {redact(url)}: "
                           "start the cluster first, or let `up --cluster N` start one")
        proc = _LocalRedis(url, data_dir, start_redis(url, data_dir))
        click.echo(f"started redis-server at {redact(url)} (data in {data_dir})", err=True)
        return proc
    if is_cluster_url(url):
        try:
            connect(url)  # reads the slot map: a plain server fails here
        except RedisClusterException as exc:
            raise SowError(f"{redact(url)} does not answer as a Redis Cluster: "
                           f"{' '.join(str(exc).split())}") from None
        click.echo(f"using the Redis Cluster at {redact(url)} (control Redis "
                   f"{redact(control_url_for(url, settings.control_url))})", err=True)
    return None


def _spawn_children(children: list[_Child], settings: Settings, workers: int) -> None:
    """Start ``workers`` worker processes, the expirer and the deriver, appending each to ``children``
    as it starts (so the ones started are stopped when a later one fails to start)."""
    env = dict(os.environ, SOW_REDIS_URL=settings.redis_url)
    if settings.control_url:
        env["SOW_CONTROL_URL"] = settings.control_url
    cli = [sys.executable, "-m", "sow_redis.cli"]
    for i in range(workers):
        children.append(_Child(f"worker {i}", cli + ["worker", "--name", f"sow-{i}"], env))
    children.append(_Child("expirer", cli + ["expirer"], env))
    children.append(_Child("deriver", cli + ["derive"], env))


def _terminate(proc: subprocess.Popen[bytes], timeout_s: float = 15) -> None:
    """SIGTERM ``proc`` and wait up to ``timeout_s`` seconds; then kill it."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()


class _LocalRedis:
    """The redis-server ``up`` started: restarted on the same port and data dir (its AOF)
    when it dies, after ``RESTART_MIN_S`` doubling to ``RESTART_MAX_S`` while restarts
    fail."""

    def __init__(self, url: str, data_dir: str, proc: subprocess.Popen[bytes]) -> None:
        self.url, self.data_dir, self.proc = url, data_dir, proc
        self.deaths, self.retry_at = 0, 0.0

    def check(self) -> None:
        """Start the server again when it died and its time has come (one line on stderr
        per event)."""
        if self.proc.poll() is None or time.monotonic() < self.retry_at:
            return
        url, data_dir = redact(self.url), self.data_dir
        click.echo(f"redis-server at {url} exited ({self.proc.returncode});"
                   f" restarting it (data in {data_dir})", err=True)
        try:
            self.proc = _respawn_redis(self.url, data_dir)
            self.deaths = 0
            click.echo(f"redis-server restarted at {url}", err=True)
        except SowError as exc:
            self.deaths += 1
            delay = min(RESTART_MAX_S, RESTART_MIN_S * 2 ** (self.deaths - 1))
            self.retry_at = time.monotonic() + delay
            click.echo(f"{exc}; retrying in {delay:.1f} s", err=True)

    def shutdown(self) -> None:
        """``SHUTDOWN NOSAVE`` (the AOF is written as it goes), then wait up to 15 s for the
        process; kill it after that."""
        _shutdown_redis(self.url)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -- pidfile, up --detach, down ----------------------------------------------------------
PIDFILE = "up.pid"
"""File in ``--data-dir`` naming the running ``up`` supervisor (see :func:`write_pidfile`)."""

UP_LOG = "up.log"
"""File in ``--data-dir`` receiving the output of a detached ``up`` and its processes."""

READY_TIMEOUT_S = 60.0
"""Default seconds ``up --detach`` waits for Redis, the config and the workers."""

DOWN_TIMEOUT_S = 60.0
"""Default seconds ``down`` waits for the supervisor to stop."""


@dataclass(frozen=True)
class UpProcess:
    """What a pidfile says: supervisor ``pid``, its ``redis_url`` and its ``workers`` (pids
    at start; a restarted worker has a new pid)."""

    pid: int
    redis_url: str
    workers: tuple[int, ...]


def write_pidfile(data_dir: str | Path, redis_url: str, worker_pids: list[int]) -> Path:
    """Write ``<data_dir>/up.pid`` for this process: three lines, the pid, the Redis URL and
    the worker pids (space-separated). Written whole (rename), so a reader never sees half.
    Readable by its owner only (mode 0600): the URL may hold a password, which ``down`` needs
    to stop the redis-server."""
    d = Path(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    path, tmp = d / PIDFILE, d / f"{PIDFILE}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n{redis_url}\n{' '.join(map(str, worker_pids))}\n")
    os.replace(tmp, path)
    return path


def read_pidfile(data_dir: str | Path) -> UpProcess | None:
    """The pidfile of ``data_dir``, or None when there is none (or it is unreadable)."""
    try:
        lines = (Path(data_dir) / PIDFILE).read_text().split("\n")
        return UpProcess(int(lines[0]), lines[1], tuple(int(x) for x in lines[2].split()))
    except (OSError, ValueError, IndexError):
        return None


def remove_pidfile(data_dir: str | Path, pid: int | None = None) -> None:
    """Remove the pidfile of ``data_dir`` if it names ``pid`` (default: this process)."""
    found = read_pidfile(data_dir)
    if found is not None and found.pid == (os.getpid() if pid is None else pid):
        (Path(data_dir) / PIDFILE).unlink(missing_ok=True)


def is_up_process(pid: int) -> bool:
    """True when ``pid`` is alive and runs ``sow-redis … up`` or ``python -m sow_redis.cli …
    up`` (checked in /proc where there is one), so a stale pidfile whose pid was reused
    never gets a signal."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    if not Path("/proc/self/cmdline").exists():
        return True
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    cli = any(a == b"sow_redis.cli" or a.endswith(b"sow-redis") for a in argv)
    return cli and b"up" in argv  # a zombie's cmdline is empty


def ready_workers(redis_url: str, pids: set[int]) -> int:
    """How many of the rq workers registered in Redis are one of ``pids`` on this host and
    idle or busy (past start-up); 0 when Redis does not answer."""

    try:
        r = Redis.from_url(redis_url, socket_connect_timeout=1.0, **tls_options(redis_url))
        found = Worker.all(connection=r)
    except (RedisConnectionError, OSError):
        return 0
    host = socket.gethostname()
    return sum(1 for w in found if w.pid in pids and w.hostname == host
               and w.get_state() in ("idle", "busy"))


def _shutdown_redis(url: str) -> None:

    try:
        Redis.from_url(url, socket_connect_timeout=1.0, **tls_options(url)).shutdown(save=False)
    except Exception:
        pass


def _last_line(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else "(no output)"


def start_detached(settings: Settings, workers: int, data_dir: str, apply_config: bool = True,
                   timeout_s: float = READY_TIMEOUT_S) -> str:
    """Start ``sow-redis up`` in the background (own session, output to ``<data_dir>/up.log``)
    and return a one-line report once Redis answers, the config is applied and ``workers``
    rq workers are registered and idle.

    When an ``up`` of ``data_dir`` already runs on the same Redis, says so and starts nothing.

    Raises:
        SowError: an ``up`` of ``data_dir`` runs on another Redis; the supervisor exited during
            start-up; or it was not ready within ``timeout_s`` seconds (it is stopped then).
    """
    url = settings.redis_url
    if url.startswith("memory://"):
        raise SowError("up needs a redis:// URL; memory:// runs inside each process")
    d = Path(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    old = read_pidfile(d)
    if old is not None and is_up_process(old.pid):
        if _same_redis(old.redis_url, url):
            return (f"sow-redis up already runs at {redact(url)} from {data_dir} (pid {old.pid}); "
                    "nothing started")
        raise SowError(f"a sow-redis up of {redact(old.redis_url)} runs from {data_dir} (pid "
                       f"{old.pid}): `sow-redis down` stops it, or give another --data-dir")
    log = d / UP_LOG
    had_redis = _ping(url)
    # the URLs go in the environment, never in argv: `ps` shows argv (and a password) to
    # every user, /proc/<pid>/environ only to the owner
    args = [sys.executable, "-m", "sow_redis.cli",
            "--config", settings.config_path, "up", "--workers", str(workers),
            "--data-dir", str(data_dir)] + ([] if apply_config else ["--no-config"])
    env = dict(os.environ, SOW_REDIS_URL=url)
    env.pop("SOW_CONTROL_URL", None)
    if settings.control_url:
        env["SOW_CONTROL_URL"] = settings.control_url
    control = control_url_for(url, settings.control_url)
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
    deadline = time.monotonic() + timeout_s
    while True:
        rc = proc.poll()
        if rc is not None:
            raise SowError(f"sow-redis up exited (status {rc}) before it was ready: "
                           f"{_last_line(log)} (log: {log})")
        mine = read_pidfile(d)
        if (mine is not None and mine.pid == proc.pid
                and ready_workers(control, set(mine.workers)) >= workers):
            break
        if time.monotonic() > deadline:
            why = _last_line(log)
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            remove_pidfile(d, proc.pid)
            if not had_redis and _ping(url):  # stopped before it could stop its redis-server
                _shutdown_redis(url)
            raise SowError(f"sow-redis up was not ready within {timeout_s:g} s, stopped it; "
                           f"its last line: {why} (log: {log})")
        time.sleep(0.05)
    applied = (f", {settings.config_path} applied"
               if apply_config and os.path.exists(settings.config_path) else "")
    return (f"sow-redis up ready at {redact(url)}{applied}: {workers} worker(s) and the expirer "
            f"(pid {proc.pid}, log {log}); `sow-redis down` stops it")


def _same_redis(a: str, b: str) -> bool:
    """Whether two URLs name the same server and database (localhost = 127.0.0.1; a cluster
    URL by its first seed node)."""
    def norm(url: str) -> tuple[str, int, str]:
        u = urlparse(first_seed_url(url))
        host = "127.0.0.1" if (u.hostname or "") in LOCAL_HOSTS else u.hostname or ""
        return host, u.port or 6379, u.path.strip("/") or "0"

    return norm(a) == norm(b)


def stop_detached(settings: Settings, data_dir: str,
                  timeout_s: float = DOWN_TIMEOUT_S) -> tuple[bool, str]:
    """Stop the ``up`` that runs from ``data_dir`` (detached or not): SIGTERM to the
    supervisor, which stops its workers and the expirer and shuts down the redis-server it
    started; wait until it is gone.

    Returns:
        (stopped, one-line report); ``stopped`` is False when nothing ran.

    Raises:
        SowError: that ``up`` serves another Redis than ``settings.redis_url``, or it did not
            stop within ``timeout_s`` seconds.
    """
    found = read_pidfile(data_dir)
    if found is None or not is_up_process(found.pid):
        if found is not None:
            remove_pidfile(data_dir, found.pid)  # stale: its process is gone
        return False, f"no sow-redis up runs from {data_dir}; nothing to stop"
    if not _same_redis(found.redis_url, settings.redis_url):
        raise SowError(f"the sow-redis up of {data_dir} (pid {found.pid}) serves "
                       f"{redact(found.redis_url)}, not {redact(settings.redis_url)}: give that --redis-url")
    os.kill(found.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while is_up_process(found.pid):
        if time.monotonic() > deadline:
            raise SowError(f"sow-redis up (pid {found.pid}) did not stop within {timeout_s:g} s"
                           f"; see {Path(data_dir) / UP_LOG}")
        time.sleep(0.05)
    remove_pidfile(data_dir, found.pid)
    return True, f"stopped sow-redis up (pid {found.pid}) at {redact(found.redis_url)}"
