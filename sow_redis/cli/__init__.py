"""``sow-redis``: the command line. Thin: it turns library errors into one-line messages."""

from __future__ import annotations

import functools
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO, NoReturn

import click
import orjson

from ..connection import Client, check_url, control_url_for, is_memory, redact, tls_options
from ..errors import BadURLError, ControlURLError, SowError
from ..settings import DEFAULT_CONFIG_PATH, DEFAULT_REDIS_URL, Settings


def _one_line(text: str, url: str) -> str:
    """One line of error text with any password of ``url`` masked."""
    from urllib.parse import urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        text = text.replace(password, "***")
    return " ".join(text.split())


EXIT_PIPE = 141
"""Exit status when the reader of standard output went away (``sow-redis sow … | head``):
128 + SIGPIPE, what a shell reports for a Unix tool that SIGPIPE ended."""

EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT), for commands that were cut short; the commands
that run until stopped (``subscribe``, ``stats --watch``, …) end with 0 instead."""


def _broken_pipe() -> NoReturn:
    """End quietly, as ``head`` expects of a writer: nothing more goes to standard output
    (it is pointed at /dev/null so that the interpreter's last flush fails no more), exit
    status :data:`EXIT_PIPE`."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    raise SystemExit(EXIT_PIPE)


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn every error of a command into one line on stderr and exit status 1 (click's own
    usage errors keep status 2): SowError as its message, Redis failures by kind, anything
    else as an internal error (``SOW_DEBUG=1`` shows the traceback). A closed standard
    output (``| head``) ends the command quietly with :data:`EXIT_PIPE` (Ctrl-C: see
    :class:`_Main`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from redis import exceptions as rx

        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            _broken_pipe()
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except SowError as exc:
            raise click.ClickException(_one_line(str(exc), _url())) from None
        except Exception as exc:
            if os.environ.get("SOW_DEBUG"):
                raise
            url = _url()
            where, msg = redact(url), _one_line(str(exc), url)
            if isinstance(exc, rx.AuthenticationError):
                text = f"authentication failed at {where}: {msg}"
            elif isinstance(exc, (rx.ConnectionError, rx.TimeoutError)):
                text = f"cannot reach Redis at {where}: {msg}"
            elif isinstance(exc, rx.InvalidResponse):
                text = f"{where} does not answer as a Redis server ({msg})"
            elif isinstance(exc, rx.RedisError):
                text = f"Redis at {where} refused: {msg}"
            else:
                text = (f"internal error: {type(exc).__name__}: {msg} "
                        "(SOW_DEBUG=1 shows the traceback)")
            raise click.ClickException(text) from None

    return wrapper


def _url() -> str:
    ctx = click.get_current_context(silent=True)
    return ctx.find_root().obj["settings"].redis_url if ctx and ctx.find_root().obj else ""


def _settings(ctx: click.Context) -> Settings:
    """The settings of a command that talks to Redis, with its URL checked
    (:func:`sow_redis.connection.check_url`; nothing is sent).

    Raises:
        click.ClickException: a URL sow-redis cannot use, or ``memory://`` (each command is a
            process of its own, so an in-process store would be empty for the next one).
    """
    settings: Settings = ctx.find_root().obj["settings"]
    url = settings.redis_url
    if is_memory(url):
        raise click.ClickException(
            "memory:// keeps the SOW inside one process, and every sow-redis command is a new "
            "process: run 'sow-redis up' for a local redis-server, or use the Python API "
            "Sow('memory://')")
    try:
        check_url(url)
    except BadURLError as exc:
        raise click.ClickException(f"invalid --redis-url {exc.url!r}: {exc.reason}") from None
    try:
        control_url_for(url, settings.control_url)
    except BadURLError as exc:
        raise click.ClickException(f"invalid --control-url {exc.url!r}: {exc.reason}") from None
    except ControlURLError as exc:
        raise click.ClickException(str(exc)) from None
    return settings


def _sow(ctx: click.Context) -> Any:
    """A :class:`~sow_redis.client.Sow` in workers mode (``sow-redis worker`` applies)."""
    from ..client import Sow

    return Sow(settings=_settings(ctx), inline=False)


RUN_UNTIL_STOPPED = frozenset({"subscribe", "sow-and-subscribe", "metrics", "stats --watch"})
"""Commands that run until Ctrl-C or SIGTERM stops them: that is how they end, status 0."""


class _Main(click.Group):
    """The ``sow-redis`` group: Ctrl-C, wherever it comes (also while a command starts),
    ends a command that runs until stopped (:data:`RUN_UNTIL_STOPPED`) with status 0, and
    any other with ``interrupted`` and :data:`EXIT_INTERRUPTED` (click would print
    ``Aborted!`` and exit 1); a closed standard output as :func:`_broken_pipe`."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _broken_pipe()
        except KeyboardInterrupt:
            name = ctx.invoked_subcommand or ""
            if name == "stats" and "--watch" in sys.argv:
                name = "stats --watch"
            if name in RUN_UNTIL_STOPPED:
                raise SystemExit(0) from None
            click.echo("interrupted", err=True)
            raise SystemExit(EXIT_INTERRUPTED) from None


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--redis-url", envvar="SOW_REDIS_URL", default=DEFAULT_REDIS_URL, show_default=True,
              help="Redis to use: redis://, rediss://, unix:// or redis+cluster://host:port "
              "(any node of a Redis Cluster) (env SOW_REDIS_URL).")
@click.option("--control-url", envvar="SOW_CONTROL_URL", default=None,
              help="Plain Redis for rq's queues and workers (env SOW_CONTROL_URL; default: "
              "--redis-url; required with a Redis Cluster, where rq cannot run).")
@click.option("--config", "config_path", envvar="SOW_REDIS_CONFIG", default=DEFAULT_CONFIG_PATH,
              show_default=True, help="Topic configuration TOML (env SOW_REDIS_CONFIG).")
@click.option("--log-json", is_flag=True, envvar="SOW_LOG_JSON",
              help="Logs as JSON, one object per line (env SOW_LOG_JSON=1).")
@click.option("--log-level", envvar="SOW_LOG_LEVEL", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Least level logged (env SOW_LOG_LEVEL; DEBUG shows every lease).")
@click.version_option(package_name="sow_redis")
@click.pass_context
def main(ctx: click.Context, redis_url: str, control_url: str | None, config_path: str,
         log_json: bool, log_level: str) -> None:
    """sow_redis: a State of the World message database on Redis.

    \b
    Example (topics in sow.toml):
      export SOW_REDIS_URL=redis://127.0.0.1:6390/0
      sow-redis up --workers 2 --detach
      echo '{"orderId": 1, "price": 120}' | sow-redis publish -t orders --wait
      sow-redis sow -t orders -f "/price > 100"
      sow-redis down
    """
    from ..logs import setup

    setup(json=log_json, level=log_level)
    ctx.obj = {"settings": Settings.from_env(redis_url=redis_url, config_path=config_path,
                                             control_url=control_url or None)}


# -- config -----------------------------------------------------------------------------
@main.group()
def config() -> None:
    """Topic definitions: validate a TOML file and store it in Redis, print what is stored,
    translate an AMPS configuration.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 config apply sow.toml
      sow-redis --redis-url redis://127.0.0.1:6390/0 config show > stored.toml
    """


@config.command("apply")
@click.argument("file", required=False)
@click.option("--migrate", is_flag=True,
              help="Move the records of topics whose shape changes (partitions, key, "
                   "key_domain, key_generator, message_type, partition_by).")
@click.pass_context
@_friendly
def config_apply(ctx: click.Context, file: str | None, migrate: bool) -> None:
    """Validate FILE (default --config) and store its topics in Redis for every worker.

    A change of a topic's shape (partitions, key, key_domain, key_generator, message_type,
    partition_by) is refused while the topic holds records or queued messages; with
    --migrate the logs are applied first, then the records are moved (re-keyed and
    re-partitioned) under the new definition. Workers are held off meanwhile.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 config apply sow.toml
    """
    from ..config import ConfigError, load_file
    from ..registry import apply_topics

    path = file or ctx.obj["settings"].config_path
    try:
        topics = load_file(path)
        sow = _sow(ctx)
        if migrate:
            from ..ops.migrate import apply_with_migration

            version, done = apply_with_migration(sow.r, topics, sow.settings, path)
        else:
            version, done = apply_topics(sow.r, topics, path), []
    except ConfigError as exc:
        for line in exc.problems:
            click.echo(f"error: {line}", err=True)
        raise SystemExit(1) from None
    for m in done:
        click.echo(m.summary())
    click.echo(f"applied {len(topics)} topic(s) from {path}: "
               f"{', '.join(t.name for t in topics)} (registry version {version})")


@config.command("import-amps")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the TOML here (default: standard output).")
@_friendly
def config_import_amps(file: str, output: str | None) -> None:
    """Translate the <SOW><Topic> sections of an AMPS configuration FILE into sow_redis TOML
    (Name, Key, KeyDomain, Expiration, MessageType, HashIndex, the chaining KeyGenerator with
    its Key, Primary, Secondary and Validation options);
    each element that is not translated is listed on stderr, one line each.

    \b
    Example:
      sow-redis config import-amps amps-config.xml -o sow.toml
    """
    from ..config import ConfigError, parse_topics
    from ..ops.amps_import import import_amps, to_toml

    try:
        with open(file, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"{file}: cannot read: {exc}") from None
    try:
        imported = import_amps(text)
    except ConfigError as exc:
        raise click.ClickException(f"{file}: {'; '.join(exc.problems)}") from None
    for line in imported.skipped:
        click.echo(f"{file}: {line}", err=True)
    if not imported.topics:
        raise click.ClickException(f"{file}: no SOW topic could be translated")
    toml_text = to_toml(imported, file)
    parse_topics(toml_text, source=f"{file} (imported)")  # what is written loads as it is
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(toml_text)
        click.echo(f"wrote {len(imported.topics)} topic(s) to {output}", err=True)
    else:
        click.echo(toml_text, nl=False)


@config.command("show")
@click.pass_context
@_friendly
@click.option("--json", "as_json", is_flag=True, help="One JSON object per topic and line "
              "(every field, as stored) instead of TOML.")
def config_show(ctx: click.Context, as_json: bool) -> None:
    """Print the topic definitions stored in Redis as a TOML configuration that
    `config apply` accepts (fields at their default left out), by topic name.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 config show > sow.toml
    """
    from ..config import to_toml
    from ..registry import load_topics

    topics = sorted(load_topics(_sow(ctx).r).values(), key=lambda t: t.name)
    if as_json:
        for t in topics:
            click.echo(t.to_json().decode())
    elif topics:
        click.echo(to_toml(topics), nl=False)


# -- publish ----------------------------------------------------------------------------
LINE_SLACK = 65_536
"""Bytes a publish line may hold beyond the topic's ``max_message_bytes`` (an envelope's
``$sow`` options). A longer line is never held in memory whole: see :func:`_lines`."""


OVERLONG = b"\x00"
"""What :func:`_lines` gives in place of an over-long line: no JSON, FIX or envelope text,
so the publisher rejects it, and :func:`_publish` reports it as ``too_large``."""


def _lines(fh: BinaryIO, limit: int, overlong: dict[int, int]) -> Iterator[bytes]:
    """The lines of ``fh`` without their line break. A line longer than ``limit`` bytes is
    never held whole: it is read past in 1 MiB chunks, given as :data:`OVERLONG`, and its
    1-based number and size in bytes are put in ``overlong``."""
    n = 0
    while line := fh.readline(limit + 1):
        n += 1
        if len(line) > limit and not line.endswith(b"\n"):
            size = len(line)
            while (rest := fh.readline(1 << 20)) and not rest.endswith(b"\n"):
                size += len(rest)
            overlong[n] = size + len(rest.rstrip(b"\r\n"))
            yield OVERLONG
        else:
            yield line.rstrip(b"\r\n")


def _separator(text: str | None) -> bytes | None:
    from ..model.fix import separator

    if text is None:
        return None
    try:
        return separator(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--separator") from None


EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_REJECTED, EXIT_TIMEOUT, EXIT_REFUSED = 0, 1, 2, 3, 4, 5
"""``publish`` exit status: every line published (or skipped); an error (unknown topic,
unreadable file, a --sow-key the topic cannot take, --durable without a replica, every line
rejected: nothing published; Redis unreachable); a usage error (click); some lines rejected,
the others published; ``--wait`` timed out (the published messages are in the log and will
be applied; takes precedence over 3); Redis refused the rest after some were published (out
of memory, read-only: the counts say what was appended). Ctrl-C: :data:`EXIT_INTERRUPTED`."""

SAMPLES = 5
"""Rejected lines shown one by one after the per-reason counts."""


def _check_sow_key_option(t: Any, sow_key: str | None) -> None:
    """Refuse a --sow-key the topic cannot take (:func:`messages.check_supplied_key`), before
    anything is read or published."""
    from ..errors import MessageError
    from ..model.messages import check_supplied_key

    if sow_key is None:
        return
    try:
        check_supplied_key(t, sow_key)
    except MessageError as exc:
        raise click.ClickException(f"--sow-key: {exc.detail}") from None


def _samples(rejected: list[Any], n: int) -> list[Any]:
    """Up to ``n`` rejected lines in line order: the first of each reason, then the earliest."""
    first: dict[str, Any] = {}
    for rej in rejected:
        first.setdefault(rej.reason, rej)
    chosen = {id(x): x for x in list(first.values())[:n]}
    for rej in rejected:
        if len(chosen) >= n:
            break
        chosen.setdefault(id(rej), rej)
    return sorted(chosen.values(), key=lambda x: x.position)


def _report_rejected(rejected: list[Any]) -> dict[str, int]:
    """Print (stderr) the rejected lines' counts by reason, then a few sample lines.

    Returns:
        reason → count (the counts add up to ``len(rejected)``).
    """
    reasons: dict[str, int] = {}
    for rej in rejected:
        reasons[rej.reason] = reasons.get(rej.reason, 0) + 1
    if not rejected:
        return reasons
    width = max(len("reason"), *(len(k) for k in reasons))
    click.echo(f"rejected {len(rejected)} line(s):", err=True)
    click.echo(f"  {'reason':<{width}}  {'count':>7}", err=True)
    for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        click.echo(f"  {reason:<{width}}  {n:>7}", err=True)
    shown = _samples(rejected, SAMPLES)
    for rej in shown:
        click.echo(f"rejected line {rej.position}: {rej.reason}: {rej.detail}", err=True)
    if len(rejected) > len(shown):
        click.echo(f"… and {len(rejected) - len(shown)} more rejected line(s)", err=True)
    return reasons


STREAM_FLUSH_S = 0.2
"""Longest time in seconds a line read from a pipe or terminal waits before it is published
(``tail -f log | sow-redis publish -t T -``): what has arrived by then is sent."""

STREAM_MAX_LINES = 50_000
"""Most lines from a pipe published in one :func:`~sow_redis.publish.append.append` call (a fast
pipe is published in blocks of at most this many lines or :data:`STREAM_FLUSH_S`)."""


class _Interrupt:
    """Ctrl-C while ``publish`` reads its input: the first SIGINT only sets :attr:`hit`, so
    reading stops at the next line and what was read is still sent and counted; a second
    one raises KeyboardInterrupt (as :meth:`hard` does for the first one once reading is
    over). Restores the previous handler on exit."""

    def __init__(self) -> None:
        self.hit = False
        self._hard = False

    def _handler(self, *_a: object) -> None:
        if self.hit or self._hard:
            raise KeyboardInterrupt
        self.hit = True

    def hard(self) -> None:
        """From now on Ctrl-C raises KeyboardInterrupt at once."""
        self._hard = True

    def __enter__(self) -> _Interrupt:
        import signal
        import threading

        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _is_stream(fh: BinaryIO) -> bool:
    """Whether ``fh`` is a pipe, socket or terminal (lines arrive over time), not a file."""
    import stat

    try:
        return not stat.S_ISREG(os.fstat(fh.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False  # no file descriptor (a test's BytesIO): read as a file


def _stream_blocks(fd: int, limit: int, overlong: dict[int, int], stop: _Interrupt,
                   flush_s: float = STREAM_FLUSH_S,
                   max_lines: int = STREAM_MAX_LINES) -> Iterator[list[bytes]]:
    """The lines arriving on ``fd`` (a pipe), in blocks: a block is given once
    ``flush_s`` seconds have passed since its first line arrived, at ``max_lines`` lines, or
    at end of input, so a slow stream is published as it comes. Lines as :func:`_lines`
    gives them (an over-long one as :data:`OVERLONG`, noted in ``overlong``). Stops at
    end of input or when ``stop.hit`` (checked at least every ``flush_s`` seconds)."""
    import select

    buf = bytearray()
    block: list[bytes] = []
    n = 0
    skipping = -1  # bytes of an over-long line read past so far, -1: none
    deadline = 0.0
    eof = False
    while True:
        if stop.hit:  # Ctrl-C: send the lines taken so far, nothing more
            if block:
                yield block
            return
        while True:  # complete lines out of buf
            nl = buf.find(b"\n")
            if skipping >= 0:
                if nl < 0:
                    skipping += len(buf)
                    buf.clear()
                    break
                n += 1
                overlong[n] = skipping + len(buf[:nl].rstrip(b"\r"))
                block.append(OVERLONG)
                skipping = -1
            elif nl < 0:
                if len(buf) > limit:
                    skipping = len(buf)
                    buf.clear()
                break
            elif nl > limit:
                n += 1
                overlong[n] = len(buf[:nl].rstrip(b"\r"))
                block.append(OVERLONG)
            else:
                n += 1
                block.append(bytes(buf[:nl]).rstrip(b"\r"))
            del buf[:nl + 1]
            if len(block) == 1:
                deadline = time.monotonic() + flush_s
        if eof:
            if skipping >= 0:
                n += 1
                overlong[n] = skipping + len(buf)
                block.append(OVERLONG)
            elif buf:
                block.append(bytes(buf).rstrip(b"\r"))
            if block:
                yield block
            return
        now = time.monotonic()
        if block and (len(block) >= max_lines or now >= deadline):
            yield block
            block = []
            continue
        wait = min(flush_s, deadline - now) if block else flush_s
        readable, _w, _x = select.select([fd], [], [], max(0.0, wait))
        if readable:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                buf += chunk
            else:
                eof = True


_SEPARATORS = {b"\x01": "SOH", b";": "';'", b"|": "'|'", b"^": "'^'", b",": "','"}
"""FIX field separators :func:`_fix_hint` recognises, as ``--separator`` takes them."""


def _fix_hint(sample: list[bytes], sep: bytes) -> str | None:
    """A hint for FIX lines rejected as ``bad_fix``: the separator ``sample`` lines seem to
    use (the character most often before ``<tag>=``), when it is not ``sep``."""
    counts = dict.fromkeys(_SEPARATORS, 0)
    for line in sample:
        for m in re.finditer(rb"(\D)\d{1,5}=", line):
            if m.group(1) in counts:
                counts[m.group(1)] += 1
    found = max(counts, key=lambda k: counts[k])
    if counts[found] < 2 or found == sep:
        return None
    used = _SEPARATORS.get(sep, repr(sep.decode(errors="replace")))
    return (f"hint: the lines look separated by {_SEPARATORS[found]}, not by {used}: "
            f"try --separator {_SEPARATORS[found]}")


def _rest_of(fh: BinaryIO) -> int | None:
    """Lines left unread in the file ``fh`` (counted now); None for a stream."""
    if _is_stream(fh) or not fh.seekable():
        return None
    n, last = 0, b"\n"
    while chunk := fh.read(1 << 20):
        n += chunk.count(b"\n")
        last = chunk[-1:]
    return n + (last != b"\n")


def _check_durable(r: Client, url: str) -> None:
    """--durable: refuse at once, before anything is sent, when a primary has no replica
    (WAIT 1 would only time out, each chunk after it was stored)."""
    from ..connection import primaries_without_replica

    lonely = primaries_without_replica(r)
    if lonely:
        where = (f"the server at {redact(url)} has" if lonely == ["the server"]
                 else f"primar{'y' if len(lonely) == 1 else 'ies'} {', '.join(lonely)} "
                      f"of {redact(url)} {'has' if len(lonely) == 1 else 'have'}")
        raise click.ClickException(
            f"--durable needs a replica, and {where} none (INFO replication: "
            "connected_slaves:0): nothing was published; publish without --durable or add a "
            "replica")


def _publish(ctx: click.Context, topic: str, file: str, cmd: str, sow_key: str | None,
             wait: bool, timeout: float, expiration: float | None,
             separator: str | None, retry_s: float = 0.0, durable: bool = False) -> None:
    with _Interrupt() as stop:
        _publish_until(ctx, stop, topic, file, cmd, sow_key, wait, timeout, expiration,
                       separator, retry_s, durable)


def _publish_until(ctx: click.Context, stop: _Interrupt, topic: str, file: str, cmd: str,
                   sow_key: str | None, wait: bool, timeout: float, expiration: float | None,
                   separator: str | None, retry_s: float = 0.0, durable: bool = False) -> None:
    """:func:`_publish` (see ``publish --help``); ``stop``: Ctrl-C ends the reading, then
    the counts are printed and the exit status is :data:`EXIT_INTERRUPTED`."""
    from ..errors import WaitTimeout, refusal
    from ..model.messages import check_expiration
    from ..publish.append import append
    from ..publish.result import PublishInterrupted, PublishResult

    check_expiration(expiration)  # --expiration beyond 100 years: one line, nothing sent
    sow = _sow(ctx)
    t = sow.topic(topic)
    _check_sow_key_option(t, sow_key)
    sep = _separator(separator)
    if durable:
        _check_durable(sow.r, sow.url)
    fh: BinaryIO
    if file == "-":
        fh, size = sys.stdin.buffer, 0
    else:
        try:
            fh = open(file, "rb")
        except OSError as exc:
            raise click.ClickException(f"cannot read {file}: {exc.strerror}") from None
        size = os.path.getsize(file)
    started = time.perf_counter()
    limit, overlong = t.max_message_bytes + LINE_SLACK, dict[int, int]()
    sample: list[bytes] = []  # the first lines, for a hint on rejections

    def items(lines: Iterable[bytes]) -> Iterator[Any]:
        for line in lines:
            if len(sample) < 5:
                sample.append(line)
            yield (cmd, line, sow_key, expiration)
            if stop.hit:
                return

    blocks: Iterator[Iterable[bytes]]
    if _is_stream(fh):
        blocks = _stream_blocks(fh.fileno(), limit, overlong, stop)
    else:
        blocks = iter([_lines(fh, limit, overlong)])
    show_bar = size > 0 and sys.stderr.isatty()
    result = PublishResult()
    if retry_s > 0:  # ride out a Redis outage (reported once on stderr), then go on
        from functools import partial

        from ..publish.retry import append_through_outage

        append = partial(append_through_outage, retry_s=retry_s)
    refused: PublishInterrupted | None = None
    try:
        if show_bar:
            from rich.progress import Progress

            with Progress(transient=True) as progress:
                task = progress.add_task(f"publishing to {topic}", total=size)
                for block in blocks:
                    result.merge(append(
                        sow.r, t, items(block), start=result.read + 1, fix_separator=sep,
                        jobs=sow.job_settings,
                        on_chunk=lambda _n: progress.update(task, completed=fh.tell()),
                        durable=durable))
                    t = result.definition or t  # read again across a migration
        else:
            for block in blocks:
                result.merge(append(sow.r, t, items(block), start=result.read + 1,
                                    fix_separator=sep, jobs=sow.job_settings, durable=durable))
                t = result.definition or t  # read again across a migration
                if stop.hit:
                    break
    except PublishInterrupted as exc:  # some were appended (else the refusal is raised)
        refused = exc
        result.merge(exc.result)
        t = result.definition or t
    ctrl_c = stop.hit and refused is None
    stop.hard()
    not_sent = _rest_of(fh) if ctrl_c else None
    if fh is not sys.stdin.buffer:
        fh.close()
    if overlong:
        from dataclasses import replace

        result.rejected = [replace(x, reason="too_large", detail=(
            f"{overlong[x.position]} bytes > max_message_bytes {t.max_message_bytes}"))
            if x.position in overlong else x for x in result.rejected]
    timed_out: WaitTimeout | None = None
    started_jobs = sow.job_settings is not None  # append(jobs=…) started the workers
    wait = wait and not ctrl_c
    try:
        if refused is not None:
            pass  # Redis refuses writes: no --wait
        elif retry_s > 0:
            from ..outage import call_through_outage

            call_through_outage(lambda: sow.handoff(t, result.last_ids, wait, timeout,
                                                    jobs_started=started_jobs), retry_s)
        else:
            sow.handoff(t, result.last_ids, wait, timeout, jobs_started=started_jobs)
    except WaitTimeout as exc:
        timed_out = exc
    except KeyboardInterrupt:
        ctrl_c, wait = True, False
    elapsed = time.perf_counter() - started
    reasons = _report_rejected(result.rejected)
    if "bad_fix" in reasons and t.message_type == "fix":
        hint = _fix_hint(sample, sep or t.field_separator.encode())
        if hint:
            click.echo(hint, err=True)
    why = (" (" + ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items())) + ")") if reasons else ""
    rate = result.published / elapsed if elapsed > 0 else 0.0
    skipped = (f", skipped {result.skipped} (MsgType in skip_msg_types: "
               f"{','.join(t.skip_msg_types)})") if result.skipped else ""
    applied = " (applied)" if (wait or sow.inline) and timed_out is None else ""
    click.echo(f"published {result.published} message(s) to {topic}{skipped}, rejected "
               f"{len(result.rejected)}{why}; read {result.read} line(s); {elapsed:.2f} s, "
               f"{rate:,.0f} msg/s{applied}")
    if refused is not None:
        click.echo(f"Error: Redis refused the publish after line {result.read}: "
                   f"{refusal(refused.cause)}; the {result.published} published message(s) are in "
                   "the transaction log and will be applied; the lines after it were not sent",
                   err=True)
        ctx.exit(EXIT_REFUSED)
    if ctrl_c:
        rest = ("the rest of standard input" if not_sent is None
                else f"{not_sent} line(s) of {file}")
        click.echo(f"interrupted: appended {result.published} message(s) to the log of "
                   f"{topic} (they will be applied), rejected {len(result.rejected)}; not sent: "
                   f"{rest} after line {result.read}", err=True)
        ctx.exit(EXIT_INTERRUPTED)
    if timed_out is not None:
        click.echo(f"Error: --wait timed out: {timed_out}; the {result.published} published "
                   "message(s) are in the transaction log and will be applied when workers run",
                   err=True)
        ctx.exit(EXIT_TIMEOUT)
    if result.rejected and result.published == 0:
        click.echo(f"Error: nothing was published: all {len(result.rejected)} line(s) "
                   "were rejected", err=True)
        ctx.exit(EXIT_ERROR)
    if result.rejected:
        ctx.exit(EXIT_REJECTED)


_publish_options = [
    click.option("-t", "--topic", required=True, help="SOW topic."),
    click.argument("file", default="-"),
    click.option("--sow-key", help="SOW key for topics without key fields (1-512 Base64 "
                 "characters); refused on topics with key fields."),
    click.option("--wait", is_flag=True, help="Return only after the workers applied everything."),
    click.option("--timeout", default=300.0, show_default=True, help="Seconds --wait waits."),
    click.option("--expiration", type=click.FloatRange(min=0),
                 help="Message lifetime in seconds (0 = never expire, at most 100 years); "
                 "overrides the topic's."),
    click.option("--separator", help="FIX topics: field separator of FILE (SOH, ';', '|'); "
                 "default: the topic's field_separator."),
    click.option("--retry-s", type=click.FloatRange(min=0), default=60.0, show_default=True,
                 help="Seconds a Redis outage may last once publishing has started: the "
                 "outage is reported once on stderr, the lines in flight are sent again when "
                 "Redis answers (at least once); 0: fail at once."),
    click.option("--durable", is_flag=True, help="Acknowledge each chunk only once a replica "
                 "has it (WAIT 1): survives the loss of a primary; needs replicas."),
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
            timeout: float, expiration: float | None, separator: str | None, retry_s: float,
            durable: bool, delta: bool) -> None:
    """Publish JSON Lines from FILE (or - for stdin): one message per line.

    Each message replaces the whole record of its SOW key; with --delta it is merged.
    A line may be an envelope with per-message options:
    {"$sow": {"expiration": 30, "sow_key": "QUJD"}, "data": {...}}.
    On a FIX topic a line is a FIX message (a log prefix before 8=FIX is skipped).
    Rejected lines are counted by reason on stderr, with a few examples.

    From a pipe (FILE -), what has arrived is published within 0.2 s (tail -f … |).
    Ctrl-C stops reading: what was read is still sent, then the counts are printed
    (appended, rejected, not sent).

    \b
    Exit status:
      0  every line published (or skipped)
      1  error (unknown topic, unreadable file, a --sow-key the topic cannot take,
         --durable without a replica, every line rejected: nothing published)
      2  usage error
      3  some lines rejected (the others were published)
      4  --wait timed out (the messages are in the log and will be applied)
      5  Redis refused the rest after some were published (out of memory, read-only)
      130  Ctrl-C (what was appended stays in the log and will be applied)

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 publish -t orders orders.jsonl --wait
    """
    _publish(ctx, topic, file, "delta_publish" if delta else "publish", sow_key, wait, timeout,
             expiration, separator, retry_s, durable)


@main.command("delta-publish")
@_with(_publish_options)
@click.pass_context
@_friendly
def delta_publish(ctx: click.Context, topic: str, file: str, sow_key: str | None, wait: bool,
                  timeout: float, expiration: float | None, separator: str | None,
                  retry_s: float, durable: bool) -> None:
    """delta_publish JSON Lines: fields in each update replace those fields of the stored
    record, nested objects merge, other fields stay (same as publish --delta). Same exit
    status as publish: 0 all published, 1 error, 2 usage, 3 lines rejected, 4 --wait timed out.

    \b
    Example:
      echo '{"orderId": 1, "price": 95}' | sow-redis --redis-url redis://127.0.0.1:6390/0 delta-publish -t orders
    """
    _publish(ctx, topic, file, "delta_publish", sow_key, wait, timeout, expiration, separator,
             retry_s, durable)


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

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 sow -t flights -f "/carrier = 'UA' AND /dep_delay > 60" --top-n 5
    """
    client = _sow(ctx)
    records = client.sow(topic, filter_, _split_keys(keys), top_n, order_by)
    if fmt == "table":
        _print_table(topic, records, with_key)
        return
    out = sys.stdout.buffer
    if fmt == "fix":
        from ..model.fix import encode

        t = client.topic(topic)
        if t.message_type != "fix":
            raise click.ClickException(f"--format fix needs a FIX topic; '{topic}' holds "
                                       f"{t.message_type} messages (use jsonl or table)")
        sep = _separator(separator) or t.field_separator.encode()
        for rec in records:
            out.write((rec.sow_key.encode() + b" " if with_key else b"")
                      + encode(rec.obj(), sep) + b"\n")
        out.flush()
        return
    for rec in records:
        if with_key:
            key = rec.sow_key.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            out.write(b'{"sow_key":%s,"seq":%d,"expiry_ms":%d,"data":%s}\n'
                      % (orjson.dumps(key), rec.seq, rec.expiry_ms, rec.data))
        else:
            out.write(rec.data + b"\n")
    out.flush()


