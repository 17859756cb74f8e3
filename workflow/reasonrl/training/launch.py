"""One node's share of a training job that spans nodes.

A rule whose resources ask for `nodes: N` runs `srun` with one task per node
(workflow/rules/common.smk, launcher()); each task runs this module, which reads the
rendezvous from SLURM's environment and replaces itself with `accelerate launch` for the
node's processes:

    python -m reasonrl.training.launch --processes-per-node 8 --config-file Z.yaml \
        -m reasonrl.cli sft ...

- machine rank: SLURM_NODEID (the node's index in the job);
- nodes: SLURM_JOB_NODELIST expanded (`scontrol show hostnames` where it holds a range);
  the first is the main node;
- main address and port: MASTER_ADDR and MASTER_PORT where set, else the first node and a
  port drawn from the job id (two jobs on one node do not meet on one port);
- world size: nodes x processes per node (accelerate starts as many on every machine).

The launched processes find the job's nodes in REASONRL_NODES (the manifest names them:
reasonrl.manifest.scheduler_provenance) and the standard launcher of DeepSpeed's multi-node
jobs is accelerate's own per node (no pdsh or ssh between nodes: srun already started us on
each).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from reasonrl.errors import ReasonRLError
from reasonrl.memory_plan import learner_gpus_per_node

# Ports drawn from the job id: above the ephemeral range's usual start is avoided (Linux
# hands out 32768 and up to clients), below it the registered services' are.
PORT_BASE, PORT_SPAN = 20000, 10000


@dataclass(frozen=True)
class Rendezvous:
    """Where one node's launcher meets the others."""

    nodes: tuple[str, ...]
    machine_rank: int
    main_address: str
    main_port: int


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compact node list ("gpu[01-02],login") as host names: `scontrol show hostnames`
    for ranges (SLURM's own parser), a plain comma split where there is none."""
    if "[" not in nodelist:
        return [host for host in nodelist.split(",") if host]
    done = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ReasonRLError(
            f"SLURM_JOB_NODELIST={nodelist}: scontrol show hostnames failed: "
            f"{done.stderr.strip().splitlines()[-1:]}"
        )
    return done.stdout.split()


def _integer(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    if value is None or not value.isdigit():
        raise ReasonRLError(
            f"{name}={value!r}: a multi-node launch runs as one srun task per node of a SLURM"
            " job (resource nodes), which sets it"
        )
    return int(value)


def rendezvous_from_slurm(env: Mapping[str, str]) -> Rendezvous:
    """The rendezvous of this srun task's node, from SLURM's environment `env`."""
    nodes = tuple(expand_nodelist(env.get("SLURM_JOB_NODELIST", "")))
    count, rank = _integer(env, "SLURM_NNODES"), _integer(env, "SLURM_NODEID")
    if len(nodes) != count:
        raise ReasonRLError(
            f"SLURM_JOB_NODELIST={env.get('SLURM_JOB_NODELIST')!r} names {len(nodes)} nodes,"
            f" SLURM_NNODES={count}"
        )
    port = env.get("MASTER_PORT") or PORT_BASE + _integer(env, "SLURM_JOB_ID") % PORT_SPAN
    return Rendezvous(nodes, rank, env.get("MASTER_ADDR") or nodes[0], int(port))


def accelerate_command(
    rendezvous: Rendezvous, processes_per_node: int, config_file: str, program: list[str]
) -> list[str]:
    """`accelerate launch` of this node's `processes_per_node` processes of `program`, by the
    interpreter running this module (the job's environment, whatever PATH says)."""
    return [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", config_file,
        "--num_machines", str(len(rendezvous.nodes)),
        "--machine_rank", str(rendezvous.machine_rank),
        "--main_process_ip", rendezvous.main_address,
        "--main_process_port", str(rendezvous.main_port),
        "--num_processes", str(processes_per_node * len(rendezvous.nodes)),
        "--deepspeed_multinode_launcher", "standard",
        *program,
    ]  # fmt: skip


def command_prefix(
    nodes: int, gpus: int, generator_gpus: int, deepspeed_config: Path, mpi: bool
) -> str:
    """What a training rule's command starts with (workflow/rules/common.smk launcher()), for
    a job of `gpus` GPUs over `nodes` nodes, `generator_gpus` of a node's its generator's:
    `reasonrl` (one process), accelerate launch over the learner's GPUs, or srun starting this
    module once per node. The SLURM executor leaves the command to start its own tasks only
    in an MPI job (resources mpi and tasks_per_node)."""
    per_node = learner_gpus_per_node(nodes, gpus, generator_gpus)
    config = shlex.quote(str(deepspeed_config))
    if nodes == 1:
        if per_node <= 1:
            return "reasonrl"
        return (
            f"accelerate launch --config_file {config} --num_processes {per_node} -m reasonrl.cli"
        )
    if not mpi:
        raise ReasonRLError(
            f"resources nodes={nodes}: also set mpi=srun and tasks_per_node={gpus // nodes}"
            " (the SLURM executor leaves an MPI job's command to start its tasks)"
        )
    return (
        f"srun --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1"
        f" python -m reasonrl.training.launch --processes-per-node {per_node}"
        f" --config-file {config} -m reasonrl.cli"
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    # The program is everything from its "-m": its own options are not this module's.
    split = argv.index("-m") if "-m" in argv else len(argv)
    parser = argparse.ArgumentParser(
        prog="python -m reasonrl.training.launch",
        usage="%(prog)s --processes-per-node N --config-file FILE -m MODULE [ARGS ...]",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--processes-per-node", type=int, required=True)
    parser.add_argument("--config-file", required=True, help="accelerate's config (DeepSpeed)")
    args = parser.parse_args(argv[:split])
    args.program = argv[split:]
    if not args.program:
        parser.error("no program: give -m MODULE [ARGS ...]")
    try:
        rendezvous = rendezvous_from_slurm(os.environ)
    except ReasonRLError as err:
        sys.exit(f"reasonrl: error: {err}")
    command = accelerate_command(
        rendezvous, args.processes_per_node, args.config_file, args.program
    )
    os.environ["REASONRL_NODES"] = ",".join(rendezvous.nodes)
    print(
        f"node {rendezvous.machine_rank} of {len(rendezvous.nodes)} ({rendezvous.nodes}),"
        f" main {rendezvous.main_address}:{rendezvous.main_port}",
        file=sys.stderr,
        flush=True,
    )
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
