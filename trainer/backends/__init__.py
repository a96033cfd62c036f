"""Generation backends: transformers (CPU/CUDA), vLLM, scripted (tests, warm start).

Each implements `tito.rollout.generation.GenerationBackend`."""
