"""The committed stubs under tito/v1/ are exactly what protoc makes from protos/ (reproducible), with the
grpcio-tools of .venvs/client (scripts/venvs/client.sh: the one whose gencode runs on the client's protobuf floor)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GENERATED = ["environment_pb2.py", "environment_pb2.pyi", "environment_pb2_grpc.py"]


@pytest.mark.framework  # a skip fails under TITO_REQUIRE_FRAMEWORKS=1
def test_stubs_match_the_proto(tmp_path):
    protoc_python = REPO / ".venvs" / "client" / "bin" / "python"
    if not protoc_python.exists():
        pytest.skip(".venvs/client is missing: bash scripts/framework_venvs.sh client")
    subprocess.run(
        [str(protoc_python), "-m", "grpc_tools.protoc", f"-I{REPO / 'protos'}", f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", str(REPO / "protos/tito/v1/environment.proto")],
        check=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "tito" / "v1" / name).read_text()
        committed = (REPO / "tito" / "v1" / name).read_text()
        assert fresh == committed, f"tito/v1/{name} is stale: run scripts/gen_protos.sh and commit"


def test_fixed_names_of_the_contract():
    from tito.v1 import environment_pb2 as pb

    from tito.conformance import FIXED_FIELDS, FIXED_METHODS

    service = pb.DESCRIPTOR.services_by_name["Environment"]
    assert service.full_name == "tito.v1.Environment"
    assert {m.name for m in service.methods} >= FIXED_METHODS
    fields = FIXED_FIELDS
    for message, names in fields.items():
        have = set(pb.DESCRIPTOR.message_types_by_name[message].fields_by_name)
        assert names <= have, (message, names - have)
