#!/usr/bin/env bash
# Inside the arm64 root: the unit-test part of the suite, with the venv the agent's wheel and
# the dev extra's arm64 wheels were installed into (scripts/arm64/venv.sh). Nothing is
# deselected: the tests that need what only the x86_64 set-up has (.venv-build's PyTorch,
# promtool) skip themselves and say so (-rs). Extra arguments go to pytest.
set -euo pipefail
VENV=${1:?usage: unit.sh VENV [PYTEST ARGS]}
shift
export EDGEAGENT_ZOO=/src/zoo
log=$(mktemp /tmp/arm64-unit-XXXXXX)
trap 'rm -f "$log"' EXIT
rc=0
"$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider -o timeout=900 tests/unit \
  "$@" 2>&1 | tee "$log" || rc=$?
echo "summary: pytest tests/unit: $(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$log" | tail -n 1 | sed 's/=//g; s/ in [0-9.]*s.*//')"
exit "$rc"
