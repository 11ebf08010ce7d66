"""Issue 9 item 6: ruff and mypy run by the README's test command; Redis clients typed.

The script test runs ``scripts/test.sh`` in a scratch copy of the project layout where
``scripts/setup.sh`` does nothing and ``.venv/bin/{ruff,mypy,python}`` are stand-ins that log
their arguments (and fail on demand), so it takes well under a second and installs nothing.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLIENT_PARAMS = {"r": "Client", "client": "Client", "pipe": "Pipeline", "pipeline": "Pipeline"}


def _client_annotations() -> list[tuple[str, str, str]]:
    """(module:function, parameter, annotation source) of every parameter named like a Redis
    client in a module-level function or method of sow_redis/ (nested functions excluded:
    orderby's sort key takes a record named ``r``)."""
    found = []
    for path in sorted((ROOT / "sow_redis").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            funcs += [n for n in cls.body if isinstance(n, ast.FunctionDef)]
        for fn in funcs:
            for a in fn.args.args + fn.args.kwonlyargs:
                if a.arg in CLIENT_PARAMS:
                    ann = ast.unparse(a.annotation) if a.annotation else "<none>"
                    found.append((f"{path.stem}:{fn.name}", a.arg, ann))
    return found


def test_redis_clients_are_typed_with_the_connection_aliases():
    found = _client_annotations()
    assert len(found) >= 60, found  # the scan does see the clients (about 70 parameters)
    wrong = [f for f in found if CLIENT_PARAMS[f[1]] not in f[2]]
    assert wrong == []


STAND_IN = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "{log}"
echo "$(basename "$0") $* :: $(ps -o cls= -p $$ | tr -d ' ')" >> "{log}.policy"
[ "$(basename "$0")" != "${{FAIL_TOOL:-none}}" ] || {{ echo "$(basename "$0"): 1 finding"; exit 3; }}
echo "$(basename "$0"): all good"
"""


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A project copy with scripts/test.sh, a no-op setup.sh and logging tool stand-ins."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "test.sh", tmp_path / "scripts" / "test.sh")
    (tmp_path / "scripts" / "setup.sh").write_text("#!/usr/bin/env bash\nexit 0\n")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("ruff", "mypy", "python"):
        exe = bin_dir / tool
        exe.write_text(STAND_IN.format(log=tmp_path / "calls.log"))
        exe.chmod(0o755)
    return tmp_path


def _run(scratch: Path, *args: str, fail: str = "none") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FAIL_TOOL": fail}
    return subprocess.run(["bash", str(scratch / "scripts" / "test.sh"), *args], check=False,
                          env=env, capture_output=True, text=True, timeout=30)


def _calls(scratch: Path) -> list[str]:
    log = scratch / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_test_sh_runs_ruff_then_mypy_then_pytest_with_its_arguments(scratch: Path):
    res = _run(scratch, "-q", "-k", "delta")
    assert res.returncode == 0, res.stderr
    calls = _calls(scratch)
    # the tests bound to wall-clock time (marker serial) and the parallel part, side by side
    assert calls[:2] == ["ruff check sow_redis", "mypy "]
    assert sorted(calls[2:]) == ["python -m pytest -m not serial -q -k delta",
                                 "python -m pytest -m serial -q -k delta"]
    lines = res.stdout.splitlines()
    assert lines[:2] == ["check ruff (sow_redis): ruff: all good",
                         "check mypy (sow_redis): mypy: all good"]
    # the serial part's output comes after the parallel part's, under its own heading
    assert lines[2:] == ["python: all good",
                         "==== the serial part (tests bound to wall-clock time), run beside "
                         "the parallel part ====", "python: all good"]


@pytest.mark.skipif(shutil.which("chrt") is None, reason="chrt (util-linux) is not installed")
def test_the_parallel_part_runs_at_the_idle_policy_beside_the_serial_part(scratch: Path):
    """The serial tests, bound to wall-clock time, run at the caller's policy (normally TS);
    the parallel part beside them at SCHED_IDLE (IDL), so it never takes a core a serial test
    wants."""
    res = _run(scratch, "-q")
    assert res.returncode == 0, res.stderr
    policy = dict(line.split(" :: ") for line in
                  (scratch / "calls.log.policy").read_text().splitlines())
    own = subprocess.run(["ps", "-o", "cls=", "-p", str(os.getpid())], check=True,
                         capture_output=True, text=True).stdout.strip()
    assert policy["python -m pytest -m not serial -q"] == "IDL"
    assert policy["python -m pytest -m serial -q"] == own


def test_a_failure_of_either_part_fails_the_run(scratch: Path):
    """The parallel part's status wins, then the serial part's; both parts always run."""
    python = scratch / ".venv" / "bin" / "python"
    python.write_text(f'#!/usr/bin/env bash\necho "$*" >> "{scratch / "calls.log"}"\n'
                      '[[ "$*" != *"$FAIL_PART"* ]] || exit 1\n')
    for part, want in (("not serial", 1), ("-m serial", 1), ("nothing", 0)):
        (scratch / "calls.log").unlink(missing_ok=True)
        res = subprocess.run(["bash", str(scratch / "scripts" / "test.sh"), "-q"], check=False,
                             env={**os.environ, "FAIL_PART": part}, capture_output=True,
                             text=True, timeout=30)
        assert res.returncode == want, (part, res.stdout, res.stderr)
        assert len(_calls(scratch)[2:]) == 2, part  # after ruff and mypy, both parts ran


@pytest.mark.parametrize("tool, ran", [("ruff", ["ruff check sow_redis"]),
                                       ("mypy", ["ruff check sow_redis", "mypy "])])
def test_a_finding_fails_the_run_before_pytest(scratch: Path, tool: str, ran: list[str]):
    res = _run(scratch, "-q", fail=tool)
    assert res.returncode == 1
    assert _calls(scratch) == ran  # pytest never started
    assert f"{tool}: 1 finding" in res.stdout
    assert f"check {tool} (sow_redis): FAILED (exit status 3); tests not run" in res.stderr


@pytest.mark.parametrize("workers, addopts, want", [
    (None, None, ["-n 6 --dist loadgroup", "-n 0"]),
    ("0", None, [""]),  # one process: one run, no xdist options
    ("3", "-p no:cacheprovider", ["-n 3 --dist loadgroup -p no:cacheprovider",
                                  "-n 0 -p no:cacheprovider"])])
def test_test_sh_runs_pytest_on_xdist_workers(scratch: Path, workers, addopts, want):
    """The tests run on SOW_TEST_WORKERS (default 6) pytest-xdist workers with the group
    scheduling of tests/conftest.py, then those marked serial on SOW_TEST_SERIAL_WORKERS
    (default 0: one process), through PYTEST_ADDOPTS (a PYTEST_ADDOPTS of the caller is kept after them);
    the arguments still reach pytest as given."""
    python = scratch / ".venv" / "bin" / "python"
    python.write_text(f'#!/usr/bin/env bash\necho "$PYTEST_ADDOPTS" >> "{scratch / "calls.log"}"\n')
    env = {k: v for k, v in os.environ.items()
           if k not in ("SOW_TEST_WORKERS", "PYTEST_ADDOPTS")}
    env.update({k: v for k, v in (("SOW_TEST_WORKERS", workers), ("PYTEST_ADDOPTS", addopts))
                if v is not None})
    res = subprocess.run(["bash", str(scratch / "scripts" / "test.sh"), "-q"], check=False,
                         env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    # after ruff and mypy: the serial and parallel parts, side by side
    assert sorted(_calls(scratch)[2:]) == sorted(want)


FUNCTION_LINES_MAX = 80
"""Issue 24 item 4: no function of sow_redis/ over this many lines (docstring included)."""

ANY_LINES_MAX = 100
"""Issue 24 item 4: lines of sow_redis/ naming ``Any`` (where a value really is any JSON or
an untyped library's), at most this many."""


def test_no_function_is_over_80_lines_and_any_stays_rare():
    long, any_lines = [], 0
    for path in sorted((ROOT / "sow_redis").rglob("*.py")):
        text = path.read_text()
        any_lines += sum(1 for line in text.splitlines() if re.search(r"\bAny\b", line))
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES_MAX:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    print(f"functions over {FUNCTION_LINES_MAX} lines: {len(long)}; lines naming Any: "
          f"{any_lines}")
    assert long == []
    assert any_lines <= ANY_LINES_MAX
