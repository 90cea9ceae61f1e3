"""Steps are batches of the user's loop, and a preemption never loses one.

Real command line, real profiling run, real ``torchrun`` workers on 127.0.0.1, real
SIGTERM to every process of the job (``--preempt-every``: the local backend's stand-in
for a spot reclaim, signalled like SkyPilot and EC2 signal a VM's processes). What ran
is read from the job's own records: its progress lines, its log, and for the tests only
a line per training batch from every rank (``TRACE_BATCHES``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lightning_srifty.cli import launch_cmd
from tests.launch.e2e import attempt_accounts, attempt_logs, events, handover_step, only_run

pytestmark = pytest.mark.slow

GAN = str(Path(__file__).resolve().parent / "scripts" / "gan.py")
BASE = ["--yes", "--catalog", "bundled"]


@pytest.fixture
def trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path.parent / f"{tmp_path.name}-batches.txt"
    monkeypatch.setenv("TRACE_BATCHES", str(path))
    return path


def _batches(trace: Path) -> list[tuple[int, int]]:
    """(rank, world size) of every batch any process ran."""
    return [
        (int(rank), int(world))
        for rank, world, _ in (line.split() for line in trace.read_text().splitlines())
    ]


def test_a_gan_stepping_two_optimizers_runs_exactly_the_batches_asked(
    in_tmp: Path, trace: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code = launch_cmd.main([GAN, "--target-steps", "120", "--cluster", "g4dn.xlarge:1", *BASE])
    out, err = capfd.readouterr()
    assert code == 0, err[-3000:]
    run = only_run(in_tmp)
    assert len(_batches(trace)) == 120  # profiling, then training: not 60, not 240
    done = events(run, "progress-1.jsonl")[-1]
    assert (done.event, done.step) == ("done", 120)
    assert "steps done: 120 / 120" in out
    limits = json.loads((run / "profile.json").read_text())["extra"]["trainer"]
    assert limits["optimizer_steps_per_batch"] == pytest.approx(2.0)  # Lightning's global_step
    code = launch_cmd.main(["--resume", str(run)])
    _, err = capfd.readouterr()
    assert code != 0 and "already finished (final checkpoint at step 120)" in err


@pytest.mark.parametrize("workers", [0, 2])
def test_every_preemption_resumes_at_the_step_the_job_reached(
    workers: int,
    in_tmp: Path,
    trace: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two processes of a GAN, DataLoader workers or not, revoked after every 1.5 s of
    training: each time the job saves the step it reached, the next attempt resumes
    there, the migration record says so, and no batch is ever run twice."""
    # The plan's 4 GPUs run here as 2 processes on twice the batch: after the profile's
    # ~230 steps the job trains ~1,380, >= 8 s at 6 ms each on any machine, room for two
    # revocations after 1.5 s of training and the first report (~1 s) each; at 2 ms a
    # fast machine could train ~2.8 s in all
    monkeypatch.setenv("STEP_SLEEP_S", "0.006")
    code = launch_cmd.main(
        [GAN, "--num-workers", str(workers), "--target-steps", "3000", "--cluster",
         "g4dn.12xlarge:1", "--preempt-every", "1.5s", *BASE]
    )  # fmt: skip
    out, err = capfd.readouterr()
    assert code == 0, err[-2000:] + "\n" + attempt_logs(in_tmp)
    run = only_run(in_tmp)
    moves = [json.loads(line) for line in (run / "migrations.jsonl").read_text().splitlines()]
    assert len(moves) >= 2
    logs = "\n".join(p.read_text(errors="replace") for p in run.glob("attempt-*/node-*.log"))
    # (torchrun's own agent prints a traceback when it gets SIGTERM; the ranks none)
    assert "DataLoader worker" not in logs
    assert not re.search(r"\[rank\d+\]:(?!\[W)", logs)  # a rank's error, not its warning
    account = "\n".join(map(json.dumps, moves)) + "\n" + attempt_accounts(run)
    # (a notice at a batch that cannot resume exactly also says the save waits)
    saved = [int(step) for step in re.findall(r"emergency checkpoint \S+ at step (\d+)", logs)]
    for move in moves:
        assert move["saved_at_preemption"] is True, account
        assert move["resumed_step"] == move["step_at_preemption"], account
        # the job's own log names the step it saved at
        assert move["step_at_preemption"] in saved, account
    assert len(saved) == len(moves), account
    assert "the job saved step" in out
    attempts = sorted(run.glob("progress-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))
    final = events(run, attempts[-1].name)[-1]
    assert final.event == "done"
    ran = _batches(trace)
    profiled = sum(1 for _, world in ran if world == 1)
    trained = sum(1 for _, world in ran if world == 2)
    # every batch exactly once: the profile's, then two ranks per step to the end
    assert profiled == handover_step(run) and trained == 2 * (final.step - profiled)
