"""Commands packed as RESP by hand, and :class:`XaddBatch`, which writes them on one pooled
connection: the publisher's fast path to one server (docs/benchmarks.md, "Profiles")."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from .. import keys
from ..connection import Client, Fields

if TYPE_CHECKING:
    from redis.connection import Connection


def resp(args: Sequence[str | bytes | int | float], header: bool = True) -> bytes:
    """RESP bytes of one command (``header``: with its array header) of str, bytes, int or
    float arguments."""
    out = bytearray(b"*%d\r\n" % len(args)) if header else bytearray()
    for a in args:
        v = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(v), v)
    return bytes(out)


GET_REGISTRY_VERSION = resp(("GET", keys.REGISTRY_VERSION))
"""``GET`` of the registry version (``append(registry_check=True)``)."""
UNWATCH = resp(("UNWATCH",))
MULTI = resp(("MULTI",))
EXEC = resp(("EXEC",))


class XaddBatch:
    """``XADD <key> * <field> <value> …`` commands packed as RESP by hand and sent in one
    write on one pooled connection: redis-py's per-command packing and reply handling cost
    about 4 µs per message, five times what Redis spends on the XADD (docs/benchmarks.md,
    "Profiles"). Same round trips and replies as a redis-py pipeline.

    :meth:`send` writes the queued commands and returns at once; :meth:`collect` reads their
    replies later, so the caller prepares the next chunk while Redis appends this one; the
    replies of several sends may be pending, read oldest first. :meth:`close` always (it
    gives the connection back, or drops it when replies were left unread).
    """

    def __init__(self, r: Client) -> None:
        self._r = r
        self._buf = bytearray()
        self._n = 0
        self._sent: deque[int] = deque()  # commands per send whose replies are unread
        self._conn: Connection | None = None

    def add(self, key: bytes, fields: Fields) -> None:
        """Queue one XADD with an auto-generated id of ``fields`` (str or bytes values)."""
        buf = self._buf
        buf += b"*%d\r\n$4\r\nXADD\r\n$%d\r\n%s\r\n$1\r\n*\r\n" % (
            3 + 2 * len(fields), len(key), key)
        for name, value in fields.items():
            k = name.encode() if isinstance(name, str) else bytes(name)  # type: ignore[arg-type]
            v = value if isinstance(value, bytes) else str(value).encode()
            buf += b"$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v)
        self._n += 1

    def add_set_nx(self, key: bytes, value: bytes, px: int) -> None:
        """Queue ``SET key value NX PX px`` (``px`` in milliseconds; its reply: ``OK`` when
        set, None when the key existed)."""
        self._buf += b"*6\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$2\r\nNX\r\n" \
            b"$2\r\nPX\r\n$%d\r\n%d\r\n" % (len(key), key, len(value), value, len(str(px)), px)
        self._n += 1

    def add_packed(self, command: bytes) -> None:
        """Queue one command already packed as RESP (see :func:`resp`)."""
        self._buf += command
        self._n += 1

    def send(self) -> None:
        """Write every queued command and start queueing anew; :meth:`collect` reads the
        replies of each send, oldest first.

        Raises:
            Connection errors (the connection is dropped).
        """
        data, n = bytes(self._buf), self._n
        self._buf, self._n = bytearray(), 0
        if not n:
            self._sent.append(0)
            return
        if self._conn is None:
            self._conn = self._r.connection_pool.get_connection()
        try:
            self._conn.send_packed_command([data], check_health=False)
        except BaseException:
            self._drop()
            raise
        self._sent.append(n)

    def collect(self, tolerate_from: int | None = None) -> list[object]:
        """The replies of the oldest :meth:`send` not collected yet, in order (stream ids
        for XADD).

        Args:
            tolerate_from: error replies of the commands from this position on are returned
                in place (the ``ResponseError``), not raised.

        Raises:
            redis.exceptions.ResponseError: the first error reply (before ``tolerate_from``),
                after every reply was read (the other commands took effect, as with a
                pipeline); connection errors.
        """
        n = self._sent.popleft()
        out: list[object] = []
        error: ResponseError | None = None
        try:
            for i in range(n):
                assert self._conn is not None
                try:
                    out.append(self._conn.read_response())
                except ResponseError as exc:
                    if tolerate_from is not None and i >= tolerate_from:
                        out.append(exc)
                        continue
                    error = error or exc
                    out.append(b"")
        except BaseException:
            self._drop()
            raise
        if error is not None:
            raise error
        return out

    def execute(self) -> list[object]:
        """Send every queued command and read the replies (one round trip)."""
        self.send()
        return self.collect()

    def close(self) -> None:
        """Give the connection back to the pool (dropped if replies are still unread)."""
        if self._sent:
            self._drop()
        elif self._conn is not None:
            self._r.connection_pool.release(self._conn)
            self._conn = None

    def _drop(self) -> None:
        self._sent.clear()
        if self._conn is not None:
            self._conn.disconnect()
            self._r.connection_pool.release(self._conn)
            self._conn = None
