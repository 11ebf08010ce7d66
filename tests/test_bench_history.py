"""scripts/bench_history.py runs end to end on a small workload and verifies its as-of query."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_history_checks_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "bench_history.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_history.py"),
                           "--n", "2000", "--changes", "200", "--runs", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["ok"] and set(result["medians"]) == {"current", "as-of"}
    assert result["bytes_per_update"] > result["bytes_per_insert"] > 0
    assert "as-of ÷ current" in proc.stdout
    assert set(result["ingest_rate"]) == {"off", "on"} and min(result["ingest_rate"].values()) > 0
    assert "history on ÷ off" in proc.stdout
    assert min(result["updates_rate"].values()) > 0 and min(result["updates_redis_us"].values()) > 0
    assert "the updates alone" in proc.stdout
