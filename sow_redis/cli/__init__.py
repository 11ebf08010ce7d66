"""``sow-redis``: the command line. Thin: each command parses its options, calls the library
(mostly the :class:`~sow_redis.client.Sow` facade) and turns library errors into one-line
messages (:mod:`.common`). The commands live in modules by group: :mod:`.config_cmds`,
:mod:`.publishing`, :mod:`.queries`, :mod:`.subscriptions`, :mod:`.ops`, :mod:`.processes`,
:mod:`.spark`."""

from __future__ import annotations

from . import interrupt

interrupt.hold()  # Ctrl-C during the imports below: the command raises it when it starts

import click  # noqa: E402

from ..settings import DEFAULT_CONFIG_PATH, DEFAULT_REDIS_URL, Settings  # noqa: E402
from . import config_cmds, ops, processes, publishing, queries, spark, subscriptions  # noqa: E402
from .common import Main  # noqa: E402

__all__ = ["main"]


@click.group(cls=Main, context_settings={"help_option_names": ["-h", "--help"]})
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
    if interrupt.release():  # Ctrl-C came while the modules were imported: Main ends it
        raise KeyboardInterrupt
    from ..logs import setup  # start-up time: not for --help

    setup(json=log_json, level=log_level)
    ctx.obj = {"settings": Settings.from_env(redis_url=redis_url, config_path=config_path,
                                             control_url=control_url or None)}



for _command in (
    config_cmds.config,
    publishing.publish, publishing.delta_publish,
    queries.sow, queries.sow_delete, queries.errors, queries.chains, queries.keys_cmd,
    queries.rebuild,
    subscriptions.subscribe, subscriptions.sow_and_subscribe, subscriptions.bookmarks,
    ops.status, ops.stats, ops.metrics,
    processes.worker, processes.expirer, processes.derive, processes.up, processes.down,
    processes.dashboard,
    spark.spark,
):
    main.add_command(_command)
