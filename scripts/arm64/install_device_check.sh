#!/usr/bin/env bash
# Inside the arm64 root: scripts/install-device.sh --root into a throw-away root, as on a
# Raspberry Pi 5 (its fixture tree is the board), from the agent's wheel and the arm64 wheels
# (offline); then what it installed: the agent runs, the Pi profile's litert extra imports,
# the config, unit, drop-in and sysusers files are there, the config is 0640.
set -euo pipefail
target=$(mktemp -d /tmp/arm64-install-XXXXXX)
trap 'rm -rf "$target"' EXIT
board=tests/fixtures/boards/raspberry-pi-5
wheel=$(ls /dist/edgeagent-*.whl)
PYTHON=python3 scripts/install-device.sh --root "$target" --source "$wheel" \
  --pip-args "--no-index --find-links /wheels" --board-root "$board"
bin=$target/opt/edgeagent/bin
version=$("$bin/edgeagent" --version)
"$bin/python" -c 'import ai_edge_litert.interpreter, onnxruntime'
for file in etc/edgeagent/agent.toml etc/systemd/system/edgeagent.service \
  etc/systemd/system/edgeagent.service.d/10-install.conf usr/lib/sysusers.d/edgeagent.conf; do
  [[ -f $target/$file ]] || { echo "summary: missing $file"; exit 1; }
done
mode=$(stat -c %a "$target/etc/edgeagent/agent.toml")
[[ $mode == 640 ]] || { echo "summary: agent.toml has mode $mode, not 640"; exit 1; }
profile=$("$bin/edgeagent" profile --board --json --root "$board" | "$bin/python" -c \
  'import json, sys; d = json.load(sys.stdin); print(d["profile"], ",".join(d["extras"]))')
[[ $profile == "raspberry-pi-5 litert" ]] || { echo "summary: board says $profile"; exit 1; }
echo "summary: $version into a throw-away root; board raspberry-pi-5, extras litert (imports);" \
  "agent.toml 0640, unit, drop-in and sysusers written"
