"""Publish side: validate messages, append them to their partition's transaction log.

``publish`` / ``delta_publish`` / ``sow_delete`` are appended to ``{sow:T:p}:log`` with
pipelining (AMPS User Guide ch. 7; ARCHITECTURE §3). The returned stream ids are the
publisher's consistency token: :func:`wait_applied` blocks until the workers applied them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from . import keys
from .config import TopicConfig
from .connection import Client, Fields, server_ms
from .errors import MessageError, WaitTimeout
from .fix import to_message
from .messages import check_expiration, encode, parse, unwrap
from .partition_state import read_cursors
from .streamids import ms_of, reached

CHUNK = 1000
"""Messages sent per pipeline round trip."""


@dataclass
class Rejected:
    """A message the publisher refused: its position (1-based line or item), reason, detail."""

    position: int
    reason: str
    detail: str


@dataclass
class PublishResult:
    """Outcome of a publish call: ``read == published + skipped + len(rejected)``.

    Attributes:
        read: messages (lines, items) taken from the input.
        published: messages appended to the log.
        skipped: FIX messages of a MsgType the topic skips (``skip_msg_types``: session-level
            messages by default); not errors, not in the log.
        rejected: messages refused before reaching the log, with reasons.
        last_ids: partition → last stream id appended (the consistency token for ``wait``).
    """

    published: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    last_ids: dict[int, str] = field(default_factory=dict)
    skipped: int = 0
    read: int = 0

    def merge(self, other: PublishResult) -> None:
        self.read += other.read
        self.published += other.published
        self.skipped += other.skipped
        self.rejected += other.rejected
        self.last_ids.update(other.last_ids)


Item = tuple[str, Any, "str | None"] | tuple[str, Any, "str | None", "float | None"]


def _entry(cmd: str, data: bytes, sow_key: str | None,
           expiration: float | None) -> Fields:
    e: Fields = {"cmd": cmd, "data": data}
    if sow_key:
        e["sow_key"] = sow_key
    if expiration is not None:
        e["expiration"] = repr(expiration)
    return e


def append(r: Client, topic: TopicConfig, items: Iterable[Item], start: int = 1,
           on_chunk: Callable[[int], None] | None = None,
           fix_separator: bytes | None = None) -> PublishResult:
    """Validate and append messages to the log.

    Every item is either appended or rejected with its reason, whatever the other items do:
    a problem with one item (including an exception no check foresaw, reported as
    ``bad_message`` with the exception text) never stops the others.

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
            it is stored as JSON with tag numbers as field names (:mod:`sow_redis.fix`).

    Returns:
        What was published and what was rejected (nothing rejected reaches the log).

    Raises:
        Whatever iterating ``items`` raises (e.g. an OSError reading a file), after appending
        the items validated before it (a note on the exception says how many were published);
        Redis errors.
    """
    result = PublishResult()
    batch = XaddBatch()
    parts: list[int] = []
    handled = 0
    is_fix = topic.message_type == "fix"
    log_keys = [keys.log(topic.name, p).encode() for p in range(topic.partitions)]
    sep = fix_separator or topic.field_separator.encode()
    skip = frozenset(topic.skip_msg_types)

    def flush() -> None:
        nonlocal parts, handled
        if parts:
            for p, sid in zip(parts, batch.execute(r)):
                result.last_ids[p] = sid.decode()
            result.published += len(parts)
        if on_chunk:
            on_chunk(handled)
        parts, handled = [], 0

    def check(item: Item) -> tuple[int, Fields] | None:
        """(partition, log entry) of one item; None for a skipped FIX message."""
        cmd, data, sow_key = item[0], item[1], item[2]
        expiration = item[3] if len(item) > 3 else None
        data = encode(data).strip()
        if not data:
            raise MessageError("empty", "empty message")
        data, opts = unwrap(data)
        obj = None
        if is_fix:
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
        return parsed.partition, _entry(cmd, data, sow_key, expiration)

    pos = start - 1
    it = iter(items)
    while True:
        try:
            item = next(it)
        except StopIteration:
            break
        except Exception as exc:
            flush()
            if result.last_ids:
                touch(r, topic.name, result.last_ids)
            exc.add_note(f"sow_redis: reading item {pos + 1} failed; the {result.published} "
                         f"earlier message(s) were appended to the log, {len(result.rejected)} "
                         "rejected")
            raise
        pos += 1
        result.read += 1
        handled += 1
        try:
            checked = check(item)
        except MessageError as exc:
            result.rejected.append(Rejected(pos, exc.reason, exc.detail))
            continue
        except Exception as exc:
            result.rejected.append(Rejected(pos, "bad_message", f"{type(exc).__name__}: {exc}"))
            continue
        if checked is None:
            result.skipped += 1
            continue
        p, entry = checked
        batch.add(log_keys[p], entry)
        parts.append(p)
        if len(parts) >= CHUNK:
            flush()
    flush()
    if result.last_ids:
        touch(r, topic.name, result.last_ids)
    return result


class XaddBatch:
    """``XADD <key> * <field> <value> …`` commands packed as RESP by hand and sent in one
    write on one pooled connection: redis-py's per-command packing and reply handling cost
    about 4 µs per message, five times what Redis spends on the XADD (docs/benchmarks.md,
    "Profiles"). Same round trips and replies as a redis-py pipeline."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._n = 0

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

    def execute(self, r: Client) -> list[bytes]:
        """Send every queued XADD, read the replies (stream ids), and start empty again.

        Raises:
            redis.exceptions.ResponseError: the first error reply, after every reply was read
                (the other commands took effect, as with a pipeline); connection errors.
        """
        data, n = bytes(self._buf), self._n
        self._buf, self._n = bytearray(), 0
        if not n:
            return []
        pool = r.connection_pool
        conn = pool.get_connection()
        out: list[bytes] = []
        error: ResponseError | None = None
        try:
            conn.send_packed_command([data], check_health=False)
            for _ in range(n):
                try:
                    out.append(conn.read_response())
                except ResponseError as exc:
                    error = error or exc
                    out.append(b"")
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        if error is not None:
            raise error
        return out


def touch(r: Client, topic: str, last_ids: dict[int, str] | None = None) -> None:
    """Record that the topic was used now (for ``idle_expiration``), in ms on the Redis server
    clock: the newest log entry id's time, or the server ``TIME``."""
    if last_ids:
        ms = max(ms_of(sid) for sid in last_ids.values())
    else:
        ms = server_ms(r)
    r.hset(keys.LAST_USED, topic, ms)


def append_delete_all_partitions(r: Client, topic: TopicConfig, fields: Fields) -> dict[int, str]:
    """Append a ``sow_delete`` by filter or by SOW keys to every partition's log.

    Returns:
        partition → stream id of the delete command.
    """
    pipe = r.pipeline(transaction=False)
    for p in range(topic.partitions):
        pipe.xadd(keys.log(topic.name, p), {"cmd": "sow_delete", **fields})
    return {p: (sid.decode() if isinstance(sid, bytes) else sid)
            for p, sid in enumerate(pipe.execute())}


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

