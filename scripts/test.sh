#!/usr/bin/env bash
# Installs everything the tests need (scripts/install.sh) and runs the whole test suite.
#   bash scripts/test.sh [pytest args]
#   bash scripts/test.sh -m "not slow"     # the fast subset, without multi-process training runs
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${TFSYNC_VENV:-$repo/.venv}
bash "$repo/scripts/install.sh"
cd "$repo"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
exec "$venv/bin/python" -m pytest "$@"
