"""The `coding` environment in-process (env_server.testing, real sandboxes): the editor's messages as OpenHands
words them, the shell's observation, and grading in a fresh sandbox with hidden tests."""

from __future__ import annotations

import pytest

from env_server.environments.coding_env import CodingEnvironment
from env_server.testing import EpisodeRunner
from tito.types import StepStatus

pytestmark = pytest.mark.docker

MOD = "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x + 1\n"
REPO = {"pkg/__init__.py": "", "pkg/mod.py": MOD, "README.md": "hello\n", ".hidden": "x"}
HIDDEN = {"tests/test_hidden.py": (
    "import unittest\nfrom pkg.mod import g\n\n\nclass T(unittest.TestCase):\n"
    "    def test_g(self):\n        self.assertEqual(g(1), 3)\n")}
TEST = "python3 -m unittest discover -s tests -v"


def edit(**args):
    return ("str_replace_editor", args)


def bash(command, **args):
    return ("execute_bash", {"command": command, **args})


async def messages(episode, *calls):
    r = await episode.step(*calls)
    assert r.status is StepStatus.OK, r
    return [m.content for m in r.tool_messages]


async def test_the_editor_speaks_like_openhands(docker_ok):
    p = "/workspace/pkg/mod.py"
    async with EpisodeRunner(CodingEnvironment, {"files": REPO}) as episode:
        listing, whole, ranged, clamped, bad_start = await messages(
            episode, edit(command="view", path="/workspace/"), edit(command="view", path=p),
            edit(command="view", path=p, view_range=[5, 6]), edit(command="view", path=p, view_range=[5, 99]),
            edit(command="view", path=p, view_range=[9, 10]))
        assert listing == (
            "Here's the files and directories up to 2 levels deep in /workspace, excluding hidden items:\n"
            "/workspace/\n/workspace/README.md\n/workspace/pkg/\n/workspace/pkg/__init__.py\n/workspace/pkg/mod.py\n\n"
            "1 hidden files/directories in this directory are excluded. You can use 'ls -la /workspace' to see them.")
        assert whole == (f"Here's the result of running `cat -n` on {p}:\n     1\tdef f(x):\n     2\t    return x + 1\n"
                         "     3\t\n     4\t\n     5\tdef g(x):\n     6\t    return x + 1\n     7\t\n")
        assert ranged == f"Here's the result of running `cat -n` on {p}:\n     5\tdef g(x):\n     6\t    return x + 1\n"
        assert clamped == "NOTE: We only show up to 6 since there're only 6 lines in this file.\n" + ranged
        assert bad_start == ("ERROR:\nInvalid `view_range` parameter: [9, 10]. Its first element `9` should be within "
                             "the range of lines of the file: [1, 6].")

        multiple, missing, same, no_param = await messages(
            episode, edit(command="str_replace", path=p, old_str="return x + 1", new_str="return x"),
            edit(command="str_replace", path=p, old_str="  nowhere  ", new_str="x"),
            edit(command="str_replace", path=p, old_str="f", new_str="f"),
            edit(command="str_replace", path=p, new_str="x"))
        assert multiple == ("ERROR:\nNo replacement was performed. Multiple occurrences of old_str `return x + 1` in "
                            "lines [2, 6]. Please ensure it is unique.")
        assert missing == f"ERROR:\nNo replacement was performed, old_str `nowhere` did not appear verbatim in {p}."
        assert same == ("ERROR:\nInvalid `new_str` parameter: f. No replacement was performed. `new_str` and `old_str` "
                        "must be different.")
        assert no_param == "ERROR:\nParameter `old_str` is required for command: str_replace."

        edited, undone, inserted = await messages(
            episode, edit(command="str_replace", path=p, old_str="def g(x):\n    return x + 1", new_str="def g(x):\n    return x + 2"),
            edit(command="undo_edit", path=p), edit(command="insert", path=p, insert_line=0, new_str="import os"))
        assert edited == (f"The file {p} has been edited. Here's the result of running `cat -n` on a snippet of {p}:\n"
                          "     2\t    return x + 1\n     3\t\n     4\t\n     5\tdef g(x):\n     6\t    return x + 2\n"
                          "     7\t\nReview the changes and make sure they are as expected. Edit the file again if "
                          "necessary.")
        assert undone == f"Last edit to {p} undone successfully. " + whole
        assert inserted == (f"The file {p} has been edited. Here's the result of running `cat -n` on a snippet of the "
                            "edited file:\n     1\timport os\n     2\tdef f(x):\n     3\t    return x + 1\n     4\t\n"
                            "     5\t\n     6\t\nReview the changes and make sure they are as expected (correct indentation, no "
                            "duplicate lines, etc). Edit the file again if necessary.")

        linked = await messages(episode, bash("ln -s /etc etc_link && ln -s /etc/passwd pw && mkfifo pipe"))
        assert linked[0].startswith("[The command completed with exit code 0.]")
        results = await messages(
            episode, edit(command="create", path=p, file_text="x"), edit(command="view", path="pkg/mod.py"),
            edit(command="view", path="/etc/passwd"), edit(command="view", path="/workspace/etc_link/passwd"),
            edit(command="view", path="/workspace/pw"), edit(command="view", path="/workspace/../etc/shadow"),
            edit(command="view", path="/workspace/pipe"), edit(command="undo_edit", path="/workspace/README.md"),
            edit(command="create", path="/workspace/new/dir/a.py", file_text="x"),
            edit(command="str_replace", path="/workspace/pkg", old_str="a", new_str="b"),
            edit(command="insert", path=p, insert_line=99, new_str="x"),
            edit(command="create", path="/workspace/pkg/new.py", file_text="VALUE = 1\n"))
        assert results == [
            f"ERROR:\nInvalid `path` parameter: {p}. File already exists at: {p}. Cannot overwrite files using command "
            "`create`.",
            "ERROR:\nInvalid `path` parameter: pkg/mod.py. The path should be an absolute path, starting with `/`. "
            f"Maybe you meant {p}?",
            "ERROR:\nInvalid `path` parameter: /etc/passwd. The path /etc/passwd is outside the repository /workspace; "
            "the editor works on files inside it only.",
            "ERROR:\nInvalid `path` parameter: /workspace/etc_link/passwd. The path /workspace/etc_link/passwd is "
            "outside the repository /workspace; the editor works on files inside it only.",
            "ERROR:\nInvalid `path` parameter: /workspace/pw. The path /workspace/pw is outside the repository "
            "/workspace; the editor works on files inside it only.",
            "ERROR:\nInvalid `path` parameter: /workspace/../etc/shadow. The path /workspace/../etc/shadow is outside "
            "the repository /workspace; the editor works on files inside it only.",
            "ERROR:\nInvalid `path` parameter: /workspace/pipe. The path /workspace/pipe is not a regular file (a pipe, "
            "a socket or a device); only text files can be viewed or edited.",
            "ERROR:\nNo edit history found for /workspace/README.md.",
            "ERROR:\nInvalid `path` parameter: /workspace/new/dir/a.py. The directory /workspace/new/dir does not "
            "exist: create it first (e.g. `mkdir -p /workspace/new/dir` with execute_bash).",
            "ERROR:\nInvalid `path` parameter: /workspace/pkg. The path /workspace/pkg is a directory and only the "
            "`view` command can be used on directories.",
            "ERROR:\nInvalid `insert_line` parameter: 99. It should be within the range of allowed values: [0, 7]",
            "File created successfully at: /workspace/pkg/new.py",
        ]
        r = await episode.step(edit(command="delete", path=p))
        assert r.tool_messages[0].content.startswith("Error: invalid arguments for 'str_replace_editor': command:")


