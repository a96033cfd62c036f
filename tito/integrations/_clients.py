"""One tito client per event loop, with its tokenizer registration: what the framework adapters share.

A grpc.aio channel belongs to the event loop it was made on, and the frameworks run episodes on loops of their
own (AReaL's executor thread, slime's rollout loop), sometimes more than one. `LoopClients.get()` returns the
running loop's client, made and registered once (concurrent first episodes wait on the same registration).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from tito.client import AsyncTitoClient
from tito.types import TokenizerRegistration


class LoopClients:
    """`address`: the env server. `tokenizer`: a transformers tokenizer or its folder; or `load_tokenizer`, called
    on first use. `client_kwargs`: for `AsyncTitoClient` (tls, token, retries, deadline_s)."""

    def __init__(self, address: str, tokenizer: Any = None, *, load_tokenizer: Callable[[], Any] | None = None,
                 chat_template_kwargs: Mapping[str, Any] | None = None,
                 client_kwargs: Mapping[str, Any] | None = None) -> None:
        self.address = address
        if (tokenizer is None) == (load_tokenizer is None):
            raise ValueError("give a tokenizer or load_tokenizer, one of them")
        self.tokenizer = tokenizer
        self.load_tokenizer = load_tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.client_kwargs = dict(client_kwargs or {})
        self._tasks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task] = weakref.WeakKeyDictionary()

    async def get(self) -> tuple[AsyncTitoClient, TokenizerRegistration]:
        """The running loop's client and its registration; a failed connection is tried again next time."""
        loop = asyncio.get_running_loop()
        task = self._tasks.get(loop)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._tasks[loop] = loop.create_task(self._connect())
        return await asyncio.shield(task)

    async def _connect(self) -> tuple[AsyncTitoClient, TokenizerRegistration]:
        tokenizer = self.tokenizer if self.load_tokenizer is None else self.load_tokenizer()
        client = AsyncTitoClient(self.address, **self.client_kwargs)
        try:
            registration = await client.register_tokenizer(tokenizer, self.chat_template_kwargs)
        except BaseException:
            await client.close()
            raise
        return client, registration

    async def close(self) -> None:
        """Close the running loop's client."""
        task = self._tasks.pop(asyncio.get_running_loop(), None)
        if task is not None and task.done() and not task.cancelled() and task.exception() is None:
            await task.result()[0].close()
