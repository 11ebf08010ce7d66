"""One apply entry point and one partition handle (issue 23, item 6).

Every change to a partition's records goes through ``lua/apply.lua`` (operations
``planned``, ``log``, ``appended``, ``load``) or the two scripts that must stay apart
(``expire.lua``; ``delete_now.lua``, flagged allow-oom); all of them read the partition's
KEYS and argument head from ``lua/include/partition.lua``, built by ``scripts.Partition``.
"""

from __future__ import annotations

import re

import pytest

from sow_redis import keys
from sow_redis.apply.scripts import (
    OP_ARGS,
    LoadStatus,
    Scripts,
    expanded_source,
    pack_load_batch,
    partition,
    script_names,
    script_source,
)
from sow_redis.client import Sow
from sow_redis.errors import ScriptArgsError
from sow_redis.publish.append import prepare
from sow_redis.registry import get_topic


def cfg(name: str, extra: str = "") -> str:
    return f'[[topic]]\nname = "{name}"\nkey = ["/id"]\npartitions = 2\n{extra}\n'


def test_every_script_that_writes_records_reads_the_one_partition_layout():
    writers = [n for n in script_names()
               if re.search(r"--@include (remove_record|write_record)", script_source(n))]
    assert writers == ["apply", "delete_now", "expire"]
    for name in writers:
        text = script_source(name)
        assert "--@include partition" in text and "partition_context()" in text, name
        body = expanded_source(name).split("local function partition_context", 1)[1]
        # no key read by position outside the one definition
        assert not re.search(r"KEYS\[\d", body.split("\nend\n", 1)[1]), name
    for part in ("apply_planned", "apply_from_log", "apply_appended", "apply_load"):
        assert f"--@include {part}" in script_source("apply")
        assert part + ".lua" not in [n + ".lua" for n in script_names()]  # no script of its own


def test_partition_handle_builds_keys_and_head_once_in_one_order(url, r, topic_name):
    sow = Sow(url)
    sow.apply_config(cfg(topic_name, 'hash_index = [["/g"]]\nexpiration = "1h"'))
    t = get_topic(r, topic_name)
    h = partition(t, 1)
    assert partition(t, 1) is h
    ks, argv = h.args("log", 7, 100, "0-0")
    assert ks == keys.partition_keys(topic_name, 1, 1)
    assert ks[11:17] == [keys.lease(topic_name, 1), keys.job_marker(topic_name, 1),
                         keys.trusted(topic_name, 1), keys.definition(topic_name, 1),
                         keys.loads(topic_name, 1), keys.load_staged(topic_name, 1)]
    assert ks[17:] == [keys.index(topic_name, 1, 0)]
    assert argv[0] == "log" and argv[OP_ARGS:] == [7, 100, "0-0"]
    assert argv[1:4] == [keys.partition_channel(topic_name, 1), topic_name, 1]
    assert argv[OP_ARGS - 1] == "0"  # change_previous off
    assert argv[OP_ARGS - 2] == t.fingerprint
    assert argv[OP_ARGS - 3] == "3600000"  # the topic's expiry of a message without one (ms)


def test_the_entry_point_refuses_an_unknown_operation(url, r, topic_name):
    Sow(url).apply_config(cfg(topic_name))
    t = get_topic(r, topic_name)
    with pytest.raises(ScriptArgsError, match="SOW_BADARGS unknown operation bogus"):
        Scripts(r).call("apply", *partition(t, 0).args("bogus"))


def test_a_load_keyed_under_a_replaced_definition_is_refused(url, r, topic_name):
    sow = Sow(url)
    sow.apply_config(cfg(topic_name))
    old = get_topic(r, topic_name)
    sow.apply_config(cfg(topic_name, 'hash_index = [["/g"]]'))  # empty: no migration
    rows = [prepare(old, ("publish", {"id": i, "g": i % 2}, None)) for i in range(4)]
    p = rows[0][0]
    batch = pack_load_batch([e for q, e in rows if q == p], [])
    scripts = Scripts(r)
    got = scripts.apply_load(old, p, "L1", 1, 0, 0, True, batch, 10)
    assert got.status == LoadStatus.DEFINITION_CHANGED and got.applied == 0
    assert r.xlen(keys.log(topic_name, p)) == 0
    new = get_topic(r, topic_name)  # keyed again under it (index members): applied
    again = [prepare(new, ("publish", {"id": i, "g": i % 2}, None)) for i in range(4)]
    batch = pack_load_batch([e for q, e in again if q == p], [])
    got = scripts.apply_load(new, p, "L2", 1, 0, 0, True, batch, 10)
    assert got.status == LoadStatus.APPLIED
    assert got.applied == sum(1 for q, _e in rows if q == p)
