"""A topic's definition (:class:`TopicConfig`): the one form every process reads, with the
durations it is written in (:func:`parse_duration_ms`). Pure: no Redis, no TOML.

Parsing and validating the TOML file is :mod:`sow_redis.config`; storing the definitions in
Redis is :mod:`sow_redis.registry`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import cached_property

import orjson

from ..errors import DerivedTopicError
from .values import JSONObject, split_path

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*(ms|s|m|h|d)?\s*$")
MAX_DURATION_MS = 36_525 * 86_400_000
"""Longest duration a topic may set: 100 years (36,525 days) in milliseconds. Expiry times
are ms since the epoch stored as Redis sorted-set scores (doubles, exact to 2**53 ms), so
any log time plus this still fits with a wide margin."""


def parse_duration_ms(value: object) -> int:
    """A duration in milliseconds from ``"30s"``, ``"5m"``, ``"1h"``, ``"250ms"``, ``"2d"`` or a
    plain number of seconds (``30``, ``"1.5"``, ``1e3``), from 0 to :data:`MAX_DURATION_MS`.

    Raises:
        ValueError: not a finite duration from 0 to 100 years (negative, ``inf``, ``nan``,
            a boolean, text that is no duration, or too long).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"not a duration (e.g. \"30s\", \"5m\", \"1h\", 30): {value!r}")
    if isinstance(value, str):
        m = _DURATION.match(value)
        if not m:
            raise ValueError(f"not a duration (e.g. \"30s\", \"5m\", \"1h\", 30): {value!r}")
        ms = float(m.group(1)) * _UNITS_MS[m.group(2) or "s"]
    else:
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"a duration must be a finite number, got {value!r}")
        if value < 0:
            raise ValueError(f"a duration cannot be negative: {value!r}")
        ms = float(value) * 1000
    if not ms <= MAX_DURATION_MS:  # also catches inf from "1e999"
        raise ValueError(f"a duration can be at most 100 years (36525d), got {value!r}")
    return round(ms)


def duration_text(value: object) -> str:
    """The stored (registry) text of a duration field: a TOML number as plain decimal text,
    a string as given. Raises ValueError like :func:`parse_duration_ms` for the result."""
    parse_duration_ms(value)
    if isinstance(value, float):
        text = repr(int(value)) if value.is_integer() else repr(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
    else:
        text = str(value)
    parse_duration_ms(text)
    return text


DEFAULT_PARTITIONS = 8
DEFAULT_CHANGE_RETENTION = "1h"
DEFAULT_CHANGE_RETENTION_COUNT = 100_000
MAX_CHANGE_RETENTION_COUNT = 100_000_000
DEFAULT_MAX_MESSAGE_BYTES = 1_048_576
PERSISTENCE = ("persistent", "transient")
"""``persistence`` values: AMPS SOW ``Durability`` (seeds/004, "Durability")."""


def parse_recovery_point(value: str) -> int | None:
    """A transient topic's ``recovery_point`` (AMPS SOW ``RecoveryPoint``, seeds/004) as the
    log time a rebuild starts from, in milliseconds since the epoch: ``"epoch"`` → 0 (the
    log's first retained entry), ``"now"`` → None (the log's end: the SOW starts empty), an
    ISO-8601 time (``"2026-11-27T06:00:00Z"``; without an offset it is UTC) → its
    milliseconds (the first entry at or after it).

    Raises:
        ValueError: none of these, or a time before 1970.
    """
    if value == "epoch":
        return 0
    if value == "now":
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f'not "epoch", "now" or an ISO-8601 time like '
                         f'"2026-11-27T06:00:00Z": {value!r}') from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    ms = int(t.timestamp() * 1000)
    if ms < 0:
        raise ValueError(f"a recovery point cannot be before 1970: {value!r}")
    return ms


