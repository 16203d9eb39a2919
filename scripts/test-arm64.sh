#!/usr/bin/env bash
# Prove the agent on arm64: an arm64 Debian root run under qemu user emulation.
#
#   scripts/test-arm64.sh [--suite bookworm|trixie] [--checks LIST] [--source worktree|head]
#                         [--rebuild] [--unit-args ARGS] [--list]
#
# Builds once (cached under .arm64/, gitignored) an arm64 Debian root with mmdebstrap, then
# runs these checks, each bounded by a time-out, and prints one line per check, PASS / FAIL /
# SKIP with how long it took (the script's own time: emulated inference speed is no measure of
# a board and is never reported), and the report in .arm64/<suite>-report.txt:
#   install       the agent's wheel (built here from --source) with its arm64 dependency wheels
#                 (downloaded here from PyPI for the root's Python and glibc; installed offline
#                 inside), and the runtimes importable there;
#   profile-emulated, profile-pi5, profile-rk3588
#                 `edgeagent profile` on the emulated machine and on the Pi 5 / RK3588 fixture
#                 trees: the expected profile, a working candidate for both zoo models;
#   answers, compare
#                 the digits classifier and the shapes detector served by the daemon with each
#                 installed runtime × precision, real images over the Unix socket; the same
#                 done on this x86_64 host; the same top-1 and boxes within tolerance;
#   governor      the daemon's governor against the Raspberry Pi 5 sysfs fixture and its
#                 vcgencmd stand-in: normal, then firmware throttling → hot and power-save;
#   install-device  scripts/install-device.sh --root into a throw-away root (Pi 5 board tree);
#   unit          pytest tests/unit inside (--unit-args adds pytest arguments).
# --checks runs only the named ones (comma-separated); --rebuild makes the root anew;
# --source head copies the committed tree (default: the working tree, untracked files too).
# Needs root (mounts, chroot), qemu-user-static and mmdebstrap (installed with apt-get when
# missing), binfmt_misc (mounted and qemu-aarch64 registered when missing), .venv and zoo/
# (scripts/setup.sh, run when missing). Exit status: 0 every check passed or was skipped;
# 1 a check failed; 2 bad arguments or a missing precondition.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
source scripts/arm64/lib.sh

SUITE=bookworm
CHECKS=all
SOURCE_FROM=worktree
REBUILD=0
UNIT_ARGS=""
ALL_CHECKS=(install profile-emulated profile-pi5 profile-rk3588 answers compare governor
  install-device unit)
while (($#)); do
  case "$1" in
    --suite) SUITE="${2:?--suite needs bookworm or trixie}"; shift 2 ;;
    --checks) CHECKS="${2:?--checks needs a list}"; shift 2 ;;
    --source) SOURCE_FROM="${2:?--source needs worktree or head}"; shift 2 ;;
    --rebuild) REBUILD=1; shift ;;
    --unit-args) UNIT_ARGS="${2?}"; shift 2 ;;
    --list) printf '%s\n' "${ALL_CHECKS[@]}"; exit 0 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "test-arm64: unknown argument: $1" >&2; exit 2 ;;
  esac
done
case "$SUITE" in
  bookworm) PY=3.11 GLIBC=36 ;;
  trixie) PY=3.13 GLIBC=41 ;;
  *) echo "test-arm64: --suite must be bookworm or trixie" >&2; exit 2 ;;
esac
[[ "$SOURCE_FROM" == worktree || "$SOURCE_FROM" == head ]] \
  || { echo "test-arm64: --source must be worktree or head" >&2; exit 2; }
[[ "$CHECKS" == all ]] && CHECKS=$(IFS=,; echo "${ALL_CHECKS[*]}")
for name in ${CHECKS//,/ }; do
  [[ " ${ALL_CHECKS[*]} " == *" $name "* ]] || { echo "test-arm64: unknown check $name" >&2; exit 2; }
done
wanted() { [[ ",$CHECKS," == *",$1,"* ]]; }

CACHE=$REPO/.arm64
ROOT=$CACHE/$SUITE-arm64
WHEELS=$CACHE/wheels-cp${PY/./}-aarch64
DIST=$CACHE/dist
LOGS=$CACHE/logs-$SUITE
REPORT=$CACHE/$SUITE-report.txt
mkdir -p "$CACHE" "$LOGS"
[[ -f "$CACHE/.gitignore" ]] || echo '*' >"$CACHE/.gitignore"
: >"$REPORT"
STARTED=$SECONDS

# ---- preconditions and the cached root -------------------------------------------------------
((EUID == 0)) || exec sudo --preserve-env=PATH "$0" "$@"
note "arm64 check of edgeagent on Debian $SUITE (Python $PY), source: $SOURCE_FROM"
need_host_tools
register_binfmt || exit 2
[[ -x .venv/bin/python && -f zoo/digits_mnv3/model.toml && -f zoo/shapes_grid_mnv2/model.toml ]] \
  || { note "no .venv or zoo/: running scripts/setup.sh first"; scripts/setup.sh; }
build_root "$ROOT" "$SUITE" "$REBUILD" || exit 2
trap 'unmount_root "$ROOT"' EXIT
mount_root "$ROOT"
stage_source "$ROOT/src" "$SOURCE_FROM"
build_wheels "$ROOT/src" "$DIST" "$WHEELS" "$PY" "$GLIBC" || exit 2
bind_ro "$DIST" "$ROOT/dist"
bind_ro "$WHEELS" "$ROOT/wheels"
rm -rf "$ROOT/out" && mkdir -p "$ROOT/out"

# ---- checks ----------------------------------------------------------------------------------
FAILED=0
in_root_command "$ROOT"
VENV=/opt/arm64-check
IN="$VENV/bin/python"
wanted install && check install 1800 "${IN_ROOT[@]}" bash scripts/arm64/venv.sh "$VENV"
if ! [[ -x "$ROOT$VENV/bin/edgeagent" ]]; then
  for name in ${CHECKS//,/ }; do
    [[ $name == install ]] || skip "$name" "the agent is not installed in the root (check install)"
  done
else
  for board in emulated pi5 rk3588; do
    wanted "profile-$board" \
      && check "profile-$board" 1800 "${IN_ROOT[@]}" "$IN" scripts/arm64/profile_check.py "$board" \
        --out "/out/profile-$board.json"
  done
  if wanted answers || wanted compare; then
    check answers-x86_64 900 .venv/bin/python scripts/arm64/answers.py --out "$CACHE/x86_64.json"
    check answers 3600 "${IN_ROOT[@]}" "$IN" scripts/arm64/answers.py --out /out/arm64.json
  fi
  wanted compare && check compare 120 .venv/bin/python scripts/arm64/compare.py \
    "$CACHE/x86_64.json" "$ROOT/out/arm64.json"
  wanted governor && check governor 900 "${IN_ROOT[@]}" "$IN" scripts/arm64/governor_check.py
  wanted install-device && check install-device 2400 "${IN_ROOT[@]}" bash scripts/arm64/install_device_check.sh
  # shellcheck disable=SC2086  # UNIT_ARGS is a list of words on purpose
  wanted unit && check unit 7200 "${IN_ROOT[@]}" bash scripts/arm64/unit.sh "$VENV" $UNIT_ARGS
fi
note "total: $((SECONDS - STARTED)) s (logs: ${LOGS#"$REPO"/}/, report: ${REPORT#"$REPO"/})"
((FAILED == 0))
