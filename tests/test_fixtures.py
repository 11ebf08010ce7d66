"""The shared fixtures of tests/conftest.py: ``lonely_url`` is one redis-server per test
module, not the session's ``redis_server``, with no worker on it."""

from __future__ import annotations

from redis import Redis
from rq import Worker

SEEN: list[str] = []


def test_lonely_url_is_a_server_of_its_own_without_workers(lonely_url, redis_server):
    SEEN.append(lonely_url)
    assert lonely_url != redis_server
    assert lonely_url.startswith("redis://127.0.0.1:") and lonely_url.endswith("/0")
    r = Redis.from_url(lonely_url)
    assert r.ping() is True
    assert Worker.all(connection=r) == []
    r.set("fixtures:probe", "1")
    assert Redis.from_url(redis_server).get("fixtures:probe") is None


def test_lonely_url_is_shared_within_a_module(lonely_url):
    SEEN.append(lonely_url)
    assert SEEN == [lonely_url, lonely_url]
    assert Redis.from_url(lonely_url).get("fixtures:probe") == b"1"
