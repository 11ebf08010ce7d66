"""The SOW-backed bookmark store of seeds/002 ("Never lose track of your state"): stateless
workers resume their subscriptions from a bookmark kept in a SOW topic, with no local file.

The store is the topic ``/ADMIN/bookmark_store`` keyed by ``/clientName`` and ``/subId``
(defined on first use, 1 partition); each record is the seed's::

    {"clientName": "worker-7", "subId": "orders-feed", "bookmark": "<bookmark>",
     "persisted": "true"}

``bookmark`` is the subscription's most recent bookmark (:mod:`.bookmark`: one position per
partition, comma-separated, as the seed's store reads a list back). ``persisted`` is the seed's
flag for subscriptions that track persisted acknowledgements: in sow_redis every change a
subscriber receives is already in the topic's change feed when it is published (the same
atomic call writes both), so the flag is ``"true"`` whenever the topic keeps a change feed.

As in the seed: the store loads the client's records at start with the query
``/clientName = '<name>'``; a subscription marks each change it receives and each one it has
processed; the **most recent** bookmark of a subscription is the position before the oldest
change still being processed (so changes processed out of order, by several handler threads,
are never skipped on resume); it is persisted every ``persist_every`` processed changes (by a
background thread that writes only the latest one) and on :meth:`BookmarkStore.close`. A
subscriber killed between persists resumes from the last persisted bookmark: it may receive
again the changes after it, and misses none. A subscription that fails to start (its bookmark
is older than the change feed retains) keeps its stored bookmark: start it again with
``resync`` (``subscribe --resync``) to re-read the records changed since, then go live.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from ..apply.jobs import apply_here
from ..config import parse_topics
from ..connection import Client
from ..errors import UnknownTopicError
from ..model.topic import TopicConfig
from ..model.values import JSONObject
from ..publish.append import append
from ..query.sow import query
from ..registry import apply_topics, get_topic
from ..settings import Settings
from .bookmark import Bookmark

log = logging.getLogger(__name__)

STORE_TOPIC = "/ADMIN/bookmark_store"
STORE_CONFIG = (f'[[topic]]\nname = "{STORE_TOPIC}"\nkey = ["/clientName", "/subId"]\n'
                'partitions = 1\n')


def store_topic(r: Client) -> TopicConfig:
    """The store's topic, defined in the registry when it is not yet."""
    try:
        return get_topic(r, STORE_TOPIC)
    except UnknownTopicError:
        t = parse_topics(STORE_CONFIG)[0]
        apply_topics(r, [t])
        return t


class SubscriptionState:
    """What the store knows of one subscription: per partition, the position up to which every
    change is processed, and the changes received but not processed yet, in order."""

    def __init__(self, store: BookmarkStore, sub_id: str, partitions: int) -> None:
        self.store, self.sub_id = store, sub_id
        self.started = False
        """True once the subscription started: a subscription that failed to start (e.g. a
        bookmark older than the change feed) never writes over its stored bookmark."""
        self.done = [0] * partitions
        self.pending: list[deque[list[int | bool]]] = [deque() for _ in range(partitions)]
        self.since_persist = 0
        self.lock = threading.Lock()

    # Tracker (sow_redis.feed.subscriber) --------------------------------------------------
    def start(self, bm: Bookmark) -> None:
        with self.lock:
            self.started = True
            self.done = list(bm.seqs)
            for q in self.pending:
                q.clear()

    def received(self, p: int, seq: int) -> None:
        with self.lock:
            self.pending[p].append([seq, False])

    def skip(self, p: int, seq: int) -> None:
        with self.lock:
            if self.pending[p]:
                self.pending[p].append([seq, True])
            else:
                self.done[p] = max(self.done[p], seq)

    def processed(self, p: int, seq: int) -> None:
        with self.lock:
            q = self.pending[p]
            for item in q:
                if item[0] == seq:
                    item[1] = True
                    break
            while q and q[0][1]:
                self.done[p] = max(self.done[p], q.popleft()[0])
            self.since_persist += 1
            due = self.since_persist >= self.store.persist_every
            if due:
                self.since_persist = 0
        if due:
            self.store.persist(self.sub_id)

    def most_recent(self) -> Bookmark:
        """The position before the oldest change still being processed, per partition."""
        with self.lock:
            return Bookmark(tuple(self.done))


