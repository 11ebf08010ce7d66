"""Deployment files (issue 13 item 4): every file parses, every ``sow-redis`` command line in
them is accepted by the CLI's own parser (real command, real options, valid values), the
files agree with each other and with sow_redis (Redis settings, topics, KEDA's stream names
from keys.py), each is documented in deploy/README.md; ``up`` warns about an evicting or
non-persistent Redis."""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import yaml
from conftest import ROOT, cli_env

from sow_redis import keys
from sow_redis.config import parse_topics
from sow_redis.ops.server import free_port

DEPLOY = ROOT / "deploy"


def command_path(argv: list[str]) -> list[str]:
    """The command names of ``argv`` (``sow-redis [global options] command [sub…] [options]
    [args]``) after click itself parsed every level, as it would at run time.

    Raises:
        click.UsageError: an unknown command or option, a bad value, a missing argument.
    """
    from sow_redis.cli import main

    assert Path(argv[0]).name == "sow-redis", argv
    ctx = main.make_context("sow-redis", list(argv[1:]))
    cmd: click.Command = main
    names: list[str] = []
    while isinstance(cmd, click.Group):
        protected = getattr(ctx, "_protected_args", None)  # click >= 8.2
        rest = [*(ctx.protected_args if protected is None else protected), *ctx.args]
        name, sub, rest = cmd.resolve_command(ctx, rest)
        assert name is not None and sub is not None
        names.append(name)
        ctx = sub.make_context(name, rest, parent=ctx)
        cmd = sub
    return names


def _yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _k8s_docs() -> list[dict]:
    docs = []
    for f in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += _yaml_docs(f)
    return docs


def _containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec.get("template", {}).get("spec", {}).get("containers", [])


def _units() -> dict[str, configparser.ConfigParser]:
    units = {}
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        cp = configparser.ConfigParser(strict=True, interpolation=None)
        cp.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
        cp.read(unit)
        units[unit.name] = cp
    return units


