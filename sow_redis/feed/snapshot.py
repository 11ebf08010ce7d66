"""A frozen copy of one partition's records, read in pages: what lets a query part in batches
(``sow_and_subscribe(batch_size=…)``, issue 25.5) and a historical query in batches
(:mod:`sow_redis.feed.history`) hold one page in the client and still see the partition
exactly as it was at one change sequence.

The records hash is copied (``COPY … REPLACE``) with the partition's seq in one MULTI/EXEC to
``keys.snapshot(topic, p, token)``, in the partition's hash slot; the copy is scanned
(``HSCAN``), each page renewing its lifetime (:data:`SNAPSHOT_TTL_MS`), and deleted by its
reader. Redis holds the copy of one partition meanwhile. Where Redis refuses the copy (an ACL
user without ``COPY``, Redis before 6.2, no memory for it) the caller reads the partition
whole instead.
"""

from __future__ import annotations

import logging
import uuid
from typing import cast

from redis.exceptions import ResponseError

from .. import keys
from ..connection import Client

log = logging.getLogger(__name__)

SNAPSHOT_TTL_MS = 600_000
"""Milliseconds the copy of a partition's records lives after its last page was read
(``keys.snapshot``): a reader that takes longer between two pages finds it gone (a batched
``sow_and_subscribe`` then reads the partition again, with a ``recovery`` message, cause
``snapshot``)."""


def snapshot_name(topic: str, p: int) -> str:
    """A fresh name for a copy of partition ``p``'s records (a random token)."""
    return keys.snapshot(topic, p, uuid.uuid4().hex)


def copy_records(r: Client, topic: str, p: int, copy: str) -> tuple[int, bool] | None:
    """Copy partition ``p``'s records hash to ``copy`` with the partition's seq, in one
    MULTI/EXEC.

    Returns:
        ``(seq, made)``: the partition's change sequence and whether there was a hash to copy
        (none: no records); None when Redis refuses the copy (``ResponseError``: no ``COPY``
        for this user, no memory for it), which is logged (INFO) with Redis's reason.

    Raises:
        redis.exceptions.ConnectionError and other RedisError but ResponseError.
    """
    pipe = r.pipeline(transaction=True)
    pipe.hget(keys.state(topic, p), "seq")
    # REPLACE: a try again after a reply lost in a disconnection finds its own copy there
    pipe.copy(keys.records(topic, p), copy, replace=True)
    pipe.pexpire(copy, SNAPSHOT_TTL_MS)
    try:
        seq_raw, made, _alive = pipe.execute()
    except ResponseError as exc:  # no COPY (ACL, Redis before 6.2), no memory for it
        log.info("%s: partition %d read whole (its records cannot be copied: %s)", topic, p,
                 exc)
        return None
    return int(seq_raw or 0), bool(made)


def scan_page(r: Client, copy: str, cursor: int,
              size: int) -> tuple[int, dict[bytes, bytes], bool]:
    """One ``HSCAN`` page of about ``size`` records of ``copy`` from ``cursor``, renewing the
    copy's lifetime: ``(next cursor, page, whether the copy was still there)``; a next cursor
    of 0 ends the scan."""
    pipe = r.pipeline(transaction=False)
    pipe.pexpire(copy, SNAPSHOT_TTL_MS)
    pipe.hscan(copy, cursor, count=size)
    alive, (cursor, page) = pipe.execute()
    return int(cursor), cast("dict[bytes, bytes]", page), bool(alive)
