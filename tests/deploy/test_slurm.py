"""deploy/slurm/tito.sbatch's checks before it starts anything, run with bash and a stand-in for `scontrol` (no
scheduler needed): the job's output joins its private folder, and missing root filesystems end the job at once
saying where the script looked and what to do (issue 36, finding 2: the server used to stay NOT_SERVING while the
script polled for minutes). The whole job on a real Slurm is tests/deploy/test_real_slurm.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid

from tests.harness import REPO

SCONTROL = """#!/bin/sh
# scontrol stand-in: `scontrol show hostnames LIST` names this host.
echo localhost
"""


def test_the_job_ends_at_once_without_root_filesystems_and_keeps_its_output_private(tmp_path):
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "scontrol").write_text(SCONTROL)
    (shims / "scontrol").chmod(0o755)
    job = f"test-{uuid.uuid4().hex[:8]}"
    out = REPO / f"tito-{job}.out"  # what Slurm would have opened for the job's output
    out.write_text("")
    out.chmod(0o644)
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "SLURM_JOB_ID": job, "SLURM_SUBMIT_DIR": str(REPO),
           "SLURM_JOB_NODELIST": "localhost", "TITO_ROOTFS_DIR": str(tmp_path / "no-rootfs")}
    run = REPO / "runs" / f"slurm-{job}"
    try:
        t0 = time.monotonic()
        proc = subprocess.run(["bash", "deploy/slurm/tito.sbatch"], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert time.monotonic() - t0 < 60
        assert (f"[tito] no root filesystem for image 'tito-sandbox-python:latest' in {tmp_path / 'no-rootfs'}"
                in proc.stderr), proc.stderr
        assert "TITO_ROOTFS_DIR=/shared/tito/rootfs sbatch" in proc.stderr
        assert not (run / "env_server.log").exists()  # no server was started
        assert not out.exists() and (run / "job.out").stat().st_mode & 0o777 == 0o600
        assert run.stat().st_mode & 0o777 == 0o700
    finally:
        out.unlink(missing_ok=True)
        shutil.rmtree(run, ignore_errors=True)
