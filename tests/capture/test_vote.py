"""Rank-agreed decisions in a real 2-process gloo job: periodic checkpoints and notices."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lightning_srifty.capture.preemption import StepVote, VoteResult
from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.launch_protocol import ProgressEvent
from lightning_srifty.io.checkpoint_store import open_store

REPO = Path(__file__).resolve().parents[2]

# Rank 1's clock is frozen: judged on its own, a time-based checkpoint would never be due
# there while rank 0 saves every 0.2 s, and the collective save would hang (torchrun's
# timeout below fails the test). Rank 1 also records its pid for the notice test.
JOB = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {examples!r})
    import lightning.pytorch as pl
    import lightning_srifty.capture.launch_mode as launch_mode
    from digits import DigitsDataModule, DigitsModule
    from lightning_srifty import SriftyCallback

    rank = int(os.environ["RANK"])
    with open(os.path.join({root!r}, f"pid-{{rank}}"), "w") as fh:
        fh.write(str(os.getpid()))
    if rank == 1:
        class FrozenClock:
            def __getattr__(self, name):
                return getattr(time, name)
            @staticmethod
            def monotonic():
                return 1000.0
        launch_mode.time = FrozenClock()

    pl.seed_everything(0)
    trainer = pl.Trainer(
        max_steps=100_000, accelerator="cpu", devices=2, strategy="ddp", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir={root!r},
        callbacks=[SriftyCallback(warmup_steps=1, profile_steps=2, verbose=False)],
    )
    trainer.fit(DigitsModule(hidden=32), DigitsDataModule(batch_size=16))
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(tmp_path: Path, extra_env: dict[str, str]) -> subprocess.Popen[str]:
    script = tmp_path / "job.py"
    script.write_text(JOB.format(examples=str(REPO / "examples"), root=str(tmp_path)))
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", SRIFTY_IMDS="off", **extra_env)
    env.update(
        {
            proto.ENV_MODE: proto.MODE_TRAIN,
            proto.ENV_CHECKPOINT_URI: str(tmp_path / "store"),
            proto.ENV_PROGRESS_PATH: str(tmp_path / "progress.jsonl"),
            proto.ENV_STATE_DIR: str(tmp_path / "state"),
            proto.ENV_KEEP_CHECKPOINTS: "100",
        }
    )
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(port), str(script),
    ]  # fmt: skip
    return subprocess.Popen(  # noqa: S603 - fixed argv
        cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _events(tmp_path: Path) -> list[ProgressEvent]:
    path = tmp_path / "progress.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [ProgressEvent.from_line(line) for line in lines if line.strip()]


@pytest.mark.slow
def test_time_based_checkpoints_are_decided_once_for_every_rank(tmp_path: Path) -> None:
    proc = _start(
        tmp_path, {proto.ENV_CHECKPOINT_INTERVAL_S: "0.2", proto.ENV_TARGET_STEPS: "1500"}
    )
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-4000:]
    refs = open_store(str(tmp_path / "store"), keep=100).refs()
    periodic = [r for r in refs if r.reason == "periodic"]
    assert len(periodic) >= 2, [r.reason for r in refs]
    assert refs[0].step == 1500 and refs[0].reason == "final"


@pytest.mark.slow
def test_a_notice_on_one_rank_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    proc = _start(tmp_path, {proto.ENV_TARGET_STEPS: "1000000"})
    try:
        deadline = time.monotonic() + 180
        while not any(e.event == "step" and e.step > 50 for e in _events(tmp_path)):
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "no training progress"
            time.sleep(0.2)
        os.kill(int((tmp_path / "pid-1").read_text()), signal.SIGTERM)  # rank 1 only
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    events = _events(tmp_path)
    preempted = [e for e in events if e.event == "preempted"]
    assert len(preempted) == 1, out[-4000:]
    newest = open_store(str(tmp_path / "store")).refs()[0]
    assert newest.reason == "emergency" and newest.step == preempted[0].step
    assert (tmp_path / "state" / proto.PREEMPTED_MARKER).exists()
    # Both ranks saved and exited with the preempted code; none hung or was killed.
    assert "exitcode: 75" in out and "exitcode: -" not in out, out[-4000:]
    assert "exitcode: 1 " not in out, out[-4000:]


def test_one_process_decides_on_its_own_flags() -> None:
    vote = StepVote()
    vote.start()  # no torch.distributed: nothing to agree with
    assert not vote.distributed
    assert vote.collect() == VoteResult()
    assert vote.launch(notice=True, checkpoint_due=False) == VoteResult(preempt=True)
    assert vote.launch(notice=False, checkpoint_due=True) == VoteResult(checkpoint=True)


# The vote's private gloo group is released once training ends normally (torch keeps a
# live group in ``distributed_c10d._world.pg_map``; ``destroy_process_group`` removes it).
RELEASE = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from lightning_srifty.capture.preemption import StepVote

    dist.init_process_group("gloo")
    vote = StepVote()
    vote.start()
    group = vote._group
    assert vote.distributed and group in c10d._world.pg_map
    vote.launch(notice=dist.get_rank() == 1, checkpoint_due=False)  # a round in flight
    vote.finish()
    released = not vote.distributed and group not in c10d._world.pg_map
    with open(os.path.join(os.path.dirname(__file__), f"released-{dist.get_rank()}"), "w") as fh:
        fh.write(str(released))  # a file per rank: two ranks' prints interleave
    dist.all_reduce(torch.ones(1))  # the default group is untouched
    dist.destroy_process_group()
    """
)


def test_a_finished_vote_releases_its_gloo_group(tmp_path: Path) -> None:
    script = tmp_path / "release.py"
    script.write_text(RELEASE)
    port = _free_port()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(port), str(script),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [(tmp_path / f"released-{rank}").read_text() for rank in (0, 1)]
    assert said == ["True", "True"], done.stdout[-2000:]
