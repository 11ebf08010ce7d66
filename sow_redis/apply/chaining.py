"""The chaining key generator (AMPS libamps_id_chaining_key_generator; seeds/003).

Messages carry a primary field that identifies the message (FIX 11 ClOrdID) and secondary
fields that name the message it updates (FIX 41 OrigClOrdID). Every identifier of a chain
maps to the chain's head in the partition's chain table (:func:`keys.chain`, a Redis hash
that persists with Redis), and the SOW key is generated from the head, so every message of a
chain updates one record:

* a primary value in no chain, with no secondary value, starts a chain (it is the head);
* a secondary value in a chain makes the message an update of that chain, and the message's
  primary value joins the chain, so later messages can refer to it;
* a secondary value in no chain is taken "as though the message contained a primary field
  with this value" (seeds/003): it becomes the head of a new chain that the primary joins;
* a primary value already in a chain updates that chain;
* a message whose identifiers resolve to two or more chains is an error: it is not applied
  and goes to the topic's error stream naming every head (reason ``two_chains``). With
  ``validation = true`` the conflict is also kept in :func:`keys.chain_conflicts`, from which
  :func:`conflict_groups` reports the chains that would have been one chain had the messages
  arrived in another order.

Lookups run in the worker, which owns the partition through its lease; the new table entries
are written by the same apply.lua call that applies the message, so the chain table and the
SOW never disagree, and a replayed batch writes the same entries.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import cast

import orjson

from .. import keys
from ..connection import Client
from ..model.chains import ChainConflict, ChainIds, chain_values, sow_key
from ..model.topic import TopicConfig
from ..model.values import JSONObject, canonical, get_path


@dataclass
class Resolution:
    """A message's chain: its head and the identifiers that join the chain with it."""

    head: str
    new_ids: list[str]


class ChainResolver:
    """Chain lookups for one partition while a worker plans a batch.

    :meth:`load` reads the batch's identifiers in one HMGET; :meth:`resolve` then works on
    that view plus the entries planned so far (:meth:`commit`), so a message can refer to an
    identifier introduced earlier in the same batch.
    """

    def __init__(self, r: Client, topic: TopicConfig, p: int) -> None:
        self.r = r
        self.topic = topic
        self.key = keys.chain(topic.name, p)
        self.table: dict[str, str | None] = {}

    def load(self, ids: list[ChainIds]) -> None:
        """Read the chain heads of every identifier in ``ids`` (as given by
        :func:`chain_values`) not read yet."""
        wanted: list[str] = []
        for primary, secondary in ids:
            for v in (primary, *secondary):
                if v is not None and v not in self.table:
                    wanted.append(v)
        wanted = list(dict.fromkeys(wanted))
        if wanted:
            for v, head in zip(wanted, cast("list[bytes | None]", self.r.hmget(self.key, wanted))):
                self.table[v] = head.decode() if head is not None else None

    def _head_of(self, v: str) -> str | None:
        if v not in self.table:
            head = cast("bytes | None", self.r.hget(self.key, v))
            self.table[v] = head.decode() if head is not None else None
        return self.table[v]

    def resolve(self, obj: JSONObject, ids: ChainIds | None = None) -> Resolution:
        """The chain of a message (nothing is recorded until :meth:`commit`).

        Args:
            ids: the message's :func:`chain_values` when already computed.

        Raises:
            MessageError: ``missing_key_field``.
            ChainConflict: the identifiers belong to two or more chains.
        """
        primary, secondary = ids if ids is not None else chain_values(obj, self.topic)
        idents = list(dict.fromkeys([*secondary, primary] if primary is not None else secondary))
        heads: list[str] = []
        new_ids: list[str] = []
        for v in idents:
            h = self._head_of(v)
            if h is None:
                new_ids.append(v)
            elif h not in heads:
                heads.append(h)
        if len(heads) > 1:
            named = {}
            paths = self.topic.chain_fields
            for path, part in zip(paths, self.topic.chain_parts):
                val = obj.get(part[0]) if len(part) == 1 else get_path(obj, part)
                if val is not None:
                    named[path] = canonical(val) if type(val) is not str else val
            raise ChainConflict(heads, named)  # type: ignore[arg-type]
        # no chain yet: a secondary value heads the new chain as though it were the primary
        head = heads[0] if heads else (secondary[0] if secondary else primary)
        return Resolution(head, new_ids)  # type: ignore[arg-type]

    def commit(self, res: Resolution) -> list[tuple[str, str]]:
        """Record a resolution in this batch's view; returns the ``(identifier, head)``
        entries the apply call must write to the chain table."""
        for v in res.new_ids:
            self.table[v] = res.head
        return [(v, res.head) for v in res.new_ids]

    def fork(self) -> ChainResolver:
        """A copy of the current view, for look-ahead that must not change this one."""
        other = copy.copy(self)
        other.table = dict(self.table)
        return other


def conflict_groups(r: Client, topic: TopicConfig) -> list[JSONObject]:
    """Chains that would have been one chain had messages arrived in another order.

    Each recorded conflict links the chains it named; linked chains form a group.

    Returns:
        ``[{"heads": [...], "messages": [stream ids]}]``, largest group first (empty when
        ``validation`` is off or nothing conflicted).
    """
    raw = r.hgetall(keys.chain_conflicts(topic.name))
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    reports = [orjson.loads(v) for v in raw.values()]
    for rep in reports:
        first = rep["heads"][0]
        for h in rep["heads"][1:]:
            parent[find(h)] = find(first)
    groups: dict[str, JSONObject] = {}
    for rep in reports:
        g = groups.setdefault(find(rep["heads"][0]), {"heads": set(), "messages": []})
        g["heads"].update(rep["heads"])
        g["messages"].append(rep["id"])
    out = [{"heads": sorted(g["heads"]), "messages": sorted(g["messages"])}
           for g in groups.values()]
    return sorted(out, key=lambda g: (-len(g["heads"]), g["heads"]))


def chain_of(r: Client, topic: TopicConfig, identifier: str) -> JSONObject | None:
    """The chain an identifier belongs to: ``{"head", "sow_key", "partition", "ids"}`` (ids
    found by scanning the partitions' chain tables), or None when it is in no chain."""
    for p in range(topic.partitions):
        head = cast("bytes | None", r.hget(keys.chain(topic.name, p), identifier))
        if head is None:
            continue
        h = head.decode()
        ids = sorted(k.decode() for k, v in r.hscan_iter(keys.chain(topic.name, p)) if v == head)
        return {"head": h, "sow_key": sow_key(topic, h), "partition": p, "ids": ids}
    return None


def chain_stats(r: Client, topic: TopicConfig) -> dict[str, int]:
    """``{"ids": identifiers in chains, "conflicts": recorded conflicts}`` of a topic."""
    pipe = r.pipeline(transaction=False)
    for p in range(topic.partitions):
        pipe.hlen(keys.chain(topic.name, p))
    pipe.hlen(keys.chain_conflicts(topic.name))
    *ids, conflicts = pipe.execute()
    return {"ids": sum(ids), "conflicts": conflicts}
