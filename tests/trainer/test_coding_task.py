"""The `coding_tasks` task: specs and teacher turns from the example task folders, and
examples/coding_grpo.yaml running through a real server (warm start on the teacher's graded demonstrations,
then a GRPO step whose rollouts the env grades)."""

from __future__ import annotations

import json
import subprocess
import sys

import docker
import pytest

from tests.harness import REPO
from tito.coding_tasks import load_tasks
from trainer.tasks import make_task


def test_specs_cover_every_task_and_the_teacher_applies_the_fix():
    task = make_task("coding_tasks", {"max_turns": 3}, seed=0, vocab_size=10)
    specs = task.sample(4, step=1)
    names = [s.meta["task"] for s in specs]
    assert sorted(names[:3]) == ["intervals", "roman", "textstats"] and specs[3].group == 3
    spec = specs[0]
    assert spec.env_args["image"].startswith(f"tito-task-{spec.meta['task']}:") and spec.env_args["max_turns"] == 3
    assert "hidden_files" in spec.env_args and "files" not in spec.env_args
    assert [m.role for m in spec.messages] == ["system", "user"]
    turn = task.teacher_turn(spec.meta, 0)
    call = json.loads(turn.removeprefix("<tool_call>\n").removesuffix("\n</tool_call><|im_end|>"))
    assert call["name"] == "str_replace_editor" and call["arguments"]["command"] == "str_replace"
    assert task.teacher_turn(spec.meta, 1) == "I fixed the issue.<|im_end|>"
    files = make_task("coding_tasks", {"use_images": False}, seed=0, vocab_size=10).sample(1, step=1)[0]
    assert "image" not in files.env_args and files.env_args["files"]


@pytest.mark.docker
@pytest.mark.slow
def test_the_example_config_runs_through_a_real_server(server, tmp_path):
    client = docker.from_env()
    for t in load_tasks(REPO / "examples" / "coding_tasks"):
        try:
            client.images.get(t.image)
        except docker.errors.ImageNotFound:
            pytest.skip(f"task image {t.image} missing: run scripts/build_task_images.sh")
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", "examples/coding_grpo.yaml", "--output-dir", str(out),
         "--env-address", server.address, "--steps", "1", "--set", "warm_start.steps=1", "--set", "num_generations=2",
         "--set", "prompts_per_step=1", "--set", "budget.per_turn=240", "--set", "progress=false"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    demos = [json.loads(line) for line in (out / "demonstrations.jsonl").read_text().splitlines()]
    # Every teacher demonstration went through the server and its grading: the fix passed the hidden tests.
    assert len(demos) == 3 and all(d["env_reward"] == 1.0 and d["tool_calls"] == 1 for d in demos), demos
    assert demos[0]["env_detail"].startswith("tests passed (exit code 0)\nchanges: changed: ")
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2 and all(r["status"] in ("completed", "truncated") for r in rollouts)
