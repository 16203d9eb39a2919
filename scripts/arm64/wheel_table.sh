#!/usr/bin/env bash
# Which of the agent's dependencies and runtimes have a wheel on PyPI for each Raspberry Pi OS:
# bookworm (Python 3.11, glibc 2.36) and trixie (Python 3.13, glibc 2.41), 64-bit (aarch64) and
# 32-bit (armv7l). Asks pip (no install; wheels land in a temporary directory) and prints a
# Markdown table: the source of the table in docs/install/arm64-support.md.
#
#   scripts/arm64/wheel_table.sh [PACKAGE…]
set -euo pipefail
cd "$(dirname "$0")/../.."
PIP=(.venv/bin/python -m pip download -q --no-deps --only-binary=:all:)
PACKAGES=("$@")
((${#PACKAGES[@]})) || PACKAGES=(onnxruntime ai-edge-litert openvino numpy pillow pysimdjson
  psutil cryptography aiohttp pyyaml)
TARGETS=("bookworm aarch64 3.11 36" "trixie aarch64 3.13 41" "bookworm armv7l 3.11 36"
  "trixie armv7l 3.13 41")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
header="| package |"
rule="|---|"
for target in "${TARGETS[@]}"; do
  read -r suite arch _ _ <<<"$target"
  header+=" $suite $arch |"
  rule+="---|"
done
echo "$header"
echo "$rule"
for package in "${PACKAGES[@]}"; do
  row="| $package |"
  for target in "${TARGETS[@]}"; do
    read -r _ arch py glibc <<<"$target"
    platforms=()
    for ((v = 17; v <= glibc; v++)); do platforms+=(--platform "manylinux_2_${v}_$arch"); done
    platforms+=(--platform "manylinux2014_$arch" --platform "linux_$arch")
    dest="$tmp/$arch-$py-$package"
    if "${PIP[@]}" "${platforms[@]}" --python-version "$py" --implementation cp \
      --abi "cp${py/./}" -d "$dest" "$package" >/dev/null 2>&1; then
      wheel=$(basename "$(ls "$dest"/*.whl)")
      version=$(cut -d- -f2 <<<"$wheel")
      row+=" $version |"
    else
      row+=" **no wheel** |"
    fi
  done
  echo "$row"
done