def _conf_directives(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition(" ")
            out[name] = value.strip()
    return out


def test_the_command_checker_refuses_what_the_cli_refuses():
    assert command_path(["sow-redis", "--log-json", "worker", "--name", "x"]) == ["worker"]
    assert command_path(["sow-redis", "config", "apply", "f.toml"]) == ["config", "apply"]
    for bad in (["sow-redis", "workers"], ["sow-redis", "worker", "--nom", "x"],
                ["sow-redis", "metrics", "--port", "http"], ["sow-redis", "config", "nope"],
                ["sow-redis", "--log-jsn", "expirer"]):
        with pytest.raises(click.UsageError):
            command_path(bad)


def test_systemd_units_parse_and_run_real_commands():
    units = _units()
    print(sorted(units))
    assert sorted(units) == ["sow-redis-config.service", "sow-redis-dashboard.service",
                             "sow-redis-deriver.service",
                             "sow-redis-expirer.service", "sow-redis-metrics.service",
                             "sow-redis-redis.service", "sow-redis-worker@.service"]
    commands = {}
    for name, cp in units.items():
        assert {"Unit", "Service", "Install"} <= set(cp.sections()), name
        exec_start = shlex.split(cp["Service"]["ExecStart"])
        if name == "sow-redis-redis.service":
            assert exec_start[:2] == ["/usr/bin/redis-server", "/etc/sow-redis/redis.conf"]
            assert cp["Service"]["Type"] == "notify" and "--supervised" in exec_start
            continue
        commands[name] = command_path(exec_start)
        assert cp["Service"]["EnvironmentFile"] == "/etc/sow-redis/env"
        assert "sow-redis-redis.service" in cp["Unit"]["After"]
    print(commands)
    assert commands == {"sow-redis-config.service": ["config", "apply"],
                        "sow-redis-dashboard.service": ["dashboard"],
                        "sow-redis-deriver.service": ["derive"],
                        "sow-redis-expirer.service": ["expirer"],
                        "sow-redis-metrics.service": ["metrics"],
                        "sow-redis-worker@.service": ["worker"]}
    assert "--bind 127.0.0.1" in units["sow-redis-dashboard.service"]["Service"]["ExecStart"]


def test_the_redis_unit_starts_redis_with_redis_conf_safely(tmp_path):
    """The Redis unit's command line, with a free port and a temporary data folder, starts
    the real redis-server with deploy/redis.conf: noeviction and AOF, so no `up` warning."""
    from redis import Redis

    from sow_redis.ops.server import redis_warnings

    argv = shlex.split(_units()["sow-redis-redis.service"]["Service"]["ExecStart"])
    port = free_port()
    argv[1] = str(DEPLOY / "redis.conf")
    argv[argv.index("--port") + 1] = str(port)
    argv[argv.index("--dir") + 1] = str(tmp_path)
    argv[0] = "redis-server"
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        r = Redis.from_url(url)
        for _ in range(100):
            try:
                r.ping()
                break
            except Exception:
                assert proc.poll() is None, "redis-server exited"
                time.sleep(0.1)
        cfg = r.config_get("maxmemory-policy", "appendonly", "appendfsync")
        print(cfg)
        assert cfg == {"maxmemory-policy": "noeviction", "appendonly": "yes",
                       "appendfsync": "everysec"}
        assert redis_warnings(url) == []
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_compose_file_parses_and_runs_real_commands():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    commands = {name: command_path(s["command"]) for name, s in services.items()
                if s["command"][0] == "sow-redis"}
    print(commands)
    assert commands == {"config": ["config", "apply"], "worker": ["worker"],
                        "expirer": ["expirer"], "deriver": ["derive"], "metrics": ["metrics"],
                        "dashboard": ["dashboard"]}
    assert services["redis"]["command"][:2] == ["redis-server", "/etc/sow-redis/redis.conf"]
    assert "./redis.conf:/etc/sow-redis/redis.conf:ro" in services["redis"]["volumes"]
    assert "./topics.toml:/etc/sow-redis/topics.toml:ro" in services["config"]["volumes"]
    for name in commands:
        assert services[name]["environment"]["SOW_REDIS_URL"] == "redis://redis:6379/0"
        assert services[name]["depends_on"]["redis"] == {"condition": "service_healthy"}
    # the dashboard is published on the host's loopback only, with a password
    assert services["dashboard"]["ports"] == ["127.0.0.1:9181:9181"]
    assert "SOW_DASHBOARD_PASSWORD" in services["dashboard"]["environment"]
    for mount in ("./redis.conf", "./topics.toml"):
        assert (DEPLOY / mount).exists()


def test_kubernetes_manifests_parse_and_run_real_commands():
    docs = _k8s_docs()
    by_kind: dict[str, list[dict]] = {}
    for d in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(d), d
        assert d["kind"] == "Namespace" or d["metadata"]["namespace"] == "sow-redis"
        by_kind.setdefault(d["kind"], []).append(d)
    print({k: len(v) for k, v in by_kind.items()})
    assert {"Namespace", "ConfigMap", "StatefulSet", "Service", "Deployment", "Job",
            "ScaledObject"} <= set(by_kind)
    commands = {}
    for d in docs:
        for c in _containers(d):
            if c["command"][0] == "sow-redis":
                commands[d["metadata"]["name"]] = command_path(c["command"])
                assert {"configMapRef": {"name": "sow-redis"}} in c["envFrom"]
    print(commands)
    assert commands == {"sow-redis-config": ["config", "apply"],
                        "sow-redis-worker": ["worker"], "sow-redis-expirer": ["expirer"],
                        "sow-redis-deriver": ["derive"], "sow-redis-metrics": ["metrics"]}
    # every Deployment's selector matches its pods; every Service selects a workload
    labels = []
    for d in by_kind["Deployment"] + by_kind["StatefulSet"]:
        sel = d["spec"]["selector"]["matchLabels"]
        assert sel.items() <= d["spec"]["template"]["metadata"]["labels"].items(), d
        labels.append(sel)
    for svc in by_kind["Service"]:
        assert svc["spec"]["selector"] in labels, svc


def test_kubernetes_redis_and_topics_match_the_deploy_files():
    maps = {d["metadata"]["name"]: d["data"] for d in _k8s_docs() if d["kind"] == "ConfigMap"}
    # the Redis settings in k8s are those of deploy/redis.conf
    assert _conf_directives(maps["redis-conf"]["redis.conf"]) == \
        _conf_directives((DEPLOY / "redis.conf").read_text())
    # the topics applied by the Job are deploy/topics.toml, and they load
    assert maps["sow-redis-topics"]["topics.toml"].strip() == \
        "\n".join(ln for ln in (DEPLOY / "topics.toml").read_text().splitlines()
                  if not ln.startswith("#")).strip()
    (job,) = [d for d in _k8s_docs() if d["kind"] == "Job"]
    (container,) = _containers(job)
    assert container["command"][-1] == "/etc/sow-redis/topics.toml"
    assert container["volumeMounts"][0]["mountPath"] == "/etc/sow-redis"
    topics = parse_topics(maps["sow-redis-topics"]["topics.toml"])
    assert [t.name for t in topics] == ["orders"]
    from sow_redis.settings import Settings

    assert int(maps["sow-redis"]["SOW_LOG_MAX_LEN"]) < Settings().log_max_len


def test_keda_scales_the_workers_on_every_partition_log():
    docs = _k8s_docs()
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    workers = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
    assert scaled["spec"]["scaleTargetRef"]["name"] == "sow-redis-worker" in workers
    topics = parse_topics((DEPLOY / "topics.toml").read_text())
    want = {keys.log(t.name, p) for t in topics for p in range(t.partitions)}
    triggers = scaled["spec"]["triggers"]
    got = [t["metadata"]["stream"] for t in triggers]
    print(len(got), sorted(got))
    assert sorted(got) == sorted(want) and len(got) == 8
    maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    log_max = int(maps["sow-redis"]["SOW_LOG_MAX_LEN"])
    redis_svc = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    for t in triggers:
        md = t["metadata"]
        assert t["type"] == "redis-streams" and "consumerGroup" not in md
        # keys KEDA's redis-streams scaler reads (XLEN mode); a length is backlog + applied
        # entries kept (at most SOW_LOG_MAX_LEN), so the target must be well above that
        assert set(md) == {"address", "stream", "streamLength"}, md
        assert int(md["streamLength"]) >= 2 * log_max
        host = md["address"].split(".")[0]
        assert host in redis_svc and md["address"].endswith(":6379")


def test_grafana_dashboard_and_redis_conf():
    dash = json.loads((DEPLOY / "grafana" / "sow_redis.json").read_text())
    assert dash["panels"]
    conf = _conf_directives((DEPLOY / "redis.conf").read_text())
    assert conf["maxmemory-policy"] == "noeviction" and conf["appendonly"] == "yes"
    assert conf["appendfsync"] == "everysec"


def test_every_deploy_file_is_documented_in_deploy_readme():
    readme = (DEPLOY / "README.md").read_text()
    files = [p for p in DEPLOY.rglob("*") if p.is_file() and p.name != "README.md"
             and p.parent.name not in ("acl", "spark")]
    missing = [str(p.relative_to(DEPLOY)) for p in files if p.name not in readme]
    print(sorted(str(p.relative_to(DEPLOY)) for p in files))
    assert not missing, f"not named in deploy/README.md: {missing}"
    for cmd in ("config import-amps", "dashboard", "metrics --port"):
        assert cmd in readme


def _up(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sow_redis.cli", "up", "--workers", "1",
                           "--no-config", "--data-dir", str(tmp_path / "data"), *args],
                          env=cli_env(url), capture_output=True, timeout=90, check=False)