async def test_the_shell_observation(docker_ok):
    async with EpisodeRunner(CodingEnvironment, {"files": REPO}) as episode:
        cd, listing, background, timeout, interactive = await messages(
            episode, bash("cd pkg && export N=4"), bash("ls; echo $N; exit 3"), bash("sleep 100 & echo started"),
            bash("sleep 30", timeout=1), bash("", is_input="true"))
        assert cd == "[The command completed with exit code 0.]\n[Current working directory: /workspace/pkg]"
        assert listing == ("__init__.py\nmod.py\n4\n[The shell exited with code 3; a new one was started in /workspace: "
                           "the working directory and variables are reset.]")
        assert background == ("started\n[Stopped 1 process the command left running in the background.]\n"
                              "[The command completed with exit code 0.]\n[Current working directory: /workspace]")
        assert timeout == ("[The command timed out after 1 seconds and was stopped. The shell was restarted in "
                           "/workspace: the working directory and variables are reset, files are kept.]")
        assert interactive.startswith("ERROR: No previous running command to interact with")
        long, = await messages(episode, bash("seq 1 20000"))
        assert "\n[... Observation truncated due to length ...]\n" in long and long.count("\n") < 10000


async def test_grading_in_a_fresh_sandbox_with_hidden_tests(docker_ok):
    args = {"files": REPO, "hidden_files": HIDDEN, "test_command": TEST}
    async with EpisodeRunner(CodingEnvironment, args) as episode:
        end = await episode.end("I did nothing.")
        assert (end.status, end.reward) == (StepStatus.EPISODE_END, 0.0)
        assert end.detail.startswith("tests failed (exit code 1)\nchanges: no changes\ntest output") and "2 != 3" in end.detail

    async with EpisodeRunner(CodingEnvironment, args) as episode:
        await messages(
            episode, edit(command="str_replace", path="/workspace/pkg/mod.py",
                          old_str="def g(x):\n    return x + 1", new_str="def g(x):\n    return x + 2"),
            # Caches are not the repository's; a test the model plants where the hidden one goes is overwritten.
            bash("env -u PYTHONDONTWRITEBYTECODE python3 -c 'import pkg.mod' && ls pkg/__pycache__ && rm README.md && mkdir -p tests && "
                 "printf 'raise SystemExit(0)\\n' > tests/test_hidden.py && echo extra > notes.txt"))
        end = await episode.end("Fixed.")
        assert (end.status, end.reward) == (StepStatus.EPISODE_END, 1.0), end
        assert end.detail.startswith("tests passed (exit code 0)\nchanges: changed: pkg/mod.py; added: notes.txt, "
                                     "tests/test_hidden.py; deleted: README.md\ntest output"), end.detail
        assert "test_g (test_hidden.T.test_g) ... ok" in end.detail


