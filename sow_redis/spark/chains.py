"""``sow-redis spark resolve-chains``: the chaining key generator (seeds/003) over a whole
input at once, with pointer jumping in Spark.

The workers resolve a chaining topic one message after the other (:class:`sow_redis.apply.chaining.
ChainResolver`). Their rule, restated so it can run in parallel: the chain table only grows
(an identifier, once in a chain, keeps its head), so every identifier is placed by the first
message that carries it. In that message, an identifier already in a chain (an *old* one) is
joined by the message's new identifiers; when none is old, the message starts a chain whose
head is its first identifier (the first secondary value, else the primary one:
``ChainResolver.resolve``). Each new identifier therefore points at an identifier placed
earlier (or at itself for a head): a forest whose roots are the chain heads. Pointer jumping
(``parent := parent's parent``, one DataFrame self-join per round) finds every root in
``ceil(log2(depth)) + 1`` rounds.

A message whose old identifiers lie in two or more chains is the seed-003 error: the workers
reject it (``two_chains``) and place none of its identifiers. A rejected message can change how
later messages resolve, so resolution is repeated with the rejected messages removed: each
pass accepts, per partition, the earliest conflict and every later conflict whose chains no
earlier conflict of the pass could change (removing a message changes only the chain its new
identifiers joined; a conflict with no new identifier changes nothing), until a pass finds no
conflict. Then the forest is exactly the table the workers build.

Input rows come from the bulk load's executor code (:func:`sow_redis.spark.load.prepare_rows`:
the publisher's validation, FIX parsing and partitioning) and the identifiers from
:func:`sow_redis.model.chains.chain_values` (the workers' canonical values): no second
implementation of either. Identifiers already in the topic's chain table take part with the
heads stored there, so a load on top of earlier data resolves like the workers would.

The result is written to the chain table (:func:`sow_redis.keys.chain`, one hash per
partition; entries already there are left as they are). ``sow-redis spark load`` on a
chaining topic runs this first, so the workers' apply path finds every identifier of the load
in the table (one HMGET per batch) and writes no new links. The table holds the load's chains
before its messages are applied: a message published meanwhile by another publisher that
names an identifier of the load resolves as if the load came first. Load a chaining topic
while nothing else publishes to the same chains.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from .. import keys
from ..connection import Fields, connect
from ..errors import MessageError
from ..model.chains import chain_values
from ..model.messages import decode
from ..model.topic import TopicConfig
from .rows import Prepared, input_rows, prepare_rows

if TYPE_CHECKING:  # pyspark is the optional [spark] extra
    from pyspark import RDD
    from pyspark.sql import DataFrame, Row, SparkSession

WRITE_BATCH = 5000
"""Chain-table entries written per HSET."""


@dataclass
class ChainResult:
    """What a resolution found.

    Attributes:
        messages: messages that carry chaining identifiers (publishes of the input).
        ids: identifiers placed by the input (new in the chain table).
        chains: chains the input's identifiers belong to (heads, old and new).
        written: chain-table entries written.
        rounds: pointer-jumping rounds of each pass (one pass per conflict-removal step).
        conflicts: messages that would join two chains: ``{"partition", "order", "ids",
            "heads"}`` (order = the row's key in the load order: increasing, not a line
            number).
    """

    messages: int = 0
    ids: int = 0
    chains: int = 0
    written: int = 0
    rounds: list[int] = field(default_factory=list)
    conflicts: list[dict[str, Any]] = field(default_factory=list)


def chain_rows(topic_json: bytes, rows: Iterable[Prepared]
               ) -> Iterator[tuple[int, int, list[str]]]:
    """Executor side: prepared load rows ``(partition, (order, fields, reject))`` →
    ``(partition, order, identifiers)`` for every message that can place identifiers, the
    identifiers in the order the workers look them up (secondary values, then the primary),
    the first one the head of a new chain. Deletes (they place nothing) and rows the workers
    reject before resolving (bad JSON, no chaining field) are left out."""
    topic = TopicConfig.from_json(topic_json)
    for p, (order, fields, _reject) in rows:
        if p < 0 or fields is None or fields.get("cmd") == "sow_delete":
            continue
        try:
            primary, secondary = chain_values(decode(cast(bytes, fields["data"]), topic), topic)
        except MessageError:
            continue
        # ChainResolver.resolve: idents = secondary values then the primary, deduplicated
        idents = list(dict.fromkeys([*secondary, primary] if primary is not None else secondary))
        yield p, order, idents


def read_table(url: str, topic: str, p: int) -> Iterator[tuple[int, str, str]]:
    """Executor side: partition ``p``'s chain table as ``(p, identifier, head)``."""
    r = connect(url)
    for k, v in r.hscan_iter(keys.chain(topic, p), count=5000):
        yield p, k.decode(), v.decode()


