"""`InProcessEnv`: the base of the tests' in-process stand-ins for an env server.

They implement the client protocol (`tito.client.EnvironmentClient`) and play a scripted plan —
faults and odd answers included — for tests of the rollout loops that need answers a real
server cannot be made to give on cue. Tests of the real path use a real server (tests/harness.py).
"""

from __future__ import annotations

from tito.client import EnvironmentClient
from tito.types import EnvironmentInfo, RegisterTokenizerRequest, TokenizerRegistration


class InProcessEnv(EnvironmentClient):
    """Subclasses implement `open`, `step` and `close_session`."""

    async def wait_ready(self, timeout_s: float = 120.0) -> None:
        pass

    async def list_environments(self) -> list[EnvironmentInfo]:
        return []

    async def register(self, request: RegisterTokenizerRequest) -> TokenizerRegistration:
        raise NotImplementedError("an in-process stand-in renders no ids of a tokenizer")

    async def close(self) -> None:
        pass
