#!/usr/bin/env bash
# Regenerates the Python gRPC stubs under tito/v1/ from protos/tito/v1/environment.proto.
# The stubs are committed; tests/test_protos.py checks they match a fresh generation.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=. protos/tito/v1/environment.proto
