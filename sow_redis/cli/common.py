"""What every ``sow-redis`` command shares: one-line errors, exit statuses, the settings and
:class:`~sow_redis.client.Sow` of a command, the click group class, option helpers."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, ParamSpec, TypeVar
from urllib.parse import urlsplit

import click

from ..connection import (
    Client,
    check_url,
    control_url_for,
    is_memory,
    primaries_without_replica,
    redact,
)
from ..errors import BadURLError, ControlURLError, SowError
from ..model.fix import separator
from ..settings import Settings

if TYPE_CHECKING:  # annotations only (start-up time: see the functions' imports)
    from rich.console import Console
    from rich.table import Table

    from ..client import Sow

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., object])


def one_line(text: str, url: str) -> str:
    """One line of error text with any password of ``url`` masked."""
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


def broken_pipe() -> NoReturn:
    """End quietly, as ``head`` expects of a writer: nothing more goes to standard output
    (it is pointed at /dev/null so that the interpreter's last flush fails no more), exit
    status :data:`EXIT_PIPE`."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    raise SystemExit(EXIT_PIPE)


def friendly(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn every error of a command into one line on stderr and exit status 1 (click's own
    usage errors keep status 2): SowError as its message, Redis failures by kind, anything
    else as an internal error (``SOW_DEBUG=1`` shows the traceback). A closed standard
    output (``| head``) ends the command quietly with :data:`EXIT_PIPE` (Ctrl-C: see
    :class:`Main`)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from redis import exceptions as rx  # start-up time: redis-py, on the error path

        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            broken_pipe()
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except SowError as exc:
            raise click.ClickException(one_line(str(exc), redis_url())) from None
        except Exception as exc:
            if os.environ.get("SOW_DEBUG"):
                raise
            url = redis_url()
            where, msg = redact(url), one_line(str(exc), url)
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


def redis_url() -> str:
    """The ``--redis-url`` of the running command ("" outside one), for error lines."""
    ctx = click.get_current_context(silent=True)
    return ctx.find_root().obj["settings"].redis_url if ctx and ctx.find_root().obj else ""


def settings_of(ctx: click.Context) -> Settings:
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


def sow_of(ctx: click.Context) -> Sow:
    """A :class:`~sow_redis.client.Sow` in workers mode (``sow-redis worker`` applies)."""
    from ..client import Sow  # start-up time: redis-py and rq

    return Sow(settings=settings_of(ctx), inline=False)


RUN_UNTIL_STOPPED = frozenset({"subscribe", "sow-and-subscribe", "metrics", "stats --watch"})
"""Commands that run until Ctrl-C or SIGTERM stops them: that is how they end, status 0."""


class Main(click.Group):
    """The ``sow-redis`` group: Ctrl-C, wherever it comes (also while a command starts),
    ends a command that runs until stopped (:data:`RUN_UNTIL_STOPPED`) with status 0, and
    any other with ``interrupted`` and :data:`EXIT_INTERRUPTED` (click would print
    ``Aborted!`` and exit 1); a closed standard output as :func:`broken_pipe`."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            broken_pipe()
        except KeyboardInterrupt:
            name = ctx.invoked_subcommand or ""
            if name == "stats" and "--watch" in sys.argv:
                name = "stats --watch"
            if name in RUN_UNTIL_STOPPED:
                raise SystemExit(0) from None
            click.echo("interrupted", err=True)
            raise SystemExit(EXIT_INTERRUPTED) from None


def with_options(options: list[Callable[[F], F]]) -> Callable[[F], F]:
    """A decorator applying ``options`` (click decorators) in the order listed."""

    def deco(fn: F) -> F:
        for opt in reversed(options):
            fn = opt(fn)
        return fn

    return deco


def parse_separator(text: str | None) -> bytes | None:
    """A ``--separator`` option as bytes (:func:`sow_redis.model.fix.separator`); None when
    not given.

    Raises:
        click.BadParameter: not a separator.
    """
    if text is None:
        return None
    try:
        return separator(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--separator") from None


def split_keys(keys: str | None) -> list[str] | None:
    """A ``--keys`` option as a list of SOW keys (None when not given)."""
    return [k for k in keys.split(",") if k] if keys else None


def select_list(select: tuple[str, ...]) -> list[str] | None:
    """The --select values (repeated, each possibly comma-separated) as the API takes them,
    checked before anything is read: a path that is no field path is one error line."""
    if not select:
        return None
    from ..model.values import select_paths  # start-up time: only with --select

    try:
        select_paths(list(select))
    except ValueError as exc:
        raise click.ClickException(f"--select: {exc}") from None
    return list(select)


def console_for(table: Table) -> Console:
    """A rich Console for ``table``: the terminal's width on a terminal; else (a pipe, a
    file) as wide as the table needs, so that no cell is cut to ``…``."""
    from rich.console import Console  # start-up time: rich, for tables only

    if sys.stdout.isatty():
        console = Console()
    else:
        console = Console(width=max(80, Console(width=1 << 20).measure(table).maximum))
    console.on_broken_pipe = broken_pipe  # type: ignore[method-assign]  # rich: exit 1
    return console


def check_durable(r: Client, url: str) -> None:
    """--durable: refuse at once, before anything is sent, when a primary has no replica
    (WAIT 1 would only time out, each chunk after it was stored)."""
    lonely = primaries_without_replica(r)
    if lonely:
        where = (f"the server at {redact(url)} has" if lonely == ["the server"]
                 else f"primar{'y' if len(lonely) == 1 else 'ies'} {', '.join(lonely)} "
                      f"of {redact(url)} {'has' if len(lonely) == 1 else 'have'}")
        raise click.ClickException(
            f"--durable needs a replica, and {where} none (INFO replication: "
            "connected_slaves:0): nothing was published; publish without --durable or add a "
            "replica")
