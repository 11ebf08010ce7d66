"""How a publish's chunks reach a Redis Cluster, and any server with ``durable``: each chunk
as one redis-py pipeline per node holding its partitions (the XADDs of one partition stay in
order), with ``WAIT 1`` per node when durable (:mod:`sow_redis.publish.commands`); no chunk
is in flight while the next one is validated."""

from __future__ import annotations

from typing import cast

from redis.exceptions import NoPermissionError, ResponseError, WatchError

from .. import keys
from ..apply.jobs import enqueue_job, job_marker_value, new_job_id
from ..connection import Client, Fields, node_for_key
from .chunk import Chunk, Pass
from .commands import Command, send_commands
from .fence import raw_fence, raw_fence_off, reason
from .through import WriteThrough, settle_calls
from .validate import Positioned


class RoundTripSink:
    """One round trip per chunk: the write-through calls (or the XADDs and the ``SET NX`` of
    the job markers) and the registry version read, with ``durable`` a ``WAIT 1`` per node.

    Raises (from :meth:`send`):
        NotDurableError: with ``durable``, no replica confirmed a chunk in time (its
            messages are in the log of the primary, not acknowledged).
    """

    def __init__(self, state: Pass, through: WriteThrough | None, durable: bool) -> None:
        self.state, self.through, self.durable = state, through, durable
        t = state.topic
        self.log_keys = [keys.log(t.name, p) for p in range(t.partitions)]
        self.apply_through = state.apply_through

    def make_room(self) -> None:
        """Nothing is in flight between chunks."""

    def drain(self) -> None:
        """Nothing is in flight between chunks."""

    def close(self) -> None:
        """Nothing is held."""

    def send(self, chunk: Chunk) -> None:
        """Send the chunk and read its replies (one round trip per node)."""
        state = self.state
        job_ids = state.job_ids(chunk.touched())
        commands = self._commands(chunk, job_ids)
        checked = state.take_registry_check()
        if checked:
            commands.append(("get", (keys.REGISTRY_VERSION,), {}))
        try:
            replies = send_commands(state.r, commands, self.durable, tolerate=not self.durable)
        except ResponseError as exc:  # durable: what the chunk appended is unknown
            state.refuse(exc)
            return
        state.read_registry(replies, checked)
        if self.through is not None:
            settle_calls(state, self.through, chunk, job_ids, replies, self.durable)
        else:
            parts = chunk.partitions()
            state.take_ids(parts, replies)
            if state.jobs is not None:
                state.start_jobs(parts, replies[len(parts):], job_ids)
        if not state.refused:
            state.progress(chunk.handled)

    def _commands(self, chunk: Chunk, job_ids: dict[int, str]) -> list[Command]:
        """The chunk's write-through calls (one per partition, ascending), or its XADDs and
        then the ``SET NX`` of the job marker of each partition touched."""
        state = self.state
        if self.through is not None:
            return [("execute_command", ("EVALSHA", *self.through.call(
                state.topic, p, entries, state.marker_ttl_ms, job_ids.get(p, ""),
                self.apply_through)), {}) for p, entries in chunk.by_partition().items()]
        commands: list[Command] = [("xadd", (self.log_keys[p], entry), {})
                                   for p, entry in chunk.entries]
        commands += [("set", (keys.job_marker(state.topic.name, p), job_marker_value(job_id)),
                      {"nx": True, "px": state.marker_ttl_ms})
                     for p, job_id in sorted(job_ids.items())]
        return commands


class WatchedSink(RoundTripSink):
    """The definition fence of :class:`~sow_redis.publish.sinks.TransactionSink` on a Redis
    Cluster (a client that may not run scripts, not durable): one transaction per partition
    of the chunk, on its primary (``WATCH`` and ``GET`` of its definition, then ``MULTI``,
    its XADDs and job marker, ``EXEC``). A partition whose definition differs or changes
    before ``EXEC`` puts its items in the fence (nothing of it appended). Once the user was
    refused ``WATCH``, chunks go as :class:`RoundTripSink` sends them."""

    def __init__(self, state: Pass) -> None:
        super().__init__(state, None, durable=False)

    def send(self, chunk: Chunk) -> None:
        """One fenced transaction per partition of the chunk, ascending."""
        if not raw_fence(self.state.r):
            super().send(chunk)
            return
        items = chunk.items_of()
        try:
            for p, entries in chunk.by_partition().items():
                self._partition(p, entries, items[p])
        except ResponseError as exc:  # out of memory …: the later partitions are not sent
            self.state.refuse(exc)
            return
        self.state.progress(chunk.handled)

    def _partition(self, p: int, entries: list[Fields], items: list[Positioned]) -> None:
        """Append ``entries`` to partition ``p`` in one transaction fenced by its definition
        (unfenced once ``WATCH`` is refused).

        Raises:
            ResponseError: Redis refused the transaction (out of memory …).
        """
        state, r = self.state, self.state.r
        log_key, def_key = keys.log(state.topic.name, p), keys.definition(state.topic.name, p)
        node = _node_of(r, log_key)
        job_id = new_job_id() if state.jobs is not None else ""
        fenced = raw_fence(r)
        with node.pipeline(transaction=fenced) as pipe:
            try:
                if fenced:
                    pipe.watch(def_key)
                    stored = cast("bytes | None", pipe.get(def_key))
                    if stored is not None and stored != state.topic.fingerprint.encode():
                        state.fenced.refuse(p, reason(stored), items)
                        return
                    pipe.multi()
                for entry in entries:
                    pipe.xadd(log_key, entry)
                if state.jobs is not None:
                    pipe.set(keys.job_marker(state.topic.name, p), job_marker_value(job_id),
                             nx=True, px=state.marker_ttl_ms)
                replies = pipe.execute()
            except WatchError:
                state.fenced.refuse(p, "changed", items)
                return
            except NoPermissionError:  # an ACL file older than the fence: append unfenced
                raw_fence_off(r)
                self._partition(p, entries, items)
                return
        state.appended(p, replies[len(entries) - 1], len(entries))
        if state.jobs is not None and replies[-1]:
            enqueue_job(r, state.topic.name, p, behind=len(entries), job_id=job_id)


def _node_of(r: Client, key: str) -> Client:
    """The client of the primary holding ``key`` on a cluster; ``r`` itself otherwise."""
    return node_for_key(r, key)[0]
