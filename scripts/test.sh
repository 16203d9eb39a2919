#!/usr/bin/env bash
# One command: set up everything the tests need (environments, zoo, a real Mosquitto broker
# binary — the tests start their own broker processes), then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
  printf '\n==> installing mosquitto (Debian package)\n' >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mosquitto >/dev/null
  # The tests run their own brokers on ephemeral ports; the packaged service is not needed.
  $SUDO systemctl disable --now mosquitto >/dev/null 2>&1 || true
fi
printf '\n==> lint and types (ruff, mypy)\n' >&2
.venv/bin/ruff check edgeagent tests scripts devtools
.venv/bin/ruff format --check --quiet edgeagent tests scripts devtools
.venv/bin/mypy edgeagent
printf '\n==> tests\n' >&2
exec .venv/bin/python -m pytest -q "$@"
