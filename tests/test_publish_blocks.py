"""The publish retry loop and the migration wait shared since issue 24 (items 3-5):
``publish.retry.append_blocks`` (blocks, positions across them, the merged result, a refusal
with the earlier blocks counted) and ``registry.await_migration`` (at once when free, False
after its timeout or when told to stop)."""

from __future__ import annotations

import time

import pytest

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.publish import retry
from sow_redis.publish.result import PublishInterrupted, PublishResult
from sow_redis.registry import await_migration


def cfg(name: str) -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/k"]\npartitions = 2\n'


def items(first: int, n: int, bad: int | None = None):
    for k in range(first, first + n):
        yield ("publish", b"not json" if k == bad else {"k": k}, None)


@pytest.mark.parametrize("retry_s", [0.0, 5.0])
def test_blocks_count_on_and_merge(backend_url, topic_name, retry_s):
    sow = Sow(backend_url)
    sow.apply_config(cfg(topic_name))
    t = sow.topic(topic_name)
    res = retry.append_blocks(sow.r, t, [items(0, 3), items(3, 4, bad=5), items(7, 2)], retry_s,
                              start=10, jobs=sow.job_settings)
    assert (res.read, res.published, res.skipped) == (9, 8, 0)
    assert [(x.position, x.reason) for x in res.rejected] == [(15, "bad_json")]
    assert set(res.last_ids) <= {0, 1} and res.last_ids
    sow.handoff_published(t, res, wait=True)
    assert sorted(rec.obj()["k"] for rec in sow.sow(topic_name)) == [0, 1, 2, 3, 4, 6, 7, 8]


def test_stop_ends_after_the_block(backend_url, topic_name):
    sow = Sow(backend_url)
    sow.apply_config(cfg(topic_name))
    seen: list[int] = []

    def stop() -> bool:
        seen.append(1)
        return True

    res = retry.append_blocks(sow.r, sow.topic(topic_name), [items(0, 2), items(2, 2)], stop=stop)
    assert res.read == 2 and len(seen) == 1


def test_a_refusal_counts_the_earlier_blocks(monkeypatch, backend_url, topic_name):
    sow = Sow(backend_url)
    sow.apply_config(cfg(topic_name))
    real = retry.append
    calls = []

    def refusing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise PublishInterrupted(PublishResult(read=1, published=1), RuntimeError("full"))
        return real(*args, **kwargs)

    monkeypatch.setattr(retry, "append", refusing)
    with pytest.raises(PublishInterrupted) as e:
        retry.append_blocks(sow.r, sow.topic(topic_name), [items(0, 3), items(3, 3)])
    assert (e.value.result.read, e.value.result.published) == (4, 4)
    assert str(e.value.cause) == "full"


def test_await_migration_returns_at_once_when_free(backend_url, topic_name):
    sow = Sow(backend_url)
    sow.apply_config(cfg(topic_name))
    started = time.monotonic()
    assert await_migration(sow.r, topic_name, range(2), 5.0)
    assert time.monotonic() - started < 1.0


def test_await_migration_gives_up_after_its_timeout_or_when_stopped(backend_url, topic_name):
    sow = Sow(backend_url)
    sow.apply_config(cfg(topic_name))
    sow.r.set(keys.definition(topic_name, 1), keys.DEFINITION_MIGRATING)
    started = time.monotonic()
    assert not await_migration(sow.r, topic_name, range(2), 0.2)
    assert 0.2 <= time.monotonic() - started < 2.0
    assert await_migration(sow.r, topic_name, [0], 0.2)  # partition 0 is not held
    asked: list[int] = []
    assert not await_migration(sow.r, topic_name, range(2), 60.0,
                               stop=lambda: asked.append(1) is None)
    assert asked == [1]
