"""``sow-redis spark …``: the data pipeline on Spark (:mod:`sow_redis.spark`, whose modules
import pyspark only when a command runs)."""

from __future__ import annotations

import functools
import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, TextIO, TypeVar

import click
import orjson

from ..model.fix import separator as fix_separator
from .common import check_durable, friendly, one_line, redis_url, sow_of, with_options

if TYPE_CHECKING:  # annotations only (start-up time: see the functions' imports)
    from pyspark.sql import SparkSession

    from ..spark.load import LoadResult

P = ParamSpec("P")
R = TypeVar("R")


@click.group()
def spark() -> None:
    """The data pipeline on Spark (pyspark, the 'spark' extra): bulk loads into a SOW, chain
    resolution, streaming, snapshots, log archives, rebuilds and SQL.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 spark load -t flights data/flights.jsonl
      sow-redis --redis-url redis://127.0.0.1:6390/0 spark sql "SELECT count(*) FROM flights"
    """


def _spark_session(master: str) -> SparkSession:
    """The SparkSession of the spark commands; one line when pyspark is missing. With stderr
    not a terminal: no progress bar, and Spark's own log to a file (spark/session.py)."""
    from ..spark.session import get_session, mute_query_context_loggers  # start-up time

    try:
        session = get_session(master, quiet=not sys.stderr.isatty())
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    mute_query_context_loggers()  # _spark_errors reports the error, in one line
    return session


def _spark_start() -> str:
    """What starting Spark cost the command, for its summary: ``Spark start-up 7.3 s`` (the
    driver's JVM and SparkContext; wall clock), or ``Spark session reused`` in ``spark
    shell``."""
    from ..spark.session import start_seconds  # start-up time: the Spark pipeline

    seconds, reused = start_seconds()
    return "Spark session reused" if reused else f"Spark start-up {seconds:.1f} s"


