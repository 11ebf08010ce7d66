"""Topic configuration: TOML file → validated :class:`TopicConfig` → registry in Redis.

One ``[[topic]]`` table per SOW topic (AMPS ``SOW/Topic``, seeds/004 "Configuration")::

    [[topic]]
    name = "orders"
    key = ["/orderId"]            # several = composite key; none = publisher supplies SowKey
    key_domain = "orders"         # default: the topic name
    message_type = "json"
    partitions = 8
    hash_index = [["/region"], ["/customer", "/status"]]
    max_message_bytes = 1048576
    expiration = "30s"            # "5m", "1h", seconds, "enabled", "disabled" (default)
    expiration_policy = "override"  # AMPS (message wins) or "min" (RabbitMQ: lower TTL wins)
    dead_letter = "orders_expired"  # expired records are published there
    idle_expiration = "1h"        # remove the topic after this long unused (RabbitMQ x-expires)

    [[topic]]                     # a FIX order topic with cancel/replace chains (seeds/003)
    name = "orders"
    message_type = "fix"          # tag=value; paths are tag numbers
    field_separator = "\u0001"    # SOH (default); ";" or "|" as seen in logs
    key = ["/11", "/41"]          # chaining: first = primary, the rest secondary
    key_generator = { type = "chaining", validation = false }
    partition_by = ["/55"]        # constant along a chain; without it: one partition

The registry (:data:`keys.REGISTRY`) holds every topic as JSON so stateless workers on any
host read the same definitions; ``apply_config`` bumps a version and announces it on pub/sub.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

import orjson

from . import keys
from .errors import ConfigError, UnknownTopicError
from .fix import separator
from .values import split_path

TOPIC_NAME = re.compile(r"^[A-Za-z0-9_.\-/]{1,200}$")
MESSAGE_TYPES = ("json", "fix")
KEY_GENERATORS = ("default", "chaining")
FIX_SESSION_MSG_TYPES = ("0", "1", "2", "3", "4", "5", "A")
"""FIX session-level (administrative) MsgType (35) values: Heartbeat, TestRequest,
ResendRequest, Reject, SequenceReset, Logout, Logon. They carry no order state, so a FIX topic
skips them at publish by default (``skip_msg_types``)."""
EXPIRATION_POLICIES = ("override", "min")
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration_ms(value: object) -> int:
    """A duration in milliseconds from ``"30s"``, ``"5m"``, ``"1h"``, ``"250ms"``, ``"2d"`` or a
    plain number of seconds (``30``, ``"1.5"``).

    Raises:
        ValueError: not a non-negative duration.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"a duration cannot be negative: {value!r}")
        return round(value * 1000)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"not a duration (e.g. \"30s\", \"5m\", \"1h\", 30): {value!r}")
    return round(float(m.group(1)) * _UNITS_MS[m.group(2) or "s"])
DEFAULT_PARTITIONS = 8
DEFAULT_MAX_MESSAGE_BYTES = 1_048_576


@dataclass(frozen=True)
class TopicConfig:
    """One SOW topic. Paths are XPath-like strings (``/a/b``)."""

    name: str
    key: tuple[str, ...] = ()
    key_domain: str = ""
    message_type: str = "json"
    partitions: int = DEFAULT_PARTITIONS
    hash_index: tuple[tuple[str, ...], ...] = ()
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
    key_parts: tuple[tuple[str, ...], ...] = field(default=(), compare=False, repr=False)
    partition_parts: tuple[tuple[str, ...], ...] = field(default=(), compare=False, repr=False)
    index_parts: tuple[tuple[tuple[str, ...], ...], ...] = field(
        default=(), compare=False, repr=False
    )
    chain_parts: tuple[tuple[str, ...], ...] = field(default=(), compare=False, repr=False)

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

    @property
    def publisher_keys(self) -> bool:
        """True when the topic has no key fields and publishers must supply the SOW key."""
        return not self.key and not self.chaining

    def to_json(self) -> bytes:
        d = asdict(self)
        for k in ("key_parts", "partition_parts", "index_parts", "chain_parts"):
            d.pop(k)
        return orjson.dumps(d)

    @classmethod
    def from_json(cls, raw: bytes | str) -> TopicConfig:
        d = orjson.loads(raw)
        return _build(d)


