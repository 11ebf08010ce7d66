"""``sow-redis status``, ``stats``, ``metrics``: figures of every topic
(:mod:`sow_redis.ops.status`, :mod:`sow_redis.ops.metrics`)."""

from __future__ import annotations

import datetime as _dt
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import click
import orjson

from ..connection import Client, redact
from ..model.values import JSONObject
from ..stopping import StopEvent, stop_on_signals
from .common import console_for, friendly, sow_of

if TYPE_CHECKING:  # annotations only (start-up time: see the functions' imports)
    from rich.table import Table

    from ..model.topic import TopicConfig


def _each_topic(ctx: click.Context,
                report: Callable[[Client, TopicConfig], JSONObject]) -> None:
    """Print ``report(redis, topic)`` as one JSON line per registered topic, by name."""
    from ..registry import load_topics  # start-up time: redis-py

    sow = sow_of(ctx)
    for t in sorted(load_topics(sow.r).values(), key=lambda t: t.name):
        click.echo(orjson.dumps(report(sow.r, t)).decode())


@click.command()
@click.pass_context
@friendly
def status(ctx: click.Context) -> None:
    """Per topic and partition: records, log length, entries waiting to be applied.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 status
    """
    from ..ops.status import topic_status  # start-up time: redis-py

    _each_topic(ctx, topic_status)


@click.command()
@click.option("-t", "--topic", "topics", multiple=True, help="Only this topic (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per topic (for scripts).")
@click.option("--watch", is_flag=True, help="Refresh a terminal view every --interval seconds.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between the two readings the rates come from.")
@click.pass_context
@friendly
def stats(ctx: click.Context, topics: tuple[str, ...], as_json: bool, watch: bool,
          interval: float) -> None:
    """Per topic: records, partitions, log length and lag (entries not yet applied, age of the
    oldest), errors, records with an expiry and the next due time, chain identifiers,
    subscribers, change feed length, and inserts / updates / deletes / expiries / queries
    per second (from counters the Lua scripts keep in the same atomic calls).

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 stats --watch
      sow-redis --redis-url redis://127.0.0.1:6390/0 stats --json -t orders
    """
    _stats(ctx, topics, as_json, watch, interval)


def _stats(ctx: click.Context, topics: tuple[str, ...], as_json: bool, watch: bool,
           interval: float) -> None:
    from rich.console import Console  # start-up time: rich
    from rich.live import Live  # start-up time: rich

    from ..ops.status import topic_stats, with_rates  # start-up time: redis-py
    from ..registry import load_topics  # start-up time: redis-py

    sow = sow_of(ctx)
    chosen = load_topics(sow.r)
    unknown = [t for t in topics if t not in chosen]
    if unknown:
        sow.topic(unknown[0])  # raises UnknownTopicError: one line
    names = sorted(topics or chosen)

    def reading() -> dict[str, JSONObject]:
        return {n: topic_stats(sow.r, chosen[n]) for n in names}

    before = reading()
    if as_json and not watch:
        time.sleep(interval)
        after = reading()
        for n in names:
            sys.stdout.buffer.write(orjson.dumps(with_rates(before[n], after[n])) + b"\n")
        return
    time.sleep(interval)
    after = reading()
    if not watch:
        table = _stats_table([with_rates(before[n], after[n]) for n in names])
        console_for(table).print(table)
        return
    console = Console() if sys.stdout.isatty() else Console(width=180)
    with Live(console=console, auto_refresh=False) as live:
        while True:
            rows = [with_rates(before[n], after[n]) for n in names]
            if as_json:
                for row in rows:
                    sys.stdout.buffer.write(orjson.dumps(row) + b"\n")
                sys.stdout.flush()
            else:
                live.update(_stats_table(rows), refresh=True)
            time.sleep(interval)
            before, after = after, reading()


def _stats_table(rows: list[JSONObject]) -> Table:

    from rich.table import Table  # start-up time: rich

    table = Table(title="sow_redis topics")
    for col in ("topic", "records", "parts", "log", "lag", "lag age s", "errors", "expiring",
                "next due", "chain ids", "subs", "feed blocks", "ins/s", "upd/s", "del/s",
                "exp/s", "qry/s"):
        table.add_column(col, justify="left" if col in ("topic", "next due") else "right")
    for x in rows:
        due = x["next_due_ms"]
        ps = x["per_second"]
        table.add_row(
            x["topic"], f"{x['records']:,}", str(x["partitions"]), f"{x['log_entries']:,}",
            f"{x['lag']:,}", f"{x['lag_age_ms'] / 1000:.1f}", f"{x['errors']:,}",
            f"{x['with_expiry']:,}",
            "-" if due is None else _dt.datetime.fromtimestamp(due / 1000, _dt.UTC).strftime(
                "%H:%M:%S.%f")[:-3],
            f"{x['chain_ids']:,}", str(x["subscribers"]), f"{x['change_feed_blocks']:,}",
            *(f"{ps[k]:,.0f}" for k in ("inserts", "updates", "deletes", "expiries",
                                         "queries")))
    return table


@click.command()
@click.option("--port", type=click.IntRange(1, 65535), default=9464, show_default=True,
              help="HTTP port of the Prometheus endpoint (/metrics).")
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface).")
@click.pass_context
@friendly
def metrics(ctx: click.Context, port: int, bind: str) -> None:
    """Serve Prometheus metrics on http://BIND:PORT/metrics: the stats figures of every topic
    and histograms of publish→applied latency, apply batch latency and expiry lag (due time
    → delete event), from the topics' change blocks. Runs until Ctrl-C or SIGTERM.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 metrics --port 9464
    """
    from ..ops.metrics import serve  # start-up time: redis-py, prometheus

    stop = StopEvent()
    stop_on_signals(stop, (signal.SIGTERM,))
    click.echo(f"metrics on http://{bind}:{port}/metrics for {redact(sow_of(ctx).url)}", err=True)
    try:
        serve(sow_of(ctx).r, port, bind, stop)
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise click.ClickException(f"cannot serve metrics on {bind}:{port}: "
                                   f"{exc.strerror or exc}") from None
