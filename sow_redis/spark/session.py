"""The SparkSession of ``sow-redis spark …`` commands: ``local[*]`` by default (``--master``
to change it), the web UI off.

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
import os
import re
import sys
import tempfile
import warnings
from typing import Any

INSTALL_HINT = ("pyspark is not installed: pip install -e '.[spark]' (and a Java runtime: "
                "apt-get install default-jre-headless)")

_log: dict[str, Any] = {"path": None, "keep": False, "remove": False}


def get_session(master: str = "local[*]", app: str = "sow-redis", quiet: bool = False) -> Any:
    """A SparkSession (the running one when there is one).

    Args:
        quiet: no progress bar and no FutureWarning of pyspark on stderr, and the Java
            process's stderr to :func:`log_path` (see the module docstring); the CLI passes
            ``not sys.stderr.isatty()``.

    Raises:
        RuntimeError: pyspark is not installed (the message says how to install it).
    """
    if quiet:
        # pyspark warns on import and at start that it "does not yet fully support pandas
        # >= 3.0.0": nothing a sow-redis user can act on
        warnings.filterwarnings("ignore", message=r"PySpark does not yet fully support pandas",
                                category=FutureWarning)
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise RuntimeError(INSTALL_HINT) from None
    if quiet:
        mute_query_context_loggers()
    # Python workers run this interpreter (the one with sow_redis and its dependencies); on a
    # cluster, ship the package and set PYSPARK_PYTHON there (deploy/spark/README.md)
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_PYTHON", python)
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.pyspark.python", python)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false" if quiet else "true")
               .config("spark.sql.shuffle.partitions", "8"))
    if not quiet or SparkSession.getActiveSession() is not None:
        return builder.getOrCreate()
    return _create_logging_to_file(builder)


def mute_query_context_loggers() -> None:
    """Silence the loggers with which pyspark 4 logs every AnalysisException as JSON with its
    Java stack on stderr (``SQLQueryContextLogger``, ``DataFrameQueryContextLogger``) before
    the exception reaches the caller: for a caller that reports it (the CLI)."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # an older pyspark: no such loggers
        return
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True


def _create_logging_to_file(builder: Any) -> Any:
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
    from py4j.protocol import Py4JError, Py4JJavaError
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
