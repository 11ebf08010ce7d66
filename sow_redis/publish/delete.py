"""``sow_delete`` by filter or by SOW keys: one log entry per partition (a delete by data is a
message like any other: :func:`~sow_redis.publish.append.append`)."""

from __future__ import annotations

from redis.exceptions import NoPermissionError, ResponseError

from .. import keys
from ..apply.scripts import scripts_of
from ..connection import Client, Fields
from ..model.topic import TopicConfig
from .result import PublishResult, interrupted
from .through import fake_redis_class


def append_delete_all_partitions(r: Client, topic: TopicConfig, fields: Fields,
                                 partitions: list[int] | None = None) -> dict[int, str]:
    """Append a ``sow_delete`` by filter or by SOW keys to every partition's log (or to
    ``partitions`` only: those that can hold the records it removes,
    :func:`sow_redis.query.sow.filter_partitions`, :func:`~sow_redis.query.sow.key_partitions`).

    A delete by SOW keys is appended and applied in one call where the partition is caught
    up (``delete_now.lua``; a write-through for deletes), also when Redis is out of memory
    (``maxmemory`` under ``noeviction`` refuses every plain append; the script is flagged
    ``allow-oom``): deleting records is how a user frees memory. The other partitions, a
    client that may not run scripts and ``memory://`` get a plain append for the workers.

    Returns:
        partition → stream id of the delete command.

    Raises:
        PublishInterrupted: Redis refused the append of some partition (out of memory with
            unapplied entries waiting there, or for a delete by filter, which needs the
            workers; read-only, …): its ``result.last_ids`` has the partitions done; the
            refusal itself when no partition was done.
    """
    entry: Fields = {"cmd": "sow_delete", **fields}
    out: dict[int, str] = {}
    targets = range(topic.partitions) if partitions is None else partitions
    if "keys" in fields and not isinstance(r, fake_redis_class()):
        scripts = scripts_of(r)
        sow_keys = str(fields["keys"]).split(",")
        try:
            for p in targets:
                done = scripts.delete_now(topic, p, entry, sow_keys)
                if done is not None:
                    out[p] = done[1]
        except NoPermissionError:  # e.g. the ACL publisher role: no scripts
            pass
    rest = [p for p in targets if p not in out]
    pipe = r.pipeline(transaction=False)
    for p in rest:
        pipe.xadd(keys.log(topic.name, p), entry)
    refused: Exception | None = None
    for p, sid in zip(rest, pipe.execute(raise_on_error=False)):
        if isinstance(sid, Exception):
            if not isinstance(sid, ResponseError):
                raise sid
            refused = refused or sid
            continue
        out[p] = sid.decode() if isinstance(sid, bytes) else sid
    if refused is not None:
        raise interrupted(PublishResult(published=len(out), last_ids=out), refused)
    return out
