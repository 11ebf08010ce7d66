"""How a publish's chunks reach one server: pipelined on one connection, through apply.lua
where the client may run scripts, else as plain XADDs fenced by a transaction; and the choice
of a sink, once per pass (:func:`open_sink`; a Redis Cluster and durable publishes:
:mod:`sow_redis.publish.cluster`)."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from redis.exceptions import NoPermissionError, ResponseError

from .. import keys
from ..apply.jobs import job_marker_value
from ..connection import is_cluster
from .chunk import Chunk, Pass, Sink
from .cluster import RoundTripSink, WatchedSink
from .fence import raw_fence, raw_fence_off, reason
from .through import WriteThrough, settle_calls, write_through
from .wire import EXEC, GET_REGISTRY_VERSION, MULTI, UNWATCH, XaddBatch, resp

log = logging.getLogger(__name__)

IN_FLIGHT = 2
"""Chunks sent whose replies are not read yet, at most: Redis appends them while the
publisher validates the next one (two: a chunk's replies may wait behind apply scripts)."""


def open_sink(state: Pass, durable: bool) -> Sink:
    """The sink of one pass, chosen once: on a cluster or ``durable``, one round trip per
    chunk (:class:`~sow_redis.publish.cluster.RoundTripSink`, or per-partition transactions
    for a client that may not run scripts: :class:`~sow_redis.publish.cluster.WatchedSink`);
    on one server, pipelined chunks (:class:`PipelinedSink`: apply.lua calls, or plain XADDs
    once ``WATCH`` was refused), or fenced by a transaction (:class:`TransactionSink`: no
    right to run scripts, ``memory://``)."""
    through = write_through(state.r)
    if durable or is_cluster(state.r):
        if through is None and not durable:
            return WatchedSink(state)
        return RoundTripSink(state, through, durable)
    if through is None and raw_fence(state.r):
        return TransactionSink(state)
    return PipelinedSink(state, through)


@dataclass
class _Sent:
    """A chunk whose replies are not read yet: its job id per partition, and whether it
    reads the registry version."""

    chunk: Chunk
    job_ids: dict[int, str]
    checked: bool


class PipelinedSink:
    """Chunks pipelined on one connection (:class:`~sow_redis.publish.wire.XaddBatch`), at
    most :data:`IN_FLIGHT` waiting for their replies. With ``through``, each partition's
    entries of a chunk go as one apply.lua (appended) call (which sets the job marker where
    it leaves entries to the workers); without, as XADDs with the ``SET NX`` of the job
    markers in the same write."""

    def __init__(self, state: Pass, through: WriteThrough | None) -> None:
        self.state, self.through = state, through
        self.batch = XaddBatch(state.r)
        self.inflight: deque[_Sent] = deque()
        t = state.topic
        self.log_keys = [keys.log(t.name, p).encode() for p in range(t.partitions)]
        self.apply_through = state.apply_through

    def make_room(self) -> None:
        """Read the oldest chunk's replies once :data:`IN_FLIGHT` chunks wait for theirs."""
        if len(self.inflight) >= IN_FLIGHT:
            self._settle()

    def send(self, chunk: Chunk) -> None:
        """Write the chunk (and the registry version read of the first one); its replies are
        read later."""
        state, batch = self.state, self.batch
        job_ids = state.job_ids(sorted(set(chunk.partitions())))
        if self.through is not None:
            for p, entries in chunk.by_partition().items():
                batch.add_packed(self.through.packed(
                    state.topic, p, entries, state.marker_ttl_ms, job_ids.get(p, ""),
                    self.apply_through))
        else:
            for p, entry in chunk.entries:
                batch.add(self.log_keys[p], entry)
            for p in sorted(job_ids):
                batch.add_set_nx(keys.job_marker(state.topic.name, p).encode(),
                                 job_marker_value(job_ids[p]).encode(), state.marker_ttl_ms)
        checked = state.take_registry_check()
        if checked:
            batch.add_packed(GET_REGISTRY_VERSION)
        batch.send()
        self.inflight.append(_Sent(chunk, job_ids, checked))

    def drain(self) -> None:
        """Read the replies of every chunk in flight."""
        while self.inflight:
            self._settle()

    def close(self) -> None:
        """Give the connection back."""
        self.batch.close()

    def _settle(self) -> None:
        """Read the replies of the oldest chunk in flight (a refusal is kept after what was
        appended is counted)."""
        state, sent = self.state, self.inflight.popleft()
        try:
            replies = self.batch.collect(tolerate_from=0)
            state.read_registry(replies, sent.checked)
            if self.through is not None:
                settle_calls(state, self.through, sent.chunk, sent.job_ids, replies)
            else:
                parts = sent.chunk.partitions()
                state.take_ids(parts, replies)
                if state.jobs is not None:
                    state.start_jobs(parts, replies[len(parts):], sent.job_ids)
        except ResponseError as exc:
            state.refuse(exc)
        state.progress(sent.chunk.handled)


class TransactionSink:
    """For a client that may not run scripts (the ACL ``publisher`` role; ``memory://``), the
    definition fence made of a transaction: per chunk, ``WATCH`` and ``MGET`` of its
    partitions' :func:`keys.definition`, then, when each is this publisher's fingerprint (or
    absent: a topic stored before the fence), ``MULTI``, the XADDs and job markers, ``EXEC``.
    A definition that differs, or changes before ``EXEC`` (which then appends nothing), puts
    the chunk's items in the fence. One chunk's transaction is in flight while the next is
    validated."""

    def __init__(self, state: Pass) -> None:
        self.state = state
        self.batch = XaddBatch(state.r)
        self.inflight: _Sent | None = None
        t = state.topic
        self.log_keys = [keys.log(t.name, p).encode() for p in range(t.partitions)]
        self.mine = t.fingerprint.encode()

    def make_room(self) -> None:
        """Read the replies of the transaction in flight."""
        self.drain()

    def send(self, chunk: Chunk) -> None:
        """Check the partitions' definitions (one round trip), then write the chunk's
        transaction, or put its items in the fence."""
        state, batch = self.state, self.batch
        touched = chunk.touched()
        other = self._watch(touched)
        if other:
            batch.add_packed(UNWATCH)
            batch.execute()
            for p, stored in other.items():
                state.fenced.why[p] = reason(stored)
            state.fenced.held.extend(chunk.items)
            return
        job_ids = state.job_ids(touched)
        batch.add_packed(MULTI)
        for p, entry in chunk.entries:
            batch.add(self.log_keys[p], entry)
        for p in sorted(job_ids):
            batch.add_set_nx(keys.job_marker(state.topic.name, p).encode(),
                             job_marker_value(job_ids[p]).encode(), state.marker_ttl_ms)
        batch.add_packed(EXEC)
        checked = state.take_registry_check()
        if checked:
            batch.add_packed(GET_REGISTRY_VERSION)
        batch.send()
        self.inflight = _Sent(chunk, job_ids, checked)

    def _watch(self, touched: list[int]) -> dict[int, bytes]:
        """``WATCH`` the definitions of partitions ``touched`` and read them: those that are
        neither absent nor this publisher's fingerprint (none once the user was refused
        ``WATCH``: an ACL file older than the definition fence; it appends unfenced)."""
        t = self.state.topic
        def_keys = [keys.definition(t.name, p).encode() for p in touched]
        self.batch.add_packed(resp((b"WATCH", *def_keys)))
        self.batch.add_packed(resp((b"MGET", *def_keys)))
        try:
            _ok, stored = self.batch.execute()
        except NoPermissionError:
            raw_fence_off(self.state.r)
            log.debug("topic %s: this user may not WATCH the partitions' definitions "
                      "(an ACL file older than the definition fence); appending unfenced",
                      t.name)
            return {}
        return {p: v for p, v in zip(touched, stored)  # type: ignore[call-overload]
                if v is not None and v != self.mine}

    def drain(self) -> None:
        """Read the replies of the transaction in flight: ``EXEC``'s None means a watched
        definition changed (the chunk goes to the fence)."""
        sent, self.inflight = self.inflight, None
        if sent is None:
            return
        state = self.state
        replies = self.batch.collect(tolerate_from=0)
        state.read_registry(replies, sent.checked)
        done = replies[-1]  # EXEC: the replies, None when a watched definition changed
        parts = sent.chunk.partitions()
        if done is None:
            state.fenced.why.update({p: "changed" for p in set(parts)})
            state.fenced.held.extend(sent.chunk.items)
        elif isinstance(done, ResponseError):
            # EXECABORT: a command was refused when queued (OOM …): nothing appended
            state.refuse(next((x for x in replies if isinstance(x, ResponseError)
                               and x is not done), done))
        else:
            assert isinstance(done, list)
            state.take_ids(parts, done)
            if state.jobs is not None:
                state.start_jobs(parts, done[len(parts):], sent.job_ids)
        state.progress(sent.chunk.handled)

    def close(self) -> None:
        """Give the connection back."""
        self.batch.close()
