"""The deriver's lower CPU priority (sow_redis.ops.priority, ``sow-redis derive --nice``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli_env

AUTOGROUP = Path("/proc/self/autogroup")

PROBE = ("import os; from sow_redis.ops.priority import lower_priority; "
         "print(*lower_priority({n}), os.nice(0))")


def _probe(n: int, new_session: bool) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(n=n)], capture_output=True,
                         text=True, timeout=60, start_new_session=new_session, check=True)
    return out.stdout.split()


def test_lower_priority_raises_the_nice_value_and_a_session_leaders_group():
    base = os.nice(0)
    want = min(19, base + 3)
    process, group, after = _probe(3, new_session=True)
    assert int(process) == int(after) == want
    if AUTOGROUP.exists():  # Linux with autogroup: the new session's group follows
        assert group == str(want)
    else:
        assert group == "None"
    # not the leader of its session: the group (this test's) is left alone
    ours = AUTOGROUP.read_text() if AUTOGROUP.exists() else None
    process, group, after = _probe(3, new_session=False)
    assert int(process) == want and group == "None"
    assert (AUTOGROUP.read_text() if AUTOGROUP.exists() else None) == ours


def test_lower_priority_zero_changes_nothing_and_bad_values_raise():
    from sow_redis.ops.priority import lower_priority

    assert _probe(0, new_session=True)[0] == str(os.nice(0))
    for bad in (-1, 20):
        with pytest.raises(ValueError, match="nice must be 0-19"):
            lower_priority(bad)


def _derive_nice(url: str, args: list[str], log: Path, **env: str) -> int:
    """The nice value (field 19 of /proc/PID/stat) of ``sow-redis derive ARGS`` once it
    says it runs (it lowers its priority before: ``sow_redis.cli.processes.derive``)."""
    environ = cli_env(url, **env)
    if "SOW_DERIVE_NICE" not in env:
        environ.pop("SOW_DERIVE_NICE", None)  # the default, whatever the caller's shell sets
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sow_redis.cli", "derive", *args],
                                env=environ, stdout=subprocess.DEVNULL,
                                stderr=out, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while b"deriver on" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the deriver did not start in 60 s"
            time.sleep(0.05)
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[16])  # field 19 of the whole line
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("args,env,increment", [
    ([], {}, 10),  # the default: DERIVE_NICE
    (["--nice", "4"], {}, 4),
    ([], {"SOW_DERIVE_NICE": "0"}, 0),
])
def test_cli_derive_runs_the_deriver_at_its_priority(url, tmp_path, args, env, increment):
    """``sow-redis derive`` runs 10 below this test's priority by default (the write path
    keeps a saturated machine: DERIVE_NICE), ``--nice N`` N below, ``SOW_DERIVE_NICE=0``
    as started."""
    from sow_redis.ops.priority import DERIVE_NICE

    assert DERIVE_NICE == 10
    nice = _derive_nice(url, args, tmp_path / "derive.log", **env)
    print(f"derive {args} {env}: nice {nice}, this test's {os.nice(0)}")
    assert nice == min(19, os.nice(0) + increment)


def test_cli_derive_nice_out_of_range_is_a_usage_error(url):
    bad = subprocess.run([sys.executable, "-m", "sow_redis.cli", "derive", "--nice", "25"],
                         env=cli_env(url), capture_output=True, timeout=60)
    assert bad.returncode == 2 and b"--nice" in bad.stderr and b"Traceback" not in bad.stderr
