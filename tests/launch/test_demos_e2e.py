"""``srifty-launch`` end to end on code we did not write: Lightning's demo models.

The script (``scripts/train_demo.py``) is what a new user writes: a plain
``L.Trainer(callbacks=[SriftyCallback()])`` with Lightning's defaults (logger, progress
bar, checkpointing) around the demo Transformer, the ``boring_classes`` CNN ``Net``, and
``BoringModel`` with ``BoringDataModule``. Each test runs the real command line, a real
profiling run and real torchrun workers on 127.0.0.1.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lightning_srifty.cli import launch_cmd
from lightning_srifty.io.checkpoint_store import open_store
from lightning_srifty.io.profile_io import load_profile
from lightning_srifty.launch.launcher import PROFILE_STARTUP
from lightning_srifty.launch.runs import read_startups, record_startup
from tests.launch.e2e import events, only_run

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "scripts" / "train_demo.py"
BASE = ["--yes", "--catalog", "bundled"]
FOUR_GPUS = ["--cluster", "g4dn.12xlarge:1"]  # one node of 4 GPUs: 2 processes here
ONE_GPU = ["--cluster", "g4dn.xlarge:1"]


def launch(argv: list[str], capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``srifty-launch`` with ``argv`` (the demo script first unless it is a --resume)."""
    code = launch_cmd.main(argv if argv[0] == "--resume" else [str(SCRIPT), *argv])
    out, err = capfd.readouterr()
    return code, out, err


