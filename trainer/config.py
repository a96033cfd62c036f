"""Trainer configuration: pydantic models, a YAML file, and CLI overrides (`--set a.b=value`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class _Strict(BaseModel):
    # Unknown keys are errors: a typo in a config must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Strict):
    path: str = Field("tiny-random-qwen3", description="A local HF model dir, a fetched model's name "
                      "(python -m tito_assets.fetch_model --list), or 'tiny-random-qwen3'.")
    device: str = Field("auto", description="'cpu', 'cuda', 'cuda:1' or 'auto' (cuda if available).")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    vocab_size: int | None = Field(None, ge=2, description="tiny-random-qwen3 only: embedding rows "
                                   "(default: the tokenizer's size). No-env tasks may use fewer.")
    head_dim: int | None = Field(None, ge=1, description="tiny-random-qwen3 only: attention head size "
                                 "(default 16 = hidden/heads; vLLM's CPU build needs 32 or more).")
    activation_checkpointing: bool = Field(
        False, description="Recompute each decoder layer's activations in the backward pass instead of keeping "
        "them (transformers' gradient checkpointing, non-reentrant): less memory, ~1/3 more compute per micro-step.")
    freeze: list[str] = Field(
        default_factory=list, description="Parameter-name prefixes kept frozen: no gradient and no optimizer state "
        "(e.g. [model.embed_tokens, lm_head]: 2 x 136M parameters of a Qwen2.5-0.5B, 3.3 GB of fp32 gradients and "
        "AdamW state). The generation backend still gets every weight.")

    @model_validator(mode="after")
    def _tiny_only(self) -> ModelConfig:
        if self.head_dim is not None and self.path != "tiny-random-qwen3":
            raise ValueError(f"head_dim applies to tiny-random-qwen3 only; {self.path!r} has its own config.json")
        return self


class TokenizerConfig(_Strict):
    dir: str | None = Field(None, description="Tokenizer dir (tokenizer.json [+ config, template]) or a fetched "
                            "model's name. Unset: model.path's when that is a fetched model's name, else the "
                            "offline Qwen tokenizer built with `template`.")
    template: str = Field("qwen2_5", description="trl chat template name when dir is unset.")
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)


class BudgetConfig(_Strict):
    context: int = Field(1024, ge=2, description="Max tokens per rollout (prompt + all turns).")
    per_turn: int = Field(128, ge=1, description="Max new tokens per assistant turn.")
    reserve: int = Field(16, ge=0, description="Tokens kept free after a tool suffix for the next turn.")
    max_turns: int = Field(4, ge=1)

    @model_validator(mode="after")
    def _fits(self) -> BudgetConfig:
        if self.reserve >= self.context:
            raise ValueError(f"reserve ({self.reserve}) must be smaller than context ({self.context})")
        return self


class EnvConfig(_Strict):
    # One HOST:PORT; several, comma-separated; or a DNS name that resolves to several (with replicas).
    address: str = "127.0.0.1:50051"
    replicas: bool = Field(False, description="Spread sessions over every address (tito.client.ReplicaClient); "
                           "implied by a comma-separated address.")
    environment: str = "python"
    # A server on a non-loopback address wants TLS and a token (docs/scaling.md).
    tls_ca_file: str | None = Field(None, description="CA of the server's certificate: connect with TLS.")
    tls_cert_file: str | None = Field(None, description="Client certificate, for servers that require mTLS.")
    tls_key_file: str | None = Field(None, description="Key of tls_cert_file.")
    token_file: str | None = Field(None, description="File holding the bearer token (else $TITO_TOKEN, if set).")
    # A Step may run several tool calls, each up to the sandbox timeout (30 s + graces by default).
    rpc_timeout_s: float = Field(600.0, gt=0)
    rpc_retries: int = Field(4, ge=0, description="Retries of one RPC on UNAVAILABLE (same seq).")
    ready_timeout_s: float = Field(120.0, gt=0, description="Wait this long for health SERVING.")


class TaskConfig(_Strict):
    name: Literal["arithmetic", "puzzles", "coding_tasks", "reasoning_gym", "token_subset"] = "arithmetic"
    params: dict[str, Any] = Field(default_factory=dict)


class LossSettings(_Strict):
    clip_eps_low: float = Field(0.2, ge=0)
    clip_eps_high: float = Field(0.2, ge=0)
    beta: float = Field(0.0, ge=0, description="KL to the initial model (k3); 0 = no reference model.")
    norm: Literal["sequence", "token"] = "sequence"
    scale_rewards: bool = Field(True, description="Divide advantages by the group's reward std.")
    old_logprobs: Literal["sampler", "recompute"] = Field(
        "sampler", description="Ratio denominator: the sampler's logprobs or a no-grad recompute.")


class VllmSettings(_Strict):
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="CUDA: the share of GPU memory vLLM "
                                          "takes (weights and KV cache). Not used on vLLM's CPU build.")
    kv_cache_memory_bytes: int | None = Field(
        None, ge=1, description="The KV cache's size in bytes. Unset: 256 MiB on vLLM's CPU build (where "
        "gpu_memory_utilization would be a share of host RAM), gpu_memory_utilization on CUDA.")
    enforce_eager: bool = True
    logprobs_mode: str = Field("processed_logprobs",
                               description="Logprobs after temperature, i.e. of the sampling distribution.")
    sleep_level: Literal[0, 1, 2] = Field(
        0, description="vLLM sleep mode while the policy trains (CUDA only): 0 off; 1 offloads the engine's "
        "weights to CPU and frees its KV cache; 2 frees both (the weights come back from the training model).")
    max_num_seqs: int | None = Field(None, ge=1, description="vLLM's cap on concurrent sequences (default: "
                                     "num_generations x prompts_per_step, the rollouts of one step).")


class TransformersSettings(_Strict):
    """The transformers backend's sampler."""

    sampler: Literal["loop", "static"] = Field(
        "loop", description="'loop': a decoding loop over transformers' dynamic KV cache (CPU and CUDA; the "
        "default). 'static': a fixed-size KV cache and one compiled decoding step (CUDA graphs on a GPU), "
        "sampling with counter-based noise so that the step has no host work (backends/static_sampler.py).")
    compile: bool = Field(True, description="sampler 'static' on CUDA: torch.compile the decoding step "
                          "(mode reduce-overhead, i.e. CUDA graphs). Ignored on CPU, where it runs eagerly.")
    max_batch_size: int = Field(64, ge=1, description="Rows sampled together; more requests run in turns.")


