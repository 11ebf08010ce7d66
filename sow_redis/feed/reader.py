"""What every subscription offers around its ``get``: iteration, :meth:`MessageReader.run`
with a callback, and ``with`` blocks (a :class:`~sow_redis.feed.subscriber.Subscriber`, an
aggregated subscription, several subscriptions read as one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Self

from ..model.values import JSONObject

Message = JSONObject
"""A subscription message: a JSON object with a ``kind`` (see :mod:`sow_redis.feed.subscriber`)."""


class MessageReader:
    """The common part of the subscriptions: subclasses give :meth:`get` and :meth:`close`."""

    def get(self, timeout: float = 1.0) -> Message | None:
        """The next message, or None after ``timeout`` seconds without one."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop reading."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[Message]:
        while True:
            msg = self.get(timeout=3600.0)
            if msg is not None:
                yield msg

    def run(self, callback: Callable[[Message], object], count: int | None = None,
            timeout: float | None = None) -> int:
        """Call ``callback`` with each message (processed when it returns) until ``count``
        messages or ``timeout`` seconds without one; returns the messages handled."""
        n = 0
        while count is None or n < count:
            msg = self.get(timeout=timeout if timeout is not None else 3600.0)
            if msg is None:
                if timeout is not None:
                    break
                continue
            callback(msg)
            n += 1
        return n

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
