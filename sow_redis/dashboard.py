"""``python -m sow_redis.dashboard``: rq-dashboard for sow_redis (``sow-redis dashboard`` runs
it with rq-dashboard's own options).

rq-dashboard 0.9 lists workers with ``Worker.all(connection=…)``, without its configured
serializer, so each worker comes with rq's default (pickle) serializer and its current job,
a JSON sow_redis job, cannot be read: the workers page failed (HTTP 500) whenever a worker
was running a job; its job page fetches jobs the same way. Here both read jobs as JSON, as
every sow_redis job is (:data:`sow_redis.safejob.SERIALIZER`); nothing is ever unpickled.
"""

from __future__ import annotations

from typing import Any

from rq.job import Job
from rq.worker import Worker

from .safejob import SERIALIZER

_all = Worker.all.__func__  # type: ignore[attr-defined]
_fetch = Job.fetch.__func__  # type: ignore[attr-defined]


def _json_workers(cls: type[Worker], *args: Any, serializer: Any = None,
                  **kwargs: Any) -> list[Any]:
    return _all(cls, *args, serializer=serializer or SERIALIZER, **kwargs)


def _json_fetch(cls: type[Job], id: str, connection: Any = None, serializer: Any = None
                ) -> Any:
    return _fetch(cls, id, connection, serializer or SERIALIZER)


def main() -> None:
    Worker.all = classmethod(_json_workers)  # type: ignore[method-assign, assignment]
    Job.fetch = classmethod(_json_fetch)  # type: ignore[method-assign, assignment]
    from rq_dashboard.cli import main as dashboard_main

    dashboard_main()


if __name__ == "__main__":
    main()
