"""Which rq jobs a sow_redis worker agrees to run (issue 7.9).

Anyone who can write to Redis can put a job on the ``sow`` queue. rq would import and call
any function a job names, and its default serializer is pickle, whose ``loads`` alone runs
code. So sow_redis enqueues and reads jobs with rq's :class:`~rq.serializers.JSONSerializer`
(decoding JSON runs nothing), and :class:`SowJob`, the job class of every sow_redis worker,
refuses any job that is not a call of one of :data:`ALLOWED_JOBS` with the argument shapes
sow_redis uses, before anything is imported or called. A refused job goes to rq's failed
registry (visible in rq-dashboard) with a reason such as
``refused: job function 'subprocess.check_call' is not a sow_redis job``.

Callbacks, webhooks, retries and repeats are rq features sow_redis never uses; they are
cleared when a job is read, since rq would otherwise import and call a callback named in the
job hash, or send a request to a webhook address, even for a failed job.
"""

from __future__ import annotations

from typing import Any

from rq.exceptions import DeserializationError
from rq.job import Job
from rq.serializers import JSONSerializer

SERIALIZER = JSONSerializer
"""The serializer of every sow_redis job, on the enqueue side and in the workers."""

ALLOWED_JOBS: dict[str, tuple[type, ...]] = {"sow_redis.apply.jobs.ingest_job": (str, int)}
"""Job function (dotted name) → the types of its positional arguments. Keyword arguments and
bound methods (an ``instance``) are never allowed."""


class RefusedJobError(DeserializationError):
    """A job that is not a sow_redis job; the message is the reason shown in rq's failed
    registry. A DeserializationError, so rq's exception logging does not try to decode the
    job again."""


def refusal(job: Job) -> str | None:
    """Why ``job`` must not run, or None when it is a sow_redis job.

    Reads only the job's decoded JSON payload: nothing is imported or called.
    """
    name, instance, args, kwargs = job.func_name, job.instance, job.args, job.kwargs
    if not isinstance(name, str) or name not in ALLOWED_JOBS:
        return f"refused: job function {name!r} is not a sow_redis job"
    if instance is not None:
        return f"refused: job {name!r} names an instance; sow_redis jobs are plain functions"
    types = ALLOWED_JOBS[name]
    if kwargs or not isinstance(args, (list, tuple)) or len(args) != len(types) or not all(
            isinstance(a, t) and not isinstance(a, bool) for a, t in zip(args, types)):
        shape = ", ".join(t.__name__ for t in types)
        return f"refused: job {name!r} takes ({shape}), got args={args!r} kwargs={kwargs!r}"
    return None


class SowJob(Job):
    """rq's Job, restricted to sow_redis jobs: see the module docstring."""

    def restore(self, raw_data: Any) -> Any:
        out = super().restore(raw_data)
        self._success_callback_name = self._failure_callback_name = None
        self._stopped_callback_name = None
        self._success_callback = None  # type: ignore[assignment]
        self._failure_callback = None  # type: ignore[assignment]
        self._stopped_callback = None
        self.webhooks = []
        self.retries_left = None
        self.repeats_left = None
        return out

    def _deserialize_data(self) -> None:
        try:
            super()._deserialize_data()
        except DeserializationError as exc:
            raise RefusedJobError(
                "refused: job payload is not a JSON sow_redis job (sow_redis workers read "
                "jobs as JSON only; pickled payloads are never loaded)") from exc
        if not isinstance(self._args, (list, tuple)) or not isinstance(self._kwargs, dict):
            raise RefusedJobError("refused: job payload is not a JSON sow_redis job "
                                  "(args must be a list, kwargs an object)")

    @property
    def func(self) -> Any:
        """The job's function, imported only after :func:`refusal` found no reason."""
        reason = refusal(self)
        if reason is not None:
            raise RefusedJobError(reason)
        return super().func
