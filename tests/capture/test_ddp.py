"""Two real gloo processes under torchrun: buckets, communication, every rank's data."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_srifty.core.profile import Profile
from lightning_srifty.io.profile_io import load_profile

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
HIDDEN = 1024  # ~4.4 MB of gradients: more than DDP's 1 MiB first bucket, so >= 2 buckets
MIN_MEASURE_S = 5.0  # longer than 8 steps of this model take here: the window grows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ddp_profile(tmp_path_factory: pytest.TempPathFactory) -> Profile:
    root = tmp_path_factory.mktemp("ddp")
    port = _free_port()
    # The example's Trainer names no devices or strategy: Lightning's PL_TRAINER_* defaults
    # (what srifty-launch sets) make it one DDP job of two processes.
    env = dict(os.environ, SRIFTY_IMDS="off", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OMP_NUM_THREADS="1", PL_TRAINER_DEVICES="2", PL_TRAINER_STRATEGY="ddp",
               PL_TRAINER_DEFAULT_ROOT_DIR=str(root))  # fmt: skip
    env.pop("SRIFTY_PROFILE_PATH", None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(port),
        str(REPO / "examples" / "train_digits.py"), "--max-steps", "60",
        "--hidden", str(HIDDEN), "--batch-size", "32", "--warmup-steps", "3",
        "--profile-steps", "8", "--min-measure-s", str(MIN_MEASURE_S),
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("srifty: profile written to") == 1  # rank zero only
    return load_profile(root / "srifty" / "profile.json")


def _grad_bytes(hidden: int) -> int:
    return 4 * ((64 + 1) * hidden + (hidden + 1) * hidden + (hidden + 1) * 10)


def test_every_rank_reaches_the_profile(ddp_profile: Profile) -> None:
    assert sorted(r.rank for r in ddp_profile.ranks) == [0, 1]
    assert all(r.step_mean_s > 0 and r.allreduce_s > 0 for r in ddp_profile.ranks)
    env = ddp_profile.environment
    assert (env.world_size, env.devices_per_node, env.num_nodes) == (2, 2, 1)
    assert ddp_profile.steps.step.count == 2 * ddp_profile.steps.measured_steps


def test_both_ranks_grow_the_phases_of_short_steps_alike(ddp_profile: Profile) -> None:
    """Rank zero decides how far warm-up and window grow; a rank that went its own way
    would hang in the window's gather or profile different steps."""
    steps = ddp_profile.steps
    assert steps.measured_steps * steps.step.p50_s < MIN_MEASURE_S
    # 60 steps leave 30 for the profile: the hook-free step grows to 10 (10x), the
    # FLOP step follows, and the window takes the rest (8 + 10).
    assert (steps.warmup_steps, steps.measured_steps) == (1 + 10 + 1, 18)
    hooks = ddp_profile.extra["hooks"]
    assert hooks["clean_steps"] == 10


def test_buckets_cover_every_gradient_in_ready_order(ddp_profile: Profile) -> None:
    buckets = ddp_profile.buckets
    assert len(buckets) >= 2
    assert sum(b.bytes for b in buckets) == _grad_bytes(HIDDEN) == ddp_profile.grad_bytes
    assert sum(b.num_params for b in buckets) == 6
    assert sorted(b.ready_order for b in buckets) == list(range(len(buckets)))
    by_order = sorted(buckets, key=lambda b: b.ready_order)
    offsets = [b.ready_offset_s for b in by_order]
    assert offsets == sorted(offsets)
    assert all(b.allreduce_s > 0 for b in buckets)


def test_communication_is_recorded(ddp_profile: Profile) -> None:
    comm = ddp_profile.communication
    assert comm is not None and comm.backend == "gloo"
    assert comm.allreduce_s > 0
    assert 0 <= comm.exposed_s <= ddp_profile.steps.backward_s


_EXIT_PROBE = """
import atexit, sys
import torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import train_digits
atexit.register(lambda: print("group alive at exit:", dist.is_initialized(), flush=True))
train_digits.main(["--max-steps", "12", "--warmup-steps", "2", "--profile-steps", "4"])
if sys.argv[2] == "script-destroys":
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("script", ["leaves-the-group", "script-destroys"])
def test_a_finished_fit_lets_the_gloo_group_go_before_the_interpreter(
    tmp_path: Path, script: str
) -> None:
    # Lightning never destroys its group; gloo threads torn down with the interpreter can
    # abort a finished run ("terminate called without an active exception"). The probe's
    # handler runs after the callback's (atexit is last-in, first-out).
    port = str(_free_port())
    env = dict(os.environ, SRIFTY_IMDS="off", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
               OMP_NUM_THREADS="1", PL_TRAINER_DEVICES="1", PL_TRAINER_STRATEGY="ddp",
               PL_TRAINER_ACCELERATOR="cpu", PL_TRAINER_DEFAULT_ROOT_DIR=str(tmp_path))  # fmt: skip
    env.pop("SRIFTY_PROFILE_PATH", None)
    cmd = [sys.executable, "-c", _EXIT_PROBE, str(REPO / "examples"), script]
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "group alive at exit: False" in done.stdout
    assert "could not destroy" not in done.stderr


def test_the_values_a_profile_counts_as_synced_each_step_are_all_reduces_under_ddp(
    tmp_path: Path,
) -> None:
    """``self.log(..., sync_dist=True)`` costs a collective on every step of a DDP run,
    which the one-process profile never pays: the profile counts them, and two real
    processes make exactly that many ``all_reduce`` calls a step (none for a value
    logged per epoch, unsynced or on rank zero only)."""
    script = REPO / "tests" / "capture" / "scripts" / "synced_logs.py"
    env = dict(os.environ, SRIFTY_IMDS="off", OMP_NUM_THREADS="1")
    env.pop("SRIFTY_PROFILE_PATH", None)
    path = tmp_path / "profile.json"
    one = subprocess.run([sys.executable, str(script), str(path)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    profile = load_profile(path)
    assert profile.extra["synced_logs"]["names"] == ["training_step.loss", "training_step.both"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
                str(script), "-"]  # fmt: skip
    two = subprocess.run(torchrun, env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=180)  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    assert f"all_reduce calls in a step: {profile.synced_logs_per_step}\n" in two.stdout
