"""DataLoader workers survive a preemption that arrives while they start.

Real Lightning jobs in their own session, real DataLoader workers of each start
method, and a real SIGTERM to the whole process group sent from inside a new worker in
the one window that used to kill it (after PyTorch's worker handlers, before its
``worker_init_fn``): see ``scripts/preempt_at_worker_start.py``. Before the trainer
blocked SIGTERM around worker creation, every case here died with "DataLoader worker
... killed by signal: Terminated" and saved nothing.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_srifty.capture.workers import ignore_sigterm_then, keep_workers_through_sigterm
from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.io.checkpoint_store import open_store

SCRIPT = Path(__file__).resolve().parent / "scripts" / "preempt_at_worker_start.py"
REPO = Path(__file__).resolve().parents[2]


def _run_job(
    tmp_path: Path, args: list[str], *, armed: bool, extra_env: dict[str, str] | None = None
) -> tuple[int, str]:
    env = dict(os.environ)
    env.update(extra_env or {})
    env.update(
        {
            proto.ENV_MODE: proto.MODE_TRAIN,
            proto.ENV_CHECKPOINT_URI: str(tmp_path / "store"),
            proto.ENV_STATE_DIR: str(tmp_path / "state"),
            "SRIFTY_IMDS": "off",
            "PREEMPT_ARM": str(tmp_path / "arm"),
            "PREEMPT_SENT": str(tmp_path / "sent"),
            "TRACE_BATCHES": str(tmp_path / "batches.txt"),
            "PYTHONPATH": str(REPO),
        }
    )
    if armed:
        (tmp_path / "arm").touch()
    # Its own session: the SIGTERM goes to the job's group, never to pytest's. The
    # output pipes close only when every process holding them (workers, a fork server)
    # has ended: a job whose workers outlive it never gets past communicate().
    job = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = job.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, _ = job.communicate()
        pytest.fail(f"the job or its workers never ended:\n{out[-3000:]}")
    return job.returncode, out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "armed"),
    [
        # workers started for the second epoch, as a preemption at an epoch boundary
        (["--context", "fork", "--arm-after-epoch", "0"], False),
        # persistent workers start once, before the first batch (and before the
        # watcher replaces Lightning's SIGTERM handler)
        (["--context", "fork", "--persistent"], True),
        # the first workers of the run: the resource tracker starts in the same window
        (["--context", "spawn"], True),
        (["--context", "forkserver", "--arm-after-epoch", "0"], False),
    ],
    ids=["fork-epoch-boundary", "fork-persistent", "spawn", "forkserver"],
)
def test_a_sigterm_while_workers_start_still_ends_in_an_emergency_checkpoint(
    tmp_path: Path, args: list[str], armed: bool
) -> None:
    code, out = _run_job(tmp_path, args, armed=armed)
    assert (tmp_path / "sent").exists(), f"the hook never fired:\n{out[-3000:]}"
    assert "DataLoader worker" not in out, out[-3000:]
    assert code == proto.PREEMPTED_EXIT_CODE, out[-3000:]
    ran = len((tmp_path / "batches.txt").read_text().splitlines())
    latest = open_store(str(tmp_path / "store"), keep=10).refs()[0]
    # the job saved exactly the batches it ran: none lost, none counted twice
    assert (latest.reason, latest.step) == ("emergency", ran)
    assert f"emergency checkpoint {latest.id} at step {ran}" in out
    assert ran < 4 * 8  # stopped by the preemption, not by max_epochs


def test_a_notice_when_a_periodic_checkpoint_is_due_saves_the_step_once(
    tmp_path: Path,
) -> None:
    """A time-based checkpoint due at every step, and a SIGTERM: the step the notice
    lands on is saved once, as the emergency checkpoint (it was saved twice)."""
    code, out = _run_job(
        tmp_path,
        ["--context", "fork", "--arm-after-epoch", "0"],
        armed=False,
        extra_env={proto.ENV_CHECKPOINT_INTERVAL_S: "0.000001", proto.ENV_KEEP_CHECKPOINTS: "50"},
    )
    assert code == proto.PREEMPTED_EXIT_CODE, out[-3000:]
    refs = open_store(str(tmp_path / "store"), keep=50).refs()
    steps = [r.step for r in refs]
    assert len(steps) == len(set(steps)), (
        f"a step saved twice: {[(r.step, r.reason) for r in refs]}"
    )
    ran = len((tmp_path / "batches.txt").read_text().splitlines())
    assert (refs[0].reason, refs[0].step) == ("emergency", ran)
    assert any(r.reason == "periodic" for r in refs)  # the clock rule did fire


def test_a_worker_ignores_sigterm_then_runs_the_loaders_own_init(tmp_path: Path) -> None:
    """In a real forked child with SIGTERM blocked and pending, as a worker starts."""
    seen = tmp_path / "init"
    script = (
        "import os, signal, sys\n"
        "from lightning_srifty.capture.workers import ignore_sigterm_then\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
        "os.kill(os.getpid(), signal.SIGTERM)  # pending: the trainer's notice\n"
        f"ignore_sigterm_then(lambda i: open({str(seen)!r}, 'w').write(str(i)), 3, unblock=True)\n"
        "blocked = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])\n"
        "os.kill(os.getpid(), signal.SIGTERM)  # a later one, ignored too\n"
        "sys.exit(7 if blocked else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]  # not -SIGTERM, not blocked
    assert seen.read_text() == "3"


def test_the_trainer_blocks_sigterm_only_while_it_starts_workers() -> None:
    """The trainer's mask during worker creation and after, and the undo."""
    from torch.utils.data import DataLoader, dataloader

    masks: list[bool] = []
    inits: list[object] = []
    iterator = dataloader._MultiProcessingDataLoaderIter
    real_init = iterator.__init__

    def record(self: object, loader: DataLoader, *args: object, **kwargs: object) -> None:
        masks.append(signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, []))
        inits.append(loader.worker_init_fn)
        self._shutdown = True  # type: ignore[attr-defined]  # nothing for __del__ to end
        raise RuntimeError("no workers needed")

    iterator.__init__ = record  # type: ignore[method-assign]
    try:
        undo = keep_workers_through_sigterm()
        loader: DataLoader[int] = DataLoader(list(range(4)), num_workers=1)  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="no workers needed"):
            iter(loader)
        undo()
        assert iterator.__init__ is record
    finally:
        iterator.__init__ = real_init  # type: ignore[method-assign]
    assert masks == [True]
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    wrapped = inits[0]
    assert isinstance(wrapped, functools.partial) and wrapped.func is ignore_sigterm_then
    assert wrapped.keywords == {"unblock": True}
    assert loader.worker_init_fn is None  # the loader is given back as it was
