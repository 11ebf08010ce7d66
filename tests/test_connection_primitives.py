"""The primitives of sow_redis.connection that hide the server-or-cluster difference give the
same answers on a server, a Redis Cluster and memory:// (what their callers rely on)."""

from __future__ import annotations

import time
import uuid

import pytest

from sow_redis import keys
from sow_redis.connection import (
    clients_by_node,
    connect,
    connect_primaries,
    get_many,
    info_per_primary,
    node_for_key,
    primary_clients,
    reload_slot_map,
    server_info,
    single_pool,
    write_in_stages,
    xread_any,
)

pytestmark = pytest.mark.parametrize(
    "plane", ["server", pytest.param("cluster", marks=pytest.mark.cluster)], indirect=True)


@pytest.fixture
def rc(backend_url):
    return connect(backend_url)


def _names(n: int) -> list[str]:
    """``n`` keys of different topics (so of different slots on a cluster)."""
    return [keys.lease(f"t{uuid.uuid4().hex[:8]}", i) for i in range(n)]


def test_get_many_reads_keys_of_any_slot_in_order(rc):
    names = _names(6)
    for i, name in enumerate(names[::2]):
        rc.set(name, f"v{i}")
    assert get_many(rc, names) == [b"v0", None, b"v1", None, b"v2", None]


def test_write_in_stages_writes_every_stage_and_returns_every_reply(rc):
    a, b, counter = _names(3)

    def first(pipe):
        pipe.set(a, "1")
        pipe.set(b, "2")

    def second(pipe):
        pipe.incr(counter)

    replies = write_in_stages(rc, [first, second])
    assert replies == [True, True, 1]
    assert get_many(rc, [a, b, counter]) == [b"1", b"2", b"1"]


def test_xread_any_sees_an_entry_after_the_given_id_of_any_stream(rc):
    streams = _names(3)
    sid = rc.xadd(streams[1], {"f": "v"}).decode()
    assert xread_any(rc, {s: "0-0" for s in streams}, 10)
    assert xread_any(rc, {streams[1]: "0-0"}, 10)
    t0 = time.monotonic()
    assert not xread_any(rc, {s: sid for s in streams}, 50)
    assert time.monotonic() - t0 >= 0.04  # it waited (blocked or slept) before saying no


def test_clients_by_node_covers_every_name_once_and_each_client_holds_its_keys(rc):
    names = _names(8)
    groups = clients_by_node(rc, names)
    assert sorted(n for _c, ns in groups for n in ns) == sorted(names)
    for client, ns in groups:
        for n in ns:
            client.set(n, "x")  # a cluster node refuses a key of another node's slot (MOVED)
    assert get_many(rc, names) == [b"x"] * len(names)


def test_node_for_key_and_primary_clients_agree(rc):
    name = _names(1)[0]
    client, where = node_for_key(rc, name)
    assert where in dict(primary_clients(rc))
    client.set(name, "y")
    assert rc.get(name) == b"y"


def test_single_pool_is_the_client_pool_except_on_a_cluster(rc, plane):
    assert single_pool(rc) is (None if plane == "cluster" else rc.connection_pool)
    reload_slot_map(rc)  # nothing on a server; the slot map read again on a cluster


def test_info_per_primary_names_the_primaries_server_info_only_a_server(plane, url):
    rc = connect(url)  # fakeredis (memory://) has no INFO
    infos = info_per_primary(rc, "server")
    assert sorted(infos) == sorted(name for name, _c in primary_clients(rc))
    if plane == "cluster":
        assert server_info(rc, "server") is None
        assert len(infos) >= 3
    else:
        assert server_info(rc, "server") is not None
        assert list(infos) == ["the server"]
    primaries = connect_primaries(url, socket_timeout_s=2)
    assert [n for n, _c in primaries] == (
        [None] if plane == "server" else [n for n, _c in primary_clients(rc)])
    assert all(c.ping() for _n, c in primaries)
