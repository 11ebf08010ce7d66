"""Connecting to a SOW's Redis: URL checks, clients, and the server clock.

URLs (redis-py ``Redis.from_url``): ``redis://[user:password@]host:port/db``,
``rediss://…`` (TLS), ``unix:///path/to/socket[?db=N]``; ``redis+cluster://host:port`` and
``rediss+cluster://host:port`` (any one node of a Redis Cluster: redis-py's
``RedisCluster`` discovers the others; database 0 only), or several seed nodes,
``redis+cluster://h1:p1,h2:p2`` (the first that answers is asked); and ``memory://[name]``, an
in-process fakeredis server (clients of one name share one server; it lives as long as this
process). A URL that cannot be used raises :class:`~sow_redis.errors.BadURLError` (one line,
password masked) before anything is sent: a bad scheme, host or port, and an option in the
query that redis-py does not take (``?ssl_ca_cert=`` for ``ssl_ca_certs``).

Control plane (ARCHITECTURE §2): rq's queues and workers cannot live on a Redis Cluster (rq
issues multi-key commands across slots: CROSSSLOT, rq issue 1942), so a cluster data client
carries a plain control client (``--control-url``, :func:`connect_pair`), which
:func:`control_of` returns; on one server both are the same client.

TLS (``rediss://``): redis-py's ``ssl_*`` options travel in the URL query
(``rediss://host:6380/0?ssl_ca_certs=/etc/sow-redis/ca.crt``), so every process that gets the
URL (``SOW_REDIS_URL``, the workers ``up`` starts) gets them too. The environment variables
of :data:`TLS_ENV` fill in the options the URL does not give, for a ``rediss://`` URL only.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .errors import BadURLError, ControlURLError

if TYPE_CHECKING:  # redis is imported lazily: `sow-redis --help` and URL checks stay fast
    import fakeredis
    import redis
    import redis.client
    from redis.connection import ConnectionPool
    from redis.typing import EncodableT, FieldT

Client: TypeAlias = "redis.Redis"
"""A redis-py client with bytes responses (``decode_responses`` off), as :func:`connect`
returns; ``fakeredis.FakeRedis`` (``memory://``) is a subclass, and so, for the type checker,
is ``redis.cluster.RedisCluster`` (``redis+cluster://``): it offers the same commands (routed
by key slot), and every call site keeps to what both offer (no multi-key command across
partitions, no MULTI across partitions, per-partition pipelines). redis-py types a string reply
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

Info: TypeAlias = "dict[str, Any]"
"""One ``INFO`` section as redis-py parses it: field → number, text, or a dict of
sub-fields (``slave0``: ``{"ip": …, "offset": …}``)."""

MEMORY = "memory://"
"""Scheme prefix of the in-process backend."""

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
"""Scheme prefixes of a Redis Cluster (any one node's address)."""

URL_SCHEMES = ("redis://", "rediss://", "unix://") + CLUSTER_SCHEMES
"""Scheme prefixes of a Redis server or cluster."""

_USAGE = ("use redis://host:port/db, rediss://host:port/db, unix:///path/to/socket or "
          "redis+cluster://host:port (memory://name in the Python API)")

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
    if not url.startswith(("rediss://", "rediss+cluster://")):
        return {}
    return {opt: os.environ[var] for var, opt in TLS_ENV.items() if os.environ.get(var)}


def is_memory(url: str) -> bool:
    """Whether ``url`` names the in-process backend (``memory://…``)."""
    return url.startswith(MEMORY)


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://`` / ``rediss+cluster://``)."""
    return url.startswith(CLUSTER_SCHEMES)


def is_cluster(r: Client) -> bool:
    """Whether client ``r`` is a ``redis.cluster.RedisCluster`` (without importing redis
    when it is not loaded). Callers outside this module use the primitives below instead
    (:func:`single_pool`, :func:`get_many`, :func:`clients_by_node`, …), which keep the
    difference between a server and a cluster in one place."""
    mod = sys.modules.get("redis.cluster")
    return mod is not None and isinstance(r, mod.RedisCluster)


def _cluster_seeds(url: str) -> tuple[str, list[tuple[str, int]]]:
    """A cluster URL split into the URL of its first node and the other seed nodes it
    names: ``redis+cluster://[user:password@]h1:p1,h2:p2,…`` → (``redis+cluster://…h1:p1…``,
    ``[(h2, p2), …]``; a node without a port: 6379). Any one node that answers is enough to
    start (redis-py's ``startup_nodes``), so a client starts while a seed node is down.

    Raises:
        BadURLError: a seed node that is not ``host:port``.
    """
    scheme, sep, rest = url.partition("://")
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]  # tail: the path, query and fragment
    user, at, nodes = authority.rpartition("@")
    first, *others = nodes.split(",")
    seeds = []
    for node in others:
        try:
            u = urlsplit(f"redis://{node}")
            if not u.hostname or u.username is not None or u.path or u.query:
                raise ValueError(node)
            seeds.append((u.hostname, u.port or 6379))
        except ValueError:
            raise BadURLError(redact(url), f"seed node {node!r} is not host:port; {_USAGE}"
                              ) from None
    return f"{scheme}{sep}{user}{at}{first}{tail}", seeds


