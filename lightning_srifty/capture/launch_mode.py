"""The job side of ``srifty-launch``: what :class:`SriftyCallback` does when launched.

Outside the launcher none of this runs. Under it, environment variables (see
:mod:`lightning_srifty.core.launch_protocol`) switch on:

* **resume**: the newest complete checkpoint in ``SRIFTY_CHECKPOINT_URI`` is restored
  automatically (model, optimizer, schedulers, loop progress, RNG states);
* **profile mode**: after the profiling window, save a checkpoint and stop cleanly;
* **train mode**: stop at ``SRIFTY_TARGET_STEPS`` (or ``SRIFTY_TARGET_EPOCHS``) unless the
  script's own ``max_steps``/``max_epochs`` stop it first (they are never lifted), check
  that the Trainer runs the ``SRIFTY_WORLD_SIZE`` processes the launcher started, checkpoint every
  ``SRIFTY_CHECKPOINT_INTERVAL_S`` seconds (or ``SRIFTY_CHECKPOINT_EVERY_STEPS`` steps),
  and on a preemption notice (SIGTERM or the EC2 spot notice) save an emergency
  checkpoint and exit with :data:`PREEMPTED_EXIT_CODE`;
* **probe mode**: as train mode, writing no checkpoint; with two processes or more it
  first times all-reduces among them (:mod:`~lightning_srifty.capture.collective`);
* **progress**: rank zero appends JSON lines to ``SRIFTY_PROGRESS_PATH`` and, with
  ``SRIFTY_PROGRESS_STDOUT=1``, prints them to its log (cloud runs).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl

from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.errors import CheckpointError, ConfigError
from lightning_srifty.core.launch_protocol import ProgressEvent

if TYPE_CHECKING:
    from lightning_srifty.capture.preemption import PreemptionWatcher

PROGRESS_EVERY_S = 1.0


@dataclass(frozen=True)
class LaunchSettings:
    """The launcher's instructions, read once from the environment."""

    mode: str
    checkpoint_uri: str
    target_steps: int | None
    progress_path: Path | None
    checkpoint_interval_s: float | None
    state_dir: Path | None
    keep_checkpoints: int = 3
    checkpoint_every_steps: int | None = None
    progress_stdout: bool = False
    target_epochs: float | None = None
    world_size: int | None = None
    job_steps: int | None = None
    job_epochs: float | None = None
    stall_dump_s: float | None = None

    @staticmethod
    def from_env(env: Mapping[str, str]) -> LaunchSettings | None:
        mode = env.get(proto.ENV_MODE, "")
        if not mode:
            return None
        if mode not in proto.MODES:
            raise ConfigError(
                f"{proto.ENV_MODE}={mode!r} is not valid: use one of {', '.join(proto.MODES)}"
            )
        uri = env.get(proto.ENV_CHECKPOINT_URI, "")
        if not uri:
            raise ConfigError(f"{proto.ENV_MODE} is set but {proto.ENV_CHECKPOINT_URI} is not")
        return LaunchSettings(
            mode=mode,
            checkpoint_uri=uri,
            target_steps=_int(env, proto.ENV_TARGET_STEPS),
            progress_path=_path(env, proto.ENV_PROGRESS_PATH),
            checkpoint_interval_s=_float(env, proto.ENV_CHECKPOINT_INTERVAL_S),
            state_dir=_path(env, proto.ENV_STATE_DIR),
            keep_checkpoints=max(_int(env, proto.ENV_KEEP_CHECKPOINTS) or 3, 1),
            checkpoint_every_steps=_int(env, proto.ENV_CHECKPOINT_EVERY_STEPS) or None,
            progress_stdout=env.get(proto.ENV_PROGRESS_STDOUT, "") == "1",
            target_epochs=_float(env, proto.ENV_TARGET_EPOCHS),
            world_size=_int(env, proto.ENV_WORLD_SIZE) or None,
            job_steps=_int(env, proto.ENV_JOB_STEPS) or None,
            job_epochs=_float(env, proto.ENV_JOB_EPOCHS) or None,
            stall_dump_s=_float(env, proto.ENV_STALL_DUMP_S),
        )


