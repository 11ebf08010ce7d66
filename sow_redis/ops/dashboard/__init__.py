"""``python -m sow_redis.ops.dashboard``: rq-dashboard for sow_redis (``sow-redis dashboard`` runs
it with rq-dashboard's own options), with a **SOW** page of the topics themselves
(:mod:`.sow_page`, on the data Redis of ``SOW_REDIS_URL`` / ``SOW_CONTROL_URL``) and its Jobs
tab opening on the queue ``sow``.

rq-dashboard 0.9 lists workers with ``Worker.all(connection=…)``, without its configured
serializer, so each worker comes with rq's default (pickle) serializer and its current job,
a JSON sow_redis job, cannot be read: the workers page failed (HTTP 500) whenever a worker
was running a job; its job page fetches jobs the same way. Here both read jobs as JSON, as
every sow_redis job is (:data:`sow_redis.apply.safejob.SERIALIZER`); nothing is ever unpickled.

The workers page shows a worker's current job by its call string
(``sow_redis.apply.jobs.ingest_job('orders', 3)``); here it shows the job's description instead,
``ingest orders[3] (1,200 entries behind)`` (:func:`sow_redis.apply.jobs.enqueue_job`), the same
text as the jobs pages; the call string stays in the job's own page.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Flask
from rq.job import Job
from rq.worker import Worker

from ...apply.safejob import SERIALIZER
from ...client import Sow
from ...connection import Client
from .sow_page import install

_all = Worker.all.__func__  # type: ignore[attr-defined]
_fetch = Job.fetch.__func__  # type: ignore[attr-defined]


def _json_workers(cls: type[Worker], *args: Any, serializer: Any = None,
                  **kwargs: Any) -> list[Worker]:
    return _all(cls, *args, serializer=serializer or SERIALIZER, **kwargs)


def _json_fetch(cls: type[Job], id: str, connection: Client | None = None,
                serializer: Any = None) -> Job:
    return _fetch(cls, id, connection, serializer or SERIALIZER)


def _described(serialize: Callable[[Job], object]) -> Callable[[Job], object]:
    """``serialize_current_job`` of rq-dashboard with the description as the shown text."""

    def serialize_current_job(job: Job) -> object:
        out = serialize(job)
        if isinstance(out, dict) and out.get("description"):
            out["call_string"] = out["description"]
        return out

    return serialize_current_job


def _with_sow_page(make_flask_app: Callable[..., Flask]) -> Callable[..., Flask]:
    """rq-dashboard's ``make_flask_app`` that also installs the SOW page on the app."""

    def make(config: Any, username: str | None, password: str | None, url_prefix: str,
             *args: Any, **kwargs: Any) -> Flask:
        app = make_flask_app(config, username, password, url_prefix, *args, **kwargs)
        install(app, Sow(), username, password, url_prefix or "")
        return app

    return make


def main() -> None:
    Worker.all = classmethod(_json_workers)  # type: ignore[method-assign, assignment]
    Job.fetch = classmethod(_json_fetch)  # type: ignore[method-assign, assignment]
    # start-up time: rq-dashboard (~0.17 s) loads when the dashboard runs (after the patches)
    from rq_dashboard import cli, web

    # start-up time: as above
    from rq_dashboard.cli import main as dashboard_main

    web.serialize_current_job = _described(web.serialize_current_job)
    cli.make_flask_app = _with_sow_page(cli.make_flask_app)

    dashboard_main()