def _print_table(topic: str, records: list[Any], with_key: bool) -> None:
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
    _console_for(table).print(table)


def _console_for(table: Any) -> Any:
    """A rich Console for ``table``: the terminal's width on a terminal; else (a pipe, a
    file) as wide as the table needs, so that no cell is cut to ``…``."""
    from rich.console import Console

    if sys.stdout.isatty():
        console = Console()
    else:
        console = Console(width=max(80, Console(width=1 << 20).measure(table).maximum))
    console.on_broken_pipe = _broken_pipe  # type: ignore[method-assign]  # rich: exit 1
    return console


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

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 sow-delete -t orders -f "/status = 'filled'"
    """
    if sum(x is not None for x in (filter_, keys, data)) != 1:
        raise click.UsageError("give exactly one of --filter, --keys or --data")
    n = _sow(ctx).sow_delete(topic, filter=filter_, keys=_split_keys(keys),
                             data=data.encode("utf-8", "surrogateescape") if data is not None else None,
                             sow_key=sow_key, timeout=timeout)
    click.echo(f"removed {n} record(s) from {topic}")


def _run_subscription(sub: Any, count: int | None, timeout: float | None) -> None:
    """Print a subscription's messages as JSON Lines until ``count`` messages, ``timeout``
    seconds without one, Ctrl-C or SIGTERM; each is processed once written. Recoveries go to
    stderr too, and first one line saying that the subscription is live (every change from
    then on is printed). Closing flushes the bookmark store."""
    import signal

    from ..feed.subscriber import to_line

    def on_term(*_a: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    out = sys.stdout.buffer
    click.echo(f"live on {sub.topic.name} ({sub.topic.partitions} partition(s)): every change "
               "from now on is printed; Ctrl-C stops", err=True)
    try:
        with sub:
            def write(msg: dict[str, Any]) -> None:
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


def _message_limits(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The --count and --timeout options of the subscription commands."""
    fn = click.option("--timeout", type=float,
                      help="Exit after this many seconds without a message.")(fn)
    return click.option("--count", type=click.IntRange(min=1),
                        help="Exit after this many messages.")(fn)