class LaunchSession:
    """Resume, periodic/emergency checkpoints, target and progress for one run."""

    def __init__(self, settings: LaunchSettings):
        from lightning_srifty.capture.preemption import PreemptionWatcher, StepVote
        from lightning_srifty.io.checkpoint_store import open_store

        self.settings = settings
        dump_stacks_on_request()
        self.store = open_store(settings.checkpoint_uri, keep=settings.keep_checkpoints)
        running = settings.mode in proto.RUNNING_MODES
        self.watcher = PreemptionWatcher(os.environ) if running else None
        self.writes = settings.mode != proto.MODE_PROBE
        """A probe measures steps and must leave the run's checkpoints as they were."""
        self.vote = StepVote()
        self.resumed_from = ""
        self._last_ckpt_time = time.monotonic()
        self._last_ckpt_step = 0
        self._last_report_time = time.monotonic()
        self._last_report_step = 0
        self._first_step = 0
        self._train_started_at: float | None = None
        self._validation_from: float | None = None
        self._last_heartbeat = 0.0
        self._stall_dump_armed_at: float | None = None
        """When the stall dump's timer was last restarted (``None``: not armed)."""
        self._validation_s = 0.0
        """Wall time of this attempt's validation passes: not part of any step."""
        self._validation_s_at_report = 0.0
        self.steps = 0
        """Batches of the training loop this run has done (restored with a checkpoint):
        the unit of every target, report and checkpoint, whatever the optimisation."""
        self.restored_steps: int | None = None
        """What the restored checkpoint counted (set by the callback's state)."""
        self._undo_workers: Callable[[], None] | None = None
        self._undo_quiet: Callable[[], None] | None = None
        self._iterate_again = False
        """The resumed epoch is a reload epoch after an epoch-end checkpoint: make the
        iterator Lightning makes at an unresumed reload epoch's start."""
        self.exit_pending = False
        """An emergency checkpoint is saved; the process ends at the next hook."""
        self._replay_at_first_batch = False
        """A resume inside an epoch: replay the epoch-start hooks Lightning skipped."""
        self._resumed_mid_epoch = False
        """Lightning restarted inside this epoch: its end steps the plateau schedulers."""
        self._deferred_preempt = False
        self._deferred_checkpoint = False
        """A save decided at a batch a checkpoint cannot resume exactly, taken at the next
        batch that can (:func:`_save_waits_for`)."""
        self._pending_handover = False
        """The profile window ended at such a batch: hand over at the next one."""
        self._final_saved_at: int | None = None
        """The step whose batch end saved the final checkpoint (the target reached)."""
        self._waited = 0
        """Batches a deferred save has waited (bounded: see :meth:`after_step`)."""
        self.samplers: list[Any] = []
        """Where each rebuilt training loader keeps its position: a :class:`ResumingBatchSampler`
        or a :class:`ResumingStreamLoader`."""
        self._trainer: pl.Trainer | None = None
        self.pending_loader_states: list[dict[str, Any]] | None = None
        """Where the restored checkpoint's loaders stood (set by the callback's state)."""
        self.pending_worker_bases: list[Any] | None = None
        """This rank's :meth:`worker_base_states` from the checkpoint resumed."""
        self.pending_script_generators: list[Any] | None = None
        """This rank's :meth:`script_generator_states` from the checkpoint resumed."""
        self._builds = 0
        """Training-loader builds so far, where the script reloads them."""
        self.restored_reload_epoch: int | None = None
        """The epoch of the uninterrupted run's last training-loader reload (set by the
        callback's state), so a resumed Lightning reloads on that run's schedule."""
        self.build_rng: dict[str, Any] | None = None
        """This process's generators as the latest training-loader build found them (under
        ``reload_dataloaders_every_n_epochs``): what the script's ``train_dataloader``
        drew from."""
        self.restored_build_rng: dict[str, Any] | None = None
        """This rank's :attr:`build_rng` from the checkpoint resumed (set by its state)."""
        self.before_training_loaders: Callable[[], None] | None = None
        """Run once before the first training loader is prepared (a resume's RNG)."""

    # ----------------------------------------------------------- lifecycle
    def setup(self, trainer: pl.Trainer) -> None:
        """Arranges the automatic resume before Lightning restores state."""
        from lightning_srifty.capture.checkpointing import install_auto_resume, restore_latest

        self._trainer = trainer
        self._resume_loaders_exactly(trainer)
        try:
            restored = restore_latest(self.store)
        except CheckpointError as exc:
            # Unreachable store or access denied: stop here. Starting from an older
            # checkpoint or from scratch would waste the work the store still holds.
            print(f"srifty: cannot resume: {exc}", file=sys.stderr, flush=True)
            raise
        if restored is not None:
            path, checkpoint_id = restored
            install_auto_resume(trainer, path)
            self.resumed_from = checkpoint_id
        if self.settings.mode not in proto.RUNNING_MODES:
            return
        from lightning_srifty.capture.workers import keep_workers_through_sigterm

        # Before Lightning starts the loaders' workers (right after this hook).
        self._undo_workers = keep_workers_through_sigterm()
        self._check_world_size(trainer)
        # The launcher's target (in batches, counted by after_step) may only shorten the
        # run: the script's own max_steps and max_epochs still hold.
        loop = trainer.fit_loop
        epochs = self.settings.target_epochs
        if epochs is not None:
            whole = math.ceil(epochs)
            if loop.max_epochs is None or loop.max_epochs < 0 or whole < loop.max_epochs:
                loop.max_epochs = whole

    def _resume_loaders_exactly(self, trainer: pl.Trainer) -> None:
        """Rebuilds each plain training ``DataLoader`` so that a resume continues at its
        exact batch (:mod:`~lightning_srifty.capture.resumable_sampler`).

        Lightning prepares every training loader through its data connector's
        ``_prepare_dataloader`` (distributed sampler included) right before it starts
        iterating, after the checkpoint is restored; the rebuilt loader takes the
        restored position there.
        """
        from lightning.pytorch.trainer.states import RunningStage

        from lightning_srifty.capture.resumable_sampler import (
            ResumingBatchSampler,
            ResumingStreamLoader,
            make_resumable,
            replays_persistent_workers,
        )

        connector = getattr(trainer, "_data_connector", None)
        original = getattr(connector, "_prepare_dataloader", None)
        if connector is None or original is None:
            return  # another Lightning: plain loaders restart their epoch, as before

        def prepare(dataloader: Any, shuffle: bool, mode: Any) -> Any:
            prepared = original(dataloader, shuffle, mode)
            if mode != RunningStage.TRAINING:
                return prepared
            first, self.before_training_loaders = self.before_training_loaders, None
            if first is not None:
                first()
            rebuilt = make_resumable(prepared, lambda: int(trainer.current_epoch))
            if rebuilt is None:
                return prepared
            if rebuilt.num_workers > 0 and rebuilt.persistent_workers and trainer.is_global_zero:
                if not replays_persistent_workers(rebuilt):
                    print(f"srifty: {PERSISTENT_WORKERS_NOTE}", file=sys.stderr, flush=True)
            # a stream keeps its position itself; a map-style loader in its batch sampler
            position: Any = (
                rebuilt if isinstance(rebuilt, ResumingStreamLoader) else rebuilt.batch_sampler
            )
            index = len(self.samplers)
            states = self.pending_loader_states or []
            if index < len(states):
                bases = self.pending_worker_bases or []
                base = bases[index] if index < len(bases) else None
                position.resume(states[index], int(trainer.world_size), base_state=base)
                generators = self.pending_script_generators or []
                if index < len(generators) and isinstance(position, ResumingBatchSampler):
                    position.restore_script_generators(generators[index])
            self.samplers.append(position)
            return rebuilt

        connector._prepare_dataloader = prepare
        self._build_as_uninterrupted(trainer)

    def _every_training_loader_resumes(self, trainer: pl.Trainer) -> bool:
        """Whether each of the fit's training loaders is one this session rebuilt to
        resume at its exact batch (a loader it could not rebuild restarts its epoch)."""
        combined = getattr(trainer.fit_loop, "_combined_loader", None)
        loaders = list(getattr(combined, "flattened", None) or [])
        rebuilt = {id(position) for position in self.samplers}
        return bool(loaders) and all(
            id(loader) in rebuilt or id(getattr(loader, "batch_sampler", None)) in rebuilt
            for loader in loaders
        )

    def _build_as_uninterrupted(self, trainer: pl.Trainer) -> None:
        """Has a resumed Lightning build the training loaders as the uninterrupted run's
        last reload did, where the script reloads them.

        Scripts reload to draw a new subset or to follow a curriculum: their
        ``train_dataloader`` draws from the global generators or reads the epoch. A
        resumed run builds its loaders when it starts, in the epoch it resumes in and
        with this process's generators, and trained other batches until the next reload
        (measured: from the first resumed batch on). Each build records the generators
        it starts from (saved with the checkpoint); a resumed run's first build, where
        it stands before the next reload, starts from the saved ones and shows
        ``train_dataloader`` the epoch of the last reload.
        """
        loop = getattr(trainer, "fit_loop", None)
        setup_data = getattr(loop, "setup_data", None)
        source = getattr(loop, "_data_source", None)
        every = _reload_every(trainer)
        if loop is None or setup_data is None or source is None or every <= 0:
            return
        if not hasattr(loop, "_last_train_dl_reload_epoch"):
            return  # another Lightning: its reload schedule is not this one

        from lightning_srifty.capture.checkpointing import capture_rng_state, restore_rng_state

        def build() -> None:
            if loop._combined_loader is not None and not loop._should_reload_train_dl:
                setup_data()
                return
            self._start_build()
            saved, self.restored_build_rng = self.restored_build_rng, None
            built_in = self.restored_reload_epoch
            epoch = int(trainer.current_epoch)
            if saved is None or built_in is None or not built_in <= epoch < built_in + every:
                # after an epoch-end checkpoint: the script's build draws from the
                # generators as that epoch left them (restored before its
                # ``train_dataloader``, not after, where the loaders are prepared)
                first, self.before_training_loaders = self.before_training_loaders, None
                if first is not None:
                    first()
                self.build_rng = capture_rng_state()
                # A new build: its loaders start their own generators, not the saved
                # ones', and Lightning counts the next reload from it (put back on the
                # saved schedule, it built them again in this epoch: the script drew a
                # second subset where the uninterrupted run drew one; measured after an
                # epoch-end checkpoint, every later batch differed).
                self.pending_script_generators = None
                self.restored_reload_epoch = None
                # In a reload epoch Lightning makes a second iterator when the epoch
                # starts, which a resumed Lightning skips: each draws a base seed (and
                # with workers an order), so the resumed epoch drew other orders.
                self._iterate_again = saved is not None and built_in is not None
                setup_data()  # a fresh run, or Lightning reloads in this epoch anyway
                return
            restore_rng_state(saved)
            self.build_rng = saved
            if built_in == epoch:
                setup_data()
                return
            original = source.dataloader
            progress = loop.epoch_progress.current

            def dataloader() -> Any:
                completed, progress.completed = progress.completed, built_in
                try:
                    return original()
                finally:
                    progress.completed = completed

            source.dataloader = dataloader
            try:
                setup_data()
            finally:
                del source.dataloader  # the class's method again

        loop.setup_data = build
        epoch_loop = getattr(loop, "epoch_loop", None)
        start = getattr(epoch_loop, "on_run_start", None)
        if epoch_loop is None or start is None:
            return

        def on_run_start(data_fetcher: Any) -> None:
            if self._iterate_again:
                self._iterate_again = False
                iter(data_fetcher)  # as ``_TrainingEpochLoop.on_run_start`` does unresumed
            start(data_fetcher)

        epoch_loop.on_run_start = on_run_start

    def _start_build(self) -> None:
        """Forgets the loaders of an earlier build when Lightning builds them again.

        Under ``Trainer(reload_dataloaders_every_n_epochs=N)`` Lightning asks the script
        for new training loaders at the start of an epoch and drops the old ones. Their
        positions were still saved, ahead of the live loaders', and a resume gave a live
        loader a dropped one's position (measured: every batch after the resume
        differed). The restored positions are for the resume's first build alone.
        """
        if self._builds:
            self.samplers = []
            self.pending_loader_states = None
            self.pending_worker_bases = None
            self.pending_script_generators = None
        self._builds += 1

    def reload_epoch(self) -> int | None:
        """The epoch of Lightning's last training-loader build under
        ``reload_dataloaders_every_n_epochs`` (``None`` without reloads), which Lightning's
        checkpoints do not keep."""
        trainer = self._trainer
        if trainer is None or not _reload_every(trainer):
            return None
        last = getattr(trainer.fit_loop, "_last_train_dl_reload_epoch", None)
        return int(last) if isinstance(last, (int, float)) and math.isfinite(last) else None

    def _keep_reload_schedule(self, trainer: pl.Trainer) -> None:
        """Puts a resumed Lightning back on the uninterrupted run's reload schedule.

        Lightning counts the epochs to the next reload from its last build, and a
        resumed run builds its loaders when it starts: resumed inside epoch 1 of a
        script reloading every 2 epochs, it reloaded at epoch 3 where the uninterrupted
        run reloaded at epoch 2, and every batch from epoch 2 on differed (measured).
        """
        restored, self.restored_reload_epoch = self.restored_reload_epoch, None
        loop = trainer.fit_loop
        if restored is None or not hasattr(loop, "_last_train_dl_reload_epoch"):
            return
        loop._last_train_dl_reload_epoch = restored

    def loader_states(self) -> list[dict[str, Any]]:
        """Where each rebuilt training loader stands, for the checkpoint."""
        trainer = self._trainer
        if trainer is None or not self.samplers:
            return []
        done = _batches_done_in_epoch(trainer)
        closed = self.epoch_closed()
        world = int(trainer.world_size)
        return [s.position(done, world, epoch_closed=closed) for s in self.samplers]

    def worker_base_states(self) -> list[Any]:
        """Per rebuilt training loader, the generator state its pass's workers were seeded
        from (``None`` for a stream or a loader without workers), for the checkpoint."""
        trainer = self._trainer
        if trainer is None or not self.samplers:
            return []
        done = _batches_done_in_epoch(trainer)
        closed = self.epoch_closed()
        return [s.worker_base_state(done, epoch_closed=closed) for s in self.samplers]

    def script_generator_states(self) -> list[list[Any]]:
        """Per rebuilt training loader, the script's own generators it draws from (a
        seeded ``RandomSampler``'s, the loader's ``generator``) as they stand, for the
        checkpoint: the passes after a resume draw their orders and base seeds there."""
        from lightning_srifty.capture.resumable_sampler import ResumingBatchSampler

        return [
            s.script_generator_states() if isinstance(s, ResumingBatchSampler) else []
            for s in self.samplers
        ]

    def epoch_closed(self) -> bool:
        """Whether the training batches done so far end the epoch (a resume then starts
        the next epoch, whose loaders draw their orders afresh)."""
        trainer = self._trainer
        if trainer is None:
            return False
        batches = trainer.num_training_batches
        return isinstance(batches, int) and 0 < batches <= _batches_done_in_epoch(trainer)

    def _check_world_size(self, trainer: pl.Trainer) -> None:
        """Stops a job whose Trainer does not run the processes the launcher started.

        The launcher sets ``devices``/``num_nodes``/``strategy`` through ``PL_TRAINER_*``
        and plans around what a script fixes itself (recorded when it was profiled); a
        script whose own values the plan did not know overrides them, and each torchrun
        process would train alone as world size 1, racing the others to the checkpoints.
        """
        expected = self.settings.world_size
        seen = int(trainer.world_size)
        if expected is None or seen == expected:
            return
        message = (
            f"SriftyCallback: srifty-launch started {expected} processes for this plan but the "
            f"Trainer runs world size {seen}: the script's own devices=, num_nodes= or "
            "strategy= were not known when the plan was made (a reused --profile, or a "
            "Trainer built where the profiling run could not see it); launch again without "
            "--profile so the plan keeps them, or remove them from Trainer(...)"
        )
        if self.settings.state_dir is not None:
            self.settings.state_dir.mkdir(parents=True, exist_ok=True)
            (self.settings.state_dir / proto.FAILURE_MARKER).write_text(message + "\n")
        raise ConfigError(message)

    def on_train_start(self, trainer: pl.Trainer) -> None:
        self.vote.start()  # collective: every rank is here
        self._keep_reload_schedule(trainer)
        if self.watcher is not None:
            # After Lightning installed its SIGTERM handler, so ours takes the signal.
            self.watcher.start()
            _adopt_early_sigterm(trainer, self.watcher)
        if self.restored_steps is not None:
            self.steps = self.restored_steps
        elif self.resumed_from:
            # a checkpoint from before steps were counted: its optimizer steps
            self.steps = int(trainer.global_step)
        # at the first batch: GradientAccumulationScheduler's on_train_start refuses a
        # Trainer whose factor is not 1 yet
        self._replay_at_first_batch = _restarted_inside_epoch(trainer)
        self._resumed_mid_epoch = bool(getattr(trainer.fit_loop, "restarted_mid_epoch", False))
        if self._resumed_mid_epoch and self._every_training_loader_resumes(trainer):
            self._undo_quiet = _quiet_unresumable_loader_warning()
        step = self.steps
        self._last_report_step = step
        self._last_ckpt_step = step
        self._first_step = step
        self._train_started_at = time.monotonic()
        self._report(
            trainer,
            "resumed" if self.resumed_from else "start",
            step,
            0.0,
            checkpoint=self.resumed_from,
        )
        if self.settings.mode == proto.MODE_PROBE and int(trainer.world_size) > 1:
            from lightning_srifty.capture.collective import measure_allreduce

            # every rank takes part; the links the plan depends on, measured on their own
            timings = measure_allreduce(trainer.strategy.root_device)
            self._report(trainer, "collective", step, 0.0, allreduce=timings)

    def before_batch(self, trainer: pl.Trainer) -> None:
        """Called at every batch start: the epoch start a resume skipped, at its first."""
        if self._replay_at_first_batch:
            self._replay_at_first_batch = False
            _replay_epoch_start(trainer)
            skipped = _unreplayed_epoch_start_hooks(trainer)
            if skipped and trainer.is_global_zero:
                note = EPOCH_START_NOTE.format(
                    epoch=trainer.current_epoch, hooks=", ".join(skipped)
                )
                print(f"srifty: {note}", file=sys.stderr, flush=True)

    def on_train_epoch_end(self, trainer: pl.Trainer) -> None:
        """The end of the epoch a resume continued: lets Lightning step its plateau
        schedulers there as the uninterrupted run does.

        Lightning skips ``ReduceLROnPlateau`` (and other epoch-interval schedulers) at the
        end of the epoch it restarted in while the fit loop is still ``restarting``
        (``fit_loop.on_advance_end``), for a checkpoint from after an epoch's end, whose
        metrics are gone. A resume inside an epoch runs that epoch's batches and
        validation, so its metrics are there; the launcher resumes inside epochs at every
        preemption, and each one skipped a plateau step (measured: the learning rate kept
        one reduction fewer and every later batch differed). The loop's own flag is
        cleared, not its children's: only that check still reads it this epoch.
        """
        if not self._resumed_mid_epoch:
            return
        self._resumed_mid_epoch = False
        loop = trainer.fit_loop
        if getattr(loop, "_restarting", False):
            loop._restarting = False

    def after_step(self, trainer: pl.Trainer) -> None:
        """Called at every batch end: progress, target, preemption, periodic save."""
        if self.exit_pending:
            return
        self.steps += 1
        step = self.steps
        now = time.monotonic()
        if now - self._last_report_time >= PROGRESS_EVERY_S and step > self._last_report_step:
            training_s = now - self._last_report_time
            training_s -= self._validation_s - self._validation_s_at_report
            per_step = max(training_s, 0.0) / (step - self._last_report_step)
            self._report(trainer, "step", step, per_step)
            self._last_report_time, self._last_report_step = now, step
            self._validation_s_at_report = self._validation_s
        agreed = self.vote.collect()
        # Every rank agrees on a vote at the same batch and stands at the same place in
        # the epoch, so a deferred decision is still taken by all at once.
        wait = _save_waits_for(trainer)
        waiting = self._pending_handover or self._deferred_preempt or self._deferred_checkpoint
        self._waited = self._waited + 1 if waiting else 0
        if wait and self._waited > int(trainer.accumulate_grad_batches) + 1:
            wait = None  # validation after every batch: no batch loses nothing
        if self._pending_handover and not wait:
            self._hand_over(trainer)
            return
        target = self.settings.target_steps
        if (target is not None and step >= target) or self._epochs_reached(trainer):
            if not wait and self.settings.mode in proto.RUNNING_MODES:
                # Saved here, inside the epoch, the final checkpoint resumes at the next
                # batch; saved at the train end, Lightning has counted the epoch as done
                # and a resume (a longer target) numbered every later epoch one ahead: a
                # DistributedSampler then ordered them as other epochs.
                self.save(trainer, "final")
                self._final_saved_at = step
            trainer.should_stop = True
            return
        interval = self.settings.checkpoint_interval_s
        local = self.vote.launch(
            notice=self.watcher is not None and self.watcher.should_checkpoint(),
            checkpoint_due=bool(interval and now - self._last_ckpt_time >= interval),
        )
        if agreed.preempt or local.preempt or self._deferred_preempt:
            if not wait:
                self._emergency_exit(trainer)
                return  # the emergency checkpoint is this step's only save
            self._defer_preempt(trainer, wait)
        every = self.settings.checkpoint_every_steps
        # Steps are the same on every rank, so the step rule needs no vote; the clock
        # rule is rank zero's reading, agreed through the vote (or this process's alone).
        if (
            agreed.checkpoint
            or local.checkpoint
            or self._deferred_checkpoint
            or (every and step - self._last_ckpt_step >= every)
        ):
            self._save_or_defer(trainer, wait)

    def _save_or_defer(self, trainer: pl.Trainer, wait: str | None) -> None:
        """A periodic checkpoint now, or at the next batch a checkpoint resumes exactly."""
        self._deferred_checkpoint = wait is not None
        if wait is None:
            self.save(trainer, "periodic")

    def _defer_preempt(self, trainer: pl.Trainer, wait: str) -> None:
        """Keeps training to the next batch a checkpoint resumes exactly, said once."""
        if self._deferred_preempt:
            return
        self._deferred_preempt = True
        if trainer.is_global_zero:
            print(
                f"srifty: preemption notice at a batch a checkpoint cannot resume exactly; "
                f"the emergency checkpoint waits for {wait}",
                file=sys.stderr,
            )

    def _epochs_reached(self, trainer: pl.Trainer) -> bool:
        """A fractional ``--epochs`` target reached at this optimizer step (whole epochs
        end through ``max_epochs``)."""
        epochs = self.settings.target_epochs
        batches = trainer.num_training_batches
        if epochs is None or epochs == int(epochs) or not isinstance(batches, int) or batches < 1:
            return False
        # Batches of this epoch done by the time the batch-end hooks run.
        if _inside_accumulation(trainer):
            return False  # stop at the cycle's optimizer step
        return trainer.current_epoch + _batches_done_in_epoch(trainer) / batches >= epochs

    def on_profile_done(self, trainer: pl.Trainer, *, training_ended: bool = False) -> None:
        """Profile mode: checkpoint where the window ended, then end training cleanly.

        ``training_ended``: the script's own Trainer ended training inside the window
        (``EarlyStopping``, its ``max_epochs``): the job is done as the script defines it,
        so the checkpoint is the final one and the launcher is told why, not handed a job
        to resume (a resumed ``EarlyStopping`` fails without its metric). Otherwise a
        window ending at a batch a checkpoint cannot resume exactly (:func:`_save_waits_for`)
        hands over at the next batch that can.
        """
        if self.settings.mode != proto.MODE_PROFILE:
            return
        if training_ended:
            self._profiled_to_the_end(trainer)
            return
        if _save_waits_for(trainer):
            self._pending_handover = True
            return
        self._hand_over(trainer)

    def _profiled_to_the_end(self, trainer: pl.Trainer) -> None:
        """The script's own Trainer ended training in the profiling run: its final
        checkpoint, and the marker that tells the launcher why."""
        self._pending_handover = False
        self.save(trainer, "final")
        if self.settings.state_dir is not None and trainer.is_global_zero:
            self.settings.state_dir.mkdir(parents=True, exist_ok=True)
            why = why_training_ended(trainer)
            (self.settings.state_dir / proto.TRAINING_ENDED_MARKER).write_text(
                f"{self.steps}\n{why}\n"
            )
        self._report(trainer, "profile-done", self.steps, 0.0)
        trainer.should_stop = True

    def _hand_over(self, trainer: pl.Trainer) -> None:
        """The profiling run's checkpoint for the training run, and its end."""
        self._pending_handover = False
        self.save(trainer, "profile-end")
        self._report(trainer, "profile-done", self.steps, 0.0)
        trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer) -> None:
        self.exit_if_preempted()
        self.vote.finish()
        if self._pending_handover:
            # the window ended at the script's last batch: nothing is left to hand over
            self._profiled_to_the_end(trainer)
        if self.settings.mode in proto.RUNNING_MODES:
            mean_step_s = self._mean_step_s(trainer)
            if self._final_saved_at != self.steps:
                self.save(trainer, "final")
            reason = "" if self._target_reached(trainer) else why_training_ended(trainer)
            self._report(trainer, "done", self.steps, mean_step_s, reason=reason)

    def _target_reached(self, trainer: pl.Trainer) -> bool:
        """Whether the launcher's target ended this run (else the script's own rule did)."""
        target = self.settings.target_steps
        if target is not None and self.steps >= target:
            return True
        epochs = self.settings.target_epochs
        return epochs is not None and (
            trainer.current_epoch >= math.ceil(epochs) or self._epochs_reached(trainer)
        )

    def _mean_step_s(self, trainer: pl.Trainer) -> float:
        """Mean step time of this attempt so far, validation passes left out (0 before
        the first step)."""
        steps = self.steps - self._first_step
        if steps <= 0 or self._train_started_at is None:
            return 0.0
        training_s = time.monotonic() - self._train_started_at - self._validation_s
        return max(training_s, 0.0) / steps

    def validation_started(self) -> None:
        """A validation pass begins (not the sanity check): its time is no step's."""
        self._validation_from = self._last_heartbeat = time.monotonic()

    def validation_batch_ended(self, trainer: pl.Trainer) -> None:
        """A heartbeat at most every :data:`PROGRESS_EVERY_S` of a validation pass: a
        pass longer than the launcher's stall timeout is alive, not hung."""
        if self._validation_from is None:
            return  # the sanity check runs before the first progress line: not watched
        now = time.monotonic()
        if now - self._last_heartbeat >= PROGRESS_EVERY_S:
            self._last_heartbeat = now
            self._report(trainer, "validating", self.steps, 0.0)

    def validation_ended(self) -> None:
        if self._validation_from is not None:
            self._validation_s += time.monotonic() - self._validation_from
            self._validation_from = None

    def _arm_stall_dump(self) -> None:
        """(Re)starts the timer after which this process writes every thread's stack to
        stderr (its node log) unless a progress line is due again before.

        The launcher stops a job whose progress lines stopped as hung; the local backend
        asks it for its stacks first (:data:`~lightning_srifty.core.launch_protocol.
        STACK_DUMP_SIGNAL`), a cloud backend cannot reach its processes. ``faulthandler``'s
        timer runs in C, so a rank stuck in native code (a collective that never
        completes) still writes them. Restarting it costs about 0.2 ms (measured), so it
        is restarted at most once a second.
        """
        limit = self.settings.stall_dump_s
        if limit is None or self.settings.mode not in proto.RUNNING_MODES:
            return
        now = time.monotonic()
        if self._stall_dump_armed_at is not None and now - self._stall_dump_armed_at < 1.0:
            return
        import faulthandler

        try:
            faulthandler.dump_traceback_later(limit, repeat=False, file=sys.stderr)
        except (AttributeError, OSError, RuntimeError, ValueError) as exc:  # no usable stderr
            print(f"srifty: stack dumps after {limit:.0f} s of silence unavailable: {exc}",
                  file=sys.stderr)  # fmt: skip
            self.settings = dataclasses.replace(self.settings, stall_dump_s=None)
            return
        self._stall_dump_armed_at = now

    def _disarm_stall_dump(self) -> None:
        if self._stall_dump_armed_at is not None:
            import faulthandler

            faulthandler.cancel_dump_traceback_later()
            self._stall_dump_armed_at = None

    def close(self) -> None:
        self._disarm_stall_dump()
        if self.watcher is not None:
            self.watcher.close()
        if self._undo_quiet is not None:
            self._undo_quiet()
            self._undo_quiet = None
        if self._undo_workers is not None:
            self._undo_workers()
            self._undo_workers = None

    # ------------------------------------------------------------- actions
    def save(self, trainer: pl.Trainer, reason: str) -> str:
        from lightning_srifty.capture.checkpointing import save_to_store

        if not self.writes:
            return ""
        checkpoint_id = save_to_store(trainer, self.store, reason=reason, step=self.steps)
        self._last_ckpt_time = time.monotonic()
        self._last_ckpt_step = self.steps
        self._report(trainer, "checkpoint", self.steps, 0.0, checkpoint=checkpoint_id or "")
        return checkpoint_id or ""

    def _emergency_exit(self, trainer: pl.Trainer) -> None:
        """Saves the step every rank just finished; the process exits at the next hook
        after this batch's own (:meth:`exit_if_preempted`).

        The callback's ``on_train_batch_end`` runs before the LightningModule's and
        Lightning's own end-of-batch work (metrics, loggers); exiting here would skip them
        for a batch the checkpoint counts as done.
        """
        assert self.watcher is not None
        checkpoint_id = self.save(trainer, "emergency")
        # The launcher's evidence first, the words for people after: a node killed in
        # between (its grace spent) still tells the launcher where it saved.
        self._report(trainer, "preempted", self.steps, 0.0, checkpoint=checkpoint_id)
        noticed_at = self.watcher.noticed_at
        why = self.watcher.reason or "a preemption notice on another rank"
        after = "" if noticed_at is None else f", {time.monotonic() - noticed_at:.1f} s after it"
        if trainer.is_global_zero:
            print(
                f"srifty: {why}; emergency checkpoint {checkpoint_id} at step {self.steps}{after}",
                file=sys.stderr,
            )
        self.exit_pending = True

    def exit_if_preempted(self) -> None:
        """Ends the process once an emergency checkpoint is saved (called at the next
        batch start, validation start, epoch end or train end)."""
        if not self.exit_pending:
            return
        from lightning_srifty.capture.preemption import finish_preempted
        from lightning_srifty.capture.workers import stop_workers

        code = finish_preempted(self.settings.state_dir)
        stop_workers()  # os._exit below skips the loaders' own clean-up
        self.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip teardown: the node is going away

    def _report(
        self,
        trainer: pl.Trainer,
        event: str,
        step: int,
        step_s: float,
        checkpoint: str = "",
        allreduce: tuple[tuple[int, float], ...] = (),
        reason: str = "",
    ) -> None:
        self._arm_stall_dump()  # every rank passes here at each line rank zero writes
        path = self.settings.progress_path
        if not trainer.is_global_zero or (path is None and not self.settings.progress_stdout):
            return
        line = ProgressEvent(
            event=event,
            time=time.time(),
            step=step,
            step_s=step_s,
            checkpoint=checkpoint,
            world_size=int(trainer.world_size),
            allreduce=allreduce,
            reason=reason,
        ).to_line()
        if self.settings.progress_stdout:
            print(proto.PROGRESS_LINE_PREFIX + line, flush=True)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
                fh.flush()


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "")
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise ConfigError(f"{name} must be >= 0, got {value}")
    return value


