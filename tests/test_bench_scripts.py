"""The benchmark scripts run end to end on tiny inputs (each starts its own redis-server on a
free loopback port) and verify their own results."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], cwd=ROOT,
                          capture_output=True, timeout=timeout, check=False)


def test_bench_ingest_runs_with_real_workers(tmp_path: Path) -> None:
    # the workers' --name is a prefix of their rq name: the script must still find them
    out = tmp_path / "ingest.json"
    proc = _run("bench_ingest.py", "--n", "2000", "--keys", "500", "--partitions", "2",
                "--workers", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stdout.decode()[-2000:] + proc.stderr.decode()[-2000:]
    res = json.loads(out.read_bytes())
    assert res["verified"] is True
    run = res["sow_redis"]["1"][0]
    for phase in ("apply_backlog", "live_end_to_end"):
        assert run[phase]["verify"] == {"ok": True, "records": 500, "seq_sum": 2000,
                                        "errors": 0, "expected_records": 500,
                                        "expected_seq_sum": 2000}


def test_bench_packing_compares_packings(tmp_path: Path) -> None:
    out = tmp_path / "packing.json"
    proc = _run("bench_packing.py", "--n", "3000", "--keys", "1000", "--batches", "100,500",
                "--repeat", "1", "--packings", "flat,msgpack,msgpack-flat,flat-nowrite",
                "--json", str(out))
    assert proc.returncode == 0, proc.stdout.decode()[-2000:] + proc.stderr.decode()[-2000:]
    rows = json.loads(out.read_bytes())["best"]
    assert [(x["batch"], x["packing"]) for x in rows] == [
        (b, p) for b in (100, 500) for p in ("flat", "msgpack", "msgpack-flat", "flat-nowrite")]
    for x in rows:
        want = 1 if x["packing"] == "flat-nowrite" else 1000
        assert x["verify"] == {"ok": True, "records": want, "seq": 3000,
                               "expected_records": 1000, "expected_seq": 3000}
        assert x["calls"] == 3000 // x["batch"]


def test_bench_latency_measures_every_variant_and_the_replay(tmp_path: Path) -> None:
    out = tmp_path / "lat.json"
    proc = _run("bench_latency.py", "--rates", "500", "--seconds", "1", "--warmup", "0.2",
                "--replay-n", "3000", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    names = [row["variant"] for row in data["rows"]]
    print(names, data["replay"])
    assert names[:3] == ["raw pub/sub", "subscribe", "sow_and_subscribe"]
    assert all(row["received"] == row["sent"] == 500 for row in data["rows"])
    assert data["replay"]["events"] == 3000
    assert "p99 ÷ raw" in proc.stdout.decode()


def test_bench_latency_repeats_in_interleaved_rounds_and_reports_medians(tmp_path: Path) -> None:
    out = tmp_path / "lat.json"
    proc = _run("bench_latency.py", "--rates", "500", "--seconds", "1", "--warmup", "0.2",
                "--replay-n", "0", "--no-nats", "--variants", "subscribe", "--repeat", "2",
                "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert [(r["variant"], r["round"]) for r in data["rows"]] == [
        ("raw pub/sub", 1), ("subscribe", 1), ("raw pub/sub", 2), ("subscribe", 2)]
    med = {m["variant"]: m for m in data["medians"]}
    sub = [r for r in data["rows"] if r["variant"] == "subscribe"]
    raw = [r for r in data["rows"] if r["variant"] == "raw pub/sub"]
    assert med["subscribe"]["p99_ms"] == (sub[0]["p99_ms"] + sub[1]["p99_ms"]) / 2
    assert med["subscribe"]["p99_vs_raw"] == med["subscribe"]["p99_ms"] / (
        (raw[0]["p99_ms"] + raw[1]["p99_ms"]) / 2)
    assert len(med["subscribe"]["p99_vs_raw_rounds"]) == 2
    assert "medians over 2 interleaved rounds" in proc.stdout.decode()


@pytest.mark.spark
def test_bench_spark_compares_the_load_with_the_cli_path(tmp_path: Path) -> None:
    import shutil

    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    if shutil.which("java") is None:
        pytest.skip("no Java runtime")
    src = tmp_path / "flights.jsonl"
    rows = [{"tailnum": f"N{i % 300}", "carrier": "AB"[i % 2], "origin": "XYZ"[i % 3],
             "dep_delay": i % 17} for i in range(3000)]
    rows[7] = {"carrier": "A", "origin": "X"}  # no tailnum: rejected on both paths
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "spark.json"
    proc = _run("bench_spark.py", "--input", str(src), "--partitions", "2", "--workers", "1",
                "--master", "local[2]", "--runs", "2", "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout.decode()[-2000:] + proc.stderr.decode()[-2000:]
    res = json.loads(out.read_bytes())
    print(res["median"], res["spark_start"], res["load_averages"])
    assert res["verified"] is True and len(res["verify"]) == 2 and len(res["load_averages"]) == 2
    assert all(v["records"] == v["records_spark"] == 300 and v["cli_rejected"] == 1
               for v in res["verify"])
    for run in res["runs"]["spark"]:
        assert run["result"]["rejected"] == 1
        assert run["result"]["appended"] == run["result"]["applied"] == 2999
    assert res["spark_start"]["session_s"] > 0 and res["spark_start"]["first_job_s"] > 0
    # each path's CPU: at least what Redis alone used (to the clock tick); per 1,000 rows by
    # process group, the groups summing to "all"
    for path in ("cli", "spark"):
        for run in res["runs"][path]:
            assert run["machine_cpu_s"] >= run["redis_cpu_s"] - 0.05 > -0.05
            assert all(v >= 0.01 for v in run["cpu_by_process"].values())
        per = res["median"][path]["cpu_per_1000_rows"]
        assert per["all"] > 0 and len(res["median"][path]["seconds_each"]) == 2
    # the load's Spark processes do its work; on the CLI path they only idle
    spark, cli = res["median"]["spark"]["cpu_per_1000_rows"], res["median"]["cli"]["cpu_per_1000_rows"]
    assert spark.get("spark python workers", 0) > 0 and "spark JVM" in spark
    assert cli.get("spark python workers", 0) + cli.get("spark JVM", 0) < 0.2 * cli["all"]
    assert res["ratios"]["wall"] == pytest.approx(res["median"]["spark"]["seconds"]
                                                  / res["median"]["cli"]["seconds"])
    assert "CPU per row" in proc.stdout.decode()
    bound = res["apply_bound"]  # the same 2,999 messages applied again, by the workers
    print(bound)
    assert bound["appended"] == 2999 and bound["redis_cpu_s"] > 0
    assert 0 < bound["log_read_cpu_s"] < bound["redis_cpu_s"]
    assert bound["apply_cpu_s"] == pytest.approx(bound["redis_cpu_s"] - bound["log_read_cpu_s"])


@pytest.mark.cluster
def test_bench_scale_runs_on_a_server_and_a_cluster(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    proc = _run("bench_scale.py", "--n", "2000", "--keys", "500", "--partitions", "6",
                "--workers", "1,2", "--target", "0", "--json", str(out), timeout=240)
    assert proc.returncode == 0, proc.stdout.decode()[-2000:] + proc.stderr.decode()[-2000:]
    res = json.loads(out.read_bytes())
    assert [(r["plane"], r["workers"]) for r in res["runs"]] == [
        ("server", 1), ("server", 2), ("cluster", 1), ("cluster", 2)]
    for run in res["runs"]:
        assert run["verify"] == {"ok": True, "records": 500, "seq_sum": 2000, "errors": 0,
                                 "expected_records": 500, "expected_seq_sum": 2000}
        assert run["applied_per_s"] > 0
    assert res["check"]["ok"] is True and res["check"]["target"] == 0


def test_split_daily_writes_each_day_in_order_with_increasing_times(tmp_path: Path) -> None:
    src = tmp_path / "flights.jsonl"
    rows = [{"year": 2013, "month": 1, "day": 2, "i": 0}, {"year": 2013, "month": 1, "day": 1,
                                                           "i": 1},
            {"year": 2013, "month": 1, "day": 2, "i": 2}, {"year": 2013, "month": 2, "day": 1,
                                                           "i": 3}]
    src.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows) + b'{"i": 4}\n')
    out = tmp_path / "daily"
    proc = _run("split_daily.py", str(src), str(out))
    assert proc.returncode == 1 and b":5: no year/month/day" in proc.stderr, proc.stderr
    files = sorted(out.iterdir())
    assert [f.name for f in files] == ["2013-01-01.jsonl", "2013-01-02.jsonl", "2013-02-01.jsonl"]
    assert [[json.loads(x)["i"] for x in f.read_text().splitlines()] for f in files] == [
        [1], [0, 2], [3]]
    times = [f.stat().st_mtime for f in files]
    assert times == sorted(times) and len(set(times)) == 3  # Spark takes them in this order


def test_bench_rebuild_compares_the_rebuild_with_the_first_apply(tmp_path: Path) -> None:
    out = tmp_path / "rebuild.json"
    proc = _run("bench_rebuild.py", "--n", "3000", "--keys", "500", "--partitions", "2",
                "--runs", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stdout.decode()[-2000:] + proc.stderr.decode()[-2000:]
    res = json.loads(out.read_bytes())
    assert set(res["medians"]) == {"apply", "rebuild"}
    assert all(v["entries_per_s"] > 0 for v in res["medians"].values())
    assert res["log_bytes_per_entry"] > 0


def test_bench_query_compares_the_range_index_with_a_scan(tmp_path: Path) -> None:
    out = tmp_path / "query.json"
    proc = _run("bench_query.py", "--n", "2000", "--runs", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stdout.decode()[-2000:] + proc.stderr.decode()[-2000:]
    res = json.loads(out.read_bytes())
    assert set(res["ingest"]["medians"]) == {"none", "1 index", "2 indexes", "1 hash index"}
    alone = res["ingest_redis_alone"]  # the replay checked records, seqs and errors itself
    assert set(alone) == set(res["ingest"]["medians"]) and alone["none"]["redis_cpu_vs_none"] == 1
    assert all(len(v["runs"]) == 1 and v["redis_us_per_msg"] > 0 for v in alone.values())
    updates = res["ingest_updates"]  # the script checked records, 2N seqs and no error
    assert set(updates) == {"px kept", "px moved"}
    for kind in updates.values():
        assert set(kind["medians"]) == {"none", "1 index"}
        assert kind["medians"]["none"]["redis_cpu_vs_none"] == 1
        assert all(len(rs) == 1 and rs[0]["redis_us_per_msg"] > 0 for rs in kind["runs"].values())
    assert [row["selectivity"] for row in res["query"]] == [0.001, 0.01, 0.1, 0.5, 0.9]
    planner = [row["planner"] for row in res["query"]]
    assert planner == ["range_index"] * 4 + ["scan"]
    for row in res["query"]:  # the script checked index and scan returned the same records
        assert row["plan"].startswith("index /px range") and row["index_ms"] > 0
    assert [row["skip_n"] for row in res["paging"]] == [0, 200, 1800]
    assert res["memory"]["index_bytes_per_record"] > 0


def test_bench_view_inapply_measures_each_variant(tmp_path: Path) -> None:
    """The in-apply prototype runs on every variant; the script checked each run's records
    and the groups' counts itself (issue 26.4: the deriver against a view in the apply)."""
    res, stdout = _results("bench_view_inapply.py", tmp_path / "inapply.json", "--n", "4000",
                           "--keys", "1000", "--runs", "1")
    medians = res["medians"]
    assert list(medians) == ["publish alone", "in apply: COUNT, SUM, AVG",
                             "in apply: and MIN, MAX"]
    assert medians["publish alone"]["redis_cpu_vs_alone"] == 1
    # the prototype's work shows in Redis: more CPU per message than the publish alone
    assert all(m["redis_us_per_msg"] > medians["publish alone"]["redis_us_per_msg"]
               for name, m in medians.items() if name != "publish alone")
    assert all(len(rs) == 1 for rs in res["runs"].values())
    assert "in apply: and MIN, MAX" in stdout


