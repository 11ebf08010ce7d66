"""Spark where users outgrow one machine (issue 28): the Spark standalone cluster of the test
run (conftest's ``spark_standalone`` and ``spark``: a master and two workers of 1 core and
1 GB, executors whose Python cannot import this checkout, the package shipped as a zip), a
Redis Cluster as the load's target (tasks grouped by slot owner, a primary killed during a
``durable`` load), and ``spark shell`` (one session for several commands, the start-up time in
each summary). The CLI tests run in subprocesses on ``local[*]``-style masters (``local[2]``):
the standalone cluster's cores belong to the test run's session."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
from conftest import (
    ROOT,
    SHARED,
    SPARK_TEST_MASTER,
    _own_cluster,
    client,
    first_flights,
    run_cli,
)

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.publish.append import append

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")
pytestmark = [pytest.mark.spark,
              pytest.mark.skipif(shutil.which("java") is None, reason="no Java runtime")]

N_ROWS = 6000


@pytest.fixture(scope="module")
def flights(tmp_path_factory) -> Path:
    """The first ``N_ROWS`` NYC flights as JSON Lines."""
    return first_flights(tmp_path_factory, N_ROWS)


def _cfg(name: str, partitions: int = 6) -> str:
    return (f'[[topic]]\nname = "{name}"\nkey = ["/tailnum"]\nkey_domain = "flights"\n'
            f'hash_index = [["/carrier"]]\npartitions = {partitions}\n')


def _records(sow: Sow, topic: str) -> dict[str, dict]:
    return {r.sow_key: r.obj() for r in sow.sow(topic)}


def _publish(sow: Sow, topic: str, path: Path, cmd: str = "publish",
             sep: bytes | None = None) -> object:
    lines = path.read_bytes().splitlines()
    pub = append(sow.r, sow.topic(topic), ((cmd, ln, None) for ln in lines), fix_separator=sep)
    sow.handoff(topic, pub.last_ids)
    return pub


def _seq_sum(r, topic: str, partitions: int) -> int:
    return sum(int(r.hget(keys.state(topic, p), "seq") or 0) for p in range(partitions))


def test_executors_import_the_shipped_package_not_the_checkout(spark):
    """On the standalone cluster: two executors (one per worker), and in each the
    ``sow_redis`` the tasks import is the shipped zip, never this checkout; the same task
    code runs there (a key computed in an executor equals the driver's)."""
    if SPARK_TEST_MASTER == "local":
        pytest.skip("SOW_TEST_SPARK=local: no executors of their own")
    sc = spark.sparkContext
    assert sc.master.startswith("spark://127.0.0.1:")

    def where(_i):
        import sow_redis
        from sow_redis.model.sowkey import generate

        try:
            import sow_redis.cli  # the whole package is there
            whole = True
        except ImportError:
            whole = False
        yield (os.getpid(), sow_redis.__file__, sys.flags.no_site, whole,
               generate("flights", ["N14228"]))

    got = sc.parallelize(range(4), 4).mapPartitionsWithIndex(lambda i, it: where(i)).collect()
    executors = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # less the driver
    from sow_redis.model.sowkey import generate

    print(executors, got)
    assert executors == 2
    assert all(re.search(r"/sow_redis-[0-9a-f]{16}\.zip/sow_redis/__init__\.py$", f)
               for _pid, f, _s, _w, _k in got)
    assert not any(f.startswith(str(ROOT)) for _pid, f, _s, _w, _k in got)
    assert all(no_site == 1 and whole for _pid, _f, no_site, whole, _k in got)
    assert {k for *_x, k in got} == {generate("flights", ["N14228"])}


def test_slot_owner_grouping_writes_each_primary_from_one_task(spark, redis_cluster,
                                                               topic_name, flights):
    """On the Redis Cluster: the load gives, record by record, the SOW of publish (and the
    same error-stream rejections); each write task sends its EVALSHAs to one primary only
    (the one owning its partitions' slots), checked with each primary's
    ``cmdstat_evalsha`` around a task run by hand."""
    from sow_redis.spark.load import load, prepare_rows, slot_owners, write_owned

    url, control, cluster = redis_cluster
    sow = Sow(url, inline=True, control_url=control)
    loaded, published = topic_name + "_spark", topic_name + "_cli"
    sow.apply_config(_cfg(loaded) + _cfg(published))
    res = load(spark, url, sow.topic(loaded), [str(flights)], batch_size=500)
    pub = _publish(sow, published, flights)
    a, b = _records(sow, loaded), _records(sow, published)
    print(res, pub.published, len(a))
    assert res.rows == N_ROWS and res.appended == pub.published == res.applied
    assert res.rejected == len(pub.rejected) == len(sow.errors(loaded, count=10_000))
    assert a == b and len(a) > 1000
    assert _seq_sum(sow.r, loaded, 6) == res.appended  # applied once each
    # the grouping: partitions → primaries as CLUSTER SLOTS says, and a task of one primary
    owner = slot_owners(url, loaded, 6)
    nodes = sorted({sow.r.get_node_from_key(keys.log(loaded, p)).name for p in range(6)})
    assert sorted(set(owner.values())) == list(range(len(nodes))) and len(nodes) >= 2
    assert all(nodes[owner[p]] == sow.r.get_node_from_key(keys.log(loaded, p)).name
               for p in range(6))
    t = sow.topic(loaded)
    lines = flights.read_bytes().splitlines()
    rows = [(p, row) for p, row in prepare_rows(t.to_json(), ((ln, i) for i, ln in
                                                              enumerate(lines)))
            if p >= 0 and owner[p] == 0]
    primaries = {f"127.0.0.1:{port}": client(f"redis://127.0.0.1:{port}/0")
                 for port in cluster.ports}

    def evalshas() -> dict[str, int]:
        out = {}
        for name, c in primaries.items():
            if c.info("replication")["role"] == "master":
                out[name] = c.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        return out

    before = evalshas()
    got = list(write_owned(url, t.to_json(), "by-hand", 500, True, iter(rows)))
    after = evalshas()
    busy = {n for n in after if after[n] > before.get(n, 0)}
    print(got, busy, nodes[0])
    assert got[0]["appended"] == len([r for r in rows if r[1][1] is not None]) > 0
    assert busy == {nodes[0]}


def test_durable_load_survives_a_killed_primary(spark, tmp_path, topic_name, flights):
    """A cluster of its own (3 primaries, two replicas each): a ``durable`` load while the
    primary of some of the topic's partitions is killed (-9) after its first batches: the
    load completes; the records equal publish's; the log holds each entry once and every
    partition's change sequence counts each once (nothing applied twice, nothing lost); the
    load's position in every partition is its end."""
    gen = _own_cluster(tmp_path, replicas=2)
    url, control, cluster = next(gen)
    try:
        from sow_redis.spark.load import load

        sow = Sow(url, inline=True, control_url=control)
        loaded, published = topic_name + "_spark", topic_name + "_cli"
        sow.apply_config(_cfg(loaded) + _cfg(published))
        t = sow.topic(loaded)
        first = int(url.rsplit(":", 1)[1])
        owner = {p: sow.r.get_node_from_key(keys.log(loaded, p)).port for p in range(6)}
        victim = next(port for port in sorted(set(owner.values())) if port != first)
        vparts = [p for p in range(6) if owner[p] == victim]
        done: dict[str, object] = {}

        def run() -> None:
            try:
                done["res"] = load(spark, url, t, [str(flights)], batch_size=100,
                                   durable=True, load_id="fo")
            except BaseException as exc:  # reported by the test's thread
                done["error"] = exc

        th = threading.Thread(target=run)
        th.start()
        victim_client = client(f"redis://127.0.0.1:{victim}/0")
        deadline = time.monotonic() + 120

        def position() -> tuple[int, int]:
            pos = victim_client.hget(keys.loads(loaded, vparts[0]), "fo") or b"0:0"
            split, batch = pos.decode().split(":")
            return int(split), int(batch)

        while time.monotonic() < deadline and th.is_alive() and position() < (0, 2):
            time.sleep(0.01)
        at_kill = position()
        cluster.procs[victim].send_signal(signal.SIGKILL)
        cluster.procs[victim].wait(timeout=10)
        th.join(timeout=240)
        assert not th.is_alive(), "the load did not end within 240 s"
        if "error" in done:
            raise done["error"]  # type: ignore[misc]
        res = done["res"]
        sow = Sow(url, inline=True, control_url=control)  # a fresh slot map
        pub = _publish(sow, published, flights)
        a, b = _records(sow, loaded), _records(sow, published)
        ends = {p: sow.r.hget(keys.loads(loaded, p), "fo") for p in range(6)}
        entries = sum(sow.r.xlen(keys.log(loaded, p)) for p in range(6))
        print(f"victim {victim} (partitions {vparts}) killed at position {at_kill} of "
              f"partition {vparts[0]}; {res}; positions {ends}; log entries {entries}")
        assert at_kill[0] == 0 and at_kill[1] >= 2  # killed in the middle of the load
        assert set(ends.values()) == {b"1:0"}
        assert res.rows == N_ROWS
        assert entries == pub.published == _seq_sum(sow.r, loaded, 6)
        assert a == b and len(a) > 1000
    finally:
        for _ in gen:
            pass


def test_cli_spark_shell_on_the_cluster_one_session_for_load_export_sql_archive_rebuild(
        redis_cluster, topic_name, flights, tmp_path):
    """``spark shell`` on ``local[2]`` against the Redis Cluster (rq on --control-url):
    Spark starts once (its start-up time in the shell's first line), and every command of
    the script says ``Spark session reused``: load (the flights), load --delta of the FIX
    logs into a chaining topic, stream --once of a folder of two daily files, export, sql,
    archive, rebuild, a failing command (one line, the next one runs, exit status 1)."""
    url, control, _c = redis_cluster
    sow = Sow(url, inline=True, control_url=control)
    fix_cfg = (ROOT / "examples" / "fix_orders.toml").read_text()
    fix_name = re.search(r'name = "([^"]+)"', fix_cfg).group(1)
    fix_topic = topic_name + "_fix"
    streamed = topic_name + "_s"
    sow.apply_config(_cfg(topic_name) + _cfg(streamed, 3) + fix_cfg.replace(
        f'name = "{fix_name}"', f'name = "{fix_topic}"'))
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    lines = flights.read_bytes().splitlines()
    for day, part in enumerate((lines[:1500], lines[1500:3000])):
        (inbox / f"day{day}.jsonl").write_bytes(b"\n".join(part) + b"\n")
        os.utime(inbox / f"day{day}.jsonl", (1e9 + day, 1e9 + day))
    logs = [x for x in sorted((SHARED / "data" / "fix").glob("*")) if x.suffix != ".md"]
    logs.sort(key=lambda x: not x.name.startswith("Ireach"))
    snap, arch = tmp_path / "snap", tmp_path / "arch"
    view = re.sub(r"[^A-Za-z0-9_]", "_", topic_name)
    script = [f"load -t {topic_name} {flights}"]
    for log in logs:
        sep = " --separator ';'" if log.name.startswith("Ireach") else ""
        script.append(f"load -t {fix_topic} --delta --format fix{sep} '{log}'")
    script += [f"stream -t {streamed} {inbox} --once --checkpoint {tmp_path / 'cp'}",
               f"export -t {topic_name} {snap}",
               f'sql "SELECT count(*) AS n FROM {view}"',
               "load -t nosuch_topic " + str(flights),
               f"archive -t {topic_name} {arch}",
               f"rebuild -t {topic_name} --from {snap} --log {arch}"]
    out = run_cli(url, "--control-url", control, "spark", "shell", "--master", "local[2]",
                  input=("\n".join(script) + "\n").encode(), check=False, timeout=600,
                  renice=False)  # the run's longest test: at nice 10 it ended last
    stdout, stderr = out.stdout.decode(), out.stderr.decode()
    print(stdout, stderr[-3000:])
    out_lines = stdout.splitlines()
    assert out.returncode == 1
    assert re.fullmatch(r"spark shell: a session on local\[2\]; Spark start-up \d+\.\d s",
                        out_lines[0])
    summaries = [ln for ln in out_lines[1:] if "Spark session reused" in ln]
    assert len(summaries) == len(script) - 2  # all but sql (stderr) and nosuch
    assert out_lines[1].startswith(f"loaded {N_ROWS} row(s) into {topic_name}: ")
    assert [ln for ln in stderr.splitlines() if ln.startswith("Error:")] == [
        "Error: topic 'nosuch_topic' is not defined in the registry (run: sow-redis config "
        "apply FILE)"]
    assert re.search(r"^\d+ row\(s\); Spark session reused$", stderr, re.M)
    n = orjson.loads(next(ln for ln in out_lines if ln.startswith('{"n"')))["n"]
    records = _records(sow, topic_name)
    assert n == len(records) > 1000
    assert any(ln.startswith(f"exported {n} record(s) of {topic_name}") for ln in out_lines)
    assert any(ln.startswith(f"rebuilt {topic_name}: restored {n} record(s)")
               for ln in out_lines)
    # the stream: two micro-batches (a file each), the SOW of each aircraft's last flight
    batches = [ln for ln in out_lines if re.match(r"batch \d+: ", ln)]
    assert len(batches) == 2 and all("rejected" in b for b in batches)
    last: dict[str, dict] = {}
    for ln in lines[:3000]:
        row = orjson.loads(ln)
        if row.get("tailnum"):
            last[row["tailnum"]] = row
    got = {r["tailnum"]: r for r in _records(sow, streamed).values()}
    assert got == last and len(got) > 500
    # the FIX delta load on the cluster equals delta-publish of the same logs
    ref = topic_name + "_fixcli"
    sow.apply_config(fix_cfg.replace(f'name = "{fix_name}"', f'name = "{ref}"'))
    for log in logs:
        _publish(sow, ref, log, "delta_publish",
                 b";" if log.name.startswith("Ireach") else None)
    fa, fb = _records(sow, fix_topic), _records(sow, ref)
    assert len(fa) > 600 and sorted(fa.values(), key=orjson.dumps) == sorted(
        fb.values(), key=orjson.dumps)
