"""The history behind the dashboard's SOW page: every :data:`SAMPLE_INTERVAL_S` seconds, one
reading of every topic, kept for :data:`HISTORY_S` seconds; the rates over the last second
and the last minute and the charts come from it.

A reading is :func:`sow_redis.ops.status.topic_stats` (the figures of ``sow-redis stats``, one
definition of each) with two more counters: ``appended`` (:func:`sow_redis.ops.status.log_appended`,
log entries ever appended) and ``applied`` (``appended - lag``: entries the workers have
passed, applied or rejected). Rates are :func:`sow_redis.ops.status.with_rates` between two
readings, as ``stats`` computes them.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque

from ...connection import Client
from ...model.topic import TopicConfig
from ...model.values import JSON, JSONObject
from ...partition_state import PENDING_COUNT_MAX
from ...registry import load_topics
from ..status import log_appended, topic_stats, with_rates

log = logging.getLogger(__name__)

SAMPLE_INTERVAL_S = 1.0
"""Seconds between two readings of every topic (each costs what one ``stats`` reading costs:
a few pipelined round trips per topic)."""

HISTORY_S = 600.0
"""Seconds of readings kept per topic (the charts show them)."""

RATE_WINDOWS_S = {"1s": 1.0, "1min": 60.0}
"""Rate name → seconds between the two readings it compares (the newest and the newest one
at least that much older; the oldest kept while the history is shorter)."""


def reading(r: Client, topic: TopicConfig) -> JSONObject:
    """One reading of ``topic`` (a :class:`~sow_redis.config.TopicConfig`): the dict of
    :func:`~sow_redis.ops.status.topic_stats` whose ``counters`` also hold ``appended`` and
    ``applied`` (log entries; see the module docstring), plus ``lag_capped``: True when
    ``lag`` may be counted up to its per-partition cap (then ``applied`` reads high)."""
    st = topic_stats(r, topic)
    appended = log_appended(r, topic)
    st["counters"] = dict(st["counters"], appended=appended,
                          applied=max(0, appended - st["lag"]))
    st["lag_capped"] = st["lag"] >= PENDING_COUNT_MAX
    return st


def rates(history: list[JSONObject]) -> dict[str, JSONObject]:
    """Window name (:data:`RATE_WINDOWS_S`) → ``{"per_second": {counter: rate}, "window_s":
    seconds actually between the two readings}`` from a topic's readings (oldest first);
    rates are per second, 0 with fewer than two readings."""
    out: dict[str, JSONObject] = {}
    if not history:
        return out
    last = history[-1]
    for name, span_s in RATE_WINDOWS_S.items():
        before = history[0]
        for x in reversed(history[:-1]):
            if last["time_ms"] - x["time_ms"] >= span_s * 1000 - 100:  # 0.1 s of jitter
                before = x
                break
        if before is last:
            out[name] = {"per_second": dict.fromkeys(last["counters"], 0.0), "window_s": 0.0}
        else:
            out[name] = {"per_second": with_rates(before, last)["per_second"],
                         "window_s": round((last["time_ms"] - before["time_ms"]) / 1000, 3)}
    return out


class Sampler:
    """Readings of every topic, :data:`SAMPLE_INTERVAL_S` apart, the last :data:`HISTORY_S`
    seconds of them kept in memory (this process only; a restart starts empty)."""

    def __init__(self, r: Client, interval_s: float = SAMPLE_INTERVAL_S,
                 keep_s: float = HISTORY_S) -> None:
        self.r = r
        self.interval_s = interval_s
        self._keep = max(2, int(keep_s / interval_s) + 1)
        self._history: dict[str, deque[JSONObject]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.error: str | None = None
        """The last reading's failure in one line (None when it succeeded)."""

    def sample(self) -> None:
        """Read every topic once and add the readings (a topic no longer registered is
        dropped)."""
        topics = load_topics(self.r)
        got = {name: reading(self.r, t) for name, t in topics.items()}
        with self._lock:
            for name in list(self._history):
                if name not in got:
                    del self._history[name]
            for name, x in got.items():
                self._history.setdefault(name, deque(maxlen=self._keep)).append(x)

    def run(self, stop: threading.Event) -> None:
        """Sample until ``stop`` is set; a failed reading is logged and kept in
        :attr:`error`, and the next one is tried an interval later."""
        while not stop.is_set():
            try:
                self.sample()
                if self.error is not None:
                    log.warning("dashboard: reading the topics works again")
                self.error = None
            except Exception as exc:  # Redis away: the page says so, sampling goes on
                error = " ".join(str(exc).split()) or type(exc).__name__
                if error != self.error:  # logged once, not every interval
                    log.warning("dashboard: reading the topics failed: %s", error)
                self.error = error
            stop.wait(self.interval_s)

    def start(self) -> None:
        """Run :meth:`run` in a daemon thread until :meth:`stop`."""
        threading.Thread(target=self.run, args=(self._stop,), name="sow-sampler",
                         daemon=True).start()

    def stop(self) -> None:
        """End the sampling thread (at its next wait)."""
        self._stop.set()

    def history(self, topic: str) -> list[JSONObject]:
        """The readings of ``topic``, oldest first (empty for a topic not read yet)."""
        with self._lock:
            return list(self._history.get(topic, ()))

    def topics(self) -> list[str]:
        """The topics read, by name."""
        with self._lock:
            return sorted(self._history)

    def latest(self, topic: str) -> JSONObject | None:
        """The newest reading of ``topic`` with ``rates`` (:func:`rates`), or None."""
        h = self.history(topic)
        if not h:
            return None
        return dict(h[-1], rates=rates(h))

    def series(self, topic: str) -> dict[str, list[JSON]]:
        """The chart data of ``topic``: ``t`` (reading times, s since the epoch, Redis
        clock), ``in`` and ``applied`` (entries/s between one reading and the one before),
        ``lag`` (entries) and ``lag_age_s`` (seconds), one value per reading after the
        first."""
        h = self.history(topic)
        out: dict[str, list[JSON]] = {"t": [], "in": [], "applied": [], "lag": [],
                                     "lag_age_s": []}
        for before, after in itertools.pairwise(h):
            ps = with_rates(before, after)["per_second"]
            out["t"].append(after["time_ms"] / 1000)
            out["in"].append(ps["appended"])
            out["applied"].append(ps["applied"])
            out["lag"].append(after["lag"])
            out["lag_age_s"].append(after["lag_age_ms"] / 1000)
        return out
