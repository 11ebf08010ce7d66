"""Publish side: validate messages, append them to their partition's transaction log.

``publish`` / ``delta_publish`` / ``sow_delete`` are appended to ``{sow:T:p}:log`` with
pipelining (AMPS User Guide ch. 7; ARCHITECTURE §3). The returned stream ids are the
publisher's consistency token: :func:`wait_applied` blocks until the workers applied them.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, cast

from redis.exceptions import (
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    RedisError,
    ResponseError,
    WatchError,
)

from .. import keys
from ..apply.jobs import enqueue_job, ensure_jobs, job_marker_value, new_job_id
from ..apply.scripts import OP_ARGS, Scripts, attached, pack_entries
from ..config import TopicConfig
from ..connection import Client, Fields, is_cluster, server_ms
from ..errors import MessageError, NotDurableError, SowError, WaitTimeout
from ..model.entries import make_entry
from ..model.fix import to_message
from ..model.messages import check_expiration, encode, index_members, parse, unwrap
from ..outage import RETRY_CHUNK, call_through_outage
from ..partition_state import read_cursors
from ..registry import get_topic, migration_holds
from ..settings import Settings
from ..streamids import ms_of, reached
from .result import NOT_READ, PublishInterrupted, PublishResult, Rejected

CHUNK = 1000
"""Messages sent per pipeline round trip."""

log = logging.getLogger(__name__)

IN_FLIGHT = 2
"""Chunks sent whose replies are not read yet, at most: Redis appends them while the
publisher validates the next one (two: a chunk's replies may wait behind apply scripts)."""


_SCALARS = frozenset({str, int, float, bool, type(None)})

Item = tuple[str, Any, "str | None"] | tuple[str, Any, "str | None", "float | None"]


def prepare(topic: TopicConfig, item: Item, fix_separator: bytes | None = None,
            skip_msg_types: frozenset[str] | None = None) -> tuple[int, Fields] | None:
    """Validate one message and build its log entry: what :func:`append` does to every item
    before it is sent (also used by bulk loaders that write the log themselves).

    Args:
        item: ``(cmd, message, publisher SOW key or None[, expiration seconds or None])``, as
            for :func:`append`.
        fix_separator / skip_msg_types: FIX topics (defaults: the topic's settings).

    Returns:
        ``(partition, stream fields)``; None for a FIX message of a skipped MsgType.

    Raises:
        MessageError: the message is refused, with its reason; other exceptions for inputs
            no check foresaw (:func:`append` reports them as ``bad_message``).
    """
    cmd, msg, sow_key = item[0], item[1], item[2]
    expiration = item[3] if len(item) > 3 else None
    data = encode(msg).strip()
    if not data:
        raise MessageError("empty", "empty message")
    text = data
    data, opts = unwrap(text)
    obj = None
    if type(msg) is dict and data is text and topic.message_type != "fix" \
            and all(type(v) in _SCALARS for v in msg.values()):
        # a flat dict of JSON scalars is its own decoding: encode() accepted it (string
        # keys, integers in range, finite floats), and its text reads back equal, so it is
        # not parsed again (about a third of this function for such a message)
        obj = msg
    if topic.message_type == "fix":
        sep = fix_separator or topic.field_separator.encode()
        skip = frozenset(topic.skip_msg_types) if skip_msg_types is None else skip_msg_types
        converted = to_message(data, sep, skip)
        if converted is None:
            return None
        data, obj = converted
    if opts:  # envelope options override the item's; null means absent
        sow_key = opts.get("sow_key") or sow_key
        if opts.get("expiration") is not None:
            expiration = opts["expiration"]
    expiration = check_expiration(expiration)
    parsed = parse(data, topic, sow_key, obj)
    members = index_members(parsed.obj, topic, parsed.sow_key) if (
        cmd == "publish" and topic.hash_index and parsed.sow_key) else ""
    return parsed.partition, make_entry(cmd, data, sow_key, expiration, parsed.sow_key, members)


def _start_jobs(r: Client, topic: TopicConfig, sent: list[int], marks: list[Any],
                job_ids: dict[int, str]) -> None:
    """After a chunk appended to partitions ``sent`` (one per entry, in order): enqueue an
    ingest job (id ``job_ids[p]``) for each partition whose job marker the chunk's write set
    (``marks``: the replies of the ``SET NX`` of each partition touched, ascending).

    Raises:
        ResponseError: a ``SET NX`` of a marker was refused.
    """
    for p, set_now in zip(sorted(set(sent)), marks):
        if isinstance(set_now, ResponseError):
            raise set_now
        if set_now:  # entries wait for the workers and no job was outstanding for p
            enqueue_job(r, topic.name, p, behind=sent.count(p), job_id=job_ids[p])


def _settle_through(r: Client, topic: TopicConfig, jobs: Settings | None, through: WriteThrough,
                    chunk: dict[int, list[Fields]], job_ids: dict[int, str],
                    replies: list[Any], result: PublishResult, durable: bool = False,
                    chunk_items: dict[int, list[tuple[int, Item]]] | None = None,
                    fenced: _Fenced | None = None) -> None:
    """Take the replies of one chunk's write-through calls (one per partition of ``chunk``,
    ascending): count what was appended, enqueue a job (id ``job_ids[p]``) where a call set
    the job marker, and append the entries of each call the server could not run (no
    script, no right to run it: an error reply appended nothing) with plain XADDs, making
    sure of a job for them. A call the definition fence refused (nothing appended) puts its
    items (``chunk_items[p]``: position and item of each entry) in ``fenced``.

    Raises:
        ResponseError: a call Redis refused for its own state (out of memory, read-only …;
            nothing of it was appended, and it is not appended otherwise either), after the
            others were counted.
    """
    retry: dict[int, list[Fields]] = {}
    refused: ResponseError | None = None
    for (p, entries), reply in zip(sorted(chunk.items()), replies):
        taken = through.settle(topic, reply)
        if isinstance(taken, str):
            assert fenced is not None and chunk_items is not None
            fenced.why[p] = taken
            fenced.held += chunk_items[p]
            continue
        if taken is None:
            if isinstance(reply, (NoScriptError, NoPermissionError)):
                retry[p] = entries
            else:
                refused = refused or reply
            continue
        applied, last, marked = taken
        result.last_ids[p] = last
        result.published += len(entries)
        if marked and jobs is not None:
            enqueue_job(r, topic.name, p, behind=len(entries) - applied, job_id=job_ids[p])
    if not retry:
        if refused is not None:
            raise refused
        return
    order = [(p, e) for p, entries in sorted(retry.items()) for e in entries]
    commands: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("xadd", (keys.log(topic.name, p), e), {}) for p, e in order]
    # every reply read (not durable): what was appended is counted even when Redis refused some
    ids = _send_chunk(r, commands, durable, tolerate=not durable)
    appended: set[int] = set()
    for (p, _e), sid in zip(order, ids):
        if not isinstance(sid, Exception):
            result.last_ids[p] = sid.decode() if isinstance(sid, bytes) else sid
            result.published += 1
            appended.add(p)
    if appended and jobs is not None:
        ensure_jobs(r, topic.name, sorted(appended), jobs,
                    behind={p: len(entries) for p, entries in retry.items()})
    refused = refused or next((x for x in ids if isinstance(x, ResponseError)), None)
    if refused is not None:
        raise refused


