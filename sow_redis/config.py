"""Topic configuration: TOML file → validated :class:`TopicConfig` → registry in Redis.

One ``[[topic]]`` table per SOW topic (AMPS ``SOW/Topic``, seeds/004 "Configuration")::

    [[topic]]
    name = "orders"
    key = ["/orderId"]            # several = composite key; none = publisher supplies SowKey
    key_domain = "orders"         # default: the topic name
    message_type = "json"
    partitions = 8
    hash_index = [["/region"], ["/customer", "/status"]]
    index = ["/px", "/time"]      # range (memo) indexes: < <= > >= BETWEEN read a sorted set
    max_message_bytes = 1048576
    expiration = "30s"            # "5m", "1h", seconds, "enabled", "disabled" (default)
    expiration_policy = "override"  # AMPS (message wins) or "min" (RabbitMQ: lower TTL wins)
    dead_letter = "orders_expired"  # expired records are published there
    idle_expiration = "1h"        # remove the topic after this long unused (RabbitMQ x-expires)
    change_retention = "1h"       # change feed kept for bookmark replay and gap recovery:
                                  # a duration, { age = "1h", count = 100000 }, or 0 (no feed)
    change_previous = false       # true: each change event also carries the record's previous
                                  # state (exact OOF for late joiners, delta subscriptions)
    persistence = "persistent"    # "transient": a lost SOW is rebuilt from the log (kept)
    recovery_point = "epoch"      # transient: rebuild from "epoch", "now" or an ISO-8601 time
    log_retention = "7d"          # transient: log entries kept this long (default: all)

    [[topic]]                     # a FIX order topic with cancel/replace chains (seeds/003)
    name = "orders"
    message_type = "fix"          # tag=value; paths are tag numbers
    field_separator = "\u0001"    # SOH (default); ";" or "|" as seen in logs
    key = ["/11", "/41"]          # chaining: first = primary, the rest secondary
    key_generator = { type = "chaining", validation = false }
    partition_by = ["/55"]        # constant along a chain; without it: one partition

Storing the definitions in Redis, where every process reads them, is
:mod:`sow_redis.registry`.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from typing import TypeAlias, cast

import orjson
import tomli_w

from .errors import ConfigError
from .model.aggregate import ProjectionError, parse_projection
from .model.fix import separator
from .model.topic import (
    DEFAULT_CHANGE_RETENTION,
    DEFAULT_CHANGE_RETENTION_COUNT,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_PARTITIONS,
    MAX_CHANGE_RETENTION_COUNT,
    PERSISTENCE,
    TopicConfig,
    duration_text,
    parse_duration_ms,
    parse_recovery_point,
    topic_from_dict,
)
from .model.values import JSON, JSONObject, split_path

TOPIC_NAME = re.compile(r"^[A-Za-z0-9_.\-/]{1,200}$")
MESSAGE_TYPES = ("json", "fix", "xml")
KEY_GENERATORS = ("default", "chaining")
FIX_SESSION_MSG_TYPES = ("0", "1", "2", "3", "4", "5", "A")
"""FIX session-level (administrative) MsgType (35) values: Heartbeat, TestRequest,
ResendRequest, Reject, SequenceReset, Logout, Logon. They carry no order state, so a FIX topic
skips them at publish by default (``skip_msg_types``)."""
EXPIRATION_POLICIES = ("override", "min")
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
"""Largest ``max_message_bytes``: Redis's own limit on one string (512 MiB)."""


_KEY_GENERATOR_FIELDS = {"type", "primary", "secondary", "validation"}


Table: TypeAlias = "JSONObject"
"""A TOML table as :mod:`tomllib` reads it (strings, numbers, booleans, arrays, tables),
or the ``[[topic]]`` fields as :func:`_build` takes them."""

_Shape: TypeAlias = "tuple[Callable[[object], bool], str]"
"""A field's type check on its TOML value, and what the field must be (for error lines)."""


