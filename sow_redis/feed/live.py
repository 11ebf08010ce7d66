"""Listening to sharded pub/sub channels (``SSUBSCRIBE``) on one server or across the nodes of
a Redis Cluster: the live change blocks of a topic's partitions
(:func:`sow_redis.keys.partition_channel`, published by the Lua scripts with ``SPUBLISH``).

Why sharded: a plain ``PUBLISH`` on a Redis Cluster is sent to every node over the cluster
bus, whether or not anyone listens there, so each node pays for every other node's change
blocks; ``SPUBLISH`` stays on the node (and replicas) of the channel's hash slot, which is the
partition's slot (Redis docs, "Sharded Pub/Sub"; measured in docs/benchmarks.md, scale-out).

A :class:`ShardListener` holds one pub/sub connection per node that serves some of its
channels and waits on all of them at once (``select`` on their sockets), so a block from any
node is read as soon as it arrives (redis-py's ``ClusterPubSub.get_sharded_message`` waits on
one node at a time).
"""

from __future__ import annotations

import itertools
import select
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import keys
from ..connection import Client, clients_by_node, reload_slot_map

SELECT_SLICE_S = 0.1
"""Longest single wait on the sockets; the connections are polled again after it (a TLS
connection may hold decrypted bytes that ``select`` does not see)."""


class ChannelMoved(RedisConnectionError):
    """The server unsubscribed this listener from a channel it did not leave: the channel's
    hash slot moved to another node (resharding or a failover). Subscribe again."""


class _Replies:
    """The replies of one subscribed pub/sub connection, read straight from its socket into
    the connection's hiredis reader: a change block costs about 1.5 µs here against 15 µs
    through redis-py's ``get_message``, which builds a message dict, formats the whole
    payload for a debug log line and records metrics for each one (measured on this
    project's 2-core machine; a subscriber receives a block per partition touched by each
    publish). Only the replies this listener expects come on these connections:
    ``ssubscribe`` confirmations, ``smessage`` and ``sunsubscribe``."""

    __slots__ = ("_buf", "reader", "sock")

    def __init__(self, reader: Any, sock: Any) -> None:
        self.reader = reader
        self.sock = sock
        self._buf = bytearray(65536)

    @classmethod
    def of(cls, ps: Any) -> _Replies | None:
        """The reader of subscribed ``ps``; None when its connection has no hiredis reader
        on a socket (then redis-py reads it)."""
        conn = ps.connection
        reader = getattr(getattr(conn, "_parser", None), "_reader", None)
        sock = getattr(conn, "_sock", None)
        if reader is None or sock is None or not hasattr(reader, "gets") \
                or not hasattr(sock, "recv_into"):
            return None
        return cls(reader, sock)

    def take(self) -> bytes | None:
        """The payload of the next message already read, None when none is buffered.

        Raises:
            ChannelMoved: an ``sunsubscribe`` this listener did not ask for.
            redis.exceptions.ConnectionError: an error reply.
        """
        while True:
            rep = self.reader.gets(False)
            if isinstance(rep, list):  # hiredis 3.2+: a PushNotification (a list)
                if rep[0] == b"smessage":
                    return rep[2]
                if rep[0] == b"sunsubscribe":
                    raise ChannelMoved(f"Redis unsubscribed this listener from {rep[1]!r}")
                continue  # a confirmation
            if isinstance(rep, Exception):
                raise RedisConnectionError(f"pub/sub connection: {rep}")
            if rep is False or type(rep) is object:  # hiredis: no complete reply yet
                return None

    def pending(self) -> bool:
        """Whether a TLS socket holds decrypted bytes (``select`` does not see them)."""
        pending = getattr(self.sock, "pending", None)
        return bool(pending and pending())

    def fill(self) -> None:
        """Read what the socket holds (call when it is readable).

        Raises:
            redis.exceptions.ConnectionError: the server closed the connection.
            OSError: the connection failed.
        """
        n = self.sock.recv_into(self._buf)
        if n == 0:
            raise RedisConnectionError("the server closed the pub/sub connection")
        self.reader.feed(self._buf, 0, n)


