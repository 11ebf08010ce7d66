"""Chain identifiers of a message (the chaining key generator, AMPS
libamps_id_chaining_key_generator; seeds/003): the pure part, no Redis.

A message's primary value (FIX 11 ClOrdID) and secondary values (FIX 41 OrigClOrdID) as
canonical text (:func:`chain_values`), the SOW key of a chain from its head (:func:`sow_key`),
and the error of a message that resolves to two chains (:class:`ChainConflict`). The lookups
in the partition's chain table are :mod:`sow_redis.apply.chaining`.
"""

from __future__ import annotations

import orjson

from ..errors import MessageError
from .sowkey import generate
from .topic import TopicConfig
from .values import JSONObject, canonical, get_path


class ChainConflict(MessageError):
    """A message resolves to two or more chains (seeds/003: it is not processed)."""

    def __init__(self, heads: list[str], ids: dict[str, str]) -> None:
        self.heads = heads
        self.ids = ids
        named = ", ".join(f"{path}={v!r}" for path, v in ids.items())
        super().__init__("two_chains", f"message resolves to {len(heads)} chains with heads "
                         f"{', '.join(repr(h) for h in heads)} ({named})")


ChainIds = tuple["str | None", "list[str]"]
"""A message's chaining identifiers: (primary value or None, secondary values present)."""


def chain_values(obj: JSONObject, topic: TopicConfig) -> ChainIds:
    """``(primary value or None, secondary values present)`` as canonical text.

    Raises:
        MessageError: ``missing_key_field`` when the primary and every secondary are absent.
    """
    parts = topic.chain_parts
    vals: list[str | None] = []
    for p in parts:
        v = obj.get(p[0]) if len(p) == 1 else get_path(obj, p)
        vals.append(v if type(v) is str else canonical(v))
    secondary = [v for v in vals[1:] if v is not None]
    if vals[0] is None and not secondary:
        raise MessageError("missing_key_field", "chaining key fields "
                           f"{', '.join(topic.chain_fields)} are all missing or null")
    return vals[0], list(dict.fromkeys(secondary))


def sow_key(topic: TopicConfig, head: str) -> str:
    """The SOW key of a chain: generated from its head as a primary-field value."""
    return generate(topic.domain, [head])


def conflict_report(p: int, stream_id: str, exc: ChainConflict) -> tuple[str, bytes]:
    """The :func:`keys.chain_conflicts` field and value kept for one conflict."""
    return f"{p}:{stream_id}", orjson.dumps({"partition": p, "id": stream_id,
                                            "heads": exc.heads, "ids": exc.ids})