def write_table(url: str, topic: str, rows: Iterable[Row]) -> Iterator[int]:
    """Executor side: HSET ``(p, id, head)`` rows into the chain tables; yields the count."""
    r = connect(url)
    pipe = r.pipeline(transaction=False)
    pending: dict[int, Fields] = {}
    n = queued = 0
    for row in rows:
        pending.setdefault(row[0], {})[row[1]] = row[2]
        n += 1
        queued += 1
        if queued >= WRITE_BATCH:
            for p, mapping in pending.items():
                pipe.hset(keys.chain(topic, p), mapping=mapping)
            pipe.execute()
            pending, queued = {}, 0
    for p, mapping in pending.items():
        pipe.hset(keys.chain(topic, p), mapping=mapping)
    pipe.execute()
    yield n


def pointer_jump(parents: DataFrame) -> tuple[DataFrame, int]:
    """Roots of a forest given as a DataFrame ``(p, id, parent)`` (a root is its own parent).

    Returns:
        ``(DataFrame (p, id, head), rounds)``; each round replaces every parent by its parent
        (one self-join), so the rounds are logarithmic in the depth of the deepest chain.
    """
    # start-up time: pyspark (the optional [spark] extra) loads once Spark runs
    from pyspark.sql import functions as F

    cur = parents.localCheckpoint()
    rounds = 0
    while True:
        rounds += 1
        a, b = cur.alias("a"), cur.alias("b")
        nxt = (a.join(b, (F.col("a.p") == F.col("b.p")) & (F.col("a.parent") == F.col("b.id")))
               .select(F.col("a.p").alias("p"), F.col("a.id").alias("id"),
                       F.col("b.parent").alias("parent"),
                       (F.col("b.parent") != F.col("a.parent")).alias("moved"))
               .localCheckpoint(eager=False))
        moved = nxt.filter("moved").count()  # materialises the checkpoint
        cur = nxt.drop("moved")
        if moved == 0:
            return cur.withColumnRenamed("parent", "head"), rounds


