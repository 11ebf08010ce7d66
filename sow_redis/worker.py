"""The ``sow-redis worker`` process: an rq worker plus a sweeper thread.

The rq worker (``SimpleWorker``: jobs run in the worker process, no fork per job) executes the
per-partition ingest jobs of :mod:`sow_redis.jobs`, so rq-dashboard shows workers, queue and
jobs. It reads jobs as JSON and runs only sow_redis's own job functions
(:mod:`sow_redis.safejob`). rq owns signals: SIGINT/SIGTERM finish the current job, then exit (warm shutdown).
The sweeper enqueues jobs for partitions with lag every ``sweep_interval_s`` seconds, with
capped exponential backoff while Redis is unreachable.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from .jobs import sweep
from .safejob import SERIALIZER, SowJob
from .settings import QUEUE_NAME, Settings

log = logging.getLogger(__name__)

BACKOFF_MAX_S = 10.0
"""Longest pause in seconds between sweeps while Redis does not answer."""


class Sweeper(threading.Thread):
    """Daemon thread: ``loop()`` sweeps once; ``run()`` repeats it until stopped."""

    def __init__(self, r: Any, settings: Settings):
        super().__init__(name="sow-sweeper", daemon=True)
        self.r, self.settings = r, settings
        self.stopped = threading.Event()

    def loop(self) -> int:
        """One unit of work: enqueue jobs for every lagging partition."""
        return sweep(self.r, self.settings)

    def run(self) -> None:
        pause = self.settings.sweep_interval_s
        while not self.stopped.wait(pause):
            try:
                self.loop()
                pause = self.settings.sweep_interval_s
            except RedisConnectionError as exc:
                pause = min(BACKOFF_MAX_S, pause * 2)
                log.warning("sweeper: redis unreachable (%s); retry in %.1f s", exc, pause)
            except Exception:  # noqa: BLE001 - the sweeper must outlive any single failure
                log.exception("sweeper failed; retrying")


def run_worker(settings: Settings, burst: bool = False, name: str | None = None) -> bool:
    """Run one worker until stopped (or, with ``burst``, until every partition is drained).

    Returns:
        True when the worker processed at least one job.
    """
    from rq import Queue, SimpleWorker

    r = Redis.from_url(settings.redis_url)
    queue = Queue(QUEUE_NAME, connection=r, serializer=SERIALIZER, job_class=SowJob)
    sweep(r, settings)  # start with everything that is already waiting
    sweeper = None
    if not burst:
        sweeper = Sweeper(Redis.from_url(settings.redis_url), settings)
        sweeper.start()
    worker = SimpleWorker([queue], connection=r, name=name, serializer=SERIALIZER,
                          job_class=SowJob)
    try:
        return worker.work(burst=burst, logging_level="WARNING")
    finally:
        if sweeper is not None:
            sweeper.stopped.set()