def _float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name, "")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not value > 0:
        raise ConfigError(f"{name} must be > 0, got {value}")
    return value


def _path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name, "")
    return Path(raw) if raw else None


def _batches_done_in_epoch(trainer: pl.Trainer) -> int:
    """Training batches of this epoch done by the time the batch-end hooks run."""
    current = trainer.fit_loop.epoch_loop.batch_progress.current
    return int(getattr(current, "processed", 0))


def _inside_accumulation(trainer: pl.Trainer) -> bool:
    """Whether the batch that just ended left gradients accumulated for an optimizer step
    still to come: Lightning's own rule (a step every ``accumulate_grad_batches`` batches
    of the epoch, and at its last batch), read at the batch-end hooks."""
    return bool(trainer.fit_loop.epoch_loop._should_accumulate())


def _save_waits_for(trainer: pl.Trainer) -> str | None:
    """What a checkpoint taken at the batch that just ended would lose on its resume (in
    words), or ``None`` where it resumes exactly.

    * Inside a gradient-accumulation cycle: a checkpoint holds no accumulated gradient,
      so the resume would lose the cycle's first micro-batches.
    * At an epoch's last batch: the epoch's end (its validation pass, the epoch-end
      hooks, ``ReduceLROnPlateau``) follows the batch; a resumed Lightning skips the
      plateau step it would take there, whose metric the checkpoint does not keep.
    * Before a validation pass due after the batch: a resumed Lightning fast-forwards
      that pass (``increment_progress_to_evaluation_end``), so ``EarlyStopping``,
      ``ReduceLROnPlateau`` and a monitoring ``ModelCheckpoint`` would see one fewer.

    All three are the same on every rank at the same batch (validation by the clock,
    ``val_check_interval`` as a time, is not waited for). A save that waits is taken
    at the next batch end that loses nothing (at most the cycle's remaining batches, or
    one batch after a validation pass or an epoch's end, unless validation follows every
    batch).
    """
    if _inside_accumulation(trainer):
        return "the accumulation cycle's optimizer step"
    epoch_loop = trainer.fit_loop.epoch_loop
    if epoch_loop._num_ready_batches_reached():
        return "the epoch's end"
    fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
    if getattr(trainer, "_val_check_time_interval", None) is not None:
        return None  # validation by the clock: each rank's clock, not a batch all share
    if fetcher is not None and not trainer.should_stop and epoch_loop._should_check_val_fx(fetcher):
        return "the validation pass due after this batch"
    return None


