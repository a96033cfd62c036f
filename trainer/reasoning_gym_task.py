"""The `reasoning_gym` training task: reasoning-gym problems of the train split (tito.reasoning_gym_tasks), scored
by the `reasoning_gym` environment with the dataset's own scorer, and a teacher for the warm start."""

from __future__ import annotations

from typing import Any

from tito.rollout.state import Rollout, Status
from trainer.rollout import RolloutSpec
from trainer.teacher_text import Decode, tool_call_text


DEMO_SEED_OFFSET = 100_000_000  # far from any run's seed and from the test split's block (tito.reasoning_gym_tasks)


class ReasoningGymTrainTask:
    """reasoning-gym problems of the train split (tito.reasoning_gym_tasks), scored by the `reasoning_gym`
    environment with the dataset's own scorer (set env.environment: reasoning_gym). Step s takes problems
    s * n .. s * n + n - 1 of the split, so no problem repeats; held-out evaluation uses the test split
    (python -m trainer.evaluate)."""

    name = "reasoning_gym"
    uses_env = True

    def __init__(self, seed: int = 0, dataset: str = "gsm_symbolic", config: dict[str, Any] | None = None,
                 tools: str = "python", system: str | None = None,
                 example: str | list[dict[str, Any]] | None = None, demos: int = 16) -> None:
        from tito.reasoning_gym_tasks import ReasoningGymTask, load_example

        if tools not in ("python", "none"):
            raise ValueError(f"tools must be 'python' or 'none', got {tools!r}")
        self.problems = ReasoningGymTask(dataset, dict(config or {}), split="train", seed=seed, tools=tools)
        self.system = system
        self.example = load_example(example)  # a worked example's turns before each problem (the format, shown)
        if demos < 1:
            raise ValueError("demos must be >= 1")
        self.demos = demos  # warm-start demonstrations (used only with warm_start.steps > 0)
        self.problems.problem(0)  # an unknown dataset or a bad config fails here, not in the first step

    def sample(self, n_prompts: int, step: int) -> list[RolloutSpec]:
        specs = []
        for g in range(n_prompts):
            p = self.problems.problem(max(step, 0) * n_prompts + g)
            specs.append(RolloutSpec(group=g, messages=p.messages(self.system, self.example), env_args=p.env_args(),
                                     meta={"answer": p.answer, "index": p.index}))
        return specs

    def reward(self, rollout: Rollout, decode: Decode | None) -> float:
        if rollout.status is not Status.COMPLETED:
            return 0.0
        return float(rollout.env_reward or 0.0)

    # -- the warm start's teacher (TeacherTask) ---------------------------------------------------------------

    def demo_specs(self) -> list[RolloutSpec]:
        """`demos` train problems GRPO never draws (another seed of the train split), each
        demonstrated once: run_python on the problem's expression, then the answer. Only datasets whose entries
        carry their expression (reasoning-gym's arithmetic ones: basic_arithmetic, chain_sum, products, ...)."""
        from tito.reasoning_gym_tasks import ReasoningGymTask, entry

        if self.problems.tools != "python":
            raise ValueError("the reasoning_gym teacher demonstrates the run_python tool: set tools: python")
        # The train split at a seed far from the run's (reasoning-gym's item i of seed s is Random(s + i)'s): small
        # indices, so the dataset that holds them is small (one of a far index takes seconds to make).
        demo_seed = self.problems.seed + DEMO_SEED_OFFSET
        source = ReasoningGymTask(self.problems.dataset, self.problems.config, "train", demo_seed, "python")
        specs = []
        for g in range(self.demos):
            p = source.problem(g)
            expression = entry(p.dataset, p.config, p.split, p.seed, p.index)["metadata"].get("expression")
            if not expression:
                raise ValueError(f"reasoning-gym's {p.dataset!r} entries carry no 'expression' to demonstrate; "
                                 "the warm start's teacher works on the arithmetic datasets (basic_arithmetic, "
                                 "chain_sum, products): set warm_start.steps: 0 for this one")
            specs.append(RolloutSpec(group=g, messages=p.messages(self.system, self.example), env_args=p.env_args(),
                                     meta={"answer": p.answer, "index": p.index, "question": p.question,
                                           "code": f"print({expression})"}))
        return specs

    def teacher_turn(self, meta: dict[str, Any], turn: int) -> str:
        """Written in the Hermes/Qwen call format (the templates of the Qwen family; others need their own)."""
        if turn == 0:
            return tool_call_text(meta["code"])
        if turn == 1:
            return f"<answer>{meta['answer']}</answer><|im_end|>"
        raise ValueError(f"the teacher has no turn {turn}")
