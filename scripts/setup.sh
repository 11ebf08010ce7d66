#!/usr/bin/env bash
# Installs what is missing, idempotently: redis-server (apt-get), with SOW_BROWSER=1 Chromium
# and its driver (apt-get; a failure is logged in test-artifacts/chromium-install.log, not
# fatal), a Java runtime when the extras include spark (apt-get), a Python virtual environment in .venv with sow_redis and the extras
# named in $SOW_EXTRAS (default: dev,demo).
# Sourced or run by scripts/main.sh and scripts/test.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${SOW_EXTRAS:-dev,demo}"

apt_install() {
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq "$@" >/dev/null
}

if ! command -v redis-server >/dev/null 2>&1; then
  echo "setup: installing redis-server (apt-get)" >&2
  apt_install redis-server
fi
browser_log="$root/test-artifacts/chromium-install.log"
if [ "${SOW_BROWSER:-0}" = "1" ] && ! { command -v chromium >/dev/null 2>&1 \
    && command -v chromedriver >/dev/null 2>&1; }; then
  echo "setup: installing chromium and chromium-driver (apt-get; the dashboard browser test)" >&2
  mkdir -p "$root/test-artifacts"
  # not fatal: without a browser only tests/test_dashboard_browser.py skips, naming this log
  if ! (apt_install chromium chromium-driver) >"$browser_log" 2>&1; then
    echo "setup: chromium could not be installed (log: $browser_log)" >&2
  else
    rm -f "$browser_log"
  fi
fi
if [[ ",$extras," == *",spark,"* ]] && ! command -v java >/dev/null 2>&1; then
  echo "setup: installing a Java runtime for Spark (apt-get default-jre-headless)" >&2
  apt_install default-jre-headless
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "setup: installing python3 (apt-get)" >&2
  apt_install python3 python3-venv python3-pip
fi
if [ ! -x "$root/.venv/bin/python" ]; then
  echo "setup: creating virtual environment .venv" >&2
  python3 -m venv "$root/.venv" || { apt_install python3-venv && python3 -m venv "$root/.venv"; }
fi
stamp="$root/.venv/.sow-installed-$extras"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  echo "setup: installing Python packages (.[${extras}])" >&2
  log="$root/.venv/pip-install.log"
  "$root/.venv/bin/python" -m pip install -q --upgrade pip >"$log" 2>&1 || true
  if ! "$root/.venv/bin/python" -m pip install -q -e "$root[${extras}]" >>"$log" 2>&1; then
    cat "$log" >&2
    echo "setup: pip install failed (log above, also in $log)" >&2
    exit 1
  fi
  "$root/.venv/bin/python" -c "import sow_redis, redis, rq, orjson, lark, xxhash, re2"
  touch "$stamp"
fi
