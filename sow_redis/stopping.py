"""A stop flag that a signal handler may set.

Python runs a signal handler in the main thread between two bytecodes, possibly while that
thread is inside ``threading.Event.wait`` holding the event's (non-reentrant) condition lock.
A handler that calls ``Event.set()`` then waits for that same lock forever: the process
ignores SIGTERM for good. It happened to an expirer retrying a refused password
(tests/test_secrets.py, once in about a thousand signals). :class:`StopEvent` is an
``Event`` whose :meth:`~StopEvent.request` only assigns an attribute, which takes no lock;
its :meth:`~StopEvent.wait` looks at that attribute at least every :data:`POLL_S` seconds.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterable

POLL_S = 0.05
"""Longest time in seconds between a signal's :meth:`StopEvent.request` and the return of a
:meth:`StopEvent.wait` in progress."""


class StopEvent(threading.Event):
    """``threading.Event`` plus :meth:`request`, safe to call from a signal handler.

    ``set()`` from another thread wakes a waiter at once, as with any Event.
    """

    def __init__(self) -> None:
        super().__init__()
        self._requested = False

    def request(self) -> None:
        """Ask to stop; takes no lock (for signal handlers)."""
        self._requested = True

    def is_set(self) -> bool:
        return self._requested or super().is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until set or requested, or ``timeout`` seconds (None: no limit).

        Returns:
            True when stopping was asked for.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if left <= 0:
                return False
            super().wait(left)
        return True


def stop_on_signals(stop: StopEvent,
                    signals: Iterable[signal.Signals] = (signal.SIGINT, signal.SIGTERM)) -> None:
    """Make each of ``signals`` (default SIGINT and SIGTERM) request ``stop``; main thread only."""
    for sig in signals:
        signal.signal(sig, lambda *_a: stop.request())