_FIELDS = {
    "name", "key", "key_domain", "message_type", "partitions", "hash_index",
    "max_message_bytes", "partition_by", "expiration", "expiration_policy", "dead_letter",
    "idle_expiration", "key_generator", "field_separator", "skip_msg_types",
}
_KEY_GENERATOR_FIELDS = {"type", "primary", "secondary", "validation"}


def _build(d: dict[str, Any]) -> TopicConfig:
    key = tuple(d.get("key") or ())
    hash_index = tuple(tuple(ix) for ix in d.get("hash_index") or ())
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
        key_parts=tuple(split_path(p) for p in key),
        partition_parts=tuple(split_path(p) for p in (partition_by or key)),
        index_parts=tuple(tuple(split_path(p) for p in ix) for ix in hash_index),
        chain_parts=tuple(split_path(p) for p in (chain_primary, *chain_secondary) if p),
    )


def _check_paths(where: str, name: str, value: Any, problems: list[str]) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{where}: '{name}' must be a list of field paths like \"/orderId\"")
        return []
    for v in value:
        try:
            split_path(v)
        except ValueError as exc:
            problems.append(f"{where}: '{name}': {exc}")
    return value


def parse_topics(text: str, source: str = "<config>") -> list[TopicConfig]:
    """Parse and validate a TOML configuration.

    Returns:
        The topics in file order.

    Raises:
        ConfigError: with one line per problem, naming file, topic and field. Nothing is
            returned (so nothing is stored) when any problem is found.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{source}: not valid TOML: {exc}"]) from None
    problems: list[str] = []
    tables = doc.get("topic")
    extra = sorted(set(doc) - {"topic"})
    if extra:
        problems.append(f"{source}: unknown top-level table(s): {', '.join(extra)}")
    if not isinstance(tables, list) or not tables:
        problems.append(f"{source}: no [[topic]] table found")
        raise ConfigError(problems)
    topics: list[TopicConfig] = []
    seen: set[str] = set()
    for i, t in enumerate(tables, 1):
        name = t.get("name")
        where = f"{source}: topic #{i}" + (f" '{name}'" if isinstance(name, str) else "")
        before = len(problems)
        if not isinstance(name, str) or not TOPIC_NAME.match(name):
            problems.append(f"{where}: 'name' must be 1-200 characters of A-Z a-z 0-9 _ . - /")
        elif name in seen:
            problems.append(f"{where}: topic defined twice")
        else:
            seen.add(name)
        unknown = sorted(set(t) - _FIELDS)
        for u in unknown:
            problems.append(f"{where}: unknown field '{u}'")
        d = dict(t)
        d["key"] = _check_paths(where, "key", t.get("key", []), problems)
        d["partition_by"] = _check_paths(where, "partition_by", t.get("partition_by", []), problems)
        ixs = t.get("hash_index", [])
        if not isinstance(ixs, list):
            problems.append(f"{where}: 'hash_index' must be a list of lists of field paths")
            ixs = []
        d["hash_index"] = [_check_paths(where, "hash_index", ix, problems) for ix in ixs]
        if any(not ix for ix in d["hash_index"]):
            problems.append(f"{where}: 'hash_index': an index needs at least one field path")
        if "key_domain" in t and (not isinstance(t["key_domain"], str) or not t["key_domain"]):
            problems.append(f"{where}: 'key_domain' must be a non-empty string")
        mt = t.get("message_type", "json")
        if mt not in MESSAGE_TYPES:
            problems.append(
                f"{where}: 'message_type' must be one of {', '.join(MESSAGE_TYPES)}, got {mt!r}"
            )
        _check_key_generator(where, t, d, problems)
        _check_fix(where, t, d, problems)
        parts = d.get("partitions", DEFAULT_PARTITIONS)
        if not isinstance(parts, int) or isinstance(parts, bool) or not 1 <= parts <= 1024:
            problems.append(f"{where}: 'partitions' must be an integer from 1 to 1024")
        mmb = t.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)
        if not isinstance(mmb, int) or isinstance(mmb, bool) or mmb < 16:
            problems.append(f"{where}: 'max_message_bytes' must be an integer >= 16")
        _check_expiration(where, t, problems)
        if len(problems) == before:
            topics.append(_build(d))
    for t in topics:
        if t.dead_letter and t.dead_letter == t.name:
            problems.append(f"{source}: topic '{t.name}': 'dead_letter' cannot be the topic itself")
    if problems:
        raise ConfigError(problems)
    return topics


def _check_key_generator(where: str, t: dict[str, Any], d: dict[str, Any],
                         problems: list[str]) -> None:
    """Resolve ``key_generator`` into the flat ``chain_*`` fields of ``d`` (seeds/003).

    ``key_generator = { type = "chaining", primary = "/11", secondary = ["/41"],
    validation = false }``. Without ``primary``, the ``key`` entries in order give the primary
    (first) and secondary fields (the rest); with it, every ``key`` entry is a secondary field
    (the seed's ``Primary`` / ``Key`` synonyms). A chaining topic without ``partition_by`` has
    one partition.
    """
    kg = t.get("key_generator")
    d.pop("key_generator", None)
    if kg is None:
        return
    if not isinstance(kg, dict):
        problems.append(f"{where}: 'key_generator' must be a table like "
                        f'{{ type = "chaining", primary = "/11", secondary = ["/41"] }}')
        return
    for u in sorted(set(kg) - _KEY_GENERATOR_FIELDS):
        problems.append(f"{where}: 'key_generator': unknown field '{u}'")
    kind = kg.get("type", "default")
    if kind not in KEY_GENERATORS:
        problems.append(f"{where}: 'key_generator': type must be one of "
                        f"{', '.join(KEY_GENERATORS)}, got {kind!r}")
        return
    if kind == "default":
        if set(kg) - {"type"}:
            problems.append(f"{where}: 'key_generator': primary, secondary and validation "
                            "apply to type \"chaining\" only")
        return
    primary = _check_paths(where, "key_generator.primary", kg.get("primary", []), problems)
    secondary = _check_paths(where, "key_generator.secondary", kg.get("secondary", []), problems)
    if len(primary) > 1:
        problems.append(f"{where}: 'key_generator': only one primary field")
    fields = list(primary) + list(d["key"]) + list(secondary)
    if len(fields) < 2 or not all(fields):
        problems.append(f"{where}: 'key_generator': the chaining key generator needs a primary "
                        "field and at least one secondary field (seeds/003), e.g. "
                        'key = ["/11", "/41"]')
        return
    if len(set(fields)) != len(fields):
        problems.append(f"{where}: 'key_generator': a field is listed twice: {fields}")
    validation = kg.get("validation", False)
    if not isinstance(validation, bool):
        problems.append(f"{where}: 'key_generator': validation must be true or false")
    d.update(key_generator="chaining", chain_primary=fields[0],
             chain_secondary=fields[1:], chain_validation=validation is True)
    if not d["partition_by"]:
        if "partitions" in t and t["partitions"] != 1:
            problems.append(f"{where}: 'partitions': a chaining topic needs 'partition_by' (a "
                            "field constant along a chain, e.g. /55) to use more than one "
                            "partition")
        d["partitions"] = 1


def _check_fix(where: str, t: dict[str, Any], d: dict[str, Any], problems: list[str]) -> None:
    """``field_separator`` (one character, default SOH) and ``skip_msg_types`` (MsgType 35
    values skipped at publish; default: FIX session-level messages) for FIX topics."""
    is_fix = t.get("message_type", "json") == "fix"
    for name in ("field_separator", "skip_msg_types"):
        if name in t and not is_fix:
            problems.append(f"{where}: '{name}' applies to message_type \"fix\" only")
    if not is_fix:
        return
    sep = t.get("field_separator", "\x01")
    try:
        if not isinstance(sep, str):
            raise ValueError(f"a FIX field separator is a string like \";\", got {sep!r}")
        d["field_separator"] = separator(sep).decode()
    except ValueError as exc:
        problems.append(f"{where}: 'field_separator': {exc}")
    skip = t.get("skip_msg_types", list(FIX_SESSION_MSG_TYPES))
    if not isinstance(skip, list) or not all(isinstance(x, str) and x for x in skip):
        problems.append(f"{where}: 'skip_msg_types' must be a list of MsgType (35) values, "
                        'e.g. ["0", "A"]')
        skip = []
    d["skip_msg_types"] = skip


def _check_expiration(where: str, t: dict[str, Any], problems: list[str]) -> None:
    exp = t.get("expiration", "disabled")
    if exp not in ("enabled", "disabled"):
        try:
            parse_duration_ms(exp)
        except ValueError as exc:
            problems.append(f"{where}: 'expiration' must be a duration, \"enabled\" or "
                            f"\"disabled\": {exc}")
    pol = t.get("expiration_policy", "override")
    if pol not in EXPIRATION_POLICIES:
        problems.append(f"{where}: 'expiration_policy' must be \"override\" or \"min\", got {pol!r}")
    dl = t.get("dead_letter", "")
    if dl and (not isinstance(dl, str) or not TOPIC_NAME.match(dl)):
        problems.append(f"{where}: 'dead_letter' must be a topic name")
    if "idle_expiration" in t:
        try:
            if parse_duration_ms(t["idle_expiration"]) <= 0:
                problems.append(f"{where}: 'idle_expiration' must be > 0")
        except ValueError as exc:
            problems.append(f"{where}: 'idle_expiration': {exc}")


def load_file(path: str) -> list[TopicConfig]:
    """Read and validate a TOML file (see :func:`parse_topics`). Raises ConfigError."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from None
    return parse_topics(text, source=path)


def apply_topics(r: Any, topics: list[TopicConfig]) -> int:
    """Store topics in the registry (replacing same-named ones) and announce the change.

    Returns:
        The new registry version.
    """
    pipe = r.pipeline(transaction=True)
    sec, usec = r.time()
    for t in topics:
        pipe.hset(keys.REGISTRY, t.name, t.to_json())
        pipe.hset(keys.LAST_USED, t.name, int(sec) * 1000 + int(usec) // 1000)
    pipe.incr(keys.REGISTRY_VERSION)
    version = pipe.execute()[-1]
    r.publish(keys.REGISTRY_CHANNEL, str(version))
    return int(version)


def load_topics(r: Any) -> dict[str, TopicConfig]:
    """All topics in the registry, by name."""
    raw = r.hgetall(keys.REGISTRY)
    out = {}
    for name, blob in raw.items():
        t = TopicConfig.from_json(blob)
        out[t.name] = t
    return out


def get_topic(r: Any, name: str) -> TopicConfig:
    """One topic from the registry. Raises UnknownTopicError."""
    blob = r.hget(keys.REGISTRY, name)
    if blob is None:
        raise UnknownTopicError(
            f"topic '{name}' is not defined in the registry (run: sow-redis config apply FILE)"
        )
    return TopicConfig.from_json(blob)


class TopicCache:
    """Registry reader for long-running workers: re-reads only when the version changed."""

    def __init__(self, r: Any):
        self._r = r
        self._version: bytes | None = None
        self._topics: dict[str, TopicConfig] = {}

    def get(self, name: str) -> TopicConfig:
        version = self._r.get(keys.REGISTRY_VERSION)
        if version != self._version or name not in self._topics:
            self._topics = load_topics(self._r)
            self._version = version
        if name not in self._topics:
            raise UnknownTopicError(f"topic '{name}' is not defined in the registry")
        return self._topics[name]

    def all(self) -> dict[str, TopicConfig]:
        version = self._r.get(keys.REGISTRY_VERSION)
        if version != self._version:
            self._topics = load_topics(self._r)
            self._version = version
        return self._topics