class _ReadFailed(Exception):
    """Iterating the items raised ``exc`` (raised again by :func:`_read_failed`)."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


class _Source:
    """The items of one :func:`append`, each with its position (``start`` for the first);
    items a definition fence refused are put back in front (:meth:`put_back`) and come again
    marked as not new, so that they are validated again but counted as read once."""

    def __init__(self, items: Iterable[Item], start: int) -> None:
        self._it = iter(items)
        self._next = start
        self._back: deque[tuple[int, Item]] = deque()

    def put_back(self, held: list[tuple[int, Item]]) -> None:
        """Items to take again before the rest, in position order."""
        self._back.extendleft(sorted(held, key=lambda pair: pair[0], reverse=True))

    def __iter__(self) -> Iterator[tuple[int, Item, bool]]:
        return self

    def __next__(self) -> tuple[int, Item, bool]:
        """``(position, item, new)``. Raises StopIteration, or what iterating raises."""
        if self._back:
            pos, item = self._back.popleft()
            return pos, item, False
        item = next(self._it)
        pos, self._next = self._next, self._next + 1
        return pos, item, True


@dataclass
class _Fenced:
    """What the definition fence of ``apply.lua`` (operation ``appended``) refused in one pass of
    :func:`append`: the items (position, item) and, per partition, why (``migrating``,
    ``absent``, ``dropped``, ``changed``)."""

    held: list[tuple[int, Item]] = field(default_factory=list)
    why: dict[int, str] = field(default_factory=dict)


def _validated(topic: TopicConfig, source: _Source, result: PublishResult, sep: bytes,
               skip: frozenset[str]) -> Iterator[tuple[int, Item, tuple[int, Fields] | None,
                                                       bool]]:
    """Each item read, validated (:func:`prepare`): ``(position, item, (partition, entry) to
    append or None, new)``; None when it was rejected (added to ``result.rejected`` with its
    position) or skipped; ``new`` is False for an item put back after a definition fence
    (``result.read`` counts new items only).

    Raises:
        _ReadFailed: iterating ``items`` raised (the caller appends what it has, then
            :func:`_read_failed`).
    """
    while True:
        try:
            pos, item, new = next(source)
        except StopIteration:
            return
        except Exception as exc:
            raise _ReadFailed(exc) from exc
        if new:
            result.read += 1
        try:
            checked = prepare(topic, item, sep, skip)
        except MessageError as exc:
            result.rejected.append(Rejected(pos, exc.reason, exc.detail))
            checked = None
        except Exception as exc:
            result.rejected.append(Rejected(pos, "bad_message", f"{type(exc).__name__}: {exc}"))
            checked = None
        else:
            if checked is None:
                result.skipped += 1
        yield pos, item, checked, new


def _read_failed(r: Client, topic: TopicConfig, start: int, result: PublishResult,
                 failed: _ReadFailed) -> NoReturn:
    """Raise what iterating the items raised, with a note of what was appended before it."""
    if result.last_ids:
        _touch_used(r, topic, result.last_ids)
    exc = failed.exc
    exc.add_note(f"sow_redis: reading item {start + result.read} failed; the "
                 f"{result.published} earlier message(s) were appended to the log, "
                 f"{len(result.rejected)} rejected")
    raise exc from None


DEFINITION_WAIT_S = 600.0
"""Seconds a publish waits at most, in all, for a topic's definition to settle when Redis
refused its messages for a definition that is no longer (or not yet) the stored one: a shape
migration running (``config apply --migrate``), or a ``config apply`` between its writes."""


def append(r: Client, topic: TopicConfig, items: Iterable[Item], start: int = 1,
           on_chunk: Callable[[int], None] | None = None,
           fix_separator: bytes | None = None,
           jobs: Settings | None = None, durable: bool = False,
           registry_check: bool = False) -> PublishResult:
    """Validate and append messages to the log.

    Every item is either appended or rejected with its reason, whatever the other items do:
    a problem with one item (including an exception no check foresaw, reported as
    ``bad_message`` with the exception text) never stops the others.

    Definition fence (issue 23.4): where the client may run scripts, each partition takes
    entries only from a publisher whose definition of the topic is the stored one (its
    :attr:`~sow_redis.config.TopicConfig.fingerprint`, ``lua/include/apply_appended.lua``). When
    Redis refuses a chunk's entries for a partition (the topic was changed or a shape
    migration holds it), nothing of them was appended: the publish stops sending, waits
    until no migration holds those partitions (at most :data:`DEFINITION_WAIT_S` seconds in
    all), reads the definition again, validates the refused messages (and the rest) under it
    and goes on. So a publisher that keeps running across ``config apply --migrate`` stores
    nothing under the old layout and loses nothing; :attr:`PublishResult.definition` is then
    the definition read.

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
        jobs: start the workers while appending: with each chunk, in the same write as its
            XADDs, the job markers of its partitions are set (``SET NX``) and an ingest job
            is enqueued for each marker that was absent (what :func:`jobs.ensure_jobs` does
            in round trips of its own). None: the caller hands the entries over itself.
            Where the client may run scripts (not the ACL ``publisher`` role, not
            ``memory://``), each chunk's entries of one partition go as one
            apply.lua (appended) call: the script appends them and records them as trusted
            (the workers then apply their prepared publishes without reading them); with
            ``jobs.write_through`` (the default), when the partition's log held no
            unapplied entry before them, it applies the plain publishes there and then; the
            marker is set (and a job enqueued) only when entries are left for the workers.
            A call the server could not run (no script cached, no right to run it) appended
            nothing: its entries are then appended with XADD and verified by the workers.
        durable: after each chunk, wait until at least one replica of every primary written
            to has it (``WAIT 1``, at most :data:`DURABLE_WAIT_MS`): an acknowledged message
            survives the loss of its primary (replication is asynchronous otherwise).
        registry_check: read the registry version in the first chunk's write, after its
            entries (:attr:`PublishResult.registry_version`): a caller that keeps ``topic``
            cached learns in the same round trip whether it was still current (see
            :meth:`sow_redis.client.Sow.publish`).

    Returns:
        What was published and what was rejected (nothing rejected reaches the log).

    Raises:
        Whatever iterating ``items`` raises (e.g. an OSError reading a file), after appending
        the items validated before it (a note on the exception says how many were published);
        PublishInterrupted: Redis refused a command (out of memory under ``noeviction``, a
        read-only replica, …) after some messages were appended: its ``result`` counts
        them; nothing after the refusal was sent; the refusal itself (``ResponseError``:
        ``OutOfMemoryError``, ``NoPermissionError`` …) when nothing was appended; the same
        (with a SowError as cause) when the definition did not settle within
        :data:`DEFINITION_WAIT_S` seconds; UnknownTopicError: the topic was removed while
        its messages were refused;
        connection errors;
        NotDurableError: with ``durable``, no replica confirmed a chunk in time (its
        messages are in the log of the primary, not acknowledged).
    """
    result = PublishResult()
    source = _Source(items, start)
    deadline = 0.0
    while True:
        fenced = _Fenced()
        if durable or is_cluster(r):
            _append_cluster(r, topic, source, start, result, on_chunk, fix_separator, jobs,
                            durable, registry_check, fenced)
        else:
            _append_server(r, topic, source, start, result, on_chunk, fix_separator, jobs,
                           registry_check, fenced)
        if not fenced.why:
            break
        registry_check = False
        deadline = deadline or time.monotonic() + DEFINITION_WAIT_S
        try:
            topic = await_definition(r, topic, fenced.why, deadline)
        except SowError as exc:
            if result.last_ids:
                _touch_used(r, topic, result.last_ids)
            raise _interrupted(result, exc) from exc
        # what was appended before the fence was applied under the old definition (a
        # migration drains every old partition first): partitions it removed have no cursor
        result.last_ids = {p: sid for p, sid in result.last_ids.items() if p < topic.partitions}
        result.definition = topic
        source.put_back(fenced.held)
    if result.last_ids:
        _touch_used(r, topic, result.last_ids)
    return result


def await_definition(r: Client, topic: TopicConfig, why: dict[int, str],
                     deadline: float) -> TopicConfig:
    """After the definition fence refused ``topic``'s entries for the partitions of ``why``
    (see :func:`append`): wait until no shape migration holds them, then read the topic's
    definition again and return it. When it is unchanged and a partition had none stored
    (a topic stored before definitions were, or a key lost), store it there (``SET NX``).

    Args:
        why: partition → the script's reason (``migrating``, ``absent``, ``dropped``,
            ``changed``).
        deadline: ``time.monotonic()`` after which to give up.

    Raises:
        SowError: still refused at ``deadline`` (e.g. a migration that failed to end, or a
            stored value that is no definition of the topic: ``config apply`` stores it
            again); UnknownTopicError: the topic is no longer defined.
    """
    parts = sorted(why)
    pause = 0.02
    while True:
        if not migration_holds(r, topic.name, parts):
            fresh = get_topic(r, topic.name)
            if fresh.fingerprint != topic.fingerprint:
                return fresh
            pipe = r.pipeline(transaction=False)
            for p in parts:
                pipe.get(keys.definition(topic.name, p))
            stored = pipe.execute()
            absent = [p for p, d in zip(parts, stored) if d is None and p < fresh.partitions]
            if absent:
                pipe = r.pipeline(transaction=False)
                for p in absent:
                    pipe.set(keys.definition(topic.name, p), fresh.fingerprint, nx=True)
                pipe.execute()
                return fresh
            # unchanged in the registry, another value stored: a config apply between its
            # two writes (look again), or a value no config apply wrote (the deadline)
        if time.monotonic() >= deadline:
            raise SowError(
                f"topic '{topic.name}': partition(s) {parts} refused this publisher's "
                f"definition for {DEFINITION_WAIT_S:g} s "
                f"({', '.join(sorted(set(why.values())))}); if no migration runs, "
                "'sow-redis config apply' with the topic's definition stores it again")
        time.sleep(pause)
        pause = min(0.5, pause * 2)


def _append_server(r: Client, topic: TopicConfig, source: _Source, start: int,
                   result: PublishResult, on_chunk: Callable[[int], None] | None,
                   fix_separator: bytes | None, jobs: Settings | None, registry_check: bool,
                   fenced: _Fenced) -> None:
    """One pass of :func:`append` on one server (not durable): chunks pipelined, at most
    :data:`IN_FLIGHT` waiting for their replies. Stops sending at the first fence refusal:
    what was refused and what was not sent yet go to ``fenced``."""
    through = _write_through(r)
    if through is None and _raw_fence(r):
        _append_raw(r, topic, source, start, result, on_chunk, fix_separator, jobs,
                    registry_check, fenced)
        return
    batch = XaddBatch(r)
    apply_through = jobs is not None and jobs.write_through
    parts: list[int] = []
    grouped: dict[int, list[Fields]] = {}  # with write-through: the chunk's entries by partition
    items: dict[int, list[tuple[int, Item]]] = {}  # and their positions and items
    handled = 0
    # (partitions, items handled, registry version read after them, write-through chunk and
    # its items, job id per partition touched), sent
    inflight: deque[tuple[list[int], int, bool, dict[int, list[Fields]] | None,
                          dict[int, list[tuple[int, Item]]], dict[int, str]]] = deque()
    check = registry_check
    log_keys = [keys.log(topic.name, p).encode() for p in range(topic.partitions)]
    sep = fix_separator or topic.field_separator.encode()
    skip = frozenset(topic.skip_msg_types)
    refused: list[ResponseError] = []  # Redis refused a command (OOM, READONLY, NOPERM …)

    def settle() -> None:
        """Read the replies of the oldest chunk in flight (a refusal is kept in ``refused``
        after what was appended is counted; no more chunks are sent after it)."""
        if not inflight:
            return
        sent, n_handled, checked, chunk, chunk_items, job_ids = inflight.popleft()
        try:
            if chunk is not None:
                assert through is not None
                replies = batch.collect(tolerate_from=0)
                if checked:
                    result.registry_version = _registry_version(replies.pop())
                _settle_through(r, topic, jobs, through, chunk, job_ids, replies, result,
                                chunk_items=chunk_items, fenced=fenced)
            else:
                replies = batch.collect(tolerate_from=0)
                if checked:
                    result.registry_version = _registry_version(replies.pop())
                for p, sid in zip(sent, replies):
                    if isinstance(sid, ResponseError):
                        refused.append(sid)
                        continue
                    result.last_ids[p] = sid.decode()
                    result.published += 1
                if jobs is not None:
                    _start_jobs(r, topic, sent, replies[len(sent):], job_ids)
        except ResponseError as exc:
            refused.append(exc)
        if on_chunk:
            on_chunk(n_handled)

    def flush(last: bool = False) -> None:
        """Send the chunk validated so far; Redis appends it while the next chunks are
        validated here (at most :data:`IN_FLIGHT` chunks wait for their replies)."""
        nonlocal parts, grouped, items, handled, check
        if len(inflight) >= IN_FLIGHT:
            settle()
        if fenced.why:  # refused: nothing more is sent in this pass
            return
        if parts:
            chunk = None
            job_ids = {p: new_job_id() for p in set(parts)} if jobs is not None else {}
            if through is not None:
                for p in sorted(grouped):
                    batch.add_packed(through.packed(
                        topic, p, grouped[p], jobs.queued_marker_ttl_ms if jobs else 0,
                        job_ids.get(p, ""), apply_through))
                chunk, grouped = grouped, {}
            elif jobs is not None:
                for p in sorted(job_ids):
                    batch.add_set_nx(keys.job_marker(topic.name, p).encode(),
                                     job_marker_value(job_ids[p]).encode(),
                                     jobs.queued_marker_ttl_ms)
            if check:
                batch.add_packed(_GET_REGISTRY_VERSION)
            batch.send()
            inflight.append((parts, handled, check, chunk, items, job_ids))
            check = False
        elif on_chunk and handled:
            on_chunk(handled)
        parts, handled, items = [], 0, {}
        while last and inflight:
            settle()

    try:
        for pos, item, checked, new in _validated(topic, source, result, sep, skip):
            handled += new
            if checked is None:
                continue
            p, entry = checked
            if through is not None:
                grouped.setdefault(p, []).append(entry)
                items.setdefault(p, []).append((pos, item))
            else:
                batch.add(log_keys[p], entry)
            parts.append(p)
            if len(parts) >= CHUNK:
                flush()
                if refused or fenced.why:
                    break
    except _ReadFailed as failed:
        try:
            flush(last=True)
        finally:
            batch.close()
        _read_failed(r, topic, start, result, failed)
    try:
        if not refused:
            flush(last=True)
        while inflight:
            settle()
    finally:
        batch.close()
    if fenced.why:  # validated under the old definition, not sent: validated again
        fenced.held += [pair for held in items.values() for pair in held]
    if refused:
        if result.last_ids:
            _touch_used(r, topic, result.last_ids)
        raise _interrupted(result, refused[0])


def _raw_fence(r: Client) -> bool:
    """True while client ``r``'s plain appends (no right to run scripts) can be fenced with
    ``WATCH`` (:func:`_append_raw`); False once its user was refused ``WATCH`` (an ACL file
    older than the definition fence): its appends then go unfenced."""
    return not getattr(r, "_sow_raw_fence_off", False)


def _append_raw(r: Client, topic: TopicConfig, source: _Source, start: int,
                result: PublishResult, on_chunk: Callable[[int], None] | None,
                fix_separator: bytes | None, jobs: Settings | None, registry_check: bool,
                fenced: _Fenced) -> None:
    """One pass of :func:`append` for a client that may not run scripts (the ACL
    ``publisher`` role; ``memory://``), with the definition fence made of a transaction:
    per chunk, ``WATCH`` and ``MGET`` of its partitions' :func:`keys.definition`, then, when
    each is this publisher's fingerprint (or absent: a topic stored before the fence),
    ``MULTI``, the XADDs and job markers, ``EXEC``. A definition that differs, or changes
    before ``EXEC`` (which then appends nothing), puts the chunk's items in ``fenced``. One
    chunk's transaction is in flight while the next is validated."""
    batch = XaddBatch(r)
    log_keys = [keys.log(topic.name, p).encode() for p in range(topic.partitions)]
    sep = fix_separator or topic.field_separator.encode()
    skip = frozenset(topic.skip_msg_types)
    mine = topic.fingerprint.encode()
    chunk: list[tuple[int, Fields]] = []
    items: list[tuple[int, Item]] = []
    handled = 0
    # (partitions in entry order, items, items handled, job ids, registry version read)
    inflight: list[tuple[list[int], list[tuple[int, Item]], int, dict[int, str], bool]] = []
    refused: list[ResponseError] = []

    def settle() -> None:
        if not inflight:
            return
        sent, held, n_handled, job_ids, checked = inflight.pop()
        replies = batch.collect(tolerate_from=0)
        if checked:
            result.registry_version = _registry_version(replies.pop())
        done = replies[-1]  # EXEC: the replies, None when a watched definition changed
        if isinstance(done, ResponseError) or done is None:
            if done is None:
                fenced.why.update({p: "changed" for p in set(sent)})
                fenced.held.extend(held)
            else:  # EXECABORT: a command was refused when queued (OOM …): nothing appended
                first = next((x for x in replies if isinstance(x, ResponseError)
                              and x is not done), done)
                refused.append(first)
        else:
            for p, sid in zip(sent, done):
                if isinstance(sid, ResponseError):
                    refused.append(sid)
                    continue
                result.last_ids[p] = sid.decode() if isinstance(sid, bytes) else sid
                result.published += 1
            if jobs is not None:
                _start_jobs(r, topic, sent, done[len(sent):], job_ids)
        if on_chunk:
            on_chunk(n_handled)

    def flush() -> None:
        nonlocal chunk, items, handled, registry_check
        settle()
        if not chunk or fenced.why or refused:
            if on_chunk and handled and not chunk:
                on_chunk(handled)
            return
        sent = [p for p, _e in chunk]
        touched = sorted(set(sent))
        def_keys = [keys.definition(topic.name, p).encode() for p in touched]
        batch.add_packed(resp((b"WATCH", *def_keys)))
        batch.add_packed(resp((b"MGET", *def_keys)))
        batch.send()
        try:
            _ok, stored = batch.collect()
        except NoPermissionError:
            r._sow_raw_fence_off = True  # type: ignore[attr-defined]
            log.debug("topic %s: this user may not WATCH the partitions' definitions "
                      "(an ACL file older than the definition fence); appending unfenced",
                      topic.name)
            stored = [None] * len(touched)
        other = {p: v.decode("utf-8", "replace") for p, v in zip(touched, stored)
                 if v is not None and v != mine}
        if other:
            batch.add_packed(_UNWATCH)
            batch.send()
            batch.collect()
            fenced.why.update({p: v if v in (keys.DEFINITION_MIGRATING, keys.DEFINITION_DROPPED)
                               else "changed" for p, v in other.items()})
            fenced.held.extend(items)
            chunk, items, handled = [], [], 0
            return
        job_ids = {p: new_job_id() for p in touched} if jobs is not None else {}
        batch.add_packed(_MULTI)
        for p, entry in chunk:
            batch.add(log_keys[p], entry)
        if jobs is not None:
            for p in touched:
                batch.add_set_nx(keys.job_marker(topic.name, p).encode(),
                                 job_marker_value(job_ids[p]).encode(),
                                 jobs.queued_marker_ttl_ms)
        batch.add_packed(_EXEC)
        if registry_check:
            batch.add_packed(_GET_REGISTRY_VERSION)
        batch.send()
        inflight.append((sent, items, handled, job_ids, registry_check))
        registry_check = False
        chunk, items, handled = [], [], 0

    try:
        for pos, item, checked, new in _validated(topic, source, result, sep, skip):
            handled += new
            if checked is None:
                continue
            chunk.append(checked)
            items.append((pos, item))
            if len(chunk) >= CHUNK:
                flush()
                if fenced.why or refused:
                    break
    except _ReadFailed as failed:
        try:
            flush()
            settle()
        finally:
            batch.close()
        _read_failed(r, topic, start, result, failed)
    try:
        flush()
        settle()
    finally:
        batch.close()
    if fenced.why:  # validated under the old definition, not sent: validated again
        fenced.held.extend(items)
    if refused:
        if result.last_ids:
            _touch_used(r, topic, result.last_ids)
        raise _interrupted(result, refused[0])


def _append_watched(r: Client, topic: TopicConfig, chunk: list[tuple[int, Fields]],
                    chunk_items: dict[int, list[tuple[int, Item]]], jobs: Settings | None,
                    result: PublishResult, fenced: _Fenced) -> None:
    """The definition fence of :func:`_append_raw` on a Redis Cluster: one transaction per
    partition of the chunk, on its primary (``WATCH`` and ``GET`` of its definition, then
    ``MULTI``, its XADDs and job marker, ``EXEC``). A partition whose definition differs or
    changes before ``EXEC`` puts its items in ``fenced`` (nothing of it appended).

    Raises:
        ResponseError: Redis refused the transaction (out of memory …).
    """
    by_p: dict[int, list[Fields]] = {}
    for p, entry in chunk:
        by_p.setdefault(p, []).append(entry)
    mine = topic.fingerprint.encode()
    for p, entries in sorted(by_p.items()):
        log_key, def_key = keys.log(topic.name, p), keys.definition(topic.name, p)
        node = (r.get_redis_connection(r.get_node_from_key(log_key))  # type: ignore[attr-defined]
                if is_cluster(r) else r)
        job_id = new_job_id() if jobs is not None else ""
        with node.pipeline(transaction=_raw_fence(r)) as pipe:
            try:
                if _raw_fence(r):
                    pipe.watch(def_key)
                    stored = cast("bytes | None", pipe.get(def_key))
                    if stored is not None and stored != mine:
                        why = stored.decode("utf-8", "replace")
                        fenced.why[p] = why if why in (keys.DEFINITION_MIGRATING,
                                                       keys.DEFINITION_DROPPED) else "changed"
                        fenced.held += chunk_items[p]
                        continue
                    pipe.multi()
                for entry in entries:
                    pipe.xadd(log_key, entry)
                if jobs is not None:
                    pipe.set(keys.job_marker(topic.name, p), job_marker_value(job_id), nx=True,
                             px=jobs.queued_marker_ttl_ms)
                replies = pipe.execute()
            except WatchError:
                fenced.why[p] = "changed"
                fenced.held += chunk_items[p]
                continue
            except NoPermissionError:  # an ACL file older than the fence: append unfenced
                r._sow_raw_fence_off = True  # type: ignore[attr-defined]
                _append_watched(r, topic, [(p, e) for e in entries], chunk_items, jobs, result,
                                fenced)
                continue
        last = replies[len(entries) - 1]
        result.last_ids[p] = last.decode() if isinstance(last, bytes) else last
        result.published += len(entries)
        if jobs is not None and replies[-1]:
            enqueue_job(r, topic.name, p, behind=len(entries), job_id=job_id)


def _interrupted(result: PublishResult, refusal: Exception) -> Exception:
    """What a publish raises when Redis refused a command: PublishInterrupted (with
    ``result``) when something was appended before, else the refusal itself (e.g. the
    NoPermissionError of a user who may not publish, the OutOfMemoryError of a full Redis)."""
    return PublishInterrupted(result, refusal) if result.published else refusal


DURABLE_WAIT_MS = 5000
"""Milliseconds a ``durable`` publish waits for a replica to confirm a chunk (``WAIT``)."""


def _send_chunk(r: Client, commands: list[tuple[str, tuple[Any, ...], dict[str, Any]]],
                durable: bool, tolerate: bool = False) -> list[Any]:
    """Run ``(method, args, kwargs)`` commands (each on one key, the key first; or
    ``("execute_command", ("EVALSHA", sha, numkeys, key, …), {})``, whose error replies are
    returned in place, not raised) in order of the replies; with ``durable``, followed on each
    node by ``WAIT 1`` on the connection that wrote them. ``tolerate`` (not ``durable``):
    every error reply is returned in place.

    Raises:
        NotDurableError: a node's WAIT counted no replica within :data:`DURABLE_WAIT_MS`;
            the first error reply of a command other than EVALSHA (after all ran).
    """
    if not durable:
        pipe = r.pipeline(transaction=False)
        for method, args, kwargs in commands:
            getattr(pipe, method)(*args, **kwargs)
        replies = pipe.execute(raise_on_error=False)
        if not tolerate:
            return _raise_first(commands, replies)
        for reply in replies:  # a lost connection is raised; error replies stay in place
            if isinstance(reply, Exception) and not isinstance(reply, ResponseError):
                raise reply
        return replies
    # WAIT counts the replicas that have the writes of its own connection: one plain pipeline
    # per node (a cluster's pipeline would spread commands over pooled connections)
    groups: dict[str, tuple[Any, list[int]]] = {}
    for i, (_m, args, _k) in enumerate(commands):
        if is_cluster(r):
            key = args[3] if args[0] == "EVALSHA" else args[0]
            node = r.get_node_from_key(key)  # type: ignore[attr-defined]
            name, client = node.name, r.get_redis_connection(node)  # type: ignore[attr-defined]
        else:
            name, client = "", r
        groups.setdefault(name, (client, []))[1].append(i)
    out: list[Any] = [None] * len(commands)
    for name, (client, idx) in groups.items():
        pipe = client.pipeline(transaction=False)
        for i in idx:
            method, args, kwargs = commands[i]
            getattr(pipe, method)(*args, **kwargs)
        pipe.execute_command("WAIT", 1, DURABLE_WAIT_MS)
        try:
            replies = pipe.execute(raise_on_error=False)
            _raise_first([commands[i] for i in idx] + [("wait", ("WAIT",), {})], replies)
        except RedisError:
            if is_cluster(r):  # a node gone or a slot moved: read the slot map again
                try:
                    r.nodes_manager.initialize()  # type: ignore[attr-defined]
                except RedisError:
                    pass  # the next call tries again
            raise
        if int(replies[-1]) < 1:
            raise NotDurableError(
                f"no replica of {name or 'the server'} confirmed {len(idx)} write(s) within "
                f"{DURABLE_WAIT_MS} ms (WAIT 1): they are not acknowledged")
        for i, reply in zip(idx, replies):
            out[i] = reply
    return out


def _raise_first(commands: list[tuple[str, tuple[Any, ...], dict[str, Any]]],
                 replies: list[Any]) -> list[Any]:
    """``replies``, after raising the first error reply of a command other than EVALSHA
    (the write-through calls, whose errors :class:`WriteThrough` takes) and the registry
    version read of ``registry_check`` (an error there only means "not read")."""
    for (_m, args, _k), reply in zip(commands, replies):
        if isinstance(reply, Exception) and not (
                args and args[0] in ("EVALSHA", keys.REGISTRY_VERSION)):
            raise reply
    return replies


def _append_cluster(r: Client, topic: TopicConfig, source: _Source, start: int,
                    result: PublishResult, on_chunk: Callable[[int], None] | None,
                    fix_separator: bytes | None, jobs: Settings | None, durable: bool,
                    registry_check: bool, fenced: _Fenced) -> None:
    """One pass of :func:`append` on a Redis Cluster, or with ``durable`` (same arguments,
    result and errors): each chunk of :data:`CHUNK` messages goes as one redis-py pipeline (on a
    cluster one round trip per node holding its partitions; the XADDs of one partition stay
    in order) with the write-through calls (or the ``SET NX`` of its job markers), and with
    ``durable`` a ``WAIT 1`` per node; no chunk is in flight while the next one is
    validated. Stops at the first fence refusal (what was refused goes to ``fenced``)."""
    log_keys = [keys.log(topic.name, p) for p in range(topic.partitions)]
    sep = fix_separator or topic.field_separator.encode()
    skip = frozenset(topic.skip_msg_types)
    chunk: list[tuple[int, Fields]] = []
    chunk_items: dict[int, list[tuple[int, Item]]] = {}
    handled = 0
    through = _write_through(r)
    apply_through = jobs is not None and jobs.write_through

    def flush() -> None:
        nonlocal chunk, chunk_items, handled, registry_check
        if chunk:
            touched = sorted({p for p, _e in chunk})
            sent = [p for p, _e in chunk]
            grouped: dict[int, list[Fields]] = {}
            job_ids = {p: new_job_id() for p in touched} if jobs is not None else {}
            commands: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
            if through is None and not durable and _raw_fence(r):
                try:
                    _append_watched(r, topic, chunk, chunk_items, jobs, result, fenced)
                except ResponseError as exc:
                    raise _interrupted(result, exc) from exc
                if on_chunk and handled:
                    on_chunk(handled)
                chunk, chunk_items, handled = [], {}, 0
                return
            if through is not None:
                for p, entry in chunk:
                    grouped.setdefault(p, []).append(entry)
                commands += [("execute_command", ("EVALSHA", *through.call(
                    topic, p, grouped[p], jobs.queued_marker_ttl_ms if jobs else 0,
                    job_ids.get(p, ""), apply_through)), {})
                    for p in touched]
            else:
                commands += [("xadd", (log_keys[p], entry), {}) for p, entry in chunk]
                if jobs is not None:
                    commands += [("set", (keys.job_marker(topic.name, p),
                                          job_marker_value(job_ids[p])),
                                  {"nx": True, "px": jobs.queued_marker_ttl_ms}) for p in touched]
            if registry_check:
                commands.append(("get", (keys.REGISTRY_VERSION,), {}))
            try:
                replies = _send_chunk(r, commands, durable, tolerate=not durable)
            except ResponseError as exc:  # durable: what the chunk appended is unknown
                raise _interrupted(result, exc) from exc
            if registry_check:
                result.registry_version = _registry_version(replies.pop())
                registry_check = False
            try:
                if grouped:
                    assert through is not None
                    _settle_through(r, topic, jobs, through, grouped, job_ids, replies, result,
                                    durable, chunk_items=chunk_items, fenced=fenced)
                else:
                    error = None
                    for (p, _e), sid in zip(chunk, replies):
                        if isinstance(sid, ResponseError):
                            error = error or sid
                            continue
                        result.last_ids[p] = sid.decode() if isinstance(sid, bytes) else sid
                        result.published += 1
                    if jobs is not None:
                        _start_jobs(r, topic, sent, replies[len(chunk):], job_ids)
                    if error is not None:
                        raise error
            except ResponseError as exc:
                raise _interrupted(result, exc) from exc
        if on_chunk and handled:
            on_chunk(handled)
        chunk, chunk_items, handled = [], {}, 0

    try:
        for pos, item, checked, new in _validated(topic, source, result, sep, skip):
            handled += new
            if checked is None:
                continue
            chunk.append(checked)
            chunk_items.setdefault(checked[0], []).append((pos, item))
            if len(chunk) >= CHUNK:
                flush()
                if fenced.why:
                    return
    except _ReadFailed as failed:
        flush()
        _read_failed(r, topic, start, result, failed)
    flush()


def resp(args: Sequence[Any], header: bool = True) -> bytes:
    """RESP bytes of one command (``header``: with its array header) of str, bytes, int or
    float arguments."""
    out = bytearray(b"*%d\r\n" % len(args)) if header else bytearray()
    for a in args:
        v = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(v), v)
    return bytes(out)


