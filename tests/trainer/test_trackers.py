"""report_to: TensorBoard event files and trackio's local database get each step's metrics;
metrics.jsonl and metrics.png are written whatever the setting."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import report
from trainer.backends.hf import TransformersBackend
from trainer.config import ConfigError, load_config
from trainer.model import build_tiny_qwen3
from trainer.setup import Run
from trainer.tasks import TokenSubsetTask
from trainer.train import train

REPO = Path(__file__).resolve().parents[2]
TINY = ["task.name=token_subset", "budget.context=24", "budget.per_turn=8", "budget.reserve=0",
        "budget.max_turns=1", "num_generations=4", "prompts_per_step=2", "steps=2", "progress=false",
        "save_checkpoint=false"]


def test_report_to_values_as_trl_takes_them():
    def report_to(value):
        return load_config(None, [f"report_to={value}"]).report_to

    assert report_to("tensorboard") == ["tensorboard"]
    assert report_to("[trackio, tensorboard]") == ["trackio", "tensorboard"]
    assert report_to("all") == ["tensorboard", "trackio"]
    assert report_to("none") == [] and load_config(None).report_to == []
    with pytest.raises(ConfigError, match="report_to"):
        report_to("wandb")


def test_tensorboard_event_file_has_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = build_tiny_qwen3(vocab_size=256)
    run = Run(model=model, backend=TransformersBackend(model), task=TokenSubsetTask(256, prompt_len=6), env=None,
              stop_token_ids=[], pad_id=0)
    cfg = load_config(None, [*TINY, "report_to=tensorboard", f"output_dir={tmp_path}"])
    asyncio.run(train(run, cfg))
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/reward_mean", "train/loss", "train/grad_norm", "train/truncated_frac", "train/tokens_per_s",
            "train/clip_frac"} <= tags
    metrics = report.read_jsonl(tmp_path / "metrics.jsonl")
    for key in ("reward_mean", "loss", "grad_norm"):
        got = [(e.step, e.value) for e in acc.Scalars(f"train/{key}")]
        assert got == [(m["step"], pytest.approx(m[key], rel=1e-6)) for m in metrics]
    assert (tmp_path / "metrics.png").stat().st_size > 1000  # the usual outputs stay


def test_trackio_logs_locally(tmp_path):
    out, store = tmp_path / "run", tmp_path / "trackio"
    env = {**os.environ, "TRACKIO_DIR": str(store), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    args = [a for item in [*TINY, "model.vocab_size=256", "tracker_project=tito-test", "run_name=tiny"]
            for a in ("--set", item)]
    proc = subprocess.run([sys.executable, "-m", "trainer", "--output-dir", str(out), "--report-to", "trackio", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    with sqlite3.connect(store / "tito-test.db") as db:
        rows = db.execute("select run_name, step, metrics from metrics order by step").fetchall()
    logged = [(name, step, json.loads(blob)) for name, step, blob in rows]
    metrics = report.read_jsonl(out / "metrics.jsonl")
    assert [(name, step) for name, step, _ in logged] == [("tiny", 1), ("tiny", 2)]
    assert [m["train/reward_mean"] for _, _, m in logged] == [m["reward_mean"] for m in metrics]
