#!/usr/bin/env bash
# The zoo's MindSpore network: LeNet-5 (scripts/mindspore/lenet.py) trained on the digits data in
# .venv-ms, for the MindSpore packaging path's tests.
#
#   scripts/mindspore_lenet.sh [DIR]
#
#   DIR   the output directory (default zoo/lenet_mindspore): lenet.ckpt, heldout.npz (inputs,
#         labels), mindspore_outputs.npz (MindSpore's own logits for them), build.json
#
# Cached: kept while the scripts that made it are unchanged (a build key), since training takes
# minutes on two cores. The digits come from the build environment (scikit-learn's set, the
# zoo's split), the training from .venv-ms. Exit status: 0 done, 1 a step failed.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-zoo/lenet_mindspore}
say() { echo "mindspore_lenet: $*" >&2; }
key=$(cat "$0" scripts/mindspore/lenet.py scripts/mindspore/train_lenet.py \
  scripts/modelbuild/digits_npz.py scripts/modelbuild/data.py | sha256sum | cut -d' ' -f1)
if [[ -f "$OUT/lenet.ckpt" && "$(cat "$OUT/.build-key" 2>/dev/null)" == "$key" ]]; then
  say "$OUT is up to date"
  exit 0
fi
staged="$OUT.partial"
rm -rf "$staged"
mkdir -p "$staged"
say "1/2 the digits split (.venv-build)"
.venv-build/bin/python scripts/modelbuild/digits_npz.py --size 32 --out "$staged/digits.npz"
say "2/2 training LeNet-5 with MindSpore (.venv-ms)"
GLOG_v=3 .venv-ms/bin/python scripts/mindspore/train_lenet.py --data "$staged/digits.npz" --out "$staged"
rm "$staged/digits.npz"
echo "$key" > "$staged/.build-key"
rm -rf "$OUT"
mv "$staged" "$OUT"
say "$OUT: $(cat "$OUT/build.json" | tr -d '\n ')"
