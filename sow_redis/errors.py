"""One exception tree, rooted at :class:`SowError`.

Lua scripts report expected outcomes as error replies of the form
``SOW_<CODE> detail``; :func:`from_script_error` maps them onto these classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


class SowError(Exception):
    """Base of every error sow_redis raises on purpose."""


class ConfigError(SowError):
    """A topic configuration is invalid. ``problems`` lists one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class UnknownTopicError(SowError):
    """The topic is not defined in the registry (run ``sow-redis config apply``)."""


class MessageError(SowError):
    """A message cannot be accepted: bad JSON, not an object, missing key field, too large,
    bad SOW key. ``reason`` is a short machine-readable code, the message text says why."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class FilterSyntaxError(SowError):
    """A content filter does not parse; the message names the position (1-based column)."""


class FilterEvalError(SowError):
    """A compiled content filter failed while evaluating a record (one-line message)."""


class FencedError(SowError):
    """A worker's fencing token is stale: another worker took over the partition lease."""


class ConflictError(SowError):
    """A record changed between a worker reading it and applying a batch (retry the batch)."""


class WaitTimeout(SowError):
    """``--wait`` gave up before the workers applied every published message."""


class BadURLError(SowError):
    """A Redis URL sow_redis cannot use (scheme, port, host or option), raised by
    :func:`sow_redis.connection.connect` before anything is sent. ``url`` has its password
    masked, ``reason`` says what is wrong; the message is one line."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"invalid Redis URL {url!r}: {reason}")


def refusal(exc: Exception) -> str:
    """One line for an error reply of Redis, with the code redis-py takes off its own
    exception classes put back (``OOM …``, ``READONLY …``, ``NOPERM …``)."""
    # start-up time: the CLI loads this module; redis only when a Redis error is mapped
    from redis import exceptions as rex

    codes = ((rex.OutOfMemoryError, "out of memory: OOM"), (rex.ReadOnlyError, "READONLY"),
             (rex.NoPermissionError, "NOPERM"))
    for cls, code in codes:
        if isinstance(exc, cls):
            return f"{code} {exc}"
    return str(exc)


class NotDurableError(SowError):
    """A ``durable`` publish: no replica confirmed the written messages in time (``WAIT``);
    they are in the primary's log but not acknowledged. One line."""


class ControlURLError(SowError):
    """No usable control plane for rq (ARCHITECTURE §2): a Redis Cluster data URL without a
    ``--control-url``, or a cluster given as the control URL. One line."""


class KeyListError(SowError):
    """A list of SOW keys (query or sow_delete by keys) that cannot be used: more than
    :data:`sow_redis.model.sowkey.MAX_KEYS` keys, or a key that is not 1-512 Base64 characters
    (generated keys are 32 hex digits). One line naming the bound."""


class ScriptArgsError(SowError):
    """A Lua script was called with malformed arguments (a client/script version mismatch)."""


_SCRIPT_ERRORS: dict[str, type[SowError]] = {
    "SOW_BADARGS": ScriptArgsError,
    "SOW_FENCED": FencedError,
    "SOW_CONFLICT": ConflictError,
}


def from_script_error(exc: Exception) -> Exception:
    """Map a Lua error reply ``SOW_<CODE> …`` to its :class:`SowError` class.

    Returns the original exception when the reply is not one of ours.
    """
    text = str(exc)
    for code, cls in _SCRIPT_ERRORS.items():
        if code in text:
            return cls(text[text.index(code):])
    return exc


class SubscriptionEnded(SowError):
    """A subscription cannot go on (e.g. the topic was migrated to a new layout and its
    bookmarks are kept in a bookmark store, whose positions are the old layout's). One line
    saying why and what to do."""


class DerivedTopicError(SowError):
    """A publish, delta_publish or sow_delete to a view or a conflated topic: its records are
    written by the deriver from its underlying topic (:mod:`sow_redis.derive`)."""


class BookmarkError(SowError):
    """A bookmark that cannot be used: malformed, for another number of partitions, or older
    than what the change feed retains (the message names the oldest retained point)."""
