"""A Spark standalone cluster of local processes (a master and N workers on loopback ports),
started from the installed PySpark's ``spark-class``: for the tests and the benchmarks, so
the Spark commands run against ``spark://127.0.0.1:PORT`` as they would against a real
cluster (executors in JVMs of their own, Python workers started by them, the package shipped
to them by :func:`sow_redis.spark.session.ship_package`).

Nothing here is used by ``sow-redis spark …`` itself, which connects to whatever master
``--master`` names.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SowError
from ..ops.server import free_port, stop_processes

DAEMON_MEMORY = "256m"
"""Heap of the master's and each worker's own JVM (``SPARK_DAEMON_MEMORY``; Spark's default
is 1g): they only schedule, the executors they start do the work."""


def spark_home() -> str:
    """The Spark installation of the installed PySpark (``SPARK_HOME`` when set).

    Raises:
        SowError: pyspark is not installed.
    """
    if os.environ.get("SPARK_HOME"):
        return os.environ["SPARK_HOME"]
    try:
        # start-up time: pyspark (the optional [spark] extra) loads once Spark runs
        import pyspark
    except ImportError:
        raise SowError("pyspark is not installed: pip install -e '.[spark]'") from None
    return os.path.dirname(pyspark.__file__)


@dataclass
class StandaloneCluster:
    """A running master and its workers (:func:`start_standalone`).

    Attributes:
        master_url: ``spark://127.0.0.1:<port>``.
        ui_port: the master's web UI port (its ``/json/`` lists the alive workers).
        workdir: the folder of the daemons' logs and the executors' work folders.
        procs: the master first, then each worker.
    """

    master_url: str
    ui_port: int
    workdir: Path
    cores: int
    memory: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def alive_workers(self) -> int:
        """Workers the master counts as alive now (0 when its UI does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/",
                                        timeout=2) as resp:
                state = json.loads(resp.read())
        except (OSError, ValueError):
            return 0
        return int(state.get("aliveworkers", 0))

    def add_worker(self, timeout_s: float = 60.0) -> None:
        """Start one more worker (``cores`` cores, ``memory`` for executors) and wait until
        the master counts it.

        Raises:
            SowError: the worker did not register within ``timeout_s`` seconds.
        """
        n = len(self.procs)
        want = self.alive_workers() + 1
        self.procs.append(_spawn(self.workdir, f"worker-{n}", [
            "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
            "--port", str(free_port()), "--webui-port", str(free_port()),
            "--cores", str(self.cores), "--memory", self.memory,
            "--work-dir", str(self.workdir / f"work-{n}"), self.master_url]))
        self._wait(lambda: self.alive_workers() >= want, timeout_s,
                   f"worker {n} did not register with {self.master_url}")

    def stop(self) -> None:
        """Stop the workers, then the master (SIGTERM; their executors end with them)."""
        stop_processes(list(reversed(self.procs)), timeout_s=15)
        self.procs.clear()

    def _wait(self, pred: object, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():  # type: ignore[operator]
            for proc in self.procs:
                if proc.poll() is not None:
                    raise SowError(f"{what}: a Spark daemon exited with status "
                                   f"{proc.returncode} (logs in {self.workdir})")
            if time.monotonic() > deadline:
                raise SowError(f"{what} within {timeout_s:g} s (logs in {self.workdir})")
            time.sleep(0.2)


def _spawn(workdir: Path, name: str, args: list[str]) -> subprocess.Popen[bytes]:
    exe = os.path.join(spark_home(), "bin", "spark-class")
    if not os.path.exists(exe) or shutil.which("java") is None:
        raise SowError("a Spark standalone cluster needs pyspark's spark-class and a Java "
                       "runtime (apt-get install default-jre-headless)")
    # no SOW_* / PYSPARK_* settings of the process that starts the cluster: executors get
    # what the driver sends them, as on a real cluster
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SOW_", "PYSPARK_"))}
    env.update(SPARK_DAEMON_MEMORY=DAEMON_MEMORY, SPARK_LOG_DIR=str(workdir),
               SPARK_NO_DAEMONIZE="1", SPARK_LOCAL_IP="127.0.0.1")
    log = open(workdir / f"{name}.log", "ab")
    try:
        return subprocess.Popen([exe, *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True,
                                preexec_fn=_die_with_parent)  # noqa: PLW1509 (one prctl call)
    finally:
        log.close()


def _libc() -> Any:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not glibc Linux
        return None


_LIBC = _libc()


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the thread that started it ends
    (``PR_SET_PDEATHSIG``), so a test run or benchmark killed without its clean-up leaves no
    Spark daemon behind. Only a C call: nothing is imported or allocated after the fork."""
    if _LIBC is not None:
        _LIBC.prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM


def start_standalone(workdir: str | Path, workers: int = 2, cores: int = 1,
                     memory: str = "1g", timeout_s: float = 90.0) -> StandaloneCluster:
    """Start a Spark standalone master and ``workers`` workers of ``cores`` cores and
    ``memory`` (for executors) each on free loopback ports, logs in ``workdir``; wait until
    every worker registered.

    Raises:
        SowError: no pyspark / Java, or a daemon that exits or does not register within
            ``timeout_s`` seconds (every process started is stopped then).
    """
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    port, ui = free_port(), free_port()
    cluster = StandaloneCluster(master_url=f"spark://127.0.0.1:{port}", ui_port=ui,
                                workdir=wd, cores=cores, memory=memory)
    try:
        cluster.procs.append(_spawn(wd, "master", [
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(port), "--webui-port", str(ui)]))
        cluster._wait(lambda: cluster.alive_workers() >= 0 and _answers(ui), timeout_s,
                      f"the Spark master on port {port} did not start")
        for _ in range(workers):
            cluster.add_worker(timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _answers(ui_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2):
            return True
    except OSError:
        return False
