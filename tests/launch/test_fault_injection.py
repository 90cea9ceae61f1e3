"""SIGKILL at random steps and in the middle of checkpoint writes, on both stores.

A real 2-process DDP run (torchrun, gloo) trains a model with dropout on a shuffled,
resumable loader. It is killed without warning at five random steps (fixed seed); each
time it must resume from the newest checkpoint, lose at most one checkpoint interval,
and finally end with weights bit-identical to an uninterrupted run of the same seed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.launch_protocol import ProgressEvent
from lightning_srifty.io.checkpoint_store import open_store
from lightning_srifty.launch.backend import JobState, LaunchSpec
from lightning_srifty.launch.local_backend import LocalBackend, LocalJob
from tests.conftest import REPO_ROOT
from tests.launch.test_local_backend import plan

pytestmark = pytest.mark.slow

TARGET_STEPS = 150
EVERY_STEPS = 10
KILLS = 5
SEED = 20261123

TRAIN = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {examples!r})
    import lightning.pytorch as pl
    from torch import nn
    from digits import DigitsDataModule, DigitsModule
    from lightning_srifty import SriftyCallback

    class WithDropout(DigitsModule):
        def __init__(self):
            super().__init__(hidden=32, depth=2)
            self.drop = nn.Dropout(0.2)  # draws from torch's RNG every step

        def forward(self, x):
            return self.head(self.drop(self.body(x)))

    class StepLog(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.is_global_zero:
                with open(os.environ["STEP_LOG"], "a") as fh:
                    fh.write(f"{{trainer.global_step}}\\n")

    pl.seed_everything(0, workers=True)
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    trainer = pl.Trainer(
        max_steps=100_000, accelerator="cpu", devices=devices,
        strategy="ddp" if devices > 1 else "auto", deterministic=True, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=os.environ["ROOT_DIR"],
        # StepLog first: a batch's step is logged before a checkpoint of it is saved, so a
        # kill between the two never leaves a checkpoint ahead of the log (seen once)
        callbacks=[StepLog(), SriftyCallback(warmup_steps=1, profile_steps=2, verbose=False)],
    )
    trainer.fit(WithDropout(), DigitsDataModule(batch_size=24, seed=1))
    """
)


class Run:
    """Attempts of one training run against one store, on the local backend."""

    def __init__(self, root: Path, store_uri: str):
        self.root = root
        self.store_uri = store_uri
        self.script = root / "train.py"
        self.script.write_text(TRAIN.format(examples=str(REPO_ROOT / "examples")))
        self.backend = LocalBackend(root / "runs", max_nodes=1, max_procs=2)
        self.attempt = 0

    def step_log(self, attempt: int) -> Path:
        return self.root / f"steps-{attempt}.log"

    def progress(self, attempt: int) -> Path:
        return self.root / f"progress-{attempt}.jsonl"

    def start(self) -> LocalJob:
        self.attempt += 1
        envs = {
            proto.ENV_MODE: proto.MODE_TRAIN,
            proto.ENV_CHECKPOINT_URI: self.store_uri,
            proto.ENV_TARGET_STEPS: str(TARGET_STEPS),
            proto.ENV_CHECKPOINT_EVERY_STEPS: str(EVERY_STEPS),
            proto.ENV_PROGRESS_PATH: str(self.progress(self.attempt)),
            "STEP_LOG": str(self.step_log(self.attempt)),
            "ROOT_DIR": str(self.root / "lightning"),
        }
        spec = LaunchSpec(str(self.script), (), plan(1, 2), envs, name=f"a{self.attempt}")
        return self.backend.launch(spec)

    def logged_steps(self, attempt: int) -> list[int]:
        path = self.step_log(attempt)
        return [int(x) for x in path.read_text().split()] if path.exists() else []

    def events(self, attempt: int) -> list[ProgressEvent]:
        path = self.progress(attempt)
        lines = path.read_text().splitlines() if path.exists() else []
        return [ProgressEvent.from_line(line) for line in lines if line.strip()]

    def final_weights(self, tmp: Path) -> dict[str, torch.Tensor]:
        found = open_store(self.store_uri).fetch_latest(tmp)
        assert found is not None
        checkpoint = torch.load(found[0], weights_only=True)
        assert checkpoint["global_step"] == TARGET_STEPS
        return dict(checkpoint["state_dict"])