@dataclass(frozen=True)
class TopicConfig:
    """One SOW topic. Paths are XPath-like strings (``/a/b``)."""

    name: str
    key: tuple[str, ...] = ()
    key_domain: str = ""
    message_type: str = "json"
    partitions: int = DEFAULT_PARTITIONS
    hash_index: tuple[tuple[str, ...], ...] = ()
    index: tuple[str, ...] = ()
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    partition_by: tuple[str, ...] = ()
    expiration: str = "disabled"
    expiration_policy: str = "override"
    dead_letter: str = ""
    idle_expiration: str = ""
    key_generator: str = "default"
    chain_primary: str = ""
    chain_secondary: tuple[str, ...] = ()
    chain_validation: bool = False
    field_separator: str = "\x01"
    skip_msg_types: tuple[str, ...] = ()
    change_retention: str = DEFAULT_CHANGE_RETENTION
    change_retention_count: int = DEFAULT_CHANGE_RETENTION_COUNT
    change_previous: bool = False
    history_window: str = ""
    history_granularity: str = ""
    kind: str = "topic"
    underlying: str = ""
    joined: str = ""
    join: tuple[str, ...] = ()
    projection: tuple[str, ...] = ()
    grouping: tuple[str, ...] = ()
    filter: str = ""
    interval: str = ""
    persistence: str = "persistent"
    recovery_point: str = "epoch"
    log_retention: str = ""
    key_parts: tuple[tuple[str, ...], ...] = field(default=(), compare=False, repr=False)
    partition_parts: tuple[tuple[str, ...], ...] = field(default=(), compare=False, repr=False)
    index_parts: tuple[tuple[tuple[str, ...], ...], ...] = field(
        default=(), compare=False, repr=False
    )
    chain_parts: tuple[tuple[str, ...], ...] = field(default=(), compare=False, repr=False)
    range_parts: tuple[tuple[str, ...], ...] = field(default=(), compare=False, repr=False)

    @property
    def n_indexes(self) -> int:
        """How many index sorted sets a partition has: the hash indexes (``hash_index``), then
        the range (memo) indexes (``index``), numbered in that order (:func:`keys.index`)."""
        return len(self.hash_index) + len(self.index)

    @property
    def chaining(self) -> bool:
        """True when SOW keys come from the chaining key generator (seeds/003)."""
        return self.key_generator == "chaining"

    @property
    def chain_fields(self) -> tuple[str, ...]:
        """Chaining fields: the primary first, then the secondary fields in order."""
        return (self.chain_primary, *self.chain_secondary) if self.chaining else ()

    @property
    def domain(self) -> str:
        """Key domain used for generated SOW keys (the topic name unless set)."""
        return self.key_domain or self.name

    @property
    def expiration_enabled(self) -> bool:
        """True when the expirer processes this topic (a duration or ``"enabled"``; seeds/004:
        with expiration disabled, message expirations are kept but nothing expires)."""
        return self.expiration != "disabled"

    @cached_property
    def default_ttl_ms(self) -> int | None:
        """Topic default lifetime in milliseconds, None when the topic sets no duration."""
        if self.expiration in ("disabled", "enabled"):
            return None
        return parse_duration_ms(self.expiration)

    @cached_property
    def idle_ms(self) -> int | None:
        """``idle_expiration`` in milliseconds, None when not set."""
        return parse_duration_ms(self.idle_expiration) if self.idle_expiration else None

    @cached_property
    def change_retention_ms(self) -> int:
        """Age after which change blocks leave the change feed, in milliseconds (0: no age
        limit, only the count)."""
        return parse_duration_ms(self.change_retention)

    @property
    def change_feed(self) -> bool:
        """False when ``change_retention = 0``: changes are published, not kept."""
        return self.change_retention_count > 0

    @property
    def transient(self) -> bool:
        """True for ``persistence = "transient"``: the SOW can be rebuilt from the log, which
        apply keeps (AMPS SOW ``Durability``, seeds/004; docs/operations.md, "Persistent and
        transient topics")."""
        return self.persistence == "transient"

    @cached_property
    def recovery_ms(self) -> int | None:
        """:func:`parse_recovery_point` of ``recovery_point``: ms since the epoch, None for
        ``"now"``."""
        return parse_recovery_point(self.recovery_point)

    @cached_property
    def log_retention_ms(self) -> int:
        """A transient topic's ``log_retention`` in milliseconds (0: the log is kept whole)."""
        return parse_duration_ms(self.log_retention) if self.log_retention else 0

    @property
    def derived(self) -> bool:
        """True for a view or a conflated topic: its records are written by the deriver
        (:mod:`sow_redis.derive`) from its ``underlying`` topic, never by publishers."""
        return self.kind != "topic"

    def check_writable(self) -> None:
        """Refuse writes by publishers to a derived topic.

        Raises:
            DerivedTopicError: the topic is a view or a conflated topic (one line naming the
                topic to write to instead).
        """
        if self.derived:
            what = "a view" if self.kind == "view" else "a conflated topic"
            raise DerivedTopicError(f"topic '{self.name}' is {what} of '{self.underlying}': "
                                    f"its records are derived from it; publish to "
                                    f"'{self.underlying}' instead")

    @cached_property
    def history_ms(self) -> int:
        """The history window in milliseconds (0: the topic keeps no history)."""
        return parse_duration_ms(self.history_window) if self.history_window else 0

    @cached_property
    def interval_ms(self) -> int:
        """A conflated topic's conflation interval in milliseconds (0 for other topics)."""
        return parse_duration_ms(self.interval) if self.interval else 0

    @property
    def publisher_keys(self) -> bool:
        """True when the topic has no key fields and publishers must supply the SOW key."""
        return not self.key and not self.chaining

    @cached_property
    def fingerprint(self) -> str:
        """16 hex digits of the SHA-1 of the topic's shape: its name and
        :data:`SHAPE_FIELDS`, the fields that decide a message's SOW key, partition and index
        members (equal in every process for equal shapes). Stored per partition
        (:func:`keys.definition`) by :func:`store_topics`; a publisher's append carries it,
        and Redis appends nothing for a publisher whose shape is not the stored one (issue
        23.4). Other fields (expiration, retention, limits) change without it."""
        d = asdict(self)
        # a topic without range indexes keeps the fingerprint it had before ``index`` existed
        shape = {f: d[f] for f in ("name", *SHAPE_FIELDS) if f != "index" or d[f]}
        return hashlib.sha1(orjson.dumps(shape, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]

    def to_json(self) -> bytes:
        d = asdict(self)
        for k in ("key_parts", "partition_parts", "index_parts", "chain_parts", "range_parts"):
            d.pop(k)
        return orjson.dumps(d)

    @classmethod
    def from_json(cls, raw: bytes | str) -> TopicConfig:
        d = orjson.loads(raw)
        return topic_from_dict(d)


def topic_from_dict(d: JSONObject) -> TopicConfig:
    """A :class:`TopicConfig` from its stored (or checked) fields: the registry's JSON
    (:meth:`TopicConfig.from_json`) or a table :mod:`sow_redis.config` validated."""
    key = tuple(d.get("key") or ())
    hash_index = tuple(tuple(ix) for ix in d.get("hash_index") or ())
    index = tuple(d.get("index") or ())
    partition_by = tuple(d.get("partition_by") or ())
    chain_primary = d.get("chain_primary") or ""
    chain_secondary = tuple(d.get("chain_secondary") or ())
    return TopicConfig(
        name=d["name"],
        key=key,
        key_domain=d.get("key_domain") or "",
        message_type=d.get("message_type", "json"),
        partitions=int(d.get("partitions", DEFAULT_PARTITIONS)),
        hash_index=hash_index,
        index=index,
        max_message_bytes=int(d.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)),
        partition_by=partition_by,
        expiration=str(d.get("expiration") or "disabled"),
        expiration_policy=d.get("expiration_policy") or "override",
        dead_letter=d.get("dead_letter") or "",
        idle_expiration=str(d.get("idle_expiration") or ""),
        key_generator=d.get("key_generator") or "default",
        chain_primary=chain_primary,
        chain_secondary=chain_secondary,
        chain_validation=bool(d.get("chain_validation", False)),
        field_separator=d.get("field_separator") or "\x01",
        skip_msg_types=tuple(d.get("skip_msg_types") or ()),
        change_retention=str(d.get("change_retention", DEFAULT_CHANGE_RETENTION)),
        change_retention_count=int(d.get("change_retention_count",
                                         DEFAULT_CHANGE_RETENTION_COUNT)),
        change_previous=bool(d.get("change_previous", False)),
        history_window=str(d.get("history_window") or ""),
        history_granularity=str(d.get("history_granularity") or ""),
        kind=d.get("kind") or "topic",
        underlying=d.get("underlying") or "",
        joined=d.get("joined") or "",
        join=tuple(d.get("join") or ()),
        projection=tuple(d.get("projection") or ()),
        grouping=tuple(d.get("grouping") or ()),
        filter=d.get("filter") or "",
        interval=str(d.get("interval") or ""),
        persistence=d.get("persistence") or "persistent",
        recovery_point=str(d.get("recovery_point") or "epoch"),
        log_retention=str(d.get("log_retention") or ""),
        key_parts=tuple(split_path(p) for p in key),
        partition_parts=tuple(split_path(p) for p in (partition_by or key)),
        index_parts=tuple(tuple(split_path(p) for p in ix) for ix in hash_index),
        chain_parts=tuple(split_path(p) for p in (chain_primary, *chain_secondary) if p),
        range_parts=tuple(split_path(p) for p in index),
    )


SHAPE_FIELDS = ("partitions", "key", "key_domain", "key_generator", "message_type",
                "partition_by", "hash_index", "index")
"""Fields that decide where a message's record lives (SOW key, partition, stored form) or
what finds it: changing one strands what a topic holds (issue 7.4), and an index added or
changed would cover only records written after it, see :func:`shape_changes`."""
