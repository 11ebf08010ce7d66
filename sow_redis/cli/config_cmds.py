"""``sow-redis config``: validate a TOML file and store it, print what is stored, translate an
AMPS configuration (:mod:`sow_redis.config`, :mod:`sow_redis.registry`)."""

from __future__ import annotations

import click

from .common import friendly, sow_of


@click.group()
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
@friendly
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
    from ..config import ConfigError, load_file  # start-up time: tomllib, hashlib
    from ..migrate import apply_with_migration  # start-up time: redis-py
    from ..registry import apply_topics  # start-up time: redis-py

    path = file or ctx.obj["settings"].config_path
    try:
        topics = load_file(path)
        sow = sow_of(ctx)
        if migrate:
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
@friendly
def config_import_amps(file: str, output: str | None) -> None:
    """Translate the <SOW><Topic> sections of an AMPS configuration FILE into sow_redis TOML
    (Name, Key, KeyDomain, Expiration, MessageType, HashIndex, the chaining KeyGenerator with
    its Key, Primary, Secondary and Validation options);
    each element that is not translated is listed on stderr, one line each.

    \b
    Example:
      sow-redis config import-amps amps-config.xml -o sow.toml
    """
    from ..config import ConfigError, parse_topics  # start-up time: tomllib, hashlib
    from ..ops.amps_import import import_amps  # start-up time: xml.etree
    from ..ops.amps_import import to_toml as amps_toml  # start-up time

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
    if not imported.topics and not imported.derived:
        raise click.ClickException(f"{file}: no SOW topic could be translated")
    toml_text = amps_toml(imported, file)
    parse_topics(toml_text, source=f"{file} (imported)")  # what is written loads as it is
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(toml_text)
        views = (f" and {len(imported.derived)} view(s) / conflated topic(s)"
                 if imported.derived else "")
        click.echo(f"wrote {len(imported.topics)} topic(s){views} to {output}", err=True)
    else:
        click.echo(toml_text, nl=False)


@config.command("show")
@click.pass_context
@friendly
@click.option("--json", "as_json", is_flag=True, help="One JSON object per topic and line "
              "(every field, as stored) instead of TOML.")
def config_show(ctx: click.Context, as_json: bool) -> None:
    """Print the topic definitions stored in Redis as a TOML configuration that
    `config apply` accepts (fields at their default left out), by topic name.

    \b
    Example:
      sow-redis --redis-url redis://127.0.0.1:6390/0 config show > sow.toml
    """
    from ..config import to_toml  # start-up time: tomllib, hashlib
    from ..registry import load_topics  # start-up time: redis-py

    topics = sorted(load_topics(sow_of(ctx).r).values(), key=lambda t: t.name)
    if as_json:
        for t in topics:
            click.echo(t.to_json().decode())
    elif topics:
        click.echo(to_toml(topics), nl=False)
