"""SOW queries: content filter, SOW key list, hash- and range-index lookups, order-by, top-N.

AMPS User Guide ch. 7, "Queries" and "SOW Indexing" (seeds/004): a query returns every record
of the topic that matches the content filter. The query plan (:func:`plan_query`, shown by
``sow --explain``) picks what to read, first that applies:

1. the given SOW keys;
2. equality (``=`` or ``IN``) on exactly the key fields: the SOW keys follow from the values;
3. equality on exactly the fields of a configured hash index: that index;
4. a comparison (``<``, ``<=``, ``>``, ``>=``, ``=``, ``BETWEEN``) with a literal on a field of
   a configured range index (``index``), the filter itself or in its top-level AND: that
   index's members in the range (its numbers by score, other values by text), per partition
   (:mod:`sow_redis.model.rangeindex`); of several such fields the one whose range holds the
   fewest members, unless even that one holds more than :data:`MAX_INDEX_FRACTION` of the
   records;
5. otherwise every record (a scan).

The full filter is still checked on every record read, so a plan changes only how many
records are read, never which match.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, cast

import orjson
from redis.exceptions import OutOfMemoryError

from .. import keys
from ..connection import Client, Pipeline, server_ms
from ..model import rangeindex
from ..model.expiry import is_due
from ..model.records import Record
from ..model.records import decode as decode_record
from ..model.sowkey import generate, index_hash, partition_of_key
from ..model.topic import TopicConfig
from ..model.values import JSONObject, select_fields, select_paths
from .orderby import parse_order_by, sort_records

if TYPE_CHECKING:
    from .filter import Filter

log = logging.getLogger(__name__)

SCAN_COUNT = 1000
"""HSCAN page size (records) when a query reads a whole partition."""

MAX_INDEX_PROBES = 1024
"""Most value combinations an ``IN`` list may expand to before the index is not used."""

READ_CHUNK = 1000
"""Records read per HMGET when a query reads a range index's candidates."""

MAX_INDEX_FRACTION = 0.7
"""A range index is read only when its range holds at most this fraction of the topic's
records (``ZLEXCOUNT`` against ``HLEN``); a wider range is scanned instead. Over 100,000
records, reading half of them through the index took about 0.6x a scan's time, 80 % about
0.9x (scripts/bench_query.py, docs/benchmarks.md)."""


def scan_partition(r: Client, topic: TopicConfig, p: int, lenient: bool = False
                   ) -> Iterator[Record]:
    """Every record of one partition (HSCAN; a record changed during the scan may be missed or
    seen twice, as with any Redis SCAN); ``lenient``: a key that is not UTF-8 reads
    (:func:`sow_redis.model.records.decode`)."""
    for k, v in r.hscan_iter(keys.records(topic.name, p), count=SCAN_COUNT):
        yield decode_record(k, v, lenient)


def get_records(r: Client, topic: TopicConfig, sow_keys: list[str]) -> Iterator[Record]:
    """The records with these SOW keys, in the given order, skipping absent ones.

    Without ``partition_by`` a key's partition follows from the key itself, so each key is
    read from its one partition; otherwise every partition is asked.
    """
    if not sow_keys:
        return
    by_part: dict[int, list[str]] = {}
    for k in dict.fromkeys(sow_keys):
        parts = ([partition_of_key(k, topic.partitions)] if not topic.partition_by
                 else range(topic.partitions))
        for p in parts:
            by_part.setdefault(p, []).append(k)
    pipe = r.pipeline(transaction=False)
    for p, ks in by_part.items():
        pipe.hmget(keys.records(topic.name, p), ks)
    found: dict[str, bytes] = {
        k: v for ks, values in zip(by_part.values(), pipe.execute())
        for k, v in zip(ks, values) if v is not None}
    for k in dict.fromkeys(sow_keys):
        if k in found:
            yield decode_record(k, found[k])


def _combos(paths: tuple[str, ...], terms: dict[str, list[str]]) -> list[tuple[str, ...]] | None:
    """Value combinations of equality terms over exactly ``paths`` (None: not those paths, or
    more than MAX_INDEX_PROBES combinations)."""
    if set(paths) != set(terms) or len(paths) != len(terms):
        return None
    combos = list(itertools.islice(
        itertools.product(*(terms[path] for path in paths)), MAX_INDEX_PROBES + 1))
    return combos if len(combos) <= MAX_INDEX_PROBES else None


