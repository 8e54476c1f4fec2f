"""A Slurm cluster on a local cluster's nodes (launching/local_cluster.py): munge, the controller and one slurmd
per node, each daemon inside a node's network namespace, so that `sbatch` runs a job across the nodes as it
would across machines — over their shaped links.

    wb-NAME-n0   munged                  one for all nodes: its socket is a file (NAME.d/munge.socket), and
                                         the nodes share the machine's filesystem
                 slurmctld               the controller, at 198.18.0.1:6817: on the first node, as on a small
                                         cluster without a head node (the cluster's addresses stay its own)
                 slurmd -N wb-NAME-n0    NodeAddr=198.18.0.1
    wb-NAME-n1   slurmd -N wb-NAME-n1    NodeAddr=198.18.0.2, ...

Its files are in the cluster's scratch folder (local_cluster.scratch_dir, /run/workbench/clusters/NAME.d):
slurm.conf, the munge key, the controller's state, each slurmd's spool, pid file and log (`%n`: the node's
name), and the task prolog. Nothing goes into the machine's /etc: clients find slurm.conf through SLURM_CONF
and run in a node (`command(argv)`: `ip netns exec wb-NAME-n0 env SLURM_CONF=... sbatch ...`). `down` cancels
the jobs, stops the daemons and removes the folder; LocalCluster.down — also after a crash — stops whatever
still runs in the namespaces and removes the folder as well.

What differs from a real cluster's machines: every node here has the machine's host name, which names none of
the nodes' addresses. On real machines torchrun learns from its host's name whether it hosts the rendezvous and
which address to publish; here the task prolog (slurm.conf's TaskProlog, run before each task: every
`export NAME=VALUE` it prints is set in the task's environment) tells it through torchrun's own variables —
PET_LOCAL_ADDR (--local-addr) is the node's NodeAddr, PET_RDZV_CONF=is_host=1 on the job's first node, whose
NodeAddr the sbatch script makes the rendezvous endpoint — and points gloo at the node's eth0. The sbatch
script (launching/slurm_script.py) is the one for real machines, unchanged. Beside that: nothing is confined
(proctrack/linuxproc, task/none, no cgroups), there is no accounting (sacct knows nothing; squeue and
`scontrol show job` do), and each node has as many CPUs as the cluster's ranks per node, whatever the machine
has (SlurmdParameters=config_overrides).

The daemons are started with `nsenter --net`, which enters only the node's network namespace: slurmd reads the
machine's /sys/fs/cgroup when it starts, which `ip netns exec` (a /sys of the namespace's own) hides.

Needs root, and Slurm's and munge's programs (Debian: apt-get install slurmctld slurmd slurm-client munge;
`make test-slurm` installs them); elsewhere `require_slurm` refuses, naming what is missing. No torch.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass

from workbench.config import ConfigError
from workbench.launching.local_cluster import LocalCluster, scratch_dir, status

#: the programs a local Slurm runs: the daemons, and the clients it submits and follows jobs with
PROGRAMS = (
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "squeue",
    "scontrol",
    "scancel",
    "sinfo",
    "nsenter",
)
#: the controller's port on the first node, and each slurmd's on its node
CTLD_PORT, SLURMD_PORT = 6817, 6818
#: a job in one of these states has not ended
_LIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}

#: run before each task (slurm.conf's TaskProlog): what a real machine's host name would tell torchrun and gloo
_PROLOG = """\
#!/bin/sh
# launching/local_slurm.py: every node of this cluster has the machine's host name, so torchrun is told here what
# the name would tell it on a real machine. Each "export NAME=VALUE" line is set in the task's environment.
export SLURM_CONF={conf}
addr=$(scontrol show node "$SLURMD_NODENAME" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
echo "export PET_LOCAL_ADDR=$addr"
[ "$SLURMD_NODENAME" = "$first" ] && echo "export PET_RDZV_CONF=is_host=1"
echo "export GLOO_SOCKET_IFNAME=eth0"
echo "export NCCL_SOCKET_IFNAME=eth0"
echo "export WORKBENCH_NODE=$SLURMD_NODENAME"
exit 0
"""


def require_slurm() -> None:
    """A ConfigError naming what is missing where a local Slurm cannot run."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        raise ConfigError(
            f"a local Slurm needs {', '.join(missing)} on PATH (Debian: apt-get install slurmctld "
            f"slurmd slurm-client munge; util-linux gives nsenter)"
        )
    if os.geteuid() != 0:
        raise ConfigError(
            f"a local Slurm runs its daemons as root (slurmd starts each job as its user); this "
            f"process runs as uid {os.geteuid()}: run it with sudo"
        )


