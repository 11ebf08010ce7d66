#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup.sh), checks sow_redis/ with ruff and
# mypy (configured in pyproject.toml), then runs pytest with this script's arguments.
# One line per check; any finding prints the tool's report and fails the run before pytest.
# Tests start their own redis-server on a free port; the machine's 6379 is never touched.
# `--fast` as the first argument runs the fast lane: every test not marked slow, cluster,
# spark, browser or faults (markers in pyproject.toml); with no argument every test runs.
# Tests run in parallel on SOW_TEST_WORKERS (default 6) pytest-xdist workers, through
# PYTEST_ADDOPTS ("-n N --dist loadgroup"; tests/conftest.py keeps the tests of the Spark
# session on one worker), at the idle scheduling policy, and beside them the tests bound to
# wall-clock time (marker serial) on SOW_TEST_SERIAL_WORKERS (default 0: one at a time, in
# one process; on 3 workers a clean clone lost a failover test and a CPU bound to their
# competition);
# SOW_TEST_WORKERS=0 runs them all in this process, one after the other, and a caller's own
# -m makes one parallel run of what it selects.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SOW_EXTRAS="dev,demo,spark" SOW_BROWSER=1 bash "$root/scripts/setup.sh"
cd "$root"

check() {  # check NAME COMMAND...: "check NAME: <tool's last line>"; on a finding, its report
  local name="$1" out status=0
  shift
  out="$("$@" 2>&1)" || status=$?
  if [ "$status" -ne 0 ]; then
    printf '%s\n' "$out"
    echo "check $name: FAILED (exit status $status); tests not run" >&2
    exit 1
  fi
  echo "check $name: $(printf '%s\n' "$out" | tail -n 1)"
}

check "ruff (sow_redis)" .venv/bin/ruff check sow_redis
check "mypy (sow_redis)" .venv/bin/mypy
lane=""
if [ "${1:-}" = "--fast" ]; then
  shift
  lane="not slow and not cluster and not spark and not browser and not faults"
fi
workers="${SOW_TEST_WORKERS:-6}"
serial_workers="${SOW_TEST_SERIAL_WORKERS:-0}"
own_marks=0
for arg in "$@"; do [ "$arg" = "-m" ] && own_marks=1; done
if [ "$workers" = "0" ] || [ "$own_marks" = "1" ]; then
  # one process (SOW_TEST_WORKERS=0), or the caller's own -m: one run as asked
  [ "$workers" = "0" ] || export PYTEST_ADDOPTS="-n $workers --dist loadgroup${PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}"
  exec .venv/bin/python -m pytest ${lane:+-m "$lane"} "$@"
fi
# the serial part starts first, in the background at the normal priority, its output kept in a
# file and printed after the parallel part; the parallel part runs beside it at the idle
# scheduling policy (chrt --idle; nice 19 where chrt is missing), so the serial tests, mostly
# asleep on the clock, get a core at once when they wake: the two parts' wall times overlap
serial_log="$(mktemp "${TMPDIR:-/tmp}/sow-serial.XXXXXX")"
trap 'rm -f "$serial_log"' EXIT
PYTEST_ADDOPTS="-n $serial_workers${PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}" \
  .venv/bin/python -m pytest -m "${lane:+($lane) and }serial" "$@" >"$serial_log" 2>&1 &
serial_pid=$!
# a Ctrl-C (or TERM) stops the serial part too; tests/conftest.py gives it back SIGINT's default
trap 'kill -INT "$serial_pid" 2>/dev/null; wait "$serial_pid"; exit 130' INT TERM
low=(nice -n 19)
if chrt --idle 0 true 2>/dev/null; then low=(chrt --idle 0); fi
# the parallel part: every test but those bound to wall-clock time (marker serial)
status=0
PYTEST_ADDOPTS="-n $workers --dist loadgroup${PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}" \
  "${low[@]}" .venv/bin/python -m pytest -m "${lane:+($lane) and }not serial" \
  "$@" || status=$?
serial=0
wait "$serial_pid" || serial=$?
echo "==== the serial part (tests bound to wall-clock time), run beside the parallel part ===="
cat "$serial_log"
# exit status 5: none selected, e.g. with -k
[ "$serial" = "5" ] && serial=0
[ "$status" = "5" ] && status=0
if [ "$status" != "0" ]; then exit "$status"; fi
exit "$serial"
