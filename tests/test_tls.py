"""``rediss://`` (issue 12 item 5): sow_redis over TLS to a redis-server started with a locally
generated CA and server certificate; a plain connection to the TLS port is refused in one
line. The CA travels in the URL (``?ssl_ca_certs=…``), so workers get it with SOW_REDIS_URL,
or in ``SOW_REDIS_SSL_CA_CERTS``; a server that wants client certificates gets them from
``SOW_REDIS_SSL_CERTFILE`` / ``SOW_REDIS_SSL_KEYFILE``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FAST

from sow_redis.client import Sow
from sow_redis.ops.server import free_port

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is missing")


def _certificates(d: Path) -> None:
    """A CA (ca.crt), a server certificate for 127.0.0.1 (server.crt/key) and a client
    certificate (client.crt/key) signed by it, and a second CA (other-ca.crt) that signs
    nothing, in ``d``."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out",
            f"{ca}.crt", "-days", "1", "-subj", f"/CN=sow-redis test {ca}")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN=sow-redis test {name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "1", "-extfile", "ext.cnf")


def _start_tls_redis(d: Path, auth_clients: str):
    """A redis-server with only a TLS port (``--port 0``); yields (process, port)."""
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", "0", "--tls-port", str(port), "--bind",
                             "127.0.0.1", "--tls-cert-file", str(d / "server.crt"),
                             "--tls-key-file", str(d / "server.key"), "--tls-ca-cert-file",
                             str(d / "ca.crt"), "--tls-auth-clients", auth_clients, "--save", "",
                             "--appendonly", "no", "--dir", str(d)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, port


def _wait_up(proc, ping) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            ping()
            return
        except Exception:
            if proc.poll() is not None:
                pytest.skip(f"this redis-server has no TLS: {proc.stdout.read()[-300:]!r}")
            assert time.monotonic() < deadline, "TLS redis-server did not start"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    _certificates(d)
    return d


@pytest.fixture(scope="module")
def tls_server(certs):
    d = certs
    proc, port = _start_tls_redis(d, "no")
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={d / 'ca.crt'}"
    try:
        _wait_up(proc, lambda: Sow(url).r.ping())
        yield url, port
    finally:
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


def _cli(url: str, *args: str, input: bytes | None = None, **env: str):
    return subprocess.run([sys.executable, "-m", "sow_redis.cli", *args],
                          env=dict(os.environ, SOW_REDIS_URL=url, **FAST, **env), input=input,
                          capture_output=True, timeout=60)


def _one_line(out) -> str:
    err = out.stderr.decode()
    assert out.returncode == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_a_worker_applies_over_tls_with_the_ca_from_the_environment(tls_server, certs,
                                                                     topic_name, tmp_path):
    """The whole CLI path over TLS, CA given once in SOW_REDIS_SSL_CA_CERTS: config apply,
    a worker process, publish --wait, query."""
    _url, port = tls_server
    bare = f"rediss://127.0.0.1:{port}/0"
    ca = {"SOW_REDIS_SSL_CA_CERTS": str(certs / "ca.crt")}
    cfg = tmp_path / "sow.toml"
    cfg.write_text(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\npartitions = 2\n')
    assert _cli(bare, "config", "apply", str(cfg), **ca).returncode == 0
    env = dict(os.environ, SOW_REDIS_URL=bare, **FAST, **ca)
    worker = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "worker"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        lines = b"".join(b'{"k": %d, "v": "tls"}\n' % i for i in range(100))
        out = _cli(bare, "publish", "-t", topic_name, "--wait", input=lines, **ca)
        assert out.returncode == 0, out.stderr
        out = _cli(bare, "sow", "-t", topic_name, "-f", "/v = 'tls'", **ca)
        assert out.returncode == 0, out.stderr
        assert len(out.stdout.splitlines()) == 100
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    # without the CA the server's certificate is not trusted: one line
    line = _one_line(_cli(bare, "sow", "-t", topic_name, SOW_REDIS_SSL_CA_CERTS=""))
    print(line)
    assert "cannot reach Redis" in line and "certificate verify failed" in line


def test_a_certificate_of_another_ca_is_refused_in_one_line(tls_server, certs, topic_name):
    _url, port = tls_server
    other = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={certs / 'other-ca.crt'}"
    line = _one_line(_cli(other, "sow", "-t", topic_name))
    print(line)
    assert "certificate verify failed" in line


def test_a_misspelt_tls_option_is_one_line_before_connecting(tls_server, topic_name):
    _url, port = tls_server
    line = _one_line(_cli(f"rediss://u:s3cret@127.0.0.1:{port}/0?ssl_ca_cert=/x", "sow", "-t",
                          topic_name))
    print(line)
    assert "unknown option 'ssl_ca_cert'" in line and "s3cret" not in line


def test_client_certificates_from_the_environment(certs, topic_name):
    """A server with ``tls-auth-clients yes``: refused without a client certificate (one
    line), served with SOW_REDIS_SSL_CERTFILE / SOW_REDIS_SSL_KEYFILE."""
    proc, port = _start_tls_redis(certs, "yes")
    url = f"rediss://127.0.0.1:{port}/0"
    mine = {"SOW_REDIS_SSL_CA_CERTS": str(certs / "ca.crt"),
            "SOW_REDIS_SSL_CERTFILE": str(certs / "client.crt"),
            "SOW_REDIS_SSL_KEYFILE": str(certs / "client.key")}
    try:
        from redis import Redis

        _wait_up(proc, lambda: Redis.from_url(
            url, ssl_ca_certs=mine["SOW_REDIS_SSL_CA_CERTS"],
            ssl_certfile=mine["SOW_REDIS_SSL_CERTFILE"],
            ssl_keyfile=mine["SOW_REDIS_SSL_KEYFILE"]).ping())
        os.environ.update(mine)
        try:
            sow = Sow(url, inline=True)
            sow.apply_config(f'[[topic]]\nname = "{topic_name}"\nkey = ["/k"]\n')
            assert sow.publish(topic_name, [{"k": 1}, {"k": 2}]).published == 2
        finally:
            for var in mine:
                del os.environ[var]
        out = _cli(url, "sow", "-t", topic_name, **mine)
        assert out.returncode == 0 and len(out.stdout.splitlines()) == 2, out.stderr
        line = _one_line(_cli(url, "sow", "-t", topic_name,
                              SOW_REDIS_SSL_CA_CERTS=mine["SOW_REDIS_SSL_CA_CERTS"]))
        print(line)
        assert "cannot reach Redis" in line
    finally:
        proc.terminate()
        proc.wait(timeout=10)
