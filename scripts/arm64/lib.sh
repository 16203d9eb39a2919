# Sourced by scripts/test-arm64.sh: the cached arm64 root, its mounts, the wheels, and the
# one-line-per-check bookkeeping. Expects REPO, LOGS, REPORT and FAILED from the caller.

# The root's packages: Python with venv and pip for the agent, git for the unit tests that
# list the tree, procps/file for the checks. A change here is installed into a cached root.
ROOT_PACKAGES="python3,python3-venv,python3-pip,ca-certificates,procps,file,git"
MIRROR=${ARM64_MIRROR:-http://deb.debian.org/debian}
# The extras whose arm64 wheels are fetched: the runtimes, and what the unit tests import.
WHEEL_EXTRAS="dev,litert,openvino,package,hub"

note() { echo "$*" | tee -a "$REPORT" >&2; }

# check NAME SECONDS COMMAND…: run it bounded, its output in $LOGS/NAME.log, one report line
# (its last 'summary:' line when it prints one); exit 77 means skipped, not failed.
check() {
  local name=$1 limit=$2 log="$LOGS/$1.log" started=$SECONDS rc=0 status summary
  shift 2
  echo "==> $name (at most $limit s)" >&2
  timeout --kill-after=30 "$limit" "$@" >"$log" 2>&1 </dev/null || rc=$?
  case $rc in
    0) status=PASS ;;
    77) status=SKIP ;;
    124 | 137) status=FAIL summary="timed out after $limit s" ;;
    *) status=FAIL ;;
  esac
  [[ $status == FAIL ]] && FAILED=1
  summary=${summary:-$(grep '^summary: ' "$log" | tail -n 1 | cut -c10- || true)}
  [[ -n $summary || $rc == 0 ]] || summary="exit $rc: $(tail -n 1 "$log")"
  printf '%-18s %-4s %5d s  %s\n' "$name" "$status" "$((SECONDS - started))" "$summary" \
    | tee -a "$REPORT" >&2
  if [[ $status == FAIL ]]; then
    tail -n 25 "$log" | sed 's/^/    | /' | tee -a "$REPORT" >&2
    echo "    full log: ${log#"$REPO"/}" | tee -a "$REPORT" >&2
  fi
  return 0
}

skip() { printf '%-18s SKIP     0 s  %s\n' "$1" "$2" | tee -a "$REPORT" >&2; }

