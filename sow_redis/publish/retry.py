"""Publishing through a Redis outage, in blocks: the one retry loop of every publisher that
must keep going (``Sow(retry_s=…)``, ``sow-redis publish --retry-s``; :mod:`sow_redis.outage`
reports the outage and backs off)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Iterator

from ..connection import Client
from ..model.topic import TopicConfig
from ..outage import RETRY_CHUNK, call_through_outage
from ..settings import Settings
from .append import append
from .result import PublishInterrupted, PublishResult
from .validate import Item


def append_blocks(r: Client, topic: TopicConfig, blocks: Iterable[Iterable[Item]],
                  retry_s: float = 0.0, *, start: int = 1,
                  stop: Callable[[], bool] | None = None,
                  on_chunk: Callable[[int], None] | None = None,
                  fix_separator: bytes | None = None, jobs: Settings | None = None,
                  durable: bool = False, registry_check: bool = False,
                  inline: Settings | None = None) -> PublishResult:
    """:func:`~sow_redis.publish.append.append` of each block of items in turn, with one
    merged result: positions count on across blocks (from ``start``), and each block is
    keyed by the definition the blocks before it ended with (:attr:`PublishResult.definition`:
    read again across a migration).

    With ``retry_s`` > 0, the publish rides out a Redis outage of up to ``retry_s`` seconds:
    each block goes in parts of :data:`~sow_redis.outage.RETRY_CHUNK` items, and a part that
    fails because Redis does not answer is sent again after a backoff
    (:func:`~sow_redis.outage.call_through_outage`: :data:`~sow_redis.outage.BACKOFF_MIN_S`
    doubling to :data:`~sow_redis.outage.BACKOFF_MAX_S`), the outage reported once
    (:func:`~sow_redis.outage.reporter` ``publisher``). Delivery across an outage is at
    least once: the messages of a part whose connection broke after Redis had appended some
    of them are appended again. A publish, a delta_publish (the same fields merged again) and
    a sow_delete give the same SOW when applied twice; a subscriber sees such a message twice.

    Args:
        blocks: the items, in blocks (e.g. the lines that arrived on a pipe within 0.2 s).
        retry_s: seconds an outage may last before its error is raised (0: at once).
        stop: asked after each block; True: the rest is not read.
        on_chunk, fix_separator, jobs, durable, registry_check, inline: as for
            :func:`~sow_redis.publish.append.append`.

    Returns:
        The merged :class:`PublishResult` of every block.

    Raises:
        PublishInterrupted: Redis refused a command after something was appended (its
            ``result`` counts the earlier blocks too); redis.exceptions.ConnectionError,
            TimeoutError: Redis did not answer for ``retry_s`` seconds (the earlier parts are
            in the log); as :func:`~sow_redis.publish.append.append` otherwise.
    """
    result = PublishResult()
    for block in blocks:
        for part in _parts(block, retry_s):
            send = functools.partial(
                append, r, result.definition or topic, part, start=start + result.read,
                on_chunk=on_chunk, fix_separator=fix_separator, jobs=jobs, durable=durable,
                registry_check=registry_check, inline=inline)
            try:
                result.merge(call_through_outage(send, retry_s))
            except PublishInterrupted as exc:  # count the earlier blocks too
                result.merge(exc.result)
                raise PublishInterrupted(result, exc.cause) from exc.cause
        if stop is not None and stop():
            break
    return result


def _parts(block: Iterable[Item], retry_s: float) -> Iterator[Iterable[Item]]:
    """``block`` itself (no retry), or its items in lists of at most
    :data:`~sow_redis.outage.RETRY_CHUNK` (each sent again whole after an outage)."""
    if retry_s <= 0:
        yield block
        return
    it = iter(block)
    while part := list(itertools.islice(it, RETRY_CHUNK)):
        yield part


def append_through_outage(r: Client, topic: TopicConfig, items: Iterable[Item], retry_s: float,
                          *, start: int = 1, on_chunk: Callable[[int], None] | None = None,
                          fix_separator: bytes | None = None, jobs: Settings | None = None,
                          durable: bool = False,
                          registry_check: bool = False) -> PublishResult:
    """:func:`~sow_redis.publish.append.append` that rides out a Redis outage of up to
    ``retry_s`` seconds: :func:`append_blocks` of ``items`` as one block (same arguments,
    result and errors)."""
    return append_blocks(r, topic, [items], retry_s, start=start, on_chunk=on_chunk,
                         fix_separator=fix_separator, jobs=jobs, durable=durable,
                         registry_check=registry_check)
