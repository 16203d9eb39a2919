# syntax=docker/dockerfile:1
# edgeagent as a container: the same scripts/install-device.sh a board runs (--container: no
# systemd unit), on a slim Python base. The agent runs as the non-root user edgeagent: the
# entrypoint (deploy/container/entrypoint.sh) starts as root only to give it /run/edgeagent and
# /var/lib/edgeagent (a bind-mounted host directory is root's), then drops to it with setpriv.
#
#   docker build -t edgeagent .                                   # extras: litert,openvino,grpc
#   docker build -t edgeagent --build-arg EXTRAS=litert .         # a Raspberry Pi / RK3588
#   sudo install -d /run/edgeagent     # podman, unlike docker, makes no missing bind source
#   docker run -d --name edgeagent -v "$PWD/zoo:/models:ro" -v edgeagent-state:/var/lib/edgeagent \
#     -v /run/edgeagent:/run/edgeagent -p 127.0.0.1:8080:8080 edgeagent
#   podman build --format docker -t edgeagent .   # OCI images (podman's default) drop HEALTHCHECK
#
# Accelerators are passed in, never baked in (README "Container"): --device /dev/dri and
# --group-add "$(getent group render | cut -d: -f3)" (Intel iGPU, Mali), --device /dev/accel
# (Intel NPU), --device /dev/apex_0 (Coral PCIe), --runtime nvidia or --gpus all with
# --build-arg ONNXRUNTIME=onnxruntime-gpu (NVIDIA; on Jetson build FROM an l4t base instead).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: the wheel, from the checkout ----------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY edgeagent ./edgeagent
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# ---- runtime --------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
ARG EXTRAS=litert,openvino,grpc
ARG ONNXRUNTIME=""
# The agent's uid and gid, which the host sees on a bind-mounted /run/edgeagent: whoever has
# that gid on the host may use the socket. 61000 is above what useradd and groupadd hand out
# on a host (system ids below 1000, people up to 60000 on Debian, Ubuntu, Fedora) and below
# systemd's dynamic users (61184-65519). Check it with `getent group 61000` on the host; change
# it here or at run time (EDGEAGENT_UID / EDGEAGENT_GID, the entrypoint).
ARG EDGEAGENT_UID=61000
ARG EDGEAGENT_GID=61000
# The same system user the board gets from systemd/edgeagent.sysusers, at fixed ids.
RUN groupadd --system --gid "$EDGEAGENT_GID" edgeagent \
 && useradd --system --uid "$EDGEAGENT_UID" --gid edgeagent --home-dir /var/lib/edgeagent \
      --no-create-home --comment "edgeagent inference agent" edgeagent \
 && install -d -o edgeagent -g edgeagent -m 0750 /var/lib/edgeagent /run/edgeagent /models
COPY --from=build /dist /dist
COPY scripts/install-device.sh /usr/local/sbin/install-device.sh
COPY deploy/container/entrypoint.sh /usr/local/sbin/edgeagent-entrypoint
RUN install-device.sh --container --source /dist/edgeagent-*.whl --extras "$EXTRAS" \
      ${ONNXRUNTIME:+--onnxruntime "$ONNXRUNTIME"} --pip-args "--no-cache-dir" \
 && rm -rf /dist

# systemd would set these for the unit; here they place the state, the socket and the models.
ENV PATH=/opt/edgeagent/bin:$PATH \
    STATE_DIRECTORY=/var/lib/edgeagent \
    RUNTIME_DIRECTORY=/run/edgeagent \
    EDGEAGENT_MODELS_DIR=/models \
    EDGEAGENT_USER=edgeagent \
    PYTHONUNBUFFERED=1
VOLUME ["/models", "/var/lib/edgeagent", "/run/edgeagent"]
# TCP listens on the container's loopback unless the mounted /etc/edgeagent/agent.toml sets
# tcp_host = "0.0.0.0", a token and [tls] or tls = "off" (the agent refuses a non-loopback
# listener without them). 8081: KServe v2 gRPC when [grpc] enabled (deploy/kserve, deploy/helm).
EXPOSE 8080 8081
# No USER: the entrypoint drops to $EDGEAGENT_USER after preparing the directories (with
# `docker run --user edgeagent` it prepares nothing, and they must already be writable).
WORKDIR /var/lib/edgeagent
# Over the Unix socket, which needs no token (TCP answers 401 without one under the default
# config); exit 0 ready, 1 not (edgeagent health --help).
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["/opt/edgeagent/bin/edgeagent", "health"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/sbin/edgeagent-entrypoint", "/opt/edgeagent/bin/edgeagent"]
CMD ["run"]