def _results(script: str, out: Path, *args: str) -> tuple[dict, str]:
    """Run a benchmark script that must succeed; its JSON (written to ``out``) and stdout."""
    proc = _run(script, *args, "--json", str(out))
    assert proc.returncode == 0, proc.stdout.decode()[-2000:] + proc.stderr.decode()[-2000:]
    return json.loads(out.read_bytes()), proc.stdout.decode()


def test_bench_apply_call_compares_two_revisions_of_the_script(tmp_path: Path) -> None:
    res, text = _results("bench_apply_call.py", tmp_path / "apply_call.json", "--base", "HEAD",
                         "--sizes", "1,5", "--rounds", "2", "--calls", "50")
    assert [r["messages"] for r in res["results"]] == [1, 5]
    for r in res["results"]:
        assert len(r["rounds"]["base"]) == len(r["rounds"]["tree"]) == 2
        assert r["base_us"] > 0 and r["tree_us"] > 0
        assert r["ratio"] == pytest.approx(r["tree_us"] / r["base_us"])
    assert "tree/base" in text and "load average" in text
    bad = _run("bench_apply_call.py", "--base", "no-such-revision", "--sizes", "1",
               "--json", str(tmp_path / "bad.json"))
    assert bad.returncode != 0 and b"git show no-such-revision" in bad.stderr


