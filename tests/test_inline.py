"""Inline applying as a declared mode, and the shared helpers (issue 9, items 3 and 4).

``Sow(url, inline=True)`` applies every publish in the calling process before returning;
``Sow(url)`` on a server leaves it to the workers; ``memory://`` is always inline. URLs are
checked in one place (:mod:`sow_redis.connection`), stream ids compared in one
(:mod:`sow_redis.streamids`), partition state read in one (:mod:`sow_redis.partition_state`).
"""

from __future__ import annotations

import pytest
from conftest import run_cli
from redis import Redis

from sow_redis import keys, streamids
from sow_redis.apply.scripts import Scripts
from sow_redis.client import Sow
from sow_redis.connection import check_url, connect
from sow_redis.errors import BadURLError, WaitTimeout
from sow_redis.expirer import Expirer
from sow_redis.feed.live import ShardListener
from sow_redis.partition_state import read_cursor, read_cursors, read_seq
from sow_redis.publish.append import append
from sow_redis.settings import QUEUE_NAME, Settings


def cfg(name: str, extra: str = "") -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/k"]\npartitions = 2\n{extra}\n'


def records(r, topic: str, partitions: int = 2) -> int:
    return sum(r.hlen(keys.records(topic, p)) for p in range(partitions))


def job_markers(r, topic: str, partitions: int = 2) -> int:
    return sum(r.exists(keys.job_marker(topic, p)) for p in range(partitions))


# -- inline on a real server ----------------------------------------------------------------
def test_inline_on_a_server_applies_before_returning(lonely_url, topic_name):
    r = Redis.from_url(lonely_url)
    queued = r.llen(f"rq:queue:{QUEUE_NAME}")
    sow = Sow(lonely_url, inline=True)
    assert sow.inline is True
    sow.apply_config(cfg(topic_name))
    res = sow.publish(topic_name, [{"k": i, "v": "a"} for i in range(10)])
    # no worker runs on this server: the records are there because publish applied them
    assert records(r, topic_name) == 10
    assert {p: read_cursor(r, topic_name, p) for p in res.last_ids} == res.last_ids
    sow.delta_publish(topic_name, {"k": 3, "w": 1})
    assert [x.obj() for x in sow.sow(topic_name, "/k = 3")] == [{"k": 3, "v": "a", "w": 1}]
    assert sow.sow_delete(topic_name, filter="/k < 5") == 5
    assert records(r, topic_name) == 5
    # nothing was handed to the workers
    assert job_markers(r, topic_name) == 0 and r.llen(f"rq:queue:{QUEUE_NAME}") == queued
    print(f"inline: 10 published, 1 delta, 5 deleted; {records(r, topic_name)} records left")


def test_without_inline_a_server_applies_nothing_without_a_worker(lonely_url, topic_name):
    sow = Sow(settings=Settings.from_env(redis_url=lonely_url, write_through=False))
    assert sow.inline is False
    sow.apply_config(cfg(topic_name))
    res = sow.publish(topic_name, [{"k": i} for i in range(6)])
    r = sow.r
    assert res.published == 6 and records(r, topic_name) == 0
    assert sum(r.xlen(keys.log(topic_name, p)) for p in range(2)) == 6
    assert job_markers(r, topic_name) == len(res.last_ids)  # jobs enqueued for the workers
    with pytest.raises(WaitTimeout, match="not applied after 0.2 s"):
        sow.publish(topic_name, {"k": 99}, wait=True, timeout=0.2)
    # the public hand-off of another, inline client applies what is in the log
    applied = Sow(lonely_url, inline=True).handoff(topic_name, {0: "0-1", 1: "0-1"})
    assert applied == 7 and records(r, topic_name) == 7
    assert Sow(lonely_url).handoff(topic_name, {}) == 0
    print(f"workers mode: 7 logged, 0 applied; inline handoff applied {applied}")


