"""Runs in .venvs/verl (tests/integrations/test_verl.py starts it): verl's own `AgentLoopWorker.generate_sequences`
with tito's agent loop loaded from an agent-loop yaml, against a real tito server and a real vLLM (CPU) server.

    .venvs/verl/bin/python tests/integrations/verl_rollout.py SPEC.json OUT.json

SPEC: {tito, vllm_url, vllm_model, model_dir, temperature, prompt_length, response_length, batches: [{name, rows: [...],
[prompt_length, response_length]}]};
each row is {messages, extra_info}. OUT: per batch either the rows verl built (unpadded) or the error it raised,
plus every generation request the engine answered.

Test scaffolding: verl's `server_manager` is normally a client of verl's own vLLM server actors (GPU only);
`VllmServerClient` below is the thinnest stand-in: it forwards verl's `generate(request_id, prompt_ids=,
sampling_params=)` to the real vLLM engine's `/v1/completions` (token ids in and out) and answers verl's
`TokenOutput`, as verl's vLLM server does. Everything else is verl's code.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from pathlib import Path

import numpy as np
import transformers
from hydra import compose, initialize_config_dir

import verl
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.protocol import DataProto
from verl.workers.rollout.replica import TokenOutput

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.integrations.inference import complete  # noqa: E402  (stdlib only)


class VllmServerClient:
    """verl's LLMServerClient.generate, forwarded to a vLLM OpenAI server (test scaffolding, see above)."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        out = await asyncio.to_thread(
            complete, self.url, self.model, list(prompt_ids), max_tokens=int(sampling_params["max_tokens"]),
            stop_token_ids=list(sampling_params.get("stop_token_ids") or ()),
            temperature=float(sampling_params.get("temperature", 1.0)), top_p=float(sampling_params.get("top_p", 1.0)),
            seed=0)  # reproducible samples (verl's own server leaves them unseeded)
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "ids": out.ids,
                           "logprobs": out.logprobs, "max_tokens": int(sampling_params["max_tokens"]),
                           "stop_token_ids": sorted(sampling_params.get("stop_token_ids") or ())})
        # verl's vLLM server: logprobs only when asked; "completed" for a stop and for a length cut alike.
        return TokenOutput(token_ids=out.ids, log_probs=out.logprobs if sampling_params.get("logprobs") else None,
                           stop_reason="completed")


def config(spec: dict, batch: dict, agent_yaml: Path):
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={spec['model_dir']}",
            "actor_rollout_ref.rollout.name=vllm",
            f"data.max_prompt_length={batch.get('prompt_length', spec['prompt_length'])}",
            f"data.max_response_length={batch.get('response_length', spec['response_length'])}",
            f"actor_rollout_ref.rollout.temperature={spec['temperature']}",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_yaml}",
            "actor_rollout_ref.rollout.agent.default_agent_loop=tito",
        ])


def batch_of(rows: list[dict]) -> DataProto:
    def column(values):
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        return arr

    return DataProto.from_dict(non_tensors={
        "raw_prompt": column([np.array(r["messages"], dtype=object) for r in rows]),
        "extra_info": column([r["extra_info"] for r in rows]),
        "index": np.arange(len(rows)),
        "agent_name": column(["tito"] * len(rows)),
        "data_source": column(["tito"] * len(rows)),
    })


def rows_of(out: DataProto) -> list[dict]:
    b = out.batch
    rows = []
    for i in range(len(out)):
        prompt_keep = b["attention_mask"][i, :b["prompts"].shape[1]].bool()
        n = int(b["attention_mask"][i, b["prompts"].shape[1]:].sum())
        row = {
            "prompt_ids": b["prompts"][i][prompt_keep].tolist(),
            "response_ids": b["responses"][i, :n].tolist(),
            "response_mask": b["response_mask"][i, :n].tolist(),
            "response_mask_padding": b["response_mask"][i, n:].tolist(),
            "rollout_log_probs": b["rollout_log_probs"][i, :n].tolist(),
            "rm_scores": b["rm_scores"][i, :n].tolist() if "rm_scores" in b.keys() else None,
            "input_ids": b["input_ids"][i][b["attention_mask"][i].bool()].tolist(),
            "num_turns": int(out.non_tensor_batch["__num_turns__"][i]),
        }
        for key in ("tito_status", "tito_truncation", "tito_tool_calls", "tito_session"):
            value = out.non_tensor_batch[key][i]
            row[key] = value.item() if hasattr(value, "item") else value
        rows.append(row)
    return rows


async def main(spec: dict, out_path: Path) -> None:
    agent_yaml = out_path.parent / "agent_loops.yaml"
    agent_yaml.write_text(
        "- name: tito\n"
        "  _target_: tito.integrations.verl.TitoAgentLoop\n"
        f"  address: {spec['tito']}\n"
        "  environment: python\n")
    client = VllmServerClient(spec["vllm_url"], spec["vllm_model"])
    result = {"transformers": transformers.__version__, "verl": verl.__version__, "batches": {}}
    workers: dict[tuple, AgentLoopWorker] = {}
    for b in spec["batches"]:
        start = len(client.calls)
        try:
            # A worker per rollout config (a batch may set its own prompt and response lengths).
            key = (b.get("prompt_length"), b.get("response_length"))
            if key not in workers:
                workers[key] = AgentLoopWorker(config(spec, b, agent_yaml), llm_client=client)
            out = await workers[key].generate_sequences(batch_of(b["rows"]))
            entry = {"rows": rows_of(out)}
        except Exception as e:
            entry = {"error": f"{type(e).__name__}: {e}", "error_type": type(e).__name__,
                     "traceback": traceback.format_exc()[-3000:]}
        entry["calls"] = client.calls[start:]
        result["batches"][b["name"]] = entry
    out_path.write_text(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])))