class BookmarkStore:
    """The bookmarks of one client name, kept in ``/ADMIN/bookmark_store`` (see the module
    docstring). Use as a context manager, or call :meth:`close`, so the last bookmarks are
    written.

    Args:
        r: the client (the store topic is read and written through it, applied in this
            process, so no worker needs to run for it).
        settings: the appliers' settings (:class:`~sow_redis.settings.Settings`; default:
            from the environment).
        client_name: the tracked client's name (the seed's ``trackedClientName``).
        persist_every: processed changes between two writes of a subscription's bookmark.
        persisted: the record's ``persisted`` flag (see the module docstring).
    """

    def __init__(self, r: Client, client_name: str, persist_every: int = 10,
                 persisted: bool = True, settings: Settings | None = None) -> None:
        if persist_every < 1:
            raise ValueError("persist_every must be 1 or more")
        self.client_name, self.persist_every, self.persisted = client_name, persist_every, persisted
        self.r = r
        self.settings = settings or Settings.from_env()
        self.topic = store_topic(r)
        self._subs: dict[str, SubscriptionState] = {}
        self.loaded: dict[str, str] = {}
        self._dirty: set[str] = set()
        self._cond = threading.Condition()
        self._closing = False
        self._load()
        self._thread = threading.Thread(target=self._writer, name=f"bookmarks {client_name}",
                                        daemon=True)
        self._thread.start()

    def _load(self) -> None:
        """Step 1 of the seed: the client's records, by the query ``/clientName = 'NAME'``
        (entries still in the store's log are applied first, here)."""
        _apply_store(self.r, self.topic, self.settings)
        quoted = self.client_name.replace("'", "''")
        for rec in query(self.r, self.topic, f"/clientName = '{quoted}'"):
            obj = rec.obj()
            if isinstance(obj.get("subId"), str) and isinstance(obj.get("bookmark"), str):
                self.loaded[obj["subId"]] = obj["bookmark"]

    def recent(self, sub_id: str) -> str | None:
        """The stored most recent bookmark of a subscription (``RECENT``), None if none."""
        state = self._subs.get(sub_id)
        if state is not None and state.started:
            return str(state.most_recent())
        return self.loaded.get(sub_id)

    def tracker(self, sub_id: str, partitions: int) -> SubscriptionState:
        """The state of subscription ``sub_id`` (give it to the subscriber as ``tracker``)."""
        state = self._subs.get(sub_id)
        if state is None:
            state = self._subs[sub_id] = SubscriptionState(self, sub_id, partitions)
        return state

    # writing ------------------------------------------------------------------------------
    def persist(self, sub_id: str) -> None:
        """Have the subscription's most recent bookmark written soon (background thread)."""
        with self._cond:
            self._dirty.add(sub_id)
            self._cond.notify()

    def _record(self, sub_id: str) -> dict[str, str]:
        return {"clientName": self.client_name, "subId": sub_id,
                "bookmark": str(self._subs[sub_id].most_recent()),
                "persisted": "true" if self.persisted else "false"}

    def _write(self, sub_ids: set[str]) -> None:
        records = [self._record(s) for s in sorted(sub_ids)
                   if s in self._subs and self._subs[s].started]
        if records:
            result = append(self.r, self.topic, [("publish", rec, None) for rec in records])
            apply_here(self.r, self.topic, list(result.last_ids), self.settings, STORE_APPLY_S)

    def _writer(self) -> None:
        while True:
            with self._cond:
                while not self._dirty and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                dirty, self._dirty = self._dirty, set()
            try:
                self._write(dirty)
            except Exception as exc:  # keep the subscriber alive; retried at the next persist
                log.warning("bookmark store %s: writing failed: %s", self.client_name, exc)
                with self._cond:
                    self._dirty |= dirty

    def flush(self) -> None:
        """Write every subscription's most recent bookmark now (seeds/002 step 3)."""
        self._write(set(self._subs))

    def close(self) -> None:
        """Stop the writer and flush."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout=10)
        self.flush()

    def __enter__(self) -> BookmarkStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


STORE_APPLY_S = 30.0
"""Seconds the store waits at most for a worker that holds its partition's lease."""


def _apply_store(r: Client, topic: TopicConfig, settings: Settings) -> None:
    """Apply what the store's log holds (written by a process that died before applying)."""
    apply_here(r, topic, list(range(topic.partitions)), settings, STORE_APPLY_S)


def list_bookmarks(r: Client, client_name: str, sub_id: str | None = None) -> list[JSONObject]:
    """The stored records of a client (and one subscription), as the store holds them."""
    topic = store_topic(r)
    _apply_store(r, topic, Settings.from_env())
    quoted = client_name.replace("'", "''")
    flt = f"/clientName = '{quoted}'"
    if sub_id is not None:
        flt += " AND /subId = '" + sub_id.replace("'", "''") + "'"
    return [rec.obj() for rec in query(r, topic, flt)]
