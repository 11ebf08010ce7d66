"""scripts/bench_views.py runs end to end (--quick) and writes every part's medians."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_views_quick_measures_every_part(tmp_path: Path) -> None:
    out = tmp_path / "bench_views.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_views.py"), "--quick",
                           "--lag-rates", "1000", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    m = result["medians"]
    assert result["machine"]["cpu_count"] >= 1 and len(result["loadavg_start"]) == 3
    # 1. throughput: every variant, the baseline's ratio 1, the views' deriver did work
    assert set(m["throughput"]) == {"0 views", "1 view", "3 views"}
    assert m["throughput"]["0 views"]["vs_baseline"] == 1.0
    for v in m["throughput"].values():
        assert v["msgs_per_s"] > 100 and v["caught_up_msgs_per_s"] > 10
    assert m["throughput"]["0 views"]["deriver_cpu_s_per_1k"] < \
        m["throughput"]["3 views"]["deriver_cpu_s_per_1k"]
    # the views' rows written: none without a view, some with one
    assert m["throughput"]["0 views"]["view_rows_per_1k"] == 0
    assert m["throughput"]["1 view"]["view_rows_per_1k"] > 0
    # 2. lag: the view and the topic itself, every change after the warm-up counted
    for part in ("lag", "lag_topic"):
        lag = m[part]["1000"]
        assert lag["changes"] >= 800  # 1,500 published, the first 0.3 s left out
        assert 0 < lag["p50_ms"] <= lag["p99_ms"] <= lag["max_ms"] < 10_000
    # 3. conflation: at most one event per key per interval (with slack for the edges)
    conf = m["conflation"]
    assert conf["underlying_per_s"] > 300
    for ms in ("500", "100"):
        x = conf["intervals"][ms]
        assert 0 < x["events_per_s"] <= x["bound_per_s"] * 1.3
    assert conf["intervals"]["500"]["events_per_s"] < conf["intervals"]["100"]["events_per_s"]
    # 4. delta: 3 of 15 fields changed, so a delta's data is well under half of a full one
    d = m["delta"]
    assert 0 < d["data_ratio"] < 0.5 and d["data_ratio"] < d["line_ratio"] < 1
    assert result["goals"]["lag_rate"] == 1000 and result["goals"]["one_view_cost"] is not None
    assert "apply throughput" in proc.stdout and "conflation" in proc.stdout