def first_seed_url(url: str) -> str:
    """A cluster URL with its first seed node only (``redis+cluster://h1:p1,h2:p2/0`` →
    ``redis+cluster://h1:p1/0``); any other URL as it is. For code that reads a URL's host
    and port (``urllib.parse``, which takes no list of nodes).

    Raises:
        BadURLError: a seed node that is not ``host:port``.
    """
    return _cluster_seeds(url)[0] if is_cluster_url(url) else url


def _node_url(url: str) -> str:
    """The plain URL of the (first) node a cluster URL names (``redis+cluster://h:p`` →
    ``redis://h:p``; the other seed nodes: :func:`_cluster_seeds`).

    Raises:
        BadURLError: a database other than 0 (a cluster has only database 0), a seed node
            that is not ``host:port``.
    """
    plain = first_seed_url(url).replace("+cluster://", "://", 1)
    u = urlsplit(plain)
    db = dict(parse_qsl(u.query)).get("db", u.path.strip("/") or "0")
    if db != "0":
        raise BadURLError(redact(url), f"a Redis Cluster has only database 0; {_USAGE}")
    return plain


def _cluster_client(url: str) -> Client:
    """A ``RedisCluster`` (bytes responses) started from the nodes ``url`` names (one, or
    several seeds: :func:`_cluster_seeds`): it asks the first that answers for the slot map
    (so, unlike a single server's client, it connects now).

    Raises:
        BadURLError: as for a single server's URL; redis.exceptions.ConnectionError: no node
            answers; redis.exceptions.RedisClusterException: the node is no cluster node.
    """
    plain = _node_url(url)  # its errors name the whole URL
    _redis_client(plain)  # the same URL checks as a single server's (nothing is sent)
    # start-up time: redis loads at the first connect (`sow-redis --help`, URL checks)
    from redis.cluster import ClusterNode, RedisCluster
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisClusterException
    from redis.exceptions import TimeoutError as RedisTimeoutError

    try:
        seeds = [ClusterNode(host, port) for host, port in _cluster_seeds(url)[1]]
        return RedisCluster.from_url(  # type: ignore[return-value]
            plain, **({"startup_nodes": seeds} if seeds else {}), **tls_options(url))
    except RedisClusterException as exc:
        # no node answered (redis-py chains the last node's error): an outage, which the
        # long-running processes ride out and the CLI reports in one line, not an error of
        # the cluster's (RedisClusterException stays for a node that is no cluster node)
        if isinstance(exc.__cause__, (RedisConnectionError, RedisTimeoutError)):
            raise RedisConnectionError(
                f"no node of the Redis Cluster at {redact(url)} answers "
                f"({' '.join(str(exc.__cause__).split())})") from exc
        raise


def _redis_client(url: str) -> Client:
    """A redis-py client (bytes responses) for a server URL; nothing is sent yet.

    Raises:
        BadURLError: not a server URL, or redis-py cannot parse it.
    """
    if not url.startswith(URL_SCHEMES):
        raise BadURLError(redact(url), _USAGE)
    # start-up time: redis loads at the first connect (`sow-redis --help`, URL checks)
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
    if is_cluster_url(url):
        _node_url(url)
        _redis_client(_node_url(url))
    elif not is_memory(url):
        _redis_client(url)


def connect(url: str) -> Client:
    """A client for ``url``: redis-py (bytes responses) for a server, ``RedisCluster`` for
    ``redis+cluster://``, fakeredis for ``memory://[name]``. For a server no command is sent
    (an unreachable server fails at the first one); a cluster client reads the slot map now.

    Raises:
        BadURLError: the URL cannot be used (see the module docstring);
            redis.exceptions.ConnectionError: no node of a cluster URL answers;
            redis.exceptions.RedisClusterException: the node it names is no cluster node.
    """
    if is_cluster_url(url):
        return _cluster_client(url)
    if is_memory(url):
        # start-up time: fakeredis (~0.45 s) loads only for memory://
        import fakeredis

        name = url[len(MEMORY):] or "default"
        server = _memory_servers.setdefault(name, fakeredis.FakeServer())
        return fakeredis.FakeRedis(server=server)
    return _redis_client(url)