@dataclass(kw_only=True)
class LocalSlurm:
    """Slurm on `cluster` (which is up): `up()`, `submit(script, workdir=...)`, `wait(job)`, `down()`."""

    cluster: LocalCluster

    @property
    def folder(self) -> str:
        return scratch_dir(self.cluster.name)

    @property
    def conf(self) -> str:
        return os.path.join(self.folder, "slurm.conf")

    def command(self, argv: list[str], node: int = 0) -> list[str]:
        """`argv` (a Slurm client: sbatch, squeue, ...) run in node `node`, reading this cluster's slurm.conf."""
        return self.cluster.exec_argv(node, ["env", f"SLURM_CONF={self.conf}", *argv])

    # bringing it up and down
    def up(self, timeout_s: float = 30.0) -> LocalSlurm:
        """Write the configuration, start munged, slurmctld and every slurmd, and wait until every node is
        idle (at most `timeout_s`). On any failure, whatever was started is stopped before the error."""
        require_slurm()
        if not self.cluster.is_up:
            raise ConfigError(f"cluster {self.cluster.name!r} is not up: bring it up first")
        if status(self.cluster.name).get("holder_pid") is not None:
            raise ConfigError(
                f"cluster {self.cluster.name!r} lives in a user namespace (WORKBENCH_CLUSTER_HOST=userns), "
                f"where the daemons cannot reach its nodes: bring it up as root without it"
            )
        self.down()
        try:
            self._write_files()
            self._daemon(0, self._munged())
            self._daemon(0, ["slurmctld"])
            for k in range(self.cluster.nodes):
                self._daemon(k, ["slurmd", "-N", self.cluster.namespace(k)])
            self._wait_idle(timeout_s)
        except BaseException:
            self.down()
            raise
        return self

    def down(self, grace_s: float = 10.0) -> None:
        """Cancel every job (their tasks end with them), stop the daemons (SIGTERM, then SIGKILL after
        `grace_s`) and remove the folder. Safe on a Slurm half started, or gone."""
        if self._alive("slurmctld.pid"):
            ids = self._client(["squeue", "-h", "-o", "%i"], check=False).split()
            if ids:
                self._client(["scancel", *ids], check=False)
                _until(lambda: not self._client(["squeue", "-h"], check=False).strip(), grace_s)
        # all at once (each takes ~2 s to end): with the jobs gone, none needs another
        pid_files = [f"{self.cluster.namespace(k)}.pid" for k in range(self.cluster.nodes)]
        pid_files += ["slurmctld.pid", "munged.pid"]
        _stop([p for p in map(self._pid, pid_files) if p is not None], grace_s)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> LocalSlurm:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # jobs
    def submit(self, script: str, *, workdir: str, env: dict[str, str] | None = None) -> int:
        """sbatch `script` (a file) from node 0, run in `workdir` (its output in workdir/slurm-<id>.out), with
        this process's environment and `env` (sbatch gives the job the submitter's environment); its job id."""
        out = os.path.join(workdir, "slurm-%j.out")
        argv = ["sbatch", "--parsable", "--chdir", workdir, "--output", out, script]
        done = subprocess.run(
            self.command(argv), capture_output=True, text=True, env={**os.environ, **(env or {})}
        )
        if done.returncode != 0:
            raise RuntimeError(f"sbatch {script} failed: {done.stderr.strip()}")
        return int(done.stdout.strip().split(";")[0])

    def state(self, job: int) -> str:
        """The job's state as the controller has it (PENDING, RUNNING, COMPLETED, FAILED, ...)."""
        shown = self._client(["scontrol", "show", "job", "-o", str(job)])
        m = re.search(r"\bJobState=(\S+)", shown)
        if m is None:
            raise RuntimeError(f"scontrol show job {job}: no JobState in {shown[:300]!r}")
        return m.group(1)

    def wait(self, job: int, timeout_s: float = 180.0) -> str:
        """The job's final state, polled every 0.2 s; past `timeout_s` the job is cancelled and TimeoutError
        says where it stood."""
        deadline = time.monotonic() + timeout_s
        while (state := self.state(job)) in _LIVE:
            if time.monotonic() > deadline:
                self._client(["scancel", str(job)], check=False)
                raise TimeoutError(
                    f"Slurm job {job} still {state} after {timeout_s:g} s: cancelled"
                )
            time.sleep(0.2)
        return state

    # the pieces
    def _write_files(self) -> None:
        os.makedirs(os.path.join(self.folder, "ctld"))
        os.chmod(self.folder, 0o755)  # munged wants its socket's folder open to all
        for k in range(self.cluster.nodes):
            os.makedirs(os.path.join(self.folder, self.cluster.namespace(k)))
        key = os.path.join(self.folder, "munge.key")
        with open(os.open(key, os.O_CREAT | os.O_WRONLY, 0o600), "wb") as f:
            f.write(os.urandom(1024))
        with open(self.conf, "w") as f:
            f.write(self.slurm_conf())
        prolog = os.path.join(self.folder, "task_prolog.sh")
        with open(prolog, "w") as f:
            f.write(_PROLOG.format(conf=self.conf))
        os.chmod(prolog, 0o755)

    def slurm_conf(self) -> str:
        """slurm.conf: the controller on node 0, one slurmd per node at its address, everything in the folder."""
        d, host, c = self.folder, socket.gethostname().split(".")[0], self.cluster
        nodes = [
            f"NodeName={c.namespace(k)} NodeHostname={host} NodeAddr={c.address(k)} "
            f"CPUs={c.ranks_per_node} State=UNKNOWN"
            for k in range(c.nodes)
        ]
        lines = [
            f"ClusterName={c.name}",
            # every node has the machine's name: the controller is told which address is its own
            f"SlurmctldHost={host}({c.address(0)})",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={CTLD_PORT}",
            f"SlurmdPort={SLURMD_PORT}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={d}/munge.socket",
            f"StateSaveLocation={d}/ctld",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmctldLogFile={d}/slurmctld.log",
            f"SlurmdSpoolDir={d}/%n",
            f"SlurmdPidFile={d}/%n.pid",
            f"SlurmdLogFile={d}/%n.log",
            f"TaskProlog={d}/task_prolog.sh",
            # nothing confined, nothing accounted: a teaching cluster in one machine's namespaces
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            # whole nodes to a job, as multi-node training asks for
            "SchedulerType=sched/builtin",
            "SelectType=select/linear",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "KillWait=5",
            *nodes,
            "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    def _munged(self) -> list[str]:
        d = self.folder
        return [
            "munged",
            f"--socket={d}/munge.socket",
            f"--key-file={d}/munge.key",
            f"--pid-file={d}/munged.pid",
            f"--log-file={d}/munged.log",
            f"--seed-file={d}/munged.seed",
        ]

    def _daemon(self, node: int, argv: list[str]) -> None:
        """Start a daemon (it forks away) in node `node`'s network namespace only."""
        ns = f"/run/netns/{self.cluster.namespace(node)}"
        done = subprocess.run(
            ["nsenter", f"--net={ns}", *argv],
            capture_output=True,
            text=True,
            env={**os.environ, "SLURM_CONF": self.conf},
            timeout=30,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{argv[0]} did not start in {ns}: {done.stderr.strip()}\n{self._logs()}"
            )

    def _wait_idle(self, timeout_s: float) -> None:
        """Until sinfo shows every node idle; else a RuntimeError with the daemons' last log lines."""

        def idle() -> bool:
            shown = self._client(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            states = dict(line.split() for line in shown.splitlines() if line.strip())
            return len(states) == self.cluster.nodes and set(states.values()) == {"idle"}

        if not _until(idle, timeout_s):
            raise RuntimeError(
                f"the Slurm nodes were not idle after {timeout_s:g} s\n{self._logs()}"
            )

    def _logs(self, lines: int = 5) -> str:
        """The last lines of every daemon's log in the folder."""
        out = []
        for name in sorted(os.listdir(self.folder)) if os.path.isdir(self.folder) else []:
            if name.endswith(".log"):
                with open(os.path.join(self.folder, name), errors="replace") as f:
                    tail = f.read().splitlines()[-lines:]
                out.append(f"--- {name}\n" + "\n".join(tail))
        return "\n".join(out)

    def _client(self, argv: list[str], *, check: bool = True) -> str:
        done = subprocess.run(self.command(argv), capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
        return done.stdout

    def _pid(self, pid_file: str) -> int | None:
        try:
            with open(os.path.join(self.folder, pid_file)) as f:
                return int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _alive(self, pid_file: str) -> bool:
        pid = self._pid(pid_file)
        return pid is not None and _running(pid)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(pids: list[int], grace_s: float) -> None:
    """SIGTERM, then SIGKILL whatever still runs after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if _until(lambda: not any(_running(p) for p in pids), grace_s):
            return


def _until(condition, timeout_s: float) -> bool:
    """Poll `condition` every 0.1 s for at most `timeout_s`; whether it came true."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
