"""The SparkSession of ``sow-redis spark …`` commands: ``local[*]`` by default (``--master``
to change it), Spark's console progress bar on, the web UI off."""

from __future__ import annotations

from typing import Any

INSTALL_HINT = ("pyspark is not installed: pip install -e '.[spark]' (and a Java runtime: "
                "apt-get install default-jre-headless)")


def get_session(master: str = "local[*]", app: str = "sow-redis") -> Any:
    """A SparkSession (the running one when there is one).

    Raises:
        RuntimeError: pyspark is not installed (the message says how to install it).
    """
    import os
    import sys

    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise RuntimeError(INSTALL_HINT) from None
    # Python workers run this interpreter (the one with sow_redis and its dependencies); on a
    # cluster, ship the package and set PYSPARK_PYTHON there (deploy/spark/README.md)
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_PYTHON", python)
    return (SparkSession.builder.master(master).appName(app)
            .config("spark.pyspark.python", python)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "true")
            .config("spark.sql.shuffle.partitions", "8")
            .getOrCreate())
