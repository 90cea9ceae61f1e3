"""Local backend: real torchrun agents on 127.0.0.1, real signals."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from lightning_srifty.core.catalog import Offer
from lightning_srifty.core.cluster import Cluster, ClusterGroup, Plan
from lightning_srifty.core.errors import LaunchError
from lightning_srifty.launch.backend import JobState, LaunchSpec
from lightning_srifty.launch.local_backend import (
    LocalBackend,
    LocalJob,
    LocalTopology,
    cpu_share_now,
    map_topology,
)


def offer(gpus: int) -> Offer:
    return Offer(
        instance_type=f"test.{gpus}x",
        accelerator="T4",
        accelerator_count=gpus,
        gpu_memory_gib=16.0,
        vcpus=4.0 * gpus,
        memory_gib=16.0 * gpus,
        region="us-west-2",
        zone="usw2-az1",
        ondemand_price=1.0 * gpus,
        spot_price=0.3 * gpus,
        intra_node_link="PCIe" if gpus > 1 else "none",
        network_gbps=50.0,
    )


def plan(nodes: int, gpus: int) -> Plan:
    cluster = Cluster((ClusterGroup(offer(gpus), nodes, gpus),))
    return Plan(cluster, False, 1.0, 0.9, 1.1, 32, 10, 1.0, 1.0, 1.0)


def launch_script(
    tmp_path: Path,
    source: str,
    where: Plan,
    args: tuple[str, ...] = (),
    envs: dict[str, str] | None = None,
) -> tuple[LocalBackend, LocalJob]:
    """Writes ``source`` as the job's script and launches it on the local backend."""
    script = tmp_path / "job.py"
    script.write_text(source)
    backend = LocalBackend(tmp_path / "run")
    return backend, backend.launch(LaunchSpec(str(script), args, where, envs=envs or {}))


@pytest.mark.parametrize(
    ("nodes", "gpus", "expected"),
    [(1, 1, (1, 1)), (1, 4, (1, 4)), (4, 4, (2, 2)), (16, 1, (2, 1)), (2, 8, (2, 2))],
)
def test_topology_keeps_shape_within_local_caps(nodes, gpus, expected) -> None:
    topo = map_topology(plan(nodes, gpus).cluster, max_nodes=2, max_procs=4)
    assert (topo.nodes, topo.procs_per_node) == expected
    assert topo.world_size <= 4


ECHO_RANKS = textwrap.dedent(
    """
    import json, os, sys
    out = os.path.join(os.environ["SRIFTY_STATE_DIR"], f"rank-{os.environ['RANK']}.json")
    with open(out, "w") as fh:
        json.dump({"argv": sys.argv[1:], "world": os.environ["WORLD_SIZE"],
                   "node": os.environ["SRIFTY_NODE_RANK"],
                   "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}, fh)
    """
)


def test_two_nodes_rendezvous_and_args_pass_untouched(tmp_path: Path) -> None:
    hostile = ("--name", "a b", "'; rm -rf /'", "$(whoami)", '"q"')
    backend, job = launch_script(tmp_path, ECHO_RANKS, plan(2, 1), hostile)
    assert backend.wait(job, timeout_s=120) is JobState.SUCCEEDED, backend.log_tail(job)
    records = [json.loads(p.read_text()) for p in sorted(job.state_dir.glob("rank-*.json"))]
    assert len(records) == 2
    assert {r["node"] for r in records} == {"0", "1"}
    assert all(r["world"] == "2" for r in records)
    assert all(tuple(r["argv"]) == hostile for r in records)


def test_local_processes_never_see_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes on one node of a machine that shows one GPU: none may use it (on an
    H100 both went to GPU 0 and the second failed with "Invalid device id")."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    backend, job = launch_script(tmp_path, ECHO_RANKS, plan(1, 2))
    assert backend.wait(job, timeout_s=120) is JobState.SUCCEEDED, backend.log_tail(job)
    records = [json.loads(p.read_text()) for p in sorted(job.state_dir.glob("rank-*.json"))]
    assert [r["cuda"] for r in records] == ["", ""]


SLEEPER = textwrap.dedent(
    """
    import os, signal, sys, time
    marker = os.path.join(os.environ["SRIFTY_STATE_DIR"], "preempted")
    def on_term(signum, frame):
        if os.environ.get("IGNORE_TERM"):
            return
        open(marker, "w").close()
        sys.exit(75)
    signal.signal(signal.SIGTERM, on_term)
    with open(os.path.join(os.environ["SRIFTY_STATE_DIR"], f"up-{os.environ['RANK']}"), "w") as fh:
        fh.write(str(os.getpid()))
    while True:
        time.sleep(0.1)
    """
)


