"""Built-in tasks: prompts (messages or prompt ids) plus a reward function.

- `arithmetic`: products of large integers, generated locally from a seed. The python
  environment checks the final answer itself when given `expected_answer` in env_args;
  the trainer falls back to decoding the final turn (decode only for the reward, never for ids).
- `token_subset`: no environment, no tools. Reward = fraction of generated tokens that fall in a
  fixed half of the vocabulary. A random tiny model can discover it, so it proves that gradients
  flow through the mask and advantages (the learning test and examples/learn_tokens.yaml).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any, Protocol

from trainer.rollout import RolloutSpec
from trainer.state import Rollout, Status

Decode = Callable[[list[int]], str]


class Task(Protocol):
    name: str
    uses_env: bool

    def sample(self, n_prompts: int, step: int) -> list[RolloutSpec]:
        """n_prompts prompt specs (group index = position); the caller repeats each per group."""
        ...

    def reward(self, rollout: Rollout, decode: Decode | None) -> float: ...


_NUMBER = re.compile(r"[-+]?\d[\d,]*")


class ArithmeticTask:
    name = "arithmetic"
    uses_env = True

    def __init__(self, seed: int = 0, digits: int = 6, env_checks_answer: bool = True) -> None:
        if digits < 1:
            raise ValueError("digits must be >= 1")
        self.seed = seed
        self.digits = digits
        self.env_checks_answer = env_checks_answer

    def sample(self, n_prompts: int, step: int) -> list[RolloutSpec]:
        rng = random.Random(f"{self.seed}:{step}")
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        specs = []
        for g in range(n_prompts):
            a, b = rng.randint(lo, hi), rng.randint(lo, hi)
            answer = str(a * b)
            messages = [
                {"role": "system", "content": "You are a careful assistant. Use the run_python tool "
                 "for any arithmetic, then reply with the final number only."},
                {"role": "user", "content": f"What is {a} * {b}?"},
            ]
            env_args = {"expected_answer": answer} if self.env_checks_answer else None
            specs.append(RolloutSpec(group=g, messages=messages, env_args=env_args,
                                     meta={"answer": answer, "question": f"{a} * {b}"}))
        return specs

    def reward(self, rollout: Rollout, decode: Decode | None) -> float:
        if rollout.status is not Status.COMPLETED:
            return 0.0
        if rollout.env_reward is not None:
            return float(rollout.env_reward)
        if decode is None:
            raise ValueError("arithmetic reward needs the env's reward or a decoder")
        text = decode(rollout.last_turn_ids())
        numbers = [n.replace(",", "") for n in _NUMBER.findall(text)]
        return 1.0 if numbers and numbers[-1].lstrip("+") == rollout.meta["answer"] else 0.0


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


def make_task(name: str, params: dict[str, Any], *, seed: int, vocab_size: int) -> Task:
    if name == "arithmetic":
        return ArithmeticTask(seed=seed, **params)
    if name == "token_subset":
        return TokenSubsetTask(vocab_size=vocab_size, seed=seed, **params)
    raise ValueError(f"unknown task {name!r}: choose 'arithmetic' or 'token_subset'")