def _report_recovery(msg: dict[str, Any]) -> None:
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
    click.echo(f"recovered partition {msg['partition']} of {msg['topic']}: seq "
               f"{msg['after'] + 1}..{msg['to']} after a {msg['cause']} (from the "
               f"{'change feed' if msg['how'] == 'feed' else 'records'})", err=True)


@main.command()
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.option("-f", "--filter", "filter_", help="Only records that match (AMPS filter).")
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
@_message_limits
@click.pass_context
@_friendly
def subscribe(ctx: click.Context, topic: str, filter_: str | None, oof: bool,
              bookmark: str | None, client_name: str | None, sub_id: str | None,
              persist_every: int, resync: bool, count: int | None,
              timeout: float | None) -> None:
    """Print the changes of a topic as JSON Lines (one message per line, with a "kind":
    publish, oof, completed, recovery), AMPS subscribe semantics: records published to the
    topic; removals only as out-of-focus notices (--oof). Gaps are recovered from the change
    feed. With --client-name/--sub-id the subscription resumes from its stored bookmark.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 subscribe -t orders -f "/price > 100"
      sow-redis --redis-url redis://127.0.0.1:6390/0 subscribe -t orders \\
          --client-name w1 --sub-id orders-feed
    """
    if (client_name is None) != (sub_id is None):
        raise click.UsageError("--client-name and --sub-id go together")
    if client_name is None and bookmark is not None and bookmark.strip().upper() == "RECENT":
        raise click.UsageError("--bookmark RECENT needs the bookmark store: give --client-name "
                               "and --sub-id")
    sub = _sow(ctx).subscribe(topic, filter_, oof=oof, bookmark=bookmark,
                              client_name=client_name, sub_id=sub_id,
                              persist_every=persist_every, resync=resync,
                              report=_report_recovery)
    _run_subscription(sub, count, timeout)


