"""What a publish returns, and the error of a publish Redis refused part of: the one
definition of both, shared by :mod:`sow_redis.publish.append`, the outage retry
(:mod:`sow_redis.publish.retry`), the :class:`~sow_redis.client.Sow` facade and the CLI."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import SowError, refusal

if TYPE_CHECKING:  # annotations only: config imports nothing of the publisher
    from ..model.topic import TopicConfig


@dataclass
class Rejected:
    """A message the publisher refused: its position (1-based line or item), reason, detail."""

    position: int
    reason: str
    detail: str


NOT_READ = object()
""":attr:`PublishResult.registry_version` when the version was not read."""


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
        registry_version: with ``append(registry_check=True)``: the registry version
            (:data:`keys.REGISTRY_VERSION`, as stored: bytes, or None when unset) read in the
            same write as the first chunk's entries, after them; :data:`NOT_READ` when
            nothing was sent or the read failed.
    """

    published: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    last_ids: dict[int, str] = field(default_factory=dict)
    skipped: int = 0
    read: int = 0
    registry_version: object = field(default=NOT_READ, repr=False)
    definition: TopicConfig | None = field(default=None, repr=False)
    """The topic's definition read again during the publish, when Redis refused messages
    keyed under the one passed in (a migration; :func:`append`): the later messages, and
    :attr:`last_ids`, are of this definition. None: the one passed in."""
    appended_at: Counter[int] = field(default_factory=Counter, repr=False)
    """Partition → entries this publish appended there."""
    applied_at: Counter[int] = field(default_factory=Counter, repr=False)
    """Partition → entries of this publish applied in the write that appended them
    (write-through: lua/include/apply_appended.lua)."""
    trim_due: set[int] = field(default_factory=set, repr=False)
    """Partitions whose log grew past ``log_max_len`` with this publish: an applier's pass
    there trims it (sow_redis.publish.chunk.Pass.through_done)."""

    @property
    def settled(self) -> set[int]:
        """Partitions of :attr:`last_ids` where this publish left nothing to do: every entry
        it appended there was applied in the same write, and the log needs no trim. A
        handoff skips them (:meth:`sow_redis.client.Sow.handoff_published`)."""
        return {p for p in self.last_ids
                if p not in self.trim_due and self.applied_at[p] == self.appended_at[p] > 0}

    def merge(self, other: PublishResult) -> None:
        """Add ``other``'s counts, rejections and stream ids (a later publish of the same
        input) to this one."""
        self.read += other.read
        self.published += other.published
        self.skipped += other.skipped
        self.rejected += other.rejected
        self.last_ids.update(other.last_ids)
        self.appended_at.update(other.appended_at)
        self.applied_at.update(other.applied_at)
        self.trim_due |= other.trim_due
        if other.registry_version is not NOT_READ:
            self.registry_version = other.registry_version
        if other.definition is not None:
            self.definition = other.definition


class PublishInterrupted(SowError):
    """Redis refused part of a publish (out of memory under ``noeviction``, a read-only
    replica, an ACL refusal): ``result`` (a :class:`PublishResult`) says
    what was appended to the log before and around the refusal (those messages will be
    applied), the rest was not sent; ``cause`` is the refusal."""

    def __init__(self, result: PublishResult, cause: Exception) -> None:
        published = result.published
        super().__init__(f"Redis refused the publish ({refusal(cause)}); {published} "
                         "message(s) were "
                         "appended before that and will be applied, the rest were not sent")
        self.result = result
        self.cause = cause


def interrupted(result: PublishResult, refusal: Exception) -> Exception:
    """What a publish raises when Redis refused a command: PublishInterrupted (with
    ``result``) when something was appended before, else the refusal itself (e.g. the
    NoPermissionError of a user who may not publish, the OutOfMemoryError of a full Redis)."""
    return PublishInterrupted(result, refusal) if result.published else refusal