def resolve_prepared(spark: SparkSession, url: str, topic: TopicConfig, prepared: RDD[Prepared],
                     write: bool = True, max_passes: int = 1000) -> ChainResult:
    """Resolve the chains of prepared load rows (an RDD of ``(partition, (order, fields,
    reject))``, as :func:`sow_redis.spark.load.load_rows` builds them) and write the new
    chain-table entries (see the module docstring).

    Raises:
        ValueError: the topic has no chaining key generator.
        RuntimeError: no fixed point after ``max_passes`` passes (never expected: each pass
            removes at least one conflict).
    """
    # start-up time: pyspark (the optional [spark] extra) loads once Spark runs
    from pyspark.sql import functions as F

    if not topic.chaining:
        raise ValueError(f"topic {topic.name!r} has no chaining key generator")
    topic_json, name = topic.to_json(), topic.name
    # checkpointed: chain_rows (each message decoded in Python) runs once, not once per use
    msgs = spark.createDataFrame(
        prepared.mapPartitions(lambda it: chain_rows(topic_json, it)),
        "p int, o long, ids array<string>").localCheckpoint()
    pairs = msgs.select("p", "o", F.posexplode("ids").alias("pos", "id"))
    existing = spark.createDataFrame(
        spark.sparkContext.parallelize(range(topic.partitions), topic.partitions).flatMap(
            lambda p: read_table(url, name, p)), "p int, id string, parent string"
    ).localCheckpoint()
    out = ChainResult(messages=msgs.count())
    removed: list[tuple[int, int]] = []
    while True:
        if len(out.rounds) >= max_passes:
            raise RuntimeError(f"chain resolution found no fixed point in {max_passes} passes")
        active = pairs
        if removed:
            gone = spark.createDataFrame(removed, "p int, o long")
            active = pairs.join(F.broadcast(gone), ["p", "o"], "left_anti")
        first = active.groupBy("p", "id").agg(F.min("o").alias("f")).join(
            existing.select("p", "id"), ["p", "id"], "left_anti").unionByName(
            existing.select("p", "id", F.lit(-1).cast("long").alias("f")))
        cls = active.join(first, ["p", "id"]).localCheckpoint()
        anchors = cls.filter("f < o").groupBy("p", "o").agg(
            F.min(F.struct("pos", "id")).getField("id").alias("anchor"))
        roots = cls.filter("pos = 0").select("p", "o", F.col("id").alias("root"))
        placed = (cls.filter("f = o").join(anchors, ["p", "o"], "left").join(roots, ["p", "o"])
                  .select("p", "id", F.coalesce("anchor", "root").alias("parent")))
        heads, rounds = pointer_jump(placed.unionByName(existing))
        out.rounds.append(rounds)
        new_ids = cls.filter("f = o").groupBy("p", "o").count()
        detected = (cls.filter("f < o").join(heads, ["p", "id"]).groupBy("p", "o")
                    .agg(F.array_sort(F.collect_set("head")).alias("heads"),
                         F.min(F.struct("pos", "head")).getField("head").alias("anchor"))
                    .filter(F.size("heads") > 1).join(new_ids, ["p", "o"], "left")
                    .orderBy("p", "o").collect())
        if not detected:
            break
        # removing a conflict changes only the chain its new identifiers joined (its anchor's);
        # a later conflict touching none of those chains is a conflict whatever comes before
        tainted: dict[int, set[str]] = {}
        for row in detected:
            seen = tainted.setdefault(row["p"], set())
            if not seen & set(row["heads"]):
                removed.append((row["p"], row["o"]))
            if row["count"]:
                seen.add(row["anchor"])
    new = heads.join(existing.select("p", "id"), ["p", "id"], "left_anti").localCheckpoint()
    out.ids = new.count()
    out.chains = heads.select("p", "head").distinct().count() if out.ids else 0
    if removed:
        gone = spark.createDataFrame(removed, "p int, o long")
        rows = msgs.join(F.broadcast(gone), ["p", "o"]).collect()
        table = {(r["p"], r["id"]): r["head"] for r in heads.join(
            pairs.join(F.broadcast(gone), ["p", "o"]).select("p", "id"), ["p", "id"]).collect()}
        out.conflicts = sorted(
            ({"partition": r["p"], "order": r["o"], "ids": list(r["ids"]),
              "heads": sorted({table[(r["p"], i)] for i in r["ids"] if (r["p"], i) in table})}
             for r in rows), key=lambda c: (c["partition"], c["order"]))
    if write and out.ids:
        out.written = sum(new.rdd.mapPartitions(
            lambda it: write_table(url, name, it)).collect())
    return out


def resolve_chains(spark: SparkSession, url: str, topic: TopicConfig, inputs: list[str],
                   fmt: str | None = None, order_by: list[str] | None = None,
                   separator: bytes | None = None, write: bool = True) -> ChainResult:
    """Resolve the chains of ``inputs`` (read, validated and ordered as ``spark load`` does)
    and write them to the topic's chain table.

    Raises:
        ValueError: the format cannot be told, or the topic has no chaining key generator;
            Spark's AnalysisException for unreadable input.
    """
    topic_json = topic.to_json()
    rows = input_rows(spark, inputs, fmt, order_by)
    prepared = rows.mapPartitions(lambda it: prepare_rows(topic_json, it, separator))
    return resolve_prepared(spark, url, topic, prepared, write)
