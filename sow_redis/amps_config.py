"""Import an AMPS configuration's SOW topics into sow_redis's TOML (``sow-redis config
import-amps``).

Translated, per ``<SOW><Topic>`` (AMPS User Guide ch. 7 "SOW Configuration", seeds/004; the
chaining key generator of seeds/003; expiration of seeds/000 and 004):

* ``Name`` → ``name``; ``Key`` (one or more) → ``key``; ``KeyDomain`` → ``key_domain``;
* ``MessageType`` ``json`` / ``fix`` → ``message_type`` (other types: the topic is skipped);
* ``Expiration`` (a duration, ``enabled`` or ``disabled``) → ``expiration``;
* ``HashIndex`` (its ``Key`` children) → one ``hash_index`` entry each;
* ``KeyGenerator`` whose module is the chaining key generator (a ``Modules/Module`` with
  ``libamps_id_chaining_key_generator`` as ``Library``, or a module name containing
  ``chaining``), with ``Options`` ``Primary`` (else the first ``Key``), ``Key`` (secondary)
  and ``Validation`` → ``key_generator = { type = "chaining", primary, secondary,
  validation }`` on one partition (a chain must stay in one partition; add ``partition_by`` for
  more). Any other key generator module: the topic is skipped.

Every other element is listed as not translated (``FileName``, ``SlabSize``, ``Index``, …:
storage and tuning of AMPS itself), one line each with its path.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

CHAINING_LIBRARY = "libamps_id_chaining_key_generator"
KNOWN = {"Name", "Key", "KeyDomain", "MessageType", "Expiration", "HashIndex", "KeyGenerator"}


@dataclass
class Imported:
    """The result of an import: topic tables (TOML-ready dicts) and the lines naming what
    was not translated."""

    topics: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _sow_sections(text: str) -> list[ET.Element]:
    """The ``<SOW>`` elements of a configuration: the whole document, or (for excerpts such as
    documentation) each ``<SOW>…</SOW>`` block, with ``...`` placeholder lines removed."""
    if re.search(r"<!DOCTYPE|<!ENTITY", text, re.I):
        raise ConfigError(["the configuration declares a DOCTYPE or ENTITY: refused "
                           "(entity expansion)"])
    blocks = re.findall(r"<SOW>.*?</SOW>", text, re.S)
    if not blocks:
        raise ConfigError(["no <SOW> section found"])
    out = []
    for i, block in enumerate(blocks, 1):
        cleaned = "\n".join(ln for ln in block.splitlines() if ln.strip() != "...")
        try:
            out.append(ET.fromstring(cleaned))
        except ET.ParseError as exc:
            raise ConfigError([f"<SOW> section {i}: not well-formed XML: {exc}"]) from None
    return out


def _chaining_modules(text: str) -> set[str]:
    """Names of the modules whose library is the chaining key generator."""
    names = set()
    for block in re.findall(r"<Module>.*?</Module>", text, re.S):
        if CHAINING_LIBRARY in block:
            m = re.search(r"<Name>\s*([^<]+?)\s*</Name>", block)
            if m:
                names.add(m.group(1))
    return names


def _text(el: ET.Element | None) -> str:
    return (el.text or "").strip() if el is not None else ""


def import_amps(text: str) -> Imported:
    """Translate the SOW topics of an AMPS configuration (XML text).

    Raises:
        ConfigError: no ``<SOW>`` section, not well-formed XML, or DOCTYPE/ENTITY declared.
    """
    chaining = _chaining_modules(text)
    out = Imported()
    for sow in _sow_sections(text):
        for n, topic in enumerate(sow.findall("Topic"), 1):
            name = _text(topic.find("Name"))
            where = f"SOW/Topic[{name or n}]"
            if not name:
                out.skipped.append(f"{where}: no Name: topic skipped")
                continue
            t: dict[str, Any] = {"name": name}
            skip_reason = ""
            for child in topic:
                tag = child.tag
                if tag not in KNOWN:
                    out.skipped.append(f"{where}/{tag}: not translated (AMPS storage or "
                                       "tuning setting)")
            keys = [_text(k) for k in topic.findall("Key") if _text(k)]
            if keys:
                t["key"] = keys
            if _text(topic.find("KeyDomain")):
                t["key_domain"] = _text(topic.find("KeyDomain"))
            mtype = _text(topic.find("MessageType")).lower()
            if mtype in ("json", "fix"):
                t["message_type"] = mtype
            elif mtype:
                skip_reason = f"MessageType {mtype!r} is not supported (json, fix)"
            exp = _text(topic.find("Expiration"))
            if exp:
                t["expiration"] = exp
            indexes = [[_text(k) for k in hi.findall("Key") if _text(k)]
                       for hi in topic.findall("HashIndex")]
            if any(indexes):
                t["hash_index"] = [ix for ix in indexes if ix]
            kg = topic.find("KeyGenerator")
            if kg is not None and not skip_reason:
                skip_reason = _key_generator(kg, chaining, t, where, out)
            if skip_reason:
                out.skipped.append(f"{where}: {skip_reason}: topic skipped")
                continue
            out.topics.append(t)
    return out


def _key_generator(kg: ET.Element, chaining: set[str], t: dict[str, Any], where: str,
                   out: Imported) -> str:
    """Fill ``t`` from a chaining ``KeyGenerator``; the reason to skip the topic otherwise."""
    module = _text(kg.find("Module"))
    if module not in chaining and "chaining" not in module.lower():
        return f"KeyGenerator module {module!r} is not the chaining key generator"
    opts = kg.find("Options")
    opts = opts if opts is not None else ET.Element("Options")
    keys = [_text(k) for k in opts.findall("Key") if _text(k)]
    primary = _text(opts.find("Primary"))
    if not primary:
        if not keys:
            return "the chaining KeyGenerator has no Primary or Key option"
        primary, keys = keys[0], keys[1:]
    gen: dict[str, Any] = {"type": "chaining", "primary": primary}
    if keys:
        gen["secondary"] = keys
    validation = _text(opts.find("Validation")).lower()
    if validation:
        gen["validation"] = validation in ("true", "1", "yes", "enabled")
    for child in opts:
        if child.tag not in ("Key", "Primary", "Validation"):
            out.skipped.append(f"{where}/KeyGenerator/Options/{child.tag}: not translated "
                               "(the chain table lives in Redis)")
    t["key_generator"] = gen
    t.pop("key", None)
    t["partitions"] = 1
    return ""


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML form for {v!r}")


def to_toml(imported: Imported, source: str = "") -> str:
    """The topics as a sow_redis configuration file."""
    head = f"# imported from the AMPS configuration {source}\n" if source else ""
    parts = [head]
    for t in imported.topics:
        parts.append("[[topic]]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in t.items()))
    return "\n".join(parts)
