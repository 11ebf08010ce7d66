"""scripts/benchlib.py: the private redis-server of a benchmark is stopped and its folder
removed however the benchmark ends; the ``"machine"`` entry of the benchmarks' JSON."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from redis import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib import BenchError, machine_info, private_redis  # noqa: E402


def test_private_redis_serves_then_stops_and_removes_its_folder():
    with private_redis("sow-test-bl-") as server:
        workdir, proc = server.workdir, server.proc
        assert workdir.is_dir() and workdir.name.startswith("sow-test-bl-")
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert Redis.from_url(server.url).ping() is True
    assert proc.poll() is not None
    assert not workdir.exists()


@pytest.mark.parametrize("exc", [BenchError("check failed"), KeyboardInterrupt()])
def test_private_redis_cleans_up_on_error_and_ctrl_c(exc):
    seen = {}
    with pytest.raises(type(exc)):
        with private_redis("sow-test-bl-") as server:
            seen["workdir"], seen["proc"] = server.workdir, server.proc
            raise exc
    assert seen["proc"].poll() is not None
    assert not seen["workdir"].exists()


def test_machine_info_describes_the_machine(r):
    m = machine_info(r)
    assert list(m) == ["cpu_count", "redis_server", "python", "platform"]
    assert m == {"cpu_count": os.cpu_count(), "redis_server": r.info("server")["redis_version"],
                 "python": platform.python_version(), "platform": platform.platform()}


def test_a_benchmark_leaves_no_folder_behind(tmp_path):
    out = tmp_path / "xadd.json"
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_xadd.py"), "--n",
                           "2000", "--repeat", "1", "--json", str(out)], cwd=ROOT,
                          capture_output=True, timeout=60, check=False,
                          env={**os.environ, "TMPDIR": str(tmpdir)})
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    runs = json.loads(out.read_bytes())["runs"]
    assert [x["variant"] for x in runs] == ["redis-py pipeline", "hand-packed RESP",
                                           "Lua + msgpack"]
    assert list(tmpdir.iterdir()) == []
