"""The `coding` environment and task images through a real server: the example tasks reward their fix and
nothing less, hidden tests cannot be found from the model's sandbox, task images are allowed by config only,
and a task image's pool is warm after the first burst of opens; under each sandbox backend."""

from __future__ import annotations

import importlib.util
import json
import re
import threading
import time
import urllib.request
import uuid

import docker
import pytest

from env_server.sandbox import SandboxConfig
from tests.harness import REPO, bwrap_available, start_server
from tito.client import FailedPreconditionError, InvalidArgumentError, StepStatus, TitoClient
from tito.coding_tasks import load_task, load_tasks
from tito.types import ToolCall

TASKS = REPO / "examples" / "coding_tasks"
ROMAN = load_task(TASKS / "roman")


@pytest.fixture(scope="module")
def server(backend_server):
    return backend_server


@pytest.fixture(scope="module")
def task_images(backend):
    for task in load_tasks(TASKS):
        if backend == "bwrap":
            why = bwrap_available(task.image)
            if why:
                pytest.skip(f"task root filesystem missing: {why}")
            continue
        client = docker.from_env()
        try:
            client.images.get(task.image)
        except docker.errors.ImageNotFound:
            pytest.skip(f"task image {task.image} missing: run scripts/build_task_images.sh (setup does)")
        finally:
            client.close()


