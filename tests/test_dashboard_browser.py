"""rq-dashboard in a real browser (issue 13 item 1): headless Chromium from Debian's packages,
driven by Selenium with the system chromedriver, against a running ``sow-redis up``: the page
loads, lists the running workers by name and shows the job of a partition. The screenshot is
kept in ``test-artifacts/dashboard.png``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT, cli_env

from sow_redis.client import Sow
from sow_redis.server import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
ARTIFACTS = ROOT / "test-artifacts"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="Chromium and chromedriver (Debian: chromium, chromium-driver) are not installed; "
           "scripts/test.sh installs them")


def _wait_http(port: int, timeout: float = 30.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
            return
        except OSError:
            assert time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.2)


def test_dashboard_in_chromium_lists_workers_and_a_partition_job(tmp_path, topic_name):
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    url = f"redis://127.0.0.1:{free_port()}/0"
    env = cli_env(url)
    up = subprocess.run([sys.executable, "-m", "sow_redis.cli", "up", "--workers", "2",
                         "--detach", "--data-dir", str(tmp_path / "data"), "--no-config"],
                        env=env, capture_output=True, timeout=60, cwd=tmp_path)
    assert up.returncode == 0, up.stderr.decode()
    port = free_port()
    dash = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "dashboard", "--port",
                             str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=tmp_path)
    stop = threading.Event()
    driver = None
    try:
        sow = Sow(url)
        sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\npartitions = 2\n')

        def publish() -> None:  # keeps a partition job running while the page is looked at
            i = 0
            while not stop.is_set():
                sow.publish(topic_name, [{"k": i % 50, "v": i}])
                i += 1
                time.sleep(0.01)

        pub = threading.Thread(target=publish, daemon=True)
        pub.start()
        _wait_http(port)
        opts = Options()
        opts.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--window-size=1400,1000"):
            opts.add_argument(arg)
        driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)
        driver.set_page_load_timeout(30)
        driver.get(f"http://127.0.0.1:{port}/0/view/workers")
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            text = driver.find_element("tag name", "body").text
            if "sow-0" in text and "sow-1" in text and f"ingest_job('{topic_name}'," in text:
                break
            time.sleep(0.5)
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "dashboard.png"))
        print(f"dashboard page text (first 600 chars): {text[:600]!r}")
        assert "sow-0" in text and "sow-1" in text, text[:2000]
        # each worker runs the job of a partition of the topic (it serves a share of them)
        assert f"ingest_job('{topic_name}'," in text, text[:2000]
        # the running (started) jobs: their descriptions name topic and partition
        driver.get(f"http://127.0.0.1:{port}/0/view/jobs/sow/started/8/asc/1")
        deadline = time.monotonic() + 20
        job_text = ""
        while time.monotonic() < deadline:
            job_text = driver.find_element("tag name", "body").text
            if f"ingest {topic_name}[" in job_text:
                break
            time.sleep(0.5)
        driver.save_screenshot(str(ARTIFACTS / "dashboard-jobs.png"))
        print(f"started jobs page: {job_text[:400]!r}")
        assert f"ingest {topic_name}[" in job_text, job_text[:2000]
        driver.get(f"http://127.0.0.1:{port}/0/view/queues")
        time.sleep(2)
        assert "sow" in driver.find_element("tag name", "body").text
        assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000
    finally:
        stop.set()
        if driver is not None:
            driver.quit()
        dash.terminate()
        dash.wait(timeout=10)
        subprocess.run([sys.executable, "-m", "sow_redis.cli", "down", "--data-dir",
                        str(tmp_path / "data")], env=env, capture_output=True, timeout=60,
                       cwd=tmp_path)
