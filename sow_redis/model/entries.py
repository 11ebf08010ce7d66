"""Transaction-log entries, decoded once into typed :class:`LogEntry` objects.

A log entry (one stream entry of ``{sow:T:p}:log``, written by :mod:`sow_redis.publish.append` or
any Redis client) has the fields ``cmd`` (``publish`` | ``delta_publish`` | ``sow_delete``),
``data`` (the message; for ``sow_delete`` by data, the message whose record is removed),
``sow_key`` (publisher-supplied key), ``keys`` (``sow_delete`` by SOW keys, comma-separated),
``filter`` (``sow_delete`` by content filter) and ``expiration`` (seconds; ``0`` = never).

sow_redis's publisher adds what it already computed while validating (:func:`make_entry`):
``k``, the SOW key of the message (any topic without a chaining key generator), and ``m``, the
record's index members (a ``publish`` on a topic with hash or range indexes). Both are hints,
never trusted as read (any client with the right to append may write them): a worker checks
them against the data (:mod:`sow_redis.apply.keying`) and rejects an entry whose ``k`` or ``m`` is
not what the topic's definition gives (reasons ``forged_key``, ``forged_members``,
``wrong_partition``); verified, they spare the messages' round trip back to Redis
(``apply.lua`` (operation ``log``)). Another client writing to a log should leave both out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .. import streamids
from ..connection import Fields
from ..errors import MessageError
from .expiry import check_expiration
from .messages import decode
from .sowkey import is_valid_user_key
from .topic import TopicConfig
from .values import JSONObject


class Command(enum.Enum):
    """What a log entry asks (AMPS User Guide ch. 7; seeds/004)."""

    PUBLISH = "publish"
    DELTA_PUBLISH = "delta_publish"
    SOW_DELETE = "sow_delete"


_COMMANDS = {c.value.encode(): c for c in Command}


@dataclass(slots=True)
class LogEntry:
    """One decoded log entry.

    Attributes:
        id: stream id ``"<ms>-<n>"``; ``ms`` its time (ms, Redis server clock): the entry sees
            the SOW as of this time.
        obj: the decoded message (None for a ``sow_delete`` by keys or by filter).
        sow_key: the publisher-supplied SOW key, if any.
        prepared_key: the SOW key sow_redis's publisher computed (field ``k``), if any.
        expiration_s: the message's own lifetime in seconds (None: the topic's).
        delete_keys / delete_filter: a ``sow_delete`` by SOW keys / by content filter.
        fields: the raw stream fields (kept for the error stream).
    """

    id: str
    ms: int
    command: Command
    fields: dict[bytes, bytes]
    data: bytes | None = None
    obj: JSONObject | None = None
    sow_key: str | None = None
    prepared_key: str | None = None
    expiration_s: float | None = None
    delete_keys: list[str] | None = None
    delete_filter: str | None = None

    @property
    def is_filter_delete(self) -> bool:
        return self.delete_filter is not None


def decode_entry(sid: bytes, fields: dict[bytes, bytes], topic: TopicConfig) -> LogEntry:
    """Decode and check one raw log entry of ``topic``.

    Raises:
        MessageError: ``bad_command`` (unknown ``cmd``, missing data / keys / filter),
            ``bad_sow_key`` (a key of a delete by keys is no SOW key), the reasons of
            :func:`messages.decode` and :func:`expiry.check_expiration`.
        UnicodeDecodeError: a key list, filter or SOW key that is not UTF-8.
    """
    id_ = sid.decode()
    cmd_b = fields.get(b"cmd") or b"publish"
    command = _COMMANDS.get(cmd_b)
    if command is None:
        raise MessageError("bad_command", f"unknown cmd {cmd_b.decode(errors='replace')[:80]!r}")
    ms, dash, _n = id_.partition("-")  # ids come from Redis: "<ms>-<n>"
    entry = LogEntry(id_, int(ms) if dash else streamids.ms_of(id_), command, fields)
    data = fields.get(b"data")
    supplied = fields.get(b"sow_key")
    entry.sow_key = supplied.decode() if supplied else None
    prepared = fields.get(b"k")
    if prepared:
        entry.prepared_key = prepared.decode()
    if data is None:
        if command is not Command.SOW_DELETE:
            raise MessageError("bad_command", f"{command.value} without data")
        if b"keys" in fields:
            entry.delete_keys = [k for k in fields[b"keys"].decode().split(",") if k]
            for k in entry.delete_keys:
                if not is_valid_user_key(k):
                    raise MessageError("bad_sow_key",
                                       f"SOW key {k[:80]!r} has characters outside Base64")
        elif b"filter" in fields:
            entry.delete_filter = fields[b"filter"].decode()
        else:
            raise MessageError("bad_command", "sow_delete needs data, keys or filter")
        return entry
    entry.data = data
    entry.obj = decode(data, topic)
    if b"expiration" in fields:
        entry.expiration_s = check_expiration(fields[b"expiration"])
    return entry


def make_entry(cmd: str, data: bytes, sow_key: str | None, expiration: float | None,
               prepared_key: str = "", members: str = "") -> Fields:
    """The stream fields of a ``publish`` / ``delta_publish`` / ``sow_delete`` (by data) entry.

    Args:
        sow_key: the publisher-supplied SOW key (field ``sow_key``), or None.
        expiration: the message's own lifetime in seconds (``0`` = never), or None.
        prepared_key: the SOW key computed by the publisher (field ``k``; "" = not computed:
            chaining topics, whose key the worker resolves).
        members: the index members of a ``publish`` (field ``m``; "" = none).
    """
    e: Fields = {"cmd": cmd, "data": data}
    if sow_key:
        e["sow_key"] = sow_key
    if expiration is not None:
        e["expiration"] = repr(expiration)
    if prepared_key:
        e["k"] = prepared_key
        if members:
            e["m"] = members
    return e


def original(fields: dict[bytes, bytes]) -> tuple[bytes, bytes, bytes]:
    """``(cmd, data, sow_key)`` bytes of a raw entry for its error-stream record (``data`` is
    the filter or key list of a ``sow_delete`` without data)."""
    return (fields.get(b"cmd") or b"",
            fields.get(b"data") or fields.get(b"filter") or fields.get(b"keys") or b"",
            fields.get(b"sow_key") or b"")
