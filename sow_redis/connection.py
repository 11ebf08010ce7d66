"""Connecting to a SOW's Redis: URL checks, clients, and the server clock.

URLs (redis-py ``Redis.from_url``): ``redis://[user:password@]host:port/db``,
``rediss://…`` (TLS), ``unix:///path/to/socket[?db=N]``; and ``memory://[name]``, an
in-process fakeredis server (clients of one name share one server; it lives as long as this
process). A URL that cannot be used raises :class:`~sow_redis.errors.BadURLError` (one line,
password masked) before anything is sent: a bad scheme, host or port, and an option in the
query that redis-py does not take (``?ssl_ca_cert=`` for ``ssl_ca_certs``).

TLS (``rediss://``): redis-py's ``ssl_*`` options travel in the URL query
(``rediss://host:6380/0?ssl_ca_certs=/etc/sow-redis/ca.crt``), so every process that gets the
URL (``SOW_REDIS_URL``, the workers ``up`` starts) gets them too. The environment variables
of :data:`TLS_ENV` fill in the options the URL does not give, for a ``rediss://`` URL only.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TypeAlias
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .errors import BadURLError

if TYPE_CHECKING:  # redis is imported lazily: `sow-redis --help` and URL checks stay fast
    import fakeredis
    import redis
    import redis.client
    from redis.typing import EncodableT, FieldT

Client: TypeAlias = "redis.Redis"
"""A redis-py client with bytes responses (``decode_responses`` off), as :func:`connect`
returns; ``fakeredis.FakeRedis`` (``memory://``) is a subclass. redis-py types a string reply
as ``bytes | str`` since it cannot know ``decode_responses``; with this client it is always
``bytes``, so read sites ``cast`` the reply (a no-op at run time), e.g.
``cast("bytes | None", r.hget(k, f))``. A string alias: redis is imported only when used."""

Pipeline: TypeAlias = "redis.client.Pipeline"
"""A pipeline of a :data:`Client` (``r.pipeline()``); ``execute()`` returns the replies in
order."""

Fields: TypeAlias = "dict[FieldT, EncodableT]"
"""A stream entry's fields as :meth:`Client.xadd` takes them: str or bytes names; str, bytes
or number values."""

StreamEntry: TypeAlias = "tuple[bytes, dict[bytes, bytes]]"
"""One entry of a :data:`Client`'s XRANGE / XREVRANGE reply: ``(stream id, {field: value})``,
all bytes. redis-py types these replies as ``bytes | str`` (it cannot know
``decode_responses``): read sites ``cast`` the reply to this shape once."""

MEMORY = "memory://"
"""Scheme prefix of the in-process backend."""

URL_SCHEMES = ("redis://", "rediss://", "unix://")
"""Scheme prefixes of a Redis server."""

_USAGE = ("use redis://host:port/db, rediss://host:port/db or unix:///path/to/socket "
          "(memory://name in the Python API)")

TLS_ENV = {
    "SOW_REDIS_SSL_CA_CERTS": "ssl_ca_certs",
    "SOW_REDIS_SSL_CERTFILE": "ssl_certfile",
    "SOW_REDIS_SSL_KEYFILE": "ssl_keyfile",
    "SOW_REDIS_SSL_CERT_REQS": "ssl_cert_reqs",
}
"""Environment variable → redis-py TLS option, used for ``rediss://`` URLs whose query does
not set that option: the CA bundle (PEM file) that signs the server's certificate, and the
client certificate and key files for a server with ``tls-auth-clients yes``."""

_SECRET_OPTIONS = ("password", "ssl_password")
"""URL query options whose value :func:`redact` masks."""

_memory_servers: dict[str, fakeredis.FakeServer] = {}


def redact(url: str) -> str:
    """``url`` with its password (and a ``password`` / ``ssl_password`` query option)
    replaced by ``***``: never print a password."""
    try:
        u = urlsplit(url)
        if u.query and any(name in u.query for name in _SECRET_OPTIONS):
            query = [(k, "***" if k in _SECRET_OPTIONS else v)
                     for k, v in parse_qsl(u.query, keep_blank_values=True)]
            u = u._replace(query=urlencode(query, safe="/*:"))
        if u.password is None:
            return urlunsplit(u)
        netloc = u.netloc.rsplit("@", 1)[1]
        user = f"{u.username}:" if u.username else ":"
        return urlunsplit(u._replace(netloc=f"{user}***@{netloc}"))
    except ValueError:
        return url if "@" not in url and "password" not in url else "<unparsable URL>"


def tls_options(url: str) -> dict[str, str]:
    """The TLS options of :data:`TLS_ENV` set in the environment, for a ``rediss://`` URL
    (``{}`` for any other URL); the URL's own query options win over these."""
    if not url.startswith("rediss://"):
        return {}
    return {opt: os.environ[var] for var, opt in TLS_ENV.items() if os.environ.get(var)}


def is_memory(url: str) -> bool:
    """Whether ``url`` names the in-process backend (``memory://…``)."""
    return url.startswith(MEMORY)


def _redis_client(url: str) -> Client:
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
        client = Redis.from_url(url, **tls_options(url))
    except ValueError as exc:
        text = " ".join(str(exc).replace(url, redact(url)).split()).rstrip(".")
        raise BadURLError(redact(url), f"{text}; {_USAGE}") from None
    pool = client.connection_pool
    try:  # builds a connection object, sends nothing: an unknown query option fails here
        pool.connection_class(**pool.connection_kwargs)
    except TypeError as exc:
        text = str(exc)
        name = text.rsplit(" ", 1)[-1].strip("'") if "unexpected keyword" in text else text
        raise BadURLError(redact(url), f"unknown option {name!r} in the URL query; {_USAGE}"
                          ) from None
    return client


def check_url(url: str) -> None:
    """Refuse a URL :func:`connect` cannot use, without connecting.

    Raises:
        BadURLError: one line naming the URL (password masked) and what is wrong.
    """
    if not is_memory(url):
        _redis_client(url)


def connect(url: str) -> Client:
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


def server_ms(r: Client) -> int:
    """The Redis server clock (``TIME``) in milliseconds since the epoch."""
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


__all__ = ["MEMORY", "TLS_ENV", "URL_SCHEMES", "Client", "Fields", "Pipeline", "StreamEntry", "check_url",
           "connect", "is_memory", "redact", "server_ms", "tls_options"]
