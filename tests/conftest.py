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

import ast
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from redis import Redis

from sow_redis.client import Sow
from sow_redis.connection import connect, is_cluster_url
from sow_redis.ops.server import (  # free_port: tests import it from here
    free_port,  # noqa: F401
    spawn_cluster,
    spawn_redis_on_free_port,
)

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"

PYCACHE = Path(tempfile.gettempdir()) / f"sow-redis-test-pycache-{os.getuid()}"
"""Bytecode cache of the test run's Python processes when the environment forbids writing it
(``PYTHONDONTWRITEBYTECODE``): without it every one of the run's ~270 Python processes (the
xdist workers, ``sow-redis worker``, ``expirer`` and CLI processes, the bench scripts)
compiled the checkout's ``.py`` files again: 4 CPU-seconds more per worker's collection, 0.1
to 0.3 s more per process. Outside the checkout (``PYTHONPYCACHEPREFIX``), so no
``__pycache__`` appears in it; Python checks each entry against its source, so a stale one
is never used. Set here, before pytest-xdist starts its workers, so they inherit it;
``PYTHONPYCACHEPREFIX`` set by the caller is kept."""
if os.environ.get("PYTHONDONTWRITEBYTECODE") and "PYTHONPYCACHEPREFIX" not in os.environ:
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    sys.dont_write_bytecode = False
    sys.pycache_prefix = str(PYCACHE)

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # started in the background by a shell without job control (``cmd &`` in a script), the
    # run inherits SIGINT ignored, and so would every process it starts: the Ctrl-C tests
    # (``sow-redis`` commands, ``up`` stopping its workers) then fail. Python's own handler
    # here makes the processes this run starts get SIGINT's default, as from a terminal.
    signal.signal(signal.SIGINT, signal.default_int_handler)

# short lease / marker lifetimes so takeover tests run in seconds
FAST = {"SOW_LEASE_MS": "1000", "SOW_MARKER_TTL_MS": "1500", "SOW_SWEEP_INTERVAL_S": "0.2"}


def _own_redis(folder: Path):
    """Yields ``redis://127.0.0.1:<free port>/0`` of a redis-server without persistence whose
    files go to ``folder``, then terminates it (a fixture's body)."""
    port, proc = spawn_redis_on_free_port(folder, persist=False)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


CORE = {"test_publish", "test_query", "test_range_index", "test_expiration", "test_chaining",
        "test_subscribe", "test_workers", "test_write_through", "test_apply_load", "test_integrity",
        "test_migrate_live", "test_change_previous", "test_delta_subscribe", "test_aggregate",
        "test_derive", "test_history", "test_subscribe_keys", "test_transient",
        "test_query_paging"}
"""Test modules whose data-plane tests run on one server and on the cluster."""

PLANE_FIXTURES = {"url", "r", "sow", "backend_url", "lonely_url"}

CONTROL: dict[str, str] = {}
"""Cluster URL → the URL of its control Redis (rq), for :func:`cli_env`."""


def pytest_generate_tests(metafunc):
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module in CORE and PLANE_FIXTURES & set(metafunc.fixturenames):
        cluster = pytest.param("cluster", marks=pytest.mark.cluster)  # not in the fast lane
        metafunc.parametrize("plane", ["server", cluster], indirect=True)


# -- pytest-xdist (scripts/test.sh runs the suite with -n N --dist loadgroup) ---------------
SPARK_FIXTURES = frozenset({"spark", "spark_standalone"})
"""The tests that take one of these fixtures (as a parameter) run on one xdist worker, one
after the other: the standalone Spark cluster and the session start once per run. The other
tests of the Spark test files (a CLI ``spark`` command in a JVM of its own) are units of their
own, handed out after the longest tests (:func:`pytest_collection_modifyitems`), not at the
start of the run, where the JVMs of four Spark tests side by side took a CLI load of 3 rows
from 8 s alone to 493 s: in the group they took 67 s of it, and the group was the run's
longest path (2026-11-28: it ended 15-23 s after every other worker). The Spark benchmark's
test runs beside the group too: in it, the group ended 100 s after every other worker."""

WHOLE_FILES = frozenset({"tests/test_fixtures.py"})
"""Files whose tests run on one worker in file order: a later test there checks what an
earlier one left (test_fixtures: ``lonely_url`` is the same server within a module)."""

LONGEST = ("test_bench_spark_compares", "test_expirer_and_workers_race_for_60s",
           "test_kill9_workers_during_500k_mixed_ingest", "test_every_failure_path_is_one_line",
           "test_up_cluster_starts_a_cluster", "test_redis_kill9_keeps_every_acknowledged",
           "test_a_view_equals_a_recompute_after_10000", "test_as_of_equals_a_model_after",
           "test_redis_unreachable_10s", "test_readme_")