UNRESUMABLE_LOADER_WARNING = "You're resuming from a checkpoint that ended before the epoch ended"
"""The start of Lightning's warning (``training_epoch_loop.reset``) for a mid-epoch
resume whose loaders have no ``state_dict``; the launcher's rebuilt loaders keep their
position in their batch sampler instead."""


def _quiet_unresumable_loader_warning() -> Callable[[], None]:
    """Ignores Lightning's "not resumable" warning until the returned function runs: the
    resume it warns of is exact here, and "unreliable results" would only alarm."""
    import warnings

    from lightning.fabric.utilities.warnings import PossibleUserWarning

    warnings.filterwarnings(
        "ignore", message=re.escape(UNRESUMABLE_LOADER_WARNING), category=PossibleUserWarning
    )
    entry = warnings.filters[0]

    def undo() -> None:
        filters = warnings.filters
        if isinstance(filters, list) and entry in filters:
            filters.remove(entry)  # an "ignore" leaves nothing in the warning caches

    return undo


def _restarted_inside_epoch(trainer: pl.Trainer) -> bool:
    """Whether Lightning restarted this fit inside an epoch or at its end, the restarts
    on which it skips ``on_train_epoch_start``."""
    loop = trainer.fit_loop
    restarts = ("restarted_mid_epoch", "restarted_on_epoch_end")
    return any(bool(getattr(loop, stage, False)) for stage in restarts)


