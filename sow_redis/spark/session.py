"""The SparkSession of ``sow-redis spark …`` commands: ``local[*]`` by default (``--master``
to change it), the web UI off.

On any master other than ``local[…]`` the package itself is shipped to the executors
(:func:`ship_package`: a zip of ``sow_redis`` through ``SparkContext.addPyFile``), so they
need only its dependencies (redis, orjson, xxhash, lark, google-re2, msgpack) in the Python
they run (``PYSPARK_PYTHON``; deploy/spark/README.md), not this checkout or virtualenv.
:func:`start_seconds` tells how long the last :func:`get_session` took (0 when it found a
running session: ``sow-redis spark shell`` runs several commands on one).

A command whose stderr is a terminal shows Spark's console progress bar and its log, as Spark
does. Otherwise (``quiet``: a pipe, a file, a test) stderr keeps only the command's own lines:
no progress bar, no pandas FutureWarning of pyspark, and the Java process's stderr (log4j's
warnings, the JVM's ``Using incubator modules``, executor stack traces) goes to a log file,
:func:`log_path` (``$SOW_SPARK_LOG``, default ``<tmp>/sow-redis-spark-<pid>.log``), which is
removed when the command ends unless :func:`keep_log` was called (a command that failed in
Spark names it in its error line).

:func:`error_line` turns Spark's errors into the one line a command prints.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import sys
import tempfile
import time
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pyspark is the optional [spark] extra
    from pyspark.sql import SparkSession

INSTALL_HINT = ("pyspark is not installed: pip install -e '.[spark]' (and a Java runtime: "
                "apt-get install default-jre-headless)")

_log: dict[str, Any] = {"path": None, "keep": False, "remove": False}
_start: dict[str, Any] = {"seconds": 0.0, "reused": False}


def get_session(master: str = "local[*]", app: str = "sow-redis", quiet: bool = False,
                ship: bool | None = None, conf: dict[str, str] | None = None
                ) -> SparkSession:
    """A SparkSession (the running one when there is one).

    Args:
        quiet: no progress bar and no FutureWarning of pyspark on stderr, and the Java
            process's stderr to :func:`log_path` (see the module docstring); the CLI passes
            ``not sys.stderr.isatty()``.
        ship: send the package to the executors (:func:`ship_package`); default: when
            ``master`` is not ``local[…]``.
        conf: more Spark settings for a new session (e.g. ``spark.cores.max``).

    Raises:
        RuntimeError: pyspark is not installed (the message says how to install it).
    """
    t0 = time.perf_counter()
    session, reused = _get_session(master, app, quiet, conf or {})
    if ship if ship is not None else not master.startswith("local"):
        ship_package(session)
    _start.update(seconds=0.0 if reused else time.perf_counter() - t0, reused=reused)
    return session


def start_seconds() -> tuple[float, bool]:
    """Seconds (wall clock) the last :func:`get_session` took to start Spark (the driver's
    JVM and the SparkContext; executors start with the first job), and whether it found a
    running session instead (then 0.0)."""
    return _start["seconds"], _start["reused"]


def package_zip(folder: str | Path | None = None) -> Path:
    """A zip of the ``sow_redis`` package (its ``.py``, Lua and grammar files, no caches),
    importable from ``sys.path``: ``<tmp>/sow_redis-<content hash>.zip``, built once per
    content.

    Args:
        folder: where to write it (default: the system's temporary folder).
    """
    root = Path(__file__).resolve().parent.parent
    files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                   and p.suffix not in (".pyc", ".pyo"))
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    out = Path(folder or tempfile.gettempdir()) / f"sow_redis-{h.hexdigest()[:16]}.zip"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for p in files:
                z.write(p, f"sow_redis/{p.relative_to(root)}")
        os.replace(tmp, out)
    return out


def ship_package(session: SparkSession) -> str:
    """Make ``sow_redis`` importable in the session's executors (``SparkContext.addPyFile``
    of :func:`package_zip`; the executors put it first on their ``sys.path``); once per
    session and content. The path of the zip."""
    sc = session.sparkContext
    path = str(package_zip())
    shipped: set[str] = getattr(sc, "_sow_shipped", set())
    if path not in shipped:
        sc.addPyFile(path)
        shipped.add(path)
        sc._sow_shipped = shipped  # type: ignore[attr-defined]
    return path


def _get_session(master: str, app: str, quiet: bool, conf: dict[str, str]
                 ) -> tuple[SparkSession, bool]:
    if quiet:
        # pyspark warns on import and at start that it "does not yet fully support pandas
        # >= 3.0.0": nothing a sow-redis user can act on
        warnings.filterwarnings("ignore", message=r"PySpark does not yet fully support pandas",
                                category=FutureWarning)
    try:
        # start-up time: pyspark (the optional [spark] extra) loads once Spark runs
        from pyspark.sql import SparkSession
    except ImportError:
        raise RuntimeError(INSTALL_HINT) from None
    if quiet:
        mute_query_context_loggers()
    running = SparkSession.getActiveSession()
    if running is not None:  # sow-redis spark shell: every command on the first one's
        return running, True
    # Python workers run this interpreter (the one with sow_redis and its dependencies); on a
    # cluster, ship the package and set PYSPARK_PYTHON there (deploy/spark/README.md)
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_PYTHON", python)
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.pyspark.python", python)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false" if quiet else "true")
               .config("spark.sql.shuffle.partitions", "8"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    if not quiet:
        return builder.getOrCreate(), False
    return _create_logging_to_file(builder), False


def mute_query_context_loggers() -> None:
    """Silence the loggers with which pyspark 4 logs every AnalysisException as JSON with its
    Java stack on stderr (``SQLQueryContextLogger``, ``DataFrameQueryContextLogger``) before
    the exception reaches the caller: for a caller that reports it (the CLI)."""
    try:
        # start-up time: pyspark (the optional [spark] extra) loads once Spark runs
        from pyspark.logger import PySparkLogger
    except ImportError:  # an older pyspark: no such loggers
        return
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True


def _create_logging_to_file(builder: SparkSession.Builder) -> SparkSession:
    """``builder.getOrCreate()`` with the Java process (started by it, inheriting file
    descriptor 2) writing its stderr to :func:`log_path`; this process's stderr unchanged."""
    path = os.environ.get("SOW_SPARK_LOG") or os.path.join(
        tempfile.gettempdir(), f"sow-redis-spark-{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if _log["path"] is None:
        _log.update(path=path, remove=not os.environ.get("SOW_SPARK_LOG"))
        atexit.register(_remove_log)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        return builder.getOrCreate()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def log_path() -> str | None:
    """The file the Java process of a quiet session writes its stderr to (None: not quiet)."""
    return _log["path"]


def keep_log() -> None:
    """Keep :func:`log_path` when the command ends (it failed in Spark)."""
    _log["keep"] = True


def _remove_log() -> None:
    if _log["path"] and _log["remove"] and not _log["keep"]:
        try:
            os.unlink(_log["path"])
        except OSError:
            pass


def error_line(exc: BaseException) -> tuple[str, bool] | None:
    """One line for an error raised by Spark, and whether it is the user's (a query or path
    Spark refused: ``AnalysisException``, ``ParseException`` and the other
    ``pyspark.errors`` exceptions) rather than a failure inside Spark (a ``Py4JJavaError``:
    a task failed, the Java side raised); None for any other exception.

    The line is the first line of Spark's message (for a failed Python task, the last line
    of its traceback: the exception the task raised), whitespace collapsed."""
    if "pyspark" not in sys.modules:
        return None
    # start-up time: py4j comes with pyspark (the optional [spark] extra)
    from py4j.protocol import Py4JError, Py4JJavaError

    # start-up time: pyspark (the optional [spark] extra) loads once Spark runs
    from pyspark.errors import PySparkException

    if isinstance(exc, PySparkException):
        # the message's first line; what follows "SQLSTATE: …; line 1 pos 7;" is the plan
        text = _first_line(str(exc))
        m = re.search(r"\s*SQLSTATE: (\w+)[;.]?\s*\(?(.*?)\)?[;.]?$", text)
        if m:
            where = f", {m.group(2)}" if m.group(2) else ""
            text = f"{text[:m.start()]} (SQLSTATE {m.group(1)}{where})"
        return text or type(exc).__name__, True
    if isinstance(exc, Py4JJavaError):
        try:
            text = str(exc.java_exception.toString())
        except Exception:  # the gateway is gone
            text = str(exc)
        return "Spark failed: " + (_task_error(text) or _first_line(text)), False
    if isinstance(exc, Py4JError):
        return "Spark failed: " + _first_line(str(exc)), False
    return None


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return " ".join(line.split())
    return ""


def _task_error(text: str) -> str | None:
    """The exception a failed Python task raised: the last line of the Python traceback in a
    Java exception's message, or None."""
    if "Traceback (most recent call last)" not in text:
        return None
    tb = text[text.index("Traceback (most recent call last)"):]
    last = None
    for line in tb.splitlines()[1:]:
        if line.startswith(("\tat ", "\t... ")) or line.startswith("Driver stacktrace"):
            break
        if line and not line[0].isspace():
            last = line
    return " ".join(last.split()) if last else None