def control_url_for(data_url: str, control_url: str | None) -> str:
    """The control plane's URL (rq queues and workers): ``control_url`` when given, else the
    data URL when it is not a cluster.

    Raises:
        ControlURLError: a cluster data URL without a control URL, or a cluster control URL
            (rq cannot run on a cluster: rq issue 1942); BadURLError: a bad control URL.
    """
    if control_url:
        if is_cluster_url(control_url):
            raise ControlURLError(
                f"the control plane (rq) cannot run on a Redis Cluster ({redact(control_url)}): "
                "give a plain redis:// server as --control-url / SOW_CONTROL_URL")
        check_url(control_url)
        return control_url
    if is_cluster_url(data_url):
        raise ControlURLError(
            f"{redact(data_url)} is a Redis Cluster, where rq's queues cannot live: give a "
            "plain Redis for them with --control-url / SOW_CONTROL_URL")
    return data_url


def connect_pair(data_url: str, control_url: str | None = None,
                 required: bool = True) -> Client:
    """The data client of ``data_url`` carrying its control client (:func:`control_of`):
    a client of ``control_url`` when it names another Redis, else the data client itself.
    ``required=False``: a cluster without a control URL gives the bare data client (for a
    process that may never enqueue; :func:`control_of` raises when it does).

    Raises:
        As :func:`control_url_for` and :func:`connect`.
    """
    if not required and not control_url and is_cluster_url(data_url):
        return connect(data_url)
    curl = control_url_for(data_url, control_url)
    r = connect(data_url)
    if curl != data_url:
        control = connect(curl)
        set_control(r, control)
    return r


def set_control(r: Client, control: Client) -> None:
    """Make ``control`` the control client of data client ``r`` (and ``r`` the data client
    of ``control``: an rq job finds it from its connection, :func:`data_of`)."""
    r._sow_control = control  # type: ignore[attr-defined]
    control._sow_data = r  # type: ignore[attr-defined]


def control_of(r: Client) -> Client:
    """The control client (rq queues, workers, dashboard) of data client ``r``: the one
    :func:`set_control` gave it, else ``r`` itself.

    Raises:
        ControlURLError: ``r`` is a cluster client without a control client.
    """
    control = getattr(r, "_sow_control", None)
    if control is not None:
        return control
    if is_cluster(r):
        raise ControlURLError("this Redis Cluster client has no control plane for rq's queues: "
                              "give --control-url / SOW_CONTROL_URL (Sow(..., control_url=))")
    return r


def data_of(control: Client) -> Client:
    """The data client a control client serves (:func:`set_control`), else ``control``."""
    return getattr(control, "_sow_data", None) or control


def server_ms(r: Client) -> int:
    """The Redis server clock (``TIME``) in milliseconds since the epoch."""
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def primaries_without_replica(r: Client) -> list[str]:
    """The primaries of ``r`` that no replica is connected to (``INFO replication``:
    ``connected_slaves:0``): ``host:port`` of each on a cluster, ``["the server"]`` for a
    server without one; [] when every primary has a replica. On such a primary a ``WAIT 1``
    (``publish --durable``) can only time out."""
    infos = info_per_primary(r, "replication")
    return sorted(node for node, info in infos.items()
                  if int(info.get("connected_slaves", 0)) < 1)


def node_for_key(r: Client, key: str) -> tuple[Client, str]:
    """The client of the primary that holds ``key`` and its name (``host:port``) on a Redis
    Cluster; ``(r, "the server")`` on a server."""
    if is_cluster(r):
        node = r.get_node_from_key(key)  # type: ignore[attr-defined]
        return r.get_redis_connection(node), node.name  # type: ignore[attr-defined]
    return r, "the server"


# -- one interface over a server and a cluster ------------------------------------------------
# A server (or memory://) holds every key on one connection pool: multi-key commands, MULTI and
# raw commands on one pooled connection reach every key. A cluster client routes each command
# by its key's slot, one node at a time. The primitives below keep that difference here.

def single_pool(r: Client) -> ConnectionPool | None:
    """The connection pool of ``r`` when one pool reaches every key (a server or
    ``memory://``): a connection taken from it may carry raw or multi-key commands of any
    keys. None for a cluster client (one pool per node; commands routed by slot)."""
    if is_cluster(r):
        return None
    return r.connection_pool


def get_many(r: Client, names: Sequence[str]) -> list[bytes | None]:
    """``GET`` of each key (one round trip; on a cluster, one per node): what ``MGET`` does
    on one server, without its same-slot rule."""
    if not is_cluster(r):
        return cast("list[bytes | None]", r.mget(names))
    pipe = r.pipeline(transaction=False)
    for name in names:
        pipe.get(name)
    return cast("list[bytes | None]", pipe.execute())


