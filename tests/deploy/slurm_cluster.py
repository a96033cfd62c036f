"""A real Slurm cluster on this machine for the tests: munged with its own key, slurmctld and one slurmd per node,
each with its own slurm.conf, state, spool, socket and log under one temporary folder, ports on loopback.

Debian's slurm-wlm 22.05 (setup installs it with munge). SlurmUser root, proctrack/linuxproc, task/none,
select/cons_tres, no accounting: job states come from `scontrol show job`, step outcomes from the job's own
files. Two nodes are two slurmd processes with their own names, ports and loopback addresses (127.0.0.1 and
127.0.0.2): this machine's name (partition cpu, where the env server runs) and `tito-gpu` (partition gpu, no GPU
gres: the job is sized with --gpus-per-task=0).
Every daemon is a child of this process, started in the foreground and stopped by its pid.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness import free_port

SBIN = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
# The server's node is this machine by its name (it resolves: the trainer dials it and the certificate names it;
# slurm.conf treats a node named "localhost" specially); the trainer's node is a second name on 127.0.0.2.
NODES = ((socket.gethostname().split(".")[0], "127.0.0.1", "cpu"), ("tito-gpu", "127.0.0.2", "gpu"))
CPUS, MEMORY_MB = 4, 8192  # what each node claims (config_overrides: the scheduler's figures, not the machine's)


def slurm_missing() -> str | None:
    """None when munged, slurmctld, slurmd and the client commands are installed, else what to do."""
    missing = [p for p in SBIN if not os.access(p, os.X_OK)]
    missing += [c for c in ("sbatch", "scontrol", "scancel", "sinfo", "squeue") if shutil.which(c) is None]
    if os.geteuid() != 0:
        missing.append("root (the daemons run as root)")
    return None if not missing else (f"no real Slurm here ({', '.join(missing)}): TITO_INSTALL_SLURM=1 "
                                     "scripts/setup.sh installs slurm-wlm and munge as root")


@dataclass
class SlurmCluster:
    root: Path  # every file of the cluster; 0755 so that an unprivileged submitter reaches the socket and conf
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client command needs to reach this cluster (its conf names munge's socket)."""
        return {"SLURM_CONF": str(self.conf)}

    @classmethod
    def start(cls, timeout_s: float = 60) -> "SlurmCluster":
        root = Path(tempfile.mkdtemp(prefix="tito-slurm-"))
        root.chmod(0o755)
        cluster = cls(root)
        try:
            cluster._write_config()
            cluster._start_daemons(timeout_s)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _write_config(self) -> None:
        r = self.root
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(mode=0o700 if d == "munge" else 0o755)
        key = r / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        ctld_port, *node_ports = (free_port() for _ in range(1 + len(NODES)))
        nodes = "\n".join(f"NodeName={n} NodeAddr={a} Port={p} CPUs={CPUS} RealMemory={MEMORY_MB} State=UNKNOWN"
                          for (n, a, _), p in zip(NODES, node_ports))
        parts = "\n".join(f"PartitionName={part} Nodes={n} MaxTime=INFINITE State=UP Default={'NO' if i else 'YES'}"
                          for i, (n, _, part) in enumerate(NODES))
        self.conf.write_text(f"""\
ClusterName=tito{secrets.token_hex(3)}
FirstJobId={1000 + secrets.randbelow(10 ** 6)}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge.socket
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SwitchType=switch/none
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=10
MinJobAge=600
{nodes}
{parts}
""")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                            start_new_session=True)

    def _start_daemons(self, timeout_s: float) -> None:
        r = self.root
        self._spawn("munged", ["/usr/sbin/munged", "--foreground", f"--socket={r}/munge.socket",
                               f"--key-file={r}/munge/munge.key", f"--pid-file={r}/munge/munged.pid",
                               f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/munged.seed"])
        self._wait(lambda: (r / "munge.socket").exists(), timeout_s, "munged's socket")
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.run("scontrol", "ping", check=False).returncode == 0, timeout_s, "slurmctld")
        for name, _, _ in NODES:
            self._spawn(f"slurmd-{name}", ["/usr/sbin/slurmd", "-D", "-N", name, "-f", str(self.conf)])
        self._wait(lambda: set(self.run("sinfo", "-h", "-N", "-o", "%t").stdout.split()) == {"idle"},
                   timeout_s, "both nodes idle")

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"Slurm test cluster: no {what} ({', '.join(dead) or 'timeout'}): {self.logs()}")
            time.sleep(0.3)

    def run(self, *cmd: str, check: bool = True, user: int | None = None, env: dict | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster (as `user`, a uid, when given)."""
        as_user = {} if user is None else {"user": user, "group": user, "extra_groups": []}
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, cwd=cwd,
                              env={**os.environ, **(env or {}), **self.env}, **as_user)
        if check and proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stdout}{proc.stderr}")
        return proc

    def jobs(self, job_id: str) -> list[dict[str, str]]:
        """`scontrol show job` of a job, one record per heterogeneous component."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines() if line.strip()]

    def wait_done(self, job_id: str, timeout_s: float) -> list[dict[str, str]]:
        """The job's records once no component is pending, running or completing."""
        deadline = time.monotonic() + timeout_s
        while True:
            recs = self.jobs(job_id)
            if all(r["JobState"] not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING") for r in recs):
                return recs
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {[r['JobState'] for r in recs]} after {timeout_s} s: {recs}")
            time.sleep(1)

    def logs(self, tail: int = 3000) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    def stop(self) -> None:
        """Cancels every job, stops the daemons (slurmds, then slurmctld, then munged) and removes the folder."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            ids = self.run("squeue", "-h", "-o", "%F", check=False).stdout.split()  # every user's
            if ids:
                self.run("scancel", *sorted(set(ids)), check=False)
                time.sleep(2)
        for name in [n for n in self.procs if n.startswith("slurmd")] + ["slurmctld", "munged"]:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)
