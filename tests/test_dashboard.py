"""``sow-redis dashboard`` (issue 8.5): rq-dashboard starts from a plain install, serves its
page, listens on 127.0.0.1 unless told otherwise, and takes basic auth from the environment
without showing the password in the process list."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
from conftest import ROOT, cli_env

from sow_redis.ops.server import free_port

STARTUP_TIMEOUT_S = 20.0


def _get(url: str, auth: tuple[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization",
                       "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp*) of the sockets listening on ``port``."""
    found = []
    for name in ("tcp", "tcp6"):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            addr, hexport = fields[1].split(":")
            if int(hexport, 16) == port and fields[3] == "0A":  # 0A = LISTEN
                found.append(addr)
    return found


def _outward_address() -> str | None:
    """This host's address on the route out (no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") else addr


class Dashboard:
    """``sow-redis dashboard`` in its own session; output in ``log``."""

    def __init__(self, url: str, tmp_path: Path, *args: str, **env: str):
        self.port = free_port()
        self.log = tmp_path / f"dashboard-{self.port}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sow_redis.cli", "dashboard", "--port", str(self.port),
                 *args], env=cli_env(url, PYTHONPATH=str(ROOT), **env),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_page(self, auth: tuple[str, str] | None = None) -> tuple[int, bytes]:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                return _get(f"http://127.0.0.1:{self.port}/", auth)
            except (urllib.error.URLError, ConnectionError, OSError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"dashboard did not serve: {self.output()}") from None
                time.sleep(0.1)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def test_dashboard_serves_its_page_on_loopback_only(url, tmp_path):
    d = Dashboard(url, tmp_path)
    try:
        status, page = d.wait_page()
        assert status == 200 and b"<title>RQ dashboard</title>" in page, page[:300]
        status, body = _get(f"http://127.0.0.1:{d.port}/0/data/workers.json")
        assert status == 200 and "workers" in orjson.loads(body)
        status, page = _get(f"http://127.0.0.1:{d.port}/sow/")  # the SOW page, same server
        assert status == 200 and b"<h2>SOW topics</h2>" in page, page[:300]
        listening = _listening(d.port)
        print(f"dashboard on port {d.port}: listening sockets {listening}")
        if listening:  # Linux: every listening socket is 127.0.0.1 (0100007F)
            assert listening == ["0100007F"], listening
        outward = _outward_address()
        print(f"non-loopback address of this host: {outward}")
        if outward is not None:
            with pytest.raises(OSError):
                socket.create_connection((outward, d.port), timeout=2).close()
        assert listening or outward, "no way to check the bind address on this host"
        assert f"http://127.0.0.1:{d.port}/" in d.output()
    finally:
        d.stop()


def test_dashboard_basic_auth_from_env_hides_the_password(url, tmp_path):
    secret = "pw-" + os.urandom(6).hex()
    d = Dashboard(url, tmp_path, SOW_DASHBOARD_USERNAME="watcher", SOW_DASHBOARD_PASSWORD=secret)
    try:
        status, _ = d.wait_page()
        assert status == 401
        assert d.wait_page(("watcher", "wrong"))[0] == 401
        status, page = d.wait_page(("watcher", secret))
        assert status == 200 and b"RQ dashboard" in page
        # the SOW page and its files ask for the same user and password
        for path in ("sow/", "sow/topic?name=x", "sow/data/series.json?name=x",
                     "sow/static/sow.js"):
            assert _get(f"http://127.0.0.1:{d.port}/{path}")[0] == 401, path
            assert _get(f"http://127.0.0.1:{d.port}/{path}", ("watcher", "wrong"))[0] == 401
            assert _get(f"http://127.0.0.1:{d.port}/{path}", ("watcher", secret))[0] in (
                200, 404), path  # 404: no topic x
        status, page = _get(f"http://127.0.0.1:{d.port}/sow/", ("watcher", secret))
        assert status == 200 and b"SOW topics" in page
        argv = Path(f"/proc/{d.proc.pid}/cmdline").read_bytes() if Path("/proc").exists() else b""
        assert secret.encode() not in argv
        assert secret not in d.output() and "watcher" in d.output()
    finally:
        d.stop()


def test_dashboard_refuses_a_user_without_password(url):
    proc = subprocess.run([sys.executable, "-m", "sow_redis.cli", "dashboard", "--username",
                           "watcher"], env=cli_env(url, PYTHONPATH=str(ROOT)), check=False,
                          capture_output=True, timeout=30)
    assert proc.returncode == 2 and b"give both --username and --password" in proc.stderr
    assert b"Traceback" not in proc.stderr


def test_undeclared_imports_of_rq_dashboard_are_declared_here():
    """rq-dashboard 0.9.0 imports ``six`` without declaring it: we declare it."""
    import rq_dashboard

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("[")[0].strip().lower() for d in deps}
    web = (Path(rq_dashboard.__file__).parent / "web.py").read_text()
    if "from six " in web or "import six" in web:
        assert "six" in names, "rq-dashboard imports six: declare it in pyproject.toml"