async def test_timeouts_setup_turn_limit_and_failures_of_the_grading_itself(docker_ok):
    async with EpisodeRunner(CodingEnvironment, {"files": REPO, "test_command": "sleep 5", "test_timeout_s": 1}) as ep:
        end = await ep.end("")
        assert end.reward == 0.0 and end.detail.startswith("tests timed out after 1 s")

    # The set-up runs before the first call and again in the grading sandbox; the turn limit ends and grades.
    args = {"files": REPO, "setup_command": "echo ready > .setup_done && cd pkg", "max_turns": 1,
            "test_command": "test -f .setup_done && test \"$(cat .setup_done)\" = ready"}
    async with EpisodeRunner(CodingEnvironment, args) as ep:
        r = await ep.step(bash("pwd"))
        assert r.status is StepStatus.EPISODE_END and r.reward == 1.0, r
        assert r.tool_messages[0].content.endswith("[Current working directory: /workspace]")

    async with EpisodeRunner(CodingEnvironment, {"files": REPO, "test_command": "true"}) as ep:
        async def no_sandbox():
            raise RuntimeError("dockerd went away")

        ep.env.sandbox_factory = no_sandbox
        end = await ep.end("")
        assert end.status is StepStatus.ERROR and end.reward is None
        assert end.detail == ("the environment could not end the episode: grading failed: could not start the grading "
                              "sandbox: dockerd went away")

    with pytest.raises(RuntimeError, match=r"setup_command failed \(exit code 7\): oops"):
        async with EpisodeRunner(CodingEnvironment, {"files": REPO, "setup_command": "echo oops; exit 7"}):
            pass


def test_env_args_are_checked_before_anything_starts():
    with pytest.raises(ValueError, match="hidden_files are only written for test_command"):
        CodingEnvironment.parse_env_args('{"hidden_files": {"t.py": "x"}}')
    with pytest.raises(ValueError, match=r"at most 2 \(server setting coding\)"):
        from env_server.config import ServerConfig

        CodingEnvironment.parse_env_args('{"files": {"a": "", "b": "", "c": ""}}',
                                         context={"config": ServerConfig(coding={"max_files": 2})})
    with pytest.raises(ValueError, match="'..' component"):
        CodingEnvironment.parse_env_args('{"files": {"../a": ""}}')
    with pytest.raises(ValueError, match="image"):
        CodingEnvironment.parse_env_args('{"image": "Bad Image!"}')
