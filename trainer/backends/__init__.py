"""Generation backends: transformers (CPU/CUDA), vLLM (GPU), scripted (tests)."""

from trainer.backends.base import FinishReason, GenerationBackend, GenRequest, GenResult, RolloutKey

__all__ = ["FinishReason", "GenerationBackend", "GenRequest", "GenResult", "RolloutKey"]