need_host_tools() {
  local missing=()
  command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
  command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
  ((${#missing[@]} == 0)) && return 0
  note "installing ${missing[*]} (Debian packages)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# The kernel must hand aarch64 ELF files to qemu (binfmt_misc, flag F: the interpreter is
# opened now, so it works inside the chroot without a copy there).
register_binfmt() {
  local fs=/proc/sys/fs/binfmt_misc
  [[ -e $fs/status ]] || mount -t binfmt_misc binfmt_misc "$fs" 2>/dev/null || {
    note "binfmt_misc cannot be mounted here: arm64 programs cannot run (needs a privileged container)"
    return 1
  }
  if [[ ! -e $fs/qemu-aarch64 ]]; then
    if command -v update-binfmts >/dev/null && update-binfmts --enable qemu-aarch64 2>/dev/null; then :
    else cat /usr/lib/binfmt.d/qemu-aarch64.conf >"$fs/register" || {
      note "could not register qemu-aarch64 with binfmt_misc"
      return 1
    }
    fi
  fi
  note "binfmt_misc: qemu-aarch64 $(head -n 1 "$fs/qemu-aarch64"), $(qemu-aarch64-static --version | head -n 1)"
}

mounted_below() { grep -q " $1/" /proc/self/mounts; }

# build_root DIR SUITE REBUILD: the arm64 root, built once by mmdebstrap; packages added to
# ROOT_PACKAGES later are installed into the cached root instead of building it again.
build_root() {
  local root=$1 suite=$2 rebuild=$3 started=$SECONDS
  unmount_root "$root"
  if mounted_below "$root"; then note "$root still has mounts: not touching it"; return 1; fi
  if ((rebuild)); then rm -rf "$root"; fi
  if [[ -f $root/.arm64-root-ok ]]; then
    if [[ "$(cat "$root/.arm64-root-ok")" != "$ROOT_PACKAGES" ]]; then
      note "adding packages to the cached root: $ROOT_PACKAGES"
      chroot "$root" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends ${ROOT_PACKAGES//,/ } && apt-get clean" \
        >"$LOGS/root.log" 2>&1 || { note "apt-get in the root failed: $LOGS/root.log"; return 1; }
      echo "$ROOT_PACKAGES" >"$root/.arm64-root-ok"
    fi
    note "root: cached ${root#"$REPO"/} ($(chroot "$root" python3 -V))"
    return 0
  fi
  rm -rf "$root.tmp"
  note "root: building ${root#"$REPO"/} with mmdebstrap (arm64, $suite; several minutes, once)"
  mmdebstrap --mode=root --arch=arm64 --variant=apt --include="$ROOT_PACKAGES" \
    "$suite" "$root.tmp" "$MIRROR" >"$LOGS/root.log" 2>&1 \
    || { note "mmdebstrap failed: the end of ${LOGS#"$REPO"/}/root.log:"; tail -n 15 "$LOGS/root.log" >&2; return 1; }
  echo "$ROOT_PACKAGES" >"$root.tmp/.arm64-root-ok"
  mv "$root.tmp" "$root"
  note "root: built in $((SECONDS - started)) s ($(chroot "$root" python3 -V))"
}

# /proc, /dev and the host's /sys, with two files of it masked. Under qemu-user the kernel's
# /proc/cpuinfo is the x86_64 host's: onnxruntime's cpuinfo library, given the CPU lists in
# /sys/devices/system/cpu/{possible,present} too, finds no Arm processor entries and crashes
# (SIGSEGV) on import; with those two files empty it warns and runs. OpenVINO's CPU plugin
# needs the rest of /sys (hwloc's topology), or it crashes when compiling. A real board's /sys
# and /proc agree, so neither happens there.
mount_root() {
  local root=$1 file
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"
  : >"$CACHE/empty"
  for file in possible present; do
    mount --bind "$CACHE/empty" "$root/sys/devices/system/cpu/$file"
  done
  mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"
}

bind_ro() {
  mkdir -p "$2"
  mount --bind "$1" "$2" && mount -o remount,bind,ro "$2"
}

# Every mount below the root, deepest first; lazily when busy (a process still exiting).
unmount_root() {
  local root=$1 target
  while read -r target; do
    umount "$target" 2>/dev/null || umount -l "$target" 2>/dev/null || true
  done < <(awk -v r="$root/" 'index($2, r) == 1 { print $2 }' /proc/self/mounts | sort -r)
}

# stage_source DEST worktree|head: the checkout the root sees (and the wheel is built from),
# with the zoo.
stage_source() {
  local dest=$1 from=$2
  rm -rf "$dest" && mkdir -p "$dest/zoo"
  if [[ $from == head ]]; then
    git archive HEAD | tar -x -C "$dest"
  else  # tracked and untracked-but-not-ignored files; deleted ones are left out
    git ls-files -z -c -o --exclude-standard \
      | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$dest"
  fi
  # The whole zoo (the unit tests' zoo fixture wants all of it), hard-linked: nothing writes it.
  cp -al zoo/. "$dest/zoo/" 2>/dev/null || cp -a zoo/. "$dest/zoo/"
  git rev-parse --short HEAD >"$dest/.arm64-source"
}

# build_wheels SRC DIST WHEELS PY GLIBC: the agent's wheel from SRC, and the arm64 wheels of
# its dependencies for CPython PY on glibc 2.GLIBC (every manylinux tag up to it; pip does not
# expand one), downloaded from PyPI here; again only when pyproject.toml or the extras change.
build_wheels() {
  local src=$1 dist=$2 wheels=$3 py=$4 glibc=$5 platforms=() v stamp
  rm -rf "$dist" && mkdir -p "$dist"
  "$REPO/.venv/bin/python" -m pip wheel -q --no-deps -w "$dist" "$src" >"$LOGS/wheel.log" 2>&1 \
    || { note "building the agent's wheel failed: $LOGS/wheel.log"; return 1; }
  for ((v = 17; v <= glibc; v++)); do platforms+=(--platform "manylinux_2_${v}_aarch64"); done
  platforms+=(--platform manylinux2014_aarch64 --platform linux_aarch64)
  stamp="$(sha256sum "$src/pyproject.toml" | cut -c1-16) $WHEEL_EXTRAS cp$py glibc2.$glibc"
  if [[ -f $wheels/.stamp && "$(cat "$wheels/.stamp")" == "$stamp" ]]; then
    note "wheels: $(basename "$dist"/*.whl); arm64 dependencies cached ($(ls "$wheels" | wc -l) wheels)"
    return 0
  fi
  rm -rf "$wheels" && mkdir -p "$wheels"
  "$REPO/.venv/bin/python" -m pip download -q --only-binary=:all: "${platforms[@]}" \
    --python-version "$py" --implementation cp --abi "cp${py/./}" -d "$wheels" \
    "$src[$WHEEL_EXTRAS]" >"$LOGS/download.log" 2>&1 || {
    note "no complete set of arm64 wheels for Python $py: the end of ${LOGS#"$REPO"/}/download.log:"
    tail -n 5 "$LOGS/download.log" >&2
    return 1
  }
  rm -f "$wheels"/edgeagent-*  # the agent comes from $dist, built from the staged source
  echo "$stamp" >"$wheels/.stamp"
  note "wheels: $(basename "$dist"/*.whl); arm64 dependencies downloaded ($(ls "$wheels" | wc -l) wheels)"
}

# "${IN_ROOT[@]}" COMMAND…: run in the arm64 root, in /src, with a clean environment (an array,
# not a function, so that `timeout` in check can run it).
in_root_command() {
  IN_ROOT=(chroot "$1" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root
    LANG=C.UTF-8 TMPDIR=/tmp /bin/bash -c 'cd /src && exec "$@"' in_root)
}