def _run_scripted():
    spec = importlib.util.spec_from_file_location("run_scripted", TASKS / "run_scripted.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_tasks_reward_the_fix_and_nothing_less(server, task_images, capsys):
    run_scripted = _run_scripted()
    assert run_scripted.main(["--env-address", server.address]) == 0
    # The same from files in the plain sandbox image, without the task image.
    assert run_scripted.main(["--env-address", server.address, "--files", "roman"]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    rewards = {(r["task"], r["fixed"]): r["reward"] for r in results[0]}
    assert rewards == {(t, fixed): float(fixed) for t in ("intervals", "roman", "textstats") for fixed in (False, True)}
    assert [(r["fixed"], r["reward"]) for r in results[1]] == [(False, 0.0), (True, 1.0)]
    assert all(r["verdict"].startswith("tests passed" if r["fixed"] else "tests failed") for r in results[0])


SEARCH = r"""
import os, sys
# Each marker comes in two halves, so this process's own command line holds neither.
marker, control = (sys.argv[1] + sys.argv[2]).encode(), (sys.argv[3] + sys.argv[4]).encode()
hits, seen, found_control = [], 0, False
for top, dirs, files in os.walk('/', followlinks=False):
    if top == '/':
        dirs[:] = [d for d in dirs if d not in ('proc', 'sys', 'dev')]
    for name in files:
        path = os.path.join(top, name)
        try:
            if os.path.islink(path) or os.path.getsize(path) > 4 << 20:
                continue
            data = open(path, 'rb').read()
        except OSError:
            continue
        seen += 1
        hits += [path] if marker in data else []
        found_control |= control in data
for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
    for what in ('environ', 'cmdline'):
        try:
            data = open(f'/proc/{pid}/{what}', 'rb').read()
        except OSError:
            continue
        seen += 1
        hits += [f'/proc/{pid}/{what}'] if marker in data else []
hits += ['os.environ'] if any(marker.decode() in k + v for k, v in os.environ.items()) else []
print(f'searched {seen} files; control found: {found_control}; hits: {hits}')
"""


def test_a_model_searching_everywhere_never_finds_the_hidden_tests(server, task_images):
    marker, control = f"HIDDEN-{uuid.uuid4().hex}", f"CONTROL-{uuid.uuid4().hex}"
    args = ROMAN.env_args()
    args["hidden_files"]["tests/test_marker.py"] = f"# {marker}\nimport unittest\n"
    args["test_command"] = f"echo {marker} >/dev/null; " + args["test_command"]
    args["files"] = {"notes.txt": control}  # a positive control: the search finds what is there
    with TitoClient(server.address) as client, client.open_session("coding", ROMAN.messages(), env_args=args) as s:
        steps = [("str_replace_editor", {"command": "create", "path": "/workspace/search.py", "file_text": SEARCH}),
                 ("execute_bash", {"command": f"python3 search.py {marker[:20]} {marker[20:]} {control[:20]} "
                                              f"{control[20:]}; env | grep -c {marker}", "timeout": 120})]
        for tool, arguments in steps:
            r = s.step(tool_calls=[ToolCall("", tool, json.dumps(arguments))])
            assert r.status is StepStatus.OK, r
        out = r.tool_messages[0].content
        searched = int(re.search(r"searched (\d+) files", out).group(1))
        assert "control found: True; hits: []" in out and searched > 1000, out
        assert "\n0\n[The command completed with exit code 1.]" in out  # grep found no variable either
        end = s.step(assistant_content="I looked everywhere.")
        # The hidden tests ran in the grading sandbox (the marker file among them): the bug is still there.
        assert end.status is StepStatus.EPISODE_END and end.reward == 0.0
        assert "tests failed" in end.detail and "added: search.py" in end.detail


def test_task_images_are_allowed_by_config_only(server, task_images, backend):
    with TitoClient(server.address, retries=0) as client:
        with pytest.raises(InvalidArgumentError, match=r"env_args image 'busybox:latest' is not allowed on this server: "
                                                       r"the setting task_images \(TITO_TASK_IMAGES\) allows 'tito-task-\*'"):
            client.open_session("coding", env_args={"image": "busybox:latest"})
        # Any sandboxed environment may run in an allowed task image: same REPL, same hardening.
        with client.open_session("python", env_args={"image": ROMAN.image}) as s:
            r = s.step(tool_calls=[ToolCall("", "run_python", json.dumps(
                {"code": "import os\nsorted(os.listdir('/opt/tito-task/repo')), os.getuid()"}))])
            listing, _, uid = r.tool_messages[0].content.rpartition(", ")
            assert listing == "Out: (['README.md', 'roman', 'tests']", r.tool_messages[0].content
            # The sandbox's user: 1000 under bwrap; under Docker a host uid of the container's own (docker/uids.py).
            defaults = SandboxConfig()
            assert (int(uid.rstrip(")")) == 1000 if backend == "bwrap" else
                    defaults.uid_range_start <= int(uid.rstrip(")")) < defaults.uid_range_start + defaults.uid_range_size)
            missing = ("is not on this server's Docker daemon" if backend == "docker"
                       else r"has no root filesystem on this server \(in /\S+\)")
            with pytest.raises(FailedPreconditionError, match=rf"the task image 'tito-task-no-such:x' {missing}; "
                                                              r".*scripts/build_task_images.sh"):
                client.open_session("coding", env_args={"image": "tito-task-no-such:x"})
            # The missing image's pool went away without touching the instance's other sandboxes.
            r = s.step(tool_calls=[ToolCall("", "run_python", json.dumps({"code": "'still here'"}))])
            assert r.tool_messages[0].content == "Out: 'still here'"


def _pool_figures(port: int, image: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    figures = {}
    for name in ("depth", "target", "in_use", "created", "cold_opens"):
        m = re.search(rf'^tito_pool_{name}(?:_total)?{{image="{re.escape(image)}"}} (\S+)$', text, re.M)
        figures[name] = float(m.group(1)) if m else 0.0
    return figures


def test_a_task_image_is_warm_after_the_first_burst(backend, task_images, tmp_path):
    srv = start_server(tmp_path, backend=backend,
                       env={"TITO_POOL__LEARN_DEMAND": "true", "TITO_POOL__TARGET_SIZE": "1"})
    image, burst = load_task(TASKS / "intervals").image, 3
    try:
        with TitoClient(srv.address) as client:
            def open_burst(times: list[float]) -> None:
                sessions = []

                def one() -> None:
                    t0 = time.perf_counter()
                    sessions.append(client.open_session("bash", env_args={"image": image}))
                    times.append(time.perf_counter() - t0)

                threads = [threading.Thread(target=one) for _ in range(burst)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert len(sessions) == burst
                for s in sessions:
                    s.close()

            cold: list[float] = []
            open_burst(cold)
            first = _pool_figures(srv.metrics_port, image)
            # The task image's pool is made by the first open: that burst started its own sandboxes (the floor's
            # warm one may start beside them).
            assert first["cold_opens"] >= 1 and first["created"] >= first["cold_opens"]
            deadline = time.monotonic() + 60
            while (figures := _pool_figures(srv.metrics_port, image))["depth"] < burst:
                assert time.monotonic() < deadline, figures
                time.sleep(0.2)
            assert figures["target"] == burst
            warm: list[float] = []
            open_burst(warm)
            after = _pool_figures(srv.metrics_port, image)
            assert after["created"] >= 2 * burst and after["in_use"] == 0
            # The second burst took warm sandboxes: no open waited for a sandbox start (the server's count; the
            # times are in the message: under bwrap a start is short enough for timing noise to hide it).
            assert after["cold_opens"] == first["cold_opens"], (first, after, warm, cold)
    finally:
        srv.terminate()