@main.command("sow-and-subscribe")
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.option("-f", "--filter", "filter_", help="Only records that match (AMPS filter).")
@click.option("--oof", is_flag=True, help="Out-of-focus notices (see subscribe).")
@click.option("--top-n", type=click.IntRange(min=0), help="The query returns at most N records.")
@click.option("--order-by", help="Order of the query part, e.g. \"/price DESC, /orderId\".")
@_message_limits
@click.pass_context
@_friendly
def sow_and_subscribe(ctx: click.Context, topic: str, filter_: str | None, oof: bool,
                      top_n: int | None, order_by: str | None, count: int | None,
                      timeout: float | None) -> None:
    """Print the query result ("kind": "sow"), a group_end line (also when the result is
    empty), then the live changes as subscribe does, as if query and subscription happened at
    the same instant (no gap, no duplicate).

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 sow-and-subscribe -t orders --oof
    """
    sub = _sow(ctx).sow_and_subscribe(topic, filter_, oof=oof, top_n=top_n,
                                      order_by=order_by, report=_report_recovery)
    _run_subscription(sub, count, timeout)


@main.command()
@click.option("--client-name", required=True, help="Client name in the bookmark store.")
@click.option("--sub-id", help="Only this subscription.")
@click.pass_context
@_friendly
def bookmarks(ctx: click.Context, client_name: str, sub_id: str | None) -> None:
    """Print the bookmarks stored for a client in the SOW-backed bookmark store
    (/ADMIN/bookmark_store), one JSON record per subscription.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 bookmarks --client-name w1
    """
    from ..feed.bookmark_store import list_bookmarks

    for rec in list_bookmarks(_sow(ctx).r, client_name, sub_id):
        sys.stdout.buffer.write(orjson.dumps(rec) + b"\n")


