#!/usr/bin/env bash
# Install edgeagent on this device (or into --root DIR, or as a container image's steps).
#
#   scripts/install-device.sh [--source SPEC] [--extras LIST] [--onnxruntime SPEC]
#                             [--allow-ip ADDR]... [--pip-args ARGS] [--root DIR]
#                             [--board-root DIR] [--container] [--no-start] [--dry-run]
#
# Steps (each one printed; --dry-run prints them and changes nothing):
#   1. a venv at <root>/opt/edgeagent with edgeagent from SPEC (a wheel or a source directory;
#      default: this checkout);
#   2. the board detected as the agent does (`edgeagent profile --board --json`; --board-root
#      reads another tree's /proc, /sys, /dev, as the tests do) and the extras
#      its profile's candidates need (litert, openvino) installed; --extras overrides;
#      --onnxruntime replaces the PyPI onnxruntime (e.g. Jetson's CUDA/TensorRT build);
#   3. unless --container (the image makes it): the sysusers file and systemd-sysusers, so the
#      user and group edgeagent exist before any file is given to them (skipped with --root);
#   4. /etc/edgeagent/agent.toml from the package's agent.example.toml (never overwritten), mode
#      0640 root:edgeagent: it may hold [server] token, which only the agent may read (an
#      existing file is tightened to that mode too);
#   5. `edgeagent config check` of that file (a bad file stops the install, exit 2), and each
#      [server] token_file / admin_token_file it names set to 0640 root:edgeagent;
#   6. unless --container: the unit and the drop-in 10-install.conf with the supplementary
#      groups that exist here (render, video, …) and IPAddressAllow= for the broker and hub
#      (--allow-ip, plus [mqtt] host resolved now); then daemon-reload and `enable --now`
#      (skipped with --root or --no-start).
# Every file and directory it writes or gives a mode to must not be a symbolic link (with --root,
# nor any directory on the way below DIR): a planted link is refused before anything is changed,
# never followed out of the root. Modes are its own (umask 022), whatever the caller's umask.
# Exit status: 0 installed; 2 bad arguments or config; 1 a step failed or a link was refused.
set -euo pipefail
umask 022  # directories 0755 and files 0644 unless set otherwise below, under any caller's umask

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SOURCE="$(dirname "$HERE")"
ROOT=""
EXTRAS=""
EXTRAS_SET=0
ONNXRUNTIME=""
PIP_ARGS=""
CONTAINER=0
START=1
DRY_RUN=0
ALLOW_IPS=()
BOARD_ROOT="/"
PYTHON="${PYTHON:-python3}"
OPTIONAL_GROUPS=(render video apex plugdev hailo)

usage() {  # the header comment above, without its '# '
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
}
die() { echo "install-device: $1" >&2; exit "${2:-1}"; }

while (($#)); do
  case "$1" in
    --source) SOURCE="${2:?--source needs a wheel, directory or requirement}"; shift 2 ;;
    --extras) EXTRAS="${2?--extras needs a list (litert,openvino or '')}"; EXTRAS_SET=1; shift 2 ;;
    --onnxruntime) ONNXRUNTIME="${2:?--onnxruntime needs a wheel or requirement}"; shift 2 ;;
    --allow-ip) ALLOW_IPS+=("${2:?--allow-ip needs an address or prefix}"); shift 2 ;;
    --pip-args) PIP_ARGS="${2?}"; shift 2 ;;
    --board-root) BOARD_ROOT="${2:?--board-root needs a directory}"; shift 2 ;;
    --root) ROOT="${2:?--root needs a directory}"; START=0; shift 2 ;;
    --container) CONTAINER=1; START=0; shift ;;
    --no-start) START=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" 2 ;;
  esac