def write_in_stages(r: Client, stages: Sequence[Callable[[Pipeline], object]]) -> list[Any]:
    """Queue each stage's commands on a pipeline and send them: all stages in one
    ``MULTI``/``EXEC`` on a server (atomic); on a cluster, where one transaction cannot span
    slots, stage after stage, each a pipeline sent once the one before it was answered (so a
    reader that sees a later stage's writes finds the earlier ones).

    Returns:
        The replies of every stage's commands, in order.
    """
    if not is_cluster(r):
        pipe = r.pipeline(transaction=True)
        for stage in stages:
            stage(pipe)
        return pipe.execute()
    replies: list[Any] = []
    for stage in stages:
        pipe = r.pipeline(transaction=False)
        stage(pipe)
        replies.extend(pipe.execute())
    return replies


def xread_any(r: Client, streams: Mapping[str, str], block_ms: int) -> bool:
    """Whether any of ``streams`` (key → stream id) has an entry after its id, waiting up to
    ``block_ms`` milliseconds: one blocking ``XREAD`` on a server (or for one stream); on a
    cluster, where one ``XREAD`` cannot name keys of several slots, a non-blocking ``XREAD``
    of each (one pipeline), then a sleep of ``block_ms`` when none has one."""
    if is_cluster(r) and len(streams) > 1:
        pipe = r.pipeline(transaction=False)
        for k, v in streams.items():
            pipe.xread({k: v}, count=1)
        if any(pipe.execute()):
            return True
        time.sleep(block_ms / 1000)
        return False
    return bool(r.xread(dict(streams), count=1, block=block_ms))  # type: ignore[arg-type]


def clients_by_node(r: Client, names: Sequence[str]) -> list[tuple[Client, list[str]]]:
    """``(client of one node, its names)``: the primary serving each key's or channel's hash
    slot on a cluster (in order of first appearance), the server itself with every name
    otherwise."""
    if not is_cluster(r):
        return [(r, list(names))]
    groups: dict[str, tuple[Client, list[str]]] = {}
    for name in names:
        node = r.get_node_from_key(name)  # type: ignore[attr-defined]
        if node.name not in groups:
            groups[node.name] = (r.get_redis_connection(node), [])  # type: ignore[attr-defined]
        groups[node.name][1].append(name)
    return list(groups.values())


def reload_slot_map(r: Client) -> None:
    """On a cluster client, read the slot map again (after a node was lost, its replica may
    serve its slots now); nothing on a server.

    Raises:
        redis.exceptions.RedisError / OSError: no node answered.
    """
    if is_cluster(r):
        r.nodes_manager.initialize()  # type: ignore[attr-defined]


def server_info(r: Client, section: str) -> Info | None:
    """``INFO <section>`` of the server behind ``r``; None for a cluster client, which has one
    per primary (:func:`info_per_primary`)."""
    if is_cluster(r):
        return None
    return r.info(section)


def info_per_primary(r: Client, section: str) -> dict[str, Info]:
    """``INFO <section>`` of each primary: by ``host:port`` on a cluster, as
    ``{"the server": …}`` on a server."""
    if is_cluster(r):
        return r.info(section, target_nodes=r.PRIMARIES)  # type: ignore[attr-defined]
    return {"the server": r.info(section)}


def connect_primaries(url: str, socket_timeout_s: float | None = None
                      ) -> list[tuple[str | None, Client]]:
    """A client of each primary behind ``url``: ``[(None, client)]`` for a server (a plain
    redis-py client with ``socket_timeout_s``; nothing sent yet), ``(host:port, client)`` of
    each primary of a cluster (:func:`connect` reads the slot map now; its own timeouts).

    Raises:
        redis.exceptions.RedisError / OSError: no node of a cluster answers; ValueError: a
            server URL redis-py cannot parse.
    """
    if is_cluster_url(url):
        return [(name, client) for name, client in primary_clients(connect(url))]
    # start-up time: redis loads at the first connect (`sow-redis --help`, URL checks)
    from redis import Redis

    return [(None, Redis.from_url(url, socket_timeout=socket_timeout_s, **tls_options(url)))]


def primary_clients(r: Client) -> list[tuple[str, Client]]:
    """``(host:port, client)`` of each primary of a cluster client; ``[("the server", r)]``
    for a server."""
    if is_cluster(r):
        return [(node.name, r.get_redis_connection(node))  # type: ignore[attr-defined]
                for node in r.get_primaries()]  # type: ignore[attr-defined]
    return [("the server", r)]


__all__ = ["CLUSTER_SCHEMES", "MEMORY", "TLS_ENV", "URL_SCHEMES", "Client", "Fields", "Info",
           "Pipeline",
           "StreamEntry", "check_url", "clients_by_node", "connect", "connect_pair",
           "connect_primaries",
           "control_of", "control_url_for", "data_of", "get_many", "info_per_primary",
           "is_cluster", "is_cluster_url", "is_memory", "node_for_key", "primaries_without_replica",
           "primary_clients", "redact", "reload_slot_map", "server_info", "server_ms",
           "set_control", "single_pool", "tls_options", "write_in_stages", "xread_any"]