class DistributedSettings(_Strict):
    """How the ranks of a torchrun / accelerate launch share the policy (docs/trainer.md, docs/scaling-training.md)."""

    strategy: Literal["replicate", "fsdp"] = Field(
        "replicate", description="'replicate': every rank holds the whole model, gradients are summed after the "
        "micro-batches. 'fsdp': the policy (and the KL reference) sharded per decoder layer with FSDP2.")
    param_dtype: Literal["bfloat16", "float16", "float32"] | None = Field(
        None, description="fsdp: the dtype layers are all-gathered and computed in (FSDP2's mixed precision; "
        "default bfloat16). The sharded weights and Adam's state keep model.dtype.")
    reduce_dtype: Literal["float32", "bfloat16"] | None = Field(
        None, description="fsdp: the dtype gradients are reduce-scattered in (default float32).")
    cpu_offload: bool = Field(False, description="fsdp on GPUs: keep the sharded weights, gradients and Adam's "
                              "state in host memory (the optimizer steps on the CPU).")

    @model_validator(mode="after")
    def _fsdp_only(self) -> DistributedSettings:
        if self.strategy != "fsdp":
            for name in ("param_dtype", "reduce_dtype", "cpu_offload"):
                if name in self.model_fields_set:
                    raise ValueError(f"distributed.{name} applies to strategy fsdp only (strategy is "
                                     f"{self.strategy!r}): set distributed.strategy: fsdp, or remove {name}")
        return self


class WarmStartConfig(_Strict):
    """Supervised fine-tuning on scripted demonstrations (run through the env server) before GRPO."""

    steps: int = Field(0, ge=0, description="SFT optimizer steps; 0 = no warm start.")
    learning_rate: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    batch_size: int = Field(0, ge=0, description="Demonstrations per SFT step; 0 = all of them.")
    micro_batch_size: int = Field(0, ge=0, description="Demonstrations per forward/backward (gradients "
                                  "accumulated over the step's batch); 0 = the whole batch at once.")
    save_model: bool = Field(False, description="Also save the warm-started policy as a model folder "
                             "(<output_dir>/warmstart-model) to evaluate the policy GRPO starts from.")
    spell_out_markup: bool = Field(False, description="Encode the teacher's markup tokens (added tokens such as "
                                   "<tool_call>; not the stop tokens) as ordinary text tokens: for a model whose "
                                   "rows for them are untrained, the spelled-out text is one it already writes, and "
                                   "the env's parser reads both alike.")


