"""Paging (skip_n with top_n) and select lists of sow queries (issue 25; AMPS skip_n and
select)."""

from __future__ import annotations

import orjson
import pytest

from sow_redis.client import Sow
from conftest import run_cli


def _config(name: str) -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = 3\n'


def test_pages_cover_every_match_once_in_order(sow, topic_name):
    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": i, "px": (i * 7) % 23, "o": {"a": i, "b": -i}}
                             for i in range(50)])
    every = [r.obj()["id"] for r in sow.sow(topic_name, "/px > 3", order_by="/px, /id")]
    pages = []
    for start in range(0, 60, 7):
        pages += [r.obj()["id"] for r in sow.sow(topic_name, "/px > 3", order_by="/px, /id",
                                                  skip_n=start, top_n=7)]
    assert pages == every and len(every) == 41
    assert len(sow.sow(topic_name, skip_n=45)) == 5  # unordered: any 5 of the 50
    assert sow.sow(topic_name, skip_n=50) == []
    with pytest.raises(ValueError, match="skip_n must be 0 or more"):
        sow.sow(topic_name, skip_n=-1)


def test_select_lists_keep_only_the_named_fields(sow, topic_name):
    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": 1, "px": 5, "o": {"a": 1, "b": 2}, "n": None}])
    (rec,) = sow.sow(topic_name, select=["/id", "/o/b", "/n", "/missing"])
    assert rec.obj() == {"id": 1, "o": {"b": 2}, "n": None}
    with pytest.raises(ValueError, match="field path"):
        sow.sow(topic_name, select=["id"])


def test_cli_paging_and_select(url, topic_name):
    Sow(url).apply_config(_config(topic_name))
    run_cli(url, "publish", "-t", topic_name, "--wait",
            input=b"".join(b'{"id": %d, "px": %d, "x": "y"}\n' % (i, i) for i in range(10)))
    out = run_cli(url, "sow", "-t", topic_name, "--order-by", "/px DESC", "--skip-n", "2",
                  "--top-n", "3", "--select", "/id")
    assert [orjson.loads(x) for x in out.stdout.splitlines()] == [{"id": 7}, {"id": 6},
                                                                   {"id": 5}]
    bad = run_cli(url, "sow", "-t", topic_name, "--select", "id", check=False)
    err = bad.stderr.decode().strip().splitlines()
    assert bad.returncode == 1 and len(err) == 1 and "--select" in err[0], err


def test_batches_hand_over_every_match_once(sow, topic_name):
    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, [{"id": i, "px": i % 7} for i in range(100)])
    batches = list(sow.sow_batches(topic_name, 16, "/px > 2"))
    assert all(1 <= len(b) <= 16 for b in batches) and len(batches) >= 4
    got = sorted(r.obj()["id"] for b in batches for r in b)
    assert got == sorted(r.obj()["id"] for r in sow.sow(topic_name, "/px > 2"))
    ordered = [r.obj()["id"] for b in sow.sow_batches(topic_name, 10, order_by="/id DESC",
                                                      skip_n=5, top_n=25) for r in b]
    assert ordered == list(range(94, 69, -1))
    assert sum(len(b) for b in sow.sow_batches(topic_name, 7, skip_n=90, top_n=20)) == 10
    with pytest.raises(ValueError, match="batch_size"):
        next(sow.sow_batches(topic_name, 0))
