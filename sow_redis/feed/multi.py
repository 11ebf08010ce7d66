"""Several subscriptions read as one (topic patterns: ``subscribe -t 'ord.*'``; issue 25.4).

Each subscription keeps its own order, positions and recovery; messages of different topics
interleave as they arrive (each message names its ``topic``).
"""

from __future__ import annotations

import time

from ..model.topic import TopicConfig
from .reader import Message, MessageReader
from .subscriber import Subscriber

POLL_S = 0.005
"""Seconds each subscription is waited for in turn while none has a message."""


class MultiSubscriber(MessageReader):
    """Messages of ``subs`` (each a :class:`~sow_redis.feed.subscriber.Subscriber`), the
    one with a message first, in turn."""

    def __init__(self, subs: list[Subscriber]) -> None:
        self.subs = subs
        self.topics: list[TopicConfig] = [s.topic for s in subs]
        self._next = 0

    def get(self, timeout: float = 1.0) -> Message | None:
        """The next message of any subscription, or None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            for _ in range(len(self.subs)):
                sub = self.subs[self._next]
                self._next = (self._next + 1) % len(self.subs)
                msg = sub.get(POLL_S)
                if msg is not None:
                    return msg
            if time.monotonic() >= deadline:
                return None

    def close(self) -> None:
        """Close every subscription."""
        for sub in self.subs:
            sub.close()
