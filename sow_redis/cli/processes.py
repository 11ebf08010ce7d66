"""``sow-redis worker``, ``expirer``, ``up``, ``down``, ``dashboard``: the processes that
apply, expire and watch (:mod:`sow_redis.ops`)."""

from __future__ import annotations

import os
import socket
import sys
import time

import click

from ..connection import connect, control_url_for, redact, tls_options
from ..ops.priority import DERIVE_NICE, lower_priority
from ..outage import connect_through_outage
from ..settings import Settings
from ..stopping import StopEvent, stop_on_signals
from .common import friendly, settings_of, sow_of


@click.command()
@click.option("--burst", is_flag=True,
              help="Drain every partition, then exit (status 1 if entries remain unapplied).")
@click.option("--name", help="Prefix of the worker name shown in rq-dashboard "
              "(the name is <prefix>-<host>-<pid>-<random>; default prefix 'sow').")
@click.pass_context
@friendly
def worker(ctx: click.Context, burst: bool, name: str | None) -> None:
    """Run a worker: applies the transaction logs (rq worker on queue 'sow').

    Run as many as the load needs, on any host. It rides out Redis outages (retries every
    0.1 s doubling to 2 s). With --burst it exits with status 1, naming topics and
    partitions, when log entries remain unapplied (e.g. another worker holds a partition).

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 worker --burst
    """
    from ..apply.jobs import unapplied_partitions  # start-up time: redis-py, rq
    from ..ops.worker import run_worker  # start-up time: redis-py, rq

    settings = settings_of(ctx)
    control = control_url_for(settings.redis_url, settings.control_url)
    started = time.monotonic()
    pending = _pending_entries(settings) if burst else 0  # fails first: one line
    click.echo(f"worker{' --burst' if burst else ''}: queue 'sow' on {redact(control)}, "
               f"applying to {redact(settings.redis_url)}"
               + ("; drains every partition, then exits" if burst else "; Ctrl-C stops it"),
               err=True)
    run_worker(settings, burst=burst, name=name)
    if burst:
        left = unapplied_partitions(connect(settings.redis_url))
        if left:
            where = "; ".join(f"{t} partitions {','.join(map(str, ps))}" for t, ps in left.items())
            raise click.ClickException(f"worker --burst: entries remain unapplied: {where}")
        click.echo(f"worker --burst: every partition applied ({pending:,} log entr"
                   f"{'y' if pending == 1 else 'ies'} waited at start); "
                   f"{time.monotonic() - started:.1f} s", err=True)


def _pending_entries(settings: Settings) -> int:
    """Log entries not yet applied, over every topic (:func:`status.topic_status`)."""
    from ..ops.status import topic_status  # start-up time: redis-py
    from ..registry import load_topics  # start-up time: redis-py

    r = connect(settings.redis_url)
    return sum(topic_status(r, t)["pending"] for t in load_topics(r).values())


@click.command()
@click.option("--burst", is_flag=True, help="Make every view and conflated topic whole now, "
              "then exit.")
@click.option("--nice", type=click.IntRange(0, 19), default=DERIVE_NICE, show_default=True,
              envvar="SOW_DERIVE_NICE",
              help="Run at this much lower CPU priority (0: as started), so the write path "
              "keeps the CPU when both compete; not with --burst (env SOW_DERIVE_NICE).")
