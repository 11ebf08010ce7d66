"""SOW queries (sow_redis.query.sow) through the Python API on both backends and through the CLI:
top-N limits, and filters that must neither hang nor overflow the stack (issues 7.6, 7.12, 8.1)."""

from __future__ import annotations

import time

import orjson
import pytest
from conftest import run_cli

from sow_redis.client import Sow
from sow_redis.errors import FilterSyntaxError


def cfg(name: str) -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/orderId"]\npartitions = 2\n'


def orders(n: int) -> list[dict]:
    return [{"orderId": i, "px": (i * 37) % 11, "sym": "AB"[i % 2]} for i in range(n)]


@pytest.fixture
def cli_topic(url, topic_name):
    """A topic on the test server with 12 orders and a record whose /s is 32 × a + "!",
    applied in process (no worker needed for queries)."""
    sow = Sow(url, inline=True)
    sow.apply_config(cfg(topic_name))
    sow.publish(topic_name, orders(12) + [{"orderId": 100, "s": "a" * 32 + "!"}])
    return topic_name


def cli_lines(proc) -> list[dict]:
    return [orjson.loads(x) for x in proc.stdout.splitlines()]


# --------------------------------------------------------------------------- top-N


def test_top_n_zero_returns_no_record(sow, topic_name):
    # issue 8.1: top_n=0 returned one record (the limit was checked after adding one)
    sow.apply_config(cfg(topic_name))
    sow.publish(topic_name, orders(20))
    assert len(sow.sow(topic_name)) == 20
    assert sow.sow(topic_name, top_n=0) == []
    assert sow.sow(topic_name, top_n=0, order_by="/px") == []
    assert sow.sow(topic_name, "/sym = 'A'", top_n=0) == []
    assert len(sow.sow(topic_name, top_n=1)) == 1
    assert len(sow.sow(topic_name, "/sym = 'A'", top_n=3)) == 3
    assert [r.obj()["px"] for r in sow.sow(topic_name, top_n=2, order_by="/px DESC")] == [10, 10]
    assert len(sow.sow(topic_name, top_n=25)) == 20
    with pytest.raises(FilterSyntaxError):  # a bad filter is still reported with top_n=0
        sow.sow(topic_name, "/px > AND", top_n=0)
    with pytest.raises(FilterSyntaxError):
        sow.sow(topic_name, top_n=0, order_by="px")
    with pytest.raises(ValueError, match="top_n must be 0 or more, got -1"):
        sow.sow(topic_name, top_n=-1)


def test_cli_top_n_zero_prints_nothing(url, cli_topic):
    assert len(cli_lines(run_cli(url, "sow", "-t", cli_topic))) == 13
    for extra in ([], ["--order-by", "/px"], ["-f", "/px >= 0"]):
        out = run_cli(url, "sow", "-t", cli_topic, "--top-n", "0", *extra)
        assert out.returncode == 0 and out.stdout == b"", (extra, out.stdout)
    assert len(cli_lines(run_cli(url, "sow", "-t", cli_topic, "--top-n", "1"))) == 1


# ----------------------------------------------------------------- bounded filters


def test_catastrophic_like_in_query_and_sow_delete_returns_quickly(sow, topic_name):
    # issue 7.6: "(a+)+$" on 32 × a + "!" kept a backtracking engine busy for minutes
    sow.apply_config(cfg(topic_name))
    sow.publish(topic_name, [{"orderId": 1, "s": "a" * 32 + "!"}, {"orderId": 2, "s": "aaa"}])
    t0 = time.perf_counter()
    assert [r.obj()["orderId"] for r in sow.sow(topic_name, "/s LIKE '(a+)+$'")] == [2]
    queried = time.perf_counter() - t0
    assert sow.sow_delete(topic_name, filter="/s LIKE '^(a+)+$'") == 1
    assert sow.sow_delete(topic_name, filter="/s LIKE '(a+)+$'") == 0
    elapsed = time.perf_counter() - t0
    assert [r.obj()["orderId"] for r in sow.sow(topic_name)] == [1]
    print(f"catastrophic LIKE: query {queried * 1000:.1f} ms, query + 2 sow_delete "
          f"{elapsed * 1000:.1f} ms")
    assert elapsed < 5.0


def test_cli_catastrophic_like_returns(url, cli_topic):
    t0 = time.perf_counter()
    out = run_cli(url, "sow", "-t", cli_topic, "-f", "/s LIKE '(a+)+$'", timeout=30)
    assert out.stdout == b""
    got = cli_lines(run_cli(url, "sow", "-t", cli_topic, "-f", "/s LIKE '^(a+)+!$'"))
    assert got == [{"orderId": 100, "s": "a" * 32 + "!"}]
    elapsed = time.perf_counter() - t0
    print(f"CLI catastrophic LIKE, 2 runs: {elapsed:.2f} s")
    assert elapsed < 20.0
    bad = run_cli(url, "sow", "-t", cli_topic, "-f", r"/s LIKE '(a)\1'", check=False)
    err = bad.stderr.decode().splitlines()
    assert bad.returncode != 0 and len(err) == 1
    assert "LIKE pattern uses a backreference \\1, which is not supported" in err[0]


def test_five_thousand_term_or_chain_query(sow, topic_name):
    sow.apply_config(cfg(topic_name))
    sow.publish(topic_name, orders(12))
    disj = " OR ".join(f"/orderId = {i + 5}" for i in range(5000))
    assert sorted(r.obj()["orderId"] for r in sow.sow(topic_name, disj)) == list(range(5, 12))


_DEEP = {
    "493 NOTs": "NOT " * 493 + "/px = 1",
    "2,000 unary minus": "- " * 2000 + "1 = /px",
    "1,000 parentheses": "(" * 1000 + "/px = 1" + ")" * 1000,
}


@pytest.mark.parametrize("filt", list(_DEEP.values()), ids=list(_DEEP))
def test_cli_deep_filter_is_one_line_error(url, cli_topic, filt):
    # issue 7.12: a 3,000-line RecursionError traceback in sow, subscribe and sow-delete
    for cmd in (["sow"], ["sow-delete", "--timeout", "5"], ["subscribe", "--timeout", "1"]):
        out = run_cli(url, *cmd, "-t", cli_topic, "-f", filt, check=False, timeout=60)
        err = out.stderr.decode().splitlines()
        assert out.returncode != 0, cmd
        assert len(err) == 1, (cmd, err[:3])
        assert err[0].startswith("Error: filter nests deeper than 200 levels ("), err[0]
        assert out.stdout == b""
    assert len(cli_lines(run_cli(url, "sow", "-t", cli_topic))) == 13  # nothing deleted


def test_cli_long_or_chain(url, cli_topic):
    disj = " OR ".join(f"/orderId = {i + 5}" for i in range(5000))
    got = cli_lines(run_cli(url, "sow", "-t", cli_topic, "-f", disj, "--order-by", "/orderId"))
    assert [o["orderId"] for o in got] == [*range(5, 12), 100]  # 100 = term 95
