#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup.sh), then runs pytest.
# Tests start their own redis-server on a free port; the machine's 6379 is never touched.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SOW_EXTRAS="dev,demo" bash "$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/python -m pytest "$@"
