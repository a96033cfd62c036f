"""deploy/slurm/tito.sbatch and tito-1node.sbatch on a real Slurm (issue 36): munged, slurmctld and two slurmd
started here (tests/deploy/slurm_cluster.py), the real scripts submitted with sbatch, a bwrap env server with TLS
and a token, and the trainer's first GRPO step on the demo's tiny model against it.

Three jobs run at once (their waits overlap): the heterogeneous job as root, which must complete with the server
stopped by its own graceful shutdown and every file private; the same job cancelled while it trains, which must
leave no process behind; and the one-node form as an unprivileged user from a checkout of their own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.deploy.slurm_cluster import SlurmCluster, slurm_missing
from tests.harness import REPO, free_port
from tests.server.test_unprivileged import _grant_traverse

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]
NOBODY = 65534
# Where setup builds them as root (or TITO_ROOTFS_DIR, as setup takes it); the unprivileged job is pointed at them.
ROOTFS = os.environ.get("TITO_ROOTFS_DIR") or "/var/lib/tito/rootfs"
# The fewest GRPO steps on the demo's tiny model: one step of one prompt, two rollouts.
TRAIN = ["examples/demo.yaml", "--steps", "1", "--set", "prompts_per_step=1", "--set", "num_generations=2",
         "--set", "warm_start.steps=1", "--set", "progress=false", "--set", "save_checkpoint=false"]
# Sized for a cluster without GPUs, as deploy/slurm/README.md says: options apply to both components.
HET_SIZES = ["--cpus-per-task=1", "--mem=2G", "--gpus-per-task=0"]
ONE_NODE_SIZES = ["--cpus-per-task=1", "--mem=3G", "--gpus=0"]
JOB_TIMEOUT_S = 420


def _job_env(port: int, **extra: str) -> dict[str, str]:
    return {"TITO_PORT": str(port), "TITO_HOST": "127.0.0.1", "TITO_POOL_SIZE": "2", "HF_HUB_OFFLINE": "1", **extra}


def _submit(cluster: SlurmCluster, script: str, sizes: list[str], *, cwd: Path, env: dict[str, str],
            user: int | None = None) -> str:
    out = cluster.run("sbatch", "--parsable", *sizes, script, *TRAIN, cwd=cwd, env=env, user=user).stdout
    return out.strip().split(";")[0].split("+")[0]


def _user_checkout(root: Path) -> Path:
    """A checkout the unprivileged user may write to (runs/ is made there): the repository's entries linked."""
    checkout = root / "checkout"
    checkout.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in ("runs", ".git") and not entry.name.startswith("tito-"):
            (checkout / entry.name).symlink_to(entry)
    home = root / "home"
    home.mkdir()
    for path in (root, checkout, home):
        os.chown(path, NOBODY, NOBODY)
    return checkout


@pytest.fixture(scope="module")
def cluster(bwrap_ok):
    why = slurm_missing()
    if why:
        pytest.skip(why)
    if not Path(ROOTFS, "tito-sandbox-python_latest").is_dir():
        pytest.skip(f"no root filesystems in {ROOTFS} (scripts/setup.sh builds them as root)")
    c = SlurmCluster.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def jobs(cluster):
    """The three jobs, submitted at once: {"root": id, "cancel": id, "user": id} and the user's checkout."""
    user_root = Path(tempfile.mkdtemp(prefix="tito-slurm-user-"))
    user_root.chmod(0o755)
    checkout = _user_checkout(user_root)
    interpreter = Path(os.path.realpath(sys.executable)).parent
    changed = _grant_traverse(interpreter) + _grant_traverse(REPO) + _grant_traverse(Path(ROOTFS))
    ids: dict[str, str] = {}
    try:
        ids["root"] = _submit(cluster, "deploy/slurm/tito.sbatch", HET_SIZES, cwd=REPO, env=_job_env(free_port()))
        ids["cancel"] = _submit(cluster, "deploy/slurm/tito.sbatch", HET_SIZES, cwd=REPO, env=_job_env(free_port()))
        ids["user"] = _submit(cluster, "deploy/slurm/tito-1node.sbatch", ONE_NODE_SIZES, cwd=checkout, user=NOBODY,
                              env=_job_env(free_port(), HOME=str(user_root / "home"), TITO_ROOTFS_DIR=ROOTFS))
        yield {**ids, "checkout": checkout}
    finally:
        for job in ids.values():
            cluster.run("scancel", job, check=False)
        for job in ("root", "cancel"):
            if job in ids:
                shutil.rmtree(REPO / "runs" / f"slurm-{ids[job]}", ignore_errors=True)
                (REPO / f"tito-{ids[job]}.out").unlink(missing_ok=True)
        for folder, mode in changed:
            os.chmod(folder, mode)
        shutil.rmtree(user_root, ignore_errors=True)


def _explain(cluster: SlurmCluster, run: Path) -> str:
    files = {p.name: p.read_text(errors="replace")[-3000:] for p in (run / "job.out", run / "env_server.log")
             if p.exists()}
    return f"{files}\n{cluster.logs(1500)}"


