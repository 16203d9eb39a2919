#!/usr/bin/env bash
# Inside the arm64 root: the agent's wheel (/dist) with its arm64 dependencies (/wheels, from
# PyPI) installed offline into a venv, as a device would install it; then which runtimes import.
# The venv is kept between runs: only a changed agent wheel is reinstalled, and the whole venv
# only when the dependency wheels change.
set -euo pipefail
VENV=${1:?usage: venv.sh VENV}
EXTRAS=dev,litert,openvino,package,hub
wheel=$(ls /dist/edgeagent-*.whl)
deps="$(cat /wheels/.stamp)"
agent="$(sha256sum "$wheel" | cut -c1-16)"
pip=("$VENV/bin/pip" install --disable-pip-version-check --no-index --find-links /wheels)
if [[ -f $VENV/.deps && "$(cat "$VENV/.deps")" == "$deps" ]]; then
  if [[ "$(cat "$VENV/.agent" 2>/dev/null)" == "$agent" ]]; then
    echo "venv $VENV: cached (same wheels)"
  else
    echo "venv $VENV: reinstalling the agent's wheel only"
    "${pip[@]}" --no-deps --force-reinstall "$wheel"
  fi
else
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "${pip[@]}" "$wheel[$EXTRAS]"
  echo "$deps" >"$VENV/.deps"
fi
echo "$agent" >"$VENV/.agent"
"$VENV/bin/pip" check
"$VENV/bin/python" - <<'PY'
import importlib, platform
from importlib import metadata

found = []
for module, dist in (("onnxruntime", "onnxruntime"), ("ai_edge_litert.interpreter", "ai-edge-litert"),
                     ("openvino", "openvino")):
    try:
        importlib.import_module(module)
        found.append(f"{dist} {metadata.version(dist)}")
    except Exception as exc:  # report, do not hide: the summary says which one failed
        found.append(f"{dist} FAILED to import ({type(exc).__name__}: {exc})")
print(f"summary: edgeagent {metadata.version('edgeagent')} on {platform.machine()} "
      f"Python {platform.python_version()}; " + ", ".join(found))
if any("FAILED" in f for f in found):
    raise SystemExit(1)
PY