_GET_REGISTRY_VERSION = resp(("GET", keys.REGISTRY_VERSION))
_UNWATCH = resp(("UNWATCH",))
_MULTI = resp(("MULTI",))
_EXEC = resp(("EXEC",))


def _registry_version(reply: Any) -> object:
    """:attr:`PublishResult.registry_version` from the reply of ``registry_check``'s GET
    (:data:`NOT_READ` for an error reply, e.g. an ACL without ``+get``)."""
    return NOT_READ if isinstance(reply, Exception) else reply


class XaddBatch:
    """``XADD <key> * <field> <value> …`` commands packed as RESP by hand and sent in one
    write on one pooled connection: redis-py's per-command packing and reply handling cost
    about 4 µs per message, five times what Redis spends on the XADD (docs/benchmarks.md,
    "Profiles"). Same round trips and replies as a redis-py pipeline.

    :meth:`send` writes the queued commands and returns at once; :meth:`collect` reads their
    replies later, so the caller prepares the next chunk while Redis appends this one; the
    replies of several sends may be pending, read oldest first. :meth:`close` always (it gives the connection back, or drops
    it when replies were left unread).
    """

    def __init__(self, r: Client) -> None:
        self._r = r
        self._buf = bytearray()
        self._n = 0
        self._sent: deque[int] = deque()  # commands per send whose replies are unread
        self._conn: Any = None

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
        """Queue ``SET key value NX PX px`` (its reply: ``OK`` when set, None when the key
        existed)."""
        self._buf += b"*6\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$2\r\nNX\r\n" \
            b"$2\r\nPX\r\n$%d\r\n%d\r\n" % (len(key), key, len(value), value, len(str(px)), px)
        self._n += 1

    def add_packed(self, command: bytes) -> None:
        """Queue one command already packed as RESP (see :func:`resp`)."""
        self._buf += command
        self._n += 1

    def send(self) -> None:
        """Write every queued command and start queueing anew; :meth:`collect` reads the
        replies of each send, oldest first."""
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

    def collect(self, tolerate_from: int | None = None) -> list[Any]:
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
        out: list[Any] = []
        error: ResponseError | None = None
        try:
            for i in range(n):
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

    def execute(self) -> list[bytes]:
        """Send every queued XADD and read the replies (one round trip)."""
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