def _replay_epoch_start(trainer: pl.Trainer) -> None:
    """Gives Lightning's epoch-scoped callbacks the epoch start a mid-epoch resume skips.

    Lightning does not call ``on_train_epoch_start`` when it restarts inside an epoch or
    at its end (``fit_loop.restarted_mid_epoch``, ``restarted_on_epoch_end``), and two of
    its own callbacks set there what the rest of the epoch trains with:

    * ``StochasticWeightAveraging`` builds its ``SWALR`` from the checkpoint's state and
      swaps it in; without it the resumed epoch ends with no ``SWALR`` step and the
      learning rate trails the uninterrupted run's by an epoch (measured: every batch
      after the resumed epoch's end differed). Its guards (``_initialized``,
      ``_latest_update_epoch``) keep it from building or averaging twice.
    * ``GradientAccumulationScheduler`` sets the epoch's ``accumulate_grad_batches``;
      without it the resumed epoch accumulates as the Trainer was built (measured: a
      resume in an epoch of 2 stepped every batch). Setting it again changes nothing.

    The launcher's emergency and handover checkpoints are inside epochs, so it replays
    those two hooks at the resumed epoch's first batch (after ``on_train_start``, where
    ``GradientAccumulationScheduler`` checks that the Trainer's own factor is 1). Other
    callbacks' epoch-start hooks ran for this epoch before the checkpoint and are not
    assumed safe to repeat (``BaseFinetuning`` would add its parameter groups twice).
    """
    from lightning.pytorch.callbacks import GradientAccumulationScheduler, StochasticWeightAveraging

    replayed = (StochasticWeightAveraging, GradientAccumulationScheduler)
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(callback, replayed):
            callback.on_train_epoch_start(trainer, trainer.lightning_module)


