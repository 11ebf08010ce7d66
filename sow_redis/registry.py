"""The registry: topic definitions stored in Redis, read by every process.

The registry (:data:`keys.REGISTRY`) holds every topic as JSON so stateless workers on any
host read the same definitions; :func:`apply_topics` checks a new set against what is stored
(:func:`registry_problems`), writes it, bumps :data:`keys.REGISTRY_VERSION` and announces the
version on :data:`keys.REGISTRY_CHANNEL`. Each partition's :func:`keys.definition` holds the
fingerprint of the shape its entries are keyed under (issue 23.4, the definition fence).
Parsing and validating the TOML file is :mod:`sow_redis.config`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

from redis.exceptions import NoPermissionError

from . import keys
from .config import TOPIC_NAME, shape_changes
from .connection import Client, Pipeline, write_in_stages
from .errors import ConfigError, FilterSyntaxError, UnknownTopicError
from .model.topic import TopicConfig
from .partition_state import read_partitions
from .query.filter import check_deterministic, compile_filter
from .streamids import ZERO


@dataclass(frozen=True)
class Holdings:
    """What a stored topic holds: records, log entries not yet applied (counted up to
    100,000 per partition) and chain identifiers (chaining key generator)."""

    records: int = 0
    queued: int = 0
    chain_ids: int = 0

    def __bool__(self) -> bool:
        return bool(self.records or self.queued or self.chain_ids)

    def __str__(self) -> str:
        parts = [f"{self.records} stored record(s)"]
        if self.queued:
            parts.append(f"{self.queued} queued message(s)")
        if self.chain_ids:
            parts.append(f"{self.chain_ids} chain identifier(s)")
        return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]


def holdings(r: Client, topic: TopicConfig) -> Holdings:
    """What ``topic`` (as stored) holds in its partitions; see :class:`Holdings`."""
    parts = read_partitions(r, topic.name, topic.partitions)
    return Holdings(sum(x.records for x in parts), sum(x.pending for x in parts),
                    sum(x.chain_ids for x in parts))


def registry_problems(r: Client, topics: list[TopicConfig], source: str = "<config>",
                      migrate: bool = False) -> list[str]:
    """Check topics against the registry before they are stored; one line per problem.

    * ``dead_letter`` must name a topic of ``topics`` or of the registry;
    * unless ``migrate``: a shape change (:func:`shape_changes`) of a stored topic that holds
      anything (:func:`holdings`) is refused, naming what it would strand and the command
      that moves it (:mod:`sow_redis.migrate`). A topic holding nothing changes freely.
    """
    stored = load_topics(r)
    names = {t.name for t in topics} | set(stored)
    problems = []
    for t in topics:
        if t.dead_letter and t.dead_letter not in names:
            problems.append(f"{source}: topic '{t.name}': 'dead_letter' names topic "
                            f"'{t.dead_letter}', which is neither in this file nor in the "
                            "registry")
    problems += _derived_problems(topics, names, source)
    if migrate:
        return problems
    for t in topics:
        old = stored.get(t.name)
        changes = shape_changes(old, t) if old is not None else []
        if not changes:
            continue
        held = holdings(r, old)  # type: ignore[arg-type]
        if held:
            how = (f"run 'sow-redis config apply --migrate {source}'" if source != "<config>"
                   else "apply with migrate=True (sow-redis config apply --migrate FILE)")
            problems.append(f"{source}: topic '{t.name}': {', '.join(changes)} would strand "
                            f"{held}; {how} to move them")
    return problems


def _derived_problems(topics: list[TopicConfig], names: set[str], source: str) -> list[str]:
    """A view's or conflated topic's ``underlying`` must be a topic of ``topics`` or of the
    registry (``names``), and its filter must parse."""
    problems = []
    for t in topics:
        if not t.derived:
            continue
        for under in filter(None, (t.underlying, t.joined)):
            if under not in names:
                problems.append(f"{source}: {t.kind} '{t.name}': 'underlying' names topic "
                                f"'{under}', which is neither in this file nor in the "
                                "registry")
        if t.filter:
            try:
                check_deterministic(compile_filter(t.filter), "the filter")
            except FilterSyntaxError as exc:
                problems.append(f"{source}: {t.kind} '{t.name}': 'filter': {exc}")
    return problems


def store_topics(r: Client, topics: list[TopicConfig]) -> int:
    """Write topics to the registry as they are (no checks), bump the version, announce it.

    Returns:
        The new registry version.
    """
    sec, usec = r.time()
    started = _newly_transient(r, topics)

    def definitions(pipe: Pipeline) -> None:
        for t in topics:
            pipe.hset(keys.REGISTRY, t.name, t.to_json())
            pipe.hset(keys.LAST_USED, t.name, int(sec) * 1000 + int(usec) // 1000)

    def bump(pipe: Pipeline) -> None:
        pipe.incr(keys.REGISTRY_VERSION)

    # one MULTI on a server; on a cluster the three keys lie in different slots: the
    # definitions first, then the version bump that makes readers load them
    version = write_in_stages(r, [definitions, bump])[-1]
    store_fingerprints(r, topics)
    if started:
        pipe = r.pipeline(transaction=False)
        for t in started:
            for p in range(t.partitions):
                pipe.hsetnx(keys.state(t.name, p), "cursor", ZERO)
        pipe.execute()
    r.publish(keys.REGISTRY_CHANNEL, str(version))
    return int(version)


def _newly_transient(r: Client, topics: list[TopicConfig]) -> list[TopicConfig]:
    """The transient topics of ``topics`` that the registry holds not at all or as
    persistent: :func:`store_topics` gives each of their partitions an applied cursor
    (``0-0`` where none is), the mark of a SOW that exists (``lua/rebuild.lua``), so a
    worker never takes a partition nothing was applied to yet for a lost SOW."""
    transient = [t for t in topics if t.transient]
    if not transient:
        return []
    out = []
    for t, raw in zip(transient, r.hmget(keys.REGISTRY, [t.name for t in transient])):
        try:
            was = raw is not None and TopicConfig.from_json(raw).transient
        except (ValueError, KeyError, TypeError):  # not a definition sow_redis wrote
            was = False
        if not was:
            out.append(t)
    return out


def store_fingerprints(r: Client, topics: list[TopicConfig]) -> None:
    """Set each partition's :func:`keys.definition` to its topic's :attr:`fingerprint`,
    after the registry holds the definitions (a publisher refused for a stale definition
    then reads the new one). A migration's lease keeps refusing publishers until it ends
    (``lua/include/apply_appended.lua``)."""
    pipe = r.pipeline(transaction=False)
    for t in topics:
        for p in range(t.partitions):
            pipe.set(keys.definition(t.name, p), t.fingerprint)
    pipe.execute()


def migration_holds(r: Client, topic: str, partitions: Iterable[int]) -> bool:
    """True while a shape migration (``config apply --migrate``) holds one of the topic's
    ``partitions``: its definition reads ``migrating`` or its lease is a migration's (a
    lease the user may not read, like the ACL ``publisher`` role, counts as not held: the
    definition says it)."""
    parts = list(partitions)
    pipe = r.pipeline(transaction=False)
    for p in parts:
        pipe.get(keys.definition(topic, p))
        pipe.get(keys.lease(topic, p))
    replies = [None if isinstance(x, NoPermissionError) else x
               for x in pipe.execute(raise_on_error=False)]
    for x in replies:
        if isinstance(x, Exception):
            raise x
    migrating = keys.DEFINITION_MIGRATING.encode()
    return any(d == migrating or (o or b"").startswith(b"migrate:")
               for d, o in zip(replies[0::2], replies[1::2]))


def apply_topics(r: Client, topics: list[TopicConfig], source: str = "<config>") -> int:
    """Check topics against the registry (:func:`registry_problems`), then store them
    (replacing same-named ones) and announce the change.

    Returns:
        The new registry version.

    Raises:
        ConfigError: one line per problem; nothing is stored.
    """
    problems = registry_problems(r, topics, source)
    if problems:
        raise ConfigError(problems)
    return store_topics(r, topics)


def load_topics(r: Client) -> dict[str, TopicConfig]:
    """All topics in the registry, by name."""
    raw = r.hgetall(keys.REGISTRY)
    topics = (TopicConfig.from_json(blob) for blob in raw.values())
    return {t.name: t for t in topics}


def get_topic(r: Client, name: str) -> TopicConfig:
    """One topic from the registry. Raises UnknownTopicError (also, without asking Redis, for
    a name no topic can have: not 1-200 characters of ``A-Z a-z 0-9 _ . - /``)."""
    if not isinstance(name, str) or not TOPIC_NAME.fullmatch(name):
        shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
        raise UnknownTopicError(f"topic {shown} is not a topic name (1-200 characters of "
                                "A-Z a-z 0-9 _ . - /)")
    blob = r.hget(keys.REGISTRY, name)
    if blob is None:
        raise UnknownTopicError(
            f"topic '{name}' is not defined in the registry (run: sow-redis config apply FILE)"
        )
    return TopicConfig.from_json(blob)


class TopicCache:
    """Registry reader for long-running workers: re-reads only when the version changed."""

    def __init__(self, r: Client) -> None:
        self._r = r
        self._version: bytes | None = None
        self._topics: dict[str, TopicConfig] = {}

    def get(self, name: str) -> TopicConfig:
        version = cast("bytes | None", self._r.get(keys.REGISTRY_VERSION))
        if version != self._version or name not in self._topics:
            self._topics = load_topics(self._r)
            self._version = version
        if name not in self._topics:
            raise UnknownTopicError(f"topic '{name}' is not defined in the registry")
        return self._topics[name]

    def all(self) -> dict[str, TopicConfig]:
        version = cast("bytes | None", self._r.get(keys.REGISTRY_VERSION))
        if version != self._version:
            self._topics = load_topics(self._r)
            self._version = version
        return self._topics


def await_migration(r: Client, topic: str, partitions: Iterable[int], timeout_s: float,
                    stop: Callable[[], bool] | None = None) -> bool:
    """Wait until no shape migration holds any of the topic's ``partitions``
    (:func:`migration_holds`), polling at once, then after 0.02 s, doubling the pause up to
    0.5 s. Shared by a publisher the definition fence refused
    (:func:`sow_redis.publish.fence.await_definition`) and a subscriber that meets a
    migration (:mod:`sow_redis.feed.subscriber`).

    Args:
        topic: the topic's name.
        partitions: the partitions to wait for.
        timeout_s: seconds to wait at most (0: look once).
        stop: called before each pause; True ends the wait (e.g. a process shutting down).

    Returns:
        True once no migration holds them (at once when none does); False when one still
        did after ``timeout_s`` seconds, or when ``stop`` ended the wait.

    Raises:
        redis.exceptions.RedisError: reading the definitions or leases failed (connection
            errors, an ACL refusal other than of the lease).
    """
    parts = list(partitions)
    deadline = time.monotonic() + timeout_s
    pause = 0.02
    while migration_holds(r, topic, parts):
        if time.monotonic() >= deadline or (stop is not None and stop()):
            return False
        time.sleep(pause)
        pause = min(0.5, pause * 2)
    return True
