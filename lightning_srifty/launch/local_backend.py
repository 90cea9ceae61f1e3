"""Local backend: the plan's topology as real processes on this machine.

Each planned "node" becomes one ``torchrun`` agent (``--nnodes N --node-rank i``)
rendezvousing on 127.0.0.1 with gloo, so the job runs the same multi-node code path
it would on the cloud. Plans are drawn against the cloud catalog (64 GPUs, say); this
machine has a couple of cores, so the shape is scaled down: node count and processes
per node are capped (see :func:`map_topology`), keeping "several nodes of several
processes" when the plan has them.

Preemption injection mirrors a cloud revocation: SIGTERM to every process of a node
(the notice), then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.cluster import Cluster
from lightning_srifty.core.errors import LaunchError
from lightning_srifty.core.planner import WHOLE_CORE_SHARE
from lightning_srifty.launch.backend import PREEMPTED_EXIT_CODE, JobState, LaunchSpec

STACK_DUMP_WAIT_S = 1.0
"""How long the stack dump of a process that outlived its grace may take to be written."""


@dataclass(frozen=True)
class LocalTopology:
    """How many local "nodes" (torchrun agents) and processes per node to start."""

    nodes: int
    procs_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def map_topology(
    cluster: Cluster,
    *,
    max_nodes: int = 2,
    max_procs: int = 4,
    per_node: int | None = None,
    nodes: int | None = None,
) -> LocalTopology:
    """Scales a cloud cluster down to this machine, keeping its shape where possible.

    Node count is capped at ``max_nodes`` and the total process count at ``max_procs``;
    a plan with several GPUs per node keeps several processes per node. What the script
    fixes itself (``Trainer(devices=per_node, num_nodes=nodes)``) is kept exactly, caps or
    not: Lightning refuses to run any other shape.
    """
    if max_nodes < 1 or max_procs < 1:
        raise LaunchError("local topology needs at least one node and one process")
    if per_node is not None:
        count = nodes or max(1, min(cluster.nodes, max_nodes, max_procs // per_node))
        return LocalTopology(nodes=count, procs_per_node=per_node)
    count = nodes or max(1, min(cluster.nodes, max_nodes, max_procs))
    widest = max((g.gpus_per_node for g in cluster.groups), default=1)
    width = max(1, min(widest, max_procs // count))
    return LocalTopology(nodes=count, procs_per_node=width)


_SHARE_PROBE = r"""
import os, sys, time
start, span, count = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
children = []
for _ in range(count - 1):
    pid = os.fork()
    if pid == 0:  # a forked child: spin, report, leave
        children = []
        break
    children.append(pid)
while time.time() < start:
    time.sleep(0.001)
wall, cpu = time.perf_counter(), time.process_time()
while time.perf_counter() - wall < span:
    pass
os.write(1, f"{(time.process_time() - cpu) / (time.perf_counter() - wall)}\n".encode())
for pid in children:
    os.waitpid(pid, 0)