def _unreplayed_epoch_start_hooks(trainer: pl.Trainer) -> list[str]:
    """The script's own ``on_train_epoch_start`` hooks a resume inside an epoch skips
    (``Module.on_train_epoch_start``, ``Callback.on_train_epoch_start``).

    Lightning's own callbacks are left out: the two that set up the epoch are replayed
    (:func:`_replay_epoch_start`), ``BaseFinetuning`` restores its parameter groups on a
    restart, and the rest only display or log (progress bars, ``LearningRateMonitor``) or
    run before the first epoch (the batch size and learning rate finders).
    """
    from lightning.pytorch.callbacks import Callback

    hooks = []
    module = trainer.lightning_module
    if type(module).on_train_epoch_start is not pl.LightningModule.on_train_epoch_start:
        hooks.append(f"{type(module).__name__}.on_train_epoch_start")
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        kind = type(callback)
        if kind.__module__.startswith(("lightning.", "lightning_srifty.")):
            continue
        if kind.on_train_epoch_start is not Callback.on_train_epoch_start:
            hooks.append(f"{kind.__name__}.on_train_epoch_start")
    return hooks


def _reload_every(trainer: pl.Trainer) -> int:
    """The script's ``reload_dataloaders_every_n_epochs`` (0: it never reloads)."""
    return int(getattr(trainer, "reload_dataloaders_every_n_epochs", 0) or 0)