done
if [[ -n "$ROOT" ]]; then
  [[ "$ROOT" = /* ]] || ROOT="$PWD/$ROOT"
  ROOT="${ROOT%/}"
fi

PREFIX="$ROOT/opt/edgeagent"
ETC="$ROOT/etc/edgeagent"
CONFIG="$ETC/agent.toml"
UNIT_DIR="$ROOT/etc/systemd/system"
DROPIN="$UNIT_DIR/edgeagent.service.d/10-install.conf"
SYSUSERS="$ROOT/usr/lib/sysusers.d/edgeagent.conf"
AGENT="$PREFIX/bin/edgeagent"

# Refuse a path the script is about to write, chmod or chown when it is a symbolic link, or
# (with --root) when a directory on its way below the root is one: following it would change a
# file outside the root (a planted etc/edgeagent/agent.toml -> /etc/shadow, say).
refuse_links() {
  local path="$1" here rest part
  if [[ -n "$ROOT" && "$path" == "$ROOT"/* ]]; then
    here="$ROOT"
    rest="${path#"$ROOT"/}"
    while [[ -n "$rest" ]]; do
      part="${rest%%/*}"
      if [[ "$rest" == */* ]]; then rest="${rest#*/}"; else rest=""; fi
      [[ -n "$part" ]] || continue
      here="$here/$part"
      if [[ -L "$here" ]]; then
        die "$here is a symbolic link (to $(readlink "$here")): refusing to follow it out of $ROOT; remove it and rerun"
      fi
    done
  elif [[ -L "$path" ]]; then
    die "$path is a symbolic link (to $(readlink "$path")): refusing to follow it; put the file itself there and rerun"
  fi
}

# Run a command, or only show it with --dry-run.
step() {
  echo "+ $*"
  ((DRY_RUN)) || "$@"
}

# Write stdin to a file (mode $2), or only show what would be written.
write_file() {
  local path="$1" mode="$2" content
  content="$(cat)"
  echo "+ write $path (mode $mode)"
  if ((DRY_RUN)); then
    sed 's/^/    /' <<<"$content"
  else
    mkdir -p -m 0755 "$(dirname "$path")"
    refuse_links "$path"
    printf '%s\n' "$content" >"$path"
    chmod "$mode" "$path"
  fi
}

# The group edgeagent's id on the target system, or nothing before it exists (numeric: with
# --root, the names of this machine are not the target's).
agent_gid() {
  if [[ -n "$ROOT" ]]; then
    [[ ! -f "$ROOT/etc/group" ]] || awk -F: '$1 == "edgeagent" { print $3 }' "$ROOT/etc/group"
  else
    getent group edgeagent | cut -d: -f3
  fi
}

# A file holding a secret: mode 0640, owner root, group edgeagent (the agent reads it, nobody
# else). Where the group or the right to give files away is missing, say what to run later.
secure_file() {
  local path="$1" gid
  step chmod 0640 "$path"
  gid="$(agent_gid || true)"
  if ((DRY_RUN)) && [[ -z "$gid" ]]; then
    echo "+ chown root:edgeagent $path"
  elif [[ -z "$gid" ]]; then
    echo "note: no group edgeagent in ${ROOT:-this system} yet: once systemd-sysusers has made it, run chown root:edgeagent $path"
  elif ((EUID != 0)); then
    echo "note: not root, so $path keeps its owner: run chown root:edgeagent $path"
  else
    step chown "0:$gid" "$path"
  fi
}

# A file shipped inside the installed package (edgeagent/paths.py shipped()).
shipped() {
  "$PREFIX/bin/python" -c 'import sys; from edgeagent.paths import shipped; print(shipped(sys.argv[1]))' "$1"
}

# Does group $1 exist on the target system?
group_exists() {
  if [[ -n "$ROOT" && -f "$ROOT/etc/group" ]]; then
    grep -q "^$1:" "$ROOT/etc/group"
  else
    getent group "$1" >/dev/null 2>&1
  fi
}

pip_install() {
  # shellcheck disable=SC2086  # PIP_ARGS is a list of words on purpose
  step "$PREFIX/bin/pip" install --disable-pip-version-check $PIP_ARGS "$@"
}

