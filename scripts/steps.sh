# Sourced by scripts/setup.sh and scripts/test.sh: one line per set-up step, its noise in a log.
#
#   run_step "runtime environment (.venv)" venv  COMMAND [ARG…]
#
# prints "==> runtime environment (.venv) ... done in 41 s" and sends everything COMMAND writes
# to $SETUP_LOGS/venv.log (default .setup-logs/). When COMMAND fails, the last $STEP_TAIL_LINES
# lines of that log and its path are printed and run_step returns COMMAND's exit status, so a
# caller under `set -e` stops with it. COMMAND may be a shell function: it runs in a subshell
# with `set -e` in force (started in the background, since bash ignores `set -e` in anything
# run as part of `cmd || …`), so its first failing command ends the step.

SETUP_LOGS=${SETUP_LOGS:-.setup-logs}
STEP_TAIL_LINES=${STEP_TAIL_LINES:-40}

run_step() {
  local title=$1 name=$2
  shift 2
  mkdir -p "$SETUP_LOGS"
  local log="$SETUP_LOGS/$name.log" started=$SECONDS status=0
  printf '==> %s ... ' "$title" >&2
  (
    set -e
    "$@"
  ) >"$log" 2>&1 </dev/null &
  wait $! || status=$?
  local took=$((SECONDS - started))
  if [ "$status" -eq 0 ]; then
    printf 'done in %d s\n' "$took" >&2
    return 0
  fi
  printf 'FAILED (exit %d) after %d s; the end of its log:\n' "$status" "$took" >&2
  tail -n "$STEP_TAIL_LINES" "$log" | sed 's/^/    /' >&2
  printf '    full log: %s\n' "$log" >&2
  return "$status"
}

# Helpers of the scripts that build one zoo package (coco_detector.sh, language_model.sh).

# usage_of SCRIPT: the comment block after SCRIPT's shebang, which is its --help.
usage_of() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$1"; }

# swap_in STAGED OUT: the finished package directory STAGED replaces OUT whole (OUT moved aside
# first), so an agent serving OUT never reads half of one.
swap_in() {
  local staged=$1 out=$2 old
  old="$(dirname "$out")/.$(basename "$out").old"
  rm -rf "$old"
  [[ ! -e "$out" ]] || mv "$out" "$old"
  mv "$staged" "$out"
  rm -rf "$old"
}