def _wait(job: LocalJob, backend: LocalBackend, timeout_s: float = 240.0) -> JobState:
    state = backend.wait(job, timeout_s=timeout_s)
    assert state.is_terminal, backend.log_tail(job)
    return state


def _until(condition: Callable[[], bool], job: LocalJob, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert all(p.poll() is None for p in job.processes), "job ended before the kill"
        assert time.monotonic() < deadline, "job made no progress"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def reference_weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """An uninterrupted run of the same seed and topology."""
    root = tmp_path_factory.mktemp("reference")
    run = Run(root, str(root / "store"))
    job = run.start()
    assert _wait(job, run.backend) is JobState.SUCCEEDED, run.backend.log_tail(job)
    return run.final_weights(root / "restore")


@pytest.mark.parametrize("store_kind", ["local", "s3"])
def test_sigkill_at_random_steps_resumes_to_identical_weights(
    store_kind: str,
    reference_weights: dict[str, torch.Tensor],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    uri = str(tmp_path / "store") if store_kind == "local" else request.getfixturevalue("s3_uri")
    run = Run(tmp_path, uri)
    store = open_store(uri)
    rng = np.random.default_rng(SEED)
    resume_step = 0
    for kill in range(KILLS):
        kill_at = int(rng.integers(resume_step + 3, TARGET_STEPS - (KILLS - kill) * 5))
        job = run.start()
        attempt = run.attempt
        _until(lambda a=attempt, k=kill_at: max(run.logged_steps(a), default=0) >= k, job)
        run.backend.kill(job)
        reached = max(run.logged_steps(attempt))
        assert reached < TARGET_STEPS
        newest = store.refs()[0]
        assert newest.step <= reached
        assert reached - newest.step <= EVERY_STEPS, "lost more than one checkpoint interval"
        if kill > 0:
            resumed = next(e for e in run.events(attempt) if e.event == "resumed")
            assert resumed.step == resume_step  # this attempt resumed the previous newest
        resume_step = newest.step

    job = run.start()
    assert _wait(job, run.backend) is JobState.SUCCEEDED, run.backend.log_tail(job)
    resumed = next(e for e in run.events(run.attempt) if e.event == "resumed")
    assert resumed.step == resume_step
    weights = run.final_weights(tmp_path / "restore")
    assert weights.keys() == reference_weights.keys()
    for name, tensor in reference_weights.items():
        assert torch.equal(weights[name], tensor), f"{name} differs from the uninterrupted run"


WRITER = textwrap.dedent(
    """
    import sys
    from lightning_srifty.io.checkpoint_store import open_store
    store = open_store(sys.argv[1], keep=2)
    step = int(sys.argv[3])
    while True:
        step += 1
        print(f"begin {step}", flush=True)
        store.save(sys.argv[2], step=step, reason="stress")
        print(f"done {step}", flush=True)
    """
)


@pytest.mark.parametrize("store_kind", ["local", "s3"])
def test_kill_during_a_checkpoint_write_keeps_the_newest_readable(
    store_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    uri = str(tmp_path / "store") if store_kind == "local" else request.getfixturevalue("s3_uri")
    payload = tmp_path / "checkpoint.ckpt"
    torch.save({"weights": torch.arange(4_000_000, dtype=torch.float32)}, payload)
    writer = tmp_path / "writer.py"
    writer.write_text(WRITER)
    rng = np.random.default_rng(SEED)
    store = open_store(uri)
    mid_write = 0
    last_done = 0
    for _ in range(4):
        proc = subprocess.Popen(  # noqa: S603 - fixed argv
            [sys.executable, str(writer), uri, str(payload), str(last_done)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        began = {}
        durations = []
        while True:
            word, step = proc.stdout.readline().split()
            now = time.monotonic()
            if word == "begin":
                began[int(step)] = now
            else:
                durations.append(now - began[int(step)])
                last_done = int(step)
            if word == "begin" and len(durations) >= 2:
                time.sleep(float(rng.uniform(0.0, 0.8)) * min(durations))
                break
        proc.kill()
        rest = proc.communicate()[0]
        finished = [int(line.split()[1]) for line in rest.splitlines() if line.startswith("done")]
        last_done = max([last_done, *finished])
        mid_write += int(not finished)
        found = store.fetch_latest(tmp_path / "restore")
        assert found is not None
        assert found[1].step >= last_done
        assert torch.load(found[0], weights_only=True)["weights"].shape == (4_000_000,)
    assert mid_write >= 1, "no kill landed inside a write; the test proved nothing"
