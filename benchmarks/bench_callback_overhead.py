"""Overhead of SriftyCallback on step time, inside the profiling window and after it.

Trains the same model with and without the callback, interleaving short repetitions
in ABBA order so drift in machine load hits both arms equally. Each run times its
own steps with a minimal timer callback, then compares medians per step index:

* inside the window (hooks active): target ratio <= 1.10 on CPU;
* after the window (hooks removed): target ratio <= 1.01.

Then the preemption vote under the launcher (``--vote-ranks 2``, 0 to skip): two real
gloo ranks train under ``torchrun`` in train mode, and each step's cost of the vote on
the training thread (:class:`~lightning_srifty.capture.preemption.StepVote`, timed by
itself) is compared with the step time; target <= 0.5 %. A blocking one-boolean
all-reduce every step (what the vote replaced) is timed beside it for reference.

    .venv/bin/python benchmarks/bench_callback_overhead.py [--reps 6] [--hidden 1024]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_srifty import SriftyCallback

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _digits() -> Any:
    spec = importlib.util.spec_from_file_location("digits", EXAMPLES / "digits.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["digits"] = module
    spec.loader.exec_module(module)
    return module


class StepTimer(pl.Callback):
    """Wall time of each training step, batch start to batch end.

    On CUDA it synchronizes at both ends, so the time is the GPU's and not only the
    launches'; both arms pay the same two synchronizations.
    """

    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    @staticmethod
    def _sync() -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def on_train_batch_start(self, *args: Any) -> None:
        self._sync()
        self._start = time.perf_counter()

    def on_train_batch_end(self, *args: Any) -> None:
        self._sync()
        self.times.append(time.perf_counter() - self._start)


def run_once(digits: Any, with_callback: bool, args: argparse.Namespace, root: str) -> list[float]:
    pl.seed_everything(0, verbose=False)
    timer = StepTimer()
    callbacks: list[pl.Callback] = [timer]
    if with_callback:
        callbacks.append(
            SriftyCallback(
                warmup_steps=args.warmup,
                profile_steps=args.window,
                profile_path=Path(root) / "profile.json",
                env={"SRIFTY_IMDS": "off"},
                verbose=False,
            )
        )
    trainer = pl.Trainer(
        max_steps=args.warmup + args.window + args.after,
        accelerator=args.accelerator,
        devices=1,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
    )
    trainer.fit(
        digits.DigitsModule(hidden=args.hidden, depth=args.depth),
        datamodule=digits.DigitsDataModule(batch_size=args.batch_size),
    )
    return timer.times


class BlockingVoteTimer(pl.Callback):
    """Times what a blocking per-step vote (Lightning's reduce_boolean_decision) costs."""

    def __init__(self, srifty: SriftyCallback) -> None:
        self.spent_s = 0.0
        self.steps = 0
        self.srifty = srifty
        self.vote: Any = None

    def on_train_end(self, trainer: pl.Trainer, *args: Any) -> None:
        session = self.srifty._session  # noqa: SLF001 - the benchmark reads the vote's counters
        self.vote = session.vote if session is not None else None

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        from lightning_srifty.capture.preemption import agree_across_ranks

        began = time.perf_counter()
        agree_across_ranks(trainer, False)
        self.spent_s += time.perf_counter() - began
        self.steps += 1


def vote_worker(args: argparse.Namespace) -> int:
    """One rank of the vote benchmark (started by torchrun from :func:`vote_benchmark`)."""
    digits = _digits()
    srifty = SriftyCallback(warmup_steps=2, profile_steps=5, verbose=False)
    timer = StepTimer()
    blocking = BlockingVoteTimer(srifty)
    trainer = pl.Trainer(
        max_steps=10**9,
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        strategy="ddp",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=os.environ["VOTE_ROOT"],
        callbacks=[srifty, timer, blocking],  # the vote runs inside the timed step
    )
    trainer.fit(
        digits.DigitsModule(hidden=args.hidden, depth=args.depth),
        datamodule=digits.DigitsDataModule(batch_size=args.batch_size),
    )
    if trainer.is_global_zero:
        vote = blocking.vote
        assert vote is not None and vote.steps > 0
        step_s = statistics.median(timer.times[20:])
        per_step = vote.spent_s / vote.steps
        blocking_s = blocking.spent_s / max(blocking.steps, 1)
        share = per_step / step_s
        verdict = "ok" if share <= 0.005 else "OVER TARGET"
        print(
            f"  vote: {trainer.world_size} ranks (gloo), {vote.steps} steps, a round every "
            f"{vote.every} steps ({vote.rounds} rounds); training-thread cost "
            f"{per_step * 1e6:.2f} us/step = {share:.3%} of the {step_s * 1e3:.2f} ms median "
            f"step (target <= 0.500 %) {verdict}; per round: start "
            f"{vote.launch_s / max(vote.rounds, 1) * 1e6:.0f} us, collect "
            f"{vote.collect_s / max(vote.rounds, 1) * 1e6:.0f} us (incl. per-step bookkeeping)",
            flush=True,
        )
        print(
            f"  reference: a blocking all-reduce every step costs {blocking_s * 1e6:.1f} us "
            f"= {blocking_s / step_s:.2%} of the step",
            flush=True,
        )
    return 0


def vote_benchmark(args: argparse.Namespace) -> None:
    """Runs :func:`vote_worker` on ``--vote-ranks`` local gloo ranks under torchrun."""
    import socket
    import subprocess

    from lightning_srifty.core import launch_protocol as proto

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as root:
        env = dict(os.environ, OMP_NUM_THREADS="1", SRIFTY_IMDS="off", VOTE_ROOT=root)
        env.update(
            {
                proto.ENV_MODE: proto.MODE_TRAIN,
                proto.ENV_CHECKPOINT_URI: str(Path(root) / "store"),
                proto.ENV_TARGET_STEPS: str(args.vote_steps),
            }
        )
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            f"--nproc-per-node={args.vote_ranks}", "--master-addr=127.0.0.1",
            f"--master-port={port}", __file__, "--vote-worker", f"--hidden={args.hidden}",
            f"--depth={args.depth}", f"--batch-size={args.batch_size}",
        ]  # fmt: skip
        print(f"preemption vote, {args.vote_ranks} ranks, {args.vote_steps} steps:", flush=True)
        subprocess.run(cmd, env=env, check=True)  # noqa: S603 - fixed argv


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--reps", type=int, default=10, help="0 skips the single-process part")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--after", type=int, default=40)
    p.add_argument("--accelerator", default="cpu", help="cpu or gpu")
    p.add_argument("--vote-ranks", type=int, default=2, help="0 skips the vote benchmark")
    p.add_argument("--vote-steps", type=int, default=1500)
    p.add_argument("--vote-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.vote_worker:
        return vote_worker(args)
    os.environ.setdefault("SRIFTY_IMDS", "off")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    digits = _digits()
    window = slice(args.warmup, args.warmup + args.window)
    after = slice(args.warmup + args.window + 2, None)  # skip the write step and one more
    per_arm: dict[bool, dict[str, list[float]]] = {
        False: {"window": [], "after": []},
        True: {"window": [], "after": []},
    }
    with tempfile.TemporaryDirectory() as root:
        if args.reps > 0:
            run_once(digits, True, args, root)  # warm caches, imports, allocator
        for rep in range(args.reps):
            # ABBA order: neither arm always runs second (warmer caches, later drift)
            for arm in (False, True) if rep % 2 == 0 else (True, False):
                times = run_once(digits, arm, args, root)
                per_arm[arm]["window"].append(statistics.median(times[window]))
                per_arm[arm]["after"].append(statistics.median(times[after]))
    print(
        f"torch {torch.__version__} on {args.accelerator}"
        f"{' ' + torch.cuda.get_device_name() if args.accelerator == 'gpu' else ''}, "
        f"threads {torch.get_num_threads()}, model hidden="
        f"{args.hidden} depth={args.depth} batch={args.batch_size}, reps={args.reps}"
    )
    for phase, target in (("window", 1.10), ("after", 1.01)) if args.reps > 0 else ():
        base = statistics.median(per_arm[False][phase])
        prof = statistics.median(per_arm[True][phase])
        ratio = prof / base
        verdict = "ok" if ratio <= target else "OVER TARGET"
        pairs = [w / wo for w, wo in zip(per_arm[True][phase], per_arm[False][phase], strict=True)]
        print(f"{phase:>6}: without {base * 1e3:7.3f} ms/step, with {prof * 1e3:7.3f} ms/step, "
              f"ratio {ratio:.3f} (target <= {target:.2f}) {verdict}; per-rep ratios "
              f"{min(pairs):.3f}..{max(pairs):.3f}")  # fmt: skip
    if args.vote_ranks > 1:
        vote_benchmark(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