@main.command()
@click.option("-t", "--topic", required=True, help="SOW topic.")
@click.option("--count", default=100, show_default=True, help="Newest N entries.")
@click.pass_context
@_friendly
def errors(ctx: click.Context, topic: str, count: int) -> None:
    """List messages the workers could not apply (the topic's error stream), with reasons.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 errors -t orders
    """
    for e in _sow(ctx).errors(topic, count):
        sys.stdout.buffer.write(orjson.dumps(e) + b"\n")


def _each_topic(ctx: click.Context, report: Callable[[Any, Any], dict[str, Any]]) -> None:
    """Print ``report(redis, topic)`` as one JSON line per registered topic, by name."""
    from ..registry import load_topics

    sow = _sow(ctx)
    for t in sorted(load_topics(sow.r).values(), key=lambda t: t.name):
        click.echo(orjson.dumps(report(sow.r, t)).decode())


@main.command()
@click.pass_context
@_friendly
def status(ctx: click.Context) -> None:
    """Per topic and partition: records, log length, entries waiting to be applied.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 status
    """
    from ..ops.status import topic_status

    _each_topic(ctx, topic_status)


@main.command()
@click.option("-t", "--topic", "topics", multiple=True, help="Only this topic (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per topic (for scripts).")
@click.option("--watch", is_flag=True, help="Refresh a terminal view every --interval seconds.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between the two readings the rates come from.")
@click.pass_context
@_friendly
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
    from ..ops.status import topic_stats, with_rates
    from ..registry import load_topics

    sow = _sow(ctx)
    chosen = load_topics(sow.r)
    unknown = [t for t in topics if t not in chosen]
    if unknown:
        sow.topic(unknown[0])  # raises UnknownTopicError: one line
    names = sorted(topics or chosen)

    def reading() -> dict[str, dict[str, Any]]:
        return {n: topic_stats(sow.r, chosen[n]) for n in names}

    before = reading()
    if as_json and not watch:
        time.sleep(interval)
        after = reading()
        for n in names:
            sys.stdout.buffer.write(orjson.dumps(with_rates(before[n], after[n])) + b"\n")
        return
    from rich.live import Live

    time.sleep(interval)
    after = reading()
    if not watch:
        table = _stats_table([with_rates(before[n], after[n]) for n in names])
        _console_for(table).print(table)
        return
    from rich.console import Console

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


