"""What the TRL tests share: the example's steering script, a client that records what the server
answered, a GRPOTrainer that records what its loss is given, and the token-for-token check."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig, GRPOTrainer

from tests.harness import REPO
from tito.client import RecordingClient, StepStatus, TitoClient


def load_example():
    """examples/trl_grpo.py as a module (its dataset and steering helpers)."""
    spec = importlib.util.spec_from_file_location("trl_grpo_example", REPO / "examples" / "trl_grpo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recording_client(address: str) -> TitoClient:
    """A TitoClient whose calls go through a `RecordingClient` (what was sent, what the server answered)."""
    client = TitoClient(address)
    client.aio = RecordingClient(client.aio, owns_inner=True)
    return client


@dataclass
class Row:
    """One row as GRPOTrainer's loss receives it, unpadded, with the extras rollout_func added."""

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    extras: dict[str, Any] = field(default_factory=dict)


class CapturingGRPOTrainer(GRPOTrainer):
    """An unchanged GRPOTrainer that keeps what `_generate_and_score_completions` hands the loss."""

    captured: list[Row]

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        rows = getattr(self, "captured", [])
        for i, x in enumerate(inputs):  # rollout_func's extras were merged into the inputs
            n = int(out["completion_mask"][i].sum())
            rows.append(Row(
                prompt_ids=out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist(),
                completion_ids=out["completion_ids"][i][:n].tolist(),
                env_mask=out["tool_mask"][i][:n].tolist() if "tool_mask" in out else [1] * n,
                extras={k: v for k, v in x.items() if k.startswith("tito_")}))
        self.captured = rows
        return out


def grpo_config(tmp_path, **overrides: Any) -> GRPOConfig:
    """A one-step CPU GRPOConfig: 2 prompts x 2 generations."""
    kw = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, seed=0, max_steps=1,
              per_device_train_batch_size=4, num_generations=2, max_completion_length=96, learning_rate=1e-4,
              beta=0.0, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True)
    kw.update(overrides)
    return GRPOConfig(**kw)


def expected_from_server(client: TitoClient, session_id: str, status: str) -> tuple[list[int], list[int], list[int]]:
    """Prompt ids, and completion ids with their mask, as the server's answers dictate: each turn
    sent to Step (mask 1), then that Step's suffix ids (mask 0) unless the rollout stopped there."""
    rec = client.aio
    steps = rec.steps[session_id]
    ids, mask = [], []
    for i, s in enumerate(steps):
        ids += s.request.completion_ids
        mask += [1] * len(s.request.completion_ids)
        stopped_here = i == len(steps) - 1 and status in ("truncated:max_turns", "truncated:tool_overflow")
        if s.result.status is StepStatus.OK and not stopped_here:
            ids += s.result.suffix_ids
            mask += [0] * len(s.result.suffix_ids)
    return list(rec.prompts[session_id]), ids, mask


def assert_token_exact(client: TitoClient, row: Row) -> None:
    """The row TRL got is the server's prompt, then the policy's turns and the server's suffix ids
    verbatim; mask 0 exactly on the suffix ids (everywhere for an aborted rollout); a last turn cut
    by length (never sent to the server) is the only thing past what the server saw."""
    status = row.extras["tito_status"]
    prompt, ids, mask = expected_from_server(client, row.extras["tito_session_id"], status)
    assert row.prompt_ids == prompt
    assert row.completion_ids[:len(ids)] == ids
    tail = len(row.completion_ids) - len(ids)
    if status == "aborted":
        assert row.env_mask == [0] * len(row.completion_ids)
    else:
        assert row.env_mask == mask + [1] * tail
    assert tail == 0 or status == "truncated:length"


def assert_logprobs(out: dict, i: int) -> None:
    """Finite sampler logprobs on generated tokens, 0.0 on tito's (rollout_func output row i)."""
    for lp, m in zip(out["logprobs"][i], out["env_mask"][i], strict=True):
        assert (math.isfinite(lp) and lp <= 0.0) if m else lp == 0.0
