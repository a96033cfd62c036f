"""Run in .venvs/areal by test_areal.py: AReaL's own RemotevLLMEngine and WorkflowExecutor.rollout_batch drive
tito.integrations.areal.TitoWorkflow against a vLLM server and a tito server; prints one JSON object.

    python areal_rollout.py '{"vllm": "127.0.0.1:PORT", "tito": "127.0.0.1:PORT", "dead_tito": "...",
                              "model_dir": "...", "messages": [...], "env_args": {...}, "max_tokens": 512}'
"""

from __future__ import annotations

import json
import sys


def rows_of(batch: list[dict]) -> list[dict]:
    """AReaL's trajectories (dicts of (B, L) tensors) as one dict of lists per episode, padding cut off."""
    out = []
    for traj in batch:
        for b in range(traj["input_ids"].shape[0]):
            keep = traj["attention_mask"][b].bool()
            out.append({k: (v[b][keep].tolist() if v.dim() == 2 else v[b].item()) for k, v in traj.items()})
    return out


def record_calls() -> list[dict]:
    """Each /v1/completions request AReaL's engine sent and the engine's answer (its own HTTP helper, passed
    through): the test compares the rows with the engine's own ids and logprobs."""
    import areal.infra.remote_inf_engine as rie

    send = rie.arequest_with_retry
    calls: list[dict] = []

    async def send_and_record(*args, **kwargs):
        result = await send(*args, **kwargs)
        payload = kwargs.get("payload") or {}
        if kwargs.get("endpoint") == "/v1/completions" and isinstance(result, dict):
            lp = result["choices"][0]["logprobs"]
            calls.append({"prompt_ids": list(payload["prompt"]), "max_tokens": payload["max_tokens"],
                          "stop_token_ids": list(payload["stop_token_ids"]),
                          "ids": [int(t.rsplit(":", 1)[1]) for t in lp["tokens"]],
                          "logprobs": lp["token_logprobs"], "finish_reason": result["choices"][0]["finish_reason"]})
        return result

    rie.arequest_with_retry = send_and_record
    return calls


def main() -> None:
    spec = json.loads(sys.argv[1])
    import areal
    import torch
    import transformers
    from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
    from areal.engine.vllm_remote import RemotevLLMEngine

    from tito.integrations.areal import TitoWorkflow

    # check_trajectory_format: AReaL validates every row the workflow returns (keys, shapes, dtypes).
    # consumer_batch_size: AReaL admits (max_head_offpolicyness + version + 1) x consumer_batch_size rollouts per
    # weight version; with no training step here, every rollout of the script must fit in version 0.
    engine = RemotevLLMEngine(InferenceEngineConfig(backend="vllm:d1", max_concurrent_rollouts=8, consumer_batch_size=16,
                                                    request_timeout=600, request_retries=3,
                                                    check_trajectory_format=True))
    engine.initialize(addr=spec["vllm"])
    calls = record_calls()
    gconfig = GenerationHyperparameters(max_new_tokens=64, max_tokens=spec["max_tokens"],
                                        temperature=spec["temperature"])
    good = {"messages": spec["messages"], "env_args": spec["env_args"]}
    # Far over the budget: the server renders it, the workflow refuses it before generating.
    too_long = {"messages": [{"role": "user", "content": "count " * (2 * spec["max_tokens"])}]}
    out: dict = {"calls": calls, "areal": areal.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
    try:
        workflow = TitoWorkflow(spec["tito"], spec["model_dir"], gconfig, environment="python", max_turns=4)
        # Two prompts, a group of two each: the long one's episodes are rejected (None), so one group comes back.
        out["batch"] = rows_of(engine.rollout_batch([good, too_long], workflow=workflow, group_size=2))
        out["batches"] = 1 if out["batch"] else 0
        print(f"AREAL-STAGE batch: {len(out['batch'])} episodes", flush=True)
        # A budget that ends inside the first turn: the turn is cut by length, the episode kept as truncated.
        tight = TitoWorkflow(spec["tito"], spec["model_dir"], gconfig.new(max_tokens=spec["prompt_len"] + 4),
                             environment="python")
        out["tight"] = rows_of(engine.rollout_batch([good], workflow=tight, group_size=1))
        print(f"AREAL-STAGE tight: {len(out['tight'])} episodes", flush=True)
        # The env server is gone (nothing listens there): every episode is aborted, AReaL gets None and drops it.
        dead = TitoWorkflow(spec["dead_tito"], spec["model_dir"], gconfig, environment="python",
                            client_kwargs={"retries": 0, "deadline_s": 10})
        out["dead"] = rows_of(engine.rollout_batch([good], workflow=dead, group_size=2))
    finally:
        engine.destroy()
    print("AREAL-RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