def _wait_up(job, count: int) -> None:
    deadline = time.monotonic() + 60
    while len(list(job.state_dir.glob("up-*"))) < count:
        assert time.monotonic() < deadline, "workers never started"
        time.sleep(0.2)


def test_preemption_sigterm_reaches_workers(tmp_path: Path) -> None:
    backend, job = launch_script(tmp_path, SLEEPER, plan(1, 2))
    _wait_up(job, 2)
    assert backend.status(job) is JobState.RUNNING
    backend.preempt(job, grace_s=10)
    assert backend.status(job) is JobState.PREEMPTED
    assert (job.state_dir / "preempted").exists()


def test_preemption_kills_workers_that_ignore_sigterm(tmp_path: Path) -> None:
    backend, job = launch_script(tmp_path, SLEEPER, plan(1, 1), envs={"IGNORE_TERM": "1"})
    _wait_up(job, 1)
    worker_pids = [int(p.read_text()) for p in job.state_dir.glob("up-*")]
    start = time.monotonic()
    backend.preempt(job, grace_s=1.0)
    assert time.monotonic() - start < 30
    assert all(p.poll() is not None for p in job.processes)
    assert worker_pids
    for pid in worker_pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert backend.status(job) is JobState.PREEMPTED


def test_missing_script_is_a_launch_error(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    with pytest.raises(LaunchError, match="script not found"):
        backend.launch(LaunchSpec(str(tmp_path / "nope.py"), (), plan(1, 1)))


def test_cpu_share_now_measures_one_share_per_process() -> None:
    # Real processes spinning on this machine's cores, in one session per node as the
    # run's: each gets some share of a core, never more than a whole one (slack for the
    # clocks' granularity).
    shares = cpu_share_now(2, 2, span_s=0.2)
    assert len(shares) == 4
    assert all(0.0 < s <= 1.05 for s in shares)
    assert len(cpu_share_now(1, own_session=False, span_s=0.1)) == 1
    assert cpu_share_now(1, span_s=0.1, python="/nonexistent/python") == []
    alone, each = LocalBackend("unused", python=sys.executable).core_shares(LocalTopology(1, 2))
    assert 0.0 < alone <= 1.05 and len(each) == 2


RAISES_ON_RANK_ONE = textwrap.dedent(
    """
    import os, time
    if os.environ["RANK"] == "1":
        raise ValueError("the data shard of rank 1 is empty")
    time.sleep(30)  # torchrun ends the survivors when one worker fails
    """
)

EXITS_WITHOUT_A_WORD = textwrap.dedent(
    """
    import os, sys
    print("loaded the dataset", flush=True)
    os._exit(3)
    """
)


def test_a_failed_job_names_the_exception_a_rank_raised(tmp_path: Path) -> None:
    backend, job = launch_script(tmp_path, RAISES_ON_RANK_ONE, plan(1, 2))
    assert backend.wait(job, timeout_s=120) is JobState.FAILED, backend.log_tail(job)
    assert backend.failure_detail(job) == "ValueError: the data shard of rank 1 is empty"


def test_a_failed_job_with_no_exception_says_how_each_worker_ended(tmp_path: Path) -> None:
    backend, job = launch_script(tmp_path, EXITS_WITHOUT_A_WORD, plan(2, 1))
    assert backend.wait(job, timeout_s=120) is JobState.FAILED, backend.log_tail(job)
    # each worker's own exit code, from torchrun's summary (its agents exit with 1)
    assert backend.failure_detail(job) == "rank 0 exited with code 3; rank 1 exited with code 3"


STUCK = textwrap.dedent(
    """
    import os, signal, time
    from lightning_srifty.capture.launch_mode import dump_stacks_on_request
    dump_stacks_on_request()  # what a launched job's callback does first
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stuck: the notice changes nothing
    with open(os.path.join(os.environ["SRIFTY_STATE_DIR"], f"up-{os.environ['RANK']}"), "w") as fh:
        fh.write(str(os.getpid()))
    def stuck_in_here():
        while True:
            time.sleep(0.1)
    stuck_in_here()
    """
)


def test_a_job_that_outlives_its_grace_leaves_its_stacks_in_the_node_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend, job = launch_script(tmp_path, STUCK, plan(1, 1))
    _wait_up(job, 1)
    backend.preempt(job, grace_s=1.0)
    assert all(p.poll() is not None for p in job.processes)
    said = capsys.readouterr().err
    assert "still running 1 s after SIGTERM" in said and "SIGKILL" in said
    log = backend.log_tail(job, 400)
    assert "most recent call first" in log, log[-2000:]
    assert "stuck_in_here" in log, log[-2000:]