class ShardListener:
    """Subscribed to ``channels`` (sharded) once constructed: each node has confirmed its
    subscriptions, so every message published on them from now on is read by :meth:`get`
    unless the connection is lost (which :meth:`get` raises).

    Raises:
        redis.exceptions.RedisError: a node is unreachable, or did not confirm within
            ``confirm_timeout_s`` seconds (``TimeoutError``).
    """

    def __init__(self, r: Client, channels: Sequence[str], confirm_timeout_s: float = 10.0) -> None:
        self._client = r  # kept: a client that is collected closes its pool's connections
        self._subs: list[Any] = []  # redis-py types PubSub.connection as None
        try:
            for client, chans in clients_by_node(r, channels):
                ps = client.pubsub()
                self._subs.append(ps)
                for ch in chans:  # one command per channel: a cluster node refuses channels
                    ps.ssubscribe(ch)  # of several slots in one SSUBSCRIBE (CROSSSLOT)
            deadline = time.monotonic() + confirm_timeout_s
            for ps in self._subs:
                want = len(ps.shard_channels)
                while want:
                    msg = ps.get_message(timeout=1.0)
                    if msg is not None and msg.get("type") == "ssubscribe":
                        want -= 1
                    elif time.monotonic() > deadline:
                        raise RedisTimeoutError(
                            f"no ssubscribe confirmation from Redis in {confirm_timeout_s:g} s")
        except BaseException:
            self.close()
            raise
        self._order = itertools.cycle(range(len(self._subs)))
        replies = [_Replies.of(ps) for ps in self._subs]
        self._replies: list[_Replies] | None = (
            None if any(rp is None for rp in replies) else replies)  # type: ignore[assignment]

    def get(self, timeout: float) -> bytes | None:
        """The payload of the next message on any channel, or None after ``timeout``
        seconds.

        Raises:
            ChannelMoved: the server unsubscribed a channel (its slot moved).
            redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError: a
                connection was lost.
        """
        if self._replies is None:
            return self._get_via_redis_py(timeout)
        replies = self._replies
        deadline = time.monotonic() + timeout
        while True:
            first = next(self._order)
            for i in range(len(replies)):  # taken in turn, starting one further each call
                payload = replies[(first + i) % len(replies)].take()
                if payload is not None:
                    return payload
            ready = [rp for rp in replies if rp.pending()]
            if not ready:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                try:
                    readable, _w, _x = select.select([rp.sock for rp in replies], [], [],
                                                     min(left, SELECT_SLICE_S))
                except ValueError:  # a socket was closed under us (fd -1)
                    raise RedisConnectionError("a pub/sub connection is closed") from None
                ready = [rp for rp in replies if rp.sock in readable]
            for rp in ready:
                rp.fill()

    def _get_via_redis_py(self, timeout: float) -> bytes | None:
        """:meth:`get` through redis-py's ``get_message`` (connections without a hiredis
        reader on a socket: the in-process ``memory://`` mode)."""
        subs = self._subs
        deadline = time.monotonic() + timeout
        while True:
            first = next(self._order)
            for i in range(len(subs)):  # polled in turn, starting one further each call
                payload = self._payload(subs[(first + i) % len(subs)].get_message(
                    timeout=0.0 if len(subs) > 1 else max(0.0, deadline - time.monotonic())))
                if payload is not None:
                    return payload
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if len(subs) == 1:
                continue
            socks = [ps.connection._sock for ps in subs if ps.connection is not None]
            if len(socks) < len(subs) or any(s is None for s in socks):
                raise RedisConnectionError("a pub/sub connection is closed")
            select.select(socks, [], [], min(left, SELECT_SLICE_S))

    @staticmethod
    def _payload(msg: dict[str, Any] | None) -> bytes | None:
        if msg is None:
            return None
        kind = msg.get("type")
        if kind == "smessage":
            return msg["data"]
        if kind == "sunsubscribe":
            raise ChannelMoved(f"Redis unsubscribed this listener from {msg.get('channel')!r}")
        return None

    def close(self) -> None:
        """Close every connection (those already lost too)."""
        subs, self._subs = self._subs, []
        for ps in subs:
            try:
                ps.close()
            except Exception:
                pass


def refresh_topology(r: Client) -> None:
    """On a cluster client, read the slot map again (after a node was lost, its replica may
    serve its slots now); nothing on a single server. Errors are left for the next attempt."""
    try:
        reload_slot_map(r)
    except Exception:
        pass


def shard_subscribers(r: Client, channels: Sequence[str]) -> dict[str, int]:
    """channel → its subscribers (``PUBSUB SHARDNUMSUB``, asked of the node of each channel's
    slot on a cluster, one command per channel as a node refuses channels of several slots
    in one; one round trip per node)."""
    out: dict[str, int] = {}
    for client, chans in clients_by_node(r, channels):
        pipe = client.pipeline(transaction=False)
        for ch in chans:
            pipe.pubsub_shardnumsub(ch)
        for reply in pipe.execute():
            for name, n in reply:
                out[name.decode() if isinstance(name, bytes) else name] = int(n)
    return out


def topic_subscribers(r: Client, topics: Sequence[str]) -> dict[str, int]:
    """topic → its subscribers: those of its partition 0's channel (a subscriber listens to
    every partition's channel, a topic has a partition 0)."""
    counts = shard_subscribers(r, [keys.partition_channel(t, 0) for t in topics])
    return {t: counts.get(keys.partition_channel(t, 0), 0) for t in topics}
