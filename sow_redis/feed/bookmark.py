"""Bookmarks: a topic's position in its change feed.

A topic's changes are numbered per partition (``seq``: every change moves its partition's
sequence by one; see :mod:`sow_redis.model.events`). A **bookmark** holds, for each partition, the
``seq`` of the last change already seen; a subscription resumed from it receives every change
after it, and none before. It prints as one opaque string, comma-separated per partition (the
form the seeds/002 bookmark store reads back), each position as 12 hexadecimal digits, so that
bookmarks of one topic sort as strings in the order of their positions::

    000000000011,00000000002a,000000000000,…

Special values a subscriber accepts instead (AMPS bookmark subscriptions):
``EPOCH`` (all that the change feed retains), ``NOW`` (only what comes next), ``RECENT`` (the
most recent bookmark of the subscription in the bookmark store), or an ISO-8601 time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import BookmarkError

WIDTH = 12
"""Hex digits per partition position."""

SPECIAL = ("EPOCH", "NOW", "RECENT")

_POSITION = re.compile(r"[0-9a-fA-F]{1,16}")


def position_text(seq: int) -> str:
    """One partition's position as it prints in a bookmark (:data:`WIDTH` hex digits)."""
    return f"{seq:0{WIDTH}x}"


@dataclass(frozen=True)
class Bookmark:
    """Per-partition positions (``seqs[p]``: last seq seen in partition ``p``; 0 = none)."""

    seqs: tuple[int, ...]

    def __str__(self) -> str:
        return ",".join(map(position_text, self.seqs))

    @classmethod
    def epoch(cls, partitions: int) -> Bookmark:
        """Before every change."""
        return cls((0,) * partitions)

    @classmethod
    def parse(cls, text: str, partitions: int) -> Bookmark:
        """A bookmark string of a topic with ``partitions`` partitions.

        Raises:
            BookmarkError: not a bookmark string, or one of another number of partitions.
        """
        parts = text.strip().split(",")
        if not all(_POSITION.fullmatch(x) for x in parts):
            raise BookmarkError(f"not a bookmark: {text[:80]!r} (expected {partitions} "
                                "comma-separated hex positions, EPOCH, NOW, RECENT or an "
                                "ISO-8601 time)")
        if len(parts) != partitions:
            raise BookmarkError(f"bookmark {text[:80]!r} has {len(parts)} positions; the topic "
                                f"has {partitions} partitions")
        return cls(tuple(int(x, 16) for x in parts))

    def at(self, p: int, seq: int) -> Bookmark:
        """This bookmark with partition ``p`` at ``seq``."""
        seqs = list(self.seqs)
        seqs[p] = seq
        return Bookmark(tuple(seqs))

    def covers(self, other: Bookmark) -> bool:
        """True when every position is at or after ``other``'s."""
        return all(a >= b for a, b in zip(self.seqs, other.seqs))