def _assert_trained_and_stopped_cleanly(cluster: SlurmCluster, job: str, run: Path) -> list[dict[str, str]]:
    t0 = time.monotonic()
    records = cluster.wait_done(job, JOB_TIMEOUT_S)
    states = [(r["JobState"], r["ExitCode"]) for r in records]
    if states != [("COMPLETED", "0:0")] * len(records):
        pytest.fail(f"job {job}: {states}\n{_explain(cluster, run)}", pytrace=False)
    print(f"job {job}: {records[0].get('RunTime')} run time, done {time.monotonic() - t0:.0f} s after the test waited")
    metrics = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1] and isinstance(metrics[0]["reward_mean"], float), metrics
    # The env's reward read over TLS: the warm start's tool-calling teachers ran their code in the server's
    # sandboxes and were scored 1 by it.
    demos = [json.loads(line) for line in (run / "train" / "demonstrations.jsonl").read_text().splitlines()]
    tool_demos = [d for d in demos if d["meta"]["teacher"] == "tool"]
    assert tool_demos and all(d["env_reward"] == 1.0 and d["tool_messages"] == [d["meta"]["answer"]]
                              for d in tool_demos), demos
    log = (run / "env_server.log").read_text()
    # The server step ended by the server's own shutdown, not by Slurm aborting the step (no "CANCELLED" line
    # from slurmstepd, no srun abort lines), after it had sized its sessions from the job's --mem.
    assert "shutting down: draining calls" in log and "shut down cleanly" in log, _explain(cluster, run)
    assert "CANCELLED" not in log and "srun:" not in log, log[-3000:]
    assert re.search(r"max \d+ sessions \(auto: 80% of [\d.]+ GiB \(the Slurm job's memory, SLURM_MEM_PER_NODE\)",
                     log), log[-3000:]
    # Private: the job's folder 0700, its output 0600 inside it, nothing left beside the checkout.
    assert run.stat().st_mode & 0o777 == 0o700
    assert (run / "job.out").stat().st_mode & 0o777 == 0o600
    assert (run / "tls" / "server.key").stat().st_mode & 0o077 == 0
    assert not (run.parent.parent / f"tito-{job}.out").exists()
    out = (run / "job.out").read_text()
    assert "[tito] env server on" in out and "bwrap sandboxes" in out and "done in" in out, out
    return records


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every process."""
    found = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            found[int(d.name)] = (int(fields[1]), fields[19])
    return found


def _job_processes(job_ids: set[str]) -> dict[int, str]:
    """pid -> start time of every process of these jobs (by SLURM_JOB_ID) and all their descendants."""
    procs = _processes()
    roots = set()
    for pid in procs:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(f"SLURM_JOB_ID={j}".encode() in environ for j in job_ids):
            roots.add(pid)
    members, grew = set(roots), True
    while grew:
        kids = {pid for pid, (ppid, _) in procs.items() if ppid in members} - members
        grew = bool(kids)
        members |= kids
    return {pid: procs[pid][1] for pid in members}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_real_slurm_cancel_leaves_no_process_of_the_job(cluster, jobs):
    job = jobs["cancel"]
    run = REPO / "runs" / f"slurm-{job}"
    deadline = time.monotonic() + JOB_TIMEOUT_S
    # Cancelled while it trains: the trainer step runs, the server holds its sandboxes.
    while "tito-trainer" not in cluster.run("squeue", "-h", "--steps", "-o", "%j", "--jobs",
                                             ",".join(r["JobId"] for r in cluster.jobs(job))).stdout:
        assert time.monotonic() < deadline and all(r["JobState"] in ("PENDING", "RUNNING", "CONFIGURING")
                                                  for r in cluster.jobs(job)), _explain(cluster, run)
        time.sleep(1)
    time.sleep(5)
    component_ids = {r["JobId"] for r in cluster.jobs(job)}
    before = _job_processes(component_ids)
    commands = [_cmdline(p) for p in before]
    assert any("-m env_server" in c for c in commands) and any("-m trainer" in c for c in commands), commands
    assert any(c.startswith("bwrap") or "/bwrap " in c for c in commands), commands
    cluster.run("scancel", job)
    records = cluster.wait_done(job, 60)
    assert {r["JobState"] for r in records} == {"CANCELLED"}, records
    time.sleep(3)
    after = _processes()
    left = [(pid, _cmdline(pid)) for pid, start in before.items() if pid in after and after[pid][1] == start]
    assert not left, left
    assert run.stat().st_mode & 0o777 == 0o700 and (run / "job.out").stat().st_mode & 0o777 == 0o600


def test_real_slurm_heterogeneous_job_completes_and_the_server_shuts_down_gracefully(cluster, jobs):
    run = REPO / "runs" / f"slurm-{jobs['root']}"
    records = _assert_trained_and_stopped_cleanly(cluster, jobs["root"], run)
    assert [r["Partition"] for r in records] == ["cpu", "gpu"] and len({r["NodeList"] for r in records}) == 2
    assert "(TLS, 1 bearer token(s))" in (run / "env_server.log").read_text()


def test_real_slurm_one_node_form_runs_as_an_unprivileged_user(cluster, jobs):
    job = jobs["user"]
    run = jobs["checkout"] / "runs" / f"slurm-{job}"
    records = _assert_trained_and_stopped_cleanly(cluster, job, run)
    assert records[0]["UserId"] == f"nobody({NOBODY})" and "HetJobId" not in records[0], records
    assert run.stat().st_uid == NOBODY and (run / "job.out").stat().st_uid == NOBODY
    # Run by a user, the server starts sandboxes as itself and says which limits fall back to rlimits.
    log = (run / "env_server.log").read_text()
    assert re.search(r"no cgroup for memory \(falls back to RLIMIT_AS per process\)", log), log[-3000:]
    assert f"root filesystems in {ROOTFS}" in (run / "job.out").read_text()
