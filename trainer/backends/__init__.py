"""Generation backends: transformers (CPU/CUDA), vLLM (GPU), scripted (tests)."""

from trainer.backends.base import GenerationBackend, GenRequest, GenResult

__all__ = ["GenerationBackend", "GenRequest", "GenResult"]
