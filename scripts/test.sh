#!/usr/bin/env bash
# One command: set up everything the tests need (environments, zoo, a real Mosquitto broker
# binary — the tests start their own broker processes — PostgreSQL for the hub server's
# tests, which likewise start their own cluster, Chromium for its dashboard, ffmpeg and
# GStreamer's RTSP server for the camera tests), then run the
# whole suite. Set-up steps print one line each; their output is in .setup-logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/steps.sh
scripts/setup.sh
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

apt_install() {  # apt_install SERVICE-TO-DISABLE|- PACKAGE…
  local service=$1
  shift
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@"
  # The tests run their own brokers / clusters on ephemeral ports; the packaged ones are not needed.
  [ "$service" = - ] || $SUDO systemctl disable --now "$service" || true
}

if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
  run_step "installing mosquitto (Debian package)" mosquitto apt_install mosquitto mosquitto
fi
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  run_step "installing PostgreSQL (Debian package; the hub server tests start their own)" \
    postgresql apt_install postgresql postgresql
fi
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  run_step "installing Chromium and its driver (Debian packages; the dashboard tests)" \
    chromium apt_install - chromium chromium-driver
fi
if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
  run_step "installing HAProxy (Debian package; the replica tests start their own)" \
    haproxy apt_install haproxy haproxy
fi
if ! command -v ffmpeg >/dev/null 2>&1 \
  || ! /usr/bin/python3 -c "import gi; gi.require_version('GstRtspServer', '1.0')" 2>/dev/null; then
  run_step "installing ffmpeg and GStreamer's RTSP server (Debian packages; the camera tests)" \
    rtsp apt_install - ffmpeg python3-gi gstreamer1.0-rtsp gir1.2-gst-rtsp-server-1.0 \
    gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly gstreamer1.0-plugins-bad \
    gstreamer1.0-libav
fi
printf '\n==> lint and types (ruff, mypy)\n' >&2
.venv/bin/ruff check edgeagent tests scripts devtools
.venv/bin/ruff format --check --quiet edgeagent tests scripts devtools
.venv/bin/mypy edgeagent
printf '\n==> tests\n' >&2
# Two workers, one test file at a time each (a file's module fixtures are built once): most
# tests wait on sockets and child processes, so two finish in about two thirds of one's time.
# EDGEAGENT_TEST_WORKERS=0 (or `scripts/test.sh -n 0`) runs it in one process.
exec .venv/bin/python -m pytest -q -n "${EDGEAGENT_TEST_WORKERS:-2}" --dist loadfile "$@"
