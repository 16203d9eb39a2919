#!/bin/sh
# Regenerate edgeagent/api/proto/inference_pb2.py(.pyi) from inference.proto.
# Needs grpcio-tools (the dev extra); the generated modules are committed so that a device
# needs only grpcio and protobuf at run time. Service handlers are written by hand
# (edgeagent/api/grpc_server.py), so no *_pb2_grpc module is generated.
set -eu
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
"$PYTHON" -m grpc_tools.protoc -I edgeagent/api/proto \
  --python_out=edgeagent/api/proto --pyi_out=edgeagent/api/proto \
  edgeagent/api/proto/inference.proto
