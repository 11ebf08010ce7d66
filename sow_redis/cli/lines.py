"""Reading the input of ``sow-redis publish``: lines of a file, or blocks of the lines that
arrived on a pipe; over-long lines read past, never held whole; Ctrl-C ending the reading."""

from __future__ import annotations

import os
import select
import signal
import stat
import threading
import time
from collections.abc import Iterator
from typing import BinaryIO

LINE_SLACK = 65_536
"""Bytes a publish line may hold beyond the topic's ``max_message_bytes`` (an envelope's
``$sow`` options). A longer line is never held in memory whole: see :func:`lines`."""


OVERLONG = b"\x00"
"""What :func:`lines` gives in place of an over-long line: no JSON, FIX or envelope text,
so the publisher rejects it, and :func:`_publish` reports it as ``too_large``."""


def lines(fh: BinaryIO, limit: int, overlong: dict[int, int]) -> Iterator[bytes]:
    """The lines of ``fh`` without their line break. A line longer than ``limit`` bytes is
    never held whole: it is read past in 1 MiB chunks, given as :data:`OVERLONG`, and its
    1-based number and size in bytes are put in ``overlong``."""
    n = 0
    while line := fh.readline(limit + 1):
        n += 1
        if len(line) > limit and not line.endswith(b"\n"):
            size = len(line)
            while (rest := fh.readline(1 << 20)) and not rest.endswith(b"\n"):
                size += len(rest)
            overlong[n] = size + len(rest.rstrip(b"\r\n"))
            yield OVERLONG
        else:
            yield line.rstrip(b"\r\n")


STREAM_FLUSH_S = 0.2
"""Longest time in seconds a line read from a pipe or terminal waits before it is published
(``tail -f log | sow-redis publish -t T -``): what has arrived by then is sent."""


STREAM_MAX_LINES = 50_000
"""Most lines from a pipe published in one :func:`~sow_redis.publish.append.append` call (a fast
pipe is published in blocks of at most this many lines or :data:`STREAM_FLUSH_S`)."""


class Interrupt:
    """Ctrl-C while ``publish`` reads its input: the first SIGINT only sets :attr:`hit`, so
    reading stops at the next line and what was read is still sent and counted; a second
    one raises KeyboardInterrupt (as :meth:`hard` does for the first one once reading is
    over). Restores the previous handler on exit."""

    def __init__(self) -> None:
        self.hit = False
        self._hard = False

    def _handler(self, *_a: object) -> None:
        if self.hit or self._hard:
            raise KeyboardInterrupt
        self.hit = True

    def hard(self) -> None:
        """From now on Ctrl-C raises KeyboardInterrupt at once."""
        self._hard = True

    def __enter__(self) -> Interrupt:
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def is_stream(fh: BinaryIO) -> bool:
    """Whether ``fh`` is a pipe, socket or terminal (lines arrive over time), not a file."""
    try:
        return not stat.S_ISREG(os.fstat(fh.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False  # no file descriptor (a test's BytesIO): read as a file


class _Splitter:
    """Complete lines out of the bytes read from a pipe, as :func:`lines` gives them: a line
    longer than ``limit`` bytes is read past (never held whole), given as :data:`OVERLONG`
    and its 1-based number and size in bytes put in ``overlong``."""

    def __init__(self, limit: int, overlong: dict[int, int]) -> None:
        self.limit, self.overlong = limit, overlong
        self.buf = bytearray()
        self.n = 0  # lines numbered so far
        self.skipping = -1  # bytes of an over-long line read past so far, -1: none

    def split(self, block: list[bytes]) -> None:
        """Move the complete lines of the buffer to ``block``."""
        buf = self.buf
        while True:
            nl = buf.find(b"\n")
            if self.skipping >= 0:
                if nl < 0:
                    self.skipping += len(buf)
                    buf.clear()
                    return
                self._overlong(block, self.skipping + len(buf[:nl].rstrip(b"\r")))
                self.skipping = -1
            elif nl < 0:
                if len(buf) > self.limit:
                    self.skipping = len(buf)
                    buf.clear()
                return
            elif nl > self.limit:
                self._overlong(block, len(buf[:nl].rstrip(b"\r")))
            else:
                self.n += 1
                block.append(bytes(buf[:nl]).rstrip(b"\r"))
            del buf[:nl + 1]

    def finish(self, block: list[bytes]) -> None:
        """At end of input: the last line, without a line break, to ``block``."""
        if self.skipping >= 0:
            self._overlong(block, self.skipping + len(self.buf))
        elif self.buf:
            block.append(bytes(self.buf).rstrip(b"\r"))

    def _overlong(self, block: list[bytes], size: int) -> None:
        self.n += 1
        self.overlong[self.n] = size
        block.append(OVERLONG)


def stream_blocks(fd: int, limit: int, overlong: dict[int, int], stop: Interrupt,
                  flush_s: float = STREAM_FLUSH_S,
                  max_lines: int = STREAM_MAX_LINES) -> Iterator[list[bytes]]:
    """The lines arriving on ``fd`` (a pipe), in blocks: a block is given once
    ``flush_s`` seconds have passed since its first line arrived, at ``max_lines`` lines, or
    at end of input, so a slow stream is published as it comes. Lines as :func:`lines`
    gives them (an over-long one as :data:`OVERLONG`, noted in ``overlong``). Stops at
    end of input or when ``stop.hit`` (checked at least every ``flush_s`` seconds)."""
    splitter = _Splitter(limit, overlong)
    block: list[bytes] = []
    deadline = 0.0
    eof = False
    while True:
        if stop.hit:  # Ctrl-C: send the lines taken so far, nothing more
            if block:
                yield block
            return
        empty = not block
        splitter.split(block)
        if empty and block:  # the block's first line arrived now
            deadline = time.monotonic() + flush_s
        if eof:
            splitter.finish(block)
            if block:
                yield block
            return
        now = time.monotonic()
        if block and (len(block) >= max_lines or now >= deadline):
            yield block
            block = []
            continue
        wait = min(flush_s, deadline - now) if block else flush_s
        readable, _w, _x = select.select([fd], [], [], max(0.0, wait))
        if readable:
            data = os.read(fd, 1 << 16)
            if data:
                splitter.buf += data
            else:
                eof = True


def rest_of(fh: BinaryIO) -> int | None:
    """Lines left unread in the file ``fh`` (counted now); None for a stream."""
    if is_stream(fh) or not fh.seekable():
        return None
    n, last = 0, b"\n"
    while chunk := fh.read(1 << 20):
        n += chunk.count(b"\n")
        last = chunk[-1:]
    return n + (last != b"\n")
