"""Runs the example coding tasks through a real env server with a scripted agent, twice each: once ending at
once (the bug is still there: reward 0.0), once after applying the known fix with `str_replace_editor` and
running the visible tests with `execute_bash` (reward 1.0). Any other outcome exits 1.

    scripts/build_task_images.sh                        # the task images tito-task-<name>:latest (setup does it)
    .venv/bin/python -m env_server &
    .venv/bin/python examples/coding_tasks/run_scripted.py [--env-address 127.0.0.1:50051] [--files] [TASK ...]

--files sends each repository as env_args files into the plain sandbox image instead of using its task image.
Prints one line per episode, then one JSON line with every result.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tito.client import StepStatus, TitoClient  # noqa: E402
from tito.coding_tasks import REPO_ROOT, CodingTask, load_tasks  # noqa: E402
from tito.types import ToolCall  # noqa: E402

TASKS = Path(__file__).resolve().parent


def call(tool: str, args: dict) -> list[ToolCall]:
    return [ToolCall("", tool, json.dumps(args))]


def episode(client: TitoClient, task: CodingTask, fix: bool, files: bool) -> dict:
    started = time.perf_counter()
    with client.open_session("coding", task.messages(), env_args=task.env_args(image=not files)) as session:
        if fix:
            first = task.fix[0].path
            steps = [("str_replace_editor", {"command": "view", "path": f"{REPO_ROOT}/{first}"}),
                     *task.fix_calls(),
                     ("execute_bash", {"command": "python3 -m unittest discover -s tests 2>&1 | tail -n 1"})]
            for tool, args in steps:
                r = session.step(tool_calls=call(tool, args))
                if r.status is not StepStatus.OK:
                    raise RuntimeError(f"{task.name}: {tool} ended the episode: {r.status.name} {r.detail}")
                if tool == "str_replace_editor" and args["command"] == "str_replace" and "has been edited" not in r.tool_messages[0].content:
                    raise RuntimeError(f"{task.name}: the fix did not apply: {r.tool_messages[0].content}")
        end = session.step(assistant_content="Done." if fix else "I made no change.")
    return {"task": task.name, "fixed": fix, "status": end.status.name, "reward": end.reward,
            "verdict": end.detail.splitlines()[0] if end.detail else "", "seconds": round(time.perf_counter() - started, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env-address", default="127.0.0.1:50051")
    ap.add_argument("--files", action="store_true", help="send the repositories as files (no task images)")
    ap.add_argument("tasks", nargs="*", help="task names (default: all)")
    args = ap.parse_args(argv)
    tasks = [t for t in load_tasks(TASKS) if not args.tasks or t.name in args.tasks]
    results = []
    with TitoClient(args.env_address) as client:
        client.wait_ready()
        for task in tasks:
            for fix in (False, True):
                result = episode(client, task, fix, args.files)
                results.append(result)
                print(f"{task.name:<10} {'fixed' if fix else 'untouched':<9} reward={result['reward']} "
                      f"({result['verdict']}; {result['seconds']} s)", flush=True)
    print(json.dumps(results))
    wrong = [r for r in results if r["status"] != "EPISODE_END" or r["reward"] != (1.0 if r["fixed"] else 0.0)]
    return 1 if wrong or not results else 0


if __name__ == "__main__":
    sys.exit(main())