def test_transformer_pinned_to_four_gpus_runs_as_one_ddp_job(
    in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", "transformer", "--target-steps", "40", "--run-dir", "exp", *FOUR_GPUS]
    code, out, err = launch([*argv, *BASE], capfd)
    assert code == 0, err[-3000:]
    run = in_tmp / "exp"
    trained = events(run, "progress-1.jsonl")
    # The unchanged Trainer became one job of world size 2 (not two copies of size 1).
    assert {e.world_size for e in trained} == {2}
    # 40 steps of one process's batch: 25 ran while profiling, the other 15 take 8 steps
    # of two processes (the same samples).
    assert trained[-1].event == "done" and trained[-1].step == 25 + 8
    assert "1 node(s) x 2 process(es)" in out and "1x g4dn.12xlarge" in out
    assert "mean over the run" in out and "last window" in out
    # Lightning's logs live in the run folder; the working directory gets none.
    assert sorted(p.name for p in in_tmp.iterdir()) == ["exp"]
    assert len(list((run / "lightning" / "lightning_logs").iterdir())) == 2  # profile, train
    # Lightning's own progress bar counts the script's epochs (no "Epoch 0/-2").
    bar = (run / "attempt-1" / "node-0.log").read_text(errors="replace")
    assert "Epoch 0/" in bar and "/-2" not in bar
    profile = load_profile(run / "profile.json")
    attention = [x for x in profile.layers if x.module_type == "MultiheadAttention"]
    assert len(attention) == 6 and all(x.flops > 0 for x in attention)
    saved = (run / "profile.json").read_bytes()

    # The identical command again: refused at once, naming --resume; nothing touched.
    started = time.monotonic()
    code, out, err = launch([*argv, *BASE], capfd)
    took = time.monotonic() - started
    assert code != 0
    ours = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and "--resume exp" in ours[0] and "already holds a run" in ours[0]
    assert took < 30.0  # it refused; it did not profile or train (each takes longer)
    assert (run / "profile.json").read_bytes() == saved
    assert not (run / "progress-2.jsonl").exists()

    # Resuming a finished run says so instead of training again from its last checkpoint.
    code, _, err = launch(["--resume", "exp"], capfd)
    assert code != 0 and "already finished (final checkpoint at step 33)" in err


def test_cnn_with_accumulation_trains_exactly_the_epochs_asked(
    in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, err = launch(
        ["--model", "cnn", "--accumulate", "2", "--epochs", "1", *ONE_GPU, *BASE], capfd
    )
    assert code == 0, err[-3000:]
    run = only_run(in_tmp)
    profile = load_profile(run / "profile.json")
    assert profile.environment.accumulate_grad_batches == 2
    # The profile's window is in optimizer updates (5 warm-up + 20 measured), two batches
    # each; steps count batches.
    stopped = next(e for e in events(run, "profile-progress.jsonl") if e.event == "profile-done")
    assert stopped.step == 2 * 25
    # 640 images in batches of 8: one epoch is 80 steps.
    done = events(run, "progress-1.jsonl")[-1]
    assert done.event == "done" and done.step == 80
    assert "steps done: 80 / 80" in out
    flops = {x.name: x.flops for x in profile.layers}
    assert flops["net.conv1"] > 0 and flops["net.fc1"] > 0  # called through self.net(x)


def test_boring_datamodule_stops_at_the_scripts_own_max_epochs(
    in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, err = launch(
        ["--model", "boring", "--max-epochs", "2", "--target-steps", "1000", *ONE_GPU, *BASE],
        capfd,
    )
    assert code == 0, err[-3000:]
    run = only_run(in_tmp)
    # BoringDataModule: 64 training samples, batch size 1; two epochs are 128 steps.
    assert "Trainer(max_epochs=2) ends training at step 128" in out
    assert events(run, "progress-1.jsonl")[-1].step == 128
    assert "steps done: 128 / 128" in out
    refs = open_store(str(run / "checkpoints")).refs()
    assert refs[0].reason == "final" and refs[0].step == 128


def test_transformer_in_bf16_mixed_profiles_and_trains(
    in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, _, err = launch(
        ["--model", "transformer", "--precision", "bf16-mixed", "--target-steps", "35",
         *ONE_GPU, *BASE],
        capfd,
    )  # fmt: skip
    assert code == 0, err[-3000:]
    run = only_run(in_tmp)
    profile = load_profile(run / "profile.json")
    assert profile.environment.precision == "bf16-mixed"
    share = sum(x.forward_s for x in profile.layers) / profile.steps.forward_s
    assert share >= 0.7
    assert events(run, "progress-1.jsonl")[-1].step == 35


def test_dry_run_then_resume_trains_without_profiling_again(
    in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", "cnn", "--target-steps", "50", "--run-dir", "r", *FOUR_GPUS, *BASE]
    code, out, err = launch([*argv, "--dry-run"], capfd)
    assert code == 0, err[-3000:]
    run = in_tmp / "r"
    profiled = (run / "profile-progress.jsonl").read_text()
    assert json.loads((run / "run.json").read_text())["argv"][0] == str(SCRIPT)

    # start-ups an earlier launch of the run measured: the local ones price its moves
    record_startup(run, "local", 4.0)
    record_startup(run, "sky", 400.0)
    record_startup(run, "local", 6.0)
    code, out, err = launch(["--resume", "r"], capfd)
    assert code == 0, err[-3000:]
    assert "resuming r from step 25" in out
    assert (
        "spot restarts and moves are priced at the start-ups this run measured on the local "
        "backend: 2, mean 5 s" in out
    )
    kept = read_startups(run)
    # the dry run's profiling start-up first: it bounds a silent start, prices no move
    (profiling, *earlier, ran) = kept
    assert profiling[0] == PROFILE_STARTUP and profiling[1] > 0
    assert tuple(earlier) == (("local", 4.0), ("sky", 400.0), ("local", 6.0))
    # the resumed attempt's own, from its launch call to its first step
    assert ran[0] == "local" and ran[1] > 0
    # The plan prices what the resumed run trains: the 25 steps left, not all 50.
    assert "the plans price the 25 steps left of its 50" in out
    assert (run / "profile-progress.jsonl").read_text() == profiled  # no second profile
    trained = events(run, "progress-1.jsonl")
    assert trained[0].event == "resumed" and trained[0].step == 25
    # 50 steps of one process: the 25 left take 13 steps of two processes.
    assert trained[-1].step == 25 + 13 and {e.world_size for e in trained} == {2}


def test_a_reused_profile_that_does_not_know_the_scripts_devices_stops_in_one_line(
    in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # A profile to reuse (no profiling run again): the refusals come from the training job.
    code, _, err = launch(
        ["--model", "cnn", "--target-steps", "30", "--run-dir", "first", *ONE_GPU, *BASE,
         "--dry-run"],
        capfd,
    )  # fmt: skip
    assert code == 0, err[-3000:]
    reuse = ["--model", "cnn", "--target-steps", "30", "--profile", "first/profile.json",
             *FOUR_GPUS, *BASE]  # fmt: skip

    # devices=1 and strategy="auto": each process would train alone; the callback stops it.
    code, out, err = launch(
        [*reuse, "--explicit-devices", "1", "--explicit-strategy", "auto"], capfd
    )
    assert code != 0
    assert "reusing the profile first/profile.json" in out
    ours = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1
    assert "started 2 processes" in ours[0] and "world size 1" in ours[0]
    assert "launch again without --profile so the plan keeps them" in ours[0]

    # devices=1 alone: Lightning's own check refuses; its line is the one shown.
    code, _, err = launch([*reuse, "--explicit-devices", "1"], capfd)
    ours = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code != 0 and len(ours) == 1
    assert "You set `devices=1`" in ours[0] and "does not match the world size (2)" in ours[0]
