#!/bin/sh
# Regenerate edgeagent/api/grpc/proto/inference_pb2.py(.pyi) from inference.proto.
# Needs grpcio-tools (the dev extra); the generated modules are committed so that a device
# needs only grpcio and protobuf at run time. Service handlers are written by hand
# (edgeagent/api/grpc/server.py), so no *_pb2_grpc module is generated.
set -eu
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
"$PYTHON" -m grpc_tools.protoc -I edgeagent/api/grpc/proto \
  --python_out=edgeagent/api/grpc/proto --pyi_out=edgeagent/api/grpc/proto \
  edgeagent/api/grpc/proto/inference.proto