def _is_str(v: object) -> bool:
    return isinstance(v, str)


def _is_underlying(v: object) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and _is_paths(v) and len(v) == 2)


def _is_join(v: object) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and _is_paths(v) and len(v) == 2)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_bool(v: object) -> bool:
    return isinstance(v, bool)


def _is_retention(v: object) -> bool:
    return isinstance(v, (dict, str, int, float)) and not isinstance(v, bool)


def _is_duration(v: object) -> bool:
    return isinstance(v, str) or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _is_paths(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _is_indexes(v: object) -> bool:
    return isinstance(v, list) and all(_is_paths(x) for x in v)


def _is_table(v: object) -> bool:
    return isinstance(v, dict)


def _is_primary(v: object) -> bool:
    return isinstance(v, str) or _is_paths(v)


_SHAPES: dict[str, _Shape] = {
    "name": (_is_str, "a string"),
    "key": (_is_paths, 'a list of field paths like ["/orderId"]'),
    "key_domain": (_is_str, "a string"),
    "message_type": (_is_str, "a string"),
    "partitions": (_is_int, "an integer"),
    "hash_index": (_is_indexes, 'a list of lists of field paths like [["/region"]]'),
    "index": (_is_paths, 'a list of field paths like ["/px", "/time"]'),
    "max_message_bytes": (_is_int, "an integer"),
    "partition_by": (_is_paths, 'a list of field paths like ["/55"]'),
    "expiration": (_is_duration, 'a duration like "30s" or 30, "enabled" or "disabled"'),
    "expiration_policy": (_is_str, "a string"),
    "dead_letter": (_is_str, "a topic name (a string)"),
    "idle_expiration": (_is_duration, 'a duration like "1h" or 3600'),
    "key_generator": (_is_table, 'a table like { type = "chaining", primary = "/11", '
                      'secondary = ["/41"] }'),
    "field_separator": (_is_str, 'a string like ";"'),
    "skip_msg_types": (_is_paths, 'a list of MsgType (35) values like ["0", "A"]'),
    "change_retention": (_is_retention, 'a duration like "1h", 0 (no change feed), or a '
                         'table like { age = "1h", count = 100000 }'),
    "change_previous": (_is_bool, "true or false"),
    "history": (_is_table, 'a table like { window = "7d", granularity = "1s" }'),
    "persistence": (_is_str, '"persistent" or "transient"'),
    "recovery_point": (_is_str, '"epoch", "now" or an ISO-8601 time like '
                       '"2026-11-27T06:00:00Z"'),
    "log_retention": (_is_duration, 'a duration like "7d" or 604800'),
}
"""Every ``[[topic]]`` field → (type check on the TOML value, what the field must be). Each
field is type-checked here first, so the value checks below only ever see the right type."""

_FIELDS = set(_SHAPES)

_KEY_GENERATOR_SHAPES: dict[str, _Shape] = {
    "type": (_is_str, 'a string ("default" or "chaining")'),
    "primary": (_is_primary, 'one field path like "/11"'),
    "secondary": (_is_paths, 'a list of field paths like ["/41"]'),
    "validation": (_is_bool, "true or false"),
}


def _kind(v: object) -> str:
    """The TOML kind of a value, for error lines (``inf``/``nan`` named as such)."""
    if isinstance(v, float) and (v != v or abs(v) == float("inf")):
        return repr(v)
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
             list: "an array", dict: "a table"}
    if isinstance(v, list) and v:
        inner = sorted({names.get(type(x), type(x).__name__).split(" ", 1)[-1] for x in v})
        return f"an array of {' and '.join(k + 's' for k in inner)}"
    return names.get(type(v), f"a {type(v).__name__}")


def _check_shapes(where: str, table: Table, shapes: dict[str, _Shape],
                  prefix: str, problems: list[str]) -> Table:
    """Type-check every known field of ``table``; returns the table without the fields of the
    wrong type (they are reported, and the value checks then use the defaults)."""
    out = dict(table)
    for name, value in table.items():
        if name in shapes and not shapes[name][0](value):
            problems.append(f"{where}: '{prefix}{name}' must be {shapes[name][1]}, "
                            f"got {_kind(value)}")
            del out[name]
    return out


