"""``sow-redis subscribe``, ``sow-and-subscribe``, ``bookmarks``: live changes as JSON Lines
(:mod:`sow_redis.feed`)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import click
import orjson

from .common import friendly, select_list, sow_of, split_keys

if TYPE_CHECKING:  # annotations only (start-up time: see the functions' imports)
    from ..feed.aggregate import AggregatedSubscriber
    from ..feed.multi import MultiSubscriber
    from ..feed.subscriber import Message, Subscriber

F = TypeVar("F", bound=Callable[..., object])


def _run_subscription(sub: Subscriber | AggregatedSubscriber | MultiSubscriber,
                      count: int | None, timeout: float | None) -> None:
    """Print a subscription's messages as JSON Lines until ``count`` messages, ``timeout``
    seconds without one, Ctrl-C or SIGTERM; each is processed once written. Recoveries go to
    stderr too, and first one line saying that the subscription is live (every change from
    then on is printed). Closing flushes the bookmark store."""
    from ..feed.multi import MultiSubscriber  # start-up time: redis-py
    from ..feed.subscriber import to_line  # start-up time: redis-py

    def on_term(*_a: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    out = sys.stdout.buffer
    topics = sub.topics if isinstance(sub, MultiSubscriber) else [sub.topic]
    where = ", ".join(f"{t.name} ({t.partitions} partition(s))" for t in topics)
    click.echo(f"live on {where}: every change from now on is printed; Ctrl-C stops", err=True)
    try:
        with sub:
            def write(msg: Message) -> None:
                try:
                    line = to_line(msg)
                except (TypeError, ValueError) as exc:  # one error line; the others go on
                    _report_recovery({**msg, "kind": "error", "data": None,
                                      "error": f"the message cannot be written as JSON ({exc})"})
                    return
                out.write(line)
                out.flush()

            sub.run(write, count=count, timeout=timeout)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


def _select_option(fn: F) -> F:
    """The --select option of the subscription commands (AMPS select lists)."""
    return click.option("--select", "select", multiple=True,
                        help="Keep only these field paths in each message's data (a select "
                        "list): comma-separated (\"/id,/px\") or the option repeated; not "
                        "with --delta.")(fn)


def _select_list(select: tuple[str, ...], delta: bool) -> list[str] | None:
    """The --select values as the API takes them (:func:`select_list`), refused with
    --delta."""
    if select and delta:
        raise click.UsageError("--select does not go with --delta (an update carries only "
                               "the fields that changed)")
    return select_list(select)


def _message_limits(fn: F) -> F:
    """The --count and --timeout options of the subscription commands."""
    fn = click.option("--timeout", type=float,
                      help="Exit after this many seconds without a message.")(fn)
    return click.option("--count", type=click.IntRange(min=1),
                        help="Exit after this many messages.")(fn)


def _report_recovery(msg: Message) -> None:
    """One stderr line per ``recovery`` or ``error`` message of a subscription."""
    if msg["kind"] == "error":
        where = "" if msg.get("partition") is None else f" partition {msg['partition']}"
        seq = "" if msg.get("seq") is None else f" seq {msg['seq']}"
        key = "" if msg.get("sow_key") is None else f" (SOW key {msg['sow_key']!r})"
        click.echo(f"error: topic {msg['topic']}{where}{seq}{key}: {msg['error']}; skipped",
                   err=True)
        return
    if msg["cause"] == "migration":
        click.echo(f"topic {msg['topic']} was migrated to {msg['partitions']} partition(s): "
                   "following the new layout; its records were read again", err=True)
        return
    if msg["cause"] == "snapshot":
        click.echo(f"partition {msg['partition']} of {msg['topic']}: the copy of its records "
                   "went before the query part was read; read again whole (records may come "
                   "twice)", err=True)
        return
    click.echo(f"recovered partition {msg['partition']} of {msg['topic']}: seq "
               f"{msg['after'] + 1}..{msg['to']} after a {msg['cause']} (from the "
               f"{'change feed' if msg['how'] == 'feed' else 'records'})", err=True)


@click.command()
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.option("-f", "--filter", "filter_", help="Only records that match (AMPS filter).")
@click.option("--keys", help="Only these SOW keys (comma-separated, AMPS SowKeys); with "
              "--filter both must hold.")
@click.option("--oof", is_flag=True, help="Out-of-focus notices: matching records removed "
              "(deleted, expired) or no longer matching (match).")
@click.option("--bookmark", help="Replay the change feed after this point first: a bookmark, "
              "EPOCH, NOW, RECENT or an ISO-8601 time.")
@click.option("--client-name", help="Keep this subscription's bookmark in the SOW-backed "
              "bookmark store under this client name (with --sub-id).")
@click.option("--sub-id", help="Subscription id in the bookmark store.")
@click.option("--persist-every", type=click.IntRange(min=1), default=10, show_default=True,
              help="Processed messages between two writes of the bookmark.")
@click.option("--resync", is_flag=True, help="A bookmark older than the change feed: re-read "
              "the records changed since it, then go live (instead of an error).")
@click.option("--topic-regex", is_flag=True, help="Read -t as a regular expression of topic "
              "names (it is one anyway when it is no defined topic and no valid name).")
@click.option("--delta", is_flag=True, help="Delta subscription (AMPS delta_subscribe): an "
              "update carries only the fields that changed; the topic needs change_previous.")
@_select_option
@_message_limits
@click.pass_context
@friendly
def subscribe(ctx: click.Context, topic: str, filter_: str | None, keys: str | None, oof: bool,
              bookmark: str | None, client_name: str | None, sub_id: str | None,
              persist_every: int, resync: bool, topic_regex: bool, delta: bool,
              select: tuple[str, ...], count: int | None, timeout: float | None) -> None:
    """Print the changes of a topic as JSON Lines (one message per line, with a "kind":
    publish, oof, completed, recovery), AMPS subscribe semantics: records published to the
    topic; removals only as out-of-focus notices (--oof). Gaps are recovered from the change
    feed. With --client-name/--sub-id the subscription resumes from its stored bookmark.
    With --delta an update of a record carries "delta": true, only the changed fields in
    "data" and the removed ones in "removed" (JSON Pointers). With --keys only the changes
    of those SOW keys are delivered.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 subscribe -t orders -f "/price > 100"
      sow-redis --redis-url redis://127.0.0.1:6390/0 subscribe -t orders --keys K1,K2 --oof
      sow-redis --redis-url redis://127.0.0.1:6390/0 subscribe -t orders \\
          --client-name w1 --sub-id orders-feed
    """
    if (client_name is None) != (sub_id is None):
        raise click.UsageError("--client-name and --sub-id go together")
    if client_name is None and bookmark is not None and bookmark.strip().upper() == "RECENT":
        raise click.UsageError("--bookmark RECENT needs the bookmark store: give --client-name "
                               "and --sub-id")
    selected = _select_list(select, delta)
    client = sow_of(ctx)
    names = client.resolve_topics(topic, topic_regex)
    if client_name is not None and names != [topic]:
        raise click.UsageError("--client-name keeps one topic's bookmarks: give one topic, "
                               "not a pattern")

    def one(name: str) -> Subscriber:
        return client.subscribe(name, filter_, oof=oof, bookmark=bookmark,
                                client_name=client_name, sub_id=sub_id,
                                persist_every=persist_every, resync=resync, delta=delta,
                                report=_report_recovery, keys=split_keys(keys),
                                select=selected)

    _run_subscription(one(topic) if names == [topic] else _many(one, names), count, timeout)


@click.command("sow-and-subscribe")
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.option("-f", "--filter", "filter_", help="Only records that match (AMPS filter).")
@click.option("--keys", help="Only these SOW keys (comma-separated, AMPS SowKeys); with "
              "--filter both must hold.")
@click.option("--oof", is_flag=True, help="Out-of-focus notices (see subscribe).")
@click.option("--top-n", type=click.IntRange(min=0), help="The query returns at most N records.")
@click.option("--skip-n", type=click.IntRange(min=0), help="The query leaves out its first N "
              "matches (a page: in --order-by's order, else in SOW-key order).")
@click.option("--order-by", help="Order of the query part, e.g. \"/price DESC, /orderId\".")
@click.option("--batch-size", type=click.IntRange(min=1), help="Read the query part N "
              "records at a time, from a copy of one partition at a time made in Redis "
              "(without --order-by and --skip-n: the client holds one batch; also with "
              "--as-of).")
@click.option("--topic-regex", is_flag=True, help="Read -t as a regular expression of topic "
              "names (it is one anyway when it is no defined topic and no valid name).")
@click.option("--delta", is_flag=True, help="AMPS sow_and_delta_subscribe: the records whole, "
              "then only the changed fields of each update (see subscribe --delta).")
@click.option("--as-of", "as_of", help="The query as of this point (ISO-8601 time, bookmark "
              "or EPOCH; a topic with history), then every change since, then live.")
@click.option("--projection", multiple=True, help="Aggregated subscription: a grouping field "
              "or FUNC(/path) AS /name (COUNT, SUM, AVG, MIN, MAX); repeat the option.")
@click.option("--grouping", multiple=True, help="Aggregated subscription: a field path to "
              "group by; repeat the option.")
@_select_option
@_message_limits
@click.pass_context
@friendly
def sow_and_subscribe(ctx: click.Context, topic: str, filter_: str | None, keys: str | None,
                      oof: bool, top_n: int | None, skip_n: int | None,
                      order_by: str | None, batch_size: int | None, topic_regex: bool,
                      delta: bool, as_of: str | None, projection: tuple[str, ...],
                      grouping: tuple[str, ...], select: tuple[str, ...], count: int | None,
                      timeout: float | None) -> None:
    """Print the query result ("kind": "sow"), a group_end line (also when the result is
    empty), then the live changes as subscribe does, as if query and subscription happened at
    the same instant (no gap, no duplicate).

    With --projection and --grouping (an aggregated subscription) it prints one row per
    group instead of records: first every row, then each row a change alters, and an oof
    line for a group left empty.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 sow-and-subscribe -t orders --oof
      sow-redis --redis-url redis://127.0.0.1:6390/0 sow-and-subscribe -t orders \\
          --grouping /sym --projection /sym --projection "COUNT(/id) AS /orders"
    """
    if projection or grouping:
        if not (projection and grouping):
            raise click.UsageError("--projection and --grouping go together")
        if (delta or top_n is not None or order_by is not None or as_of is not None
                or keys is not None or skip_n is not None or select
                or batch_size is not None):
            raise click.UsageError("an aggregated subscription (--projection) takes no "
                                   "--delta, --top-n, --skip-n, --order-by, --as-of, --keys, "
                                   "--select or --batch-size")
        client = sow_of(ctx)
        if client.resolve_topics(topic, topic_regex) != [topic]:
            raise click.UsageError("an aggregated subscription (--projection) reads one "
                                   "topic: give its name, not a pattern")
        _run_subscription(client.aggregate(topic, list(projection), list(grouping), filter_,
                                           report=_report_recovery),
                          count, timeout)
        return
    selected = _select_list(select, delta)
    client = sow_of(ctx)
    names = client.resolve_topics(topic, topic_regex)

    def one(name: str) -> Subscriber:
        return client.sow_and_subscribe(name, filter_, oof=oof, top_n=top_n,
                                        order_by=order_by, report=_report_recovery,
                                        delta=delta, as_of=as_of, keys=split_keys(keys),
                                        skip_n=skip_n, select=selected, batch_size=batch_size)

    _run_subscription(one(topic) if names == [topic] else _many(one, names), count, timeout)


def _many(one: Callable[[str], Subscriber], names: list[str]) -> MultiSubscriber:
    """One subscription per topic of a pattern, read as one (closed again if one fails)."""
    from ..feed.multi import MultiSubscriber  # start-up time: redis-py

    subs: list[Subscriber] = []
    try:
        for name in names:
            subs.append(one(name))
    except BaseException:
        for sub in subs:
            sub.close()
        raise
    return MultiSubscriber(subs)


@click.command()
@click.option("--client-name", required=True, help="Client name in the bookmark store.")
@click.option("--sub-id", help="Only this subscription.")
@click.pass_context
@friendly
def bookmarks(ctx: click.Context, client_name: str, sub_id: str | None) -> None:
    """Print the bookmarks stored for a client in the SOW-backed bookmark store
    (/ADMIN/bookmark_store), one JSON record per subscription.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 bookmarks --client-name w1
    """
    from ..feed.bookmark_store import list_bookmarks  # start-up time: redis-py

    for rec in list_bookmarks(sow_of(ctx).r, client_name, sub_id):
        sys.stdout.buffer.write(orjson.dumps(rec) + b"\n")