EPOCH_START_NOTE = (
    "this attempt resumed inside epoch {epoch}, where Lightning does not call "
    "on_train_epoch_start: {hooks} ran for this epoch before the checkpoint and is not "
    "repeated, so what it sets outside the checkpoint (attributes, not the state_dict or "
    "on_save_checkpoint) stays as this process built it until the next epoch"
)
"""Said once per attempt, on rank zero, where the script has such hooks."""

PERSISTENT_WORKERS_NOTE = (
    "DataLoader(persistent_workers=True) over a stream or with in_order=False: a resume "
    "continues at the exact batch, but random draws inside the loader's workers "
    "(augmentations in the dataset) start afresh, because those workers keep their "
    "generators from epoch to epoch; with persistent_workers=False the launcher replays them"
)
"""Said under the launcher for each training loader whose persistent workers' draws a
resume does not replay."""


def time_limit(trainer: pl.Trainer) -> tuple[float, float] | None:
    """``Trainer(max_time=...)`` (Lightning's ``Timer``) and the training time it has
    counted so far, in seconds (``None``: no limit is set)."""
    from lightning.pytorch.callbacks import Timer

    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        remaining = callback.time_remaining() if isinstance(callback, Timer) else None
        if remaining is not None:
            elapsed = float(callback.time_elapsed())
            return elapsed + remaining, elapsed
    return None