def test_write_through_applies_plain_publishes_and_leaves_the_rest_to_workers(lonely_url,
                                                                            topic_name):
    """With write-through (the default), a plain publish to a caught-up partition is applied
    in the publisher's own write, with no worker; a delta_publish, and every publish logged
    behind it, wait in the log for a worker, in order."""
    sow = Sow(lonely_url)
    assert sow.settings.write_through and not sow.inline
    sow.apply_config(cfg(topic_name, "").replace("partitions = 2", "partitions = 1"))
    r = sow.r
    sub = ShardListener(r, [keys.partition_channel(topic_name, 0)])
    res = sow.publish(topic_name, [{"k": i, "v": 0} for i in range(5)], wait=True, timeout=2)
    assert records(r, topic_name, 1) == 5
    assert read_cursor(r, topic_name, 0) == res.last_ids[0]
    assert sub.get(timeout=1) is not None  # the change block, published
    assert job_markers(r, topic_name, 1) == 0  # nothing left: no worker is woken
    queued = r.llen(f"rq:queue:{QUEUE_NAME}")
    sow.delta_publish(topic_name, {"k": 1, "w": 1})
    after = sow.publish(topic_name, [{"k": 1, "v": 2}, {"k": 7, "v": 2}])
    # the delta needs a worker, and the publishes behind it wait for it (log order)
    assert records(r, topic_name, 1) == 5
    assert job_markers(r, topic_name, 1) == 1 and r.llen(f"rq:queue:{QUEUE_NAME}") == queued + 1
    assert read_cursor(r, topic_name, 0) == res.last_ids[0]
    applied = Sow(lonely_url, inline=True).handoff(topic_name, {0: after.last_ids[0]})
    assert applied == 3
    got = {x.obj()["k"]: x.obj() for x in sow.sow(topic_name)}
    assert got[1] == {"k": 1, "v": 2} and got[7] == {"k": 7, "v": 2} and len(got) == 6
    # caught up again: the next publish is written through
    sow.publish(topic_name, {"k": 8, "v": 3})
    assert records(r, topic_name, 1) == 7
    print(f"write-through: 5 + 1 applied by the publisher, {applied} by the hand-off")


def test_inline_waits_for_a_lease_held_elsewhere_then_times_out(lonely_url, topic_name):
    sow = Sow(lonely_url, inline=True)
    sow.apply_config(cfg(topic_name, "").replace("partitions = 2", "partitions = 1"))
    t = sow.topic(topic_name)
    lease = keys.lease(topic_name, 0)
    assert Scripts(sow.r).lease_acquire(lease, keys.state(topic_name, 0), "elsewhere:1:x",
                                        5000) is not None
    res = append(sow.r, t, [("publish", b'{"k":1}', None)])
    with pytest.raises(WaitTimeout, match="stayed leased by another process for 0.3 s"):
        sow.handoff(t, res.last_ids, timeout=0.3)
    assert records(sow.r, topic_name, 1) == 0
    Scripts(sow.r).lease_release(lease, "elsewhere:1:x")
    assert sow.handoff(t, res.last_ids) == 1 and records(sow.r, topic_name, 1) == 1


def test_memory_is_inline_and_refuses_workers_mode():
    assert Sow("memory://inline-test").inline is True
    with pytest.raises(ValueError, match=r"memory:// runs in this process.*no worker"):
        Sow("memory://inline-test", inline=False)


def test_inline_is_read_only(lonely_url):
    sow = Sow(lonely_url)
    with pytest.raises(AttributeError):
        sow.inline = True  # type: ignore[misc]


def test_expirer_forwards_dead_letters_in_the_declared_mode(lonely_url, topic_name):
    """The expirer hands the dead-letter copies over through ``Sow.handoff``: applied here
    when inline, enqueued for the workers otherwise; never chosen by the client's class."""
    import time

    dl = topic_name + "dl"
    sow = Sow(lonely_url, inline=True)
    sow.apply_config(cfg(topic_name, f'expiration = "100ms"\ndead_letter = "{dl}"')
                     + f'[[topic]]\nname = "{dl}"\npartitions = 1\n')
    sow.publish(topic_name, [{"k": 1}, {"k": 2}])
    time.sleep(0.25)
    r = sow.r
    assert Expirer(r, sow.settings, topics=[topic_name]).run(burst=True) == 2
    assert Expirer(r, sow.settings).sow.inline is False
    assert r.xlen(keys.log(dl, 0)) == 2 and records(r, dl, 1) == 0
    sow.publish(topic_name, [{"k": 3}])
    time.sleep(0.25)
    assert Expirer(r, sow.settings, topics=[topic_name], inline=True).run(burst=True) == 1
    # inline: every copy in the dead-letter log is applied, the two earlier ones too
    assert sorted(x.obj()["data"]["k"] for x in sow.sow(dl)) == [1, 2, 3]