def _stats_table(rows: list[dict[str, Any]]) -> Any:
    import datetime as _dt

    from rich.table import Table

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


@main.command()
@click.option("--port", type=click.IntRange(1, 65535), default=9464, show_default=True,
              help="HTTP port of the Prometheus endpoint (/metrics).")
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface).")
@click.pass_context
@_friendly
def metrics(ctx: click.Context, port: int, bind: str) -> None:
    """Serve Prometheus metrics on http://BIND:PORT/metrics: the stats figures of every topic
    and histograms of publish→applied latency, apply batch latency and expiry lag (due time
    → delete event), from the topics' change blocks. Runs until Ctrl-C or SIGTERM.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 metrics --port 9464
    """
    import signal

    from ..ops.metrics import serve
    from ..stopping import StopEvent, stop_on_signals

    stop = StopEvent()
    stop_on_signals(stop, (signal.SIGTERM,))
    click.echo(f"metrics on http://{bind}:{port}/metrics for {redact(_sow(ctx).url)}", err=True)
    try:
        serve(_sow(ctx).r, port, bind, stop)
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise click.ClickException(f"cannot serve metrics on {bind}:{port}: "
                                   f"{exc.strerror or exc}") from None


@main.command()
@click.option("-t", "--topic", required=True, help="A topic with the chaining key generator.")
@click.option("--id", "ident", help="Show the chain of this identifier (e.g. a ClOrdID).")
@click.pass_context
@_friendly
def chains(ctx: click.Context, topic: str, ident: str | None) -> None:
    """Chaining key generator state: identifiers in chains and, with validation on, the
    chains that would have been one had messages arrived in another order.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 chains -t orders --id ORD-1
    """
    from ..apply.chaining import chain_of, chain_stats, conflict_groups

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