def why_training_ended(trainer: pl.Trainer) -> str:
    """The script's own rule that ended training, in words: a stopping callback's message
    (Lightning's ``EarlyStopping`` keeps one), else the limit reached."""
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        message = getattr(callback, "stopping_reason_message", None)
        if isinstance(message, str) and message.strip():
            return f"{type(callback).__name__}: {message.strip()}"
        if int(getattr(callback, "stopped_epoch", 0) or 0) > 0:
            return f"{type(callback).__name__} stopped it at epoch {callback.stopped_epoch}"
    timed = time_limit(trainer)
    if timed is not None and timed[1] >= timed[0]:
        limit, trained = (dt.timedelta(seconds=round(t)) for t in timed)
        return (
            f"its Trainer(max_time={limit}) was reached after {trained} of training "
            "(Lightning's Timer counts every resumed run's time)"
        )
    if trainer.max_epochs is not None and 0 <= trainer.max_epochs <= trainer.current_epoch:
        return f"its Trainer(max_epochs={trainer.max_epochs}) was reached"
    if trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step:
        return f"its Trainer(max_steps={trainer.max_steps}) was reached"
    if trainer.should_stop:
        return "trainer.should_stop was set by the script or one of its callbacks"
    return "its training loop ended"


def _adopt_early_sigterm(trainer: pl.Trainer, watcher: PreemptionWatcher) -> None:
    """Takes over a SIGTERM that Lightning's handler got before the watcher's.

    Lightning installs its handler just before the fit stage and the watcher replaces it
    only at ``on_train_start``: in between come the sanity check and the first epoch's
    DataLoader workers starting (a SIGTERM blocked while they start is delivered right
    after, to Lightning's handler). Left there, it ends the fit with Lightning's
    ``SIGTERMException`` at the first batch and nothing is saved; taken over, the job
    saves its emergency checkpoint at the first step boundary like any other notice.
    """
    connector = getattr(trainer, "_signal_connector", None)
    if connector is not None and getattr(connector, "received_sigterm", False):
        connector.received_sigterm = False
        watcher.notice("SIGTERM (before training started)")


def dump_stacks_on_request() -> None:
    """Writes every thread's stack to stderr (the node's log) on
    :data:`~lightning_srifty.core.launch_protocol.STACK_DUMP_SIGNAL`.

    A job that outlives its revocation's grace is stuck, often in native code where no
    Python handler runs; ``faulthandler`` answers from C. A handler the script (or a
    native library) installed for the same signal is chained, so it still runs; the
    default action is not: ``chain=True`` re-raises the signal to the previous handler,
    and ``SIG_DFL`` for ``SIGUSR2`` ends the process (seen: ``kill -USR2`` on a stuck
    job's ranks dumped their stacks and killed them).
    """
    import faulthandler
    import signal

    signum = getattr(signal, proto.STACK_DUMP_SIGNAL, None)
    if signum is None or not hasattr(faulthandler, "register"):
        return  # not on this platform (Windows)
    previous = signal.getsignal(signum)
    try:
        faulthandler.register(
            signum, all_threads=True, chain=previous not in (signal.SIG_DFL, signal.SIG_IGN)
        )
    except (RuntimeError, ValueError, OSError) as exc:  # no usable stderr, or refused
        print(f"srifty: stack dumps on {proto.STACK_DUMP_SIGNAL} unavailable: {exc}",
              file=sys.stderr)  # fmt: skip
