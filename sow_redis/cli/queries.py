"""``sow-redis sow``, ``sow-delete``, ``errors``, ``chains``, ``keys``: reading a topic."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, BinaryIO

import click
import orjson

from .. import keys
from ..model.fix import encode
from ..model.records import Record
from .common import console_for, friendly, parse_separator, select_list, sow_of, split_keys

if TYPE_CHECKING:  # annotations only (start-up time: the client loads redis-py)
    from ..client import Sow


@click.command()
@click.option("-t", "--topic", required=True, help="SOW topic, or a regular expression of "
              "topic names (every line then names its topic).")
@click.option("--topic-regex", is_flag=True, help="Read -t as a regular expression of topic "
              "names (it is one anyway when it is no defined topic and no valid name).")
@click.option("-f", "--filter", "filter_", help="AMPS content filter, e.g. \"/price > 100\".")
@click.option("--top-n", type=click.IntRange(min=0), help="Return at most N records.")
@click.option("--skip-n", type=click.IntRange(min=0),
              help="Leave out the first N matches: with --top-n, a page. Pages come in "
              "--order-by's order, else in SOW-key order (stable while records change).")
@click.option("--select", "select", multiple=True, help="Return only these field paths of "
              "each record (a select list): comma-separated (\"/id,/o/px\") or the option "
              "repeated.")
@click.option("--as-of", "as_of", help="The SOW as it was at this point: an ISO-8601 time, a "
              "bookmark or EPOCH (a topic with history).")
@click.option("--batch-size", type=click.IntRange(min=1), help="Read and print N records at a "
              "time (any --format but table; without --order-by and --skip-n a result of any "
              "size takes the memory of one batch).")
@click.option("--order-by", help="e.g. \"/price DESC, /orderId\".")
@click.option("--keys", help="Only these SOW keys (comma-separated).")
@click.option("--with-key", is_flag=True, help="Print {\"sow_key\":…, \"data\":…} per record.")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "table", "fix", "xml"]),
              default="jsonl", show_default=True,
              help="fix: tag=value fields, one record per line; xml: one XML document per line.")
@click.option("--separator", help="With --format fix: field separator (default: the topic's).")
@click.option("--explain", is_flag=True, help="Print the query plan instead of the records: "
              "\"<topic>: index /px range (10, +inf)\", \"hash index …\", \"key …\" or "
              "\"scan\", one line per topic.")
@click.pass_context
@friendly
def sow(ctx: click.Context, topic: str, topic_regex: bool, filter_: str | None,
        top_n: int | None, skip_n: int | None, select: tuple[str, ...], as_of: str | None,
        batch_size: int | None, order_by: str | None, keys: str | None, with_key: bool,
        fmt: str, separator: str | None, explain: bool) -> None:
    """Query the SOW of a topic: one JSON record per line.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 sow -t flights -f "/carrier = 'UA' AND /dep_delay > 60" --top-n 5
      sow-redis --redis-url redis://127.0.0.1:6390/0 sow -t flights --order-by /tailnum --skip-n 20 --top-n 10 --select /tailnum,/carrier
      sow-redis --redis-url redis://127.0.0.1:6390/0 sow -t flights -f "/dep_delay > 60" --explain
    """
    selected = select_list(select)
    client = sow_of(ctx)
    if explain:
        for name in client.resolve_topics(topic, topic_regex):
            plan = client.explain(name, filter_, split_keys(keys))
            text = f"scan of the history as of {as_of}" if as_of is not None else plan.text
            click.echo(f"{name}: {text}")
        return
    if batch_size is not None and fmt == "table":
        raise click.UsageError("--batch-size does not go with --format table (a table is laid "
                               "out from every record)")
    names = client.resolve_topics(topic, topic_regex)
    if names != [topic]:  # a pattern: each topic's records, every line naming its topic
        for name in names:
            _print_records(client, name, filter_, keys, top_n, order_by, skip_n, selected,
                           as_of, batch_size, with_key, fmt, separator, labelled=True)
        return
    _print_records(client, topic, filter_, keys, top_n, order_by, skip_n, selected, as_of,
                   batch_size, with_key, fmt, separator, labelled=False)


def _print_records(sow: Sow, topic: str, filter_: str | None, keys: str | None,
                   top_n: int | None, order_by: str | None, skip_n: int | None,
                   select: list[str] | None, as_of: str | None, batch_size: int | None,
                   with_key: bool, fmt: str, separator: str | None, labelled: bool) -> None:
    """Print one topic's query result (``labelled``: JSON lines carry ``topic``); with
    ``batch_size``, read and printed ``batch_size`` records at a time."""
    out = sys.stdout.buffer
    if batch_size is None:
        records: Iterable[Record] = sow.sow(topic, filter_, split_keys(keys), top_n, order_by,
                                            skip_n=skip_n, select=select, as_of=as_of)
    else:
        records = _flushing(out, batch_size, sow.sow(
            topic, filter_, split_keys(keys), top_n, order_by, skip_n=skip_n, select=select,
            as_of=as_of, batch_size=batch_size))
    if fmt == "table":
        _print_table(topic, list(records), with_key)
        return
    if fmt == "xml":
        from ..model.xml import encode as xml_encode  # start-up time: xml.sax

        for rec in records:
            out.write((topic.encode() + b" " if labelled else b"")
                      + (rec.sow_key.encode() + b" " if with_key else b"")
                      + xml_encode(rec.obj()) + b"\n")
        out.flush()
        return
    if fmt == "fix":
        t = sow.topic(topic)
        if t.message_type != "fix":
            raise click.ClickException(f"--format fix needs a FIX topic; '{topic}' holds "
                                       f"{t.message_type} messages (use jsonl or table)")
        sep = parse_separator(separator) or t.field_separator.encode()
        for rec in records:
            out.write((topic.encode() + b" " if labelled else b"")
                      + (rec.sow_key.encode() + b" " if with_key else b"")
                      + encode(rec.obj(), sep) + b"\n")
        out.flush()
        return
    label = b'"topic":%s,' % orjson.dumps(topic) if labelled else b""
    for rec in records:
        if with_key:
            key = rec.sow_key.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            out.write(b'{%s"sow_key":%s,"seq":%d,"expiry_ms":%d,"data":%s}\n'
                      % (label, orjson.dumps(key), rec.seq, rec.expiry_ms, rec.data))
        elif labelled:
            out.write(b'{%s"data":%s}\n' % (label, rec.data))
        else:
            out.write(rec.data + b"\n")
    out.flush()


def _flushing(out: BinaryIO, every: int, records: Iterable[Record]) -> Iterator[Record]:
    """``records``, flushing ``out`` after each ``every`` of them (a batch printed whole)."""
    for i, rec in enumerate(records, 1):
        yield rec
        if i % every == 0:
            out.flush()


def _print_table(topic: str, records: list[Record], with_key: bool) -> None:
    from rich.table import Table  # start-up time: rich, for --format table

    objs = [r.obj() for r in records]
    cols: list[str] = []
    for o in objs:
        cols += [k for k in o if k not in cols]
    table = Table(title=f"{topic}: {len(records)} record(s)")
    if with_key:
        table.add_column("sow_key")
    for c in cols:
        table.add_column(c)
    for rec, o in zip(records, objs):
        cells = [orjson.dumps(o[c]).decode().strip('"') if c in o else "" for c in cols]
        table.add_row(*([rec.sow_key] if with_key else []), *cells)
    console_for(table).print(table)


@click.command("sow-delete")
@click.option("-t", "--topic", required=True, help="SOW topic, or a regular expression of "
              "topic names.")
@click.option("--topic-regex", is_flag=True, help="Read -t as a regular expression of topic "
              "names (it is one anyway when it is no defined topic and no valid name).")
@click.option("-f", "--filter", "filter_", help="Delete records matching (1=1: all).")
@click.option("--keys", help="Delete these SOW keys (comma-separated).")
@click.option("--data", help="Delete the record a publish of this JSON would update.")
@click.option("--sow-key", help="With --data on topics without key fields.")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for workers.")
@click.pass_context
@friendly
def sow_delete(ctx: click.Context, topic: str, topic_regex: bool, filter_: str | None,
               keys: str | None, data: str | None, sow_key: str | None,
               timeout: float) -> None:
    """Remove records by filter, by SOW keys or by message data; prints how many.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 sow-delete -t orders -f "/status = 'filled'"
    """
    if sum(x is not None for x in (filter_, keys, data)) != 1:
        raise click.UsageError("give exactly one of --filter, --keys or --data")
    client = sow_of(ctx)
    for name in client.resolve_topics(topic, topic_regex):
        n = client.sow_delete(name, filter=filter_, keys=split_keys(keys),
                              data=data.encode("utf-8", "surrogateescape")
                              if data is not None else None,
                              sow_key=sow_key, timeout=timeout)
        click.echo(f"removed {n} record(s) from {name}")


@click.command()
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.option("--count", default=100, show_default=True, help="Newest N entries.")
@click.pass_context
@friendly
def errors(ctx: click.Context, topic: str, count: int) -> None:
    """List messages the workers could not apply (the topic's error stream), with reasons.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 errors -t orders
    """
    for e in sow_of(ctx).errors(topic, count):
        sys.stdout.buffer.write(orjson.dumps(e) + b"\n")


@click.command()
@click.option("-t", "--topic", required=True, help="A topic with the chaining key generator.")
@click.option("--id", "ident", help="Show the chain of this identifier (e.g. a ClOrdID).")
@click.pass_context
@friendly
def chains(ctx: click.Context, topic: str, ident: str | None) -> None:
    """Chaining key generator state: identifiers in chains and, with validation on, the
    chains that would have been one had messages arrived in another order.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 chains -t orders --id ORD-1
    """
    from ..apply.chaining import chain_of, chain_stats, conflict_groups  # start-up time

    sow = sow_of(ctx)
    t = sow.topic(topic)
    if not t.chaining:
        raise click.ClickException(f"topic '{topic}' does not use the chaining key generator")
    if ident is not None:
        found = chain_of(sow.r, t, ident)
        if found is None:
            raise click.ClickException(f"topic '{topic}': {ident!r} is in no chain")
        click.echo(orjson.dumps(found).decode())
        return
    report = {"topic": t.name, **chain_stats(sow.r, t), "validation": t.chain_validation,
              "would_merge": conflict_groups(sow.r, t)}
    click.echo(orjson.dumps(report).decode())


@click.command("keys")
@click.option("-t", "--topic", required=True, help="A topic.")
@click.pass_context
@friendly
def keys_cmd(ctx: click.Context, topic: str) -> None:
    """A topic's partitions: one JSON line each with its hash slot, hash tag, transaction log
    (the stream any Redis client may XADD to) and live channel (SSUBSCRIBE). Every key of a
    partition is <tag>:<name> (docs/architecture.md, "Keys and channels").

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 keys -t orders
    """
    t = sow_of(ctx).topic(topic)
    for p in range(t.partitions):
        click.echo(orjson.dumps({
            "partition": p, "slot": keys.partition_slot(t.name, p),
            "tag": keys.partition_tag(t.name, p), "log": keys.log(t.name, p),
            "live": keys.partition_channel(t.name, p)}).decode())


@click.command("rebuild")
@click.option("-t", "--topic", required=True, help="A transient topic.")
@click.option("--wait", is_flag=True, help="Return once the workers replayed the log.")
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds to wait at most for a leased partition, and with --wait.")
@click.pass_context
@friendly
def rebuild(ctx: click.Context, topic: str, wait: bool, timeout: float) -> None:
    """Drop a transient topic's SOW; the workers rebuild it from its log, from its
    recovery_point (docs/failures.md, "Persistent and transient topics"). Subscribers get no
    event for the replayed entries: they re-read the records at their next change.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 rebuild -t quotes --wait
    """
    sow = sow_of(ctx)
    t = sow.topic(topic)
    sow.rebuild(topic, wait=wait, timeout=timeout)
    if wait:
        from ..registry import holdings  # start-up time: only here

        done = f"rebuilt {holdings(sow.r, t).records:,} record(s)"
    else:
        done = "the workers rebuild it"
    click.echo(f"topic '{t.name}': dropped the SOW of {t.partitions} partition(s); {done} "
               f"from its log (recovery point {t.recovery_point})")
