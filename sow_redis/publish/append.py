"""Publish side: validate messages, append them to their partition's transaction log.

``publish`` / ``delta_publish`` / ``sow_delete`` are appended to ``{sow:T:p}:log`` with
pipelining (AMPS User Guide ch. 7; ARCHITECTURE §3). The returned stream ids are the
publisher's consistency token: :func:`wait_applied` blocks until the workers applied them.

One loop (:func:`append`): items are validated (:mod:`.validate`), gathered in chunks of
:data:`CHUNK` entries and handed to a sink (:mod:`.sinks`, :mod:`.cluster`) that sends them
to one server or a cluster, with or without scripts, durable or not; a chunk the definition
fence refused (:mod:`.fence`) is validated again under the definition read after the
migration. The other names here are kept for their importers: :func:`prepare`,
:func:`wait_applied`, :func:`delete_counts`, :func:`touch`,
:func:`append_delete_all_partitions`, :class:`WriteThrough`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NoReturn

from ..connection import Client
from ..errors import SowError
from ..model.topic import TopicConfig
from ..settings import Settings
from .chunk import Chunk, Pass, Sink
from .delete import append_delete_all_partitions
from .fence import await_definition, wait_deadline
from .result import PublishResult, interrupted
from .sinks import open_sink
from .through import WriteThrough
from .used import touch, touch_used
from .validate import Item, ReadFailed, Source, prepare, validated
from .wait import delete_counts, wait_applied

__all__ = ["CHUNK", "Item", "WriteThrough", "append", "append_delete_all_partitions",
           "delete_counts", "prepare", "touch", "wait_applied"]

CHUNK = 1000
"""Messages sent per pipeline round trip."""


def append(r: Client, topic: TopicConfig, items: Iterable[Item], start: int = 1,
           on_chunk: Callable[[int], None] | None = None,
           fix_separator: bytes | None = None,
           jobs: Settings | None = None, durable: bool = False,
           registry_check: bool = False, inline: Settings | None = None) -> PublishResult:
    """Validate and append messages to the log.

    Every item is either appended or rejected with its reason, whatever the other items do:
    a problem with one item (including an exception no check foresaw, reported as
    ``bad_message`` with the exception text) never stops the others.

    Definition fence (issue 23.4, :mod:`sow_redis.publish.fence`): entries Redis refuses for
    a definition that is no longer the stored one were not appended; the publish waits out
    the migration, reads the definition again (:attr:`PublishResult.definition`) and goes
    on under it: nothing is stored under the old layout, nothing is lost.

    Args:
        items: ``(cmd, message, publisher SOW key or None[, expiration seconds or None])``;
            cmd is ``publish``, ``delta_publish`` or ``sow_delete`` (delete the record this data
            would update). A message is bytes (a line), ``str``, or a JSON-encodable value
            such as a dict (see :func:`messages.encode`). A message may be an envelope line
            (see :func:`messages.unwrap`) whose options override the item's.
        start: position number of the first item (for error reports: line numbers).
        on_chunk: called with the number of items handled after each pipeline round trip.
        fix_separator: FIX topics: the field separator of these messages (default: the
            topic's ``field_separator``). A FIX line may carry a log prefix before ``8=FIX``;
            it is stored as JSON with tag numbers as field names (:mod:`sow_redis.model.fix`).
        jobs: start the workers while appending: each chunk sets, in the same write, the job
            markers of its partitions (``SET NX``) and an ingest job is enqueued where one was
            absent (as :func:`jobs.ensure_jobs` does in round trips of its own); None: the
            caller hands the entries over itself. Where the client may run scripts (not the
            ACL ``publisher`` role, not ``memory://``), a chunk's entries of one partition go
            as one apply.lua (appended) call, which appends them, records them as trusted
            and, with ``jobs.write_through`` and the partition caught up, applies them there
            and then (:mod:`sow_redis.publish.through`); a call the server could not run
            appended nothing, and its entries are appended with XADD.
        durable: after each chunk, wait until at least one replica of every primary written
            to has it (``WAIT 1``, at most
            :data:`~sow_redis.publish.commands.DURABLE_WAIT_MS` milliseconds): an
            acknowledged message survives the loss of its primary (replication is
            asynchronous otherwise).
        registry_check: read the registry version in the first chunk's write
            (:attr:`PublishResult.registry_version`): a caller that caches ``topic`` learns in
            the same round trip whether it is current (:meth:`sow_redis.client.Sow.publish`).
        inline: instead of ``jobs``, the settings of a client that applies what the publish
            leaves itself (``Sow(inline=True)``): written through as with ``jobs`` (where
            ``write_through``), no job marker set; :attr:`PublishResult.settled` names the
            partitions left with nothing to do.

    Returns:
        What was published and what was rejected (nothing rejected reaches the log).

    Raises:
        Whatever iterating ``items`` raises (e.g. an OSError reading a file), after appending
        the items validated before it (a note on the exception says how many were published);
        PublishInterrupted: Redis refused a command (out of memory under ``noeviction``, a
        read-only replica, …) after some messages were appended (its ``result`` counts
        them; nothing after the refusal was sent), or the refusal itself (``ResponseError``)
        when nothing was; the same with a SowError as cause when the definition did not
        settle in time; UnknownTopicError: the topic was removed meanwhile; connection errors;
        NotDurableError: with ``durable``, no replica confirmed a chunk in time (its
        messages are in the log of the primary, not acknowledged).
    """
    result = PublishResult()
    source = Source(items, start)
    deadline = 0.0
    while True:
        state = Pass(r, topic, jobs, result, on_chunk, registry_check, inline)
        _one_pass(state, open_sink(state, durable), source, fix_separator, start)
        if state.refused is not None:
            touch_used(r, topic, result.last_ids)
            raise interrupted(result, state.refused)
        if not state.fenced.why:
            break
        registry_check = False
        deadline = deadline or wait_deadline()
        topic = _definition_after(state, deadline)
        source.put_back(state.fenced.held)
    touch_used(r, topic, result.last_ids)
    return result


def _definition_after(state: Pass, deadline: float) -> TopicConfig:
    """The topic's definition once the fence that stopped ``state``'s pass settled
    (:func:`~sow_redis.publish.fence.await_definition`), recorded in the result.

    Raises:
        PublishInterrupted (or the SowError itself when nothing was appended): the
        definition did not settle by ``deadline``; UnknownTopicError.
    """
    r, result = state.r, state.result
    try:
        topic = await_definition(r, state.topic, state.fenced.why, deadline)
    except SowError as exc:
        touch_used(r, state.topic, result.last_ids)
        raise interrupted(result, exc) from exc
    # what was appended before the fence was applied under the old definition (a migration
    # drains every old partition first): partitions it removed have no cursor
    result.last_ids = {p: sid for p, sid in result.last_ids.items() if p < topic.partitions}
    result.definition = topic
    return topic


def _one_pass(state: Pass, sink: Sink, source: Source, fix_separator: bytes | None,
              start: int) -> None:
    """One pass of :func:`append` over ``source``: validate, chunk, hand each chunk to
    ``sink``, until the items run out or the pass stops (the fence or Redis refused
    something: :attr:`Pass.stopped`); every reply is read before it returns.

    Raises:
        What iterating the items raised (see :func:`_read_failed`), after the chunk
        validated before it was sent; what the sink raises (NotDurableError, connection
        errors).
    """
    chunk = Chunk()
    failed: ReadFailed | None = None
    try:
        try:
            for pos, item, checked, new in validated(state.topic, source, state.result,
                                                     fix_separator):
                chunk.handled += new
                if checked is None:
                    continue
                chunk.add(pos, item, checked)
                if len(chunk.entries) >= CHUNK:
                    _hand_over(state, sink, chunk)
                    chunk = Chunk()
                    if state.stopped:
                        break
        except ReadFailed as exc:
            failed = exc
        _hand_over(state, sink, chunk)
        sink.drain()
    finally:
        sink.close()
    if failed is not None:
        _read_failed(state, start, failed)


def _hand_over(state: Pass, sink: Sink, chunk: Chunk) -> None:
    """Send ``chunk`` through ``sink`` unless the pass stopped (a chunk the fence stopped is
    held, to be validated again under the definition read next); a chunk without entries
    only reports its items to ``on_chunk``."""
    if not chunk.entries:
        state.progress(chunk.handled)
        return
    if not state.stopped:
        sink.make_room()
    if state.stopped:
        if state.fenced.why:  # validated under the old definition, not sent
            state.fenced.held += chunk.items
        return
    sink.send(chunk)


def _read_failed(state: Pass, start: int, failed: ReadFailed) -> NoReturn:
    """Raise what iterating the items raised, with a note of what was appended before it."""
    result = state.result
    touch_used(state.r, state.topic, result.last_ids)
    exc = failed.exc
    exc.add_note(f"sow_redis: reading item {start + result.read} failed; the "
                 f"{result.published} earlier message(s) were appended to the log, "
                 f"{len(result.rejected)} rejected")
    raise exc from None
