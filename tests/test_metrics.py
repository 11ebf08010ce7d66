"""The Prometheus endpoint (issue 13 item 3): a scrape holds the stats figures of each topic
and the latency histograms, filled from the change blocks."""

from __future__ import annotations

import threading
import time
import urllib.request

from conftest import cli_env
from prometheus_client.parser import text_string_to_metric_families

from sow_redis.client import Sow
from sow_redis.expirer import Expirer
from sow_redis.ops.metrics import serve
from sow_redis.ops.server import free_port


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_scrape_has_the_figures_and_the_histograms_filled(url, topic_name):
    sow = Sow(url, inline=True)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\npartitions = 2\n'
                     'expiration = "enabled"\n')
    port = free_port()
    stop = threading.Event()
    th = threading.Thread(target=serve, args=(sow.r, port, "127.0.0.1", stop), daemon=True)
    th.start()
    try:
        time.sleep(0.7)  # following the feeds (they are noted at the first poll)
        sow.publish(topic_name, [{"k": i} for i in range(20)])
        sow.publish(topic_name, [{"k": 100 + i} for i in range(5)], expiration=0.05)
        time.sleep(0.1)
        Expirer(sow.r, topics=[topic_name]).loop()
        sow.sow(topic_name)
        lab = (("topic", topic_name),)
        deadline = time.monotonic() + 10  # the feeds are read every FEED_POLL_S
        while True:
            got = {k[0]: v for k, v in _scrape(port).items() if k[1] == lab}
            if got.get("sow_expiry_lag_seconds_count") == 5 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        stop.set()
        th.join(timeout=5)
    print({k: v for k, v in got.items() if not k.endswith("_bucket")})
    assert got["sow_records"] == 20 and got["sow_inserts_total"] == 25
    assert got["sow_expiries_total"] == 5 and got["sow_queries_total"] == 1
    assert got["sow_lag_entries"] == 0 and got["sow_subscribers"] == 0
    assert got["sow_publish_to_applied_seconds_count"] == 25
    assert got["sow_apply_batch_seconds_count"] >= 2
    assert got["sow_expiry_lag_seconds_count"] == 5
    assert 0 < got["sow_expiry_lag_seconds_sum"] < 5


def test_metrics_command_refuses_a_busy_port_in_one_line(url):
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "sow_redis.cli", "metrics", "--port",
                              str(port)], env=cli_env(url), capture_output=True, timeout=30)
    assert out.returncode == 1
    assert out.stderr.decode().strip().splitlines()[-1].startswith(
        "Error: cannot serve metrics on 127.0.0.1:")


def test_the_grafana_dashboard_uses_only_metrics_the_endpoint_serves():
    import json
    import re

    from conftest import ROOT

    from sow_redis.ops import metrics

    dash = json.loads((ROOT / "deploy" / "grafana" / "sow_redis.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(sow_[a-z_]+)", e)}
    served = ({n for n, _d in metrics.GAUGES.values()} | {n + "_total" for n, _d in
              metrics.COUNTERS.values()} | {"sow_lag_age_seconds", "sow_next_due_timestamp_seconds"}
              | {h + "_bucket" for h in ("sow_publish_to_applied_seconds",
                                         "sow_apply_batch_seconds", "sow_expiry_lag_seconds")})
    assert used and used <= served, used - served