def key_lookup(topic: TopicConfig, terms: dict[str, list[str]]) -> list[str] | None:
    """SOW keys for equality on exactly the topic's key fields (no scan, no index needed;
    not on chaining topics, whose keys come from the chain table)."""
    if topic.publisher_keys or topic.chaining:
        return None
    combos = _combos(topic.key, terms)
    return None if combos is None else [generate(topic.domain, list(c)) for c in combos]


def key_partitions(topic: TopicConfig, sow_keys: list[str]) -> list[int] | None:
    """The partitions that can hold records with these SOW keys, ascending: a key's
    partition follows from the key itself (None: any, with ``partition_by``)."""
    if topic.partition_by:
        return None
    return sorted({partition_of_key(k, topic.partitions) for k in sow_keys})


def pinned_keys(topic: TopicConfig, pred: Filter) -> list[str] | None:
    """The SOW keys a filter pins by equality on exactly the topic's key fields (``/id = 5``,
    ``/id IN (1, 2)``: :func:`key_lookup` of its equality terms); None: it pins none."""
    terms = pred.equality_terms()
    return key_lookup(topic, terms) if terms else None


def filter_partitions(topic: TopicConfig, pred: Filter) -> list[int] | None:
    """The partitions that can hold a record ``pred`` matches: those of its
    :func:`pinned_keys`, ascending; None: any. A sow_delete by filter is appended only there
    (the same plan a sow query of that filter reads by)."""
    sow_keys = pinned_keys(topic, pred)
    return None if sow_keys is None else key_partitions(topic, sow_keys)


def partition_candidates(r: Client, topic: TopicConfig, p: int, pred: Filter
                         ) -> Iterator[Record]:
    """The records of partition ``p`` that ``pred`` may match (the caller evaluates it on
    each): the records of its :func:`pinned_keys` that live in ``p``, else every record
    (:func:`scan_partition`). A worker's plan of a sow_delete by filter reads them."""
    # with partition_by a key does not name its partition: no keys to read by
    sow_keys = None if topic.partition_by else pinned_keys(topic, pred)
    if sow_keys is None:
        return scan_partition(r, topic, p)
    return get_records(r, topic, [k for k in sow_keys
                                  if partition_of_key(k, topic.partitions) == p])