class TrainConfig(_Strict):
    model: ModelConfig = Field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    backend: Literal["transformers", "vllm"] = "transformers"
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    loss: LossSettings = Field(default_factory=LossSettings)
    vllm: VllmSettings = Field(default_factory=VllmSettings)
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    transformers: TransformersSettings = Field(default_factory=TransformersSettings)
    distributed: DistributedSettings = Field(default_factory=DistributedSettings)

    num_generations: int = Field(4, ge=1, description="Rollouts per prompt (GRPO group size).")
    prompts_per_step: int = Field(2, ge=1)
    steps: int = Field(10, ge=1, description="Optimizer steps.")
    learning_rate: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    micro_batch_size: int = Field(8, ge=1, description="Rollouts per forward/backward.")
    temperature: float = Field(1.0, ge=0)
    seed: int = 0
    malloc: Literal["keep_freed", "return_freed"] = Field(
        "keep_freed", description="keep_freed: freed tensor memory stays in the process (faster sampling; RSS stays "
        "near its peak). return_freed: large allocations go back to the system when freed, for a model that fills "
        "the machine's memory (trainer/malloc.py).")
    retries: int = Field(1, ge=0, description="Re-runs of an aborted rollout before it is dropped.")
    gen_batch_wait_s: float = Field(0.02, ge=0, description="Wait this long to batch generation.")
    seed_per_request: bool = Field(
        True, description="Seed each generation from (seed, step, prompt group, member, attempt, turn), so "
        "samples depend neither on how requests were batched nor on the rank: runs repeat and resume exactly.")
    output_dir: str = "runs/demo"
    save_checkpoint: bool = Field(True, description="Checkpoint at the end (and every save_steps).")
    save_steps: int = Field(0, ge=0, description="Also checkpoint every this many steps; 0 = only at the end.")
    save_total_limit: int = Field(1, ge=1, description="Step checkpoints kept (the oldest are deleted).")
    resume_from: str | None = Field(None, description="A checkpoint folder, or a run folder (its latest "
                                    "checkpoint): continue from there.")
    report_to: list[Literal["tensorboard", "trackio"]] = Field(
        default_factory=list, description="Trackers besides metrics.jsonl and metrics.png, as TRL's "
        "report_to: 'tensorboard', 'trackio', a list of them, 'all' or 'none'.")
    run_name: str | None = Field(None, description="The run's name in trackers (default: output_dir's name).")
    tracker_project: str = Field("tito", description="trackio project.")
    ddp_timeout_s: float = Field(1800.0, gt=0, description="Collective timeout between ranks (a warm start "
                                 "runs on rank 0 while the others wait).")
    progress: bool = True

    @property
    def fsdp(self) -> bool:
        return self.distributed.strategy == "fsdp"

    @property
    def compute_dtype(self) -> str:
        """The dtype the policy computes in, and so the one generation should sample in: FSDP's
        param_dtype (default bfloat16) under fsdp, else model.dtype."""
        if self.fsdp:
            return self.distributed.param_dtype or "bfloat16"
        return self.model.dtype

    @model_validator(mode="after")
    def _strategy_fits(self) -> TrainConfig:
        if self.backend != "transformers" and "transformers" in self.model_fields_set:
            raise ValueError(f"the transformers section configures backend transformers, and backend is "
                             f"{self.backend!r}: remove it, or set backend: transformers")
        if not self.fsdp:
            return self
        if self.model.freeze:
            raise ValueError("model.freeze needs distributed.strategy: replicate (fsdp shards frozen and trained "
                             "parameters together)")
        if self.warm_start.steps > 0:
            raise ValueError("warm_start.steps > 0 needs distributed.strategy: replicate: the warm start trains the "
                             "whole model on rank 0, which fsdp exists to avoid. Warm-start with replicate, then "
                             "start the fsdp run from its checkpoint (model.path: <run>/checkpoint)")
        if self.distributed.cpu_offload and self.model.device == "cpu":
            raise ValueError("distributed.cpu_offload moves the sharded state from the GPU to host memory; with "
                             "model.device: cpu it is there already: remove cpu_offload or train on cuda")
        return self

    @field_validator("report_to", mode="before")
    @classmethod
    def _report_to(cls, v: Any) -> Any:
        # TRL accepts a name, a list, "all" or "none".
        if v is None or v == "none":
            return []
        if v == "all":
            return ["tensorboard", "trackio"]
        if isinstance(v, str):
            return [x.strip() for x in v.split(",") if x.strip() and x.strip() != "none"]
        return v


class ConfigError(ValueError):
    pass


def _format_validation(e: ValidationError, source: str) -> str:
    lines = [f"invalid trainer config ({source}):"]
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        got = f" (got {err['input']!r})" if "input" in err and not isinstance(err["input"], dict) else ""
        lines.append(f"  {loc}: {err['msg']}{got}")
    return "\n".join(lines)


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {key}: {p!r} is not a section")
        node = nxt
    node[parts[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """'budget.context=512' -> ('budget.context', 512); values parse as YAML scalars."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value, got {item!r}")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set expects key=value, got {item!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                extra: dict[str, Any] | None = None) -> TrainConfig:
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping, got {type(loaded).__name__}")
        data = loaded
    for item in overrides or []:
        key, value = parse_override(item)
        _set_dotted(data, key, value)
    for key, value in (extra or {}).items():
        if value is not None:
            _set_dotted(data, key, value)
    if overrides or extra:
        source += " + overrides"
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation(e, source)) from None
