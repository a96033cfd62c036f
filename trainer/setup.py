"""Assembly: from a config to the one `Run` the training loop works with.

The process group (when launched by torchrun / accelerate), tokenizer files (read locally,
uploaded to the server, never used to render), the policy model, the task, the env connection
(health, environment check, tokenizer registration and fingerprint check; one per rank) and the
generation backend.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tito.client import AsyncReplicaClient, AsyncTitoClient, EnvironmentClient, TlsOptions
from tito.rollout.generation import GenerationBackend
from tito.types import TokenizerRegistration
from trainer import distributed
from trainer.config import TrainConfig
from trainer.distributed import Dist
from trainer.model import freeze_parameters, load_model
from trainer.tasks import Task, make_task
from trainer.teacher_text import Decode, Encode

log = logging.getLogger(__name__)


@dataclass
class Run:
    """What the training loop works with."""

    model: Any  # the policy being trained (a transformers causal LM)
    backend: GenerationBackend
    task: Task
    env: EnvironmentClient | None  # None for tasks without an environment
    stop_token_ids: list[int]
    pad_id: int  # a valid embedding row; pads are never attended to or trained on
    device: torch.device | None = None  # default: the model's
    decode: Decode | None = None  # ids -> text, only to score tasks the env does not score
    encode_teacher_text: Encode | None = None  # warm-start demonstrations only
    dist: Dist = field(default_factory=Dist)  # this process's rank (a single process by default)
    registration: TokenizerRegistration | None = None  # the tokenizer the env renders with (with env)

    @property
    def fingerprint(self) -> str:
        return self.registration.fingerprint if self.registration else ""

    def __post_init__(self) -> None:
        if self.device is None:
            self.device = next(self.model.parameters()).device


def resolve_device(name: str, dist: Dist | None = None) -> torch.device:
    """'auto' is cuda when there is one; with several ranks 'cuda' is each rank's own GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and dist is not None and dist.enabled:
        return torch.device("cuda", dist.local_rank)
    return torch.device(name)


@dataclass
class TokenizerInfo:
    files: dict[str, bytes]
    vocab_size: int
    pad_id: int
    eos_ids: list[int]
    _tok: Any = None

    @classmethod
    def load(cls, cfg: TrainConfig) -> TokenizerInfo:
        from tokenizers import Tokenizer

        from tito.fingerprint import read_tokenizer_files

        from tito_assets.models import model_sources, resolve_model

        if cfg.tokenizer.dir:
            directory = Path(resolve_model(cfg.tokenizer.dir))
        elif cfg.model.path in model_sources():
            directory = Path(resolve_model(cfg.model.path))  # a fetched model brings its tokenizer and template
        else:
            from tito_assets.qwen_tokenizer import build_tokenizer_dir

            # One-off setup: the offline Qwen tokenizer with a trl chat template (no hub).
            directory = build_tokenizer_dir(template=cfg.tokenizer.template)
        files = read_tokenizer_files(directory)
        tok = Tokenizer.from_str(files["tokenizer.json"].decode())
        tcfg = json.loads(files.get("tokenizer_config.json", b"{}"))
        eos_ids = []
        for key in ("eos_token", "pad_token"):
            value = tcfg.get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str) and tok.token_to_id(value) is not None:
                eos_ids.append(tok.token_to_id(value))
        pad = eos_ids[-1] if eos_ids else 0
        return cls(files=files, vocab_size=tok.get_vocab_size(with_added_tokens=True), pad_id=pad,
                   eos_ids=eos_ids[:1], _tok=tok)

    def decode(self, ids: list[int]) -> str:
        # Only for rewards and logs; ids are never re-encoded.
        return self._tok.decode(ids, skip_special_tokens=False)

    def encode_teacher_text(self, text: str, spell_out: bool = False, keep: Collection[int] = ()) -> list[int]:
        """Scripted teacher text for warm-start demonstrations (dataset text, never model
        output or env text). Added tokens written in the text (`<tool_call>`, `<|im_end|>`)
        become their ids; with `spell_out`, all but `keep` (the stop tokens, which end a turn as
        themselves) are spelled in ordinary text tokens instead, as a model writes them that never
        learned the added token (the env's parser reads the text, so it reads both alike)."""
        if not spell_out:
            return self._tok.encode(text, add_special_tokens=False).ids
        kept = {self._tok.id_to_token(i): i for i in keep}
        parts = re.split("(" + "|".join(map(re.escape, kept)) + ")", text) if kept else [text]
        return [i for part in parts if part for i in ([kept[part]] if part in kept else self._spelled(part))]

    def _spelled(self, text: str) -> list[int]:
        """The text through the tokenizer's normalizer, pre-tokenizer and model, skipping its added-token match."""
        tok = self._tok
        text = tok.normalizer.normalize_str(text) if tok.normalizer else text
        pieces = tok.pre_tokenizer.pre_tokenize_str(text) if tok.pre_tokenizer else [(text, None)]
        return [t.id for piece, _ in pieces for t in tok.model.tokenize(piece)]


