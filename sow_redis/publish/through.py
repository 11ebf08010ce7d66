"""Write-through: the publisher's side of apply.lua (operation ``appended``), which appends a
partition's entries of one chunk, records them as trusted and, where the partition is caught
up, applies them in the same call (ARCHITECTURE §3; ``lua/include/apply_appended.lua``)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from .. import keys
from ..apply.jobs import enqueue_job, ensure_jobs, job_marker_value
from ..apply.scripts import OP_ARGS, ScriptArg, Scripts, attached, pack_entries
from ..connection import Client, Fields
from ..model.topic import TopicConfig
from .commands import Command, send_commands
from .wire import resp

if TYPE_CHECKING:
    from .chunk import Chunk, Pass

log = logging.getLogger(__name__)

Taken = tuple[int, str, bool, int]
"""What one write-through call did: entries applied, stream id of the last entry appended,
job marker set, the log's length after it."""


class WriteThrough:
    """The publisher's side of apply.lua (appended), one per client (:func:`write_through`):
    the script is loaded once (``SCRIPT LOAD``) and then sent as a bare EVALSHA per partition
    in each chunk's write, carrying that partition's entries, which it appends and applies
    (when the partition is caught up) or leaves to the workers, setting the job marker
    (then :func:`~sow_redis.publish.append.append` enqueues a job). An error reply (no right
    to run scripts, the server lost its script cache, out of memory) appended nothing: those
    entries are then appended with XADD; it is logged once per kind."""

    def __init__(self, r: Client) -> None:
        self._scripts = Scripts(r)
        self._loaded = False
        self._warned: set[str] = set()
        self._packed: dict[tuple[str, int, int, bool], tuple[TopicConfig, bytes, bytes]] = {}
        self.applied = 0
        """Entries this client applied by write-through (for benchmarks and tests)."""
        self.refused = False
        """True once the server refused the script to this client's user (ACL ``NOPERM``,
        e.g. the ``publisher`` role): its later chunks are appended with XADD."""

    @property
    def loaded(self) -> bool:
        """True once the script was loaded (and not lost since)."""
        return self._loaded

    def load(self) -> None:
        """``SCRIPT LOAD`` the script (before sending it as a bare EVALSHA).

        Raises:
            NoPermissionError: the client's user may not run scripts.
        """
        self._scripts.load("apply")
        self._loaded = True

    def call(self, topic: TopicConfig, p: int, entries: Sequence[Fields],
             marker_ttl_ms: int, job_id: str, through: bool = True) -> list[ScriptArg]:
        """The EVALSHA arguments (after the command name) appending ``entries`` to partition
        ``p`` (applied there with ``through`` when the partition is caught up); the script
        sets the job marker to ``job:<job_id>`` (lifetime ``marker_ttl_ms`` milliseconds)
        when it leaves entries to the workers and no job was outstanding (``job_id`` "": no
        marker).

        Raises:
            NoPermissionError: loading the script was refused.
        """
        if not self._loaded:
            self.load()
        sha, ks, argv = self._scripts.apply_appended_call(
            topic, p, pack_entries(entries), marker_ttl_ms, through,
            job_marker_value(job_id) if job_id else "")
        return [sha, len(ks), *ks, *argv]

    def packed(self, topic: TopicConfig, p: int, entries: Sequence[Fields],
               marker_ttl_ms: int, job_id: str, through: bool = True) -> bytes:
        """The EVALSHA of :meth:`call` packed as RESP. Only the entries and the job id differ
        from one chunk to the next: the rest is packed once per topic definition and
        partition (packing the ~20 arguments took a fifth of a small publish's time)."""
        if not self._loaded:
            self.load()
        key = (topic.name, p, marker_ttl_ms, through)
        hit = self._packed.get(key)
        if hit is None or (hit[0] is not topic and hit[0] != topic):
            args = [b"EVALSHA", *self.call(topic, p, [], marker_ttl_ms, "", through)]
            # the entries: the operation's first argument (lua/include/apply_appended.lua),
            # then its marker lifetime and write-through flag, then the marker value, last
            at = 3 + int(args[2]) + OP_ARGS
            hit = (topic, b"*%d\r\n" % len(args) + resp(args[:at], header=False),
                   resp(args[at + 1:-1], header=False))
            self._packed[key] = hit
        data = pack_entries(entries)
        value = job_marker_value(job_id).encode() if job_id else b""
        return (hit[1] + b"$%d\r\n%s\r\n" % (len(data), data) + hit[2]
                + b"$%d\r\n%s\r\n" % (len(value), value))

    def settle(self, topic: TopicConfig, reply: object) -> Taken | str | None:
        """Take the reply of one write-through call.

        Returns:
            ``(entries applied, stream id of the last entry appended, job marker set, the
            log's length after the call)``;
            the reason (``migrating``, ``absent``, ``dropped``, ``changed``) when the
            definition fence refused the call; None for an error reply (in both cases
            nothing was appended).
        """
        if isinstance(reply, ResponseError):
            # redis-py takes the code (NOSCRIPT, NOPERM) off the text of its own classes
            if isinstance(reply, NoScriptError):
                self._loaded = False
            elif isinstance(reply, NoPermissionError):
                self.refused = True
            if isinstance(reply, (NoScriptError, NoPermissionError)):
                self._warn(topic, type(reply).__name__, f"write-through failed ({reply}); "
                           "the entries are appended with XADD and applied by the workers")
            return None
        parts = cast("list[bytes | int]", reply)
        if int(parts[0]) < 0:
            why = parts[1]
            return why.decode() if isinstance(why, bytes) else str(why)
        applied, last, marked, error, log_len = parts
        if error:
            self._warn(topic, "apply", f"write-through apply failed ({error!r}); the workers "
                       "apply those entries")
        self.applied += int(applied)
        return (int(applied), last.decode() if isinstance(last, bytes) else str(last),
                bool(marked), int(log_len))

    def _warn(self, topic: TopicConfig, kind: str, text: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("topic %s: %s", topic.name, text)


class _NoFake:
    """A class no client is an instance of (fakeredis is not loaded)."""


def fake_redis_class() -> type:
    """fakeredis's client class (``memory://``: its Lua runs no flagged script), or a class
    no client is an instance of when fakeredis is not loaded (made once: making a class
    costs about as much as the rest of a small publish's client-side work)."""
    fake = sys.modules.get("fakeredis")
    return fake.FakeRedis if fake is not None else _NoFake


def write_through(r: Client) -> WriteThrough | None:
    """The appender of client ``r`` (its entries are appended by apply.lua (appended), which
    records them as trusted and writes them through where asked), or None where the server
    runs no script for this client's user (the ACL ``publisher`` role: plain XADD) and on
    ``memory://`` (fakeredis runs no MessagePack in Lua)."""
    if isinstance(r, fake_redis_class()):
        return None
    through = cast(WriteThrough, attached(r, "write_through", WriteThrough))
    if not through.refused and not through.loaded:
        try:
            through.load()
        except NoPermissionError:  # e.g. the ACL publisher role: no scripts
            through.refused = True
    return None if through.refused else through


def settle_calls(state: Pass, through: WriteThrough, chunk: Chunk, job_ids: dict[int, str],
                 replies: list[object], durable: bool = False) -> None:
    """Take the replies of one chunk's write-through calls (one per partition of ``chunk``,
    ascending): count what was appended, enqueue a job (id ``job_ids[p]``) where a call set
    the job marker, and append the entries of each call the server could not run (no
    script, no right to run it: an error reply appended nothing) with plain XADDs (with
    ``durable``: confirmed by a replica), making sure of a job for them. A call the
    definition fence refused (nothing appended) puts its items in ``state.fenced``; a call
    Redis refused for its own state (out of memory, read-only …; nothing of it was appended,
    and it is not appended otherwise either) is kept as ``state.refused``.

    Raises:
        NotDurableError: with ``durable``, no replica confirmed the XADDs in time.
    """
    retry: dict[int, list[Fields]] = {}
    items = chunk.items_of()
    for (p, entries), reply in zip(chunk.by_partition().items(), replies):
        taken = through.settle(state.topic, reply)
        if isinstance(taken, str):
            state.fenced.refuse(p, taken, items[p])
        elif taken is not None:
            applied, last, marked, log_len = taken
            state.appended(p, last, len(entries))
            if marked and state.jobs is not None:
                enqueue_job(state.r, state.topic.name, p, behind=len(entries) - applied,
                            job_id=job_ids[p])
            state.through_done(p, len(entries), applied, log_len)
        elif isinstance(reply, (NoScriptError, NoPermissionError)):
            retry[p] = entries
        else:
            state.refuse(cast(ResponseError, reply))
    if retry:
        _append_refused_calls(state, retry, durable)


def _append_refused_calls(state: Pass, retry: dict[int, list[Fields]], durable: bool) -> None:
    """Append with XADD the entries of the write-through calls the server could not run
    (``retry``: partition → entries), every reply read (not durable: what was appended is
    counted even when Redis refused some), and make sure of a job for each partition."""
    topic = state.topic
    order = [(p, e) for p, entries in sorted(retry.items()) for e in entries]
    commands: list[Command] = [("xadd", (keys.log(topic.name, p), e), {}) for p, e in order]
    try:
        ids = send_commands(state.r, commands, durable, tolerate=not durable)
    except ResponseError as exc:  # durable: what the chunk appended is unknown
        state.refuse(exc)
        return
    appended: set[int] = set()
    for (p, _e), sid in zip(order, ids):
        if isinstance(sid, ResponseError):
            state.refuse(sid)
        elif not isinstance(sid, Exception):
            state.appended(p, sid)
            appended.add(p)
    if appended and state.jobs is not None:
        ensure_jobs(state.r, topic.name, sorted(appended), state.jobs,
                    behind={p: len(entries) for p, entries in retry.items()})
