"""``sow-redis``: the command line. Thin: it turns library errors into one-line messages."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import click
import orjson

from .errors import SowError
from .settings import DEFAULT_CONFIG_PATH, DEFAULT_REDIS_URL, Settings


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Report SowError and unreachable Redis as one line (exit 1) instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from redis.exceptions import ConnectionError as RedisConnectionError

        try:
            return fn(*args, **kwargs)
        except SowError as exc:
            raise click.ClickException(str(exc)) from None
        except RedisConnectionError as exc:
            url = click.get_current_context().obj["settings"].redis_url
            raise click.ClickException(f"cannot reach Redis at {url}: {exc}") from None

    return wrapper


def _sow(ctx: click.Context) -> Any:
    from .client import Sow

    return Sow(settings=ctx.obj["settings"])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--redis-url", envvar="SOW_REDIS_URL", default=DEFAULT_REDIS_URL, show_default=True,
              help="Redis to use (env SOW_REDIS_URL); memory:// runs in process.")
@click.option("--config", "config_path", envvar="SOW_REDIS_CONFIG", default=DEFAULT_CONFIG_PATH,
              show_default=True, help="Topic configuration TOML (env SOW_REDIS_CONFIG).")
@click.version_option(package_name="sow_redis")
@click.pass_context
def main(ctx: click.Context, redis_url: str, config_path: str) -> None:
    """sow_redis: a State of the World message database on Redis.

    \b
    Example (topics in sow.toml):
      export SOW_REDIS_URL=redis://127.0.0.1:6390/0
      sow-redis up --workers 2 --detach
      echo '{"orderId": 1, "price": 120}' | sow-redis publish -t orders --wait
      sow-redis sow -t orders -f "/price > 100"
      sow-redis down
    """
    ctx.obj = {"settings": Settings.from_env(redis_url=redis_url, config_path=config_path)}


# -- config -----------------------------------------------------------------------------
@main.group()
def config() -> None:
    """Topic definitions: validate a TOML file and store it in Redis."""


@config.command("apply")
@click.argument("file", required=False)
@click.pass_context
@_friendly
def config_apply(ctx: click.Context, file: str | None) -> None:
    """Validate FILE (default --config) and store its topics in Redis for every worker.

    Example: sow-redis config apply sow.toml
    """
    from .config import ConfigError, apply_topics, load_file

    path = file or ctx.obj["settings"].config_path
    try:
        topics = load_file(path)
    except ConfigError as exc:
        for line in exc.problems:
            click.echo(f"error: {line}", err=True)
        raise SystemExit(1) from None
    sow = _sow(ctx)
    version = apply_topics(sow.r, topics)
    click.echo(f"applied {len(topics)} topic(s) from {path}: "
               f"{', '.join(t.name for t in topics)} (registry version {version})")


@config.command("show")
@click.pass_context
@_friendly
def config_show(ctx: click.Context) -> None:
    """Print the topic definitions stored in Redis, one JSON object per line.

    Example: sow-redis config show
    """
    from .config import load_topics

    for t in sorted(load_topics(_sow(ctx).r).values(), key=lambda t: t.name):
        click.echo(t.to_json().decode())


# -- publish ----------------------------------------------------------------------------
def _lines(fh: BinaryIO) -> Iterator[bytes]:
    for line in fh:
        yield line.rstrip(b"\r\n")


def _separator(text: str | None) -> bytes | None:
    from .fix import separator

    if text is None:
        return None
    try:
        return separator(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--separator") from None


def _publish(ctx: click.Context, topic: str, file: str, cmd: str, sow_key: str | None,
             wait: bool, timeout: float, expiration: float | None,
             separator: str | None) -> None:
    from .publisher import PublishResult, append

    sow = _sow(ctx)
    t = sow.topic(topic)
    sep = _separator(separator)
    fh: BinaryIO
    if file == "-":
        fh, size = sys.stdin.buffer, 0
    else:
        try:
            fh = open(file, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise click.ClickException(f"cannot read {file}: {exc.strerror}") from None
        size = os.path.getsize(file)
    started = time.perf_counter()
    items = ((cmd, line, sow_key, expiration) for line in _lines(fh))
    show_bar = size > 0 and sys.stderr.isatty()
    result: PublishResult
    if show_bar:
        from rich.progress import Progress

        with Progress(transient=True) as progress:
            task = progress.add_task(f"publishing to {topic}", total=size)
            result = append(sow.r, t, items, fix_separator=sep,
                            on_chunk=lambda _n: progress.update(task, completed=fh.tell()))
    else:
        result = append(sow.r, t, items, fix_separator=sep)
    if fh is not sys.stdin.buffer:
        fh.close()
    sow._after_append(t, result.last_ids, wait, timeout)
    elapsed = time.perf_counter() - started
    for rej in result.rejected[:20]:
        click.echo(f"rejected line {rej.position}: {rej.reason}: {rej.detail}", err=True)
    if len(result.rejected) > 20:
        click.echo(f"… and {len(result.rejected) - 20} more rejected lines", err=True)
    reasons: dict[str, int] = {}
    for rej in result.rejected:
        reasons[rej.reason] = reasons.get(rej.reason, 0) + 1
    why = (" (" + ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items())) + ")") if reasons else ""
    rate = result.published / elapsed if elapsed > 0 else 0.0
    skipped = (f", skipped {result.skipped} (MsgType in skip_msg_types: "
               f"{','.join(t.skip_msg_types)})") if result.skipped else ""
    click.echo(f"published {result.published} message(s) to {topic}{skipped}, rejected "
               f"{len(result.rejected)}{why}; {elapsed:.2f} s, {rate:,.0f} msg/s"
               + (" (applied)" if wait or sow.memory else ""))


_publish_options = [
    click.option("-t", "--topic", required=True, help="SOW topic."),
    click.argument("file", default="-"),
    click.option("--sow-key", help="SOW key for topics without key fields (Base64 characters)."),
    click.option("--wait", is_flag=True, help="Return only after the workers applied everything."),
    click.option("--timeout", default=300.0, show_default=True, help="Seconds --wait waits."),
    click.option("--expiration", type=click.FloatRange(min=0),
                 help="Message lifetime in seconds (0 = never expire); overrides the topic's."),
    click.option("--separator", help="FIX topics: field separator of FILE (SOH, ';', '|'); "
                 "default: the topic's field_separator."),
]


def _with(options: list[Callable[..., Any]]) -> Callable[..., Any]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for opt in reversed(options):
            fn = opt(fn)
        return fn

    return deco


@main.command()
@_with(_publish_options)
@click.option("--delta", is_flag=True, help="delta_publish: merge into the stored record.")
@click.pass_context
@_friendly
def publish(ctx: click.Context, topic: str, file: str, sow_key: str | None, wait: bool,
            timeout: float, expiration: float | None, separator: str | None,
            delta: bool) -> None:
    """Publish JSON Lines from FILE (or - for stdin): one message per line.

    Each message replaces the whole record of its SOW key; with --delta it is merged.
    A line may be an envelope with per-message options:
    {"$sow": {"expiration": 30, "sow_key": "QUJD"}, "data": {...}}.
    On a FIX topic a line is a FIX message (a log prefix before 8=FIX is skipped).

    Example: sow-redis publish -t orders orders.jsonl --wait
    """
    _publish(ctx, topic, file, "delta_publish" if delta else "publish", sow_key, wait, timeout,
             expiration, separator)


@main.command("delta-publish")
@_with(_publish_options)
@click.pass_context
@_friendly
def delta_publish(ctx: click.Context, topic: str, file: str, sow_key: str | None, wait: bool,
                  timeout: float, expiration: float | None, separator: str | None) -> None:
    """delta_publish JSON Lines: fields in each update replace those fields of the stored
    record, nested objects merge, other fields stay (same as publish --delta).

    Example: echo '{"orderId": 1, "price": 95}' | sow-redis delta-publish -t orders
    """
    _publish(ctx, topic, file, "delta_publish", sow_key, wait, timeout, expiration, separator)


# -- query ------------------------------------------------------------------------------
def _split_keys(keys: str | None) -> list[str] | None:
    return [k for k in keys.split(",") if k] if keys else None


@main.command()
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.option("-f", "--filter", "filter_", help="AMPS content filter, e.g. \"/price > 100\".")
@click.option("--top-n", type=click.IntRange(min=0), help="Return at most N records.")
@click.option("--order-by", help="e.g. \"/price DESC, /orderId\".")
@click.option("--keys", help="Only these SOW keys (comma-separated).")
@click.option("--with-key", is_flag=True, help="Print {\"sow_key\":…, \"data\":…} per record.")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "table", "fix"]), default="jsonl",
              show_default=True, help="fix: tag=value fields, one record per line.")
@click.option("--separator", help="With --format fix: field separator (default: the topic's).")
@click.pass_context
@_friendly
def sow(ctx: click.Context, topic: str, filter_: str | None, top_n: int | None,
        order_by: str | None, keys: str | None, with_key: bool, fmt: str,
        separator: str | None) -> None:
    """Query the SOW of a topic: one JSON record per line.

    Example: sow-redis sow -t flights -f "/carrier = 'UA' AND /dep_delay > 60" --top-n 5
    """
    client = _sow(ctx)
    records = client.sow(topic, filter_, _split_keys(keys), top_n, order_by)
    if fmt == "table":
        _print_table(topic, records, with_key)
        return
    out = sys.stdout.buffer
    if fmt == "fix":
        from .fix import encode

        sep = _separator(separator) or client.topic(topic).field_separator.encode()
        for rec in records:
            out.write((rec.sow_key.encode() + b" " if with_key else b"")
                      + encode(rec.obj(), sep) + b"\n")
        out.flush()
        return
    for rec in records:
        if with_key:
            out.write(b'{"sow_key":"%s","seq":%d,"expiry_ms":%d,"data":%s}\n'
                      % (rec.sow_key.encode(), rec.seq, rec.expiry_ms, rec.data))
        else:
            out.write(rec.data + b"\n")
    out.flush()


def _print_table(topic: str, records: list[Any], with_key: bool) -> None:
    from rich.console import Console
    from rich.table import Table

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
    Console().print(table)


@main.command("sow-delete")
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.option("-f", "--filter", "filter_", help="Delete records matching (1=1: all).")
@click.option("--keys", help="Delete these SOW keys (comma-separated).")
@click.option("--data", help="Delete the record a publish of this JSON would update.")
@click.option("--sow-key", help="With --data on topics without key fields.")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for workers.")
@click.pass_context
@_friendly
def sow_delete(ctx: click.Context, topic: str, filter_: str | None, keys: str | None,
               data: str | None, sow_key: str | None, timeout: float) -> None:
    """Remove records by filter, by SOW keys or by message data; prints how many.

    Example: sow-redis sow-delete -t orders -f "/status = 'filled'"
    """
    if sum(x is not None for x in (filter_, keys, data)) != 1:
        raise click.UsageError("give exactly one of --filter, --keys or --data")
    n = _sow(ctx).sow_delete(topic, filter=filter_, keys=_split_keys(keys),
                             data=data.encode() if data is not None else None,
                             sow_key=sow_key, timeout=timeout)
    click.echo(f"removed {n} record(s) from {topic}")


@main.command()
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.option("-f", "--filter", "filter_", help="Only events whose record matches.")
@click.option("--count", type=int, help="Exit after this many events.")
@click.option("--timeout", type=float, help="Exit after this many seconds without an event.")
@click.pass_context
@_friendly
def subscribe(ctx: click.Context, topic: str, filter_: str | None, count: int | None,
              timeout: float | None) -> None:
    """Print live change events of a topic as JSON Lines (Redis pub/sub channel sow:TOPIC).

    Example: sow-redis subscribe -t orders -f "/price > 100"
    """
    n = 0
    with _sow(ctx).subscribe(topic, filter_) as sub:
        while count is None or n < count:
            ev = sub.get(timeout=timeout if timeout is not None else 3600.0)
            if ev is None:
                if timeout is not None:
                    break
                continue
            sys.stdout.buffer.write(orjson.dumps(ev) + b"\n")
            sys.stdout.flush()
            n += 1


@main.command()
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.option("--count", default=100, show_default=True, help="Newest N entries.")
@click.pass_context
@_friendly
def errors(ctx: click.Context, topic: str, count: int) -> None:
    """List messages the workers could not apply (the topic's error stream), with reasons.

    Example: sow-redis errors -t orders
    """
    for e in _sow(ctx).errors(topic, count):
        sys.stdout.buffer.write(orjson.dumps(e) + b"\n")


def _each_topic(ctx: click.Context, report: Callable[[Any, Any], dict[str, Any]]) -> None:
    """Print ``report(redis, topic)`` as one JSON line per registered topic, by name."""
    from .config import load_topics

    sow = _sow(ctx)
    for t in sorted(load_topics(sow.r).values(), key=lambda t: t.name):
        click.echo(orjson.dumps(report(sow.r, t)).decode())


@main.command()
@click.pass_context
@_friendly
def status(ctx: click.Context) -> None:
    """Per topic and partition: records, log length, entries waiting to be applied.

    Example: sow-redis status
    """
    from .status import topic_status

    _each_topic(ctx, topic_status)


@main.command()
@click.pass_context
@_friendly
def stats(ctx: click.Context) -> None:
    """Per topic: records, records with an expiry, the next due time, expiration settings.

    Example: sow-redis stats
    """
    from .status import expiry_stats

    _each_topic(ctx, expiry_stats)


@main.command()
@click.option("-t", "--topic", required=True, help="A topic with the chaining key generator.")
@click.option("--id", "ident", help="Show the chain of this identifier (e.g. a ClOrdID).")
@click.pass_context
@_friendly
def chains(ctx: click.Context, topic: str, ident: str | None) -> None:
    """Chaining key generator state: identifiers in chains and, with validation on, the
    chains that would have been one had messages arrived in another order.

    Example: sow-redis chains -t orders --id ORD-1
    """
    from .chaining import chain_of, chain_stats, conflict_groups

    sow = _sow(ctx)
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


# -- processes --------------------------------------------------------------------------
@main.command()
@click.option("--burst", is_flag=True, help="Drain every partition, then exit.")
@click.option("--name", help="Worker name shown in rq-dashboard.")
@click.pass_context
@_friendly
def worker(ctx: click.Context, burst: bool, name: str | None) -> None:
    """Run a worker: applies the transaction logs (rq worker on queue 'sow').

    Run as many as the load needs, on any host. Example: sow-redis worker --burst
    """
    from .worker import run_worker

    run_worker(ctx.obj["settings"], burst=burst, name=name)


@main.command()
@click.option("--burst", is_flag=True, help="Expire what is due now, then exit.")
@click.option("-t", "--topic", "topics", multiple=True,
              help="Serve only this topic (repeatable; default: every topic).")
@click.pass_context
@_friendly
def expirer(ctx: click.Context, burst: bool, topics: tuple[str, ...]) -> None:
    """Run the expirer: removes due records (event reason "expired"), forwards dead letters,
    removes idle topics. Any number may run at once; `up` starts one.

    Example: sow-redis expirer
    """
    from .expirer import run_expirer

    n = run_expirer(ctx.obj["settings"], burst=burst, topics=topics or None)
    if burst:
        click.echo(f"expired {n} record(s)")


@main.command()
@click.option("--workers", default=2, show_default=True, help="Worker processes to run.")
@click.option("--data-dir", default=".sow-redis", show_default=True,
              help="Folder for the redis-server started here (AOF files, log), the pidfile "
              "up.pid and, with --detach, the log up.log.")
@click.option("--no-config", is_flag=True, help="Do not apply --config at start.")
@click.option("--detach", is_flag=True,
              help="Run in the background; return once Redis answers, the config is applied "
              "and the workers are idle (exit 1 with the reason otherwise). "
              "`sow-redis down` stops it.")
@click.option("--wait-ready", type=click.FloatRange(min=0), metavar="SECONDS",
              help="With --detach: seconds to wait until ready (default 60).")
@click.pass_context
@_friendly
def up(ctx: click.Context, workers: int, data_dir: str, no_config: bool, detach: bool,
       wait_ready: float | None) -> None:
    """Start a local redis-server (if none answers at --redis-url), apply --config, run
    N workers and the expirer; Ctrl-C (or `sow-redis down`) stops them all cleanly.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 up --workers 2 --detach
      sow-redis --redis-url redis://127.0.0.1:6390/0 down
    """
    from .server import READY_TIMEOUT_S, run_up, start_detached

    if wait_ready is not None and not detach:
        raise click.UsageError("--wait-ready needs --detach")
    if detach:
        click.echo(start_detached(ctx.obj["settings"], workers, data_dir,
                                  apply_config=not no_config,
                                  timeout_s=READY_TIMEOUT_S if wait_ready is None
                                  else wait_ready))
        return
    run_up(ctx.obj["settings"], workers, data_dir, apply_config=not no_config)


@main.command()
@click.option("--data-dir", default=".sow-redis", show_default=True,
              help="The --data-dir of the `up` to stop.")
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds to wait for it to stop.")
@click.pass_context
@_friendly
def down(ctx: click.Context, data_dir: str, timeout: float) -> None:
    """Stop the `sow-redis up` of --data-dir (detached or not; it must serve --redis-url):
    its workers finish their current job, the redis-server it started flushes its AOF and
    exits. Exit status 0 also when none runs; 1 when it did not stop within --timeout.

    Example: sow-redis --redis-url redis://127.0.0.1:6390/0 down
    """
    from .server import stop_detached

    _stopped, report = stop_detached(ctx.obj["settings"], data_dir, timeout)
    click.echo(report)


@main.command()
@click.option("--port", default=9181, show_default=True, help="HTTP port.")
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="Address to listen on; 0.0.0.0 = every interface (then set a user and "
              "password: rq-dashboard shows and deletes jobs).")
@click.option("--username", envvar="SOW_DASHBOARD_USERNAME",
              help="HTTP basic auth user (env SOW_DASHBOARD_USERNAME); default: no auth.")
@click.option("--password", envvar="SOW_DASHBOARD_PASSWORD",
              help="HTTP basic auth password; prefer env SOW_DASHBOARD_PASSWORD, which other "
              "users cannot read in the process list.")
@click.pass_context
@_friendly
def dashboard(ctx: click.Context, port: int, bind: str, username: str | None,
              password: str | None) -> None:
    """Run rq-dashboard on this Redis to watch workers, the 'sow' queue and jobs; it
    listens on 127.0.0.1 unless --bind says otherwise.

    \b
    Example (then open http://127.0.0.1:9181/):
      sow-redis --redis-url redis://127.0.0.1:6390/0 dashboard --port 9181
    """
    from redis import Redis

    url = ctx.obj["settings"].redis_url
    if url.startswith("memory://"):
        raise click.ClickException("dashboard needs a redis:// URL; memory:// runs inside "
                                   "each process")
    if bool(username) != bool(password):
        raise click.UsageError("give both --username and --password (or neither)")
    try:
        import rq_dashboard.cli  # noqa: F401 - fail here, in one line, not in the child
    except ImportError as exc:
        raise click.ClickException(f"rq-dashboard cannot start: {exc} "
                                   "(reinstall: pip install -e .)") from None
    Redis.from_url(url, socket_connect_timeout=2.0).ping()
    env = dict(os.environ)
    if username:
        # handed over in the environment, not argv, so `ps` does not show the password
        env.update(RQ_DASHBOARD_USERNAME=username, RQ_DASHBOARD_PASSWORD=password or "")
    elif bind not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: rq-dashboard on {bind} without --username/--password: anyone "
                   "who reaches this port can see and delete jobs", err=True)
    host = f"[{bind}]" if ":" in bind else bind
    click.echo(f"rq-dashboard on http://{host}:{port}/ for {url}"
               + (f" (basic auth, user {username})" if username else "")
               + "; Ctrl-C stops it", err=True)
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "rq_dashboard", "--bind", bind,
                               "--port", str(port), "--redis-url", url], env)


if __name__ == "__main__":
    main()
