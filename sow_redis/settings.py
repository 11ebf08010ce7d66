"""Runtime settings: one frozen object built from the environment and CLI options.

Every tunable is a field with its unit in the name or docstring. Environment variables:
``SOW_REDIS_URL``, ``SOW_CONTROL_URL``, ``SOW_REDIS_CONFIG``, ``SOW_LEASE_MS``,
``SOW_MARKER_TTL_MS``, ``SOW_BATCH_SIZE``, ``SOW_JOB_BUDGET_S``, ``SOW_LINGER_MS``,
``SOW_SWEEP_INTERVAL_S``, ``SOW_LOG_MAX_LEN``, ``SOW_WRITE_THROUGH`` (``0`` turns it off).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
"""Default ``--redis-url`` when neither the option nor ``SOW_REDIS_URL`` is given."""

DEFAULT_CONFIG_PATH = "sow.toml"
"""Default ``--config`` file when neither the option nor ``SOW_REDIS_CONFIG`` is given."""

QUEUE_NAME = "sow"
"""Name of the rq queue that carries the per-partition ingest jobs."""


@dataclass(frozen=True)
class Settings:
    """Process-wide settings.

    Attributes:
        redis_url: ``redis://host:port/db``, ``redis+cluster://host:port`` or
            ``memory://name`` (in-process fakeredis): the data plane.
        control_url: the plain Redis of the control plane (rq queues and workers, the
            dashboard); None: the data Redis, which must then not be a cluster
            (:func:`sow_redis.connection.control_url_for`).
        config_path: TOML topic configuration file read by ``config apply``.
        lease_ms: partition lease time in milliseconds; a dead worker's partition moves on
            after at most this long.
        marker_ttl_ms: lifetime in milliseconds of the "job queued" marker of a partition; a
            lost job is re-enqueued by the sweeper after at most this long.
        batch_size: log entries applied per Lua call.
        job_budget_s: seconds one ingest job works on its partition before re-enqueueing itself.
        linger_ms: milliseconds a job that drained its partition waits for new entries before
            it retires (0 = retire at once).
        sweep_interval_s: seconds between two sweeps that enqueue jobs for partitions with lag.
        log_max_len: applied log entries kept per partition stream before trimming (unapplied
            entries are never trimmed).
        write_through: a publisher that starts the workers (``append(jobs=…)``: ``Sow.publish``,
            ``sow-redis publish``) also applies the plain publishes it appended to a caught-up
            partition, in the same write (lua/include/apply_appended.lua): subscribers get them one
            round trip after the publish, with no worker hop. Workers still apply everything
            else (deltas, deletes, chaining topics, a backlog left by a crash).
    """

    redis_url: str = DEFAULT_REDIS_URL
    control_url: str | None = None
    config_path: str = DEFAULT_CONFIG_PATH
    lease_ms: int = 5_000
    marker_ttl_ms: int = 10_000
    batch_size: int = 500
    job_budget_s: float = 1.0
    linger_ms: int = 50
    sweep_interval_s: float = 0.5
    log_max_len: int = 100_000
    write_through: bool = True

    QUEUED_MARKER_MIN_MS = 60_000
    """Milliseconds a queued job's marker lives at least (see :attr:`queued_marker_ttl_ms`)."""

    @property
    def queued_marker_ttl_ms(self) -> int:
        """Lifetime in milliseconds of the marker of a job waiting in the queue
        (``job:<id>``): at least a minute, so it never lapses while its job waits (a
        lapsed marker let a second job of the partition into the queue). A marker that
        stands for no job is removed by the workers' sweep, whatever its lifetime
        (:func:`sow_redis.apply.jobs.stale_markers`)."""
        return max(self.marker_ttl_ms, self.QUEUED_MARKER_MIN_MS)

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Settings from ``SOW_*`` environment variables; non-None ``overrides`` win."""
        env = os.environ
        base = cls(
            redis_url=env.get("SOW_REDIS_URL", DEFAULT_REDIS_URL),
            control_url=env.get("SOW_CONTROL_URL") or None,
            config_path=env.get("SOW_REDIS_CONFIG", DEFAULT_CONFIG_PATH),
            lease_ms=int(env.get("SOW_LEASE_MS", cls.lease_ms)),
            marker_ttl_ms=int(env.get("SOW_MARKER_TTL_MS", cls.marker_ttl_ms)),
            batch_size=int(env.get("SOW_BATCH_SIZE", cls.batch_size)),
            job_budget_s=float(env.get("SOW_JOB_BUDGET_S", cls.job_budget_s)),
            linger_ms=int(env.get("SOW_LINGER_MS", cls.linger_ms)),
            sweep_interval_s=float(env.get("SOW_SWEEP_INTERVAL_S", cls.sweep_interval_s)),
            log_max_len=int(env.get("SOW_LOG_MAX_LEN", cls.log_max_len)),
            write_through=env.get("SOW_WRITE_THROUGH", "1").strip().lower()
            not in ("0", "false", "no", "off"),
        )
        return replace(base, **{k: v for k, v in overrides.items()  # type: ignore[arg-type]
                                if v is not None})
