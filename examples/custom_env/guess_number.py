"""An example custom environment: guess a secret number with `guess`, told higher or lower.

It needs no sandbox, ends the episode itself when the guess is right, and gives a reward
that falls with the number of guesses. Load it without touching the server:

    PYTHONPATH=examples/custom_env python -m env_server --environment guess_number:GuessNumberEnvironment

or in the server's YAML config:  environments: ["guess_number:GuessNumberEnvironment"]
or as an entry point of your package, group "tito.environments".
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from env_server.environments import Environment, ToolError, ToolResult, tool


class GuessArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    number: int = Field(description="Your guess.")


class GuessNumberEnvArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    secret: int = Field(description="The number to find.")
    low: int = 1
    high: int = 100
    max_guesses: int = Field(10, ge=1)


class GuessNumberEnvironment(Environment):
    name = "guess_number"
    description = "Find the secret number between low and high; each guess is answered higher, lower or correct."
    EnvArgs = GuessNumberEnvArgs

    def __init__(self, env_args: GuessNumberEnvArgs, sandbox=None) -> None:
        super().__init__(env_args, sandbox)
        self.guesses = 0

    @tool
    async def guess(self, args: GuessArgs) -> ToolResult:
        """Guess the secret number."""
        a = self.env_args
        if not a.low <= args.number <= a.high:
            raise ToolError(f"{args.number} is outside the range {a.low}..{a.high}")
        self.guesses += 1
        if args.number == a.secret:
            return ToolResult(content="correct", done=True, reward=1.0 / self.guesses)
        if self.guesses >= a.max_guesses:
            return ToolResult(content=f"wrong; no guesses left (it was {a.secret})", done=True, reward=0.0)
        return ToolResult(content="higher" if args.number < a.secret else "lower")

    async def end(self, final_text: str) -> ToolResult:
        return ToolResult(content="gave up", done=True, reward=0.0)  # stopping without finding it earns nothing