with_extras() {  # SPEC[EXTRAS]: pip takes extras after a wheel path or a source directory
  if [[ -n "$1" ]]; then echo "$SOURCE[$1]"; else echo "$SOURCE"; fi
}

# Every path below is checked before the first change, so a refused link changes nothing.
for path in "$PREFIX/bin" "$PREFIX/README.md" "$CONFIG" "$SYSUSERS" \
    "$UNIT_DIR/edgeagent.service" "$DROPIN"; do
  refuse_links "$path"
done

# ---- 1. venv --------------------------------------------------------------------------------
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || die "$PYTHON is older than 3.10 (edgeagent needs Python >= 3.10)" 2
[[ -x "$PREFIX/bin/python" ]] || step "$PYTHON" -m venv "$PREFIX"
pip_install "$(with_extras "$EXTRAS")"

# ---- 2. board and extras --------------------------------------------------------------------
if ((EXTRAS_SET)); then
  echo "extras: $EXTRAS (from --extras)"
elif ((DRY_RUN)) && [[ ! -x "$AGENT" ]]; then
  echo "+ $AGENT profile --board --json   # then: pip install '$SOURCE[<extras it names>]'"
else
  board="$("$AGENT" profile --board --json --root "$BOARD_ROOT")" || die "board detection failed (edgeagent profile --board)"
  read -r PROFILE EXTRAS < <("$PREFIX/bin/python" -c '
import json, sys
doc = json.load(sys.stdin)
print(doc["profile"], ",".join(doc["extras"]))' <<<"$board")
  echo "board profile: $PROFILE; extras its candidates need: ${EXTRAS:-none}"
  [[ -z "$EXTRAS" ]] || pip_install "$(with_extras "$EXTRAS")"
  if [[ "$PROFILE" == jetson-* && -z "$ONNXRUNTIME" ]]; then
    echo "note: PyPI's onnxruntime has no CUDA/TensorRT for Jetson; rerun with" \
      "--onnxruntime <onnxruntime-gpu wheel for your JetPack> (docs/install/jetson.md)"
  fi
fi
if [[ -n "$ONNXRUNTIME" ]]; then
  step "$PREFIX/bin/pip" uninstall --yes onnxruntime
  pip_install "$ONNXRUNTIME"
fi
if ((DRY_RUN)) && [[ ! -x "$AGENT" ]]; then
  echo "+ write $PREFIX/README.md (the package's README, the unit's Documentation=)"
else
  "$PREFIX/bin/python" -c 'from importlib.metadata import metadata; print(metadata("edgeagent").get_payload())' \
    | write_file "$PREFIX/README.md" 0644
fi

# ---- 3. the agent's user and group -----------------------------------------------------------
if ! ((CONTAINER)); then
  if ((DRY_RUN)) && [[ ! -x "$AGENT" ]]; then
    echo "+ install the package's systemd/edgeagent.sysusers to $SYSUSERS"
  else
    write_file "$SYSUSERS" 0644 <"$(shipped systemd/edgeagent.sysusers)"
  fi
  if [[ -z "$ROOT" ]]; then
    step systemd-sysusers "$SYSUSERS"
  else
    echo "skipped with --root: systemd-sysusers $SYSUSERS (on the device: makes the user edgeagent)"
  fi
fi

# ---- 4. config ------------------------------------------------------------------------------
if [[ -e "$CONFIG" ]]; then
  echo "keeping existing $CONFIG"
  secure_file "$CONFIG"
elif ((DRY_RUN)) && [[ ! -x "$AGENT" ]]; then
  echo "+ write $CONFIG from the package's agent.example.toml (mode 0640)"
  secure_file "$CONFIG"
else
  write_file "$CONFIG" 0640 <"$(shipped agent.example.toml)"
  secure_file "$CONFIG"
fi

# ---- 5. config check, token files -------------------------------------------------------------
if ! ((DRY_RUN)) || [[ -x "$AGENT" && -e "$CONFIG" ]]; then
  echo "+ $AGENT config check $CONFIG"
  "$AGENT" config check "$CONFIG" || die "$CONFIG is not valid: fix the lines above, then rerun" 2
  while read -r token_file; do
    refuse_links "$ROOT$token_file"
    if [[ -e "$ROOT$token_file" ]]; then secure_file "$ROOT$token_file"; fi
  done < <("$PREFIX/bin/python" -c '
import sys
from edgeagent._toml import tomllib
with open(sys.argv[1], "rb") as f:
    server = tomllib.load(f).get("server", {})
for key in ("token_file", "admin_token_file"):
    if key in server:
        print(server[key])' "$CONFIG")
else
  echo "+ $AGENT config check $CONFIG; then chmod 0640, chown root:edgeagent each [server] token_file / admin_token_file it names"
fi
((CONTAINER)) && { echo "installed into $PREFIX (container: no systemd unit)"; exit 0; }

# ---- 6. systemd -----------------------------------------------------------------------------
if ((DRY_RUN)) && [[ ! -x "$AGENT" ]]; then
  echo "+ install the package's systemd/edgeagent.service to $UNIT_DIR/edgeagent.service"
else
  write_file "$UNIT_DIR/edgeagent.service" 0644 <"$(shipped systemd/edgeagent.service)"
fi

groups=()
for group in "${OPTIONAL_GROUPS[@]}"; do
  if group_exists "$group"; then groups+=("$group"); fi
done
broker=""
if [[ -x "$AGENT" && -e "$CONFIG" ]]; then
  broker="$("$AGENT" config show --config "$CONFIG" --json | "$PREFIX/bin/python" -c '
import json, sys
doc = {row["key"]: row["value"] for row in json.load(sys.stdin)["mqtt"]}
print(doc["host"])')"
fi
resolv="${ROOT}/etc/resolv.conf"
[[ -f "$resolv" ]] || resolv=/etc/resolv.conf
if [[ -n "$broker" && ! "$broker" =~ ^[0-9.]+$|: ]]; then
  # A broker named by host name needs DNS: allow the resolvers (a local stub is localhost).
  while read -r keyword address _; do
    [[ "$keyword" == nameserver ]] || continue
    case "$address" in 127.*|::1) ;; *) ALLOW_IPS+=("$address") ;; esac
  done < "$resolv"
