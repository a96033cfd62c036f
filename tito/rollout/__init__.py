"""The client side of an episode, shared by the trainer and the TRL integration.

- `state`: one rollout's ids, loss mask and logprobs, always the same length, and how it ended;
- `generation`: the generation-backend protocol, its request and result, why a generation ended;
- `turns`: the one turn rule (after a generation, after a Step: go on, complete, truncate, abort);
- `vllm`: vLLM request, logprob and weight helpers (importable without vLLM).
"""

from tito.rollout.generation import (FinishReason, GenerationBackend, GenRequest, GenResult, RolloutKey)
from tito.rollout.state import (AbortCause, Rollout, RolloutStateError, Status, TruncationCause, TurnRecord)
from tito.rollout.turns import TurnLimits

__all__ = ["AbortCause", "FinishReason", "GenRequest", "GenResult", "GenerationBackend", "Rollout",
           "RolloutKey", "RolloutStateError", "Status", "TruncationCause", "TurnLimits", "TurnRecord"]
