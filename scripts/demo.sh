#!/usr/bin/env bash
# One command on a fresh machine: set up, then run the agent on its embedded default
# (generic profile, the zoo's packages, a Unix socket and http://127.0.0.1:8080).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/edgeagent run --models-dir zoo "$@"