def index_keys(r: Client, topic: TopicConfig, terms: dict[str, list[str]]) -> list[str] | None:
    """SOW keys that a hash index yields for equality terms ``{path: [values]}``.

    Returns:
        None when no hash index has exactly these fields (the caller scans instead).
    """
    for n, ix in enumerate(topic.hash_index):
        combos = _combos(ix, terms)
        if combos is None:
            continue
        pipe = r.pipeline(transaction=False)
        for p in range(topic.partitions):
            for combo in combos:
                h = index_hash(list(combo))
                pipe.zrangebylex(keys.index(topic.name, p, n), f"[{h}:", f"[{h};")
        out: list[str] = []
        for members in pipe.execute():
            out += [m.decode().split(":", 1)[1] for m in members]
        return out
    return None


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a query reads a topic (:func:`plan_query`).

    Attributes:
        kind: ``"sow_keys"``, ``"key"``, ``"hash_index"``, ``"range_index"`` or ``"scan"``.
        text: one line for people, e.g. ``index /px range (10, +inf)`` or ``scan``.
        index: the index number (:func:`keys.index`) for the two index kinds, else -1.
        bounds: a range index's bounds on its field.
        candidates / records: for a range index (planned with a client): the members in its
            range and the topic's records, summed over the partitions; else -1.
    """

    kind: str
    text: str
    index: int = -1
    bounds: tuple[rangeindex.Bound, ...] = ()
    candidates: int = -1
    records: int = -1

    def to_dict(self) -> dict[str, object]:
        """``{"plan": kind, "text": text}`` (and ``"index"`` for an index), for JSON output."""
        out: dict[str, object] = {"plan": self.kind, "text": self.text}
        if self.index >= 0:
            out["index"] = self.index
        if self.candidates >= 0:
            out["candidates"], out["records"] = self.candidates, self.records
        return out


def plan_query(topic: TopicConfig, pred: Filter | None,
               sow_keys: list[str] | None = None, r: Client | None = None) -> Plan:
    """The plan of a query of ``topic`` with the compiled filter ``pred`` (order in the module
    docstring). Without a client ``r`` nothing is read; with one, a range index's candidates
    are counted first and a range holding more than :data:`MAX_INDEX_FRACTION` of the records
    is scanned instead."""
    if sow_keys is not None:
        return Plan("sow_keys", f"sow keys ({len(sow_keys)})")
    if pred is None:
        return Plan("scan", "scan")
    terms = pred.equality_terms()
    if terms:
        if key_lookup(topic, terms) is not None:
            return Plan("key", "key " + ", ".join(topic.key))
        for n, ix in enumerate(topic.hash_index):
            if _combos(ix, terms) is not None:
                return Plan("hash_index", "hash index " + ", ".join(ix), n)
    plans = [Plan("range_index", f"index {path} range {rangeindex.describe(bounds)}",
                  len(topic.hash_index) + topic.index.index(path), tuple(bounds))
             for path, bounds in pred.range_terms().items() if path in topic.index]
    if not plans:
        return Plan("scan", "scan")
    return plans[0] if r is None else _estimated(r, topic, plans)


def _count_range(pipe: Pipeline, topic: TopicConfig, p: int, plan: Plan) -> int:
    """Queue on ``pipe`` the counts of partition ``p``'s members in the plan's ranges (its
    numbers' score range, then its lex ranges); returns how many replies they make."""
    scores = rangeindex.score_range(list(plan.bounds))
    if scores is not None:
        pipe.zcount(keys.range_numbers(topic.name, p, plan.index), *scores)
    lexes = rangeindex.lex_ranges(list(plan.bounds))
    for low, high in lexes:
        pipe.zlexcount(keys.index(topic.name, p, plan.index), low, high)
    return (scores is not None) + len(lexes)


def _estimated(r: Client, topic: TopicConfig, plans: list[Plan]) -> Plan:
    """Of the range index plans (one per indexed field of the filter), the one whose range
    holds the fewest members, with its candidates and the topic's records counted (one
    pipeline of ``ZCOUNT``, ``ZLEXCOUNT`` and ``HLEN``); a scan when even that one holds more
    than :data:`MAX_INDEX_FRACTION` of the records."""
    pipe = r.pipeline(transaction=False)
    for p in range(topic.partitions):
        pipe.hlen(keys.records(topic.name, p))
    replies = [sum(_count_range(pipe, topic, p, plan) for p in range(topic.partitions))
               for plan in plans]
    counts = [int(c) for c in pipe.execute()]
    records = sum(counts[:topic.partitions])
    at, per_plan = topic.partitions, []
    for n in replies:
        per_plan.append(sum(counts[at:at + n]))
        at += n
    candidates = min(per_plan)
    plan = plans[per_plan.index(candidates)]
    if candidates > MAX_INDEX_FRACTION * records:
        return Plan("scan", f"scan ({plan.text} holds {candidates} of {records} records)",
                    candidates=candidates, records=records)
    return dataclasses.replace(plan, candidates=candidates, records=records)


def range_candidates(r: Client, topic: TopicConfig, p: int, plan: Plan) -> list[str]:
    """The SOW keys of partition ``p`` that range index ``plan.index`` holds in the plan's
    range (candidates: the filter decides)."""
    pipe = r.pipeline(transaction=False)
    scores = rangeindex.score_range(list(plan.bounds))
    if scores is not None:
        pipe.zrangebyscore(keys.range_numbers(topic.name, p, plan.index), *scores)
    name = keys.index(topic.name, p, plan.index)
    for low, high in rangeindex.lex_ranges(list(plan.bounds)):
        pipe.zrangebylex(name, low, high)
    replies = cast("list[list[bytes]]", pipe.execute())
    numbers = [m.decode() for m in replies[0]] if scores is not None else []
    lexes = replies[1:] if scores is not None else replies
    # a key moved between the sets between two reads would come twice: once
    return list(dict.fromkeys(
        numbers + [rangeindex.member_key(m) for members in lexes for m in members]))


def _range_source(r: Client, topic: TopicConfig, plan: Plan) -> Iterator[Record]:
    """The records a range index gives, partition by partition, :data:`READ_CHUNK` a read."""
    for p in range(topic.partitions):
        candidates = range_candidates(r, topic, p, plan)
        name = keys.records(topic.name, p)
        for i in range(0, len(candidates), READ_CHUNK):
            chunk = candidates[i:i + READ_CHUNK]
            for k, v in zip(chunk, cast("list[bytes | None]", r.hmget(name, chunk))):
                if v is not None:  # removed since the index was read
                    yield decode_record(k, v, lenient=True)


def _source(r: Client, topic: TopicConfig, pred: Filter | None,
            sow_keys: list[str] | None) -> Iterator[Record]:
    """The records a query reads, as :func:`plan_query` plans."""
    plan = plan_query(topic, pred, sow_keys, r)
    if sow_keys is not None:
        return get_records(r, topic, sow_keys)
    terms = pred.equality_terms() if pred is not None else None
    if plan.kind == "key" and terms:
        return get_records(r, topic, key_lookup(topic, terms) or [])
    if plan.kind == "hash_index" and terms:
        return get_records(r, topic, index_keys(r, topic, terms) or [])
    if plan.kind == "range_index":
        return _range_source(r, topic, plan)
    return itertools.chain.from_iterable(
        scan_partition(r, topic, p, lenient=True) for p in range(topic.partitions))


def explain(r: Client, topic: TopicConfig, filter: str | None = None,
            sow_keys: list[str] | None = None) -> Plan:
    """The plan a :func:`query` of ``topic`` with this filter follows (no record is read; a
    range index's candidates are counted).

    Raises:
        FilterSyntaxError: the filter does not parse.
    """
    from .filter import compile_filter  # start-up time: as in query()

    return plan_query(topic, compile_filter(filter) if filter else None, sow_keys, r)


def check_page(top_n: int | None = None, skip_n: int | None = None,
               batch_size: int | None = None) -> None:
    """Check a query's page and batch arguments (None: not given).

    Raises:
        ValueError: ``top_n`` or ``skip_n`` below 0, ``batch_size`` below 1.
    """
    if top_n is not None and top_n < 0:
        raise ValueError(f"top_n must be 0 or more, got {top_n}")
    if skip_n is not None and skip_n < 0:
        raise ValueError(f"skip_n must be 0 or more, got {skip_n}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be 1 or more, got {batch_size}")


def unsorted(order_by: str | None, skip_n: int | None) -> bool:
    """Whether a query in batches hands its records over as it reads them: with neither an
    order (an empty ``order_by`` is none, as :func:`query` reads it) nor a page, which sort
    every match before the first batch."""
    return not order_by and skip_n is None


def query(r: Client, topic: TopicConfig, filter: str | None = None,
          sow_keys: list[str] | None = None,
          top_n: int | None = None, order_by: str | None = None, skip_n: int | None = None,
          select: str | list[str] | None = None,
          source: Iterable[Record] | None = None) -> list[Record]:
    """Run a SOW query.

    Args:
        filter: AMPS content filter (``None`` = every record).
        sow_keys: only these SOW keys.
        top_n: at most this many records (after ordering and ``skip_n``); ``0`` returns
            none (the filter and order-by are still checked), ``None`` every match.
        order_by: ``"/f DESC, /g"``.
        skip_n: leave out the first ``skip_n`` matches (after ordering): with ``top_n``, a
            page (AMPS ``skip_n``). A page is in a stable order: ``order_by``'s, else that of
            the SOW keys (every match is then read and sorted, as with an order-by), so pages
            taken one after the other while records are updated visit each record once.
            ``None`` (no page): without ``order_by`` the records come in the order they
            are read, and ``top_n`` stops reading once it has them.
        select: the field paths each record is returned with (a select list; AMPS
            ``select``), as a list or comma-separated (``"/id,/o/b"``; see
            :func:`~sow_redis.model.values.select_paths`): every other field is left out,
            nested paths keep their objects; ``None`` the whole record.
        source: the records to query instead of the topic's current ones (e.g. the SOW as
            of a point in time, :func:`sow_redis.feed.history.records_as_of`); they are
            taken as they are (no record is left out as due).

    Returns:
        The matching records.

    Raises:
        FilterSyntaxError: the filter or order-by does not parse, or nests too deeply.
        FilterEvalError: evaluating the filter on a record failed.
        ValueError: ``top_n`` or ``skip_n`` is negative, or a ``select`` path is no field
            path.

    A record whose data is no JSON object (written behind sow_redis's back) matches no filter
    and no order-by (a warning is logged); without either it is returned as stored.
    """
    # start-up time: the filter compiler loads lark and re2 (about 20 ms), and every CLI
    # command imports this module; only a query pays for them
    from .filter import compile_filter

    check_page(top_n, skip_n)
    selected = select_paths(select)
    try:
        r.hincrby(keys.topic_stats(topic.name), "n_query", 1)
    except OutOfMemoryError:  # a query reads: it never fails for want of memory to count it
        pass
    pred = compile_filter(filter) if filter else None
    order = parse_order_by(order_by) if order_by else None
    if top_n == 0:
        return []
    records = _source(r, topic, pred, sow_keys) if source is None else source
    out: list[Record] = []
    objs: dict[str, JSONObject] = {}
    now_ms = server_ms(r) if topic.expiration_enabled and source is None else 0
    for rec, obj in _matching(topic, records, pred, order is not None, now_ms):
        if obj is not None:
            objs[rec.sow_key] = obj
        out.append(rec)
        if top_n is not None and order is None and skip_n is None and len(out) >= top_n:
            break
    if order is not None:
        out = sort_records(out, order, data=lambda rec: objs[rec.sow_key])
    elif skip_n is not None:  # a page: in the order of the SOW keys
        out.sort(key=_sow_key)
    skip = skip_n or 0
    out = out[skip:] if top_n is None else out[skip:skip + top_n]
    return out if selected is None else [_selected(rec, selected) for rec in out]


def _sow_key(rec: Record) -> str:
    return rec.sow_key


def _matching(topic: TopicConfig, records: Iterable[Record], pred: Filter | None,
              decode: bool, now_ms: int) -> Iterator[tuple[Record, JSONObject | None]]:
    """The records that match ``pred`` and are not due at ``now_ms`` (0: no check), each
    with its decoded data when a filter or ``decode`` (an order-by) needed it."""
    for rec in records:
        if now_ms and is_due(rec.expiry_ms, now_ms):
            continue  # due: the expirer is about to remove it; never returned once due
        if pred is None and not decode:
            yield rec, None
            continue
        try:
            obj = rec.obj()
        except orjson.JSONDecodeError as exc:  # no JSON object: no filter can match it
            log.warning("topic %s: record %r is no JSON object the query can read (%s); "
                        "skipped", topic.name, rec.sow_key, exc)
            continue
        if not isinstance(obj, dict):
            continue
        if pred is not None and not pred(obj):
            continue
        yield rec, obj


def query_batches(r: Client, topic: TopicConfig, batch_size: int, filter: str | None = None,
                  sow_keys: list[str] | None = None, top_n: int | None = None,
                  order_by: str | None = None, skip_n: int | None = None,
                  select: str | list[str] | None = None,
                  source: Iterable[Record] | None = None) -> Iterator[list[Record]]:
    """:func:`query` in batches of at most ``batch_size`` records (AMPS ``batch_size``):
    without ``order_by`` and ``skip_n`` the records are read, filtered and handed over as they
    come, so a result of any size takes the memory of one batch (and of Redis's HSCAN
    pages); with either the matches are sorted first (a page's stable order, see
    :func:`query`), then handed over in batches. ``source`` as for :func:`query` (read as it
    is iterated).

    The arguments are checked (and the query counted) when this is called, before the first
    batch is asked for.

    Raises:
        ValueError: ``batch_size`` below 1; as :func:`query` otherwise.
    """
    check_page(top_n, skip_n, batch_size)
    if not unsorted(order_by, skip_n):
        rows = query(r, topic, filter, sow_keys, top_n, order_by, skip_n, select, source)
        return (rows[i:i + batch_size] for i in range(0, len(rows), batch_size))
    # a query of no record checks the arguments and counts the query (n_query)
    query(r, topic, filter, sow_keys, 0, None, skip_n, select)
    return _batches(r, topic, batch_size, filter, sow_keys, top_n, select, source)


def _batches(r: Client, topic: TopicConfig, batch_size: int, filter: str | None,
             sow_keys: list[str] | None, top_n: int | None, select: str | list[str] | None,
             source: Iterable[Record] | None) -> Iterator[list[Record]]:
    """The matches of an unordered :func:`query_batches`, read as they are asked for."""
    # start-up time: as in query()
    from .filter import compile_filter

    pred = compile_filter(filter) if filter else None
    selected = select_paths(select)
    now_ms = server_ms(r) if topic.expiration_enabled and source is None else 0
    records = _source(r, topic, pred, sow_keys) if source is None else source
    picked = itertools.islice(_matching(topic, records, pred, False, now_ms), top_n)
    batch: list[Record] = []
    for rec, _obj in picked:
        batch.append(rec if selected is None else _selected(rec, selected))
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def _selected(rec: Record, paths: list[tuple[str, ...]]) -> Record:
    """``rec`` with only the fields at ``paths`` (a select list); a record that is no JSON
    object is returned as it is."""
    try:
        obj = rec.obj()
    except orjson.JSONDecodeError:
        return rec
    if not isinstance(obj, dict):
        return rec
    return dataclasses.replace(rec, data=orjson.dumps(select_fields(obj, paths)))
