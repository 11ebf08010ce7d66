"""Import an AMPS configuration's SOW topics into sow_redis's TOML (``sow-redis config
import-amps``).

Translated, per ``<SOW><Topic>`` (AMPS User Guide ch. 7 "SOW Configuration", seeds/004; the
chaining key generator of seeds/003; expiration of seeds/000 and 004):

* ``Name`` → ``name``; ``Key`` (one or more) → ``key``; ``KeyDomain`` → ``key_domain``;
* ``MessageType`` ``json`` / ``fix`` / ``xml`` (any case) → ``message_type`` (other types:
  the topic is skipped);
* ``Expiration`` → ``expiration``: ``enabled`` / ``disabled`` as they are, a duration with an
  AMPS interval unit (``ns``, ``us``, ``ms``, ``s``, ``m``, ``h``, ``d``, ``w``; no unit =
  seconds) in the units of :func:`sow_redis.config.parse_duration_ms` (``1w`` → ``7d``,
  ``1500us`` → ``2ms``: whole milliseconds);
* ``HashIndex`` (its ``Key`` children) → one ``hash_index`` entry each;
* ``Durability`` ``transient`` (any case) → ``persistence = "transient"``, ``persistent``
  (the default) → nothing; a transient topic's ``RecoveryPoint`` ``epoch`` / ``now`` (any
  case) → ``recovery_point`` as it is, an AMPS timestamp (``20261127T060000``, UTC) → the
  ISO-8601 time (``"2026-11-27T06:00:00Z"``); a bookmark or another value is listed as not
  translated (seeds/004, "Durability");
* ``Index`` (a field path: a memo index AMPS is asked to create ahead of queries) → one
  ``index`` entry each (a range index; sow_redis keeps only the indexes configured);
* ``History`` with ``Window`` (and ``Granularity``), AMPS interval units as for
  ``Expiration`` → ``history = { window, granularity }`` (seeds/004, "historical
  snapshots"); a ``History`` without a ``Window`` is listed as not translated;
* ``KeyGenerator`` whose module is the chaining key generator (a ``Modules/Module`` with
  ``libamps_id_chaining_key_generator`` in its ``Library``, or a module name containing
  ``chaining``), with ``Options`` ``Primary`` (else the first ``Key``), ``Key`` and
  ``Secondary`` (secondary fields) and ``Validation`` (``true``/``1``) → ``key_generator =
  { type = "chaining", primary, secondary, validation }`` on one partition (a chain must stay
  in one partition; add ``partition_by`` for more). Any other key generator module: the topic
  is skipped.

Per ``<SOW><View>`` (AMPS ``View``) → a ``[[view]]`` table: ``Name``, ``UnderlyingTopic``
(one topic; a ``Join`` is not translated), ``Projection`` and ``Grouping`` (their ``Field``
children, e.g. ``COUNT(/id) AS /orders``), ``Filter``. Per ``<SOW><ConflatedTopic>`` → a
``[[conflated_topic]]`` table: ``Name``, ``UnderlyingTopic``, ``Interval`` (AMPS interval
units, as for ``Expiration``), ``Filter``. A ``MessageType`` other than ``json`` skips them.

Everything else is listed as not translated, one line each with its element path
(``SOW/Topic[ORDERS]/FileName``, ``SOW/Topic[Orders]/KeyGenerator/Options/FileName``,
``SOW/Queue[1]``, …): AMPS storage and tuning settings (``FileName``, ``SlabSize``,
…), other children of ``<SOW>`` (queues, …), projections
sow_redis cannot compute (expressions such as ``SUM(/px * /qty)``)
and topics that cannot be expressed (the line says why: message type, key generator, a name
defined twice, a value sow_redis refuses). Each translated topic is checked with
:func:`sow_redis.config.parse_topics`, so the output always loads.

Input: a whole configuration file, or a documentation excerpt holding ``<SOW>…</SOW>`` blocks
with ``...`` placeholder lines (read block by block when the text as a whole is not XML).
A DOCTYPE or ENTITY declaration is refused (no entity expansion).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ..config import parse_topics
from ..errors import ConfigError
from ..model.values import JSONObject

CHAINING_LIBRARY = "libamps_id_chaining_key_generator"
TRANSLATED = {"Name", "Key", "KeyDomain", "MessageType", "Expiration", "HashIndex",
              "KeyGenerator", "Durability", "RecoveryPoint", "Index", "History"}
CHAIN_OPTIONS = {"Key", "Primary", "Secondary", "Validation"}
_AMPS_UNITS_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9,
                  "h": 3600 * 10**9, "d": 86_400 * 10**9, "w": 7 * 86_400 * 10**9}
"""AMPS interval units (AMPS Configuration Guide, "Units, Intervals") in nanoseconds."""
_INTERVAL = re.compile(r"^(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h|d|w)?$")


@dataclass
class Imported:
    """The result of an import: topic tables (TOML-ready dicts, in file order) and the lines
    naming what was not translated (``<element path>: <why>``)."""

    topics: list[JSONObject] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    derived: list[tuple[str, JSONObject]] = field(default_factory=list)
    """``(kind, table)`` of each view (``view``) and conflated topic (``conflated_topic``)."""


def _text(el: ET.Element | None) -> str:
    return (el.text or "").strip() if el is not None else ""


def _parse(text: str) -> tuple[list[ET.Element], set[str], list[str]]:
    """The ``<SOW>`` elements, the names of the chaining modules and notes on how the text was
    read.

    Raises:
        ConfigError: DOCTYPE/ENTITY declared, no ``<SOW>`` section, or a section that is not
            well-formed XML.
    """
    if re.search(r"<!DOCTYPE|<!ENTITY", text, re.I):
        raise ConfigError(["the configuration declares a DOCTYPE or ENTITY: refused "
                           "(entity expansion)"])
    notes: list[str] = []
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        whole_error = str(exc)
    else:
        sows = [root] if root.tag == "SOW" else list(root.iter("SOW"))
        if not sows:
            raise ConfigError(["no <SOW> section found"])
        return sows, _chaining_modules(root.iter("Module")), notes
    # a documentation excerpt: each <SOW> / <Modules> block on its own, "..." lines removed
    blocks = re.findall(r"<SOW>.*?</SOW>", text, re.S)
    if not blocks:
        if "<SOW>" in text:
            raise ConfigError([f"not well-formed XML: {whole_error}"])
        raise ConfigError(["no <SOW> section found"])
    if re.search(r"<AMPSConfig\b", text):
        notes.append(f"(document): not well-formed XML as a whole ({whole_error}): each "
                     "<SOW> section read on its own")
    sows = [_fragment(block, f"<SOW> section {i}") for i, block in enumerate(blocks, 1)]
    modules: list[ET.Element] = []
    for block in re.findall(r"<Module>.*?</Module>", text, re.S):
        try:  # a module that does not read is no chaining module
            modules.append(_fragment(block, "<Module>"))
        except ConfigError:
            continue
    return sows, _chaining_modules(modules), notes


def _fragment(block: str, what: str) -> ET.Element:
    cleaned = "\n".join(ln for ln in block.splitlines() if ln.strip() != "...")
    try:
        return ET.fromstring(cleaned)
    except ET.ParseError as exc:
        raise ConfigError([f"{what}: not well-formed XML: {exc}"]) from None


def _chaining_modules(modules: Iterable[ET.Element]) -> set[str]:
    """Names of the ``Module`` elements whose ``Library`` is the chaining key generator."""
    return {_text(m.find("Name")) for m in modules
            if CHAINING_LIBRARY in _text(m.find("Library")) and _text(m.find("Name"))}


def amps_interval(value: str) -> str:
    """An AMPS ``Expiration`` value in sow_redis's terms: ``enabled`` / ``disabled`` (any
    case), or a duration (``30s``, ``1w``, ``1500us``; AMPS interval units, no unit =
    seconds) as text :func:`sow_redis.config.parse_duration_ms` reads, in whole milliseconds
    or the original unit when it is one of ``ms s m h d``.

    Raises:
        ValueError: not ``enabled``/``disabled`` nor a duration, or a non-zero duration
            shorter than half a millisecond (sow_redis counts whole milliseconds).
    """
    v = value.strip().lower()
    if v in ("enabled", "disabled"):
        return v
    m = _INTERVAL.match(v)
    if not m:
        raise ValueError(f"{value!r} is not a duration (e.g. 30s, 5m, 1h), enabled or disabled")
    number, unit = m.group(1), m.group(2) or "s"
    if unit in ("ms", "s", "m", "h", "d"):
        return f"{number}{unit}"
    ns = round(float(number) * _AMPS_UNITS_NS[unit])
    if unit == "w":
        days = ns / _AMPS_UNITS_NS["d"]
        return f"{int(days)}d" if days.is_integer() else f"{days}d"
    ms = round(ns / 1_000_000)
    if ms == 0 and ns > 0:
        raise ValueError(f"{value!r} is shorter than a millisecond, the resolution of sow_redis")
    return f"{ms}ms"


def import_amps(text: str) -> Imported:
    """Translate the SOW topics of an AMPS configuration (XML text) as described in the module
    docstring.

    Returns:
        The translated topics (each loads with :func:`sow_redis.config.parse_topics`) and one
        line per element or topic not translated.

    Raises:
        ConfigError: no ``<SOW>`` section, not well-formed XML, or DOCTYPE/ENTITY declared.
    """
    sows, chaining, notes = _parse(text)
    out = Imported(skipped=list(notes))
    seen: set[str] = set()
    for sow in sows:
        others: dict[str, int] = {}
        for child in sow:
            if child.tag in DERIVED_TAGS:
                _derived(child, out, seen)
            elif child.tag != "Topic":
                others[child.tag] = others.get(child.tag, 0) + 1
                label = _text(child.find("Name")) or str(others[child.tag])
                out.skipped.append(f"SOW/{child.tag}[{label}]: not translated (sow_redis has "
                                   "SOW topics, views and conflated topics: no queues)")
        for n, topic in enumerate(sow.findall("Topic"), 1):
            t = _topic(topic, n, chaining, out)
            if t is None:
                continue
            where = f"SOW/Topic[{t['name']}]"
            if t["name"] in seen:
                out.skipped.append(f"{where}: a topic of this name is already imported (AMPS "
                                   "scopes names by message type, sow_redis does not): topic "
                                   "skipped")
                continue
            try:
                parse_topics(to_toml(Imported(topics=[t])), source=where)
            except ConfigError as exc:
                for problem in exc.problems:
                    for prefix in (f"{where}: topic #1 '{t['name']}': ", f"{where}: topic #1: "):
                        problem = problem.removeprefix(prefix)
                    out.skipped.append(f"{where}: {problem}: topic skipped")
                continue
            seen.add(t["name"])
            out.topics.append(t)
    return out


DERIVED_TAGS = {"View": "view", "ConflatedTopic": "conflated_topic"}
"""AMPS ``<SOW>`` children translated into derived topics (:mod:`sow_redis.derive`)."""

_DERIVED_TRANSLATED = {"Name", "UnderlyingTopic", "Projection", "Grouping", "Filter",
                       "Interval", "MessageType"}


def _derived(el: ET.Element, out: Imported, seen: set[str]) -> None:
    """Translate one ``<View>`` or ``<ConflatedTopic>`` into ``out.derived`` (or say in
    ``out.skipped`` why not)."""
    kind, name = DERIVED_TAGS[el.tag], _text(el.find("Name"))
    where = f"SOW/{el.tag}[{name or '?'}]"
    for child in el:
        if child.tag not in _DERIVED_TRANSLATED:
            out.skipped.append(f"{where}/{child.tag}: not translated")
    mt = _text(el.find("MessageType")).lower()
    under = el.find("UnderlyingTopic")
    why = ("no Name" if not name else f"message type {mt!r} (sow_redis: json)"
           if mt not in ("", "json") else "a join of topics is not translated"
           if under is not None and under.find("Join") is not None else "no UnderlyingTopic"
           if not _text(under) else "")
    if why:
        out.skipped.append(f"{where}: {why}: skipped")
        return
    table: JSONObject = {"name": name, "underlying": _text(under)}
    if kind == "view":
        for part in ("Projection", "Grouping"):
            table[part.lower()] = [_text(f) for f in el.findall(f"{part}/Field") if _text(f)]
    else:
        try:
            table["interval"] = amps_interval(_text(el.find("Interval")) or "0")
        except ValueError as exc:
            out.skipped.append(f"{where}/Interval: {exc}: skipped")
            return
    if _text(el.find("Filter")):
        table["filter"] = _text(el.find("Filter"))
    try:
        parse_topics(to_toml(Imported(derived=[(kind, table)])), source=where)
    except ConfigError as exc:
        for problem in exc.problems:
            problem = re.sub(rf"^{re.escape(where)}: {kind} #1 '[^']*': ", "", problem)
            out.skipped.append(f"{where}: {problem}: skipped")
        return
    if name in seen:
        out.skipped.append(f"{where}: a topic of this name is already imported: skipped")
        return
    seen.add(name)
    out.derived.append((kind, table))


def _topic(topic: ET.Element, n: int, chaining: set[str], out: Imported
           ) -> JSONObject | None:
    """The TOML table of one ``<Topic>``, or None (the reason appended to ``out.skipped``)."""
    name = _text(topic.find("Name"))
    where = f"SOW/Topic[{name or n}]"
    if not name:
        out.skipped.append(f"{where}: no Name: topic skipped")
        return None
    t: JSONObject = {"name": name}
    for child in topic:
        if child.tag not in TRANSLATED:
            out.skipped.append(f"{where}/{child.tag}: not translated (AMPS storage or tuning "
                               "setting)")
    keys = [_text(k) for k in topic.findall("Key") if _text(k)]
    if keys:
        t["key"] = keys
    if _text(topic.find("KeyDomain")):
        t["key_domain"] = _text(topic.find("KeyDomain"))
    mtype = _text(topic.find("MessageType")).lower()
    if mtype in ("json", "fix", "xml"):
        t["message_type"] = mtype
    elif mtype:
        out.skipped.append(f"{where}: MessageType {mtype!r} is not supported (json, fix, xml): "
                           "topic skipped")
        return None
    exp = _text(topic.find("Expiration"))
    if exp:
        try:
            t["expiration"] = amps_interval(exp)
        except ValueError as exc:
            out.skipped.append(f"{where}/Expiration: not translated: {exc}")
    _durability(topic, t, where, out)
    _history(topic, t, where, out)
    indexes = _hash_indexes(topic, where, out)
    if indexes:
        t["hash_index"] = indexes
    memo = list(dict.fromkeys(_text(ix) for ix in topic.findall("Index") if _text(ix)))
    if memo:
        t["index"] = memo
    kg = topic.find("KeyGenerator")
    if kg is not None:
        reason = _key_generator(kg, chaining, t, where, out)
        if reason:
            out.skipped.append(f"{where}: {reason}: topic skipped")
            return None
    return t


def _durability(topic: ET.Element, t: JSONObject, where: str, out: Imported) -> None:
    """``Durability`` and ``RecoveryPoint`` into ``t`` (see the module docstring); what
    cannot be translated is appended to ``out.skipped``."""
    durability = _text(topic.find("Durability")).lower()
    if durability == "transient":
        t["persistence"] = "transient"
    elif durability not in ("", "persistent"):
        out.skipped.append(f"{where}/Durability: not translated: {durability!r} is neither "
                           "persistent nor transient")
    point = _text(topic.find("RecoveryPoint"))
    if not point:
        return
    if durability != "transient":
        out.skipped.append(f"{where}/RecoveryPoint: not translated: applies to a transient "
                           "topic only")
        return
    if point.lower() in ("epoch", "now"):
        t["recovery_point"] = point.lower()
        return
    try:
        at = datetime.fromisoformat(point)
    except ValueError:
        out.skipped.append(f"{where}/RecoveryPoint: not translated: {point!r} is not epoch, "
                           "now or a timestamp (a bookmark has no sow_redis equivalent)")
        return
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    t["recovery_point"] = at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _history(topic: ET.Element, t: JSONObject, where: str, out: Imported) -> None:
    """``History`` (``Window``, ``Granularity``) into ``t`` as ``history``; what cannot be
    translated is appended to ``out.skipped``."""
    history = topic.find("History")
    if history is None:
        return
    for child in history:
        if child.tag not in ("Window", "Granularity"):
            out.skipped.append(f"{where}/History/{child.tag}: not translated")
    window, granularity = _text(history.find("Window")), _text(history.find("Granularity"))
    if not window:
        out.skipped.append(f"{where}/History: not translated: no Window")
        return
    try:
        value = {"window": amps_interval(window)}
        if granularity:
            value["granularity"] = amps_interval(granularity)
    except ValueError as exc:
        out.skipped.append(f"{where}/History: not translated: {exc}")
        return
    if {"enabled", "disabled"} & set(value.values()):
        out.skipped.append(f"{where}/History: not translated: Window and Granularity are "
                           "durations")
        return
    t["history"] = value


def _hash_indexes(topic: ET.Element, where: str, out: Imported) -> list[list[str]]:
    """The key lists of a ``<Topic>``'s ``<HashIndex>`` elements (what is not translated,
    and an index without a Key, appended to ``out.skipped``)."""
    indexes = []
    for i, hi in enumerate(topic.findall("HashIndex"), 1):
        for child in hi:
            if child.tag != "Key":
                out.skipped.append(f"{where}/HashIndex[{i}]/{child.tag}: not translated")
        ix = [_text(k) for k in hi.findall("Key") if _text(k)]
        if ix:
            indexes.append(ix)
        else:
            out.skipped.append(f"{where}/HashIndex[{i}]: no Key: not translated")
    return indexes


def _key_generator(kg: ET.Element, chaining: set[str], t: JSONObject, where: str,
                   out: Imported) -> str:
    """Fill ``t`` from a chaining ``KeyGenerator``; the reason to skip the topic otherwise."""
    module = _text(kg.find("Module"))
    if module not in chaining and "chaining" not in module.lower():
        return f"KeyGenerator module {module!r} is not the chaining key generator"
    for child in kg:
        if child.tag not in ("Module", "Options"):
            out.skipped.append(f"{where}/KeyGenerator/{child.tag}: not translated")
    opts = kg.find("Options")
    opts = opts if opts is not None else ET.Element("Options")
    keys = [_text(k) for k in opts if k.tag in ("Key", "Secondary") and _text(k)]
    primary = _text(opts.find("Primary"))
    if not primary:
        first_key = next((_text(k) for k in opts.findall("Key") if _text(k)), "")
        if not first_key:
            return "the chaining KeyGenerator has no Primary or Key option"
        primary = first_key
        keys.remove(first_key)
    gen: JSONObject = {"type": "chaining", "primary": primary}
    if keys:
        gen["secondary"] = keys
    validation = _text(opts.find("Validation")).lower()
    if validation:
        gen["validation"] = validation in ("true", "1", "yes", "enabled")
    for child in opts:
        if child.tag not in CHAIN_OPTIONS:
            out.skipped.append(f"{where}/KeyGenerator/Options/{child.tag}: not translated "
                               "(the chain table lives in Redis)")
    t["key_generator"] = gen
    if "key" in t:
        out.skipped.append(f"{where}/Key: not translated (the KeyGenerator makes the SOW key)")
        del t["key"]
    t["partitions"] = 1
    return ""


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        escaped = "".join(c if c.isprintable() and c not in '"\\' else
                          {'"': '\\"', "\\": "\\\\"}.get(c, f"\\U{ord(c):08x}") for c in v)
        return f'"{escaped}"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML form for {v!r}")


def to_toml(imported: Imported, source: str = "") -> str:
    """The topics as a sow_redis configuration file (TOML text, ``[[topic]]`` tables in
    order; the header comment names ``source`` when given)."""
    source = " ".join(source.split())
    head = f"# imported from the AMPS configuration {source}\n" if source else ""
    parts = [head]
    for t in imported.topics:
        parts.append("[[topic]]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in t.items()))
    for kind, d in imported.derived:
        parts.append(f"[[{kind}]]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in d.items()))
    return "\n".join(parts)