def _head_tree(folder: Path) -> Path:
    """``folder`` holding HEAD's ``sow_redis`` (another tree for a benchmark's ``--against``)."""
    folder.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD", "sow_redis"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def test_bench_deriver_replays_the_changes_through_two_trees(tmp_path: Path) -> None:
    old = _head_tree(tmp_path / "old")
    res, text = _results("bench_deriver.py", tmp_path / "deriver.json", "--n", "1500",
                         "--runs", "1", "--against", str(old))
    assert [r["tree"] for r in res["results"]] == [str(ROOT), str(old)]
    assert res["machine"]["cpu_count"] and res["options"]["n"] == 1500
    for r in res["results"]:
        assert 0 < r["parse_us"] < r["all_us"] and r["subscriber_us"] > 0
        assert len(r["all_us_runs"]) == 1
    assert "captured" in text and "load average" in text
    bad = _run("bench_deriver.py", "--n", "10", "--against", str(tmp_path),
               "--json", str(tmp_path / "bad.json"))
    assert bad.returncode != 0 and b"holds no sow_redis" in bad.stderr


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (callgrind)")
def test_bench_instructions_counts_the_tree_it_is_given(tmp_path: Path) -> None:
    """``--against`` measures the other tree (the workload once imported this checkout's
    sow_redis for both: it ran in the project folder, first on the path); ``--topic-extra``
    reaches the workload's topic."""
    old = _head_tree(tmp_path / "old")
    out = tmp_path / "bi.json"
    proc = _run("bench_instructions.py", "--n", "120", "--workloads", "redis write-through",
                "--topic-extra", 'index = ["/v"]', "--against", str(old), "--json", str(out),
                timeout=600)
    assert proc.returncode == 0, proc.stdout.decode()[-2000:] + proc.stderr.decode()[-2000:]
    res = json.loads(out.read_bytes())
    assert res["topic_extra"] == 'index = ["/v"]' and res["against"] == str(old)
    [row] = res["rows"]
    assert row["workload"] == "redis write-through"
    assert row["this tree"] > 0 and row["against"] > 0
    assert row["ratio"] == pytest.approx(row["this tree"] / row["against"])
    bad = _run("bench_instructions.py", "--workloads", "nothing")
    assert bad.returncode == 2 and b"--workloads" in bad.stderr


