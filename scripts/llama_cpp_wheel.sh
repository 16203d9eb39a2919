#!/usr/bin/env bash
# llama-cpp-python, compiled once for a CPU baseline every machine of a kind has, cached as a
# wheel, and installed from that wheel only:
#
#   scripts/llama_cpp_wheel.sh VENV [PIP-INSTALL-ARGS…]
#
# Why: the package is a source distribution whose build (4.5 min on two cores) defaults to
# -march=native, and such a build dies with "Illegal instruction" on another CPU — even on the
# machine that built it when the VM hides an instruction set the compiler saw. pip's own wheel
# cache is keyed by the source distribution and never sees CMAKE_ARGS, so it may hand back a
# native build made earlier. Here the wheel lives in .wheels/llama-cpp-python-VERSION-ARCH-HASH/
# (HASH: of the CMake flags), built with --no-cache-dir and installed with --no-index from that
# folder alone; a second run finds the keyed wheel and compiles nothing.
#
# The version is the one pyproject.toml's `llm` extra pins. LLAMA_CPP_CMAKE_ARGS replaces the
# portable flags (a CUDA or Vulkan build, say); being part of the key, it gets its own wheel.
# PIP-INSTALL-ARGS, when given, are installed next (the `llm` extras), with llama-cpp-python
# allowed only as a binary from the keyed folder, so that pip can never compile it itself.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:?usage: scripts/llama_cpp_wheel.sh VENV [PIP-INSTALL-ARGS…]}
shift
python="$venv/bin/python"

version=$(sed -n 's/.*"llama-cpp-python==\([0-9][0-9.]*\)".*/\1/p' pyproject.toml | head -n 1)
[ -n "$version" ] || {
  echo "pyproject.toml pins no llama-cpp-python==VERSION in its llm extra" >&2
  exit 1
}
arch=$(uname -m)
case "$arch" in
  x86_64 | amd64)  # AVX2 + FMA + F16C: every x86-64 CPU of the last decade, AVX-512 ones too
    portable="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" ;;
  *)  # aarch64 and the rest: the compiler's baseline for the architecture (armv8-a)
    portable="-DGGML_NATIVE=OFF" ;;
esac
flags=${LLAMA_CPP_CMAKE_ARGS:-$portable}
key="$version-$arch-$(printf '%s' "$flags" | sha256sum | cut -c1-12)"
cache=".wheels/llama-cpp-python-$key"

if compgen -G "$cache/llama_cpp_python-$version-*.whl" >/dev/null; then
  echo "llama-cpp-python $version: the wheel built with \"$flags\" is cached in $cache"
else
  echo "llama-cpp-python $version: compiling with CMAKE_ARGS=\"$flags\" (minutes) into $cache"
  partial="$cache.partial"  # a build cut short never looks like a cached wheel
  rm -rf "$partial"
  mkdir -p "$partial"
  CMAKE_ARGS="$flags" FORCE_CMAKE=1 "$python" -m pip wheel --disable-pip-version-check \
    --progress-bar off --no-deps --no-cache-dir --no-binary llama-cpp-python \
    "llama-cpp-python==$version" -w "$partial"
  printf '%s\n' "$flags" >"$partial/cmake-args.txt"
  mv "$partial" "$cache"
fi
# --force-reinstall: a llama-cpp-python of the same version already there may be a native
# build from pip's cache; the keyed wheel replaces it (its dependencies are left as they are).
# The file itself, not a name for pip to look up: a find-links folder in pip's own configuration
# could offer another build of the same version.
wheel=$(compgen -G "$cache/llama_cpp_python-$version-*.whl" | head -n 1)
"$python" -m pip install --disable-pip-version-check --progress-bar off --no-index \
  --no-deps --force-reinstall "$wheel"
if [ "$#" -gt 0 ]; then
  "$python" -m pip install --disable-pip-version-check --progress-bar off \
    --find-links "$cache" --only-binary llama-cpp-python "$@"
fi
