"""Security (issue 7.9): workers run only sow_redis's own jobs, never unpickle a job, and the
ACL of docs/operations.md confines a log appender to the log streams."""

from __future__ import annotations

import pickle
import re
import signal
import time
import uuid
from pathlib import Path

import pytest
from conftest import ROOT, run_cli, start_worker
from redis import Redis
from redis.exceptions import NoPermissionError, ResponseError
from rq import Queue
from rq.job import Job
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.settings import QUEUE_NAME

APPENDER_ACL = "ACL SETUSER sow-appender on >CHANGE-ME resetkeys ~{sow:*:*}:log resetchannels -@all +xadd"
"""The ACL of docs/operations.md ("Security") for a client that may only append to the
transaction logs."""


def make_topic(url: str, name: str) -> Sow:
    sow = Sow(url)
    sow.apply_config(f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = 2\n')
    return sow


def failure_of(r: Redis, job_id: str) -> str:
    """The exception text rq recorded for a failed job ('' while it has not failed)."""
    if job_id not in FailedJobRegistry(QUEUE_NAME, connection=r, serializer=JSONSerializer):
        return ""
    job = Job.fetch(job_id, connection=r, serializer=JSONSerializer)
    result = job.latest_result()
    return result.exc_string if result is not None else ""


def wait_failed(r: Redis, job_id: str, timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while not (text := failure_of(r, job_id)):
        assert time.monotonic() < deadline, f"job {job_id} did not fail"
        time.sleep(0.05)
    return text


class Touch:
    """Unpickling this creates ``path`` (what a crafted pickled job payload could do)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def worker(url):
    w = start_worker(url)
    yield w
    w.send_signal(signal.SIGTERM)
    w.wait(timeout=30)


def applies(sow: Sow, topic: str, value: str) -> None:
    sow.publish(topic, {"id": value}, wait=True, timeout=20)
    assert sow.sow(topic, f"/id = '{value}'")


def test_foreign_job_functions_are_refused(url, r, topic_name, tmp_path, worker):
    sow = make_topic(url, topic_name)
    applies(sow, topic_name, "before")
    marker = tmp_path / "pwned"
    # the command (default pickle payload) and the same call as a JSON job
    plain = Queue(QUEUE_NAME, connection=r).enqueue("subprocess.check_call",
                                                    ["touch", str(marker)])
    as_json = Queue(QUEUE_NAME, connection=r, serializer=JSONSerializer).enqueue(
        "subprocess.check_call", ["touch", str(marker)])
    bound = Queue(QUEUE_NAME, connection=r, serializer=JSONSerializer).enqueue(
        "sow_redis.apply.jobs.ingest_job", "../../etc", {"not": "an int"})
    why_json = wait_failed(r, as_json.id)
    why_plain = wait_failed(r, plain.id)
    why_args = wait_failed(r, bound.id)
    print(f"\nrefusals: {why_json.strip().splitlines()[-1]!r}; "
          f"{why_plain.strip().splitlines()[-1]!r}; {why_args.strip().splitlines()[-1]!r}")
    assert "refused: job function 'subprocess.check_call' is not a sow_redis job" in why_json
    assert "refused: job payload is not a JSON sow_redis job" in why_plain
    assert "refused: job 'sow_redis.apply.jobs.ingest_job' takes (str, int)" in why_args
    assert not marker.exists()
    assert worker.poll() is None
    applies(sow, topic_name, "after")


def test_pickled_payload_in_a_job_hash_is_never_loaded(url, r, topic_name, tmp_path, worker):
    sow = make_topic(url, topic_name)
    marker = tmp_path / "unpickled"
    job_id = f"crafted-{uuid.uuid4().hex}"
    payload = pickle.dumps(("sow_redis.apply.jobs.ingest_job", None, (Touch(marker), 0), {}))
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(Touch(control))).close()
    assert control.exists()  # such a payload does run code when unpickled
    r.hset(f"rq:job:{job_id}", mapping={"data": payload, "status": "queued",
                                        "origin": QUEUE_NAME, "description": "crafted",
                                        "created_at": "2024-01-01T00:00:00.000000Z"})
    r.rpush(f"rq:queue:{QUEUE_NAME}", job_id)
    why = wait_failed(r, job_id)
    print(f"\ncrafted pickle job: {why.strip().splitlines()[-1]!r}")
    assert "refused: job payload is not a JSON sow_redis job" in why
    assert not marker.exists()
    assert worker.poll() is None
    applies(sow, topic_name, "still-applying")


def test_refusal_reads_only_the_json_payload(r):
    """A job's callbacks and webhooks are dropped when it is read, and the function is
    checked before it is imported."""
    from rq import Callback

    from sow_redis.apply.safejob import SowJob, refusal

    job = Job.create("os.system", args=["true"], connection=r, serializer=JSONSerializer,
                     on_failure=Callback("os.abort"))
    job.save()
    got = SowJob.fetch(job.id, connection=r, serializer=JSONSerializer)
    assert got.failure_callback is None and got.webhooks == []
    assert refusal(got) == "refused: job function 'os.system' is not a sow_redis job"
    with pytest.raises(Exception, match="is not a sow_redis job"):
        got.func  # noqa: B018 - the property refuses before importing
    ok = Job.create("sow_redis.apply.jobs.ingest_job", args=["orders", 3], connection=r,
                    serializer=JSONSerializer)
    ok.save()
    assert refusal(SowJob.fetch(ok.id, connection=r, serializer=JSONSerializer)) is None


def test_readme_acl_confines_an_appender_to_the_logs(url, r, topic_name):
    readme = (ROOT / "docs" / "operations.md").read_text()
    assert APPENDER_ACL in readme
    user, password = f"sow-appender-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    rules = APPENDER_ACL.split()[3:]
    rules[rules.index(">CHANGE-ME")] = f">{password}"
    r.execute_command("ACL", "SETUSER", user, *rules)
    try:
        sow = make_topic(url, topic_name)
        port = re.search(r":(\d+)/", url).group(1)
        a = Redis(host="127.0.0.1", port=int(port), username=user, password=password)
        from sow_redis.model.messages import parse

        p = parse(b'{"id": "via-acl"}', sow.topic(topic_name)).partition
        sid = a.xadd(keys.log(topic_name, p), {"cmd": "publish", "data": '{"id": "via-acl"}'})
        refused = []
        for what, call in [
            ("XADD to the records", lambda: a.xadd(keys.records(topic_name, p), {"x": 1})),
            ("HSET the records", lambda: a.hset(keys.records(topic_name, p), "k", "v")),
            ("XRANGE the log", lambda: a.xrange(keys.log(topic_name, p))),
            ("LPUSH an rq queue", lambda: a.lpush(f"rq:queue:{QUEUE_NAME}", "x")),
            ("HSET an rq job", lambda: a.hset("rq:job:x", "data", "x")),
            ("XADD an rq key", lambda: a.xadd("rq:queue:sow", {"x": 1})),
            ("EVAL", lambda: a.eval("return 1", 0)),
            ("PUBLISH", lambda: a.publish(keys.channel(topic_name), "x")),
            ("DEL the log", lambda: a.delete(keys.log(topic_name, p))),
        ]:
            with pytest.raises((NoPermissionError, ResponseError), match="(?i)permission"):
                call()
            refused.append(what)
        print(f"\nACL user {user}: XADD to {keys.log(topic_name, p)} ok ({sid.decode()}); "
              f"refused: {', '.join(refused)}")
        # the appended entry is applied by a worker (its sweep finds it)
        assert run_cli(url, "worker", "--burst").returncode == 0
        assert [x.obj() for x in sow.sow(topic_name)] == [{"id": "via-acl"}]
    finally:
        r.execute_command("ACL", "DELUSER", user)
