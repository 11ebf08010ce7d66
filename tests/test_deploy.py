"""Deployment files (issue 13 item 4): every file parses, and every ``sow-redis`` command line
in them names a real command with real options; ``up`` warns about an evicting or
non-persistent Redis."""

from __future__ import annotations

import configparser
import json
import shlex

import yaml
from conftest import ROOT

DEPLOY = ROOT / "deploy"


def _check_command(argv: list[str]) -> None:
    """``argv`` (starting with ``sow-redis``) names a command of the CLI and only its options."""
    from sow_redis.cli import main

    assert argv[0].endswith("sow-redis"), argv
    args = argv[1:]
    global_opts = {o for p in main.params for o in p.opts}
    flags = {o for p in main.params if getattr(p, "is_flag", False) for o in p.opts}
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        assert opt in global_opts, (argv, opt)
        if opt not in flags:
            args.pop(0)
    assert args and args[0] in main.commands, (argv, "no such command")
    cmd = main.commands[args[0]]
    cmd_opts = {o for p in cmd.params for o in p.opts}
    for a in args[1:]:
        if a.startswith("-"):
            assert a in cmd_opts, (argv, a)


def test_systemd_units_parse_and_run_real_commands():
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert len(units) == 4
    for unit in units:
        cp = configparser.ConfigParser(strict=False, interpolation=None)
        cp.read(unit)
        assert {"Unit", "Service", "Install"} <= set(cp.sections()), unit
        exec_start = shlex.split(cp["Service"]["ExecStart"])
        if "sow-redis" in exec_start[0]:
            _check_command(exec_start)
        else:
            assert exec_start[0] == "/usr/bin/redis-server"


def test_compose_and_kubernetes_files_parse_and_run_real_commands():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    commands = [s["command"] for s in compose["services"].values()
                if isinstance(s.get("command"), list) and s["command"][0] == "sow-redis"]
    docs = []
    for f in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    for d in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(d), d
        for c in (d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])):
            if c.get("command", [""])[0] == "sow-redis":
                commands.append(c["command"])
    assert len(commands) >= 7
    for argv in commands:
        _check_command(argv)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ScaledObject", "StatefulSet", "Service", "ConfigMap"} <= kinds
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    from sow_redis import keys

    streams = {t["metadata"]["stream"] for t in scaled["spec"]["triggers"]}
    assert keys.log("orders", 0) in streams


def test_grafana_dashboard_and_redis_conf():
    dash = json.loads((DEPLOY / "grafana" / "sow_redis.json").read_text())
    assert dash["panels"]
    conf = (DEPLOY / "redis.conf").read_text()
    assert "maxmemory-policy noeviction" in conf and "appendonly yes" in conf


def test_up_warns_about_eviction_and_no_persistence(lonely_url):
    from redis import Redis

    from sow_redis.server import redis_warnings

    r = Redis.from_url(lonely_url)
    r.config_set("maxmemory-policy", "allkeys-lru")
    r.config_set("appendonly", "no")
    r.config_set("save", "")
    try:
        warnings = redis_warnings(lonely_url)
        print(warnings)
        assert len(warnings) == 2
        assert "allkeys-lru" in warnings[0] and "no persistence" in warnings[1]
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("appendonly", "yes")
        assert redis_warnings(lonely_url) == []
    finally:
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("appendonly", "no")
