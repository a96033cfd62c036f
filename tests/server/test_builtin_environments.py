"""The built-in environments through a real server: python_scientific runs numpy, scipy, sympy, pandas and
matplotlib in its own image (its own warm pool), bash keeps its shell, and seeded files reach all three; under
each sandbox backend."""

from __future__ import annotations

import json

import pytest

from tito.client import InvalidArgumentError, StepStatus, TitoClient
from tito.types import ToolCall

FILES = {"data/values.csv": "x,y\n1,2\n3,4\n"}


def _call(tool: str, **args) -> list[ToolCall]:
    return [ToolCall("c", tool, json.dumps(args))]


@pytest.fixture(scope="module")
def server(backend_server):
    return backend_server


def test_environments_listed_with_their_tools(server):
    with TitoClient(server.address) as client:
        envs = {e.name: e for e in client.list_environments()}
        assert {"python", "python_scientific", "bash"} <= set(envs)
        assert [t.name for t in envs["python_scientific"].tools] == ["run_python"]
        assert [t.name for t in envs["bash"].tools] == ["run_bash"]
        for name in ("python", "python_scientific", "bash"):
            assert "files" in envs[name].env_args_schema["properties"]


def test_scientific_stack_runs_in_its_image(server):
    code = (
        "import numpy as np, scipy.linalg, sympy, pandas as pd, matplotlib.pyplot as plt\n"
        "df = pd.read_csv('data/values.csv')\n"
        "plt.plot(df.x, df.y); plt.savefig('plot.png')\n"
        "x = sympy.symbols('x')\n"
        "(int(np.arange(10).sum()), round(float(scipy.linalg.det(np.array([[2.0, 0], [0, 3]]))), 6), "
        "str(sympy.factor(x**2 - 1)), int(df.y.sum()), __import__('os').path.getsize('plot.png') > 1000)"
    )
    with TitoClient(server.address) as client:
        # Importing five libraries and drawing the first plot takes ~2 s alone and more on a loaded machine: a
        # per-session timeout above the test server's 5 s.
        with client.open_session("python_scientific", env_args={"files": FILES, "timeout_s": 60}) as s:
            r = s.step(tool_calls=_call("run_python", code=code))
            assert r.status is StepStatus.OK
            assert r.tool_messages[0].content == "Out: (45, 6.0, '(x - 1)*(x + 1)', 6, True)"
        # The plain python image has none of it.
        with client.open_session("python") as s:
            r = s.step(tool_calls=_call("run_python", code="import numpy"))
            assert "ModuleNotFoundError: No module named 'numpy'" in r.tool_messages[0].content


def test_bash_through_the_server_keeps_its_shell_and_sees_seeded_files(server):
    with TitoClient(server.address) as client:
        with client.open_session("bash", env_args={"files": FILES}) as s:
            assert s.step(tool_calls=_call("run_bash", command="cd data && export N=3")).tool_messages[0].content == "(no output)"
            r = s.step(tool_calls=_call("run_bash", command="pwd; echo $N; tail -n 1 values.csv"))
            assert r.tool_messages[0].content == "/workspace/data\n3\n3,4"
        with pytest.raises(InvalidArgumentError, match=r"'\.\./x' has an empty, '\.' or '\.\.' component"):
            client.open_session("bash", env_args={"files": {"../x": ""}})


def test_a_missing_image_fails_only_its_environment(backend, tmp_path):
    from tests.harness import start_server
    from tito.client import UnavailableError

    srv = start_server(tmp_path, backend=backend,
                       env={"TITO_ENVIRONMENT_IMAGES": json.dumps(
                           {"python_scientific": "tito-sandbox-python:no-such-tag"})})
    missing = "not found" if backend == "docker" else "no root filesystem for image 'tito-sandbox-python:no-such-tag'"
    try:
        with TitoClient(srv.address, retries=0) as client:
            client.wait_ready()  # SERVING: the main image is there
            with pytest.raises(UnavailableError, match=f"python_scientific.*{missing}"):
                client.open_session("python_scientific")
            with client.open_session("python") as s:
                assert s.step(tool_calls=_call("run_python", code="1 + 1")).tool_messages[0].content == "Out: 2"
    finally:
        srv.terminate()
