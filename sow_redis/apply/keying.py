"""SOW keys of log entries: one resolver interface, two implementations.

* :class:`PlainKeys`: the key generated from the topic's key fields (or the publisher's key on
  a topic without key fields), AMPS User Guide ch. 7 "SOW Keys", seeds/004.
* :class:`ChainKeys`: the chaining key generator (seeds/003): the key of the chain the entry
  belongs to, resolved against the partition's chain table with a batch look-ahead (one
  HMGET for every identifier of the batch), new identifiers recorded in the batch's view.

A worker calls :meth:`KeyResolver.prepare` once with a batch's entries, then
:meth:`KeyResolver.resolve` for each entry in log order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..connection import Client
from ..errors import MessageError
from ..model.chains import ChainIds, chain_values
from ..model.chains import sow_key as chain_sow_key
from ..model.entries import Command, LogEntry
from ..model.messages import check_supplied_key, index_members, key_of, partition_for
from ..model.topic import TopicConfig
from .chaining import ChainResolver


@dataclass(slots=True)
class Resolved:
    """An entry's SOW key, and the chain-table entries ``(identifier, head)`` its apply must
    write (chaining topics only)."""

    sow_key: str
    links: list[tuple[str, str]] = field(default_factory=list)


class KeyResolver(Protocol):
    """Resolves the SOW keys of one partition's log entries, in log order."""

    def prepare(self, entries: Sequence[LogEntry]) -> None:
        """Look ahead over a batch (e.g. read every chain identifier at once)."""

    def resolve(self, entry: LogEntry) -> Resolved:
        """The SOW key of an entry carrying a message (publish, delta_publish, sow_delete by
        data). Raises MessageError (missing key field, bad SOW key, wrong partition, two
        chains)."""


def _check_partition(obj: dict[str, Any], topic: TopicConfig, key: str, p: int) -> None:
    part = partition_for(obj, topic, key)
    if part != p:
        raise MessageError("wrong_partition", f"message belongs to partition {part}")


def verified_prepared(entry: LogEntry, topic: TopicConfig, p: int) -> bool:
    """True when ``entry`` is a plain ``publish`` that apply.lua (log) may apply from the log
    itself: it carries the SOW key (field ``k``) and, on a topic with hash indexes, the index
    members (``m``) that the topic's definition gives for its data in partition ``p``, and no
    message expiration. False for anything else (the worker plans it, rejecting a forged
    ``k`` or ``m`` to the error stream with its reason)."""
    if (entry.command is not Command.PUBLISH or entry.prepared_key is None
            or entry.obj is None or entry.expiration_s is not None or topic.chaining):
        return False
    try:
        key = key_of(entry.obj, topic, entry.sow_key)
        if key != entry.prepared_key or partition_for(entry.obj, topic, key) != p:
            return False
    except MessageError:
        return False
    if not topic.n_indexes:
        return b"m" not in entry.fields
    return entry.fields.get(b"m") == index_members(entry.obj, topic, key).encode()


def check_members(entry: LogEntry, topic: TopicConfig, key: str) -> None:
    """Refuse index members (field ``m``) that are not those the topic's definition gives
    for the entry's data: only a ``publish`` on a topic with hash indexes carries them.

    Raises:
        MessageError: ``forged_members``.
    """
    given = entry.fields.get(b"m")
    if given is None:
        return
    if entry.command is Command.PUBLISH and topic.n_indexes and entry.obj is not None \
            and given == index_members(entry.obj, topic, key).encode():
        return
    raise MessageError("forged_members", f"field m {given[:80]!r} is not the index "
                       "members of the data")


class PlainKeys:
    """Generated keys (key fields + key domain) or publisher-supplied keys."""

    def __init__(self, topic: TopicConfig, p: int) -> None:
        self.topic, self.p = topic, p

    def prepare(self, entries: Sequence[LogEntry]) -> None:
        pass

    def resolve(self, entry: LogEntry) -> Resolved:
        assert entry.obj is not None
        key = key_of(entry.obj, self.topic, entry.sow_key)
        _check_partition(entry.obj, self.topic, key, self.p)
        if entry.prepared_key is not None and entry.prepared_key != key:
            # a publisher's "k" is a hint, checked here, never taken on trust (ARCHITECTURE §3)
            raise MessageError("forged_key", f"field k {entry.prepared_key[:80]!r} is not the "
                               f"SOW key of the data ({key})")
        return Resolved(key)


class ChainKeys:
    """The chaining key generator over the partition's chain table (seeds/003)."""

    def __init__(self, r: Client, topic: TopicConfig, p: int) -> None:
        self.topic, self.p = topic, p
        self.chains = ChainResolver(r, topic, p)
        self._ids: dict[str, ChainIds] = {}

    def prepare(self, entries: Sequence[LogEntry]) -> None:
        ids = []
        for e in entries:
            if e.obj is None:
                continue
            try:
                self._ids[e.id] = chain_values(e.obj, self.topic)
            except MessageError:
                continue  # rejected with its reason by resolve()
            ids.append(self._ids[e.id])
        self.chains.load(ids)

    def resolve(self, entry: LogEntry) -> Resolved:
        assert entry.obj is not None
        if entry.prepared_key is not None:
            raise MessageError("forged_key", "field k on a chaining topic: the SOW key of a "
                               "chain is resolved by the workers, never supplied")
        check_supplied_key(self.topic, entry.sow_key)
        _check_partition(entry.obj, self.topic, "", self.p)
        res = self.chains.resolve(entry.obj, self._ids.pop(entry.id, None))
        key = chain_sow_key(self.topic, res.head)
        if entry.command is Command.SOW_DELETE:  # deletes leave the chains as they are
            return Resolved(key)
        return Resolved(key, self.chains.commit(res))


def resolver(r: Client, topic: TopicConfig, p: int) -> KeyResolver:
    """The key resolver of ``topic``'s partition ``p``."""
    return ChainKeys(r, topic, p) if topic.chaining else PlainKeys(topic, p)
