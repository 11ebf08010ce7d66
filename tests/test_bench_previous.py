"""scripts/bench_previous.py runs end to end on a small workload and writes its medians."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_previous_measures_every_variant(tmp_path: Path) -> None:
    out = tmp_path / "bench_previous.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_previous.py"),
                           "--n", "2000", "--keys", "500", "--runs", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert set(result["medians"]) == {"off", "on", "off, expiring", "on, expiring"}
    for figures in result["medians"].values():
        assert figures["msgs_per_s"] > 0 and figures["redis_us_per_msg"] > 0
    # the previous state is in the feed: more bytes per change than without it
    assert (result["medians"]["on"]["feed_bytes_per_change"]
            > result["medians"]["off"]["feed_bytes_per_change"] + 100)
    assert "vs off" in proc.stdout
    # one ratio per round and variant, each against its base variant's in the same round
    paired = result["paired_ratios"]
    assert set(paired) == set(result["medians"]) and all(len(v) == 1 for v in paired.values())
    assert paired["off"] == [1.0] and paired["off, expiring"] == [1.0]
    assert paired["on"][0] == (result["runs"]["on"][0]["msgs_per_s"]
                               / result["runs"]["off"][0]["msgs_per_s"])
