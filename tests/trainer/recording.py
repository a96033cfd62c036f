"""An env client wrapper for the end-to-end tests: passes calls through to the real server and
keeps what it returned (and can fail one Step on purpose)."""

from __future__ import annotations


class Recorder:
    """Passes every call through to the real client and keeps what the server returned."""

    def __init__(self, inner, sabotage_first_step: bool = False) -> None:
        self.inner = inner
        self.prompts: dict[str, list[int]] = {}
        self.steps: dict[str, list] = {}
        self.closed: list[str] = []
        self.sabotage = sabotage_first_step

    async def open_session(self, environment, messages, env_args):
        opened = await self.inner.open_session(environment, messages, env_args)
        self.prompts[opened.session_id] = opened.prompt_ids
        self.steps[opened.session_id] = []
        return opened

    async def step(self, session_id, seq, completion_ids, max_suffix_tokens):
        if self.sabotage:
            # A session the server does not know: the real server answers NOT_FOUND, as after
            # a restart. Only this rollout may abort; its retry must start clean.
            self.sabotage = False
            return await self.inner.step("no-such-session", seq, completion_ids, max_suffix_tokens)
        out = await self.inner.step(session_id, seq, completion_ids, max_suffix_tokens)
        self.steps[session_id].append(out)
        return out

    async def close_session(self, session_id):
        self.closed.append(session_id)
        await self.inner.close_session(session_id)
