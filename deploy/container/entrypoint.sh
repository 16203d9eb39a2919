#!/bin/sh
# The container image's entrypoint: give the agent its directories, then run "$@" as the agent.
#
# `docker run -v /run/edgeagent:/run/edgeagent` makes a missing host directory root-owned, mode
# 0755, and a bind-mounted state directory is whatever the host made it: the non-root agent
# could not create its socket there. Started as root (the image's default), this gives
# $RUNTIME_DIRECTORY and $STATE_DIRECTORY (the socket's and the state's directory, top level
# only) to $EDGEAGENT_USER's uid and gid (or $EDGEAGENT_UID / $EDGEAGENT_GID), mode 0750, when
# they do not own them, and then runs "$@" as them with setpriv (util-linux): the user's
# supplementary groups plus those the container was started with
# (--group-add render: the accelerators' device nodes), no new privileges. Started as any other
# user (docker run --user), it changes nothing: those directories must already be that user's.
set -eu

if [ "$(id -u)" -ne 0 ]; then
  exec "$@"
fi
user="${EDGEAGENT_USER:-edgeagent}"
image_uid="$(id -u "$user")" || { echo "edgeagent-entrypoint: no user $user (EDGEAGENT_USER)" >&2; exit 1; }
image_gid="$(id -g "$user")"
# EDGEAGENT_UID / EDGEAGENT_GID: other ids than the image's, for a host where one of them is
# taken (whoever has the gid of the host's /run/edgeagent may use the agent's socket).
uid="${EDGEAGENT_UID:-$image_uid}"
gid="${EDGEAGENT_GID:-$image_gid}"
for id in "UID=$uid" "GID=$gid"; do
  case "${id#*=}" in
    '' | *[!0-9]*) number=0 ;;
    *) number="${id#*=}" ;;
  esac
  if [ "$number" -le 0 ] 2>/dev/null || [ "$number" -gt 4294967294 ]; then
    echo "edgeagent-entrypoint: EDGEAGENT_$id: want a number above 0 (never root's)" >&2
    exit 1
  fi
done
for dir in "${RUNTIME_DIRECTORY:-}" "${STATE_DIRECTORY:-}"; do
  dir="${dir%%:*}"  # systemd's form: the first of a colon-separated list, as the agent reads it
  [ -n "$dir" ] || continue
  mkdir -p "$dir"
  if [ "$(stat -c %u:%g "$dir")" != "$uid:$gid" ]; then
    echo "edgeagent-entrypoint: giving $dir to $user as $uid:$gid (was $(stat -c '%U:%G %a' "$dir"))" >&2
    chown "$uid:$gid" "$dir"
    chmod 0750 "$dir"
  fi
done
export HOME
HOME="$(getent passwd "$user" | cut -d: -f6)"  # the user's, not root's: a cache goes there
# The supplementary groups: the user's and the container's (--group-add), never root's group
# nor the image's gid when EDGEAGENT_GID replaces it.
groups="$( { id -G; id -G "$user"; } | tr ' ' '\n' | grep -vx -e 0 -e "$image_gid" | sort -un | paste -sd, -)"
if [ -n "$groups" ]; then groups="--groups=$groups"; else groups="--clear-groups"; fi
exec setpriv --reuid="$uid" --regid="$gid" "$groups" --no-new-privs -- "$@"