def test_bench_client_measures_each_interpreter_and_tree(tmp_path: Path) -> None:
    out = tmp_path / "client.json"
    other = str(Path(sys.executable).with_name("python3"))  # the venv's, by another name
    tree = tmp_path / "tree"  # another checkout: a copy of the package
    shutil.copytree(ROOT / "sow_redis", tree / "sow_redis")
    proc = _run("bench_client.py", "--python", other, "--tree", str(tree), "--n", "400",
                "--runs", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stdout.decode()[-2000:] + proc.stderr.decode()[-2000:]
    res = json.loads(out.read_bytes())
    (run,) = res["runs"][f"{sys.executable} {tree}"]
    assert run["published"] == 220 and run["records"] == 220  # 200 warm-up + 20 timed
    assert run["sow_redis"] == str(tree / "sow_redis")  # the tree given, not this checkout
    med = res["median"][f"{sys.executable} {tree}"]
    assert all(med[c] > 0 for c in ("get", "evalsha", "pipeline_10", "inline_publish",
                                    "inline_delete"))
    assert res["runs"][f"{other} {tree}"][0]["records"] == 220  # the other interpreter's
    assert len(res["load_averages"]) == 1 and "inline_delete" in proc.stdout.decode()


def test_bench_batches_measures_the_client_memory_of_each_variant(tmp_path: Path) -> None:
    """Every variant ran and printed exactly its records (the script counted each run's
    lines); the peak RSS is the command's own, not the script's (a start-up of the CLI takes
    less than the script, which generated the records)."""
    res, text = _results("bench_batches.py", tmp_path / "batches.json", "--n", "3000",
                         "--runs", "1", "--batch-size", "100", "--as-of")
    medians = res["medians"]
    assert list(medians) == [
        "start-up (sow --top-n 0)", "sow", "sow --batch-size 100", "Sow.sow() (a list)",
        "Sow.sow(batch_size=100)", "sow-and-subscribe", "sow-and-subscribe --batch-size 100",
        "sow-and-subscribe --projection (500 groups)", "sow --as-of", "sow --as-of --batch-size 100", "sow-and-subscribe --as-of",
        "sow-and-subscribe --as-of --batch-size 100", "subscribe --bookmark EPOCH"]
    assert "30 updated after" in text  # every 100th of 3,000 records: replayed, counted
    assert all(len(runs) == 1 for runs in res["all_runs"].values())
    assert all(10 < m["rss_mib"] < 500 and m["seconds"] > 0 for m in medians.values())
    assert "peak RSS of the client process" in text and res["n"] == 3000
    assert 3000 / 8 * 150 < res["partition_copy_bytes"] < 3000 * 1000  # one partition of 8
