"""A real single-node SLURM cluster (Debian's slurm-wlm 22.05 and munge) under one folder.

Every daemon runs in the foreground (`-D`, `-F`) as a child of the test process, so stopping
it is a signal to a PID we started; nothing is installed as a system service and no system
config file is touched. Clients find the cluster through SLURM_CONF (see `env`).

The node advertises fake GPUs (gres.conf `File=` twins of /dev/null): SLURM schedules them and sets
CUDA_VISIBLE_DEVICES like on a GPU node, which is what the workflow's GPU rules need to be
tested on a machine without one.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
MUNGE_USER = "munge"


def missing_programs() -> list[str]:
    """Programs of the slurm-wlm and munge packages this cluster needs and PATH lacks."""
    needed = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "setpriv")
    return [name for name in needed if shutil.which(name, path=_sbin_path()) is None]


def _sbin_path() -> str:
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SlurmCluster:
    """slurmctld + one slurmd with `cpus` CPUs, `memory_mb` memory and `gpus` fake GPUs; with
    `nodes` > 1, as many slurmd on this host (nodes n1, n2, ... each on a port of its own, the
    CPUs and memory shared out, no GPUs), as a multi-node job needs them."""

    def __init__(
        self, root: Path, cpus: int = 2, memory_mb: int = 16000, gpus: int = 2, nodes: int = 1
    ):
        self.root = Path(root)
        self.cpus = cpus
        self.memory_mb = memory_mb
        self.gpus = gpus if nodes == 1 else 0
        self.host = socket.gethostname().split(".")[0]
        self.nodes = [self.host] if nodes == 1 else [f"n{i + 1}" for i in range(nodes)]
        self.node = self.nodes[0]
        self.processes: dict[str, subprocess.Popen] = {}
        self.conf = self.root / "etc/slurm.conf"
        self.munge_dir = self.root / "munge"

    @property
    def env(self) -> dict[str, str]:
        """Environment for clients (sbatch, squeue, the executor plugin) of this cluster."""
        path = os.pathsep.join([str(self.root / "bin"), _sbin_path()])
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": path}

    def start(self, timeout: float = 60) -> SlurmCluster:
        try:
            self._write_munge_files()
            self._write_slurm_conf()
            self._start_munged()
            self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
            for node in self.nodes:
                name = "slurmd" if len(self.nodes) == 1 else f"slurmd-{node}"
                self._spawn(name, ["slurmd", "-D", "-f", str(self.conf), "-N", node])
            self._wait_for_idle_node(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM each daemon we started (newest first), SIGKILL what outlives 10 s."""
        for name in reversed(list(self.processes)):
            process = self.processes.pop(name)
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        """A client command (squeue, scontrol, ...) against this cluster."""
        return subprocess.run(command, env=self.env, capture_output=True, text=True, check=check)

    def log(self, daemon: str) -> str:
        path = self.root / "log" / f"{daemon}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # --- set-up -------------------------------------------------------------------------------

    def _write_munge_files(self) -> None:
        # munged refuses keys and sockets that anyone but its own user could touch.
        user = pwd.getpwnam(MUNGE_USER)
        # The socket folder must be traversable by every client (execute for all).
        self.munge_dir.mkdir(parents=True)
        self.munge_dir.chmod(0o711)
        key = self.munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for path in (self.munge_dir, key):
            os.chown(path, user.pw_uid, user.pw_gid)
        # The munge user must reach its folder (root's parents must already be traversable).
        self.root.chmod(self.root.stat().st_mode | 0o711)

    def _write_slurm_conf(self) -> None:
        for folder in ("etc", "state", "spool", "log/slurmd", "run/slurmd", "bin"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self._write_srun_shim()
        ctld_port, slurmd_port = _free_port(), _free_port()
        gpus = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        # Several slurmd on one host: each its own port, spool, pid and log (%n: its name).
        several = len(self.nodes) > 1
        per_node = "/%n" if several else ""
        nodes = "".join(
            f"NodeName={node} NodeHostname={self.host} NodeAddr=127.0.0.1"
            + (f" Port={_free_port()}" if several else "")
            + f" CPUs={self.cpus // len(self.nodes)}"
            + f" RealMemory={self.memory_mb // len(self.nodes)}{gpus} State=UNKNOWN\n"
            for node in self.nodes
        )
        self.conf.write_text(
            f"""\
ClusterName=reasonrl-test
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_dir / "munge.socket"}
StateSaveLocation={self.root / "state"}
SlurmdSpoolDir={self.root / "spool"}{per_node}
SlurmctldPidFile={self.root / "run/slurmctld.pid"}
SlurmdPidFile={self.root / "run/slurmd"}{per_node}.pid
SlurmctldLogFile={self.root / "log/slurmctld.log"}
SlurmdLogFile={self.root / "log/slurmd"}{per_node}.log
# No cgroup hierarchy of our own: track processes by parent, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
# squeue must still see a finished job at the executor's next status check (and the
# tests read finished jobs back with scontrol).
MinJobAge=3600
ReturnToService=2
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SlurmdParameters=config_overrides
GresTypes=gpu
{nodes}PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )
        gres = "".join(
            f"NodeName={self.node} Name=gpu File={device}\n" for device in self._fake_gpu_devices()
        )
        (self.root / "etc/gres.conf").write_text(gres)

    def _fake_gpu_devices(self) -> list[Path]:
        """One character device per fake GPU, a twin of /dev/null named like /dev/nvidiaN.

        slurmd wants a distinct character device per GPU and takes the GPU index (hence
        CUDA_VISIBLE_DEVICES) from the number that ends its name.
        """
        devices = []
        for index in range(self.gpus):
            device = self.root / f"dev/nvidia{index}"
            device.parent.mkdir(exist_ok=True)
            os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            devices.append(device)
        return devices

    def _write_srun_shim(self) -> None:
        """srun that finds this cluster's config even when SLURM_CONF was dropped.

        The executor plugin's job step removes every SLURM_* variable but a few before it calls
        srun inside the job; on a real cluster srun then reads /etc/slurm/slurm.conf. This
        cluster's config lives in its own folder, so the srun first on the jobs' PATH puts
        SLURM_CONF back (no system file is written).
        """
        srun = shutil.which("srun", path=_sbin_path())
        shim = self.root / "bin/srun"
        shim.write_text(f'#!/bin/sh\nSLURM_CONF={self.conf} exec {srun} "$@"\n')
        shim.chmod(0o755)

    def _start_munged(self) -> None:
        user = pwd.getpwnam(MUNGE_USER)
        group = grp.getgrgid(user.pw_gid).gr_name
        command = [
            "setpriv",
            f"--reuid={MUNGE_USER}",
            f"--regid={group}",
            "--init-groups",
            "munged",
            "-F",
            f"--key-file={self.munge_dir / 'munge.key'}",
            f"--socket={self.munge_dir / 'munge.socket'}",
            f"--pid-file={self.munge_dir / 'munged.pid'}",
            f"--seed-file={self.munge_dir / 'munged.seed'}",
            f"--log-file={self.munge_dir / 'munged.log'}",
        ]
        self._spawn("munged", command)
        self._wait(lambda: (self.munge_dir / "munge.socket").exists(), 20, "munged socket")

    def _spawn(self, name: str, command: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 (owned by the child)
        self.processes[name] = subprocess.Popen(
            command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def _wait_for_idle_node(self, timeout: float) -> None:
        def node_idle() -> bool:
            result = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
            return result.returncode == 0 and result.stdout.split() == ["idle"] * len(self.nodes)

        self._wait(node_idle, timeout, "an idle node")

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [name for name, p in self.processes.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {name}:\n{(self.root / 'log' / f'{name}.out').read_text()[-2000:]}"
                    for name in self.processes
                )
                raise RuntimeError(
                    f"SLURM cluster: no {what} after {timeout:.0f} s (exited: {dead})\n{logs}\n"
                    f"{self.log('slurmctld')[-2000:]}\n{self.log('slurmd')[-2000:]}"
                )
            time.sleep(0.2)