def _check_paths(where: str, name: str, value: list[str], problems: list[str]) -> list[str]:
    """Check each field path of a list (already type-checked as a list of strings)."""
    for v in value:
        try:
            split_path(v)
        except ValueError as exc:
            problems.append(f"{where}: '{name}': {exc}")
    return value


def parse_topics(text: str, source: str = "<config>") -> list[TopicConfig]:
    """Parse and validate a TOML configuration.

    Every field is first checked for its TOML type (:data:`_SHAPES`), then for its value.
    Only the file itself is checked here; :func:`apply_topics` also checks it against the
    registry (``dead_letter`` targets, shape changes of topics holding data).

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
    tables = doc.get("topic", [])
    extra = sorted(set(doc) - {"topic", *DERIVED_KINDS})
    if extra:
        problems.append(f"{source}: unknown top-level table(s): {', '.join(extra)}")
    if not isinstance(tables, list) or not (tables or any(doc.get(k) for k in DERIVED_KINDS)):
        problems.append(f"{source}: no [[topic]] table found")
        raise ConfigError(problems)
    topics: list[TopicConfig] = []
    seen: dict[str, str] = {}  # topic name → where it was first defined
    for i, raw in enumerate(tables, 1):
        if not isinstance(raw, dict):
            problems.append(f"{source}: topic #{i}: 'topic' must be an array of tables "
                            f"([[topic]]), got {_kind(raw)} in the array")
            continue
        before = len(problems)
        d = _check_topic(source, i, raw, seen, problems)
        if len(problems) == before:
            topics.append(topic_from_dict(d))
    topics += _parse_derived(doc, source, seen, problems)
    for built in topics:
        if built.dead_letter and built.dead_letter == built.name:
            problems.append(f"{source}: topic '{built.name}': 'dead_letter' cannot be the "
                            "topic itself")
    if problems:
        raise ConfigError(problems)
    return topics


DERIVED_KINDS = ("view", "conflated_topic")
"""Top-level tables of topics whose records the deriver writes (:mod:`sow_redis.derive`)."""

_DERIVED_SHAPES: dict[str, dict[str, _Shape]] = {
    "view": {
        "name": (_is_str, "a topic name"),
        "underlying": (_is_underlying, 'a topic name, or two: ["orders", "fills"]'),
        "join": (_is_join, 'a field path like "/id", or one per topic: ["/id", "/order_id"]'),
        "projection": (_is_paths, 'a list like ["/sym", "COUNT(/id) AS /orders"]'),
        "grouping": (_is_paths, 'a list of field paths like ["/sym"]'),
        "filter": (_is_str, "an AMPS filter string"),
        "partitions": (_is_int, "an integer"),
    },
    "conflated_topic": {
        "name": (_is_str, "a topic name"),
        "underlying": (_is_str, "the name of the topic it conflates"),
        "interval": (_is_duration, 'a duration like "500ms"'),
        "filter": (_is_str, "an AMPS filter string"),
        "partitions": (_is_int, "an integer"),
    },
}
"""Fields of a ``[[view]]`` (AMPS ``View``) and a ``[[conflated_topic]]`` (AMPS
``ConflatedTopic``) table, as :data:`_SHAPES` for topics."""

MIN_INTERVAL_MS = 10
"""The shortest conflation interval, in milliseconds."""


def _check_underlying(where: str, kind: str, name: JSON, d: JSONObject,
                      problems: list[str]) -> None:
    """``underlying`` (one topic, or two joined on ``join`` for a view) into ``d``'s
    ``underlying``, ``joined`` and ``join`` (one field path per topic)."""
    under = d.get("underlying")
    names = [under] if isinstance(under, str) else list(under or [])
    if not names or not all(names):
        problems.append(f"{where}: 'underlying' must name the topic it reads")
        return
    if name in names:
        problems.append(f"{where}: 'underlying' cannot be the {kind} itself")
    join = d.pop("join", None)
    if len(names) == 2:
        if kind != "view":
            problems.append(f"{where}: 'underlying' of a {kind} is one topic")
        elif names[0] == names[1]:
            problems.append(f"{where}: 'underlying' names the same topic twice")
        elif join is None:
            problems.append(f"{where}: a view of two topics needs 'join': the field path "
                            'they are joined on, like "/id"')
        else:
            paths = [join, join] if isinstance(join, str) else list(join)
            d["join"] = _check_paths(where, "join", paths, problems)
        d["underlying"], d["joined"] = names
    elif join is not None:
        problems.append(f"{where}: 'join' needs two underlying topics")


def _parse_derived(doc: JSONObject, source: str, seen: dict[str, str],
                   problems: list[str]) -> list[TopicConfig]:
    """The ``[[view]]`` and ``[[conflated_topic]]`` tables as topics (keyed by the deriver:
    no key fields), their problems added to ``problems``. The ``underlying`` topic and the
    filter are checked against the registry by :func:`sow_redis.registry.registry_problems`."""
    out = []
    for kind in DERIVED_KINDS:
        tables = doc.get(kind, [])
        if not isinstance(tables, list) or not all(isinstance(x, dict) for x in tables):
            problems.append(f"{source}: '{kind}' must be an array of tables ([[{kind}]])")
            continue
        shapes = _DERIVED_SHAPES[kind]
        for i, raw in enumerate(tables, 1):
            name = raw.get("name")
            where = f"{source}: {kind} #{i}" + (f" '{name}'" if isinstance(name, str) else "")
            before = len(problems)
            d = _check_shapes(where, raw, shapes, "", problems)
            for u in sorted(set(raw) - set(shapes)):
                problems.append(f"{where}: unknown field '{u}'")
            if not isinstance(name, str) or not TOPIC_NAME.fullmatch(name):
                problems.append(f"{where}: 'name' must be 1-200 characters of "
                                "A-Z a-z 0-9 _ . - /")
            elif name in seen:
                problems.append(f"{where}: topic defined twice (also {seen[name]})")
            else:
                seen[name] = f"{kind} #{i}"
            _check_underlying(where, kind, name, d, problems)
            parts = d.get("partitions", 1)
            if not 1 <= parts <= 1024:
                problems.append(f"{where}: 'partitions' must be an integer from 1 to 1024")
            if kind == "view":
                try:
                    parse_projection(d.get("projection", []), d.get("grouping", []))
                except ProjectionError as exc:
                    problems.append(f"{where}: {exc}")
            else:
                try:
                    interval = parse_duration_ms(d.get("interval", ""))
                except ValueError as exc:
                    problems.append(f"{where}: 'interval': {exc}")
                else:
                    if interval < MIN_INTERVAL_MS:
                        problems.append(f"{where}: 'interval' must be at least "
                                        f"{MIN_INTERVAL_MS} ms")
                    else:
                        d["interval"] = duration_text(d["interval"])
            if len(problems) == before:
                out.append(topic_from_dict({**d, "kind": kind, "partitions": parts, "key": []}))
    return out


def _twice(where: str, first: str, message_type: object) -> str:
    """The problem of a topic name defined a second time (``first``: where it was first).

    AMPS scopes a topic by name and message type (an ``xml`` and a ``json`` topic may share
    a name); sow_redis scopes it by name alone: every Redis key, lease, CLI command and
    subscription names a topic by its name (docs/configuration.md, "One name, one topic")."""
    if first.endswith(f"message_type {message_type}"):
        return f"{where}: topic defined twice (also {first})"
    return (f"{where}: topic defined twice (also {first}; this one message_type "
            f"{message_type}): sow_redis scopes topics by name alone, not by name and message "
            "type as AMPS does: rename one")


def _check_topic(source: str, i: int, raw: Table, seen: dict[str, str],
                 problems: list[str]) -> Table:
    """Check the ``i``-th ``[[topic]]`` table ``raw`` of ``source`` (``seen``: the names of
    the topics before it, this one's added), appending one line per problem to
    ``problems``.

    Returns:
        The topic's fields as :func:`_build` takes them (meaningful only when no problem was
        appended).
    """
    name = raw.get("name")
    where = f"{source}: topic #{i}" + (f" '{name}'" if isinstance(name, str) else "")
    t = _check_shapes(where, raw, _SHAPES, "", problems)
    if not isinstance(name, str) or not TOPIC_NAME.fullmatch(name):
        if "name" in t or "name" not in raw:
            problems.append(
                f"{where}: 'name' must be 1-200 characters of A-Z a-z 0-9 _ . - /")
    elif name in seen:
        problems.append(_twice(where, seen[name], raw.get("message_type", "json")))
    else:
        seen[name] = f"topic #{i}, message_type {raw.get('message_type', 'json')}"
    for u in sorted(set(raw) - _FIELDS):
        problems.append(f"{where}: unknown field '{u}'")
    d = dict(t)
    d["key"] = _check_paths(where, "key", t.get("key", []), problems)
    d["partition_by"] = _check_paths(where, "partition_by", t.get("partition_by", []),
                                     problems)
    d["hash_index"] = [_check_paths(where, "hash_index", ix, problems)
                       for ix in t.get("hash_index", [])]
    if any(not ix for ix in d["hash_index"]):
        problems.append(f"{where}: 'hash_index': an index needs at least one field path")
    d["index"] = _check_paths(where, "index", t.get("index", []), problems)
    if len(set(d["index"])) != len(d["index"]):
        problems.append(f"{where}: 'index': a field path is named twice")
    if "key_domain" in t and not t["key_domain"]:
        problems.append(f"{where}: 'key_domain' must be a non-empty string")
    mt = t.get("message_type", "json")
    if mt not in MESSAGE_TYPES:
        problems.append(
            f"{where}: 'message_type' must be one of {', '.join(MESSAGE_TYPES)}, got {mt!r}"
        )
    _check_key_generator(where, t, d, problems)
    _check_fix(where, t, d, problems)
    _check_sizes(where, t, d, problems)
    _check_expiration(where, t, d, problems)
    _check_change_retention(where, t, d, problems)
    _check_history(where, t, d, problems)
    _check_persistence(where, t, d, problems)
    return d


def _check_sizes(where: str, t: Table, d: Table,
                 problems: list[str]) -> None:
    """Check ``partitions`` (1 to 1024) and ``max_message_bytes`` (16 bytes to
    :data:`MAX_MESSAGE_BYTES`)."""
    parts = d.get("partitions", DEFAULT_PARTITIONS)
    if not 1 <= parts <= 1024:
        problems.append(f"{where}: 'partitions' must be an integer from 1 to 1024")
    mmb = t.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)
    if not 16 <= mmb <= MAX_MESSAGE_BYTES:
        problems.append(f"{where}: 'max_message_bytes' must be an integer from 16 to "
                        f"{MAX_MESSAGE_BYTES} (512 MiB)")


def _check_key_generator(where: str, t: Table, d: Table,
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
    for u in sorted(set(kg) - _KEY_GENERATOR_FIELDS):
        problems.append(f"{where}: 'key_generator': unknown field '{u}'")
    kg = _check_shapes(where, kg, _KEY_GENERATOR_SHAPES, "key_generator.", problems)
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
    primary = kg.get("primary", [])
    primary = _check_paths(where, "key_generator.primary",
                           [primary] if isinstance(primary, str) else primary, problems)
    secondary = _check_paths(where, "key_generator.secondary", kg.get("secondary", []),
                             problems)
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
    d.update(key_generator="chaining", chain_primary=fields[0],
             chain_secondary=fields[1:], chain_validation=kg.get("validation", False) is True)
    if not d["partition_by"]:
        if "partitions" in t and t["partitions"] != 1:
            problems.append(f"{where}: 'partitions': a chaining topic needs 'partition_by' (a "
                            "field constant along a chain, e.g. /55) to use more than one "
                            "partition")
        d["partitions"] = 1


def _check_fix(where: str, t: Table, d: Table, problems: list[str]) -> None:
    """``field_separator`` (one character, default SOH) and ``skip_msg_types`` (MsgType 35
    values skipped at publish; default: FIX session-level messages) for FIX topics."""
    is_fix = t.get("message_type", "json") == "fix"
    for name in ("field_separator", "skip_msg_types"):
        if name in t and not is_fix:
            problems.append(f"{where}: '{name}' applies to message_type \"fix\" only")
    if not is_fix:
        return
    try:
        d["field_separator"] = separator(t.get("field_separator", "\x01")).decode()
    except ValueError as exc:
        problems.append(f"{where}: 'field_separator': {exc}")
    skip = t.get("skip_msg_types", list(FIX_SESSION_MSG_TYPES))
    if not all(skip):
        problems.append(f"{where}: 'skip_msg_types' must be a list of MsgType (35) values, "
                        'e.g. ["0", "A"]')
        skip = []
    d["skip_msg_types"] = skip


def _check_expiration(where: str, t: Table, d: Table,
                      problems: list[str]) -> None:
    """``expiration``, ``expiration_policy``, ``dead_letter`` (a topic name; whether it is
    defined is checked against the registry by :func:`apply_topics`) and ``idle_expiration``.
    Durations are stored as :func:`duration_text` gives them, so what is checked here is what
    workers parse later."""
    exp = t.get("expiration", "disabled")
    if exp not in ("enabled", "disabled"):
        try:
            d["expiration"] = duration_text(exp)
        except ValueError as exc:
            problems.append(f"{where}: 'expiration' must be a duration, \"enabled\" or "
                            f"\"disabled\": {exc}")
    pol = t.get("expiration_policy", "override")
    if pol not in EXPIRATION_POLICIES:
        problems.append(f"{where}: 'expiration_policy' must be \"override\" or \"min\", got {pol!r}")
    dl = t.get("dead_letter", "")
    if dl and not TOPIC_NAME.fullmatch(dl):
        problems.append(f"{where}: 'dead_letter' must be a topic name")
    _check_positive_duration(where, t, d, "idle_expiration", problems)


def _check_positive_duration(where: str, t: Table, d: Table, name: str,
                             problems: list[str]) -> None:
    """Field ``name`` of ``t``, when given, as a duration longer than 0 into ``d`` (its
    canonical text); else a problem naming it."""
    if name not in t:
        return
    try:
        d[name] = duration_text(t[name])
        if parse_duration_ms(d[name]) <= 0:
            problems.append(f"{where}: '{name}' must be > 0")
    except ValueError as exc:
        problems.append(f"{where}: '{name}': {exc}")


def _check_change_retention(where: str, t: Table, d: Table,
                            problems: list[str]) -> None:
    """``change_retention``: a duration (age; the count stays the default), 0 (no change
    feed: changes are published only), or ``{ age = …, count = N }`` (either or both; a table
    without ``age`` keeps changes by count only). Stored as ``change_retention`` (age text,
    "0" = no age limit) and ``change_retention_count``."""
    if "change_retention" not in t:
        return
    value = d.pop("change_retention")
    age: object = DEFAULT_CHANGE_RETENTION
    count: object = DEFAULT_CHANGE_RETENTION_COUNT
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"age", "count"})
        if unknown:
            problems.append(f"{where}: 'change_retention' has unknown field(s) "
                            f"{', '.join(unknown)} (known: age, count)")
            return
        age, count = value.get("age", 0), value.get("count", DEFAULT_CHANGE_RETENTION_COUNT)
    else:
        age = value
    try:
        d["change_retention"] = duration_text(age)
    except ValueError as exc:
        problems.append(f"{where}: 'change_retention': {exc}")
        return
    if not isinstance(value, dict) and parse_duration_ms(d["change_retention"]) == 0:
        count = 0  # change_retention = 0: no change feed
    if not _is_int(count) or not 1 <= cast("int", count) <= MAX_CHANGE_RETENTION_COUNT:
        if count != 0 or isinstance(value, dict):
            problems.append(f"{where}: 'change_retention' count must be an integer from 1 to "
                            f"{MAX_CHANGE_RETENTION_COUNT}")
            return
    d["change_retention_count"] = count


def _check_history(where: str, t: Table, d: Table, problems: list[str]) -> None:
    """``history = { window = "7d", granularity = "1s" }`` (AMPS SOW ``History`` with
    ``Window`` and ``Granularity``; seeds/004): the topic keeps the previous state in its
    change events (``change_previous``) and its change feed for at least ``window``, by age
    only (count :data:`MAX_CHANGE_RETENTION_COUNT`), so ``sow --as-of`` can undo the changes
    after any point of the window (:mod:`sow_redis.query.history`)."""
    if "history" not in t:
        return
    value = d.pop("history")
    unknown = sorted(set(value) - {"window", "granularity"})
    if unknown:
        problems.append(f"{where}: 'history' has unknown field(s) {', '.join(unknown)} "
                        "(known: window, granularity)")
        return
    try:
        window = duration_text(value.get("window", 0))
        granularity = duration_text(value.get("granularity", 0))
    except ValueError as exc:
        problems.append(f"{where}: 'history': {exc}")
        return
    if parse_duration_ms(window) <= 0:
        problems.append(f"{where}: 'history' needs a window longer than 0, like \"7d\"")
        return
    if d.get("change_retention_count") == 0:
        problems.append(f"{where}: 'history' keeps the change feed: it cannot go with "
                        "change_retention = 0")
        return
    age = d.get("change_retention", DEFAULT_CHANGE_RETENTION)
    if 0 < parse_duration_ms(age) < parse_duration_ms(window):
        d["change_retention"] = window
    d["change_retention_count"] = MAX_CHANGE_RETENTION_COUNT
    d["change_previous"] = True
    d["history_window"], d["history_granularity"] = window, granularity


def _check_persistence(where: str, t: Table, d: Table, problems: list[str]) -> None:
    """``persistence`` ("persistent", the default, or "transient"; AMPS SOW ``Durability``),
    and a transient topic's ``recovery_point`` (AMPS ``RecoveryPoint``: "epoch", "now" or an
    ISO-8601 time) and ``log_retention`` (a duration > 0; default: the log is kept whole),
    which a persistent topic cannot set (seeds/004, "Durability")."""
    mode = t.get("persistence", "persistent")
    if mode not in PERSISTENCE:
        problems.append(f"{where}: 'persistence' must be \"persistent\" or \"transient\", "
                        f"got {mode!r}")
        return
    for name in ("recovery_point", "log_retention"):
        if name in t and mode != "transient":
            problems.append(f"{where}: '{name}' applies to a transient topic only "
                            "(persistence = \"transient\")")
    if "recovery_point" in t:
        try:
            parse_recovery_point(t["recovery_point"])
        except ValueError as exc:
            problems.append(f"{where}: 'recovery_point': {exc}")
    _check_positive_duration(where, t, d, "log_retention", problems)


def to_toml(topics: list[TopicConfig]) -> str:
    """The topics as a configuration file that :func:`parse_topics` reads back to the same
    definitions: one ``[[topic]]`` table each, with ``name``, ``key`` and every field that
    differs from its default (``key_generator`` and ``change_retention`` as tables)."""
    default = TopicConfig(name="-")
    out: list[Table] = []
    derived: dict[str, list[Table]] = {kind: [] for kind in DERIVED_KINDS}
    for t in topics:
        if t.derived:
            derived[t.kind].append(_derived_table(t))
            continue
        d: Table = {"name": t.name, "key": list(t.key)}
        for name in ("key_domain", "message_type", "partitions", "hash_index", "index",
                     "max_message_bytes", "partition_by", "expiration", "expiration_policy",
                     "dead_letter", "idle_expiration", "field_separator", "skip_msg_types",
                     "change_previous", "persistence", "recovery_point", "log_retention"):
            value = getattr(t, name)
            if value != getattr(default, name):
                d[name] = ([list(ix) for ix in value] if name == "hash_index"
                           else list(value) if isinstance(value, tuple) else value)
        if t.chaining:
            d["key_generator"] = {"type": "chaining", "primary": t.chain_primary,
                                  "secondary": list(t.chain_secondary),
                                  "validation": t.chain_validation}
        if t.history_window:
            d["history"] = {"window": t.history_window}
            if t.history_granularity:
                d["history"]["granularity"] = t.history_granularity
        if t.change_retention_count == 0:
            d["change_retention"] = 0
        elif (t.change_retention, t.change_retention_count) != (
                default.change_retention, default.change_retention_count):
            d["change_retention"] = {"age": t.change_retention,
                                     "count": t.change_retention_count}
        out.append(d)
    doc: JSONObject = {"topic": out} if out else {}
    doc.update({kind: tables for kind, tables in derived.items() if tables})
    return tomli_w.dumps(doc)


def _derived_table(t: TopicConfig) -> JSONObject:
    """The ``[[view]]`` or ``[[conflated_topic]]`` table of a derived topic."""
    d: JSONObject = {"name": t.name, "underlying": t.underlying}
    if t.joined:
        d["underlying"] = [t.underlying, t.joined]
        d["join"] = t.join[0] if t.join[0] == t.join[1] else list(t.join)
    if t.kind == "view":
        d["projection"], d["grouping"] = list(t.projection), list(t.grouping)
    else:
        d["interval"] = t.interval
    if t.filter:
        d["filter"] = t.filter
    if t.partitions != 1:
        d["partitions"] = t.partitions
    return d


def load_file(path: str) -> list[TopicConfig]:
    """Read and validate a TOML file (see :func:`parse_topics`).

    Raises:
        ConfigError: unreadable, not UTF-8, or invalid (one line per problem).
    """
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: not UTF-8 text (TOML files are UTF-8): invalid byte "
                           f"0x{raw[exc.start]:02x} at offset {exc.start}"]) from None
    return parse_topics(text, source=path)


# -- shape -----------------------------------------------------------------------------
def _show(v: object) -> str:
    return str(v) if isinstance(v, int) else orjson.dumps(v).decode()


def shape_changes(old: TopicConfig, new: TopicConfig) -> list[str]:
    """What differs between two definitions of a topic in :data:`SHAPE_FIELDS`, one text per
    field like ``'partitions' 8 → 4``; empty when records and logs stay valid as they are.

    The key domain is compared as used (the topic name when unset); ``key`` of a chaining
    topic as its chain fields (primary, then secondary); ``partition_by`` only when either
    definition has more than one partition.
    """
    out = []

    def diff(name: str, a: object, b: object) -> None:
        if a != b:
            out.append(f"'{name}' {_show(a)} → {_show(b)}")

    diff("partitions", old.partitions, new.partitions)
    if old.chaining or new.chaining:
        diff("key_generator", [old.key_generator, *old.chain_fields],
             [new.key_generator, *new.chain_fields])
    else:
        diff("key", list(old.key), list(new.key))
    diff("key_domain", old.domain, new.domain)
    diff("message_type", old.message_type, new.message_type)
    if max(old.partitions, new.partitions) > 1:
        diff("partition_by", list(old.partition_by), list(new.partition_by))
    diff("hash_index", [list(ix) for ix in old.hash_index], [list(ix) for ix in new.hash_index])
    diff("index", list(old.index), list(new.index))
    return out
