"""The README's walkthroughs run as pasted (issues 8.12, 8.2): the quick start block, taken
from README.md itself, prints its documented result on a fresh port every time and leaves no
process behind; ``up --detach`` / ``down`` report failures in one line; the demos' topics
have distinct names, so following the README from top to bottom gives its figures.

Each run of a block starts a redis-server, two workers and the expirer (about 2 s);
``SOW_QUICKSTART_RUNS`` (default 3) sets how many times the quick start is run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
import uuid
from pathlib import Path

import pytest
from conftest import ROOT, SHARED

from sow_redis.ops.server import free_port

README = ROOT / "README.md"
README_URL = "redis://127.0.0.1:6390/0"
RUNS = int(os.environ.get("SOW_QUICKSTART_RUNS", "3"))
FIX_DIR = SHARED / "data" / "fix"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/environ").exists(),
                                 reason="finds leftover processes through /proc")]


def readme_block(heading: str) -> str:
    """The first ```bash block after ``heading`` in README.md."""
    text = README.read_text()
    m = re.compile(r"```bash\n(.*?)```", re.DOTALL).search(text, text.index(heading))
    assert m, f"no bash block under {heading!r}"
    return m.group(1)


def documented_output(block: str) -> str:
    """The result the README gives as a comment on the block's ``sow-redis sow`` line."""
    (line,) = [x for x in block.splitlines() if x.startswith("sow-redis sow -t ") and "#" in x]
    return line.split("# ", 1)[1].strip()


def leftovers(mark: str, cwd: Path) -> list[int]:
    """Pids of the live processes a run started: those whose environment holds
    ``SOW_TEST_MARK=<mark>`` (bash, up, workers, expirer inherit it) or whose working
    directory is under ``cwd`` (redis-server, which overwrites its environment with its
    process title, works in ``cwd/.sow-redis/redis-<port>``)."""
    needle = f"SOW_TEST_MARK={mark}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            here = Path(os.readlink(d / "cwd"))
            if needle in (d / "environ").read_bytes().split(b"\0") or here == cwd \
                    or cwd in here.parents:
                pids.append(int(d.name))
        except OSError:  # gone, a zombie, or not ours
            continue
    return pids


def run_bash(script: str, cwd: Path, mark: str, timeout_s: float = 180) -> \
        subprocess.CompletedProcess:
    """Run ``script`` with bash in ``cwd`` as a user would paste it: the venv's bin first on
    PATH, ``.venv`` in ``cwd`` pointing at the venv, this checkout's sow_redis, no SOW_*
    settings. Kills everything it started in the end (``finally``)."""
    venv = Path(sys.prefix)
    if (venv / "bin" / "activate").exists() and not (cwd / ".venv").exists():
        (cwd / ".venv").symlink_to(venv)
    else:
        (cwd / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
        (cwd / ".venv" / "bin" / "activate").touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SOW_", "RQ_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=str(ROOT), SOW_TEST_MARK=mark)
    (cwd / "block.sh").write_text(script)
    # output to files, not pipes: a process left in the background must not hold the test
    with open(cwd / "out.txt", "wb") as out, open(cwd / "err.txt", "wb") as err:
        proc = subprocess.Popen(["bash", "block.sh"], cwd=cwd, env=env, stdout=out, stderr=err,
                                start_new_session=True)
    try:
        proc.wait(timeout=timeout_s)
        return subprocess.CompletedProcess(proc.args, proc.returncode,
                                           (cwd / "out.txt").read_bytes(),
                                           (cwd / "err.txt").read_bytes())
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        # a test assertion reports what was left (LEFT …); here it is only cleaned up
        for pid in leftovers(mark, cwd.resolve()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_readme_quick_start_prints_its_result_every_time(tmp_path):
    block = readme_block("## Quick start")
    expected = documented_output(block)
    assert expected == '{"orderId":1,"sym":"IBM","px":95}'
    ok, times = 0, []
    for i in range(RUNS):
        cwd = tmp_path / f"run{i}"
        cwd.mkdir()
        mark = uuid.uuid4().hex
        url = f"redis://127.0.0.1:{free_port()}/0"
        started = time.monotonic()
        res = run_bash(_checked(block, url, mark), cwd, mark)
        times.append(time.monotonic() - started)
        out, err = res.stdout.decode(), res.stderr.decode()
        assert res.returncode == 0, f"run {i}: exit {res.returncode}\n{out}\n{err}"
        assert out.splitlines().count(expected) == 1, f"run {i}:\n{out}\n{err}"
        assert "Error" not in err and "Traceback" not in err, err
        assert "LEFT none" in out and "REDIS down" in out, \
            f"run {i}: processes left after `sow-redis down`:\n{out}"
        assert not (cwd / ".sow-redis" / "up.pid").exists()
        ok += 1
    print(f"quick start: {ok}/{RUNS} runs printed {expected}; seconds per run: "
          + ", ".join(f"{t:.1f}" for t in times))


def _checked(block: str, url: str, mark: str) -> str:
    """The block on ``url``, followed by a check run inside the same shell, before any
    cleanup, printing ``LEFT none`` when no process of this run but the shell is alive (as
    :func:`leftovers`) and ``REDIS down`` when nothing answers at ``url`` any more."""
    assert f"export SOW_REDIS_URL={README_URL}\n" in block
    port = url.rsplit(":", 1)[1].split("/", maxsplit=1)[0]
    probe = textwrap.dedent(f"""\
        left="" here="$(pwd -P)"
        for d in /proc/[0-9]*; do
          p="${{d#/proc/}}"
          [ "$p" = "$$" ] && continue
          if tr '\\0' '\\n' 2>/dev/null < "$d/environ" | grep -qx 'SOW_TEST_MARK={mark}'; then
            left="$left $p"
          else
            case "$(readlink "$d/cwd" 2>/dev/null)" in "$here"|"$here"/*) left="$left $p";; esac
          fi
        done
        echo "LEFT ${{left:-none}}"
        (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo "REDIS up" || echo "REDIS down"
        """)
    return block.replace(README_URL, url) + probe


def test_help_example_runs_as_written(tmp_path):
    """The example of ``sow-redis --help`` (with the topics it names in sow.toml)."""
    from click.testing import CliRunner

    from sow_redis.cli import main

    text = CliRunner().invoke(main, ["--help"]).output
    lines = text[text.index("Example (topics in sow.toml):"):].splitlines()[1:]
    example = "\n".join(x.strip() for x in lines[:lines.index("")]) + "\n"
    assert "sow-redis up --workers 2 --detach" in example and "sow-redis down" in example
    (tmp_path / "sow.toml").write_text('[[topic]]\nname = "orders"\nkey = ["/orderId"]\n')
    mark = uuid.uuid4().hex
    res = run_bash(_checked(example, f"redis://127.0.0.1:{free_port()}/0", mark), tmp_path,
                   mark)
    out = res.stdout.decode()
    assert res.returncode == 0, out + res.stderr.decode()
    assert '{"orderId": 1, "price": 120}' in out.splitlines(), out
    assert "LEFT none" in out and "REDIS down" in out, out


def test_up_detach_failure_is_one_line_and_leaves_nothing(tmp_path):
    """A config error: `up --detach` exits 1 with one line naming it; `down` then has
    nothing to stop (exit 0); nothing is left running."""
    (tmp_path / "sow.toml").write_text('[[topic]]\nname = "orders"\npartitions = 0\n')
    mark = uuid.uuid4().hex
    script = textwrap.dedent(f"""\
        export SOW_REDIS_URL={README_URL}
        sow-redis up --workers 1 --detach; echo "up=$?"
        sow-redis down; echo "down=$?"
        sow-redis up --workers 1 --wait-ready 5; echo "nodetach=$?"
        """)
    res = run_bash(_checked(script, f"redis://127.0.0.1:{free_port()}/0", mark), tmp_path,
                   mark)
    out, err = res.stdout.decode(), res.stderr.decode()
    assert "up=1" in out and "down=0" in out and "nodetach=2" in out, out + err
    up_err = [x for x in err.splitlines() if "sow-redis up exited" in x]
    assert len(up_err) == 1 and "'partitions' must be an integer" in up_err[0], err
    assert "no sow-redis up runs from .sow-redis" in out
    assert "Traceback" not in err and "LEFT none" in out and "REDIS down" in out, out + err


def test_second_up_and_down_of_another_redis(tmp_path):
    """`up --detach` again: says it runs (exit 0); for another Redis from the same data dir,
    or `down` of another Redis: one line, exit 1; `down`: stops it (exit 0)."""
    (tmp_path / "sow.toml").write_text('[[topic]]\nname = "orders"\nkey = ["/orderId"]\n')
    mark = uuid.uuid4().hex
    other = f"redis://127.0.0.1:{free_port()}/0"
    script = textwrap.dedent(f"""\
        export SOW_REDIS_URL={README_URL}
        sow-redis up --workers 1 --detach; echo "up=$?"
        sow-redis up --workers 1 --detach; echo "again=$?"
        sow-redis --redis-url {other} up --workers 1 --detach; echo "elsewhere=$?"
        sow-redis --redis-url {other} down; echo "other=$?"
        sow-redis down; echo "down=$?"
        """)
    url = f"redis://127.0.0.1:{free_port()}/0"
    res = run_bash(_checked(script, url, mark), tmp_path, mark)
    out, err = res.stdout.decode(), res.stderr.decode()
    assert "up=0" in out and "again=0" in out and "other=1" in out and "down=0" in out, \
        out + err
    assert f"sow-redis up already runs at {url} from .sow-redis" in out
    assert "elsewhere=1" in out and f"a sow-redis up of {url} runs from .sow-redis" in err
    assert f"serves {url}, not {other}" in err
    assert "stopped sow-redis up (pid" in out, out + err
    assert "LEFT none" in out and "REDIS down" in out, out + err


def _topics(toml_text: str) -> list[str]:
    return [t["name"] for t in tomllib.loads(toml_text).get("topic", [])]


def test_demo_topics_have_distinct_names():
    """examples/*.toml and the quick start's sow.toml define different topics (8.2), and the
    second demo queries only topics of the file it applies."""
    where: dict[str, list[str]] = {}
    for f in sorted((ROOT / "examples").glob("*.toml")):
        for name in _topics(f.read_text()):
            where.setdefault(name, []).append(f"examples/{f.name}")
    quick = readme_block("## Quick start")
    inline = quick[quick.index("<<'EOF'\n") + 8:quick.index("\nEOF\n")]
    for name in _topics(inline):
        where.setdefault(name, []).append("README quick start")
    assert {"orders", "fix_orders", "flights", "weather"} <= set(where), where
    assert {n: w for n, w in where.items() if len(w) > 1} == {}

    demo = readme_block("## Second demo")
    (applied,) = re.findall(r"config apply (examples/\S+\.toml)", demo)
    defined = set(_topics((ROOT / applied).read_text()))
    used = set(re.findall(r" -t (\S+)", demo))
    assert used and used <= defined, (used, defined)


@pytest.mark.skipif(not FIX_DIR.is_dir(), reason="../shared/data/fix is not beside the project")
def test_readme_top_to_bottom_gives_the_second_demos_figure(tmp_path):
    """Quick start, then the second demo in the same folder and Redis: `wc -l` prints 642."""
    quick, demo = readme_block("## Quick start"), readme_block("## Second demo")
    (figure,) = re.findall(r"\| wc -l\s+# (\d+)", demo)
    demo = (demo.replace("examples/", f"{ROOT}/examples/")
            .replace("../shared/data/fix/", f"{FIX_DIR}/"))
    mark = uuid.uuid4().hex
    res = run_bash(_checked(quick + demo, f"redis://127.0.0.1:{free_port()}/0", mark),
                   tmp_path, mark)
    out, err = res.stdout.decode(), res.stderr.decode()
    assert res.returncode == 0, out + err
    assert figure == "642" and out.splitlines().count(figure) == 1, out + err
    assert "LEFT none" in out and "REDIS down" in out and "Traceback" not in err, out + err


def test_main_sh_shows_the_publish_report_whole(tmp_path):
    """scripts/main.sh's publish step shows the CLI's rejection report whole, so its counts
    add up (8.13), and still sums the published counts. Run with a stub `sow-redis`."""
    main_sh = (ROOT / "scripts" / "main.sh").read_text()
    start = main_sh.index("published_total=0\npublish() {")
    func = main_sh[start:main_sh.index("\n}\n", start) + 3]
    report = ["missing_key_field: 2512"] + [
        f"rejected line {i}: missing_key_field: key field /tailnum is missing or null"
        for i in range(1, 21)] + ["… and 2492 more rejected lines"]
    stub = tmp_path / "bin" / "sow-redis"
    stub.parent.mkdir()
    stub.write_text("#!/usr/bin/env bash\ncat >&2 <<'EOF'\n" + "\n".join(report) + "\nEOF\n"
                    "echo 'published 334264 message(s) to flights, rejected 2512'\n"
                    "exit 3\n")  # publish's status when some lines were rejected
    stub.chmod(0o755)
    script = f"set -euo pipefail\nnote() {{ :; }}\n{func}\npublish flights x.jsonl\n" \
             "publish flights x.jsonl\necho \"total=$published_total\"\n"
    res = subprocess.run(["bash", "-c", script], capture_output=True, timeout=30, cwd=tmp_path,
                         check=False,
                         env=dict(os.environ, PATH=f"{stub.parent}{os.pathsep}"
                                  f"{os.environ.get('PATH', '')}"))
    out = res.stdout.decode().splitlines()
    assert res.returncode == 0, res.stderr.decode()
    assert out.count("… and 2492 more rejected lines") == 2
    for line in report:
        assert line in out, line
    assert out[-1] == "total=668528"
    # any other failure still stops the main job
    stub.write_text("#!/usr/bin/env bash\necho 'Error: cannot reach Redis' >&2\nexit 1\n")
    res = subprocess.run(["bash", "-c", script], capture_output=True, timeout=30, cwd=tmp_path,
                         check=False,
                         env=dict(os.environ, PATH=f"{stub.parent}{os.pathsep}"
                                  f"{os.environ.get('PATH', '')}"))
    assert res.returncode != 0 and b"cannot reach Redis" in res.stderr