# -- connecting --------------------------------------------------------------------------
@pytest.mark.parametrize("bad, why", [
    ("notaurl", "use redis://host:port/db"),
    ("http://127.0.0.1:1/0", "use redis://host:port/db"),
    ("redis://127.0.0.1:99999/0", "Port out of range"),
    ("redis://127.0.0.1:nope/0", "Port could not be cast to integer"),
    ("redis://127.0.0.1/0?socket_timeout=x", "Invalid value for 'socket_timeout'"),
])
def test_a_bad_url_is_one_line_from_connect(bad, why):
    with pytest.raises(BadURLError) as info:
        connect(bad)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"invalid Redis URL {bad!r}: ") and why in text
    with pytest.raises(BadURLError):
        Sow(bad)
    with pytest.raises(BadURLError):
        check_url(bad)


def test_a_bad_url_never_shows_its_password():
    with pytest.raises(BadURLError) as info:
        connect("redis://alice:S3cret@127.0.0.1:nope/0")
    assert "S3cret" not in str(info.value) and "redis://alice:***@127.0.0.1:nope/0" in str(
        info.value)


def test_cli_reports_a_bad_port_in_one_line():
    proc = run_cli("redis://127.0.0.1:99999/0", "sow", "-t", "x", check=False)
    err = proc.stderr.decode().strip()
    assert proc.returncode == 1 and "\n" not in err and "Traceback" not in err
    assert err.startswith("Error: invalid --redis-url 'redis://127.0.0.1:99999/0': "
                          "Port out of range 0-65535")


# -- stream ids ---------------------------------------------------------------------------
@pytest.mark.parametrize("later, earlier", [
    ("10-0", "9-5"), ("5-10", "5-9"), ("1700000000000-0", "999999999999-99"), ("0-1", "0-0"),
    (b"10-0", "9-5"), ("6", "5-99"),
])
def test_stream_ids_order_by_numbers_not_text(later, earlier):
    assert streamids.compare(later, earlier) == 1
    assert streamids.compare(earlier, later) == -1
    assert streamids.compare(later, later) == 0
    assert streamids.reached(later, earlier) and not streamids.reached(earlier, later)


def test_stream_id_parts_and_refusals():
    assert streamids.parse("1700000000123-7") == (1700000000123, 7)
    assert streamids.parse(b"5") == (5, 0)
    assert streamids.ms_of("1700000000123-7") == 1700000000123
    assert not streamids.reached(None, "0-1")
    for bad in ("", "-1", "1-", "a-1", "1-2-3", " 1-2", "１-2", "1-２", "1_0-2"):
        with pytest.raises(ValueError, match="not a stream id"):
            streamids.parse(bad)


# -- partition state -----------------------------------------------------------------------
def test_cursor_and_seq_readers(lonely_url, topic_name):
    sow = Sow(lonely_url, inline=True)
    sow.apply_config(cfg(topic_name).replace("partitions = 2", "partitions = 1"))
    assert read_cursor(sow.r, topic_name, 0) == "0-0" and read_seq(sow.r, topic_name, 0) == 0
    res = sow.publish(topic_name, [{"k": 1}, {"k": 2}, {"k": 1, "v": 2}])
    assert read_cursor(sow.r, topic_name, 0) == res.last_ids[0]
    assert read_cursors(sow.r, topic_name, [0]) == res.last_ids
    assert read_seq(sow.r, topic_name, 0) == 3  # one change event per publish
    sow.sow_delete(topic_name, filter="1=1")
    assert read_seq(sow.r, topic_name, 0) == 5
