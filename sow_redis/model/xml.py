"""The XML message type (``message_type = "xml"``; the AMPS ``MessageType xml`` of the seed's
ALERTS example, seeds/004): XML messages stored as JSON objects so keys, filters, indexes,
expiry and subscriptions work on them as on JSON.

A message is one XML document. Its root element becomes the object's single top-level field,
so field paths read like XPath from the document root (``<order><id>7</id></order>`` →
``{"order": {"id": "7"}}``, path ``/order/id``):

* an element with child elements is an object of them; one with text only is its text (a
  string, as FIX fields are: a filter compares ``/order/qty > 5`` numerically all the same);
  an empty element is ``""``;
* an element repeated under one parent is an array of its occurrences;
* an attribute is a field ``@name`` of its element's object (``<order id="7"/>`` →
  ``{"order": {"@id": "7"}}``): a key field may name it (``key = ["/order/@id"]``); filter
  paths are word characters, so a filter reads elements, not attributes;
* text beside child elements (mixed content) is kept under ``#text``.

A document type declaration (DTD), and with it any entity declaration or external
reference, is refused (``bad_xml``: no entity expansion), in whatever encoding the document
declares; so is text that is not well-formed XML. The parsing is defusedxml's
(``defusedxml.ElementTree``, over the standard library's expat parser). :func:`encode` writes
an object back as XML (``sow --format xml``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape, quoteattr

import orjson
from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring

from ..errors import MessageError
from .values import JSON, JSONObject


def to_message(data: bytes) -> tuple[bytes, JSONObject]:
    """``(JSON text, object)`` of one XML message.

    Raises:
        MessageError: ``bad_xml`` (not well-formed, a DOCTYPE, ENTITY or external
            reference, or a document without a root element).
    """
    try:
        root = fromstring(data, forbid_dtd=True)
    except DefusedXmlException as exc:
        raise MessageError("bad_xml", f"the message declares a DOCTYPE or ENTITY: refused "
                           f"(entity expansion; {exc})") from None
    except ET.ParseError as exc:
        raise MessageError("bad_xml", f"not well-formed XML ({exc})") from None
    obj: JSONObject = {root.tag: _value(root)}
    return orjson.dumps(obj), obj


def _value(el: ET.Element) -> JSON:
    children = list(el)
    if not children and not el.attrib:
        return (el.text or "").strip()
    out: JSONObject = {f"@{k}": v for k, v in el.attrib.items()}
    for child in children:
        value = _value(child)
        existing = out.get(child.tag)
        if child.tag not in out:
            out[child.tag] = value
        elif isinstance(existing, list):  # _value returns no list: this is a repetition
            existing.append(value)
        else:
            out[child.tag] = [existing, value]
    text = (el.text or "").strip()
    if text:
        out["#text"] = text
    return out


def encode(obj: JSONObject) -> bytes:
    """An object (as :func:`to_message` makes them) written as XML."""
    return "".join(_element(tag, value) for tag, value in obj.items()).encode()


def _element(tag: str, value: JSON) -> str:
    if isinstance(value, list):
        return "".join(_element(tag, item) for item in value)
    if not isinstance(value, dict):
        text = "" if value is None else value if isinstance(value, str) else \
            orjson.dumps(value).decode()
        return f"<{tag}>{escape(text)}</{tag}>"
    attrs = "".join(f" {k[1:]}={quoteattr(str(v))}" for k, v in value.items()
                    if k.startswith("@"))
    inner = "".join(_element(k, v) for k, v in value.items()
                    if not k.startswith("@") and k != "#text")
    text = escape(str(value.get("#text", "")))
    return f"<{tag}{attrs}>{text}{inner}</{tag}>"
