"""Built-in tasks: prompts (messages or prompt ids) plus a reward function.

- `arithmetic`: products of large integers, generated locally from a seed. The python
  environment checks the final answer itself when given `expected_answer` in env_args;
  the trainer falls back to decoding the final turn (decode only for the reward, never for ids).
- `token_subset`: no environment, no tools. Reward = fraction of generated tokens that fall in a
  fixed half of the vocabulary. A random tiny model can discover it, so it proves that gradients
  flow through the mask and advantages (the learning test and examples/learn_tokens.yaml).
- `puzzles`: a small fixed pool of interpreter puzzles (big products, modular powers, digit sums,
  prime counts), generated from a seed. Small enough for the tiny demo model to memorize after a
  warm start on demonstrations (examples/demo.yaml); the env checks the final answer.
- `reasoning_gym` (trainer/reasoning_gym_task.py): any reasoning-gym dataset's train split, scored by the
  `reasoning_gym` environment, with a teacher for the warm start on the arithmetic datasets.
- `coding_tasks`: the `coding` environment on task folders (`tito.coding_tasks`: a repository with a bug,
  an issue, hidden tests); the env grades each episode with the hidden tests in a fresh sandbox
  (examples/coding_grpo.yaml on examples/coding_tasks). Its teacher applies the known fix.

Tasks that use the interpreter can also act as a *teacher* for the warm start
(`trainer/warmstart.py`): `demo_specs()` lists the prompts to demonstrate, `teacher_turn()` writes
the scripted assistant text of each turn (turn 0: a `run_python` call; turn 1: the task's own
answer, which the env then checks against what the sandbox computed).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tito.answers import answer_matches
from tito.coding_tasks import load_tasks
from tito.rollout.state import Rollout, Status
from tito.types import Message, Role
from trainer.reasoning_gym_task import ReasoningGymTrainTask
from trainer.rollout import RolloutSpec
from trainer.teacher_text import Decode, call_text, tool_call_text


class Task(Protocol):
    name: str
    uses_env: bool

    def sample(self, n_prompts: int, step: int) -> list[RolloutSpec]:
        """n_prompts prompt specs (group index = position); the caller repeats each per group."""
        ...

    def reward(self, rollout: Rollout, decode: Decode | None) -> float: ...


@runtime_checkable
class TeacherTask(Protocol):
    """A task that can script demonstrations for the warm start."""

    def demo_specs(self) -> list[RolloutSpec]: ...

    def teacher_turn(self, meta: dict[str, Any], turn: int) -> str: ...


def scripted_turn(meta: dict[str, Any], turn: int) -> str:
    """The scripted two-turn policy: call the tool with meta['code'], then give meta['answer'].

    The answer is the task's own, not text taken from the tool message, so no environment text
    is ever encoded into trained ids; the env still scores the answer, and a demonstration whose
    sandbox output disagrees earns reward 0 and is refused by the warm start."""
    if answers_from_head(meta):
        if turn == 0:
            # Worded unlike the tool path's answer turn ("The answer is"), so that GRPO telling
            # the two apart does not also push down the answer turn that follows a tool call.
            return f"About {meta['estimate']}.<|im_end|>"
        raise ValueError("the head teacher answers in one turn")
    if turn == 0:
        return tool_call_text(meta["code"])
    if turn == 1:
        return f"The answer is {meta['answer']}.<|im_end|>"
    raise ValueError(f"the teacher has no turn {turn}")


def answers_from_head(meta: dict[str, Any]) -> bool:
    """A demonstration whose teacher answers without the tool (see `PuzzleTask(head_demos=...)`)."""
    return meta.get("teacher") == "head"


def _rollout_used_tool(rollout: Rollout) -> bool:
    return rollout.tool_calls > 0


class ArithmeticTask:
    name = "arithmetic"
    uses_env = True

    def __init__(self, seed: int = 0, digits: int = 6, env_checks_answer: bool = True,
                 demos: int = 8) -> None:
        if digits < 1:
            raise ValueError("digits must be >= 1")
        self.seed = seed
        self.digits = digits
        self.env_checks_answer = env_checks_answer
        self.demos = demos

    def sample(self, n_prompts: int, step: int) -> list[RolloutSpec]:
        rng = random.Random(f"{self.seed}:{step}")
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        specs = []
        for g in range(n_prompts):
            a, b = rng.randint(lo, hi), rng.randint(lo, hi)
            answer = str(a * b)
            messages = [
                Message(Role.SYSTEM, "You are a careful assistant. Use the run_python tool "
                        "for any arithmetic, then reply with the final number only."),
                Message(Role.USER, f"What is {a} * {b}?"),
            ]
            env_args = {"expected_answer": answer} if self.env_checks_answer else None
            specs.append(RolloutSpec(group=g, messages=messages, env_args=env_args,
                                     meta={"answer": answer, "question": f"{a} * {b}",
                                           "code": f"print({a} * {b})"}))
        return specs

    def demo_specs(self) -> list[RolloutSpec]:
        # Questions from a step index GRPO never samples (steps count from 1).
        return self.sample(self.demos, step=-1)

    def teacher_turn(self, meta, turn) -> str:
        return scripted_turn(meta, turn)

    def reward(self, rollout: Rollout, decode: Decode | None) -> float:
        if rollout.status is not Status.COMPLETED:
            return 0.0
        if rollout.env_reward is not None:
            return float(rollout.env_reward)
        if decode is None:
            raise ValueError("arithmetic reward needs the env's reward or a decoder")
        # The same reading of the final answer as the environment's own check.
        return 1.0 if answer_matches(decode(rollout.last_turn_ids()), rollout.meta["answer"]) else 0.0


class TokenSubsetTask:
    name = "token_subset"
    uses_env = False

    def __init__(self, vocab_size: int, seed: int = 0, fraction: float = 0.5,
                 prompt_len: int = 8, vocab_limit: int | None = None) -> None:
        """The subset is a seeded random `fraction` of token ids below vocab_limit (default
        vocab_size); prompts are random token ids from the same range."""
        self.vocab_size = vocab_size
        self.limit = vocab_limit or vocab_size
        self.seed = seed
        rng = random.Random(seed)
        self.subset = frozenset(i for i in range(self.limit) if rng.random() < fraction)
        self.prompt_len = prompt_len

    def sample(self, n_prompts: int, step: int) -> list[RolloutSpec]:
        rng = random.Random(f"{self.seed}:{step}")
        return [RolloutSpec(group=g, prompt_ids=[rng.randrange(self.limit) for _ in range(self.prompt_len)])
                for g in range(n_prompts)]

    def reward(self, rollout: Rollout, decode: Decode | None) -> float:
        gen = [t for t, m in zip(rollout.ids, rollout.mask) if m == 1]
        return sum(t in self.subset for t in gen) / len(gen) if gen else 0.0


def _prime_count_below(n: int) -> int:
    sieve = bytearray([1]) * max(n, 2)
    sieve[0:2] = b"\x00\x00"
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, n, i)))
    return sum(sieve[:n])


def _round_sig(x: int, digits: int) -> int:
    return int(float(f"{x:.{digits - 1}e}"))


def make_puzzles(n: int, seed: int) -> list[dict[str, str]]:
    """n interpreter puzzles, the same for the same seed: question, code, answer (computed here)
    and `estimate`, what one would say without running code (a rounded product, 4.5 per digit of
    2**k, n/ln n primes, a guess of half the modulus): never exact, so the env scores it 0."""
    rng = random.Random(f"puzzles:{seed}")
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            a, b = rng.randint(100_000, 999_999), rng.randint(100_000, 999_999)
            q, code, ans = f"What is {a} * {b}?", f"print({a} * {b})", a * b
            est = _round_sig(a, 2) * _round_sig(b, 2)
        elif kind == 1:
            k = rng.randint(150, 999)
            q = f"What is the digit sum of 2**{k}?"
            code, ans = f"print(sum(map(int, str(2**{k}))))", sum(map(int, str(2**k)))
            est = round(4.5 * (math.floor(k * math.log10(2)) + 1))
        elif kind == 2:
            a, e, m = rng.randint(1000, 9999), rng.randint(1000, 9999), rng.randint(10_000, 99_999)
            q, code, ans = f"What is {a}**{e} mod {m}?", f"print(pow({a}, {e}, {m}))", pow(a, e, m)
            est = m // 2
        else:
            lim = rng.randint(1000, 3000)
            q = f"How many primes are below {lim}?"
            code = f"print(sum(all(p % d for d in range(2, p)) for p in range(2, {lim})))"
            ans = _prime_count_below(lim)
            est = round(lim / math.log(lim))
        if est == ans:  # an estimate that happens to be exact would not be one
            est += 1
        out.append({"question": q, "code": code, "answer": str(ans), "estimate": str(est)})
    return out


class PuzzleTask:
    """A fixed pool of interpreter puzzles; every step asks `n_prompts` of them (a seeded draw).

    The pool is tiny on purpose: the demo's random 10M-parameter model can memorize it after a
    warm start, so GRPO has something to work with within CPU minutes. This shows the machinery
    learning end to end, not arithmetic ability. With `require_tool_call` (default) an episode
    that answers without ever calling `run_python` scores 0, so answering from memory alone is
    not rewarded.

    `head_demos`: per puzzle, this many extra warm-start demonstrations in which the teacher
    answers at once with its `estimate` (no tool call; the env scores it 0) next to the one that
    calls `run_python`. The warm-started policy then calls the tool in about 1 of 1+head_demos
    rollouts, and only the env's reward tells GRPO which behaviour pays (examples/demo.yaml).
    """

    name = "puzzles"
    uses_env = True
    SYSTEM = "Use run_python to compute, then reply with the number."

    def __init__(self, seed: int = 0, n: int = 4, require_tool_call: bool = True,
                 system: str | None = None, head_demos: int = 0) -> None:
        if n < 1:
            raise ValueError("n must be >= 1")
        if head_demos < 0:
            raise ValueError("head_demos must be >= 0")
        self.seed = seed
        self.puzzles = make_puzzles(n, seed)
        self.require_tool_call = require_tool_call
        self.system = self.SYSTEM if system is None else system
        self.head_demos = head_demos

    def _spec(self, group: int, p: dict[str, Any]) -> RolloutSpec:
        messages = [Message(Role.USER, p["question"])]
        if self.system:
            messages.insert(0, Message(Role.SYSTEM, self.system))
        return RolloutSpec(group=group, messages=messages, env_args={"expected_answer": p["answer"]},
                           meta=dict(p))

    def sample(self, n_prompts: int, step: int) -> list[RolloutSpec]:
        rng = random.Random(f"{self.seed}:{step}")
        order: list[dict[str, str]] = []
        while len(order) < n_prompts:  # each puzzle once before any repeats
            batch = list(self.puzzles)
            rng.shuffle(batch)
            order.extend(batch)
        return [self._spec(g, p) for g, p in enumerate(order[:n_prompts])]

    def demo_specs(self) -> list[RolloutSpec]:
        metas = [dict(p, teacher="tool") for p in self.puzzles]
        metas += [dict(p, teacher="head") for p in self.puzzles for _ in range(self.head_demos)]
        return [self._spec(g, m) for g, m in enumerate(metas)]

    def teacher_turn(self, meta, turn) -> str:
        return scripted_turn(meta, turn)

    def reward(self, rollout: Rollout, decode: Decode | None) -> float:
        if rollout.status is not Status.COMPLETED:
            return 0.0
        if self.require_tool_call and not _rollout_used_tool(rollout):
            return 0.0
        if rollout.env_reward is None:
            raise ValueError("the puzzles task needs the env's reward (expected_answer)")
        return float(rollout.env_reward)


EXAMPLE_CODING_TASKS = Path(__file__).resolve().parent.parent / "examples" / "coding_tasks"


class CodingTasksTask:
    """The `coding` environment on a folder of coding tasks (tito.coding_tasks: a repository with a bug, an
    issue, hidden tests, the known fix). Every step asks `n_prompts` of them (each once before any repeats);
    the env's reward is the hidden tests' verdict in a fresh sandbox, an unfinished rollout scores 0.

    `max_turns` goes to the env (the episode is graded after that many tool turns): give it the trainer's
    budget.max_turns, so a rollout that runs out of turns is still graded. `use_images`: each task's own image
    (scripts/build_task_images.sh), else its repository sent as files. The teacher (for the warm start) applies
    the known fix with str_replace_editor, one edit a turn, then says it is done."""

    name = "coding_tasks"
    uses_env = True

    def __init__(self, seed: int = 0, dir: str | None = None, use_images: bool = True, max_turns: int | None = None,
                 system: str | None = None) -> None:
        self.seed = seed
        self.tasks = load_tasks(dir or EXAMPLE_CODING_TASKS)
        self.use_images = use_images
        self.max_turns = max_turns
        self.system = system

    def _spec(self, group: int, index: int) -> RolloutSpec:
        task = self.tasks[index]
        messages = task.messages() if self.system is None else task.messages(self.system or None)
        return RolloutSpec(group=group, messages=messages,
                           env_args=task.env_args(image=self.use_images, max_turns=self.max_turns),
                           meta={"task": task.name, "index": index})

    def sample(self, n_prompts: int, step: int) -> list[RolloutSpec]:
        rng = random.Random(f"{self.seed}:{step}")
        order: list[int] = []
        while len(order) < n_prompts:
            batch = list(range(len(self.tasks)))
            rng.shuffle(batch)
            order.extend(batch)
        return [self._spec(g, i) for g, i in enumerate(order[:n_prompts])]

    def demo_specs(self) -> list[RolloutSpec]:
        return [self._spec(g, i) for g, i in enumerate(range(len(self.tasks))) if self.tasks[i].fix]

    def teacher_turn(self, meta: dict[str, Any], turn: int) -> str:
        calls = self.tasks[meta["index"]].fix_calls()
        if turn < len(calls):
            return call_text(*calls[turn])
        if turn == len(calls):
            return "I fixed the issue.<|im_end|>"
        raise ValueError(f"the teacher has no turn {turn}")

    def reward(self, rollout: Rollout, decode: Decode | None) -> float:
        if rollout.status is not Status.COMPLETED:
            return 0.0
        return float(rollout.env_reward or 0.0)


def make_task(name: str, params: dict[str, Any], *, seed: int, vocab_size: int) -> Task:
    if name == "arithmetic":
        return ArithmeticTask(seed=seed, **params)
    if name == "token_subset":
        return TokenSubsetTask(vocab_size=vocab_size, seed=seed, **params)
    if name == "puzzles":
        return PuzzleTask(seed=seed, **params)
    if name == "coding_tasks":
        return CodingTasksTask(seed=seed, **params)
    if name == "reasoning_gym":
        return ReasoningGymTrainTask(seed=seed, **params)
    raise ValueError(f"unknown task {name!r}: choose 'arithmetic', 'puzzles', 'coding_tasks', 'reasoning_gym' or "
                     "'token_subset'")