def make_backend(cfg: TrainConfig, model, tok: TokenizerInfo, rank: int = 0,
                 device: torch.device | None = None) -> GenerationBackend:
    """The generation backend. Under fsdp the training model will be sharded, so the transformers
    backend samples from its own whole copy (in the compute dtype, on `device`), which
    `sync_weights` fills from the shards; vLLM's engine always holds its own copy."""
    vocab = model.get_input_embeddings().weight.shape[0]
    # Ranks sample differently even from requests without their own seed.
    if cfg.backend == "transformers":
        from trainer.backends.hf import TransformersBackend

        t = cfg.transformers
        sampling_model = model
        if cfg.fsdp:
            from trainer.fsdp import meta_skeleton

            sampling_model = meta_skeleton(model).to(dtype=getattr(torch, cfg.compute_dtype))
            sampling_model.to_empty(device=device or "cpu")
            sampling_model.tie_weights()
        return TransformersBackend(sampling_model, seed=cfg.seed + rank, pad_token_id=min(tok.pad_id, vocab - 1),
                                   max_batch_size=t.max_batch_size, sampler=t.sampler, compile=t.compile,
                                   max_len=cfg.budget.context, needs_sync=cfg.fsdp)
    from trainer.backends.vllm_backend import VllmBackend

    return VllmBackend.from_training_model(model, cfg, seed=cfg.seed + rank)


async def connect_env(cfg: TrainConfig, tok: TokenizerInfo) -> tuple[EnvironmentClient, TokenizerRegistration]:
    """Connect (several addresses, or `env.replicas`: an `AsyncReplicaClient`), wait for SERVING, check
    the environment exists, register the tokenizer (the client checks the fingerprint)."""
    e = cfg.env
    addresses = [a.strip() for a in e.address.split(",") if a.strip()]
    tls = (TlsOptions(ca_file=e.tls_ca_file, cert_file=e.tls_cert_file, key_file=e.tls_key_file)
           if e.tls_ca_file or e.tls_cert_file else None)
    token = Path(e.token_file).read_text().strip() if e.token_file else os.environ.get("TITO_TOKEN") or None
    options: dict[str, Any] = dict(deadline_s=e.rpc_timeout_s, retries=e.rpc_retries, tls=tls, token=token)
    client: EnvironmentClient = (AsyncReplicaClient(addresses, **options) if e.replicas or len(addresses) > 1
                                 else AsyncTitoClient(addresses[0], **options))
    try:
        await client.wait_ready(e.ready_timeout_s)
        await client.environment(e.environment)
        reg = await client.register_tokenizer(tok.files, cfg.tokenizer.chat_template_kwargs)
    except BaseException:
        await client.close()
        raise
    log.info("registered tokenizer %s (family %s, stop ids %s)", reg.fingerprint[:12],
             reg.template_family, list(reg.stop_token_ids))
    return client, reg


@asynccontextmanager
async def open_run(cfg: TrainConfig) -> AsyncIterator[Run]:
    """The Run for `cfg`; the env connection (and the process group) is closed when the block ends."""
    if cfg.backend == "vllm":
        from trainer.backends.vllm_backend import check_settings, require_vllm

        require_vllm()  # before anything is loaded
        check_settings(cfg, resolve_device(cfg.model.device).type)
    dist = distributed.init(cfg.model.device, cfg.ddp_timeout_s, fsdp=cfg.fsdp,
                            cpu_offload=cfg.distributed.cpu_offload)
    try:
        async with _open_run(cfg, dist) as run:
            yield run
    finally:
        distributed.shutdown(dist)


@asynccontextmanager
async def _open_run(cfg: TrainConfig, dist: Dist) -> AsyncIterator[Run]:
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.model.device, dist)
    if cfg.distributed.cpu_offload and device.type != "cuda":
        from trainer.config import ConfigError

        raise ConfigError(f"distributed.cpu_offload moves the sharded state from the GPU to host memory, and "
                          f"model.device={cfg.model.device!r} trains on {device}: remove cpu_offload or train on cuda")
    tok = TokenizerInfo.load(cfg)
    vocab = cfg.model.vocab_size or tok.vocab_size
    # fsdp: rank 0 reads the whole model into host memory, the others make a skeleton; sharding
    # (train.py, trainer/fsdp.py) moves the shards to the device.
    load_on = ("cpu" if dist.is_main else "meta") if cfg.fsdp else str(device)
    model = load_model(cfg.model.path, vocab_size=vocab, seed=cfg.seed, device=load_on,
                       dtype=cfg.model.dtype, head_dim=cfg.model.head_dim)
    if cfg.model.freeze:
        trainable = freeze_parameters(model, cfg.model.freeze)
        log.info("model.freeze %s: %.0fM of %.0fM parameters train", cfg.model.freeze, trainable / 1e6,
                 sum(p.numel() for p in model.parameters()) / 1e6)
    if cfg.backend == "vllm":
        from trainer.backends.vllm_backend import check_model

        check_model(model.config)  # before the env connection, the warm start and the engine
    task = make_task(cfg.task.name, cfg.task.params, seed=cfg.seed, vocab_size=vocab)
    if task.uses_env and vocab < tok.vocab_size:
        raise ValueError(f"model.vocab_size={vocab} is smaller than the tokenizer ({tok.vocab_size}): "
                         "the env would render ids the model cannot embed")
    env, registration = None, None
    stop_ids = tok.eos_ids
    if task.uses_env:
        env, registration = await connect_env(cfg, tok)
        stop_ids = list(registration.stop_token_ids)
    backend = None
    try:
        backend = make_backend(cfg, model, tok, dist.rank, device)
        yield Run(model=model, backend=backend, task=task, env=env,
                  stop_token_ids=stop_ids, pad_id=tok.pad_id if tok.pad_id < vocab else 0,
                  device=device, decode=tok.decode, encode_teacher_text=tok.encode_teacher_text, dist=dist,
                  registration=registration)
    finally:
        if (close_backend := getattr(backend, "close", None)) is not None:
            close_backend()  # a backend's own thread (vLLM's engine loop)
        if env is not None:
            await env.close()
