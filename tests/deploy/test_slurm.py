"""deploy/slurm/tito.sbatch on this machine: `srun` and `scontrol` are stand-ins (srun runs the command here,
scontrol names this host), everything else is real: make_certs.sh, a bwrap env server with TLS and a token,
and the trainer's first step against it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest

from env_server.sandbox.bwrap import rootfs
from tests.harness import REPO, free_port

pytestmark = pytest.mark.bwrap

SRUN = """#!/bin/sh
# srun stand-in: drop srun's own options, run the command here.
while [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done
exec "$@"
"""
SCONTROL = """#!/bin/sh
# scontrol stand-in: `scontrol show hostnames LIST` names this host.
echo localhost
"""


def test_the_slurm_job_trains_against_a_bwrap_server_over_tls(bwrap_ok, tmp_path):
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    job = f"test-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "SLURM_JOB_ID": job, "SLURM_SUBMIT_DIR": str(REPO),
           "SLURM_JOB_NODELIST_HET_GROUP_0": "localhost", "TITO_PORT": str(free_port()), "TITO_HOST": "127.0.0.1",
           "TITO_ROOTFS_DIR": str(rootfs.default_rootfs_dir()), "TITO_POOL_SIZE": "2", "HF_HUB_OFFLINE": "1"}
    run = REPO / "runs" / f"slurm-{job}"
    try:
        proc = subprocess.run(
            ["bash", "deploy/slurm/tito.sbatch", "examples/demo.yaml", "--steps", "1", "--set", "prompts_per_step=1",
             "--set", "num_generations=2", "--set", "warm_start.steps=1", "--set", "progress=false",
             "--set", "save_checkpoint=false", "--set", "model.device=cpu"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=420)
        log = (run / "env_server.log").read_text() if (run / "env_server.log").exists() else ""
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:] + log[-2000:]
        assert "bwrap sandboxes" in proc.stdout
        assert "listening on 127.0.0.1" in log and "(TLS, 1 bearer token(s))" in log
        steps = [json.loads(x)["step"] for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
        assert steps == [1]
        # The job's folder is the user's alone; the keys in it too.
        assert run.stat().st_mode & 0o777 == 0o700 and (run / "tls" / "server.key").stat().st_mode & 0o077 == 0
    finally:
        shutil.rmtree(run, ignore_errors=True)
