"""A real four-node Slurm cluster on this one machine, for the tests and CI.

Debian builds Slurm with ``MULTIPLE_SLURMD``: one ``slurmd -N NAME`` per node, each
on its own port, all on 127.0.0.1, with a private ``munged``. Everything lives
under one directory; daemons are stopped by their PID files.

    python -m tests.support.slurm_cluster start /tmp/tg-slurm   # prints the env to export
    python -m tests.support.slurm_cluster stop /tmp/tg-slurm

Needs root and Debian's ``slurmctld slurmd slurm-client munge`` packages.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trainguard.actions.hostlist import expand

NODES = [f"gpu-node-0{i}" for i in range(1, 5)]
CTLD_PORT = 16817
SLURMD_PORTS = "17001-17004"
BINARIES = ("slurmctld", "slurmd", "munged", "mungekey", "scontrol", "sbatch", "squeue", "sinfo")


@dataclass(frozen=True)
class SlurmCluster:
    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a client (scontrol, sbatch, trainguard's driver) needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> str:
        proc = subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=30)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def reset(self) -> None:
        """Cancel every job and return every node to service."""
        self.run("scancel", "--full", "--quiet", "--user=root", check=False)
        _wait(
            lambda: (
                not self.run("squeue", "-h", "-t", "all", "-o", "%T", check=False)
                .replace("CANCELLED", "")
                .replace("COMPLETED", "")
                .replace("FAILED", "")
                .strip()
            ),
            "all jobs gone",
        )
        self.run("scontrol", "update", f"nodename={','.join(NODES)}", "state=resume", check=False)
        _wait(lambda: _all_idle(self), "all four nodes idle")

    def submit(self, nodes: int = 2, name: str = "llm-pretrain") -> tuple[str, list[str]]:
        """Submit a requeueable job that runs forever; return its id and nodes once it runs."""
        out = self.run(
            "sbatch",
            "--parsable",
            f"--nodes={nodes}",
            "--gres=gpu:8",
            f"--job-name={name}",
            "--requeue",
            "--open-mode=append",
            f"--output={self.root}/job-%j.out",
            "--wrap",
            "srun -l sleep 100000",
        )
        job = out.strip().split(";")[0]
        _wait(lambda: self.job(job)["job_state"] == "RUNNING", f"job {job} running")
        return job, expand(self.job(job)["nodes"])

    def job(self, job_id: str) -> dict:
        jobs = json.loads(self.run("squeue", "--json", "--states=all"))["jobs"]
        return next(j for j in jobs if str(j["job_id"]) == job_id)

    def nodes(self) -> dict[str, dict]:
        return {n["name"]: n for n in json.loads(self.run("sinfo", "--json"))["nodes"]}

    def stop_controller(self) -> None:
        """Stop slurmctld only (the nodes keep running their jobs): the scheduler is down."""
        pidfile = self.root / "run" / "slurmctld.pid"
        pid = int(pidfile.read_text().strip())
        os.kill(pid, signal.SIGTERM)
        _wait(lambda: not Path(f"/proc/{pid}").exists(), "slurmctld stopped")

    def start_controller(self) -> None:
        subprocess.run([_bin("slurmctld"), "-f", str(self.conf)], env={**os.environ, **self.env}, check=False)
        _wait(lambda: "UP" in self.run("scontrol", "ping", check=False), "slurmctld answering ping")

    def wait_for(self, predicate: object, what: str, timeout: float = 30.0, job: str | None = None) -> None:
        try:
            _wait(predicate, what, timeout)
        except RuntimeError as exc:
            if job is None:
                raise
            j = self.job(job)
            state = {k: j.get(k) for k in ("job_state", "state_reason", "restart_cnt", "nodes", "priority")}
            raise RuntimeError(f"{exc}; job {job}: {state}") from None


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def _bin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _write_config(root: Path) -> None:
    host = socket.gethostname().split(".")[0]
    etc, run, log = root / "etc", root / "run", root / "log"
    for d in (etc, run, log, root / "state", root / "spool", root / "munge", root / "dev"):
        d.mkdir(parents=True, exist_ok=True)
    for node in NODES:
        (root / "spool" / node).mkdir(exist_ok=True)
    (root / "munge").chmod(0o755)  # clients need to reach the socket
    for i in range(8):  # fake GPUs: gres.conf needs File=, /dev/null symlinks will do
        dev = root / "dev" / f"nvidia{i}"
        if not dev.exists():
            dev.symlink_to("/dev/null")
    (etc / "gres.conf").write_text(f"Name=gpu File={root}/dev/nvidia[0-7]\n")
    (etc / "slurm.conf").write_text(
        f"""ClusterName=trainguard
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={CTLD_PORT}
SlurmdPort=17000
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket,cred_expire=10
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={run}/slurmctld.pid
SlurmdPidFile={run}/slurmd-%n.pid
SlurmctldLogFile={log}/slurmctld.log
SlurmdLogFile={log}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={log}/jobcomp.txt
MpiDefault=none
GresTypes=gpu
SlurmctldTimeout=10
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=300
NodeName=gpu-node-0[1-4] NodeAddr=127.0.0.1 NodeHostname={host} Port=[{SLURMD_PORTS}] CPUs=8 Gres=gpu:8 State=UNKNOWN
PartitionName=gpu Nodes=gpu-node-0[1-4] Default=YES MaxTime=INFINITE State=UP
PartitionName=canary Nodes=gpu-node-04 MaxTime=INFINITE State=UP
"""
    )


def _wait(predicate: object, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise RuntimeError(f"Slurm test cluster: {what} did not happen within {timeout:.0f} s")


def start(root: Path) -> SlurmCluster:
    """Write the configuration, start munged, slurmctld and one slurmd per node; wait until all are idle."""
    missing = missing_binaries()
    if missing:
        raise RuntimeError(f"install Debian's slurmctld slurmd slurm-client munge packages (missing: {missing})")
    root = root.resolve()
    stop(root)
    _write_config(root)
    cluster = SlurmCluster(root)
    key = root / "munge" / "munge.key"
    if not key.exists():
        subprocess.run([_bin("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        key.chmod(0o600)
    subprocess.run(
        [
            _bin("munged"),
            f"--socket={root}/munge/munge.socket",
            f"--key-file={key}",
            f"--pid-file={root}/run/munged.pid",
            f"--log-file={root}/log/munged.log",
            f"--seed-file={root}/munge/munged.seed",
            "--force",
        ],
        check=True,
        capture_output=True,
    )
    env = {**os.environ, **cluster.env}
    # slurmctld exits 0 even when it refuses the configuration: readiness is `scontrol ping`.
    subprocess.run([_bin("slurmctld"), "-f", str(cluster.conf)], env=env, check=False, capture_output=True)
    _wait(lambda: "UP" in cluster.run("scontrol", "ping", check=False), "slurmctld answering ping")
    for node in NODES:
        subprocess.run([_bin("slurmd"), "-N", node, "-f", str(cluster.conf)], env=env, check=True, capture_output=True)
    _wait(lambda: _all_idle(cluster), "all four nodes idle")
    return cluster


def _all_idle(cluster: SlurmCluster) -> bool:
    states = cluster.run("sinfo", "-h", "-N", "-p", "gpu", "-o", "%N %t", check=False).split("\n")
    return sum(1 for line in states if line.strip().endswith(" idle")) == len(NODES)


def stop(root: Path) -> None:
    """Cancel every job, then stop the daemons by their PID files."""
    root = root.resolve()
    if (root / "run" / "slurmctld.pid").exists():
        # A controller that is already gone times out here: the daemons are stopped below anyway.
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                ["scancel", "--full", "--quiet", "--user=root"],
                env={**os.environ, "SLURM_CONF": str(root / "etc" / "slurm.conf")},
                capture_output=True,
                timeout=10,
                check=False,
            )
    run = root / "run"
    pidfiles = [*sorted(run.glob("slurmd-*.pid")), run / "slurmctld.pid", run / "munged.pid"]
    for pidfile in pidfiles:
        try:
            pid = int(pidfile.read_text().strip())
            os.kill(pid, signal.SIGTERM)
        except (FileNotFoundError, ValueError, ProcessLookupError):
            continue
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pidfile.unlink(missing_ok=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit("usage: python -m tests.support.slurm_cluster start|stop DIR")
    directory = Path(sys.argv[2])
    if sys.argv[1] == "start":
        c = start(directory)
        print(f"export SLURM_CONF={c.conf}")
    else:
        stop(directory)
