#!/bin/sh
# The container image's entrypoint: give the agent its directories, then run "$@" as the agent.
#
# `docker run -v /run/edgeagent:/run/edgeagent` makes a missing host directory root-owned, mode
# 0755, and a bind-mounted state directory is whatever the host made it: the non-root agent
# could not create its socket there. Started as root (the image's default), this gives
# $RUNTIME_DIRECTORY and $STATE_DIRECTORY (the socket's and the state's directory, top level
# only) to $EDGEAGENT_USER, mode 0750, when that user does not own them, and then runs "$@" as
# that user with setpriv (util-linux): its groups plus those the container was started with
# (--group-add render: the accelerators' device nodes), no new privileges. Started as any other
# user (docker run --user), it changes nothing: those directories must already be that user's.
set -eu

if [ "$(id -u)" -ne 0 ]; then
  exec "$@"
fi
user="${EDGEAGENT_USER:-edgeagent}"
uid="$(id -u "$user")" || { echo "edgeagent-entrypoint: no user $user (EDGEAGENT_USER)" >&2; exit 1; }
gid="$(id -g "$user")"
for dir in "${RUNTIME_DIRECTORY:-}" "${STATE_DIRECTORY:-}"; do
  dir="${dir%%:*}"  # systemd's form: the first of a colon-separated list, as the agent reads it
  [ -n "$dir" ] || continue
  mkdir -p "$dir"
  if [ "$(stat -c %u "$dir")" != "$uid" ]; then
    echo "edgeagent-entrypoint: giving $dir to $user (was $(stat -c '%U:%G %a' "$dir"))" >&2
    chown "$uid:$gid" "$dir"
    chmod 0750 "$dir"
  fi
done
export HOME
HOME="$(getent passwd "$user" | cut -d: -f6)"  # the user's, not root's: a cache goes there
groups="$( { id -G; id -G "$user"; } | tr ' ' '\n' | grep -vx 0 | sort -un | paste -sd, -)"
exec setpriv --reuid="$uid" --regid="$gid" --groups="$groups" --no-new-privs -- "$@"
