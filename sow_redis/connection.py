"""Connecting to a SOW's Redis: URL checks, clients, and the server clock.

URLs (redis-py ``Redis.from_url``): ``redis://[user:password@]host:port/db``,
``rediss://…`` (TLS), ``unix:///path/to/socket[?db=N]``; and ``memory://[name]``, an
in-process fakeredis server (clients of one name share one server; it lives as long as this
process). A URL that cannot be used raises :class:`~sow_redis.errors.BadURLError` (one line,
password masked) before anything is sent.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .errors import BadURLError

MEMORY = "memory://"
"""Scheme prefix of the in-process backend."""

URL_SCHEMES = ("redis://", "rediss://", "unix://")
"""Scheme prefixes of a Redis server."""

_USAGE = ("use redis://host:port/db, rediss://host:port/db or unix:///path/to/socket "
          "(memory://name in the Python API)")

_memory_servers: dict[str, Any] = {}


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (never print a password)."""
    try:
        u = urlsplit(url)
        if u.password is None:
            return url
        netloc = u.netloc.rsplit("@", 1)[1]
        user = f"{u.username}:" if u.username else ":"
        return urlunsplit(u._replace(netloc=f"{user}***@{netloc}"))
    except ValueError:
        return url if "@" not in url else "<unparsable URL>"


def is_memory(url: str) -> bool:
    """Whether ``url`` names the in-process backend (``memory://…``)."""
    return url.startswith(MEMORY)


def _redis_client(url: str) -> Any:
    """A redis-py client (bytes responses) for a server URL; nothing is sent yet.

    Raises:
        BadURLError: not a server URL, or redis-py cannot parse it.
    """
    if not url.startswith(URL_SCHEMES):
        raise BadURLError(redact(url), _USAGE)
    from redis import Redis

    try:
        u = urlsplit(url)
        _ = u.port  # "Port out of range", "Port could not be cast to integer value"
        return Redis.from_url(url)
    except ValueError as exc:
        text = " ".join(str(exc).replace(url, redact(url)).split()).rstrip(".")
        raise BadURLError(redact(url), f"{text}; {_USAGE}") from None


def check_url(url: str) -> None:
    """Refuse a URL :func:`connect` cannot use, without connecting.

    Raises:
        BadURLError: one line naming the URL (password masked) and what is wrong.
    """
    if not is_memory(url):
        _redis_client(url)


def connect(url: str) -> Any:
    """A client for ``url``: redis-py (bytes responses) for a server, fakeredis for
    ``memory://[name]``. No command is sent: an unreachable server fails at the first one.

    Raises:
        BadURLError: the URL cannot be used (see the module docstring).
    """
    if is_memory(url):
        import fakeredis

        name = url[len(MEMORY):] or "default"
        server = _memory_servers.setdefault(name, fakeredis.FakeServer())
        return fakeredis.FakeRedis(server=server)
    return _redis_client(url)


def server_ms(r: Any) -> int:
    """The Redis server clock (``TIME``) in milliseconds since the epoch."""
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


__all__ = ["MEMORY", "URL_SCHEMES", "check_url", "connect", "is_memory", "redact", "server_ms"]