fi
if [[ -n "$broker" ]]; then
  while read -r address _; do
    case "$address" in
      127.*|::1|"") ;;  # loopback: the unit already allows localhost
      *) ALLOW_IPS+=("$address") ;;
    esac
  done < <(getent ahosts "$broker" 2>/dev/null | awk '{print $1}' | sort -u)
fi
{
  echo "# Written by scripts/install-device.sh for this device; rerun it after adding a group or"
  echo "# changing the broker. Groups that do not exist here are left out (they stop the unit)."
  echo "[Service]"
  if ((${#groups[@]})); then echo "SupplementaryGroups=${groups[*]}"; fi
  if ((${#ALLOW_IPS[@]})); then
    echo "# The MQTT broker ([mqtt] host${broker:+ = $broker}) and its DNS servers, --allow-ip."
    echo "IPAddressAllow=$(printf '%s\n' "${ALLOW_IPS[@]}" | sort -u | tr '\n' ' ' | sed 's/ $//')"
  fi
} | write_file "$DROPIN" 0644

if ((START)); then
  step systemctl daemon-reload
  step systemctl enable --now edgeagent
fi
if ((DRY_RUN)); then
  ((START)) || echo "not started (--root or --no-start): systemctl daemon-reload; systemctl enable --now edgeagent"
  echo "dry run: nothing was changed"
elif ((START)); then
  echo "installed and started: systemctl status edgeagent; edgeagent health; edgeagent status"
else
  echo "installed into ${ROOT:-/} (not started: start with systemctl enable --now edgeagent)"
fi