"""Tests of 15 s or more (``--durations``) outside the Spark group: under xdist they are
handed out right after the Spark group, so none of them starts last (the Spark CLI tests,
marked ``spark``, follow with those marked ``slow`` and ``faults``)."""


@functools.cache
def _spark_tests() -> frozenset[str]:
    """``path::name`` of every test function in tests/ with a :data:`SPARK_FIXTURES`
    parameter, from the files' syntax trees: the xdist controller schedules by node id and
    collects nothing itself."""
    found = set()
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test") and (
                    SPARK_FIXTURES & {a.arg for a in node.args.args}):
                found.add(f"tests/{path.name}::{node.name}")
    return frozenset(found)


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: pytest-xdist's group scheduling, where the tests of
    :func:`_spark_tests` form the group ``spark-session`` and each of :data:`WHOLE_FILES`
    a group of its own (pytest-xdist 3.8 cannot see an ``xdist_group`` mark on pytest 9.2:
    pytest-dev/pytest-xdist#1386); every other test is a unit of its own, handed to
    whichever worker is free."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    spark = _spark_tests()

    class SparkGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.split("[", 1)[0] in spark:
                return "spark-session"
            if nodeid.split("::", 1)[0] in WHOLE_FILES:
                return nodeid.split("::", 1)[0]
            return super()._split_scope(nodeid)

    return SparkGroupScheduling(config, log)


SERIAL_FILES = frozenset({
    "test_resilience.py", "test_cluster_failover.py", "test_migrate_live.py", "test_cli_unix.py",
    "test_logs.py", "test_workers.py", "test_expirer_wake.py", "test_up_existing.py",
    "test_dashboard_sow.py"})
"""Test files bound to wall-clock time (a restart within seconds, a Ctrl-C at a given moment, a
cluster failover's 2 s node timeout): on 2 cores, beside 6 busy xdist workers, they starve
and fail. They are marked ``serial``, and scripts/test.sh runs them one at a time beside the
parallel part, which runs at the idle scheduling policy (a serial test that wakes gets a core
at once)."""


def pytest_itemcollected(item):
    """Mark the tests of :data:`SERIAL_FILES` ``serial``."""
    if item.path.name in SERIAL_FILES:
        item.add_marker(pytest.mark.serial)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist: the run starts with the work that takes longest, so no worker is
    left with a long test at the end: the Spark group, then :data:`LONGEST`, then the tests
    marked spark, faults or slow, then those on the cluster, then the rest (each in
    collection order; every worker sorts alike). Without xdist the files' order stays."""
    if not hasattr(config, "workerinput"):  # not a pytest-xdist worker
        return

    def rank(item) -> int:
        if item.nodeid.split("[", 1)[0] in _spark_tests():
            return 0
        if item.name.startswith(LONGEST):
            return 1
        marks = {m.name for m in item.iter_markers()}
        if marks & {"spark", "faults", "slow"}:
            return 2
        return 3 if "cluster" in marks else 4

    items.sort(key=rank)  # stable: collection order within a rank


@pytest.fixture
def plane(request):
    """``"server"`` or ``"cluster"``: the data plane of this test (only core modules run on
    both)."""
    return getattr(request, "param", "server")


def client(url: str):
    """A client (bytes replies) of a server or cluster URL."""
    return connect(url) if is_cluster_url(url) else Redis.from_url(url)


def command_calls(r, *commands: str) -> dict[str, int]:
    """How many times one server ran each of ``commands`` (lower case), from its command
    statistics (``INFO commandstats``): what tests read to see which reads a path made."""
    stats = r.info("commandstats")
    return {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in commands}


def control(url: str):
    """A client of the control Redis (rq) of data URL ``url``: the cluster's control Redis,
    or the server itself."""
    return client(CONTROL.get(url, url))


def _own_cluster(folder: Path, replicas: int):
    """Yields ``(cluster URL, control URL, LocalCluster)`` of a 3-primary cluster with ``replicas`` replicas
    each and a plain control redis-server, without persistence, then stops them."""
    cluster = spawn_cluster(3, replicas, folder / "cluster")
    port, control = spawn_redis_on_free_port(folder / "control", persist=False)
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
    Cluster without replicas (cluster-node-timeout 2000 ms) and its control Redis, started for
    this test session. No replicas: every write would be made twice, and on a loaded machine a
    replica may take over a primary that missed its node timeout; the tests that need
    replicas (durable publishing, failover) start a cluster of their own."""
    yield from _own_cluster(tmp_path_factory.mktemp("cluster"), replicas=0)


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
    env = dict(os.environ, SOW_REDIS_URL=url, **{**FAST, **extra})  # extra overrides FAST
    if url in CONTROL:
        env.setdefault("SOW_CONTROL_URL", CONTROL[url])
    else:
        env.pop("SOW_CONTROL_URL", None)
    return env


def start_worker(url: str, *args: str, **extra: str) -> subprocess.Popen:
    """``sow-redis worker ARGS`` as a process. Its output (stdout and stderr) goes to a file,
    never a pipe: a worker whose output no test reads would block once a pipe's 64 KiB
    filled (a long test under load logs more); ``proc.stdout`` reads that file from its
    start (after the worker ended: everything it printed). Python's fault handler is on, so
    a crash leaves its threads' stacks there (a worker stopped by SIGTERM ended once with
    SIGSEGV in CI, 2026-11-28)."""
    fd, path = tempfile.mkstemp(prefix="sow-worker-", suffix=".log")
    extra.setdefault("PYTHONFAULTHANDLER", "1")
    try:
        with open(fd, "ab") as log:  # appends: the reader below has an offset of its own
            proc = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "worker", *args],
                                    env=cli_env(url, **extra), stdout=log,
                                    stderr=subprocess.STDOUT)
        proc.stdout = open(path, "rb")  # noqa: SIM115 - closed with the Popen
    finally:
        os.unlink(path)  # the open files keep it while they need it
    return proc


IN_PROCESS = frozenset({"config", "publish", "delta-publish", "sow", "sow-delete", "subscribe",
                        "sow-and-subscribe", "bookmarks", "errors", "chains", "stats", "status",
                        "keys", "rebuild"})
"""Commands :func:`run_cli` runs in the test's own process (click's ``CliRunner``): they end
by themselves and what they print is under test, not the process. The others (``up``,
``down``, ``worker``, ``expirer``, ``dashboard``, ``metrics``, ``spark``: processes,
signals, rq's logging, a JVM) run as ``python -m sow_redis.cli``, as does every call with
``process=True``."""


def _command(args: tuple[str, ...]) -> str:
    """The command name in ``args``, after the group's options."""
    rest = list(args)
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option in ("--redis-url", "--control-url", "--config", "--log-level"):
            rest = rest[1:]
    if rest and rest[0] == "stats" and "--watch" in rest:
        return "stats --watch"
    return rest[0] if rest else ""


def _run_in_process(env: dict[str, str], args: tuple[str, ...],
                    input: bytes | None) -> subprocess.CompletedProcess:
    """``sow-redis ARGS`` through click's ``CliRunner`` with ``env`` as the environment:
    the same exit status, standard output and standard error (an exception that escapes
    the command is written to stderr as a traceback, as the interpreter would). The
    ``sow_redis`` logger and the SIGINT/SIGTERM handlers are restored afterwards, and the
    command's connections closed."""
    import gc
    import logging
    import traceback

    from click.testing import CliRunner

    from sow_redis.cli import main

    changes: dict[str, str | None] = {k: v for k, v in env.items() if os.environ.get(k) != v}
    changes.update({k: None for k in os.environ if k not in env})
    logger = logging.getLogger("sow_redis")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        result = CliRunner(env=changes).invoke(main, list(args), input=input,
                                               prog_name="sow-redis")
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        gc.collect()  # the command's Redis clients close their connections, as at a process exit
    stderr = result.stderr_bytes or b""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        exc = result.exception
        stderr += "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).encode()
    return subprocess.CompletedProcess(["sow-redis", *args], result.exit_code,
                                       result.stdout_bytes, stderr)


def sow_redis_cli(env: dict[str, str], *args: str, input: bytes | None = None,
                  timeout: float = 120, process: bool = False,
                  in_process: bool = False, renice: bool = True) -> subprocess.CompletedProcess:
    """``sow-redis ARGS`` with the environment ``env``, as a
    :class:`subprocess.CompletedProcess` (bytes). Commands of :data:`IN_PROCESS` run in this
    process (about 0.7 s of interpreter start-up saved per call; ``timeout`` is not enforced
    there); the others, and any with ``process=True``, as a process of their own;
    ``in_process=True`` runs any command here (a ``spark`` command of a test that holds the
    ``spark`` fixture then reuses the test session's Spark instead of starting a JVM).
    A ``spark`` command's process runs at :data:`SPARK_NICE` unless ``renice=False`` (the
    longest of them: at nice 10 beside six busy workers it was the run's last test)."""
    if in_process or (not process and _command(args) in IN_PROCESS):
        return _run_in_process(env, args, input)
    spark = renice and _command(args) == "spark"  # a JVM: at SPARK_NICE
    return subprocess.run([sys.executable, "-m", "sow_redis.cli", *args], env=env,
                          input=input, capture_output=True, timeout=timeout,
                          preexec_fn=(lambda: _renice(0)) if spark else None)  # noqa: PLW1509


def run_cli(url: str, *args: str, input: bytes | None = None, check: bool = True,
            timeout: float = 120, process: bool = False, in_process: bool = False,
            renice: bool = True, **extra: str) -> subprocess.CompletedProcess:
    """``sow-redis ARGS`` against ``url`` with :func:`cli_env`'s environment (plus ``extra``),
    through :func:`sow_redis_cli`. With ``check``, a non-zero exit status fails the test."""
    proc = sow_redis_cli(cli_env(url, **extra), *args, input=input, timeout=timeout,
                         process=process, in_process=in_process, renice=renice)
    if check and proc.returncode != 0:
        raise AssertionError(f"sow-redis {' '.join(args)} failed: {proc.stderr.decode()}")
    return proc


def random_record(rnd, id_: object, value) -> dict:
    """A record of random shape for the aggregation tests: ``id_``, a grouping value of mixed
    types (``/g``: 1, 1.0 and True apart), ``/h``, and the fields ``v w qty px n`` at the top
    and under ``/a``, each there 9 times in 10 with ``value()``."""
    rec: dict = {"id": id_, "g": rnd.choice([1, 2, "b", None, 1.0, True]),
                 "h": rnd.choice(["x", "y"]), "a": {"g": rnd.choice(["p", "q"])}}
    for name in ("v", "w", "qty", "px", "n"):
        if rnd.random() < 0.9:
            rec[name] = value()
        if rnd.random() < 0.9:
            rec["a"][name] = value()
    return rec


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

SPARK_TEST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Java options of this run's Spark JVMs: the drivers (this process's and the CLI's, through
``PYSPARK_SUBMIT_ARGS``), the executors and the standalone daemons. Their jobs are small and
short: the client compiler only (no C2 compile threads) and one GC thread cut their CPU time
on a 2-core machine that runs the tests on several xdist workers at once."""
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f"--driver-java-options '{SPARK_TEST_JVM}' --conf "
                      f"'spark.executor.extraJavaOptions={SPARK_TEST_JVM}' pyspark-shell")
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", SPARK_TEST_JVM)

SPARK_NICE = 4
"""Niceness of this run's Spark JVMs (the standalone daemons and their executors, the
session's driver, the CLI's ``spark`` commands): the Spark tests check results, not timings,
while the fault and expiry tests on the other xdist workers measure seconds and lose them
when JVMs compete with their Redis and workers for the 2 cores. Not more: the tests of the
Spark session run one after the other on one worker (:data:`SPARK_FIXTURES`), one of the run's
longest paths. In scripts/test.sh's parallel part it changes nothing: Linux gives every task
of the idle scheduling policy the same weight, whatever its niceness."""


def _renice(pid: int) -> None:
    """Run ``pid`` (0: this process) at :data:`SPARK_NICE` more than this process's niceness
    (scripts/test.sh runs the parallel part at nice 19 where ``chrt`` is missing), at most
    19."""
    try:
        own = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, pid, min(19, own + SPARK_NICE))
    except OSError:  # gone already, or not allowed: it runs at the normal priority
        pass


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


def first_flights(tmp_path_factory: pytest.TempPathFactory, n: int) -> Path:
    """The first ``n`` NYC flights as JSON Lines (``flights_<n>.jsonl``), cut from the export of
    scripts/export_flights.py (about 4 CPU-seconds), which is made once per test run: under
    pytest-xdist in the run's base folder, shared by the workers (a lock lets one export while
    the others wait; the script leaves a fresh export alone)."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    out = base / "flights-export"
    out.mkdir(exist_ok=True)
    small = out / f"flights_{n}.jsonl"
    with open(out / ".lock", "wb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not small.exists():
            subprocess.run([sys.executable, str(ROOT / "scripts" / "export_flights.py"),
                            str(out)], check=True, capture_output=True, timeout=300)
            part = small.with_suffix(".part")
            with open(out / "flights.jsonl", "rb") as src, open(part, "wb") as dst:
                for i, line in enumerate(src):
                    if i >= n:
                        break
                    dst.write(line)
            part.rename(small)
    return small


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory):
    """A :class:`sow_redis.spark.standalone.StandaloneCluster`: master and two workers (1
    core, 1 GB each) on loopback ports, for this test session."""
    from sow_redis.spark.standalone import start_standalone

    cluster = start_standalone(tmp_path_factory.mktemp("spark-standalone"), workers=2,
                               cores=1, memory="1g")
    for proc in cluster.procs:  # their executors, started later, inherit it
        _renice(proc.pid)
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
    gateway = getattr(session.sparkContext._gateway, "proc", None)  # the driver's JVM
    if gateway is not None:
        _renice(gateway.pid)
    yield session
    session.stop()
