"""A chunk's commands as redis-py pipelines, one per node, each followed by ``WAIT 1`` for a
durable publish: the publisher's path on a Redis Cluster, and wherever a write must be
confirmed by a replica (``WAIT``: https://redis.io/docs/latest/commands/wait/)."""

from __future__ import annotations

from redis.exceptions import RedisError, ResponseError

from .. import keys
from ..connection import Client, node_for_key, reload_slot_map
from ..errors import NotDurableError

Command = tuple[str, tuple[object, ...], dict[str, object]]
"""``(method, args, kwargs)`` of one redis-py pipeline call, its key first (or
``("execute_command", ("EVALSHA", sha, numkeys, key, …), {})``)."""

DURABLE_WAIT_MS = 5000
"""Milliseconds a ``durable`` publish waits for a replica to confirm a chunk (``WAIT``)."""


def send_commands(r: Client, commands: list[Command], durable: bool,
                  tolerate: bool = False) -> list[object]:
    """Run ``commands`` (each on one key) and return their replies in order; with
    ``durable``, followed on each node by ``WAIT 1`` on the connection that wrote them.

    Args:
        durable: wait up to :data:`DURABLE_WAIT_MS` milliseconds per node for a replica.
        tolerate: (not ``durable``) every error reply is returned in place.

    Raises:
        NotDurableError: a node's WAIT counted no replica within :data:`DURABLE_WAIT_MS`;
        ResponseError: the first error reply of a command other than EVALSHA and the
            registry version read (after all ran), unless ``tolerate``;
        connection errors (a lost connection, also with ``tolerate``).
    """
    if not durable:
        pipe = r.pipeline(transaction=False)
        for method, args, kwargs in commands:
            getattr(pipe, method)(*args, **kwargs)
        replies = pipe.execute(raise_on_error=False)
        if not tolerate:
            return raise_first(commands, replies)
        for reply in replies:  # a lost connection is raised; error replies stay in place
            if isinstance(reply, Exception) and not isinstance(reply, ResponseError):
                raise reply
        return replies
    out: list[object] = [None] * len(commands)
    for name, (client, idx) in _by_node(r, commands).items():
        replies = _run_and_wait(r, client, [commands[i] for i in idx])
        if int(replies[-1]) < 1:  # type: ignore[call-overload]
            raise NotDurableError(
                f"no replica of {name or 'the server'} confirmed {len(idx)} write(s) within "
                f"{DURABLE_WAIT_MS} ms (WAIT 1): they are not acknowledged")
        for i, reply in zip(idx, replies):
            out[i] = reply
    return out


def _by_node(r: Client, commands: list[Command]) -> dict[str, tuple[Client, list[int]]]:
    """Node name → (its client, positions of the commands on its keys); one entry, "the server",
    off a cluster. WAIT counts the replicas that have the writes of its own connection: one
    plain pipeline per node (a cluster's pipeline would spread commands over pooled
    connections)."""
    groups: dict[str, tuple[Client, list[int]]] = {}
    for i, (_m, args, _k) in enumerate(commands):
        key = args[3] if args[0] == "EVALSHA" else args[0]
        client, name = node_for_key(r, str(key))
        groups.setdefault(name, (client, []))[1].append(i)
    return groups


def _run_and_wait(r: Client, client: Client, commands: list[Command]) -> list[object]:
    """``commands`` and a ``WAIT 1`` (:data:`DURABLE_WAIT_MS`) as one pipeline of ``client``
    (one node of ``r``); the replies, WAIT's last. Raises the first error reply (see
    :func:`raise_first`); a cluster's slot map is read again after a failure."""
    pipe = client.pipeline(transaction=False)
    for method, args, kwargs in commands:
        getattr(pipe, method)(*args, **kwargs)
    pipe.execute_command("WAIT", 1, DURABLE_WAIT_MS)
    try:
        replies = pipe.execute(raise_on_error=False)
        return raise_first(commands + [("wait", ("WAIT",), {})], replies)
    except RedisError:
        try:  # a node gone or a slot moved: read the slot map again (a cluster)
            reload_slot_map(r)
        except (RedisError, OSError):
            pass  # the next call tries again
        raise


def raise_first(commands: list[Command], replies: list[object]) -> list[object]:
    """``replies``, after raising the first error reply of a command other than EVALSHA
    (the write-through calls, whose errors :class:`~sow_redis.publish.through.WriteThrough`
    takes) and the registry version read of ``registry_check`` (an error there only means
    "not read")."""
    for (_m, args, _k), reply in zip(commands, replies):
        if isinstance(reply, Exception) and not (
                args and args[0] in ("EVALSHA", keys.REGISTRY_VERSION)):
            raise reply
    return replies
