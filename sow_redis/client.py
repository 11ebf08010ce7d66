"""Python API: :class:`Sow` — publish, delta_publish, sow (query), sow_delete, subscribe.

Two ways to apply what is published (the transaction log, ARCHITECTURE §3), declared per
:class:`Sow`, never guessed from the client:

* **workers** (default for ``redis://…``): a publish appends to the log and enqueues ingest
  jobs; ``sow-redis worker`` processes apply them; ``wait=True`` waits for them.
* **inline** (``inline=True``; the default, and the only mode, for ``memory://``): every
  publish, delta_publish and sow_delete is applied in the calling process, by the same code
  the workers run, before the call returns (like rq's ``Queue(is_async=False)`` or huey's
  immediate mode). For notebooks, tests, scripts and benchmarks; on a real server it needs no
  worker.

Example::

    sow = Sow("memory://")            # in process, on fakeredis, inline
    sow.apply_config('[[topic]]\\nname = "orders"\\nkey = ["/orderId"]\\n')
    sow.publish("orders", [{"orderId": 1, "price": 120}])
    sow.delta_publish("orders", {"orderId": 1, "price": 95})
    [r.obj() for r in sow.sow("orders", "/price < 100")]   # [{'orderId': 1, 'price': 95}]
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, overload

import orjson
import re2
from redis.exceptions import OutOfMemoryError, ResponseError

from . import keys
from .apply.jobs import apply_here, ensure_jobs
from .apply.scripts import scripts_of
from .config import DERIVED_KINDS, TOPIC_NAME, load_file, parse_topics
from .connection import Client, connect, connect_pair, is_cluster_url, is_memory, redact
from .errors import BookmarkError, MessageError, UnknownTopicError
from .feed.aggregate import QUERY_BATCH, AggregatedSubscriber
from .feed.bookmark import Bookmark
from .feed.bookmark_store import BookmarkStore
from .feed.changes import iso_ms
from .feed.history import as_of_position, records_as_of
from .feed.subscriber import Message, Subscriber
from .migrate import apply_with_migration
from .model.aggregate import Aggregation
from .model.fix import separator as fix_separator
from .model.records import Record
from .model.sowkey import check_key_list
from .model.topic import TopicConfig
from .model.values import JSON
from .outage import call_through_outage
from .partition_state import read_cursors
from .publish.append import append
from .publish.delete import append_delete_all_partitions
from .publish.result import NOT_READ, PublishInterrupted, PublishResult
from .publish.retry import append_blocks
from .publish.used import touch
from .publish.validate import Item, prepare
from .publish.wait import delete_counts, wait_applied
from .query.filter import check_deterministic, compile_filter
from .query.sow import (
    Plan,
    explain,
    filter_partitions,
    key_partitions,
    query,
    query_batches,
    unsorted,
)
from .registry import apply_topics, get_topic, load_topics
from .settings import Settings
from .streamids import parse as parse_id
from .streamids import reached

"""Seconds an inline apply sleeps while another process holds a partition's lease."""


def _to_bytes(msg: object) -> bytes:
    if isinstance(msg, bytes):
        return msg
    if isinstance(msg, str):  # lone surrogates (undecodable argv bytes) reach the decoder,
        return msg.encode("utf-8", "surrogateescape")  # which rejects them: not UTF-8
    return orjson.dumps(msg)


def _query_messages(topic: str, batches: Iterable[list[Record]],
                    bookmark: str) -> Iterator[Message]:
    """The ``sow`` messages of a historical query's records, then its ``group_end`` (its
    count), each with the query's ``bookmark``: built as they are taken."""
    count = 0
    for batch in batches:
        for rec in batch:
            count += 1
            yield {"kind": "sow", "topic": topic, "sow_key": rec.sow_key, "seq": rec.seq,
                   "bookmark": bookmark, "data": rec.obj()}
    yield {"kind": "group_end", "topic": topic, "count": count, "bookmark": bookmark}


TOPIC_KEEP_S = 0.05
"""Seconds a publisher uses a topic definition without reading the registry, counted from
the last publish whose write found the registry version unchanged (see
:meth:`Sow._publish_topic`)."""


