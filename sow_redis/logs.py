"""Structured logs: one line per event, as text or JSON (``--log-json``).

Events carry an ``event`` name and their fields as ``extra`` of the logging call::

    log.info("lease taken", extra=fields("lease_taken", topic="orders", partition=3))

Text: ``2026-11-24T16:30:00.123Z INFO sow_redis.apply.jobs lease taken event=lease_taken topic=orders
partition=3``. JSON: ``{"ts": "…", "level": "INFO", "logger": "sow_redis.apply.jobs", "msg": "lease
taken", "event": "lease_taken", "topic": "orders", "partition": 3}``.

The events: ``worker_start`` / ``worker_stop``; ``lease_taken`` (DEBUG: once per job) and
``lease_lost``; ``rejected`` (a log entry the worker could not apply, with ``reason``);
``expired`` (an expirer pass that removed records, with ``count`` and ``lag_ms``);
``recovery`` (a subscriber filled a gap); ``redis_unreachable`` (once per outage and
component) and ``redis_reachable`` (:mod:`sow_redis.outage`). Nothing logged holds a
password: URLs are logged through :func:`sow_redis.connection.redact`.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from typing import Any

import orjson

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def fields(event: str, **values: Any) -> dict[str, Any]:
    """The ``extra`` of a structured log call: the event name and its fields."""
    return {"event": event, **values}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


def _ts(record: logging.LogRecord) -> str:
    return dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": _ts(record), "level": record.levelname, "logger": record.name,
               "msg": record.getMessage(), **_extras(record)}
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """``<ts> <LEVEL> <logger> <message> key=value …``."""

    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        line = f"{_ts(record)} {record.levelname} {record.name} {record.getMessage()}"
        return f"{line} {extra}" if extra else line


def setup(json: bool = False, level: str = "INFO") -> None:
    """Send the ``sow_redis`` loggers' records to stderr, one line each (text or JSON)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    logger = logging.getLogger("sow_redis")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
