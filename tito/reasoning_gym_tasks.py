"""reasoning-gym problems by (dataset, config, split, seed, index), made the same way by the client (the user
turn) and by the `reasoning_gym` environment (the scorer's entry), and the final answer read from a reply.

    task = ReasoningGymTask("gsm_symbolic", split="test", seed=0)
    problem = task.problem(3)
    session = client.open_session("reasoning_gym", problem.messages(), env_args=problem.env_args())

Splits come from disjoint seeds: reasoning-gym makes item i of a dataset of seed s from `Random(s + i)`, so
two seeds closer than the dataset's size share items. Here the split picks a block of seeds far apart
(`SPLIT_OFFSET`), and an index must stay below `MAX_INDEX`, so train and test never draw the same generator
state. Needs `reasoning-gym` (pip install 'tito[reasoning]'); imported only when a problem is made.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

Split = Literal["train", "test"]
MAX_INDEX = 1_000_000  # problems per split and seed
SPLIT_OFFSET = {"train": 0, "test": 500_000_000}  # seed blocks of the splits, far beyond any index
# No example value: small models copy it ("<answer>42</answer>" for every problem, seen with Qwen2.5-Coder-0.5B).
ANSWER_INSTRUCTION = "End your reply with the final answer inside <answer> and </answer> tags."
TOOL_INSTRUCTION = "You can run Python code with the run_python tool to compute intermediate results."

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def split_seed(split: str, seed: int) -> int:
    if split not in SPLIT_OFFSET:
        raise ValueError(f"split must be one of {sorted(SPLIT_OFFSET)}, got {split!r}")
    return SPLIT_OFFSET[split] + seed


@lru_cache(maxsize=64)
def _dataset(name: str, config_json: str, seed: int, size: int):
    try:
        import reasoning_gym
    except ImportError as e:
        # A ValueError: the env server answers OpenSession with it (INVALID_ARGUMENT) instead of failing inside.
        raise ValueError("reasoning-gym is not installed here: pip install 'tito[reasoning]' (reasoning-gym==0.1.25)") from e
    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))
    except Exception as e:  # an unknown name or a config the dataset refuses: the caller's mistake
        raise ValueError(f"reasoning-gym cannot make dataset {name!r} with config {config_json}: "
                         f"{type(e).__name__}: {e}") from e


def entry(dataset: str, config: dict[str, Any], split: str, seed: int, index: int) -> dict[str, Any]:
    """reasoning-gym's entry (question, answer, metadata) of one problem, and the dataset that scores it."""
    if not 0 <= index < MAX_INDEX:
        raise ValueError(f"index must be in [0, {MAX_INDEX}), got {index}")
    # Size: item i depends on seed + i only, so a dataset of the index's block holds it.
    size = (index // 1024 + 1) * 1024
    ds = _dataset(dataset, json.dumps(config, sort_keys=True), split_seed(split, seed), size)
    return ds[index]


def score(dataset: str, config: dict[str, Any], split: str, seed: int, index: int, answer: str | None) -> float:
    """reasoning-gym's own scorer on `answer` (None: no answer, 0.0)."""
    size = (index // 1024 + 1) * 1024
    ds = _dataset(dataset, json.dumps(config, sort_keys=True), split_seed(split, seed), size)
    if answer is None:
        return 0.0
    return float(ds.score_answer(answer, ds[index]))


def extract_answer(reply: str) -> str | None:
    """The final answer of a reply: the last <answer>...</answer>, else the last \\boxed{...}; None if neither
    (a reply without the asked-for format gets no reward rather than a guess at what it meant)."""
    visible = reply.split("</think>")[-1]
    tagged = _ANSWER_TAG.findall(visible)
    if tagged:
        return tagged[-1].strip()
    boxed = _BOXED.findall(visible)
    return boxed[-1].strip() if boxed else None


@dataclass(frozen=True)
class Problem:
    dataset: str
    config: dict[str, Any]
    split: str
    seed: int
    index: int
    question: str
    answer: str  # reasoning-gym's reference answer (never sent to the model)
    tools: str = "python"

    def user_turn(self) -> str:
        extra = f"\n\n{TOOL_INSTRUCTION}" if self.tools == "python" else ""
        return f"{self.question}{extra}\n\n{ANSWER_INSTRUCTION}"

    def messages(self, system: str | None = None, example: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
        """The opening turn: the system message (if any), a worked example's turns (if any: earlier turns of the
        same conversation, as OpenAI-style messages, e.g. from `load_example`), then the problem."""
        head = [{"role": "system", "content": system}] if system else []
        return head + [dict(m) for m in example] + [{"role": "user", "content": self.user_turn()}]

    def env_args(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "config": self.config, "split": self.split, "seed": self.seed,
                "index": self.index, "tools": self.tools}


@dataclass(frozen=True)
class ReasoningGymTask:
    """Problems of one reasoning-gym dataset, split and seed."""

    dataset: str
    config: dict[str, Any] = field(default_factory=dict)
    split: str = "train"
    seed: int = 0
    tools: str = "python"

    def problem(self, index: int) -> Problem:
        e = entry(self.dataset, self.config, self.split, self.seed, index)
        return Problem(dataset=self.dataset, config=dict(self.config), split=self.split, seed=self.seed, index=index,
                       question=e["question"], answer=str(e["answer"]), tools=self.tools)


def load_example(source: str | Path | Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A worked example to put before each problem: OpenAI-style messages given as a list, or the path of a JSON
    file holding that list (examples/real_model/worked_example.json). Checked here, so that a mistake stops the
    run before its first rollout instead of reaching the env server as a malformed opening turn."""
    if source is None:
        return []
    if isinstance(source, (str, Path)):
        try:
            messages = json.loads(Path(source).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read the worked example {str(source)!r}: {e} (a JSON list of messages)") from e
    else:
        messages = list(source)
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"a worked example is a non-empty list of messages, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "tool"):
            raise ValueError(f"worked example message {i} must be an object with role user, assistant or tool: {m!r}")
    if messages[0]["role"] != "user" or messages[-1]["role"] != "assistant":
        raise ValueError("a worked example starts with a user turn and ends with the assistant's final reply")
    return messages
