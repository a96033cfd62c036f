#!/usr/bin/env bash
# Regenerates the Python gRPC stubs under tito/v1/ from protos/tito/v1/environment.proto.
# The stubs are committed; tests/test_protos.py checks they match a fresh generation.
# They are made with .venvs/client's grpcio-tools 1.74.0 (scripts/venvs/client.sh): its gencode runs on
# protobuf >= 6.31.1, the floor pyproject.toml states; a newer grpcio-tools would raise that floor.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venvs/client/bin/python}
[ -x "$PY" ] || { echo "no $PY: bash scripts/framework_venvs.sh client" >&2; exit 2; }
"$PY" -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=. protos/tito/v1/environment.proto
