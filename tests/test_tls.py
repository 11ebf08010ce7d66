"""``rediss://`` (issue 12 item 5): sow_redis over TLS to a redis-server started with a locally
generated CA and server certificate; a plain connection to the TLS port is refused in one
line. The CA travels in the URL (``?ssl_ca_certs=…``), so workers get it with SOW_REDIS_URL."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from sow_redis.client import Sow
from sow_redis.server import free_port

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is missing")


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "1", "-subj", "/CN=sow-redis test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "ext.cnf")
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", "0", "--tls-port", str(port), "--bind",
                             "127.0.0.1", "--tls-cert-file", str(d / "server.crt"),
                             "--tls-key-file", str(d / "server.key"), "--tls-ca-cert-file",
                             str(d / "ca.crt"), "--tls-auth-clients", "no", "--save", "",
                             "--appendonly", "no", "--dir", str(d)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={d / 'ca.crt'}"
    deadline = time.monotonic() + 10
    while True:
        try:
            Sow(url).r.ping()
            break
        except Exception:
            if proc.poll() is not None:
                pytest.skip(f"this redis-server has no TLS: {proc.stdout.read()[-300:]!r}")
            assert time.monotonic() < deadline, "TLS redis-server did not start"
            time.sleep(0.05)
    yield url, port
    proc.terminate()
    proc.wait(timeout=10)


def test_publish_query_and_subscribe_over_tls(tls_server, topic_name):
    url, _port = tls_server
    sow = Sow(url, inline=True)
    sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\npartitions = 2\n')
    with sow.subscribe(topic_name) as sub:
        sow.publish(topic_name, [{"k": i} for i in range(5)])
        got = [sub.get(2) for _ in range(5)]
    assert sorted(m["data"]["k"] for m in got) == [0, 1, 2, 3, 4]
    out = subprocess.run([sys.executable, "-m", "sow_redis.cli", "sow", "-t", topic_name],
                         env=dict(os.environ, SOW_REDIS_URL=url), capture_output=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 5


def test_a_plain_connection_to_the_tls_port_is_one_line(tls_server, topic_name):
    _url, port = tls_server
    out = subprocess.run([sys.executable, "-m", "sow_redis.cli", "sow", "-t", topic_name],
                         env=dict(os.environ, SOW_REDIS_URL=f"redis://127.0.0.1:{port}/0"),
                         capture_output=True, timeout=60)
    err = out.stderr.decode()
    print(err.strip())
    assert out.returncode == 1 and err.count("\n") == 1 and "Traceback" not in err