@main.command("keys")
@click.option("-t", "--topic", required=True, help="A topic.")
@click.pass_context
@_friendly
def keys_cmd(ctx: click.Context, topic: str) -> None:
    """A topic's partitions: one JSON line each with its hash slot, hash tag, transaction log
    (the stream any Redis client may XADD to) and live channel (SSUBSCRIBE). Every key of a
    partition is <tag>:<name> (docs/architecture.md, "Keys and channels").

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 keys -t orders
    """
    from .. import keys

    t = _sow(ctx).topic(topic)
    for p in range(t.partitions):
        click.echo(orjson.dumps({
            "partition": p, "slot": keys.partition_slot(t.name, p),
            "tag": keys.partition_tag(t.name, p), "log": keys.log(t.name, p),
            "live": keys.partition_channel(t.name, p)}).decode())


# -- processes --------------------------------------------------------------------------
@main.command()
@click.option("--burst", is_flag=True,
              help="Drain every partition, then exit (status 1 if entries remain unapplied).")
@click.option("--name", help="Prefix of the worker name shown in rq-dashboard "
              "(the name is <prefix>-<host>-<pid>-<random>; default prefix 'sow').")
@click.pass_context
@_friendly
def worker(ctx: click.Context, burst: bool, name: str | None) -> None:
    """Run a worker: applies the transaction logs (rq worker on queue 'sow').

    Run as many as the load needs, on any host. It rides out Redis outages (retries every
    0.1 s doubling to 2 s). With --burst it exits with status 1, naming topics and
    partitions, when log entries remain unapplied (e.g. another worker holds a partition).

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 worker --burst
    """
    from ..ops.worker import run_worker

    settings = _settings(ctx)
    control = control_url_for(settings.redis_url, settings.control_url)
    started = time.monotonic()
    pending = _pending_entries(settings) if burst else 0  # fails first: one line
    click.echo(f"worker{' --burst' if burst else ''}: queue 'sow' on {redact(control)}, "
               f"applying to {redact(settings.redis_url)}"
               + ("; drains every partition, then exits" if burst else "; Ctrl-C stops it"),
               err=True)
    run_worker(settings, burst=burst, name=name)
    if burst:
        from ..apply.jobs import unapplied_partitions
        from ..connection import connect

        left = unapplied_partitions(connect(settings.redis_url))
        if left:
            where = "; ".join(f"{t} partitions {','.join(map(str, ps))}" for t, ps in left.items())
            raise click.ClickException(f"worker --burst: entries remain unapplied: {where}")
        click.echo(f"worker --burst: every partition applied ({pending:,} log entr"
                   f"{'y' if pending == 1 else 'ies'} waited at start); "
                   f"{time.monotonic() - started:.1f} s", err=True)


def _pending_entries(settings: Settings) -> int:
    """Log entries not yet applied, over every topic (:func:`status.topic_status`)."""
    from ..connection import connect
    from ..ops.status import topic_status
    from ..registry import load_topics

    r = connect(settings.redis_url)
    return sum(topic_status(r, t)["pending"] for t in load_topics(r).values())


@main.command()
@click.option("--burst", is_flag=True, help="Expire what is due now, then exit.")
@click.option("-t", "--topic", "topics", multiple=True,
              help="Serve only this topic (repeatable; default: every topic).")
@click.pass_context
@_friendly
def expirer(ctx: click.Context, burst: bool, topics: tuple[str, ...]) -> None:
    """Run the expirer: removes due records (event reason "expired"), forwards dead letters,
    removes idle topics. Any number may run at once; `up` starts one.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 expirer
    """
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from ..expirer import run_expirer
    from ..registry import load_topics

    settings = _settings(ctx)
    sow = _sow(ctx)
    try:
        known = load_topics(sow.r)
    except (RedisConnectionError, RedisTimeoutError):
        if burst:
            raise
        known = None  # the expirer waits for Redis (one line when the outage starts)
    if known is not None:
        for name in topics:
            if name not in known:
                sow.topic(name)  # raises UnknownTopicError: one line, status 1
        served = [known[n] for n in (topics or sorted(known))]
        expiring = [t.name for t in served if t.expiration_enabled]
        enabled = (f"; {len(expiring)} with expiration enabled"
                   + (f" ({', '.join(expiring[:5])}{', …' if len(expiring) > 5 else ''})"
                      if expiring else ""))
    click.echo(f"expirer{' --burst' if burst else ''} on {redact(settings.redis_url)}: "
               + (f"topic(s) {', '.join(topics)}" if topics else "every topic")
               + (enabled if known is not None else "")
               + ("" if burst else "; Ctrl-C stops it"), err=True)
    started = time.monotonic()
    n = run_expirer(settings, burst=burst, topics=topics or None)
    if burst:
        click.echo(f"expired {n} record(s)")
    else:
        click.echo(f"expirer stopped: expired {n:,} record(s) in "
                   f"{time.monotonic() - started:.0f} s", err=True)


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
@click.option("--cluster", "cluster_n", type=click.IntRange(min=3), metavar="N",
              help="Start a Redis Cluster of N primaries (N >= 3) and a plain control Redis "
              "on free loopback ports instead of using --redis-url, and print their URLs "
              "(for trials; without --detach).")
