"""Structured logs (issue 13 item 6): one line per event, JSON with --log-json."""

from __future__ import annotations

import time

import orjson
from conftest import run_cli

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.publish.append import append


def _events(stderr: bytes) -> list[dict]:
    out = []
    for line in stderr.decode().splitlines():
        if line.startswith("{"):
            out.append(orjson.loads(line))
    return out


def test_worker_and_expirer_log_their_events_as_json_lines(url, topic_name):
    sow = Sow(url)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\npartitions = 1\n'
                     'expiration = "enabled"\n')
    t = sow.topic(topic_name)
    append(sow.r, t, [("publish", b'{"k": 1}', None, 0.05), ("publish", b'{"k": 2}', None)])
    bad_id = sow.r.xadd(keys.log(t.name, 0), {"cmd": "publish", "data": b"{not json"}).decode()
    out = run_cli(url, "--log-json", "--log-level", "DEBUG", "worker", "--burst")
    evs = _events(out.stderr)
    kinds = [e.get("event") for e in evs]
    print(kinds)
    assert kinds[0] == "worker_start" and kinds[-1] == "worker_stop"
    assert "lease_taken" in kinds
    # this topic's bad entry (a burst worker serves every topic of the session's server)
    (rej,) = [e for e in evs if e.get("event") == "rejected" and e.get("id") == bad_id]
    assert rej["reason"] == "bad_json" and rej["level"] == "WARNING" and rej["ts"].endswith("Z")
    time.sleep(0.1)
    out = run_cli(url, "--log-json", "expirer", "--burst", "-t", topic_name)
    (exp,) = [e for e in _events(out.stderr) if e.get("event") == "expired"]
    assert exp["topic"] == topic_name and exp["count"] == 1
    text = run_cli(url, "--log-level", "DEBUG", "worker", "--burst").stderr.decode()
    assert " DEBUG sow_redis.ops.worker worker " in text and "event=worker_start" in text
