"""``sow-redis publish`` and ``delta-publish``: JSON Lines (or FIX lines) from a file or a pipe,
appended through the :class:`~sow_redis.client.Sow` facade, with the counts of what was
published and rejected on stderr and an exit status that says how it went."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, BinaryIO

import click

from ..errors import MessageError, WaitTimeout, refusal
from ..publish.result import PublishInterrupted, PublishResult, Rejected
from .common import (
    EXIT_INTERRUPTED,
    check_durable,
    friendly,
    parse_separator,
    settings_of,
    with_options,
)
from .lines import LINE_SLACK, Interrupt, is_stream, lines, rest_of, stream_blocks

if TYPE_CHECKING:  # annotations only (start-up time: see the functions' imports)
    from ..client import Sow
    from ..model.topic import TopicConfig
    from ..publish.validate import Item

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_REJECTED, EXIT_TIMEOUT, EXIT_REFUSED = 0, 1, 2, 3, 4, 5
"""``publish`` exit status: every line published (or skipped); an error (unknown topic,
unreadable file, a --sow-key the topic cannot take, --durable without a replica, every line
rejected: nothing published; Redis unreachable); a usage error (click); some lines rejected,
the others published; ``--wait`` timed out (the published messages are in the log and will
be applied; takes precedence over 3); Redis refused the rest after some were published (out
of memory, read-only: the counts say what was appended). Ctrl-C: :data:`EXIT_INTERRUPTED`."""


SAMPLES = 5
"""Rejected lines shown one by one after the per-reason counts."""


def _check_sow_key_option(t: TopicConfig, sow_key: str | None) -> None:
    """Refuse a --sow-key the topic cannot take (:func:`messages.check_supplied_key`), before
    anything is read or published."""
    from ..model.messages import check_supplied_key  # start-up time: config

    if sow_key is None:
        return
    try:
        check_supplied_key(t, sow_key)
    except MessageError as exc:
        raise click.ClickException(f"--sow-key: {exc.detail}") from None


def _samples(rejected: list[Rejected], n: int) -> list[Rejected]:
    """Up to ``n`` rejected lines in line order: the first of each reason, then the earliest."""
    first: dict[str, Rejected] = {}
    for rej in rejected:
        first.setdefault(rej.reason, rej)
    chosen = {id(x): x for x in list(first.values())[:n]}
    for rej in rejected:
        if len(chosen) >= n:
            break
        chosen.setdefault(id(rej), rej)
    return sorted(chosen.values(), key=lambda x: x.position)


def _report_rejected(rejected: list[Rejected]) -> dict[str, int]:
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


def _publish(ctx: click.Context, topic: str, file: str, cmd: str, sow_key: str | None,
             wait: bool, timeout: float, expiration: float | None,
             separator: str | None, retry_s: float = 0.0, durable: bool = False) -> None:
    """``publish`` / ``delta-publish`` (see ``publish --help``): the lines of ``file`` (``-``:
    standard input) appended with :meth:`Sow.append_blocks <sow_redis.client.Sow.append_blocks>`
    (through an outage of ``retry_s`` seconds), handed to the workers, then the counts on
    stderr and the exit status (:data:`EXIT_OK` …). Ctrl-C ends the reading: what was read
    is still sent, then the counts are printed and the exit status is
    :data:`~sow_redis.cli.common.EXIT_INTERRUPTED`."""
    from ..client import Sow  # start-up time: redis-py and rq
    from ..model.expiry import check_expiration  # start-up time: config

    with Interrupt() as stop:
        check_expiration(expiration)  # --expiration beyond 100 years: one line, nothing sent
        sow = Sow(settings=settings_of(ctx), inline=False, retry_s=retry_s, durable=durable)
        t = sow.topic(topic)
        t.check_writable()
        _check_sow_key_option(t, sow_key)
        sep = parse_separator(separator)
        if durable:
            check_durable(sow.r, sow.url)
        source = _Input.open(file, t.max_message_bytes + LINE_SLACK)
        started = time.perf_counter()
        out = _append_input(sow, t, source, (cmd, sow_key, expiration), sep, stop)
        t = out.result.definition or t  # read again across a migration
        out.interrupted = stop.hit and out.refused is None
        stop.hard()
        out.not_sent = rest_of(source.fh) if out.interrupted else None
        source.close()
        _mark_too_large(out.result, source.overlong, t)
        _hand_off(sow, t, out, wait and not out.interrupted, timeout)
        _report(ctx, t, file, out, time.perf_counter() - started, source.sample,
                sep or t.field_separator.encode())


@dataclass
class _Input:
    """The lines of a publish: the open file (or standard input), its size in bytes (0 for
    standard input), the longest line taken in bytes, the over-long lines met (line number →
    size in bytes) and the first lines (for a hint on rejections)."""

    fh: BinaryIO
    size: int
    limit: int
    overlong: dict[int, int] = field(default_factory=dict)
    sample: list[bytes] = field(default_factory=list)

    @classmethod
    def open(cls, file: str, limit: int) -> _Input:
        """``file`` (``-``: standard input) opened for reading.

        Raises:
            click.ClickException: the file cannot be read.
        """
        if file == "-":
            return cls(sys.stdin.buffer, 0, limit)
        try:
            fh = open(file, "rb")  # closed by close(), after the publish
        except OSError as exc:
            raise click.ClickException(f"cannot read {file}: {exc.strerror}") from None
        return cls(fh, os.path.getsize(file), limit)

    def blocks(self, stop: Interrupt) -> Iterator[Iterable[bytes]]:
        """The lines in blocks: of a pipe, as they arrive (:func:`stream_blocks`); of a
        file, all in one."""
        if is_stream(self.fh):
            return stream_blocks(self.fh.fileno(), self.limit, self.overlong, stop)
        return iter([lines(self.fh, self.limit, self.overlong)])

    def close(self) -> None:
        """Close the file (not standard input)."""
        if self.fh is not sys.stdin.buffer:
            self.fh.close()


@dataclass
class _Outcome:
    """What a publish came to: its result, the refusal that stopped it, the ``--wait`` that
    timed out, whether Ctrl-C cut it short (and the lines of the file not sent then), whether
    what was published is applied."""

    result: PublishResult
    refused: PublishInterrupted | None = None
    timed_out: WaitTimeout | None = None
    interrupted: bool = False
    not_sent: int | None = None
    applied: bool = False


def _append_input(sow: Sow, t: TopicConfig, source: _Input,
                  item: tuple[str, str | None, float | None], sep: bytes | None,
                  stop: Interrupt) -> _Outcome:
    """Append the lines of ``source`` as ``(cmd, line, sow_key, expiration)`` items, with a
    progress bar on a terminal when the size is known; reading stops at Ctrl-C."""
    from rich.progress import Progress  # start-up time: rich, for a terminal

    cmd, sow_key, expiration = item

    def items(block: Iterable[bytes]) -> Iterator[Item]:
        for line in block:
            if len(source.sample) < 5:
                source.sample.append(line)
            yield (cmd, line, sow_key, expiration)
            if stop.hit:
                return

    feed = (items(block) for block in source.blocks(stop))
    try:
        if source.size > 0 and sys.stderr.isatty():
            with Progress(transient=True) as progress:
                task = progress.add_task(f"publishing to {t.name}", total=source.size)
                return _Outcome(sow.append_blocks(
                    t, feed, fix_separator=sep, stop=lambda: stop.hit,
                    on_chunk=lambda _n: progress.update(task, completed=source.fh.tell())))
        return _Outcome(sow.append_blocks(t, feed, fix_separator=sep, stop=lambda: stop.hit))
    except PublishInterrupted as exc:  # some were appended (else the refusal is raised)
        return _Outcome(exc.result, refused=exc)


def _mark_too_large(result: PublishResult, overlong: dict[int, int], t: TopicConfig) -> None:
    """Report the over-long lines (rejected as what the reader gave in their place) as
    ``too_large``, with their size."""
    if overlong:
        result.rejected = [replace(x, reason="too_large", detail=(
            f"{overlong[x.position]} bytes > max_message_bytes {t.max_message_bytes}"))
            if x.position in overlong else x for x in result.rejected]


def _hand_off(sow: Sow, t: TopicConfig, out: _Outcome, wait: bool, timeout: float) -> None:
    """Hand what was published to the workers (with ``wait``, until they applied it), unless
    Redis refused the publish; a timeout or Ctrl-C is noted in ``out``."""
    if out.refused is not None:  # Redis refuses writes: no --wait
        out.applied = wait or sow.inline  # kept as before: "(applied)" follows --wait
        return
    try:
        sow.handoff_published(t, out.result, wait, timeout)
    except WaitTimeout as exc:
        out.timed_out = exc
    except KeyboardInterrupt:
        out.interrupted, wait = True, False
    out.applied = (wait or sow.inline) and out.timed_out is None


def _report(ctx: click.Context, t: TopicConfig, file: str, out: _Outcome, elapsed: float,
            sample: list[bytes], sep: bytes) -> None:
    """Print the counts (stderr: the rejections first) and end with the exit status."""
    result = out.result
    reasons = _report_rejected(result.rejected)
    if "bad_fix" in reasons and t.message_type == "fix":
        hint = _fix_hint(sample, sep)
        if hint:
            click.echo(hint, err=True)
    why = (" (" + ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items())) + ")") if reasons else ""
    rate = result.published / elapsed if elapsed > 0 else 0.0
    skipped = (f", skipped {result.skipped} (MsgType in skip_msg_types: "
               f"{','.join(t.skip_msg_types)})") if result.skipped else ""
    applied = " (applied)" if out.applied else ""
    click.echo(f"published {result.published} message(s) to {t.name}{skipped}, rejected "
               f"{len(result.rejected)}{why}; read {result.read} line(s); {elapsed:.2f} s, "
               f"{rate:,.0f} msg/s{applied}")
    ctx.exit(_exit_status(t, file, out))


def _exit_status(t: TopicConfig, file: str, out: _Outcome) -> int:
    """The exit status of a publish (:data:`EXIT_OK` …), after its error line on stderr."""
    result = out.result
    if out.refused is not None:
        click.echo(f"Error: Redis refused the publish after line {result.read}: "
                   f"{refusal(out.refused.cause)}; the {result.published} published message(s) "
                   "are in the transaction log and will be applied; the lines after it were "
                   "not sent", err=True)
        return EXIT_REFUSED
    if out.interrupted:
        rest = ("the rest of standard input" if out.not_sent is None
                else f"{out.not_sent} line(s) of {file}")
        click.echo(f"interrupted: appended {result.published} message(s) to the log of "
                   f"{t.name} (they will be applied), rejected {len(result.rejected)}; not sent: "
                   f"{rest} after line {result.read}", err=True)
        return EXIT_INTERRUPTED
    if out.timed_out is not None:
        click.echo(f"Error: --wait timed out: {out.timed_out}; the {result.published} published "
                   "message(s) are in the transaction log and will be applied when workers run",
                   err=True)
        return EXIT_TIMEOUT
    if result.rejected and result.published == 0:
        click.echo(f"Error: nothing was published: all {len(result.rejected)} line(s) "
                   "were rejected", err=True)
        return EXIT_ERROR
    return EXIT_REJECTED if result.rejected else EXIT_OK


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


@click.command()
@with_options(_publish_options)
@click.option("--delta", is_flag=True, help="delta_publish: merge into the stored record.")
@click.pass_context
@friendly
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


@click.command("delta-publish")
@with_options(_publish_options)
@click.pass_context
@friendly
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