def _down(url: str, tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "sow_redis.cli", "down", "--data-dir",
                    str(tmp_path / "data")], env=cli_env(url), capture_output=True,
                   timeout=90, check=False)


def test_up_warns_about_eviction_and_no_persistence(lonely_url, tmp_path):
    from redis import Redis

    from sow_redis.ops.server import redis_warnings

    r = Redis.from_url(lonely_url)
    r.config_set("maxmemory-policy", "allkeys-lru")
    r.config_set("appendonly", "no")
    r.config_set("save", "")
    try:
        warnings = redis_warnings(lonely_url)
        print(warnings)
        assert len(warnings) == 2
        assert "allkeys-lru" in warnings[0] and "no persistence" in warnings[1]
        # the command itself: one line each on stderr, with --detach too
        out = _up(lonely_url, tmp_path, "--detach")
        _down(lonely_url, tmp_path)
        err = out.stderr.decode().splitlines()
        print(out.returncode, err)
        assert out.returncode == 0
        lines = [ln for ln in err if ln.startswith("warning: ")]
        assert lines == [f"warning: {w}" for w in warnings]
        assert "Traceback" not in out.stderr.decode()
        # in the foreground: the same lines, before the workers run
        proc = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "up", "--workers", "1",
                                 "--no-config", "--data-dir", str(tmp_path / "fg")],
                                env=cli_env(lonely_url), stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            seen = []
            assert proc.stderr is not None
            for raw in proc.stderr:
                seen.append(raw.decode().rstrip("\n"))
                if "running; Ctrl-C stops everything" in seen[-1]:
                    break
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        print(seen)
        assert [ln for ln in seen if ln.startswith("warning: ")] == \
            [f"warning: {w}" for w in warnings]
        # RDB snapshots alone are persistence; noeviction: nothing to warn about
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("save", "3600 1")
        assert redis_warnings(lonely_url) == []
        r.config_set("save", "")
        r.config_set("appendonly", "yes")
        assert redis_warnings(lonely_url) == []
        out = _up(lonely_url, tmp_path, "--detach")
        _down(lonely_url, tmp_path)
        assert out.returncode == 0 and b"warning: " not in out.stderr, out.stderr
    finally:
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("appendonly", "no")
        r.config_set("save", "")


def test_readme_names_only_real_deploy_files():
    readme = (DEPLOY / "README.md").read_text()
    for name in re.findall(r"`((?:systemd|k8s|grafana)/[^`]+|[\w.-]+\.(?:yml|yaml|toml|conf))`",
                           readme):
        if "<" in name or "*" in name:
            continue
        assert (DEPLOY / name).exists() or (DEPLOY / "systemd" / name).exists() or \
            (DEPLOY / "k8s" / name).exists(), name
