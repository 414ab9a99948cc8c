#!/usr/bin/env bash
# Installs everything the tests need (scripts/install.sh) and runs the whole test suite.
#   bash scripts/test.sh [pytest args]
#   bash scripts/test.sh -m "not slow"     # the fast subset, without multi-process training runs
#   bash scripts/test.sh -n 0                    # in one process (the default: two pytest-xdist workers)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${TFSYNC_VENV:-$repo/.venv}
bash "$repo/scripts/install.sh"

# The multi-host tests (tests/test_multihost.py) run `horovodrun -H` over SSH between network
# namespaces: they need OpenSSH's server and client. As root on Debian/Ubuntu, install them
# when missing, without starting the system's sshd (the tests start their own, one per
# namespace, on that namespace's address only). Elsewhere those tests skip and say why.
if { [ ! -x /usr/sbin/sshd ] || ! command -v ssh >/dev/null; } && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[test] installing openssh-server and openssh-client for the multi-host tests" >&2
  policy=/usr/sbin/policy-rc.d
  made_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made_policy=1
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      openssh-server openssh-client >/dev/null; } || echo "[test] could not install OpenSSH; the SSH tests will skip" >&2
  if [ -n "$made_policy" ]; then rm -f "$policy"; fi
fi

cd "$repo"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
# Two pytest-xdist workers (docs/TESTING.md, "Two workers"); a later -n overrides it.
exec "$venv/bin/python" -m pytest -n 2 --dist loadgroup "$@"
