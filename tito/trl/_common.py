"""What both TRL doors share: the client they drive, calls whose failures are values, and how a
rollout's status becomes the reward TRL sees."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

from tito.client import TitoClient

log = logging.getLogger("tito.trl")
T = TypeVar("T")

# Values of the `tito_status` extra (and `TitoEnvironment.status`).
COMPLETED = "completed"
ABORTED = "aborted"


def truncated(cause: str) -> str:
    """`truncated:length`, `truncated:tool_overflow` or `truncated:max_turns`."""
    return f"truncated:{cause}"


def connect(address_or_client: str | TitoClient, ready_timeout_s: float) -> tuple[TitoClient, bool]:
    """The client to use and whether we own it (and so close it). Waits until the server is SERVING."""
    if isinstance(address_or_client, TitoClient):
        client, owned = address_or_client, False
    elif isinstance(address_or_client, str):
        client, owned = TitoClient(address_or_client), True
    else:
        raise TypeError(f"expected a 'host:port' address or a tito.client.TitoClient, got "
                        f"{type(address_or_client).__name__}")
    try:
        client.wait_ready(ready_timeout_s)
    except BaseException:
        if owned:
            client.close()
        raise
    return client, owned


async def attempt(call: Awaitable[T]) -> T | Exception:
    """The call's result, or the exception it raised: one failed rollout must not cancel the others
    of a `TitoClient.gather`."""
    try:
        return await call
    except Exception as e:  # noqa: BLE001 - returned to the caller, which aborts that rollout
        return e


def status_reward(status: str, env_reward: float | None, truncated_reward: float | None) -> float | None:
    """What TRL trains on: the environment's reward for a completed episode, `truncated_reward` for
    one cut short, and None (TRL ignores the row) for an aborted one."""
    if status == COMPLETED:
        return env_reward
    if status == ABORTED:
        return None
    return truncated_reward


class EnvClock:
    """Wall time the trainer spent waiting on the env server since the last `take` (opening,
    stepping and closing sessions): logged once per batch as `tito/env_seconds`."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def timing(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - started

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def log_status_metrics(log_metric, statuses: Sequence[str], tool_calls: Sequence[int], clock: EnvClock) -> None:
    """tito's own metrics of a batch through TRL's `log_metric` (a reward function kwarg)."""
    env_seconds = clock.take()
    if log_metric is None or not statuses:
        return
    n = len(statuses)
    log_metric("tito/env_seconds", env_seconds)
    log_metric("tito/tool_calls_per_rollout", mean([float(c) for c in tool_calls]))
    log_metric("tito/completed_frac", sum(s == COMPLETED for s in statuses) / n)
    log_metric("tito/truncated_frac", sum(s.startswith("truncated") for s in statuses) / n)
    log_metric("tito/aborted_frac", sum(s == ABORTED for s in statuses) / n)