"""
"""``count`` busy processes (this one and ``count - 1`` forks, in its session): after
a common start each spins for ``span`` seconds of wall time and prints the share of a
core it got (CPU seconds per wall second)."""


def cpu_share_now(
    procs_per_node: int,
    nodes: int = 1,
    *,
    own_session: bool = True,
    span_s: float = 0.3,
    python: str = sys.executable,
) -> list[float]:
    """The share of a core each process of a local run would get on this machine now.

    Srifty's rule, measure where you will run, applied to the local backend: the local
    "GPUs" share this machine's cores with each other and with other work, and how much
    each gets is the scheduler's choice (fair shares among threads; among sessions,
    with Linux's autogroups, so that a session's processes split one share; a VM's
    quota), which no model of the machine knows. Stand-ins are started as the run's
    processes are: one session per node (``own_session``, as :meth:`LocalBackend.
    launch` starts each node's ``torchrun``) with ``procs_per_node`` one-thread
    processes in it; with ``own_session=False`` they stay in this process's session, as
    the profiling run does. They spin together for ``span_s`` and report their CPU time
    over wall time. Returns one share per process; empty when the measurement could
    not run (the caller then keeps the model's prediction).
    """
    start = time.time() + 0.2 + 0.03 * procs_per_node * nodes  # all up before any spins
    argv = [python, "-S", "-c", _SHARE_PROBE, f"{start:.6f}", f"{span_s:.3f}", str(procs_per_node)]
    try:
        running = [
            subprocess.Popen(  # noqa: S603 - argv list, no shell
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                start_new_session=own_session,
            )
            for _ in range(nodes)
        ]
    except OSError:
        return []
    shares: list[float] = []
    for proc in running:
        try:
            out, _ = proc.communicate(timeout=span_s + 10.0)
            shares.extend(float(line) for line in out.split())
        except (subprocess.TimeoutExpired, ValueError):
            proc.kill()
            proc.wait()
    return shares if len(shares) == procs_per_node * nodes else []


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 for the rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LocalJob:
    """Handle of a running local job: one torchrun agent per node."""

    topology: LocalTopology
    processes: list[subprocess.Popen[bytes]]
    logs: list[Path]
    state_dir: Path
    started_at: float
    preempt_injected: bool = False
    exit_codes: list[int | None] = field(default_factory=list)


class LocalBackend:
    """Runs jobs as torchrun process groups on this machine (the embedded default)."""

    name = "local"

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        max_nodes: int = 2,
        max_procs: int = 4,
        python: str = sys.executable,
    ):
        self.run_dir = Path(run_dir)
        self.max_nodes = max_nodes
        self.max_procs = max_procs
        self.python = python
        self._launches = 0
        self._fixed_per_node: int | None = None
        self._fixed_nodes: int | None = None
        self.measured: dict[LocalTopology, tuple[float, float, float]] = {}
        """Steady step (median, 10th, 90th percentile) a probe measured per topology."""

    @staticmethod
    def process_env() -> dict[str, str]:
        """What every local process runs with, the profiling run's included.

        One intra-op thread per process (unless the user chose): several local "GPUs"
        share this machine's cores, and more threads than cores per process make tiny
        ops wait on each other and step times meaningless.

        No GPU: the backend stands a plan's processes up on this machine, and a node of
        N processes needs N devices where a workstation has one or none. On a GPU
        machine Lightning's ``auto`` put every process on GPU 0 and a 4-process node
        failed with "Invalid device id" (seen on an H100). Every process, the profile's
        too, trains on the CPU, so the steps measured match the predictions made from
        that profile.
        """
        return {
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "CUDA_VISIBLE_DEVICES": "",
        }

    def core_shares(
        self, topology: LocalTopology, *, profile_share: float = 0.0
    ) -> tuple[float, list[float]]:
        """The share of a core the profiling process, then each process of a run of
        ``topology``, would get on this machine now (:func:`cpu_share_now`). The first
        is measured only for a profile that had less than a whole core (it is what
        tells how the machine splits the load the profile saw); else it is 1."""
        alone = [1.0]
        if profile_share < WHOLE_CORE_SHARE:
            alone = cpu_share_now(1, own_session=False, python=self.python)
        run = cpu_share_now(topology.procs_per_node, topology.nodes, python=self.python)
        return (alone[0] if alone else 0.0), run

    def fix_shape(self, *, per_node: int | None, nodes: int | None) -> None:
        """Keeps what the script's own ``Trainer(devices=, num_nodes=)`` fixes."""
        self._fixed_per_node, self._fixed_nodes = per_node, nodes

    def topology_for(self, cluster: Cluster) -> LocalTopology:
        return map_topology(
            cluster,
            max_nodes=self.max_nodes,
            max_procs=self.max_procs,
            per_node=self._fixed_per_node,
            nodes=self._fixed_nodes,
        )

    def command(
        self, topology: LocalTopology, node_rank: int, port: int, script: str, args: Sequence[str]
    ) -> list[str]:
        """The argv of one node's agent; script arguments pass through untouched."""
        return [
            self.python,
            "-m",
            "torch.distributed.run",
            f"--nnodes={topology.nodes}",
            f"--node-rank={node_rank}",
            f"--nproc-per-node={topology.procs_per_node}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            script,
            *args,
        ]

    def launch(self, spec: LaunchSpec) -> LocalJob:
        if not Path(spec.script).is_file():
            raise LaunchError(f"script not found: {spec.script}")
        topology = self.topology_for(spec.plan.cluster)
        label = spec.name.removeprefix("srifty-")
        if label.startswith("probe-"):
            attempt_dir = self.run_dir / label  # probes do not count as attempts
        else:
            self._launches += 1
            while (self.run_dir / f"attempt-{self._launches}").exists():
                self._launches += 1  # a resumed run: never write into an earlier one's folder
            attempt_dir = self.run_dir / f"attempt-{self._launches}"
        attempt_dir.mkdir(parents=True, exist_ok=True)
        state_dir = attempt_dir / "state"
        state_dir.mkdir(exist_ok=True)
        port = free_port()
        processes: list[subprocess.Popen[bytes]] = []
        logs: list[Path] = []
        for node_rank in range(topology.nodes):
            env = _job_env(spec.envs, state_dir, topology, node_rank)
            log = attempt_dir / f"node-{node_rank}.log"
            with open(log, "wb") as sink:
                processes.append(
                    subprocess.Popen(  # noqa: S603 - argv list, no shell
                        self.command(topology, node_rank, port, spec.script, spec.script_args),
                        env=env,
                        stdout=sink,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
            logs.append(log)
        return LocalJob(topology, processes, logs, state_dir, time.monotonic())

    def output_bytes(self, handle: object) -> int:
        """Bytes the job's processes have written to their node logs so far."""
        total = 0
        for log in _as_job(handle).logs:
            try:
                total += log.stat().st_size
            except OSError:
                continue
        return total

    def status(self, handle: object) -> JobState:
        job = _as_job(handle)
        codes = [p.poll() for p in job.processes]
        job.exit_codes = codes
        if any(code is None for code in codes):
            return JobState.RUNNING
        if job.preempt_injected or (job.state_dir / proto.PREEMPTED_MARKER).exists():
            return JobState.PREEMPTED
        if any(code == PREEMPTED_EXIT_CODE for code in codes):
            return JobState.PREEMPTED
        if all(code == 0 for code in codes):
            return JobState.SUCCEEDED
        return JobState.FAILED

    def preempt(self, handle: object, *, grace_s: float = 10.0) -> None:
        """Revokes every node like a spot reclaim: SIGTERM, then SIGKILL after grace."""
        job = _as_job(handle)
        job.preempt_injected = True
        _signal_trees(job.processes, signal.SIGTERM, grace_s)

    def kill(self, handle: object) -> None:
        """SIGKILL to every process of the job at once: a crash with no notice, no cleanup."""
        _signal_trees(_as_job(handle).processes, signal.SIGKILL, 0.0)

    def stop(self, handle: object) -> None:
        job = _as_job(handle)
        _signal_trees(job.processes, signal.SIGTERM, 5.0)

    def wait(self, handle: object, timeout_s: float | None = None) -> JobState:
        """Blocks until the job ends (or ``timeout_s`` passes) and returns its state."""
        job = _as_job(handle)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for proc in job.processes:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                break
        return self.status(job)

    @staticmethod
    def failure_detail(handle: object) -> str:
        """Why the job failed, in one line: the reason the callback left before stopping
        a misconfigured job, else the last exception line of the script's own output
        (a rank's, which torchrun prefixes with ``[rankN]:``), else how each worker ended
        (exit code or signal) as torchrun summarised it, else each node's exit code."""
        job = _as_job(handle)
        try:
            return (job.state_dir / proto.FAILURE_MARKER).read_text("utf-8").splitlines()[0]
        except (OSError, IndexError):
            pass
        found = ""
        workers: list[str] = []
        for log in job.logs:
            if not log.exists():
                continue
            rank = ""
            for line in log.read_text(errors="replace").splitlines():
                text = _RANK_PREFIX.sub("", line).strip()
                match = _EXCEPTION_LINE.match(text)
                if match and "ChildFailedError" not in match.group(1):
                    found = text
                if summary := _SUMMARY_RANK.match(text):
                    rank = summary.group(1)
                elif (summary := _SUMMARY_EXIT.match(text)) and rank:
                    workers.append(_how_it_ended(f"rank {rank}", int(summary.group(1))))
                    rank = ""
        if found:
            return found
        if workers:
            return "; ".join(workers)
        return "; ".join(
            _how_it_ended(f"node {node}", code)
            for node, code in enumerate(job.exit_codes or [])
            if code not in (0, None)
        )

    @staticmethod
    def log_tail(handle: object, lines: int = 30) -> str:
        """The last lines of every node's log, for error messages."""
        job = _as_job(handle)
        out = []
        for log in job.logs:
            text = log.read_text(errors="replace").splitlines() if log.exists() else []
            out.append(f"--- {log.name} ---")
            out.extend(text[-lines:])
        return "\n".join(out)


_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): \S")
"""A traceback's last line (``ValueError: ...``); torchrun's own summary is skipped."""
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:")
"""What torchrun puts before each line a worker writes to stderr."""
_SUMMARY_RANK = re.compile(r"^rank\s*:\s*(\d+)")
_SUMMARY_EXIT = re.compile(r"^exitcode\s*:\s*(-?\d+)")
"""torchrun's summary of a failed worker (``rank : 1 (local_rank: 0)``, ``exitcode : 3``)."""


def _how_it_ended(who: str, code: int) -> str:
    """``rank 1 exited with code 3`` or ``node 0 was killed by SIGKILL``."""
    if code >= 0:
        return f"{who} exited with code {code}"
    try:
        return f"{who} was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"{who} was killed by signal {-code}"


def _as_job(handle: object) -> LocalJob:
    if not isinstance(handle, LocalJob):
        raise LaunchError(f"not a local job handle: {handle!r}")
    return handle


def _job_env(
    extra: Mapping[str, str], state_dir: Path, topology: LocalTopology, node_rank: int
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env[proto.ENV_STATE_DIR] = str(state_dir)
    env["SRIFTY_NUM_NODES"] = str(topology.nodes)
    env["SRIFTY_NODE_RANK"] = str(node_rank)
    env["SRIFTY_PROCS_PER_NODE"] = str(topology.procs_per_node)
    env.update(LocalBackend.process_env())
    return env


def _signal_trees(
    processes: Sequence[subprocess.Popen[bytes]], first: signal.Signals, grace_s: float
) -> None:
    """Sends ``first`` to each agent and all its workers, SIGKILLs survivors after grace.

    torchrun starts workers in their own sessions, so signalling the agent's process
    group alone would orphan them; the tree is collected before any signal is sent.
    """
    tree: list[psutil.Process] = []
    for proc in processes:
        try:
            root = psutil.Process(proc.pid)
            tree.extend([root, *root.children(recursive=True)])
        except psutil.NoSuchProcess:
            continue
    _send(tree, first)
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    if alive and first != signal.SIGKILL:
        alive = _dump_stacks(alive, first, grace_s)
    _send(alive, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5.0)
    for proc in processes:
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            proc.kill()


def _dump_stacks(
    alive: list[psutil.Process], first: signal.Signals, grace_s: float
) -> list[psutil.Process]:
    """Asks processes that outlived the grace for their threads' stacks before SIGKILL.

    A launched job writes them to its node log on :data:`proto.STACK_DUMP_SIGNAL`; a
    process that did not register it (the torchrun agent) ends on it, which SIGKILL was
    about to do anyway. Returns the processes still alive afterwards.
    """
    dump = getattr(signal, proto.STACK_DUMP_SIGNAL, None)
    if dump is None:
        return alive
    pids = ", ".join(str(p.pid) for p in alive)
    print(
        f"srifty: {len(alive)} process(es) ({pids}) still running {grace_s:.0f} s after "
        f"{first.name}; their threads' stacks go to the node logs, then SIGKILL",
        file=sys.stderr,
    )
    _send(alive, dump)
    _, still = psutil.wait_procs(alive, timeout=STACK_DUMP_WAIT_S)
    return list(still)


def _send(members: Sequence[psutil.Process], signum: int) -> None:
    """``signum`` to each process; one that already ended is skipped."""
    for member in members:
        try:
            member.send_signal(signum)
        except psutil.NoSuchProcess:
            pass