@click.option("--replicas", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --cluster: replicas per primary.")
@click.pass_context
@_friendly
def up(ctx: click.Context, workers: int, data_dir: str, no_config: bool, detach: bool,
       wait_ready: float | None, cluster_n: int | None, replicas: int) -> None:
    """Start a local redis-server (if none answers at --redis-url), apply --config, run
    N workers and the expirer; Ctrl-C (or `sow-redis down`) stops them all cleanly.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 up --workers 2 --detach
      sow-redis --redis-url redis://127.0.0.1:6390/0 down

    With --cluster N (and --replicas R) it starts a local Redis Cluster and a control Redis
    instead, prints SOW_REDIS_URL and SOW_CONTROL_URL, and stops them on Ctrl-C.
    """
    from ..ops.server import READY_TIMEOUT_S, redis_warnings, run_up, start_detached

    if wait_ready is not None and not detach:
        raise click.UsageError("--wait-ready needs --detach")
    if cluster_n is not None:
        if detach:
            raise click.UsageError("--cluster runs in the foreground (no --detach)")
        run_up(ctx.find_root().obj["settings"], workers, data_dir, apply_config=not no_config,
               cluster=(cluster_n, replicas))
        return
    if replicas:
        raise click.UsageError("--replicas needs --cluster")
    settings = _settings(ctx)
    if detach:
        click.echo(start_detached(settings, workers, data_dir, apply_config=not no_config,
                                  timeout_s=READY_TIMEOUT_S if wait_ready is None
                                  else wait_ready))
        for warning in redis_warnings(settings.redis_url):  # up.log has them too
            click.echo(f"warning: {warning}", err=True)
        return
    run_up(settings, workers, data_dir, apply_config=not no_config)


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

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 down
    """
    from ..ops.server import stop_detached

    _stopped, report = stop_detached(_settings(ctx), data_dir, timeout)
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
    """Run rq-dashboard on this Redis (the --control-url one when given) to watch workers,
    the 'sow' queue and jobs, with a SOW page (/sow/) of the topics: figures, rates, lag,
    rejections, partitions and queries; it listens on 127.0.0.1 unless --bind says otherwise.

    \b
    Example (then open http://127.0.0.1:9181/):
      sow-redis --redis-url redis://127.0.0.1:6390/0 dashboard --port 9181
    """
    from redis import Redis

    settings = _settings(ctx)
    url = control_url_for(settings.redis_url, settings.control_url)  # rq lives there
    if bool(username) != bool(password):
        raise click.UsageError("give both --username and --password (or neither)")
    try:
        import rq_dashboard.cli  # noqa: F401 - fail here, in one line, not in the child
    except ImportError as exc:
        raise click.ClickException(f"rq-dashboard cannot start: {exc} "
                                   "(reinstall: pip install -e .)") from None
    Redis.from_url(url, socket_connect_timeout=2.0, **tls_options(url)).ping()
    _check_port_free(bind, port)
    # the Redis URL (it may hold a password) goes in the environment, never in argv, which
    # `ps` shows to every user: rq-dashboard reads RQ_DASHBOARD_<OPTION> variables
    env = dict(os.environ, RQ_DASHBOARD_REDIS_URL=url, SOW_REDIS_URL=settings.redis_url)
    if settings.control_url:  # the SOW page reads the data plane (sow_redis/ops/dashboard)
        env["SOW_CONTROL_URL"] = settings.control_url
    if username:
        # handed over in the environment, not argv, so `ps` does not show the password
        env.update(RQ_DASHBOARD_USERNAME=username, RQ_DASHBOARD_PASSWORD=password or "")
    elif bind not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: rq-dashboard on {bind} without --username/--password: anyone "
                   "who reaches this port can see and delete jobs", err=True)
    host = f"[{bind}]" if ":" in bind else bind
    click.echo(f"rq-dashboard on http://{host}:{port}/ (SOW page: /sow/) for {redact(url)}"
               + (f" (basic auth, user {username})" if username else "")
               + "; Ctrl-C stops it", err=True)
    sys.stderr.flush()
    # --json: sow_redis jobs are JSON; the dashboard must never unpickle a job payload
    # sow_redis.ops.dashboard: rq-dashboard whose workers page reads the jobs as JSON too
    os.execve(sys.executable, [sys.executable, "-m", "sow_redis.ops.dashboard", "--bind", bind,
                               "--port", str(port), "--json"], env)


def _check_port_free(bind: str, port: int) -> None:
    """Refuse, in one line, a port another process listens on (checked the way the HTTP
    server binds it: SO_REUSEADDR), before rq-dashboard starts and says it runs there."""
    import socket

    try:
        infos = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise click.ClickException(f"dashboard: cannot use --bind {bind}: {exc}") from None
    family, _t, _p, _c, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            raise click.ClickException(
                f"dashboard: cannot listen on {bind}:{port}: {exc.strerror or exc} (another "
                "process uses that port: give --port)") from None


# -- spark ------------------------------------------------------------------------------
@main.group()
def spark() -> None:
    """The data pipeline on Spark (pyspark, the 'spark' extra): bulk loads into a SOW, chain
    resolution, streaming, snapshots, log archives, rebuilds and SQL.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 spark load -t flights data/flights.jsonl
      sow-redis --redis-url redis://127.0.0.1:6390/0 spark sql "SELECT count(*) FROM flights"
    """


def _spark_session(master: str) -> Any:
    """The SparkSession of the spark commands; one line when pyspark is missing. With stderr
    not a terminal: no progress bar, and Spark's own log to a file (spark/session.py)."""
    from ..spark.session import get_session, mute_query_context_loggers

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
    from ..spark.session import start_seconds

    seconds, reused = start_seconds()
    return "Spark session reused" if reused else f"Spark start-up {seconds:.1f} s"


def _spark_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Spark's errors as one line (under :func:`_friendly`): a query or path Spark refused
    (``AnalysisException``, ``ParseException``, …) as Spark's first line; a failure in
    Spark (a task, the Java side) as its cause, naming Spark's log file when there is one;
    ``SOW_DEBUG=1`` shows the traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except Exception as exc:
            from ..spark.session import error_line, keep_log, log_path

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
            raise click.ClickException(_one_line(text, _url())) from None

    return wrapper


def _spark_inputs(inputs: tuple[str, ...], fmt: str | None) -> list[str]:
    """The inputs of `spark load` / `resolve-chains`, checked before Spark starts."""
    from ..spark.load import check_inputs

    try:
        check_inputs(list(inputs), fmt)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    return list(inputs)


def _spark_local_dir(path: str, what: str) -> None:
    """A folder Spark is to read, when on the local file system: it must be there."""
    from ..spark.load import local_path

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
@_with(_spark_input_options)
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
@_friendly
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
    from ..spark.load import load

    if delta and delete:
        raise click.UsageError("give at most one of --delta and --delete")
    cmd = "delta_publish" if delta else "sow_delete" if delete else "publish"
    sow = _sow(ctx)
    t = sow.topic(topic)
    paths = _spark_inputs(inputs, fmt)
    if durable:
        _check_durable(sow.r, sow.url)
    session = _spark_session(master)
    started = time.perf_counter()
    from ..model.fix import separator as fix_separator

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
@_with(_spark_input_options)
@click.option("--separator", help="FIX field separator of the input (default: the topic's).")
@click.option("--dry-run", is_flag=True, help="Resolve and report; write nothing.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.pass_context
@_friendly
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
    from ..model.fix import separator as fix_separator
    from ..spark.chains import resolve_chains

    sow = _sow(ctx)
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
@_friendly
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
    from ..model.fix import separator as fix_separator
    from ..spark.stream import stream

    sow = _sow(ctx)
    t = sow.topic(topic)
    _spark_local_dir(directory, "folder")
    session = _spark_session(master)
    cp = checkpoint or os.path.join(directory, f"_sow_checkpoint_{re.sub(r'[^A-Za-z0-9_]', '_', topic)}")
    click.echo(f"streaming {directory} into {topic} (checkpoint {cp}); {_spark_start()}")

    def progress(batch_id: int, res: Any) -> None:
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
@_friendly
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
    from ..spark.snapshot import export

    sow = _sow(ctx)
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
@_friendly
@_spark_errors
def spark_archive(ctx: click.Context, topic: str, out: str, trim: bool, master: str) -> None:
    """Write a topic's transaction log (OUT/log) and change feed (OUT/changes) to Parquet,
    one Spark task per partition; --trim then removes the archived, applied log entries.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 spark archive -t flights out/arch --trim
    """
    from ..spark.archive import archive

    sow = _sow(ctx)
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
@_friendly
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
    from ..spark.archive import rebuild

    sow = _sow(ctx)
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
@_friendly
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
    from ..registry import load_topics
    from ..spark.snapshot import sql

    sow = _sow(ctx)
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
@_friendly
@_spark_errors
def spark_shell(ctx: click.Context, script: Any, master: str) -> None:
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
    import shlex

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
