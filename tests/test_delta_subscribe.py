"""Delta subscriptions (issue 26.2; AMPS delta_subscribe, sow_and_delta_subscribe): after the
initial records, an update carries the SOW key and only the fields that changed, removed
fields as JSON Pointers; a subscriber that applies the deltas ends with exactly the SOW."""

from __future__ import annotations

import random
import subprocess
import sys
import threading

import orjson
import pytest

from sow_redis.client import Sow
from sow_redis.errors import ConfigError
from sow_redis.model.delta import apply_delta, delta_of
from conftest import cli_env, run_cli


def _config(name: str, previous: bool = True, partitions: int = 4) -> str:
    text = f'[[topic]]\nname = "{name}"\nkey = ["/k"]\npartitions = {partitions}\n'
    return text + ("change_previous = true\n" if previous else "")


def test_delta_of_and_apply_delta_round_trip():
    old = {"k": 1, "px": 10, "order": {"qty": 5, "side": "B", "tags": ["a"]}, "gone": 1,
           "a/b": {"~x": 1}}
    new = {"k": 1, "px": 10.5, "order": {"qty": 5, "side": "S", "tags": ["a", "b"]},
           "extra": None, "a/b": {}}
    changed, removed = delta_of(old, new)
    assert changed == {"px": 10.5, "order": {"side": "S", "tags": ["a", "b"]}, "extra": None}
    assert sorted(removed) == ["/a~1b/~0x", "/gone"]
    assert apply_delta(old, changed, removed) == new
    assert old["a/b"] == {"~x": 1}  # inputs unchanged
    assert delta_of(new, new) == ({}, [])
    assert delta_of({"v": 1}, {"v": True}) == ({"v": True}, [])  # JSON true is not 1


def test_a_delta_subscriber_applying_deltas_ends_with_the_sow(sow, topic_name):
    """Concurrent publish, delta_publish and sow_delete on 4 partitions while a
    sow_and_subscribe --delta subscriber folds what it receives into its own copy."""
    sow.apply_config(_config(topic_name))
    rng = random.Random(7)
    operations = 150 if sow.url.startswith("memory://") else 600  # fakeredis's Lua: slower

    def record(k: int) -> dict:
        rec = {"k": k, "px": rng.randint(1, 5), "qty": rng.randint(1, 1000),
               "venue": rng.choice(["X", "Y"]),
               "book": {"bid": rng.randint(1, 9), "ask": rng.randint(1, 9)}}
        if rng.random() < 0.3:
            rec["note"] = "n" * rng.randint(1, 30)
        return rec

    sow.publish(topic_name, [record(k) for k in range(40)])
    mine: dict[str, dict] = {}
    sent = delta_bytes = full_bytes = 0
    with sow.sow_and_subscribe(topic_name, oof=True, delta=True) as sub:
        def publisher() -> None:
            for _ in range(operations):
                k = rng.randrange(60)
                roll = rng.random()
                if roll < 0.45:
                    sow.publish(topic_name, record(k))
                elif roll < 0.9:
                    sow.delta_publish(topic_name, {"k": k, "qty": rng.randint(1, 1000),
                                                   "book": {"bid": rng.randint(1, 9)}})
                else:
                    sow.sow_delete(topic_name, f"/k = {k}")

        worker = threading.Thread(target=publisher)
        worker.start()
        while True:
            msg = sub.get(2.0)
            if msg is None:
                if not worker.is_alive():
                    break
                continue
            key = msg.get("sow_key")
            if msg["kind"] == "sow":
                mine[key] = msg["data"]
            elif msg["kind"] == "publish" and msg.get("delta"):
                assert key in mine, msg
                before = mine[key]
                mine[key] = apply_delta(before, msg["data"], msg.get("removed", []))
                delta_bytes += len(orjson.dumps([msg["data"], msg.get("removed", [])]))
                full_bytes += len(orjson.dumps(mine[key]))
                sent += 1
            elif msg["kind"] == "publish":
                mine[key] = msg["data"]
            elif msg["kind"] == "oof":
                mine.pop(key, None)
        worker.join()
    sow_now = {rec.sow_key: rec.obj() for rec in sow.sow(topic_name)}
    assert mine == sow_now
    assert sent > operations // 3, sent
    print(f"\n{sent} delta updates: {delta_bytes} bytes of deltas against {full_bytes} of "
          f"whole records ({1 - delta_bytes / full_bytes:.0%} saved)")
    assert delta_bytes < full_bytes


def test_delta_updates_are_only_for_records_the_subscriber_holds(sow, topic_name):
    """A record that enters the filter comes whole; an update that changes nothing is not
    sent; a record that leaves it is an out-of-focus notice."""
    sow.apply_config(_config(topic_name, partitions=1))
    sow.publish(topic_name, {"k": 1, "v": 1, "s": "a"})
    with sow.subscribe(topic_name, "/v > 5", oof=True, delta=True) as sub:
        sow.publish(topic_name, {"k": 1, "v": 6, "s": "a"})  # enters: whole
        sow.publish(topic_name, {"k": 1, "v": 6, "s": "a"})  # unchanged: nothing
        sow.delta_publish(topic_name, {"k": 1, "s": "b"})    # a delta
        sow.publish(topic_name, {"k": 1, "v": 7})            # a delta with a removal
        sow.publish(topic_name, {"k": 1, "v": 2})            # leaves: oof
        got = [sub.get(10) for _ in range(4)]
        assert sub.get(0.3) is None
    assert [(m["kind"], m.get("delta"), m["data"], m.get("removed")) for m in got] == [
        ("publish", None, {"k": 1, "v": 6, "s": "a"}, None),
        ("publish", True, {"s": "b"}, None),
        ("publish", True, {"v": 7}, ["/s"]),
        ("oof", None, {"k": 1, "v": 2}, None),
    ]


def test_delta_needs_the_previous_state(sow, topic_name, url, plane):
    sow.apply_config(_config(topic_name, previous=False))
    with pytest.raises(ConfigError, match="change_previous = true"):
        sow.subscribe(topic_name, delta=True)
    if plane == "cluster":
        return  # the CLI's one line: on the server plane
    Sow(url).apply_config(_config(topic_name, previous=False))
    out = run_cli(url, "subscribe", "-t", topic_name, "--delta", "--count", "1", check=False)
    err = out.stderr.decode().strip().splitlines()
    assert out.returncode != 0 and len(err) == 1 and "change_previous = true" in err[0], err


def test_cli_sow_and_delta_subscribe_prints_only_what_changed(topic_name, url):
    sow = Sow(url)
    sow.apply_config(_config(topic_name))
    sow.publish(topic_name, {"k": 1, "px": 10, "o": {"a": 1, "b": 2}, "gone": True},
                wait=True)
    proc = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "sow-and-subscribe", "-t",
                             topic_name, "--delta", "--count", "3", "--timeout", "30"],
                            env=cli_env(url), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stderr.readline()  # live: the query part is read and the channels subscribed
        sow.publish(topic_name, {"k": 1, "px": 11, "o": {"a": 1, "b": 2}}, wait=True)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    first, end, update = map(orjson.loads, out.splitlines())
    assert (first["kind"], first["data"]) == ("sow", {"k": 1, "px": 10, "o": {"a": 1, "b": 2},
                                                      "gone": True})
    assert end["kind"] == "group_end" and end["count"] == 1
    assert (update["kind"], update["delta"], update["data"], update["removed"]) == (
        "publish", True, {"px": 11}, ["/gone"])
