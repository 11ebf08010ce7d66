"""Ports of a local Redis Cluster's nodes: a node's cluster bus (port + 10000) must not be
another node's port, or that node does not start ("Address already in use": CI failed once
when free ports 41757 and 51757 went to two nodes of one cluster)."""

from __future__ import annotations

import socket

import pytest

from sow_redis.ops import server


def test_a_node_port_whose_bus_is_taken_is_skipped(monkeypatch):
    a = 41757
    offered = iter([a - 10000, a, a + 10000, 40123, 40124])
    monkeypatch.setattr(server, "free_port", lambda: next(offered))
    monkeypatch.setattr(socket.socket, "bind", lambda self, addr: None)  # all free
    # a - 10000: its bus is a's port; a: taken; a + 10000: a's bus
    assert server.free_cluster_port([a]) == 40123


def test_a_node_port_whose_bus_port_is_in_use_is_skipped(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        if busy - 10000 < 1024:
            return  # no candidate below it to offer
        # busy - 10000 first, then real free ports (one may be skipped in turn: above 55535,
        # or its bus port taken by another process of the run)
        offered, real = iter([busy - 10000]), server.free_port
        monkeypatch.setattr(server, "free_port", lambda: next(offered, None) or real())
        port = server.free_cluster_port()
    assert port != busy - 10000


def test_ports_of_a_cluster_never_clash():
    ports: list[int] = []
    for _ in range(9):
        ports.append(server.free_cluster_port(ports))
    every = ports + [p + 10000 for p in ports]
    assert len(set(every)) == len(every)


def _taken() -> socket.socket:
    """A socket bound to a free loopback port, as a client connection's ephemeral port is:
    a port some other process took (nothing listens: a ping is refused)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    return held


def test_a_server_whose_free_port_was_taken_meanwhile_starts_on_another(monkeypatch, tmp_path):
    """Between :func:`free_port` and redis-server's listen, another process may take the port
    (an outgoing connection's ephemeral port): the server starts on another free one."""
    with _taken() as held:
        taken = held.getsockname()[1]
        offered, real = iter([taken]), server.free_port
        monkeypatch.setattr(server, "free_port", lambda: next(offered, None) or real())
        with pytest.raises(server.PortTakenError, match=f"port {taken}"):
            server.spawn_redis(taken, tmp_path / "first", persist=False)
        port, proc = server.spawn_redis_on_free_port(tmp_path / "second", persist=False)
    try:
        assert port != taken
        assert server._ping(f"redis://127.0.0.1:{port}/0")
    finally:
        server.stop_processes([proc], timeout_s=10)


def test_a_cluster_node_whose_port_was_taken_meanwhile_starts_on_another(monkeypatch,
                                                                          tmp_path):
    with _taken() as held:
        taken = held.getsockname()[1]
        real, offered = server.free_cluster_port, iter([taken])
        monkeypatch.setattr(server, "free_cluster_port",
                            lambda ports=(): next(offered, None) or real(ports))
        cluster = server.spawn_cluster(3, 0, tmp_path / "cluster")
    try:
        assert taken not in cluster.ports and len(cluster.procs) == 3
        assert cluster.url == f"redis+cluster://127.0.0.1:{cluster.ports[0]}"
        assert set(cluster.procs) == set(cluster.ports)
    finally:
        cluster.stop()