class Sow:
    """A connection to one SOW (one Redis server or cluster, or an in-memory one).

    Args:
        url: ``redis://host:port/db``, ``rediss://…``, ``unix:///path``,
            ``redis+cluster://host:port`` or ``memory://[name]`` (see
            :mod:`sow_redis.connection`); default from ``SOW_REDIS_URL``.
        control_url: the plain Redis of rq's queues (``--control-url``; default from
            ``SOW_CONTROL_URL``, else the data Redis). A cluster ``url`` needs one unless
            ``inline`` (nothing is enqueued then).
        durable: every publish, delta_publish and sow_delete by data returns only once a
            replica has its messages (``WAIT 1`` per chunk; see
            :func:`~sow_redis.publish.append.append`); raises NotDurableError otherwise.
        settings: overrides for timing knobs (see :class:`~sow_redis.settings.Settings`);
            its ``redis_url`` is used when given (``url`` is then ignored).
        client: a Redis client to use instead of connecting to the URL (the URL still sets
            the default of ``inline``: pass ``inline=True`` for a client of an in-process
            server).
        inline: apply every publish, delta_publish and sow_delete in this process before
            returning (see the module docstring). Default: True for ``memory://``, else
            False (workers apply).
        retry_s: seconds a Redis outage may last during :meth:`publish` /
            :meth:`delta_publish` before its error is raised: the outage is logged once and
            the messages in flight are sent again when Redis answers (at least once; see
            :func:`sow_redis.publish.retry.append_blocks`). 0 (default): raise at once.

    Attributes:
        inline: the mode chosen (read-only).

    Raises:
        BadURLError: the URL cannot be used (one line, password masked).
        ValueError: ``inline=False`` with ``memory://``: no worker can reach an in-process
            server, so nothing published would ever be applied.
        ControlURLError: a cluster ``url`` without a control URL, not inline.
    """

    def __init__(self, url: str | None = None, settings: Settings | None = None,
                 client: Client | None = None, inline: bool | None = None,
                 retry_s: float = 0.0, control_url: str | None = None,
                 durable: bool = False) -> None:
        self.settings = settings or Settings.from_env(redis_url=url, control_url=control_url)
        self.url = self.settings.redis_url
        memory = is_memory(self.url)
        if inline is None:
            inline = memory
        elif not inline and memory:
            raise ValueError(f"Sow({redact(self.url)!r}, inline=False): memory:// runs in this process, "
                             "where no worker can apply the log; use inline (the default) or "
                             "a redis:// server with 'sow-redis worker'")
        self._inline = bool(inline)
        self.retry_s = retry_s
        # topics this client publishes to, valid for one registry version (_publish_topic)
        self._topics: dict[str, TopicConfig] = {}
        self._topics_version: object = NOT_READ
        self._topics_until = 0.0  # time.monotonic() until which they may be used unread
        self.durable = durable
        if client is not None:
            self.r = client
        elif self._inline and is_cluster_url(self.url) and not self.settings.control_url:
            self.r = connect(self.url)  # inline: nothing goes to rq's queues
        else:
            self.r = connect_pair(self.url, self.settings.control_url)

    @property
    def inline(self) -> bool:
        """Whether publishes are applied in this process before returning (read-only)."""
        return self._inline

    # configuration -------------------------------------------------------------------
    @property
    def job_settings(self) -> Settings | None:
        """What :func:`~sow_redis.publish.append.append` needs to start the workers while a long
        publish runs (``jobs=``); None when :attr:`inline` (this process applies)."""
        return None if self._inline else self.settings

    def apply_config(self, source: str | list[TopicConfig],
                     migrate: bool = False) -> list[TopicConfig]:
        """Store topic definitions in the registry.

        Args:
            source: TOML text, a path to a TOML file, or parsed topics.
            migrate: move the records of stored topics whose shape changes (see
                :mod:`sow_redis.migrate`); without it such a change is refused while the
                topic holds anything.

        Raises:
            ConfigError: one line per problem (also: a ``dead_letter`` topic defined nowhere,
                a refused shape change); nothing is stored.
        """
        where = "<config>"
        if isinstance(source, str):
            if any(f"[[{table}]]" in source for table in ("topic", *DERIVED_KINDS)):
                topics = parse_topics(source)
            else:
                topics, where = load_file(source), source
        else:
            topics = source
        if migrate:
            apply_with_migration(self.r, topics, self.settings, where)
        else:
            apply_topics(self.r, topics, where)
        self._topics.clear()
        return topics

    def topic(self, name: str) -> TopicConfig:
        """A topic's definition. Raises UnknownTopicError."""
        return get_topic(self.r, name)

    # publishing ----------------------------------------------------------------------
    def _publish_topic(self, name: str) -> TopicConfig:
        """A topic's definition for a publish: from this client's cache while it is known
        current, else read from the registry.

        Each publish reads the registry version in the same write as its first chunk
        (``append(registry_check=True)``). When the version is the one the cache was filled
        under, the definitions stay usable for :data:`TOPIC_KEEP_S` seconds from that
        publish; when it moved (another client changed the registry), the cache is dropped.
        So a steady publisher spares the lookup round trip of each publish, and a definition
        changed elsewhere is used for at most :data:`TOPIC_KEEP_S` seconds after the change
        by a publisher that kept publishing (a change through this client drops the cache at
        once). Topics with ``idle_expiration`` are always read (the expirer may remove them
        between two publishes: the publish must fail with UnknownTopicError, not log to a
        removed topic).

        Raises:
            UnknownTopicError, DerivedTopicError (a view or a conflated topic).
        """
        t = self._topics.get(name)
        if t is not None and time.monotonic() < self._topics_until:
            return t
        started = time.monotonic()
        try:
            version: object = self.r.get(keys.REGISTRY_VERSION)  # before the definition
        except ResponseError:  # not allowed to read it: no caching
            version = NOT_READ
        t = self.topic(name)
        t.check_writable()
        if version is not NOT_READ and not t.idle_ms:
            if version != self._topics_version or started >= self._topics_until:
                self._topics.clear()
                self._topics_version = version
                self._topics_until = started + TOPIC_KEEP_S
            self._topics[name] = t
        return t

    def _published(self, result: PublishResult, started: float) -> None:
        """After a publish begun at ``started`` (``time.monotonic()``): keep the cached
        definitions :data:`TOPIC_KEEP_S` seconds more when ``result`` read the version they
        were read under (and no definition fence made it read the topic again), else drop
        them."""
        if result.registry_version is not NOT_READ and result.definition is None \
                and result.registry_version == self._topics_version:
            self._topics_until = max(self._topics_until, started + TOPIC_KEEP_S)
        else:
            self._topics.clear()
            self._topics_version = NOT_READ
            self._topics_until = 0.0

    def _publish(self, cmd: str, topic: str, messages: JSON, sow_key: str | None, wait: bool,
                 timeout: float, expiration: float | None,
                 separator: str | None = None) -> PublishResult:
        started = time.monotonic()
        # ride out an outage of retry_s seconds (sow_redis.outage): every step may repeat
        t = call_through_outage(lambda: self._publish_topic(topic), self.retry_s)
        if isinstance(messages, (dict, bytes, str)):
            messages = [messages]
        sep = None
        if separator is not None:
            sep = fix_separator(separator)
        # each message is encoded inside append: one that cannot be is rejected, not raised
        items = ((cmd, m, sow_key, expiration) for m in messages)
        result = self.append_blocks(t, [items], fix_separator=sep, registry_check=True)
        self._published(result, started)
        self.handoff_published(t, result, wait, timeout)
        return result

    def append_blocks(self, topic: TopicConfig, blocks: Iterable[Iterable[Item]], *,
                      fix_separator: bytes | None = None,
                      on_chunk: Callable[[int], None] | None = None,
                      stop: Callable[[], bool] | None = None,
                      registry_check: bool = False) -> PublishResult:
        """Append blocks of items to ``topic``'s log with this client's :attr:`retry_s`,
        ``durable`` and mode (workers started as entries wait for them, unless
        :attr:`inline`): :func:`sow_redis.publish.retry.append_blocks`, which
        :meth:`publish` and the CLI's ``publish`` use. Nothing is applied or waited for
        beyond what the writes apply themselves (write-through, also inline: publishes to a
        caught-up partition): see :meth:`handoff_published`.

        Args:
            topic: the definition to key by (read again across a migration:
                :attr:`PublishResult.definition`).
            blocks: ``(cmd, message, sow_key[, expiration])`` items in blocks (e.g. the
                lines that arrived on a pipe within 0.2 s; each is one append call).
            fix_separator: FIX topics: the messages' field separator (default: the topic's).
            on_chunk: called with the number of items handled after each chunk.
            stop: asked after each block; True: the rest is not read.
            registry_check: read the registry version with the first chunk
                (:attr:`PublishResult.registry_version`).

        Raises:
            PublishInterrupted: Redis refused the rest after something was appended;
            connection errors after an outage of :attr:`retry_s` seconds; as
            :func:`sow_redis.publish.append.append` otherwise.
        """
        return append_blocks(self.r, topic, blocks, self.retry_s, stop=stop,
                             on_chunk=on_chunk, fix_separator=fix_separator,
                             jobs=self.job_settings, durable=self.durable,
                             registry_check=registry_check,
                             inline=self.settings if self._inline else None)

    def handoff_published(self, topic: TopicConfig, result: PublishResult, wait: bool = False,
                          timeout: float = 60.0) -> int:
        """:meth:`handoff` of what :meth:`append_blocks` appended (``result.last_ids``, under
        ``result.definition`` when the publish read it again, else ``topic``), riding out an
        outage of :attr:`retry_s` seconds (the handoff may repeat: ``SET NX``, waits). The
        partitions the writes settled themselves (:attr:`PublishResult.settled`: every entry
        written through, no trim due) are skipped: no drain inline, no wait.

        Returns:
            The number of log entries applied in this process (0 without inline).

        Raises:
            WaitTimeout: after ``timeout`` seconds; connection errors after an outage of
            :attr:`retry_s` seconds.
        """
        t = result.definition or topic
        settled = result.settled  # applied in the publish's own write: nothing to hand over
        last_ids = {p: sid for p, sid in result.last_ids.items() if p not in settled}
        return call_through_outage(lambda: self.handoff(t, last_ids, wait, timeout,
                                                        jobs_started=True), self.retry_s)

    def handoff(self, topic: str | TopicConfig, last_ids: dict[int, str], wait: bool = False,
                timeout: float = 60.0, jobs_started: bool = False) -> int:
        """Hand log entries appended with :func:`sow_redis.publish.append.append` (or any XADD to
        a partition log) to the appliers: apply them here when :attr:`inline`, else enqueue
        ingest jobs for the workers and, with ``wait``, block until they applied them.
        ``publish`` / ``delta_publish`` / ``sow_delete`` call it; so do the CLI's
        ``publish`` (which appends itself, for its progress bar) and the expirer's
        dead-letter forwarding.

        Inline, each partition of ``last_ids`` is applied until its log is drained (entries
        after ``last_ids`` included), whatever ``wait`` says; while another process holds a
        partition's lease (a worker, another inline client) it retries every
        :data:`sow_redis.apply.jobs.LEASE_POLL_S` seconds, at most ``timeout`` seconds in all.

        Args:
            topic: the topic name or definition.
            last_ids: partition → stream id of the last entry appended there
                (:attr:`PublishResult.last_ids`); empty: nothing to do.
            wait: without inline, wait until the workers' applied cursors reach
                ``last_ids`` (read-your-writes).
            timeout: seconds to wait at most (for the workers, or inline for a lease).
            jobs_started: the entries were appended with ``append(jobs=…)``, which already
                started the workers where entries wait for them (and, with write-through,
                only there): no job markers are set here.

        Returns:
            The number of log entries applied in this process (0 without inline).

        Raises:
            WaitTimeout: after ``timeout`` seconds (the entries stay in the log and will be
                applied); UnknownTopicError: ``topic`` names no topic.
        """
        if not last_ids:
            return 0
        t = topic if isinstance(topic, TopicConfig) else self.topic(topic)
        if self._inline:
            return self._apply_here(t, list(last_ids), timeout)
        if not jobs_started:
            ensure_jobs(self.r, t.name, list(last_ids), self.settings)
        if wait:
            wait_applied(self.r, t, last_ids, timeout)
        return 0

    def _apply_here(self, t: TopicConfig, partitions: list[int], timeout: float) -> int:
        """Drain ``partitions`` in this process with the workers' code (see :meth:`handoff`)."""
        return apply_here(self.r, t, partitions, self.settings, timeout)

    def rebuild(self, topic: str, wait: bool = False, timeout: float = 60.0) -> dict[int, str]:
        """Drop the SOW of transient ``topic`` and have it rebuilt from its log, from its
        ``recovery_point`` (AMPS SOW ``Durability`` transient, ``RecoveryPoint``; seeds/004;
        :func:`sow_redis.rebuild.drop_sow`): here when :attr:`inline`, else by the workers
        (ingest jobs enqueued; ``wait``: until they replayed the log as it was when dropped).

        Returns:
            partition → the log's last entry when it was dropped (``0-0``: an empty log).

        Raises:
            SowError: the topic is persistent, or a partition stayed leased by another
                process for ``timeout`` seconds; WaitTimeout; UnknownTopicError.
        """
        from .rebuild import drop_sow  # start-up time: only for this call

        t = self.topic(topic)
        horizons = drop_sow(self.r, t, self.settings, timeout)
        self.handoff(t, horizons, wait=wait, timeout=timeout)
        return horizons

    def publish(self, topic: str, messages: JSON, sow_key: str | None = None, wait: bool = False,
                timeout: float = 60.0, expiration: float | None = None,
                separator: str | None = None) -> PublishResult:
        """Publish messages: each replaces the whole record of its SOW key (seeds/004).

        Args:
            messages: one message or an iterable; a message is a dict, JSON text or bytes;
                on a FIX topic also ``tag=value`` text (a log prefix before ``8=FIX`` is
                skipped; session-level messages are skipped and counted). A dict that JSON
                cannot carry exactly is rejected, not altered: a non-string key
                (``bad_key_type``), NaN or an infinity (``not_finite``), an int outside 64 bits
                (``number_out_of_range``), nesting deeper than 254 (``too_deep``).
            separator: FIX field separator of these messages (``"SOH"``, ``";"``, ``"|"``;
                default: the topic's ``field_separator``).
            sow_key: the SOW key for topics without key fields (1-512 Base64 characters); on a
                topic with key fields every message is rejected ``bad_sow_key``.
            expiration: message lifetime in seconds (overrides the topic default under policy
                "override"; ``0`` = never expire; at most 100 years, 3,155,760,000 s); every
                publish resets the lifetime. Not a number from 0 to 100 years (or a bool):
                every message is rejected ``bad_expiration`` (the MessageError of
                :func:`sow_redis.model.expiry.check_expiration`).
            wait: return only after the workers applied every message (read-your-writes);
                always so with :attr:`inline`.
            timeout: seconds to wait at most with ``wait`` (see :meth:`handoff`).

        Returns:
            Counts and per-message rejections (bad JSON, missing key field, too large, …):
            every message is either published or rejected with its position and reason
            (``read == published + skipped + len(rejected)``).

        Raises:
            UnknownTopicError, WaitTimeout, ValueError (bad ``separator``).
        """
        return self._publish("publish", topic, messages, sow_key, wait, timeout, expiration,
                             separator)

    def delta_publish(self, topic: str, messages: JSON, sow_key: str | None = None,
                      wait: bool = False, timeout: float = 60.0,
                      expiration: float | None = None,
                      separator: str | None = None) -> PublishResult:
        """Merge messages into their stored records (AMPS delta_publish: fields in the update
        replace those fields, nested objects merge, other fields stay). Same arguments and
        errors as :meth:`publish`."""
        return self._publish("delta_publish", topic, messages, sow_key, wait, timeout, expiration,
                             separator)

    # reading -------------------------------------------------------------------------
    @overload
    def sow(self, topic: str, filter: str | None = None, keys: list[str] | None = None,
            top_n: int | None = None, order_by: str | None = None, skip_n: int | None = None,
            select: str | list[str] | None = None, as_of: str | None = None,
            batch_size: None = None) -> list[Record]: ...

    @overload
    def sow(self, topic: str, filter: str | None = None, keys: list[str] | None = None,
            top_n: int | None = None, order_by: str | None = None, skip_n: int | None = None,
            select: str | list[str] | None = None, as_of: str | None = None, *,
            batch_size: int) -> Iterator[Record]: ...

    def sow(self, topic: str, filter: str | None = None, keys: list[str] | None = None,
            top_n: int | None = None, order_by: str | None = None, skip_n: int | None = None,
            select: str | list[str] | None = None, as_of: str | None = None,
            batch_size: int | None = None) -> list[Record] | Iterator[Record]:
        """SOW query (seeds/004 "Queries"): records matching an AMPS content filter.

        Returns:
            The matching records as a list; with ``batch_size``, an iterator of them.

        Args:
            top_n / skip_n: a page: at most ``top_n`` records after leaving out the first
                ``skip_n`` matches, in ``order_by``'s order, else in the SOW keys' (a stable
                order: :func:`sow_redis.query.sow.query`). ``top_n`` alone (``skip_n``
                None) takes the first matches read, in no particular order.
            select: the field paths each record keeps (a select list), e.g.
                ``["/id", "/px"]`` or ``"/id,/px"``; None: whole records.
            as_of: the SOW as it was at this point (an ISO-8601 time, a bookmark string or
                ``EPOCH``) on a topic with ``history`` (:mod:`sow_redis.feed.history`):
                records deleted or expired since included.
            batch_size: read the records ``batch_size`` at a time (AMPS ``batch_size``) and
                return an iterator: without ``order_by`` and ``skip_n`` a result of any
                size takes the memory of one batch (with ``as_of``, also of the records
                changed since the point in the partition being read and its SOW keys given
                so far, read from a copy of it in Redis; :meth:`sow_batches`, whose
                batches it flattens). The arguments are checked here, before a record is
                asked for.

        Raises:
            UnknownTopicError, FilterSyntaxError, KeyListError (more than
            :data:`~sow_redis.model.sowkey.MAX_KEYS` keys, or a key no record can have),
            ValueError (a negative ``top_n`` or ``skip_n``, a ``select`` path that is no
            field path), BookmarkError (``as_of`` on a topic without history, malformed, or
            older than the history window: the message names the oldest point kept),
            ValueError (``batch_size`` below 1).
        """
        if batch_size is not None:
            return itertools.chain.from_iterable(self.sow_batches(
                topic, batch_size, filter, keys, top_n, order_by, skip_n, select, as_of))
        t, source = self._query_source(topic, keys, as_of)
        return query(self.r, t, filter, keys, top_n, order_by, skip_n=skip_n, select=select,
                     source=source)

    def _query_source(self, topic: str, keys: list[str] | None, as_of: str | None,
                      page_size: int | None = None
                      ) -> tuple[TopicConfig, Iterable[Record] | None]:
        """The topic of a query and, ``as_of`` given, the records as of then (read one
        partition at a time as the query goes, in pages of ``page_size`` when given); None:
        the current SOW."""
        if keys is not None:
            check_key_list(keys)
        t = self.topic(topic)
        if t.idle_ms:
            touch(self.r, t.name)
        if as_of is None:
            return t, None
        return t, self._as_of(t, as_of, keys, page_size)[1]

    def explain(self, topic: str, filter: str | None = None,
                keys: list[str] | None = None) -> Plan:
        """The query plan :meth:`sow` follows for this filter (``sow --explain``): which index
        it reads, or a scan (:func:`sow_redis.query.sow.plan_query`); no record is read (a
        range index's candidates are counted). ``plan.text`` is one line, e.g.
        ``index /px range (10, +inf)`` or ``scan``.

        Raises:
            UnknownTopicError, FilterSyntaxError.
        """
        return explain(self.r, self.topic(topic), filter, keys)

    def sow_batches(self, topic: str, batch_size: int, filter: str | None = None,
                    keys: list[str] | None = None, top_n: int | None = None,
                    order_by: str | None = None, skip_n: int | None = None,
                    select: str | list[str] | None = None,
                    as_of: str | None = None) -> Iterator[list[Record]]:
        """:meth:`sow` in batches of at most ``batch_size`` records (AMPS ``batch_size``):
        without ``order_by`` and ``skip_n`` a result of any size is read and handed over one
        batch at a time (:func:`sow_redis.query.sow.query_batches`). The arguments are
        checked here, before the first batch is asked for.

        Raises:
            as :meth:`sow`; ValueError: ``batch_size`` below 1.
        """
        # pages of a copy only where the result is handed over as it is read (not sorted)
        pages = batch_size if unsorted(order_by, skip_n) else None
        t, source = self._query_source(topic, keys, as_of, pages)
        return query_batches(self.r, t, batch_size, filter, keys, top_n, order_by, skip_n,
                             select, source)

    def _as_of(self, t: TopicConfig, when: str, keys: list[str] | None,
               page_size: int | None = None) -> tuple[list[int], Iterator[Record]]:
        """The per-partition position of ``when`` (checked here) and the records as they were
        there, only those of ``keys`` when given, read one partition at a time as they are
        asked for (from a copy in pages of ``page_size`` records when given:
        :func:`sow_redis.feed.history.records_as_of`)."""
        position = as_of_position(self.r, t, when)
        records = records_as_of(self.r, t, position, iso_ms(when),
                                page_size if keys is None else None)
        if keys is not None:
            wanted = set(keys)
            records = (rec for rec in records if rec.sow_key in wanted)
        return position, records

    # deleting ------------------------------------------------------------------------
    def sow_delete(self, topic: str, filter: str | None = None, keys: list[str] | None = None,
                   data: JSON = None, sow_key: str | None = None, timeout: float = 60.0) -> int:
        """Remove records (seeds/004 "Removing SOW Records") by content filter (``1=1`` removes
        all), by SOW keys, or by message data (the record a publish of that data would update).
        Waits until the workers applied the delete (with :attr:`inline`, applies it here).

        Returns:
            The number of records removed.

        Raises:
            ValueError (not exactly one of filter / keys / data), FilterSyntaxError (also a
            filter calling ``NOW()``: every partition must find the same records),
            KeyListError (as for :meth:`sow`), MessageError (bad data), WaitTimeout.
        """
        if sum(x is not None for x in (filter, keys, data)) != 1:
            raise ValueError("give exactly one of filter, keys or data")
        if keys is not None:
            check_key_list(keys)
        t = self.topic(topic)
        t.check_writable()
        if filter is not None:
            # a syntax error is the caller's, before anything is logged; so is NOW(): each
            # partition (and a worker after a restart) must find the same records
            pred = compile_filter(filter)
            check_deterministic(pred, "a sow_delete filter")
            # only to the partitions that can hold a match (a filter pinning the key fields)
            ids = append_delete_all_partitions(self.r, t, {"filter": filter},
                                               filter_partitions(t, pred))
        elif keys is not None:
            ids = append_delete_all_partitions(self.r, t, {"keys": ",".join(keys)},
                                               key_partitions(t, keys))
        else:
            try:
                res = append(self.r, t, [("sow_delete", _to_bytes(data), sow_key)],
                             durable=self.durable)
            except (PublishInterrupted, OutOfMemoryError) as exc:
                res = self._delete_now(t, _to_bytes(data), sow_key, exc)
            if res.rejected:
                rej = res.rejected[0]
                raise MessageError(rej.reason, rej.detail)
            ids = res.last_ids
            t = res.definition or t  # read again across a migration
        # a delete applied in its own call (delete_now.lua; also out of memory, when a job
        # could not be enqueued) needs no worker
        cursors = read_cursors(self.r, t.name, ids)
        self.handoff(t, {p: sid for p, sid in ids.items() if not reached(cursors[p], sid)},
                     True, timeout)
        return delete_counts(self.r, t, ids)

    def _delete_now(self, t: TopicConfig, data: bytes, sow_key: str | None,
                    refused: Exception) -> PublishResult:
        """A sow_delete by data whose append Redis refused as out of memory: applied at once
        on its caught-up partition (``delete_now.lua``, flagged ``allow-oom``), so a user
        can free memory; ``refused`` is raised again otherwise."""
        checked = None
        cause = refused.cause if isinstance(refused, PublishInterrupted) else refused
        if isinstance(cause, OutOfMemoryError):
            try:
                checked = prepare(t, ("sow_delete", data, sow_key))
            except MessageError:
                checked = None
        if checked is None or not checked[1].get("k"):  # chaining topics: the workers' key
            raise refused
        p, entry = checked
        done = scripts_of(self.r).delete_now(t, p, entry, [str(entry["k"])])
        if done is None:
            raise refused
        return PublishResult(published=1, last_ids={p: done[1]})

    # live events ---------------------------------------------------------------------
    def subscribe(self, topic: str, filter: str | None = None, *, oof: bool = False,
                  bookmark: str | None = None, client_name: str | None = None,
                  sub_id: str | None = None, persist_every: int = 10,
                  auto_processed: bool = True, resync: bool = False, delta: bool = False,
                  report: Callable[[Message], None] | None = None,
                  keys: list[str] | None = None,
                  select: str | list[str] | None = None) -> Subscriber:
        """Subscribe to a topic's changes (AMPS ``subscribe``): the records published to it
        that match ``filter`` (the merged record of a delta_publish) and, with ``oof``, an
        out-of-focus notice for each matching record that is removed (``deleted``,
        ``expired``) or stops matching (``match``). Messages and recovery:
        :mod:`sow_redis.feed.subscriber`.

        Args:
            bookmark: replay the change feed after this point first (a bookmark string,
                ``EPOCH``, ``NOW``, ``RECENT`` or an ISO-8601 time), then a ``completed``
                message, then live.
            client_name / sub_id: keep the subscription's bookmark in the SOW-backed bookmark
                store (seeds/002, :mod:`sow_redis.feed.bookmark_store`): resume from its most
                recent bookmark (``RECENT``, the default bookmark then; EPOCH when none is
                stored), persist it every ``persist_every`` processed messages and on close.
            auto_processed: a message counts as processed when the next is asked for; False:
                call :meth:`Subscriber.processed` for each.
            resync: when the bookmark (given or stored) is older than the change feed
                retains, re-read the records changed since it (``publish`` messages and a
                ``recovery`` message with cause ``resync``), then go live; without it such a
                bookmark raises BookmarkError, and a stored one stays as it was.
            report: called with each ``recovery`` and ``error`` message.
            delta: AMPS ``delta_subscribe``: an update of a record the subscriber holds
                carries only the fields that changed (``delta`` true, ``removed``); the topic
                must set ``change_previous = true``.
            keys: only the changes of these SOW keys (AMPS ``SowKeys`` on a subscribe
                command); with ``filter`` both must hold; out-of-focus notices only for
                these keys. None: every key.
            select: a select list (AMPS ``select``; ``["/id", "/px"]`` or ``"/id,/px"``):
                each message's ``data`` keeps only these fields (the filter still reads the
                whole record); not with ``delta``.

        Raises:
            UnknownTopicError, FilterSyntaxError, BookmarkError (malformed, ahead of the
            topic, or older than the change feed without ``resync``), ConfigError
            (``delta`` on a topic without ``change_previous``), KeyListError (more than
            :data:`~sow_redis.model.sowkey.MAX_KEYS` keys, or a key no record can have),
            ValueError (a ``select`` path that is no field path, or ``select`` with
            ``delta``).
        """
        if keys is not None:
            check_key_list(keys)
        return self._subscriber(topic, filter=filter, oof=oof, bookmark=bookmark,
                                client_name=client_name, sub_id=sub_id,
                                persist_every=persist_every, auto_processed=auto_processed,
                                resync=resync, report=report, delta=delta, keys=keys,
                                select=select)

    def sow_and_subscribe(self, topic: str, filter: str | None = None, *, oof: bool = False,
                          top_n: int | None = None, order_by: str | None = None,
                          report: Callable[[Message], None] | None = None,
                          delta: bool = False, as_of: str | None = None,
                          keys: list[str] | None = None, skip_n: int | None = None,
                          select: str | list[str] | None = None,
                          batch_size: int | None = None) -> Subscriber:
        """AMPS ``sow_and_subscribe``: the query result (``sow`` messages, with ``top_n`` and
        ``order_by``), a ``group_end`` message (also when the result is empty), then the live
        changes as :meth:`subscribe` gives them, as if query and subscription were placed at
        the same instant (decided per partition by the change sequence: no gap, no duplicate,
        no older state after a newer one). With ``delta``, AMPS
        ``sow_and_delta_subscribe``: the records whole, then each update of one of them as
        the fields that changed (see :meth:`subscribe`).

        With ``as_of`` (a topic with ``history``): the query as of that point (see
        :meth:`sow`), then every change after it in order, a ``completed`` message, then
        live: no gap and no duplicate (the query and the replay start at the same
        per-partition position).

        With ``keys`` (AMPS ``SowKeys``): the query returns only the records of these SOW
        keys and the subscription delivers only their changes (see :meth:`subscribe`).

        ``skip_n`` pages the query part as :meth:`sow` does (in ``order_by``'s order, else
        the SOW keys'); ``select`` keeps only those fields in every message's ``data`` (see
        :meth:`subscribe`).

        ``batch_size`` (AMPS ``batch_size``): without ``order_by`` and ``skip_n``, the query
        part is read one partition at a time as its messages are asked for, from a copy of
        the partition's records made in Redis with its seq, ``batch_size`` records at a time:
        the client holds one batch, Redis a copy of one partition while it is read. Its
        ``sow`` messages then carry no bookmark (``group_end`` does: see
        :class:`~sow_redis.feed.subscriber.Subscriber`). With ``as_of``, the historical query
        is read as its messages are asked for, as :meth:`sow` with both reads it, its
        messages with the query's bookmark. The replay after it is read as it is taken in any
        case (:class:`~sow_redis.feed.subscriber.Subscriber`, ``bookmark``).

        Raises:
            UnknownTopicError, FilterSyntaxError, ConfigError (``delta`` on a topic without
            ``change_previous``), BookmarkError (``as_of``: see :meth:`sow`), KeyListError
            (``keys``: see :meth:`subscribe`), ValueError (``select`` or ``skip_n``: see
            :meth:`sow`; ``select`` with ``delta``; ``batch_size`` below 1).
        """
        if keys is not None:
            check_key_list(keys)
        if as_of is None:
            return self._subscriber(topic, filter=filter, oof=oof, sow=True, top_n=top_n,
                                    order_by=order_by, report=report, delta=delta, keys=keys,
                                    skip_n=skip_n, select=select, batch_size=batch_size)
        t = self.topic(topic)
        pages = batch_size if unsorted(order_by, skip_n) else None
        position, records = self._as_of(t, as_of, keys, pages)
        batches: Iterable[list[Record]]
        if batch_size is None:
            batches = [query(self.r, t, filter, None, top_n, order_by, skip_n=skip_n,
                             source=records)]
        else:  # read as the messages are taken, from a copy of one partition at a time
            batches = query_batches(self.r, t, batch_size, filter, None, top_n, order_by,
                                    skip_n, source=records)
        mark = str(Bookmark(tuple(position)))  # the query's position: the replay starts there
        sub = self._subscriber(topic, filter=filter, oof=oof, report=report, delta=delta,
                               bookmark=mark, keys=keys, select=select)
        sub.prepend(_query_messages(t.name, batches, mark))
        return sub

    def topics_matching(self, pattern: str) -> list[str]:
        """The names of the defined topics a regular expression matches (unanchored, as AMPS
        topic patterns and LIKE: ``^ord`` for a prefix; RE2 syntax), sorted.

        Raises:
            UnknownTopicError: the pattern is no regular expression, or no topic matches.
        """
        try:
            pattern.encode()
        except UnicodeEncodeError:  # bytes of no UTF-8 (a shell argument): no name, no pattern
            shown = pattern.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise UnknownTopicError(f"topic {shown!r} is not a topic name (1-200 characters "
                                    "of A-Z a-z 0-9 _ . - /) nor a pattern") from None
        try:
            regex = re2.compile(pattern)
        except re2.error as exc:
            raise UnknownTopicError(f"topic pattern {pattern!r} is no regular expression "
                                    f"({exc})") from None
        names = sorted(n for n in load_topics(self.r) if regex.search(n))
        if not names:
            raise UnknownTopicError(f"no topic matches the pattern {pattern!r}")
        return names

    def resolve_topics(self, topic: str, regex: bool = False) -> list[str]:
        """``topic`` as the topic names it stands for: itself when it is a defined topic;
        else, with ``regex`` or when it is no valid topic name (``ord.*``), the topics it
        matches as a regular expression (:meth:`topics_matching`; issue 25.4).

        Raises:
            UnknownTopicError: no such topic, or no topic matches the pattern.
        """
        if not regex:
            if TOPIC_NAME.fullmatch(topic):
                self.topic(topic)  # raises UnknownTopicError for an undefined name
                return [topic]
        return self.topics_matching(topic)

    def aggregate(self, topic: str, projection: list[str], grouping: list[str],
                  filter: str | None = None, *,
                  report: Callable[[Message], None] | None = None) -> AggregatedSubscriber:
        """An aggregated subscription (AMPS aggregated subscriptions): the rows of
        ``projection`` grouped by ``grouping`` over the records that match ``filter``, first
        as of now (``sow`` messages, ``group_end``), then kept current: a ``publish`` message
        for each row a change alters, an ``oof`` message for a group left empty
        (:mod:`sow_redis.feed.aggregate`, :mod:`sow_redis.model.aggregate`). The query part
        is read :data:`~sow_redis.feed.aggregate.QUERY_BATCH` records at a time and folded
        into the groups as it comes (see ``batch_size`` of :meth:`sow_and_subscribe`).

        Args:
            projection: grouping fields and aggregates, e.g. ``["/sym", "COUNT(/id) AS
                /orders", "SUM(/qty) AS /qty", "AVG(/px) AS /avg_px"]`` (COUNT, SUM, AVG,
                MIN, MAX).
            grouping: field paths, e.g. ``["/sym"]``.

        Raises:
            UnknownTopicError, FilterSyntaxError, ProjectionError (a projection item or
            grouping that cannot be used; one line).
        """
        aggregation = Aggregation(projection, grouping, domain=f"{topic}:aggregate")
        sub = self._subscriber(topic, filter=filter, oof=True, sow=True, report=report,
                               batch_size=QUERY_BATCH)
        return AggregatedSubscriber(sub, aggregation)

    def _subscriber(self, topic: str, *, client_name: str | None = None,
                    sub_id: str | None = None, persist_every: int = 10,
                    bookmark: str | None = None, **kw: Any) -> Subscriber:
        t = self.topic(topic)
        if (client_name is None) != (sub_id is None):
            raise ValueError("client_name and sub_id go together")
        store = None
        tracker = None
        if client_name is not None and sub_id is not None:
            store = BookmarkStore(self.r, client_name, persist_every, settings=self.settings)
            if bookmark is None or bookmark.strip().upper() == "RECENT":
                bookmark = store.recent(sub_id) or "EPOCH"
            tracker = store.tracker(sub_id, t.partitions)
        elif bookmark is not None and bookmark.strip().upper() == "RECENT":
            raise BookmarkError("RECENT needs the bookmark store: give client_name and sub_id")
        try:
            sub = Subscriber(self.r, t, bookmark=bookmark, tracker=tracker, **kw)
        except BaseException:
            if store is not None:
                store.close()
            raise
        if store is not None:
            sub.on_close.append(store.close)
        return sub

    def errors(self, topic: str, count: int = 100) -> list[dict[str, str]]:
        """The newest ``count`` entries of the topic's error streams (log entries the workers
        rejected, one stream per partition, and dead letters that could not be forwarded),
        oldest first. Each is a dict of text fields: ``reason``, ``detail``, ``id`` (the log
        entry), ``partition``, ``cmd``, ``data``, ``sow_key`` and ``error_id``.

        Raises:
            UnknownTopicError: the topic is not defined.
        """
        t = self.topic(topic)
        pipe = self.r.pipeline(transaction=False)
        for stream in keys.error_streams(t.name, t.partitions):
            pipe.xrevrange(stream, count=count)
        newest: list[tuple[tuple[int, int], dict[str, str]]] = []
        for entries in pipe.execute():
            for sid, fields in entries:
                e = {k.decode(): v.decode(errors="replace") for k, v in fields.items()}
                e["error_id"] = sid.decode()
                newest.append((parse_id(sid), e))
        newest.sort(key=lambda item: item[0])
        return [e for _order, e in newest[-count:]] if count > 0 else []


__all__ = ["Sow", "Subscriber", "connect"]  # connect: from sow_redis.connection