@click.pass_context
@friendly
def derive(ctx: click.Context, burst: bool, nice: int) -> None:
    """Run the deriver: keeps every view ([[view]]) and conflated topic ([[conflated_topic]])
    from its underlying topic. Any number may run (each derived topic is served by one, under
    a lease); `up` starts one. It runs at a lower CPU priority (--nice, default 10): views
    then lag while publishers keep the machine busy, and catch up when it has room; --nice 0
    for the views' lowest latency where the write path has cores to spare.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 derive
    """
    from ..derive import Deriver  # start-up time: redis-py, rq

    if burst:
        deriver = Deriver(sow_of(ctx))
        names = deriver.burst()
        click.echo(f"derived {len(names)} topic(s){': ' if names else ''}{', '.join(names)}")
        return
    starting = StopEvent()  # started while Redis is down: wait for it (reported once)
    stop_on_signals(starting)
    sow = connect_through_outage(lambda: sow_of(ctx), starting, "deriver")
    if sow is None:
        click.echo("deriver stopped", err=True)
        return
    deriver = Deriver(sow, stop=starting, settle=True)  # a SIGTERM from here on stops it
    lower_priority(nice)
    click.echo(f"deriver on {redact(settings_of(ctx).redis_url)}: every view and conflated "
               "topic; Ctrl-C stops it", err=True)
    deriver.run()
    click.echo("deriver stopped", err=True)


@click.command()
@click.option("--burst", is_flag=True, help="Expire what is due now, then exit.")
@click.option("-t", "--topic", "topics", multiple=True,
              help="Serve only this topic (repeatable; default: every topic).")
@click.pass_context
@friendly
def expirer(ctx: click.Context, burst: bool, topics: tuple[str, ...]) -> None:
    """Run the expirer: removes due records (event reason "expired"), forwards dead letters,
    removes idle topics. Any number may run at once; `up` starts one.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 expirer
    """
    from redis.exceptions import ConnectionError as RedisConnectionError  # start-up
    from redis.exceptions import TimeoutError as RedisTimeoutError  # start-up time

    from ..expirer import run_expirer  # start-up time: redis-py, rq
    from ..registry import load_topics  # start-up time: redis-py

    settings = settings_of(ctx)
    try:  # a cluster client connects when made: within the try
        sow = sow_of(ctx)
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


@click.command()
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
@friendly
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
    from ..ops.server import (  # start-up time
        READY_TIMEOUT_S,
        redis_warnings,
        run_up,
        start_detached,
    )

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
    settings = settings_of(ctx)
    if detach:
        click.echo(start_detached(settings, workers, data_dir, apply_config=not no_config,
                                  timeout_s=READY_TIMEOUT_S if wait_ready is None
                                  else wait_ready))
        for warning in redis_warnings(settings.redis_url):  # up.log has them too
            click.echo(f"warning: {warning}", err=True)
        return
    run_up(settings, workers, data_dir, apply_config=not no_config)


@click.command()
@click.option("--data-dir", default=".sow-redis", show_default=True,
              help="The --data-dir of the `up` to stop.")
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds to wait for it to stop.")
@click.pass_context
@friendly
def down(ctx: click.Context, data_dir: str, timeout: float) -> None:
    """Stop the `sow-redis up` of --data-dir (detached or not; it must serve --redis-url):
    its workers finish their current job, the redis-server it started flushes its AOF and
    exits. Exit status 0 also when none runs; 1 when it did not stop within --timeout.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 down
    """
    from ..ops.server import stop_detached  # start-up time: redis-py, rq

    _stopped, report = stop_detached(settings_of(ctx), data_dir, timeout)
    click.echo(report)


@click.command()
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
@friendly
def dashboard(ctx: click.Context, port: int, bind: str, username: str | None,
              password: str | None) -> None:
    """Run rq-dashboard on this Redis (the --control-url one when given) to watch workers,
    the 'sow' queue and jobs, with a SOW page (/sow/) of the topics: figures, rates, lag,
    rejections, partitions and queries; it listens on 127.0.0.1 unless --bind says otherwise.

    \b
    Example (then open http://127.0.0.1:9181/):
      sow-redis --redis-url redis://127.0.0.1:6390/0 dashboard --port 9181
    """
    from redis import Redis  # start-up time: redis-py

    settings = settings_of(ctx)
    url = control_url_for(settings.redis_url, settings.control_url)  # rq lives there
    if bool(username) != bool(password):
        raise click.UsageError("give both --username and --password (or neither)")
    try:
        # start-up time: flask and rq-dashboard load for this command only (and fail here,
        # in one line, not in the child)
        import rq_dashboard.cli  # noqa: F401
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