class WriteThrough:
    """The publisher's side of apply.lua (appended), one per client (:func:`_write_through`):
    the script is loaded once (``SCRIPT LOAD``) and then sent as a bare EVALSHA per partition
    in each chunk's write, carrying that partition's entries, which it appends and applies
    (when the partition is caught up) or leaves to the workers, setting the job marker
    (then :func:`append` enqueues a job). An error reply (no right to run scripts, the server
    lost its script cache, out of memory) appended nothing: :func:`append` appends those
    entries with XADD; it is logged once per kind."""

    def __init__(self, r: Client) -> None:
        self._scripts = Scripts(r)
        self._loaded = False
        self._warned: set[str] = set()
        self._packed: dict[tuple[str, int, int, bool], tuple[TopicConfig, bytes, bytes]] = {}
        self.applied = 0
        """Entries this client applied by write-through (for benchmarks and tests)."""
        self.refused = False
        """True once the server refused the script to this client's user (ACL ``NOPERM``,
        e.g. the ``publisher`` role): its later chunks are appended with XADD."""

    @property
    def loaded(self) -> bool:
        """True once the script was loaded (and not lost since)."""
        return self._loaded

    def load(self) -> None:
        """``SCRIPT LOAD`` the script (before sending it as a bare EVALSHA).

        Raises:
            NoPermissionError: the client's user may not run scripts.
        """
        self._scripts.load("apply")
        self._loaded = True

    def call(self, topic: TopicConfig, p: int, entries: Sequence[Fields],
             marker_ttl_ms: int, job_id: str, through: bool = True) -> list[Any]:
        """The EVALSHA arguments (after the command name) appending ``entries`` to partition
        ``p`` (applied there with ``through`` when the partition is caught up); the script
        sets the job marker to ``job:<job_id>`` (lifetime ``marker_ttl_ms`` milliseconds)
        when it leaves entries to the workers and no job was outstanding (``job_id`` "": no
        marker)."""
        if not self._loaded:
            self.load()
        sha, ks, argv = self._scripts.apply_appended_call(
            topic, p, pack_entries(entries), marker_ttl_ms, through,
            job_marker_value(job_id) if job_id else "")
        return [sha, len(ks), *ks, *argv]

    def packed(self, topic: TopicConfig, p: int, entries: Sequence[Fields],
               marker_ttl_ms: int, job_id: str, through: bool = True) -> bytes:
        """The EVALSHA of :meth:`call` packed as RESP. Only the entries and the job id differ
        from one chunk to the next: the rest is packed once per topic definition and
        partition (packing the ~20 arguments took a fifth of a small publish's time)."""
        if not self._loaded:
            self.load()
        key = (topic.name, p, marker_ttl_ms, through)
        hit = self._packed.get(key)
        if hit is None or (hit[0] is not topic and hit[0] != topic):
            args = [b"EVALSHA", *self.call(topic, p, [], marker_ttl_ms, "", through)]
            # the entries: the operation's first argument (lua/include/apply_appended.lua),
            # then its marker lifetime and write-through flag, then the marker value, last
            at = 3 + int(args[2]) + OP_ARGS
            hit = (topic, b"*%d\r\n" % len(args) + resp(args[:at], header=False),
                   resp(args[at + 1:-1], header=False))
            self._packed[key] = hit
        data = pack_entries(entries)
        value = job_marker_value(job_id).encode() if job_id else b""
        return (hit[1] + b"$%d\r\n%s\r\n" % (len(data), data) + hit[2]
                + b"$%d\r\n%s\r\n" % (len(value), value))

    def settle(self, topic: TopicConfig, reply: Any) -> tuple[int, str, bool] | str | None:
        """Take the reply of one write-through call.

        Returns:
            ``(entries applied, stream id of the last entry appended, job marker set)``;
            the reason (``migrating``, ``absent``, ``dropped``, ``changed``) when the
            definition fence refused the call; None for an error reply (in both cases
            nothing was appended).
        """
        if isinstance(reply, ResponseError):
            # redis-py takes the code (NOSCRIPT, NOPERM) off the text of its own classes
            if isinstance(reply, NoScriptError):
                self._loaded = False
            elif isinstance(reply, NoPermissionError):
                self.refused = True
            if isinstance(reply, (NoScriptError, NoPermissionError)):
                self._warn(topic, type(reply).__name__, f"write-through failed ({reply}); "
                           "the entries are appended with XADD and applied by the workers")
            return None
        if int(reply[0]) < 0:
            why = reply[1]
            return why.decode() if isinstance(why, bytes) else str(why)
        applied, last, marked, error = reply
        if error:
            self._warn(topic, "apply", f"write-through apply failed ({error!r}); the workers "
                       "apply those entries")
        self.applied += int(applied)
        return int(applied), last.decode() if isinstance(last, bytes) else last, bool(marked)

    def _warn(self, topic: TopicConfig, kind: str, text: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("topic %s: %s", topic.name, text)


def _write_through(r: Client) -> WriteThrough | None:
    """The appender of client ``r`` (its entries are appended by apply.lua (appended), which
    records them as trusted and writes them through where asked), or None where the server
    runs no script for this client's user (the ACL ``publisher`` role: plain XADD) and on
    ``memory://`` (fakeredis runs no MessagePack in Lua)."""
    if isinstance(r, _fake_redis_class()):
        return None
    through = cast(WriteThrough, attached(r, "write_through", WriteThrough))
    if not through.refused and not through.loaded:
        try:
            through.load()
        except NoPermissionError:  # e.g. the ACL publisher role: no scripts
            through.refused = True
    return None if through.refused else through


TOUCH_EVERY_S = 1.0
"""A publisher records a topic's use at most this often (seconds), or a tenth of its
``idle_expiration`` when that is shorter (:func:`_touch_used`)."""


def _touch_used(r: Client, topic: TopicConfig, last_ids: dict[int, str]) -> None:
    """:func:`touch` after an append, for a topic with ``idle_expiration`` only (nothing else
    reads the time), and at most every :data:`TOUCH_EVERY_S` seconds per client and topic
    (a tenth of ``idle_expiration`` when shorter): a steady publisher spares a round trip
    per publish."""
    idle_ms = topic.idle_ms
    if not idle_ms or not last_ids:
        return
    seen: dict[str, float] = attached(r, "touched", lambda _r: {})
    now = time.monotonic()
    if now - seen.get(topic.name, -math.inf) < min(TOUCH_EVERY_S, idle_ms / 10_000):
        return
    touch(r, topic.name, last_ids)
    seen[topic.name] = now


def touch(r: Client, topic: str, last_ids: dict[int, str] | None = None) -> None:
    """Record that the topic was used now (for ``idle_expiration``), in ms on the Redis server
    clock: the newest log entry id's time, or the server ``TIME``."""
    if last_ids:
        ms = max(ms_of(sid) for sid in last_ids.values())
    else:
        ms = server_ms(r)
    try:
        r.hset(keys.LAST_USED, topic, ms)
    except OutOfMemoryError:  # a query still reads when Redis is out of memory
        pass


def append_delete_all_partitions(r: Client, topic: TopicConfig, fields: Fields) -> dict[int, str]:
    """Append a ``sow_delete`` by filter or by SOW keys to every partition's log.

    A delete by SOW keys is appended and applied in one call where the partition is caught
    up (``delete_now.lua``; a write-through for deletes), also when Redis is out of memory
    (``maxmemory`` under ``noeviction`` refuses every plain append; the script is flagged
    ``allow-oom``): deleting records is how a user frees memory. The other partitions, a
    client that may not run scripts and ``memory://`` get a plain append for the workers.

    Returns:
        partition → stream id of the delete command.

    Raises:
        PublishInterrupted: Redis refused the append of some partition (out of memory with
            unapplied entries waiting there, or for a delete by filter, which needs the
            workers; read-only, …): its ``result.last_ids`` has the partitions done.
    """
    entry: Fields = {"cmd": "sow_delete", **fields}
    out: dict[int, str] = {}
    if "keys" in fields and not isinstance(r, _fake_redis_class()):
        scripts = Scripts(r)
        sow_keys = str(fields["keys"]).split(",")
        try:
            for p in range(topic.partitions):
                done = scripts.delete_now(topic, p, entry, sow_keys)
                if done is not None:
                    out[p] = done[1]
        except NoPermissionError:  # e.g. the ACL publisher role: no scripts
            pass
    rest = [p for p in range(topic.partitions) if p not in out]
    pipe = r.pipeline(transaction=False)
    for p in rest:
        pipe.xadd(keys.log(topic.name, p), entry)
    refused: Exception | None = None
    for p, sid in zip(rest, pipe.execute(raise_on_error=False)):
        if isinstance(sid, Exception):
            if not isinstance(sid, ResponseError):
                raise sid
            refused = refused or sid
            continue
        out[p] = sid.decode() if isinstance(sid, bytes) else sid
    if refused is not None:
        raise _interrupted(PublishResult(published=len(out), last_ids=out), refused)
    return out


def _fake_redis_class() -> type:
    """fakeredis's client class (``memory://``: its Lua runs no flagged script), or a class
    no client is an instance of when fakeredis is not loaded."""
    import sys

    fake = sys.modules.get("fakeredis")
    return fake.FakeRedis if fake is not None else type("_NoFake", (), {})


def wait_applied(r: Client, topic: TopicConfig, last_ids: dict[int, str], timeout_s: float = 60.0,
                 poll_s: float = 0.01) -> None:
    """Block until every partition's applied cursor reaches the given stream ids, polling
    after 1 ms, then at doubling intervals up to ``poll_s`` seconds (read-your-writes
    latency stays a few ms for a lone message, the polling cost stays bounded for a backlog).

    Raises:
        WaitTimeout: after ``timeout_s`` seconds, naming the partitions still behind.
    """
    pending = dict(last_ids)
    pause = min(poll_s, 0.001)
    deadline = time.monotonic() + timeout_s
    while pending:
        for p, cur in read_cursors(r, topic.name, pending).items():
            if reached(cur, pending[p]):
                del pending[p]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise WaitTimeout(
                f"topic {topic.name}: partitions {sorted(pending)} not applied after "
                f"{timeout_s:g} s (are workers running? sow-redis worker)")
        time.sleep(pause)
        pause = min(poll_s, pause * 2)


def delete_counts(r: Client, topic: TopicConfig, ids: dict[int, str]) -> int:
    """Records removed by a sow_delete, summed over partitions (after :func:`wait_applied`)."""
    pipe = r.pipeline(transaction=False)
    for p, sid in ids.items():
        pipe.hget(keys.acks(topic.name, p), sid)
    return sum(int(v or 0) for v in pipe.execute())


def append_through_outage(r: Client, topic: TopicConfig, items: Iterable[Item], retry_s: float,
                          **kwargs: Any) -> PublishResult:
    """:func:`sow_redis.publish.append.append` that rides out a Redis outage of up to ``retry_s``
    seconds: items go in blocks of :data:`RETRY_CHUNK`; a block that fails because Redis does
    not answer is sent again after a backoff (:data:`BACKOFF_MIN_S` doubling to
    :data:`BACKOFF_MAX_S`), the outage reported once (:func:`reporter` ``publisher``).

    Delivery across an outage is at least once: the messages of a block whose connection broke
    after Redis had appended some of them are appended again. A publish, a delta_publish (the
    same fields merged again) and a sow_delete give the same SOW when applied twice; a
    subscriber sees such a message twice.

    Args:
        r, topic, items, kwargs: as for :func:`~sow_redis.publish.append.append` (``start`` counts
            on across blocks).
        retry_s: seconds an outage may last before its error is raised.

    Returns:
        The merged :class:`~sow_redis.publish.append.PublishResult` of every block.

    Raises:
        redis.exceptions.ConnectionError, TimeoutError: Redis did not answer for ``retry_s``
            seconds (the earlier blocks are in the log); as :func:`append` otherwise.
    """
    result = PublishResult()
    start = kwargs.pop("start", 1)
    it = iter(items)
    while True:
        block = list(itertools.islice(it, RETRY_CHUNK))
        if not block:
            return result
        send = functools.partial(append, r, topic, block, start=start, **kwargs)
        try:
            result.merge(call_through_outage(send, retry_s))
        except PublishInterrupted as exc:  # count the earlier blocks too
            result.merge(exc.result)
            raise PublishInterrupted(result, exc.cause) from exc.cause
        start += len(block)
