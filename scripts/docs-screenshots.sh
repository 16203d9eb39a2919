#!/usr/bin/env bash
# Make the dashboard pictures of the docs again: the browser test, told to keep its screenshots
# in the docs' picture folder (the suite itself writes them to a temporary directory only).
set -euo pipefail
cd "$(dirname "$0")/.."
export EDGEAGENT_SCREENSHOTS_DIR="${EDGEAGENT_SCREENSHOTS_DIR:-$PWD/docs/images}"
exec .venv/bin/python -m pytest -q -p no:cacheprovider tests/integration/test_hub_dashboard_browser.py "$@"