def _spark_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Spark's errors as one line (under :func:`friendly`): a query or path Spark refused
    (``AnalysisException``, ``ParseException``, …) as Spark's first line; a failure in
    Spark (a task, the Java side) as its cause, naming Spark's log file when there is one;
    ``SOW_DEBUG=1`` shows the traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from ..spark.session import (  # start-up time: the Spark pipeline
            error_line,
            keep_log,
            log_path,
        )

        try:
            return fn(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except Exception as exc:
            got = error_line(exc)
            if got is None or os.environ.get("SOW_DEBUG"):
                raise
            text, users = got
            if sys.stderr.isatty():
                sys.stderr.write("\r\x1b[K")  # off the line of Spark's progress bar
            if not users:
                where = log_path()
                if where:
                    keep_log()
                text += (f" (Spark's log: {where})" if where
                         else " (SOW_DEBUG=1 shows the traceback)")
            raise click.ClickException(one_line(text, redis_url())) from None

    return wrapper


def _spark_inputs(inputs: tuple[str, ...], fmt: str | None) -> list[str]:
    """The inputs of `spark load` / `resolve-chains`, checked before Spark starts."""
    from ..spark.load import check_inputs  # start-up time: the Spark pipeline

    try:
        check_inputs(list(inputs), fmt)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    return list(inputs)


def _spark_local_dir(path: str, what: str) -> None:
    """A folder Spark is to read, when on the local file system: it must be there."""
    from ..spark.load import local_path  # start-up time: the Spark pipeline

    local = local_path(path)
    if local is not None and not os.path.isdir(local):
        raise click.ClickException(f"{what} {path!r} is not a folder" if os.path.exists(local)
                                   else f"{what} not found: {path!r}")


_spark_input_options = [
    click.option("--format", "fmt", type=click.Choice(["json", "fix", "parquet"]),
                 help="Input format (default: from the file extensions)."),
    click.option("--order-by", help="Comma-separated columns / JSON fields giving the publish "
                 "order (default: input order)."),
]
"""What `spark load` and `spark resolve-chains` read their inputs with."""


@spark.command("load")
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.argument("inputs", nargs=-1, required=True)
@with_options(_spark_input_options)
@click.option("--load-id", help="Id of this load for exactly-once appends (default: from the "
              "inputs' names, sizes and times: the same files are never appended twice).")
@click.option("--batch-size", type=click.IntRange(min=1), default=5000, show_default=True,
              help="Log entries appended per atomic call.")
@click.option("--separator", help="FIX field separator of the input (default: the topic's), "
              "e.g. ';' or '|'.")
@click.option("--delta", is_flag=True, help="Each row is a delta_publish: merged into the "
              "stored record (as sow-redis delta-publish).")
@click.option("--delete", is_flag=True, help="Each row removes the record a publish of it "
              "would update (as sow-redis sow-delete --data); rows need only the key fields.")
@click.option("--durable", is_flag=True, help="Each batch returns only once a replica has "
              "it: a failover during the load loses nothing (needs a replica of every "
              "primary).")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.pass_context
@friendly
@_spark_errors
def spark_load(ctx: click.Context, topic: str, inputs: tuple[str, ...], fmt: str | None,
               order_by: str | None, load_id: str | None, batch_size: int,
               separator: str | None, delta: bool, delete: bool, durable: bool,
               master: str) -> None:
    """Load JSON Lines, Parquet or FIX log files (files, folders, globs) into a topic with
    Spark: keys computed by the publisher's code in the executors, appended to the partition
    logs exactly once, applied by the workers' path; bad rows go to the error stream. Rows
    are publishes, or with --delta delta publishes, with --delete deletes. On a Redis Cluster
    (redis+cluster://, rq's queues on --control-url) each Spark task writes to one primary
    only: the topic partitions whose slot it owns.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 spark load -t flights data/flights.jsonl
      sow-redis --redis-url redis://127.0.0.1:6390/0 spark load -t fix_orders --delta \\
          --format fix --separator ';' logs/orders.fix.txt
    """
    from ..spark.load import load  # start-up time: the Spark pipeline

    if delta and delete:
        raise click.UsageError("give at most one of --delta and --delete")
    cmd = "delta_publish" if delta else "sow_delete" if delete else "publish"
    sow = sow_of(ctx)
    t = sow.topic(topic)
    paths = _spark_inputs(inputs, fmt)
    if durable:
        check_durable(sow.r, sow.url)
    session = _spark_session(master)
    started = time.perf_counter()
    res = load(session, sow.url, t, paths, fmt,
               [c.strip() for c in order_by.split(",")] if order_by else None, load_id,
               batch_size, separator=fix_separator(separator) if separator else None, cmd=cmd,
               durable=durable)
    took = time.perf_counter() - started
    if res.chains is not None:
        click.echo(f"chains: {res.chains.ids} new identifier(s), {len(res.chains.conflicts)} "
                   f"conflict(s), pointer-jumping rounds per pass {res.chains.rounds}")
    what = {"publish": "", "delta_publish": " as delta publishes",
            "sow_delete": " as deletes"}[cmd]
    click.echo(f"loaded {res.rows} row(s) into {topic}{what}: appended {res.appended}, applied "
               f"{res.applied}, rejected {res.rejected} (in the error stream), skipped "
               f"{res.skipped}; {took:.1f} s, {res.rows / took if took else 0:,.0f} rows/s; "
               f"{_spark_start()}")


@spark.command("resolve-chains")
@click.option("-t", "--topic", required=True, help="SOW topic with the chaining key generator.")
@click.argument("inputs", nargs=-1, required=True)
@with_options(_spark_input_options)
@click.option("--separator", help="FIX field separator of the input (default: the topic's).")
@click.option("--dry-run", is_flag=True, help="Resolve and report; write nothing.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.pass_context
@friendly
@_spark_errors
def spark_resolve_chains(ctx: click.Context, topic: str, inputs: tuple[str, ...],
                         fmt: str | None, order_by: str | None, separator: str | None,
                         dry_run: bool, master: str) -> None:
    """Resolve every chaining identifier of the inputs to its chain head with pointer
    jumping (seeds/003), print the rounds and each message that would join two chains, and
    write the topic's chain table (spark load of a chaining topic does this first).

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 spark resolve-chains -t fix_orders \\
          --format fix --separator ';' logs/orders.fix.txt
    """
    from ..spark.chains import resolve_chains  # start-up time: the Spark pipeline

    sow = sow_of(ctx)
    t = sow.topic(topic)
    if not t.chaining:
        raise click.ClickException(f"topic {topic!r} has no chaining key generator")
    paths = _spark_inputs(inputs, fmt)
    session = _spark_session(master)
    started = time.perf_counter()
    res = resolve_chains(session, sow.url, t, paths, fmt,
                         [c.strip() for c in order_by.split(",")] if order_by else None,
                         fix_separator(separator) if separator else None, write=not dry_run)
    took = time.perf_counter() - started
    for c in res.conflicts:
        click.echo(f"conflict: partition {c['partition']}: a message with identifiers "
                   f"{', '.join(c['ids'])} resolve to {len(c['heads'])} chains (heads "
                   f"{', '.join(c['heads'])}); the workers reject it (two_chains)")
    click.echo(f"resolved {res.messages} message(s) of {topic}: {res.ids} new identifier(s) in "
               f"{res.chains} chain(s), {len(res.conflicts)} conflict(s); pointer-jumping "
               f"rounds per pass {res.rounds}; wrote {res.written} chain-table entr"
               f"{'y' if res.written == 1 else 'ies'}; {took:.1f} s; {_spark_start()}")


@spark.command("stream")
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.argument("directory")
@click.option("--checkpoint", help="Spark checkpoint folder (default: DIRECTORY/_sow_checkpoint"
              "_<topic>); keep it to resume where the query stopped.")
@click.option("--once", is_flag=True, help="Process the files there now, then stop.")
@click.option("--separator", help="FIX field separator of the input (default: the topic's).")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.pass_context
@friendly
@_spark_errors
def spark_stream(ctx: click.Context, topic: str, directory: str, checkpoint: str | None,
                 once: bool, separator: str | None, master: str) -> None:
    """Feed a topic from a folder of JSON Lines or FIX files with Spark Structured Streaming,
    exactly once (each micro-batch's id is recorded in Redis with the batch); prints one line
    per micro-batch; runs until Ctrl-C (or, with --once, until the folder is processed).

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 spark stream -t flights data/daily/
    """
    from ..spark.stream import stream  # start-up time: the Spark pipeline

    sow = sow_of(ctx)
    t = sow.topic(topic)
    _spark_local_dir(directory, "folder")
    session = _spark_session(master)
    cp = checkpoint or os.path.join(directory, f"_sow_checkpoint_{re.sub(r'[^A-Za-z0-9_]', '_', topic)}")
    click.echo(f"streaming {directory} into {topic} (checkpoint {cp}); {_spark_start()}")

    def progress(batch_id: int, res: LoadResult) -> None:
        click.echo(f"batch {batch_id}: {res.rows} row(s), appended {res.appended}, applied "
                   f"{res.applied}, rejected {res.rejected}, skipped {res.skipped}")

    query = stream(session, sow.url, t, directory, cp, once=once,
                   separator=fix_separator(separator) if separator else None, on_batch=progress)
    if not once:
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()


@spark.command("export")
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.argument("out")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.pass_context
@friendly
@_spark_errors
def spark_export(ctx: click.Context, topic: str, out: str, master: str) -> None:
    """Write a consistent snapshot of a topic to Parquet at OUT: record fields as columns,
    plus _sow_key, _sow_expiry_ms, _sow_partition, _sow_seq and _sow_cursor (the sequence and
    applied cursor each partition is consistent with) and the exact record (_sow_data,
    _sow_record_seq, _sow_stream_id) for 'spark rebuild'; one task per partition.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 spark export -t flights out/flights
    """
    from ..spark.snapshot import export  # start-up time: the Spark pipeline

    sow = sow_of(ctx)
    t = sow.topic(topic)
    session = _spark_session(master)
    n = export(session, sow.url, t, out)
    click.echo(f"exported {n} record(s) of {topic} to {out}; {_spark_start()}")


@spark.command("archive")
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.argument("out")
@click.option("--trim", is_flag=True, help="Then remove from each partition log the entries "
              "archived and already applied (never an unapplied one).")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.pass_context
@friendly
@_spark_errors
def spark_archive(ctx: click.Context, topic: str, out: str, trim: bool, master: str) -> None:
    """Write a topic's transaction log (OUT/log) and change feed (OUT/changes) to Parquet,
    one Spark task per partition; --trim then removes the archived, applied log entries.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 spark archive -t flights out/arch --trim
    """
    from ..spark.archive import archive  # start-up time: the Spark pipeline

    sow = sow_of(ctx)
    t = sow.topic(topic)
    session = _spark_session(master)
    res = archive(session, sow.url, t, out, trim)
    click.echo(f"archived {res.entries} log entr{'y' if res.entries == 1 else 'ies'} and "
               f"{res.changes} change(s) of {topic} to {out}"
               + (f"; trimmed {res.trimmed} applied entr{'y' if res.trimmed == 1 else 'ies'}"
                  if trim else "") + f"; {_spark_start()}")


@spark.command("rebuild")
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.option("--from", "snapshot", required=True, help="A 'spark export' folder.")
@click.option("--log", "archive_dir", help="A 'spark archive' folder: its log entries after "
              "the snapshot are applied (with the live log's).")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.pass_context
@friendly
@_spark_errors
def spark_rebuild(ctx: click.Context, topic: str, snapshot: str, archive_dir: str | None,
                  master: str) -> None:
    """Rebuild a topic's SOW from a snapshot (spark export) plus the archived and the live
    log entries after each partition's snapshot cursor, through the workers' apply path
    (each partition under its lease; stop the topic's workers first or they are waited for).

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 spark rebuild -t flights \\
          --from out/snap --log out/arch
    """
    from ..spark.archive import rebuild  # start-up time: the Spark pipeline

    sow = sow_of(ctx)
    t = sow.topic(topic)
    _spark_local_dir(snapshot, "snapshot")
    if archive_dir is not None:
        _spark_local_dir(archive_dir, "archive")
    session = _spark_session(master)
    try:
        res = rebuild(session, sow.url, t, snapshot, archive_dir)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"rebuilt {topic}: restored {res.restored} record(s) from {snapshot}, replayed "
               f"{res.archived} archived and {res.live} live log entr"
               f"{'y' if res.live == 1 else 'ies'} ({res.applied} applied); {res.records} "
               "record(s) now" + (f", {res.chain_ids} chain identifier(s) restored"
                                  if t.chaining else "") + f"; {_spark_start()}")


@spark.command("sql")
@click.argument("query")
@click.option("--out", help="Write the result here (.csv: CSV, else Parquet) instead of "
              "printing it.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
              help="Rows printed.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.pass_context
@friendly
@_spark_errors
def spark_sql(ctx: click.Context, query: str, out: str | None, limit: int, master: str) -> None:
    """Run a Spark SQL QUERY over snapshot views of the SOW topics (each topic a view named
    by its name, characters outside [A-Za-z0-9_] as _), e.g. an AMPS-like view. Only the
    topics the query names are read.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 spark sql \\
          "SELECT carrier, avg(dep_delay) FROM flights GROUP BY carrier ORDER BY 2 DESC"
    """
    from ..registry import load_topics  # start-up time: redis-py
    from ..spark.snapshot import sql  # start-up time: the Spark pipeline

    sow = sow_of(ctx)
    topics = list(load_topics(sow.r).values())
    session = _spark_session(master)
    try:
        df = sql(session, sow.url, topics, query)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if out:
        writer = df.write.mode("overwrite")
        (writer.option("header", True).csv(out) if out.endswith(".csv") else writer.parquet(out))
        click.echo(f"wrote the result to {out}; {_spark_start()}")
    else:
        rows = df.limit(limit).collect()
        for row in rows:
            sys.stdout.buffer.write(orjson.dumps(row.asDict(recursive=True)) + b"\n")
        sys.stdout.flush()
        # the rows are the output; the summary goes beside them
        click.echo(f"{len(rows)} row(s); {_spark_start()}", err=True)


@spark.command("shell")
@click.argument("script", required=False, type=click.File("r"))
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL of "
              "the one session every command runs on (a command's own --master is ignored).")
@click.pass_context
@friendly
@_spark_errors
def spark_shell(ctx: click.Context, script: TextIO | None, master: str) -> None:
    """Run several spark commands on one Spark session, started once: one command per line
    of SCRIPT (default: standard input; '-' too), written as after 'sow-redis spark', '#'
    starts a comment, 'exit' ends. A command that fails prints its one error line and the
    next one runs; the exit status is 1 when any failed. Each command's summary says
    'Spark session reused' where it would say its start-up time.

    \b
    Example:
      printf 'load -t flights data/day1.jsonl\nsql "SELECT count(*) FROM flights"\n' |
          sow-redis --redis-url redis://127.0.0.1:6390/0 spark shell --master spark://h:7077
    """
    source = script or sys.stdin
    interactive = script is None and sys.stdin.isatty()
    _spark_session(master)
    click.echo(f"spark shell: a session on {master}; {_spark_start()}")
    failed = 0
    while True:
        if interactive:
            click.echo("spark> ", nl=False)
        line = source.readline()
        if not line:
            break
        try:
            args = shlex.split(line, comments=True)
        except ValueError as exc:
            click.echo(f"Error: {exc}: {line.strip()}", err=True)
            failed += 1
            continue
        if args and args[0] == "spark":
            args = args[1:]  # "spark load …" as well as "load …"
        if not args:
            continue
        if args[0] in ("exit", "quit"):
            break
        if args[0] == "shell":
            click.echo("Error: already in a spark shell", err=True)
            failed += 1
            continue
        try:
            with spark.make_context("spark", args, parent=ctx.find_root()) as sub:
                spark.invoke(sub)
        except click.ClickException as exc:
            exc.show()
            failed += 1
        except click.exceptions.Exit as exc:  # --help
            failed += exc.exit_code != 0
        sys.stdout.flush()
    if failed:
        raise click.exceptions.Exit(1)
