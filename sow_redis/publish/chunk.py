"""One pass of a publish over its items: the chunks it sends, and what it learns from the
replies (appended, fenced, refused), shared by the loop
(:func:`~sow_redis.publish.append.append`) and the :class:`Sink` that talks to Redis."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from redis.exceptions import ResponseError

from ..apply.jobs import enqueue_job, ensure_jobs, new_job_id
from ..connection import Client, Fields
from ..model.topic import TopicConfig
from ..settings import Settings
from .fence import Fenced
from .result import NOT_READ, PublishResult
from .validate import Checked, Item, Positioned


@dataclass
class Chunk:
    """Validated entries sent in one write, in the order read, with their items.

    Attributes:
        entries: ``(partition, log entry fields)`` of each item to append.
        items: ``(position, item)`` of each entry, in the same order.
        handled: new items read into this chunk (also those rejected or skipped).
    """

    entries: list[Checked] = field(default_factory=list)
    items: list[Positioned] = field(default_factory=list)
    handled: int = 0

    def add(self, pos: int, item: Item, checked: Checked) -> None:
        """Take one validated item."""
        self.entries.append(checked)
        self.items.append((pos, item))

    def partitions(self) -> list[int]:
        """The partition of each entry, in order."""
        return [p for p, _e in self.entries]

    def touched(self) -> list[int]:
        """The partitions the chunk appends to, ascending."""
        return sorted({p for p, _e in self.entries})

    def by_partition(self) -> dict[int, list[Fields]]:
        """Partition → its entries in order, partitions ascending."""
        out: dict[int, list[Fields]] = {}
        for p, entry in sorted(self.entries, key=lambda pair: pair[0]):
            out.setdefault(p, []).append(entry)
        return out

    def items_of(self) -> dict[int, list[Positioned]]:
        """Partition → the items of its entries, in order."""
        out: dict[int, list[Positioned]] = {}
        for (p, _e), pair in zip(self.entries, self.items):
            out.setdefault(p, []).append(pair)
        return out


class Pass:
    """What one pass of a publish knows: the client, the topic definition it keys by, the
    result so far, what the definition fence refused and the first command Redis refused
    (after which nothing more is sent).

    Args:
        jobs: start the workers while appending (see :func:`~sow_redis.publish.append.append`).
        on_chunk: called with the number of items handled, after each chunk's replies.
        registry_check: read the registry version with the first chunk sent.
        inline: the settings of a client that applies what the publish leaves itself (see
            :func:`~sow_redis.publish.append.append`).
    """

    def __init__(self, r: Client, topic: TopicConfig, jobs: Settings | None,
                 result: PublishResult, on_chunk: Callable[[int], None] | None,
                 registry_check: bool, inline: Settings | None = None) -> None:
        self.r, self.topic, self.jobs, self.result = r, topic, jobs, result
        self.on_chunk = on_chunk
        self.registry_check = registry_check
        self.fenced = Fenced()
        self.refused: ResponseError | None = None
        self.settings = jobs or inline
        self.apply_through = self.settings is not None and self.settings.write_through
        """Whether apply.lua (appended) applies the chunks on a caught-up partition."""

    @property
    def stopped(self) -> bool:
        """True once the fence or Redis refused something: no more chunks are sent."""
        return bool(self.fenced.why) or self.refused is not None

    @property
    def marker_ttl_ms(self) -> int:
        """Lifetime in milliseconds of a job marker set with a chunk (0: no jobs)."""
        return self.jobs.queued_marker_ttl_ms if self.jobs is not None else 0

    def refuse(self, exc: ResponseError) -> None:
        """Redis refused a command (out of memory, read-only, an ACL refusal): the first one
        is kept, to be raised once what was appended is counted."""
        self.refused = self.refused or exc

    def job_ids(self, touched: list[int]) -> dict[int, str]:
        """A fresh ingest job id per partition of ``touched`` (none without jobs)."""
        return {p: new_job_id() for p in touched} if self.jobs is not None else {}

    def take_registry_check(self) -> bool:
        """Whether the chunk being sent reads the registry version (the first one sent)."""
        check, self.registry_check = self.registry_check, False
        return check

    def read_registry(self, replies: list[object], checked: bool) -> None:
        """With ``checked``: take the registry version read off the end of ``replies``
        (:data:`NOT_READ` for an error reply, e.g. an ACL without ``+get``)."""
        if checked:
            reply = replies.pop()
            self.result.registry_version = NOT_READ if isinstance(reply, Exception) else reply

    def appended(self, p: int, sid: object, n: int = 1) -> None:
        """``n`` entries were appended to partition ``p``, the last with stream id ``sid``."""
        self.result.last_ids[p] = sid.decode() if isinstance(sid, bytes) else str(sid)
        self.result.published += n
        self.result.appended_at[p] += n

    def through_done(self, p: int, n: int, applied: int, log_len: int) -> None:
        """A write-through call appended ``n`` entries to partition ``p`` (after
        :meth:`appended`) and applied ``applied`` of them; the log holds ``log_len`` entries
        now. No worker passes over a partition whose entries are all written through, and
        only a worker's pass trims a log (:func:`sow_redis.apply.jobs.drain_partitions`):
        when the log crossed a step of a tenth of ``log_max_len`` above it (a persistent
        topic, or a transient one with ``log_retention``), the partition is due a pass: a
        job (with ``jobs``, where this call left none), or the inline client's own."""
        self.result.applied_at[p] += applied
        settings, topic = self.settings, self.topic
        if settings is None or (topic.transient and not topic.log_retention_ms):
            return
        limit = settings.log_max_len
        step = max(1, limit // 10)
        if log_len > limit and (log_len - n) // step != log_len // step:
            self.result.trim_due.add(p)
            if self.jobs is not None and applied == n:
                ensure_jobs(self.r, topic.name, [p], self.jobs)

    def take_ids(self, sent: list[int], replies: list[object]) -> None:
        """Count the XADD replies of entries appended to ``sent`` (one partition each, in
        order); an error reply is kept as the refusal."""
        for p, sid in zip(sent, replies):
            if isinstance(sid, ResponseError):
                self.refuse(sid)
            else:
                self.appended(p, sid)

    def start_jobs(self, sent: list[int], marks: list[object], job_ids: dict[int, str]) -> None:
        """After a chunk appended to partitions ``sent`` (one per entry, in order): enqueue an
        ingest job (id ``job_ids[p]``) for each partition whose job marker the chunk's write
        set (``marks``: the replies of the ``SET NX`` of each partition touched, ascending).
        A refused ``SET NX`` is kept as the refusal."""
        for p, set_now in zip(sorted(set(sent)), marks):
            if isinstance(set_now, ResponseError):
                self.refuse(set_now)
                return
            if set_now:  # entries wait for the workers and no job was outstanding for p
                enqueue_job(self.r, self.topic.name, p, behind=sent.count(p),
                            job_id=job_ids[p])

    def progress(self, handled: int) -> None:
        """Report ``handled`` items done to ``on_chunk``."""
        if self.on_chunk is not None and handled:
            self.on_chunk(handled)


class Sink(Protocol):
    """How the chunks of one pass reach Redis (one server, a cluster, with or without
    scripts, durable or not): chosen once per pass by
    :func:`~sow_redis.publish.sinks.open_sink`. It records every outcome on its
    :class:`Pass`."""

    def make_room(self) -> None:
        """Read the replies that must be read before another chunk is sent (the pass may
        stop: then no chunk is sent)."""

    def send(self, chunk: Chunk) -> None:
        """Send a chunk with entries (its replies may be read later)."""

    def drain(self) -> None:
        """Read every reply still pending."""

    def close(self) -> None:
        """Give back what the sink holds (always called, last)."""
