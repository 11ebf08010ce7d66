"""Ports of a local Redis Cluster's nodes: a node's cluster bus (port + 10000) must not be
another node's port, or that node does not start ("Address already in use": CI failed once
when free ports 41757 and 51757 went to two nodes of one cluster)."""

from __future__ import annotations

import socket

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
