"""The XML message type (issue 25; the seed's ALERTS example, MessageType xml): XML messages
are keyed, filtered and queried like JSON ones and written back as XML."""

from __future__ import annotations

import pytest

from sow_redis.errors import MessageError
from sow_redis.model.xml import encode, to_message
from conftest import run_cli

ALERT = (b'<alert id="a1"><sym>IBM</sym><level>3</level><tags><tag>x</tag><tag>y</tag></tags>'
         b"<note/></alert>")


def test_xml_to_object_and_back():
    _data, obj = to_message(ALERT)
    assert obj == {"alert": {"@id": "a1", "sym": "IBM", "level": "3",
                             "tags": {"tag": ["x", "y"]}, "note": ""}}
    assert to_message(encode(obj))[1] == obj
    utf16 = '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE x [<!ENTITY e "x">]><a>&e;</a>'
    for bad in (b"<a><b></a>", b'<!DOCTYPE x [<!ENTITY e "x">]><a>&e;</a>', b"plain",
                utf16.encode("utf-16"), b'<!doctype a SYSTEM "file:///etc/passwd"><a/>'):
        with pytest.raises(MessageError) as info:
            to_message(bad)
        assert info.value.reason == "bad_xml"


def test_an_xml_topic_is_keyed_filtered_and_printed_as_xml(sow, topic_name, url):
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nmessage_type = "xml"\n'
                     'key = ["/alert/@id"]\npartitions = 2\n')
    sow.publish(topic_name, [ALERT, b'<alert id="a2"><sym>MSFT</sym><level>7</level></alert>',
                             b'<alert id="a1"><sym>IBM</sym><level>5</level></alert>'])
    res = sow.publish(topic_name, [b"<alert><broken></alert>"])
    assert [r.reason for r in res.rejected] == ["bad_xml"]
    assert sorted(r.obj()["alert"]["@id"] for r in sow.sow(topic_name)) == ["a1", "a2"]
    high = sow.sow(topic_name, "/alert/level > 4 AND /alert/sym = 'IBM'")
    assert [r.obj()["alert"]["level"] for r in high] == ["5"]
    if url.startswith("redis://") and sow.url == url:
        out = run_cli(url, "sow", "-t", topic_name, "-f", "/alert/sym = 'MSFT'", "--format", "xml")
        assert out.stdout == b'<alert id="a2"><sym>MSFT</sym><level>7</level></alert>\n'
