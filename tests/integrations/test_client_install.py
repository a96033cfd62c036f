"""`pip install .` is the client alone: the wheel built from this checkout installs into a fresh venv with only
grpcio, grpcio-health-checking and protobuf, at the floors pyproject.toml states (the wheels of
scripts/venvs/client.sh, offline), and runs a real session against a real tito server."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.harness import REPO, start_server
from tests.integrations.conftest import framework_python
from tito.client import TitoClient

pytestmark = pytest.mark.framework

# What the client's wheel may bring, and nothing else (pip and setuptools come with the venv).
ALLOWED = {"tito", "grpcio", "grpcio-health-checking", "protobuf", "pip", "setuptools"}
QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]

SESSION = textwrap.dedent('''
    import json, sys
    import google.protobuf, grpc
    from tito.client import TitoClient
    from tito.types import ToolCall
    address, tokenizer_dir = sys.argv[1:3]
    with TitoClient(address) as client:
        client.wait_ready(60)
        reg = client.register_tokenizer(tokenizer_dir)
        with client.open_session("python", [{"role": "user", "content": "What is 6 * 7?"}],
                                 fingerprint=reg.fingerprint) as s:
            r = s.step(tool_calls=[ToolCall("c1", "run_python", json.dumps({"code": "print(6 * 7)"}))])
            print(json.dumps({"protobuf": google.protobuf.__version__, "grpcio": grpc.__version__,
                              "fingerprint": reg.fingerprint, "prompt_ids": list(s.prompt_ids),
                              "suffix_ids": list(r.suffix_ids), "status": r.status.name,
                              "tool": [m.content for m in r.tool_messages]}))
''')


def _wheel(out: Path) -> Path:
    """The wheel of this checkout, built from a copy (an in-tree build would leave build/ and *.egg-info here),
    with this venv's setuptools (no build isolation: nothing is downloaded)."""
    src = out / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("tito", "tito_assets", "env_server", "trainer"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(out / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = (out / "dist").glob("tito-*.whl")
    return wheel


@pytest.fixture(scope="module")
def fresh_client(tmp_path_factory) -> Path:
    """A new venv holding the client's wheel and what it pulled from the floor wheelhouse; its python."""
    wheelhouse = framework_python("client").parent.parent / "wheelhouse"
    tmp = tmp_path_factory.mktemp("client-install")
    wheel = _wheel(tmp)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheelhouse),
                    str(wheel)], check=True, timeout=300)
    return python


def test_the_wheel_installs_the_client_alone(fresh_client):
    listed = subprocess.run([str(fresh_client), "-m", "pip", "list", "--format=json"], check=True,
                            capture_output=True, text=True, timeout=120).stdout
    names = {p["name"].lower().replace("_", "-") for p in json.loads(listed)}
    assert names <= ALLOWED, f"the client pulled {sorted(names - ALLOWED)}"
    # Every module of the client path imports there; a module needing an extra says which.
    probe = textwrap.dedent('''
        import importlib, json
        for m in ("tito.client", "tito.rollout", "tito.types", "tito.integrations", "tito.wire", "tito.conformance"):
            importlib.import_module(m)
        import tito.rollout.vllm as v
        said = []
        for use in (v.on_cpu_platform, lambda: importlib.import_module("tito.integrations.openenv")):
            try:
                use()
            except ImportError as e:
                said.append(str(e))
        print(json.dumps(said))
    ''')
    out = subprocess.run([str(fresh_client), "-c", probe], check=True, capture_output=True, text=True,
                         timeout=120, cwd="/").stdout
    vllm, openenv = json.loads(out)
    assert "pip install 'tito[vllm]'" in vllm and "pip install 'tito[openenv]'" in openenv


@pytest.mark.bwrap
def test_a_session_runs_from_the_fresh_install(fresh_client, bwrap_ok, tmp_path):
    from tito_assets.qwen_tokenizer import build_tokenizer_dir

    tokenizer_dir = build_tokenizer_dir(template="qwen2_5")
    srv = start_server(tmp_path, backend="bwrap")
    try:
        done = subprocess.run([str(fresh_client), "-c", SESSION, srv.address, str(tokenizer_dir)], cwd="/",
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
        assert (got["protobuf"], got["grpcio"]) == ("6.31.1", "1.74.0")  # the floors pyproject.toml states
        assert got["status"] == "OK" and got["tool"] == ["42"], got
        assert got["suffix_ids"]
        # The same prompt as this project's own client gets: the fresh install renders nothing itself.
        with TitoClient(srv.address) as client:
            reg = client.register_tokenizer(tokenizer_dir)
            assert reg.fingerprint == got["fingerprint"]
            with client.open_session("python", QUESTION, fingerprint=reg.fingerprint) as s:
                assert list(s.prompt_ids) == got["prompt_ids"]
    finally:
        srv.terminate()
