"""``SriftyCallback``: profile a window of training steps and write one profile.

One line of integration, ``Trainer(callbacks=[SriftyCallback()])``. The callback skips
warm-up steps, counts FLOPs on the last warm-up step (the counter slows that step, so
it is never timed), then times ``profile_steps`` steps (or ``profile_epochs`` epochs).
The profile's timing unit is an optimizer update: with ``accumulate_grad_batches=k`` a
profiled step spans k batches, and the profile records k (the planner prices updates
and reports seconds per batch). Under the launcher the unit of targets, progress and
checkpoints is a batch of the training loop, whatever the optimisation.

* phases from Lightning hooks: forward (batch start → ``on_before_backward``), backward
  (→ ``on_after_backward``, which under DDP includes waiting for the last bucket),
  optimizer (``on_before_optimizer_step`` → batch end) and data wait (previous batch end
  → batch start), summed over a step's micro-batches;
* per layer record: every module that runs in the window, except pure containers
  (``nn.Sequential``), is a record of its own *self* time, so nothing is counted twice
  and a module computing in its own forward (``MultiheadAttention``, a wrapper applying
  ``F.relu``) is covered. Forward self time comes from module pre/post hooks and the
  call stack; backward from *tensor* hooks (on the module's outputs for the start, on
  its parameters, or for parameter-less modules its inputs, for the end), minus the
  records nested inside. Tensor hooks rather than ``register_full_backward_hook``
  because full backward hooks wrap outputs in a view that an in-place op
  (``ReLU(inplace=True)``) may not modify. Every parameter belongs to exactly one
  record (a parameter of a module that never runs, like ``MultiheadAttention``'s
  ``out_proj``, to the record that uses it). FLOPs come from ``FlopCounterMode``'s
  forward counts, resolved to module paths whatever the tracker's naming, with the
  backward counted per record as the weights' and (where needed) the input's gradient;
  blocks follow the model's structure through single-child wrappers (``self.model``);
* under DDP, each bucket's ready time and all-reduce time from a communication hook
  (:mod:`~lightning_srifty.capture.ddp`).

Marks come from a clock: ``time.perf_counter`` on CPU, CUDA events on GPU resolved with
one synchronise per measured step, never per layer. After the window every module and
parameter hook is removed; the DDP hook (which torch cannot remove) turns pass-through.
The warm-up steps after the first and before the FLOP count run with no hook at all and
are timed too; the window's compute is scaled to them
(:func:`~lightning_srifty.capture.timing.hook_overhead_scale`): the hooks' host time is
the profiler's, not the job's. A full garbage collection runs, untimed, before the
hook-free steps and before the window, so a collection the process had due does not
land in a timed step. FLOPs are counted under
:class:`~lightning_srifty.capture.flops.DeviceTolerantFlopCounter`, which keeps a step
that trains without the counter training with it.
Every rank measures; rank zero gathers all ranks and writes the profile.

Later issues hang off :meth:`SriftyCallback._on_window_done` (profile mode: checkpoint
and ``trainer.should_stop = True``) and :meth:`state_dict` (resume without re-profiling).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gc
import inspect
import math
import os
import platform
import statistics
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning
import lightning.pytorch as pl
import psutil
import torch
import torch.distributed as dist
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.hooks import RemovableHandle

from lightning_srifty.capture import ddp
from lightning_srifty.capture.checkpointing import (
    for_this_rank,
    gather_per_rank,
    gather_rng_states,
    restore_rng_state,
    rng_state_for_this_rank,
)
from lightning_srifty.capture.compiled import compiled_frames, describe_compiled, run_eagerly
from lightning_srifty.capture.environment import (
    accelerator_from_device_name,
    detect_placement,
    float32_math,
)
from lightning_srifty.capture.flops import DeviceTolerantFlopCounter
from lightning_srifty.capture.launch_mode import LaunchSession, LaunchSettings, time_limit
from lightning_srifty.capture.loader_load import LoaderMeter
from lightning_srifty.capture.script_facts import facts_for
from lightning_srifty.capture.timing import (
    BucketAccumulator,
    BucketEvent,
    CallSpan,
    LayerAccumulator,
    LayerInfo,
    ModelFacts,
    RankMeasurement,
    StepRecord,
    assign_parameters,
    block_names,
    build_profile,
    exclusive_calls,
    exclusive_nested,
    fold_into_records,
    hook_overhead_scale,
    steps_to_cover,
    without_hook_overhead,
)
from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.launch_protocol import (
    ATTACHED_MARKER,
    ENV_PROFILE_PATH,
    ENV_STATE_DIR,
    MODE_PROFILE,
    SHORT_PROFILE_MARKER,
)
from lightning_srifty.core.profile import DataLoading, Environment, GradParam, Profile
from lightning_srifty.io.profile_io import save_profile

STATE_VERSION = 1


class CpuClock:
    """Host wall clock; marks are ``perf_counter`` floats."""

    def mark(self) -> Any:
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        return float(end - start)

    def sync(self) -> None:
        """Nothing queued on CPU."""


class CudaClock:
    """CUDA events on the current stream; resolve only after :meth:`sync`."""

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1000.0

    def sync(self) -> None:
        torch.cuda.synchronize()


Clock = CpuClock | CudaClock


@dataclass
class _Micro:
    """Marks of one micro-batch (one forward/backward) inside an optimizer step."""

    data_wait_s: float
    start: Any
    before_backward: Any = None
    after_backward: Any = None
    before_optimizer: Any = None
    bwd_start: dict[str, list[Any]] = field(default_factory=dict)
    param_end: dict[str, list[Any]] = field(default_factory=dict)
    """Marks when a module's own parameters got their gradients."""
    input_end: dict[str, list[Any]] = field(default_factory=dict)
    """Marks when a module's inputs got theirs (late when an input is used elsewhere too)."""


@dataclass(frozen=True)
class _Records:
    """The per-layer records of a profile, by module path (``""`` is the LightningModule)."""

    names: tuple[str, ...]
    params: dict[str, tuple[int, int]]
    """``(count, bytes)`` of the parameters each record holds."""
    blocks: dict[str, str]
    display: dict[str, str]
    """Name written to the profile (the root's is its class name)."""


class SriftyCallback(pl.Callback):
    """Profiles a window of training steps and writes ``profile.json`` on rank zero.

    Args:
        warmup_steps: Steps before the window (at least one: the FLOP count runs on
            the last). Those after the first and before the last are timed with no hook
            at all: per-layer hooks cost host time that on a GPU stretched a step of
            many short layers up to 2.4x, so the profile keeps the window's per-layer
            and per-phase shares and takes its compute time from them (3 of the default
            5; fewer than 3 warm-up steps keep the hooked times).
        profile_steps: Steps measured. Ignored when ``profile_epochs`` is set.
        min_measure_s: The hook-free warm-up steps and the window that span less than
            this many seconds run 10x their step count instead (never past half of the
            run): a count of tiny steps is too short a time to measure on a machine
            doing other work. 0 keeps the counts exactly. Every rank follows rank
            zero's decision.
        profile_epochs: Measure until this many epochs have ended after warm-up.
        profile_path: Where to write; ``SRIFTY_PROFILE_PATH`` overrides it (the launcher
            sets it); default ``<default_root_dir>/srifty/profile.json``.
        env: Environment variables to read (default ``os.environ``); injectable so
            tests never depend on the machine's.
        verbose: Print the path once written (rank zero).
    """

    def __init__(
        self,
        warmup_steps: int = 5,
        profile_steps: int = 20,
        profile_epochs: int | None = None,
        min_measure_s: float = 0.5,
        profile_path: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        verbose: bool = True,
    ) -> None:
        if warmup_steps < 0:
            raise ConfigError(f"SriftyCallback: warmup_steps must be >= 0, got {warmup_steps}")
        if profile_epochs is None and profile_steps < 1:
            raise ConfigError(f"SriftyCallback: profile_steps must be >= 1, got {profile_steps}")
        if profile_epochs is not None and profile_epochs < 1:
            raise ConfigError(f"SriftyCallback: profile_epochs must be >= 1, got {profile_epochs}")
        if not min_measure_s >= 0:
            raise ConfigError(f"SriftyCallback: min_measure_s must be >= 0, got {min_measure_s}")
        self.warmup_steps = max(warmup_steps, 1)
        self.profile_steps = profile_steps
        self.min_measure_s = float(min_measure_s)
        self.profile_epochs = profile_epochs
        self._env = dict(os.environ if env is None else env)
        override = self._env.get(ENV_PROFILE_PATH)
        self._explicit_path = (
            Path(override)
            if override
            else (Path(profile_path) if profile_path is not None else None)
        )
        self.verbose = verbose
        self._launch_settings = LaunchSettings.from_env(self._env)
        self._session: LaunchSession | None = None
        self._pending_rng: list[dict[str, Any]] | None = None
        self._training_ended = False
        self.profiled = False
        self.profile: Profile | None = None
        self.written_path: Path | None = None
        self._reset_window()

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Saved in checkpoints so a resumed run does not profile twice.

        Under the launcher it also carries every rank's RNG state (a collective: Lightning
        builds checkpoint state on all ranks), so a resumed run draws the same numbers.
        """
        state: dict[str, Any] = {"state_version": STATE_VERSION, "profiled": self.profiled}
        if self._session is not None:
            state["rng"] = gather_rng_states()
            state["steps"] = self._session.steps
            state["loaders"] = self._session.loader_states()
            # per rank: each rank's workers draw their base seeds from its own generator
            state["worker_bases"] = gather_per_rank(self._session.worker_base_states())
            # per rank: a script may seed each rank's generator its own way
            state["script_generators"] = gather_per_rank(self._session.script_generator_states())
            state["epoch_closed"] = self._session.epoch_closed()
            reload_epoch = self._session.reload_epoch()
            if reload_epoch is not None:
                state["reload_epoch"] = reload_epoch
                # a collective: every rank reloads on the same schedule
                state["reload_rng"] = gather_per_rank(self._session.build_rng)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.profiled = bool(state_dict.get("profiled", False))
        rng = state_dict.get("rng")
        self._pending_rng = list(rng) if isinstance(rng, list) else None
        steps = state_dict.get("steps")
        if self._session is not None and isinstance(steps, int):
            self._session.restored_steps = steps
        loaders = state_dict.get("loaders")
        if self._session is not None and isinstance(loaders, list):
            self._session.pending_loader_states = [x for x in loaders if isinstance(x, dict)]
        bases = state_dict.get("worker_bases")
        if self._session is not None and isinstance(bases, list) and bases:
            mine = for_this_rank(bases)
            self._session.pending_worker_bases = mine if isinstance(mine, list) else None
        generators = state_dict.get("script_generators")
        if self._session is not None and isinstance(generators, list) and generators:
            mine = for_this_rank(generators)
            self._session.pending_script_generators = mine if isinstance(mine, list) else None
        reload_epoch = state_dict.get("reload_epoch")
        if self._session is not None and isinstance(reload_epoch, int):
            self._session.restored_reload_epoch = reload_epoch
            reload_rng = state_dict.get("reload_rng")
            if isinstance(reload_rng, list) and reload_rng:
                self._session.restored_build_rng = rng_state_for_this_rank(reload_rng)
        if self._session is not None and state_dict.get("epoch_closed") is True:
            # Saved after an epoch's last batch: the uninterrupted run drew the next
            # epoch's loader seeds from this state when it created their iterators, which
            # a resumed Lightning does before ``on_train_start``; restore it before then.
            self._session.before_training_loaders = self._restore_rng

    def _restore_rng(self) -> None:
        """Sets this rank's generators from the checkpoint, once."""
        pending, self._pending_rng = self._pending_rng, None
        state = rng_state_for_this_rank(pending) if pending else None
        if state is not None:
            restore_rng_state(state)

    def _reset_window(self) -> None:
        self._clock: Clock = CpuClock()
        self._seen_steps = 0
        """Optimizer steps completed so far (warm-up included)."""
        self._micro_in_step = 0
        """Micro-batches of the optimizer step under way (``accumulate_grad_batches``)."""
        self._global_step_at_start = 0
        self._window_global_step = 0
        """Lightning's optimizer steps when the window started (it counts each optimizer
        a manual ``training_step`` steps)."""
        self._epochs_in_window = 0
        self._compute_from: tuple[float, float] | None = None
        """(this thread's CPU time, wall time) when the batch under way started computing."""
        self._compute_cpu_s = 0.0
        self._compute_wall_s = 0.0
        """CPU and wall time of the window's batches from start to end (data waits out)."""
        self._sched_from: tuple[float, float] | None = None
        self._compute_oncpu_s = 0.0
        self._compute_queued_s = 0.0
        """The kernel's account of the same spans: on a core, and runnable but waiting for
        one (:func:`_scheduler_times`); blocked time (sleeps, I/O) is in neither."""
        self._host_share: dict[str, float] | None = None
        self._validation_batch_s: list[float] = []
        """Validation batches timed before the profile, each with its fetch (each pass's
        first batch left out: it warms up)."""
        self._validation_overhead_s: list[float] = []
        """Each timed pass's time outside its batches (loader start, epoch-end logging)."""
        self._validation_marks: list[float] | None = None
        """The pass under way: its start, then each batch's start and end."""
        self._measuring = False
        self._in_step = False
        self._loader_meter = LoaderMeter()
        self._data_loading: DataLoading | None = None
        self._handles: list[RemovableHandle] = []
        self._hookless_params: list[torch.Tensor] = []
        self._recorder: ddp.BucketRecorder | None = None
        self._flop_mode: FlopCounterMode | None = None
        self._end_eager: Callable[[], None] = _nothing
        """Ends the FLOP count's eager stance (:func:`~lightning_srifty.capture.compiled.
        run_eagerly`)."""
        self._module_flops: dict[str, float] = {}
        """Forward FLOPs per module, exclusive of the modules below it."""
        self._flop_forward: dict[str, float] = {}
        self._flop_mark: dict[str, float] | None = None
        self._grad_input: set[str] = set()
        """Modules called with an input that needs a gradient (their backward computes it)."""
        self._flops_per_step = 0.0
        self._forward_only_flops = False
        self._modules: dict[str, torch.nn.Module] = {}
        self._containers: set[str] = set()
        self._ran: list[str] = []
        self._ran_set: set[str] = set()
        self._activation_bytes: dict[str, int] = {}
        self._seen_outputs: dict[int, weakref.ref[torch.Tensor]] = {}
        """Outputs already counted this micro-batch (by id, checked alive: ids recycle)."""
        self._layers = LayerAccumulator()
        self._buckets = BucketAccumulator()
        self._steps: list[StepRecord] = []
        self._micro_counts: list[int] = []
        self._peak_bytes = 0
        self._local_batch_size = 1
        self._last_end_host: float | None = None
        self._micros: list[_Micro] = []
        self._calls: list[list[Any]] = []
        """This step's module calls: ``[name, parent index, start mark, end mark]``."""
        self._stack: list[int] = []
        self._end_mark: Any = None
        self._hooked_spans: list[float] = []
        """Each measured step's span from its first batch start to its end (hooked)."""
        self._clean_start: Any = None
        self._clean_marks: list[tuple[Any, Any]] = []
        self._flop_step = self.warmup_steps - 1
        """The update whose FLOPs are counted (moved once by :meth:`_extension`); the
        window starts on the next."""
        self._window_goal = self.profile_steps
        self._compiled = ""
        """What in the step is ``torch.compile``'d, in words (:mod:`~lightning_srifty.
        capture.compiled`): its layers are not hooked and the step is timed whole."""
        self._frames_at_start = 0
        self._frames_at_step = 0
        self._compiling_steps: set[int] = set()
        """Window steps (indices into ``_steps``) during which something compiled."""
        self._synced_logs: list[str] = []
        """Each value the FLOP count's step logged every step with ``sync_dist=True``."""
        self._log_wrapper: Callable[..., None] | None = None

    # ------------------------------------------------------------ lightning
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Tells the launcher (if any) that the script really uses this callback."""
        state_dir = self._env.get(ENV_STATE_DIR)
        if stage == "fit" and state_dir and trainer.is_global_zero:
            Path(state_dir).mkdir(parents=True, exist_ok=True)
            (Path(state_dir) / ATTACHED_MARKER).touch()
        if stage == "fit" and self._launch_settings is not None and self._session is None:
            self._session = LaunchSession(self._launch_settings)
            self._session.setup(trainer)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._session is not None:
            # Last, after every restore step, so nothing draws in between (unless the
            # checkpoint closed its epoch: then it was restored before the loaders).
            self._restore_rng()
            self._session.on_train_start(trainer)
        if self.profiled:
            return
        self._clock = CudaClock() if pl_module.device.type == "cuda" else CpuClock()
        self._modules = dict(pl_module.named_modules())
        self._containers = {n for n, m in self._modules.items() if _is_container(m)}
        self._compiled = describe_compiled(pl_module)
        self._frames_at_start = compiled_frames()
        model = trainer.strategy.model
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            recorder = ddp.BucketRecorder(mark=self._clock.mark, process_group=model.process_group)
            if ddp.attach(model, recorder):
                self._recorder = recorder

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._session is not None:
            self._session.exit_if_preempted()
            self._session.before_batch(trainer)
        if self.profiled:
            return
        now = time.perf_counter()
        data_wait = now - self._last_end_host if self._last_end_host is not None else 0.0
        if self._micro_in_step == 0:
            # The first micro-batch of an optimizer update: warm-up, FLOPs and window
            # boundaries are counted in updates, whatever the accumulation.
            self._global_step_at_start = int(trainer.global_step)
            if self._seen_steps in (1, self._flop_step + 1):
                _collect_garbage_untimed()
            if 1 <= self._seen_steps < self._flop_step:
                # Warm (not the first step) and hook-free (not the FLOP count's step).
                self._clean_start = self._clock.mark()
            if self._seen_steps == self._flop_step:
                self._end_eager = run_eagerly()
                self._flop_mode = DeviceTolerantFlopCounter(display=False)
                self._flop_mode.__enter__()
                self._flop_forward = {}
                self._detect_compiled()
                if self._compiled:
                    self._hook_activations()
                self._count_synced_logs(trainer, pl_module)
            if self._seen_steps == self._flop_step + 1:
                self._window_global_step = int(trainer.global_step)
                self._start_window(pl_module, batch)
                self._loader_meter.start(trainer)
            if self._measuring:
                self._micros, self._calls, self._stack = [], [], []
                self._frames_at_step = compiled_frames()
                if self._recorder is not None:
                    self._recorder.take()
        self._micro_in_step += 1
        if self._flop_mode is not None:
            self._flop_mark = _flop_totals(self._flop_mode)
            self._seen_outputs = {}
        if self._measuring:
            self._loader_meter.observe(trainer, batch_idx)
            self._in_step = True
            self._seen_outputs = {}
            self._compute_from = (time.thread_time(), time.perf_counter())
            self._sched_from = _scheduler_times()
            self._micros.append(_Micro(data_wait_s=data_wait, start=self._clock.mark()))

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        if self._flop_mode is not None and self._flop_mark is not None:
            # Forward counts only: the module tracker follows the forward exactly, but in
            # backward it keeps a module open until all its inputs' gradients are summed,
            # which double-counts when an input feeds several modules.
            for key, total in _flop_totals(self._flop_mode).items():
                done = total - self._flop_mark.get(key, 0.0)
                self._flop_forward[key] = self._flop_forward.get(key, 0.0) + done
            self._flop_mark = None
        if self._measuring and self._micros and self._micros[-1].before_backward is None:
            self._micros[-1].before_backward = self._clock.mark()

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._measuring and self._micros:
            self._micros[-1].after_backward = self._clock.mark()

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        self._stop_flop_count(pl_module)
        if self._measuring and self._micros and self._micros[-1].before_optimizer is None:
            self._micros[-1].before_optimizer = self._clock.mark()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self._session is not None:
            self._session.after_step(trainer)
        if self.profiled:
            return
        # An optimizer step ended with this micro-batch (Lightning also steps on the last
        # batch of an epoch that does not fill an accumulation cycle).
        stepped = (
            int(trainer.accumulate_grad_batches) <= 1
            or int(trainer.global_step) > self._global_step_at_start
        )
        if stepped and self._clean_start is not None:
            self._clean_marks.append((self._clean_start, self._clock.mark()))
            self._clean_start = None
            if len(self._clean_marks) == self.warmup_steps - 2:  # the configured count
                self._clock.sync()
                spans = [self._clock.seconds(a, b) for a, b in self._clean_marks]
                self._flop_step += self._extension(trainer, spans)
        self._last_end_host = time.perf_counter()
        if self._compute_from is not None:
            cpu0, wall0 = self._compute_from
            self._compute_cpu_s += time.thread_time() - cpu0
            self._compute_wall_s += self._last_end_host - wall0
            self._compute_from = None
            sched, self._sched_from = _scheduler_times(), self._sched_from
            if sched is not None and self._sched_from is not None:
                self._compute_oncpu_s += sched[0] - self._sched_from[0]
                self._compute_queued_s += sched[1] - self._sched_from[1]
        if not stepped:
            self._in_step = False
            return
        self._stop_flop_count(pl_module)
        if self._measuring:
            self._end_mark = self._clock.mark()
            self._in_step = False
            self._finish_step()
            if compiled_frames() != self._frames_at_step:
                self._compiling_steps.add(len(self._steps) - 1)
            if self.profile_epochs is None:
                if len(self._steps) == self.profile_steps:  # the configured count
                    self._window_goal += self._extension(trainer, self._hooked_spans)
                if len(self._steps) >= self._window_goal:
                    self._end_window(trainer, pl_module)
        self._seen_steps += 1
        self._micro_in_step = 0
        self._last_end_host = time.perf_counter()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._session is not None:
            self._session.exit_if_preempted()  # no validation on a node going away
            if not trainer.sanity_checking:
                self._session.validation_started()
        # passes before the profile are timed (the window's hooks would slow them)
        timed = not self.profiled and not self._measuring
        self._validation_marks = [time.perf_counter()] if timed else None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._session is not None and not trainer.sanity_checking:
            self._session.validation_ended()
        now = time.perf_counter()
        if self._validation_marks is not None:
            self._time_validation_pass(self._validation_marks, now)
            self._validation_marks = None
        if self._last_end_host is not None:
            # the next batch's data wait starts here: a pass is not the loader's time
            self._last_end_host = now

    def on_validation_batch_start(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._validation_marks is not None:
            self._validation_marks.append(time.perf_counter())

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._session is not None:
            self._session.validation_batch_ended(trainer)
        if self._validation_marks is None:
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self._validation_marks.append(time.perf_counter())

    def _time_validation_pass(self, marks: list[float], end: float) -> None:
        """A pass's cost per batch (the batch and the fetch before it, the first batch
        left out: it warms up) and its cost outside the batches (its loader's start
        before the first fetch, the epoch-end logging after the last batch)."""
        starts, ends = marks[1::2], marks[2::2]
        if len(starts) < 2 or len(ends) != len(starts):
            return
        fetch = [starts[i] - ends[i - 1] for i in range(1, len(starts))]
        self._validation_batch_s.extend(
            ends[i] - starts[i] + fetch[i - 1] for i in range(1, len(starts))
        )
        setup = max(starts[0] - marks[0] - statistics.median(fetch), 0.0)
        self._validation_overhead_s.append(setup + end - ends[-1])

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._session is not None:
            self._session.exit_if_preempted()
            self._session.on_train_epoch_end(trainer)
        if self._measuring and self.profile_epochs is not None:
            self._epochs_in_window += 1
            if self._epochs_in_window >= self.profile_epochs:
                self._end_window(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Training ended inside the window: keep what was measured rather than nothing."""
        self._stop_flop_count(pl_module)
        if self._measuring:
            self._training_ended = True  # the script's Trainer stopped, not the window
            self._end_window(trainer, pl_module)
        state_dir = self._env.get(ENV_STATE_DIR)
        profiling = self._launch_settings is None or self._launch_settings.mode == MODE_PROFILE
        if state_dir and profiling and self.written_path is None and trainer.is_global_zero:
            (Path(state_dir) / SHORT_PROFILE_MARKER).write_text(self._too_short(trainer) + "\n")
        if self._session is not None:
            self._session.on_train_end(trainer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The fit ended normally: let the gloo group go before the interpreter does."""
        if dist.is_available() and dist.is_initialized():
            ddp.release_gloo_group_at_exit()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._stop_flop_count(pl_module)
        self._remove_hooks()

    def _too_short(self, trainer: pl.Trainer) -> str:
        """Why training ended before the window: the batches run against those needed,
        and the script's own limit that stopped it (the launcher never lifts them)."""
        ran = int(trainer.fit_loop.total_batch_idx) + 1
        if self.profile_epochs is None:
            window = f"{self.warmup_steps + self.profile_steps} batches"
        else:
            window = f"{self.warmup_steps} batches and {self.profile_epochs} epochs"
        plural = "es" if ran != 1 else ""
        why = [f"training ended after {ran} batch{plural}, before the profiling window ({window})"]
        limits = []
        if trainer.max_steps is not None and trainer.max_steps >= 0:
            limits.append(f"max_steps={trainer.max_steps}")
        if trainer.max_epochs is not None and trainer.max_epochs >= 0:
            per_epoch = trainer.num_training_batches
            each = ""
            if isinstance(per_epoch, int):
                each = f" with {per_epoch} batch{'es' if per_epoch != 1 else ''} an epoch"
            limits.append(f"max_epochs={trainer.max_epochs}{each}")
        if limits:
            why.append(f"the script's own Trainer({', '.join(limits)}) stopped it")
        return "; ".join(why)

    # -------------------------------------------------------------- window
    def _start_window(self, pl_module: pl.LightningModule, batch: Any) -> None:
        try:
            self._local_batch_size = int(extract_batch_size(batch))
        except (MisconfigurationException, RecursionError, TypeError):
            self._local_batch_size = 1
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        self._detect_compiled()
        if self._compiled:
            self._note_compiled(pl_module)
        hooked: set[int] = set()
        for name, module in {} if self._compiled else self._modules.items():
            # Every module, not only leaves: a module that computes in its own forward
            # (MultiheadAttention, a wrapper applying F.relu) gets its self time.
            self._handles.append(module.register_forward_pre_hook(self._pre_forward_hook(name)))
            self._handles.append(module.register_forward_hook(self._forward_hook(name)))
            for param in module.parameters(recurse=False):
                if param.requires_grad and id(param) not in hooked:
                    hooked.add(id(param))
                    if param._backward_hooks is None:
                        self._hookless_params.append(param)
                    self._handles.append(param.register_hook(self._grad_end_hook(name, True)))
        if self._recorder is not None:
            self._recorder.active = True
        self._compute_cpu_s = self._compute_wall_s = 0.0
        self._compute_oncpu_s = self._compute_queued_s = 0.0
        self._measuring = True

    def _detect_compiled(self) -> None:
        """Compiled code the modules did not show: something compiled since training began."""
        if not self._compiled and compiled_frames() > self._frames_at_start:
            self._compiled = "the training step runs torch.compile'd code"

    def _hook_activations(self) -> None:
        """Counts a compiled model's activations in the FLOP count's step, which runs
        eagerly (:func:`~lightning_srifty.capture.compiled.run_eagerly`), so the hooks
        reach no graph: the memory model needs them where no CUDA peak is measured."""
        for name, module in self._modules.items():
            if name not in self._containers:
                self._handles.append(module.register_forward_hook(self._activation_hook(name)))

    def _activation_hook(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            self._count_activations(name, output)

        return hook

    def _count_activations(self, name: str, output: Any) -> None:
        """Activations once, by the module that produced them (not again by wrappers)."""
        fresh = [t for t in _tensors(output) if not self._seen(t)]
        self._seen_outputs.update((id(t), weakref.ref(t)) for t in fresh)
        self._activation_bytes[name] = sum(t.numel() * t.element_size() for t in fresh)

    def _count_synced_logs(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Lists the FLOP count's step's values logged every step with ``sync_dist=True``.

        Under DDP Lightning all-reduces each on every step (``_ResultMetric.update``
        calls ``meta.sync`` for ``on_step`` values; measured with 2 gloo processes: one
        ``all_reduce`` a step per such value, none for ``on_epoch``-only ones, unsynced
        ones or ``rank_zero_only`` ones). A one-process run pays nothing, and Lightning
        drops the request there (``LightningModule.log``: ``sync_dist and ...
        is_distributed``), so the request is read as the script makes it: ``log`` is
        wrapped for this step, which runs eagerly, so a compiled step is not retraced.
        The level (``on_step``) is Lightning's own resolution, read back after the call.
        """
        original = pl_module.log
        signature = inspect.signature(original)

        def log(*args: Any, **kwargs: Any) -> None:
            original(*args, **kwargs)
            try:
                asked = signature.bind(*args, **kwargs).arguments
            except TypeError:
                return
            if not asked.get("sync_dist") or asked.get("rank_zero_only"):
                return
            key = f"{getattr(pl_module, '_current_fx_name', '')}.{asked.get('name')}"
            results = getattr(trainer, "_results", None)
            metric = results.get(key) if isinstance(results, Mapping) else None
            if getattr(getattr(metric, "meta", None), "on_step", False):
                self._synced_logs.append(key)

        pl_module.log = self._log_wrapper = log  # type: ignore[method-assign]

    def _note_compiled(self, pl_module: pl.LightningModule) -> None:
        if self.verbose and pl_module.global_rank == 0:
            print(
                f"srifty: {self._compiled}, so layers are not timed one by one (hooks would "
                "split its graphs and recompile them); each step is timed whole",
                flush=True,
            )

    def _pre_forward_hook(self, name: str) -> Any:
        container = name in self._containers

        def hook(module: torch.nn.Module, args: Any) -> None:
            if not self._in_step:
                return
            if name not in self._ran_set:
                self._ran_set.add(name)
                self._ran.append(name)
            parent = self._stack[-1] if self._stack else -1
            self._stack.append(len(self._calls))
            self._calls.append([name, parent, self._clock.mark(), None])
            if container:
                return
            for tensor in _tensors(args):
                if tensor.requires_grad:
                    self._grad_input.add(name)
                    tensor.register_hook(self._grad_end_hook(name, False))

        return hook

    def _forward_hook(self, name: str) -> Any:
        container = name in self._containers

        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if not self._in_step or not self._stack:
                return
            call = self._calls[self._stack.pop()]
            call[3] = self._clock.mark()
            if container:
                return
            self._count_activations(name, output)
            for tensor in _tensors(output):
                if tensor.requires_grad:
                    tensor.register_hook(self._grad_start_hook(name))

        return hook

    def _seen(self, tensor: torch.Tensor) -> bool:
        ref = self._seen_outputs.get(id(tensor))
        return ref is not None and ref() is tensor

    def _grad_start_hook(self, name: str) -> Any:
        def hook(grad: torch.Tensor) -> None:
            if self._micros:
                self._micros[-1].bwd_start.setdefault(name, []).append(self._clock.mark())

        return hook

    def _grad_end_hook(self, name: str, parameter: bool) -> Any:
        def hook(grad: torch.Tensor) -> None:
            if self._in_step and self._micros:
                micro = self._micros[-1]
                ends = micro.param_end if parameter else micro.input_end
                ends.setdefault(name, []).append(self._clock.mark())

        return hook

    def _finish_step(self) -> None:
        """Resolves this optimizer step's marks into durations (one synchronise on CUDA).

        With gradient accumulation a step spans several micro-batches: forward and
        backward add up over them, the optimizer runs once, and under DDP the buckets
        are all-reduced in the last micro-batch's backward only.
        """
        clock, micros, end = self._clock, self._micros, self._end_mark
        clock.sync()
        forward = exclusive_calls(
            [
                CallSpan(name, parent, max(clock.seconds(a, b), 0.0) if b is not None else 0.0)
                for name, parent, a, b in self._calls
            ]
        )
        backward: dict[str, float] = {}
        forward_s = backward_s = data_wait_s = 0.0
        last_layer_end = 0.0
        for micro in micros:
            before_bwd = micro.before_backward or micro.start
            after_bwd = micro.after_backward or before_bwd
            forward_s += max(clock.seconds(micro.start, before_bwd), 0.0)
            backward_s += max(clock.seconds(before_bwd, after_bwd), 0.0)
            data_wait_s += micro.data_wait_s
            spans: dict[str, float] = {}
            last_layer_end = 0.0
            params = _resolve(clock, before_bwd, micro.param_end)
            inputs = _resolve(clock, before_bwd, micro.input_end)
            for name, starts in micro.bwd_start.items():
                span, finish = _backward_span(
                    name, sorted(clock.seconds(before_bwd, m) for m in starts), params, inputs
                )
                spans[name] = span
                last_layer_end = max(last_layer_end, finish)
            for name, value in exclusive_nested(spans).items():
                backward[name] = backward.get(name, 0.0) + value
        first, last = micros[0], micros[-1]
        before_bwd = last.before_backward or last.start
        after_bwd_s = clock.seconds(before_bwd, last.after_backward or before_bwd)
        before_opt = last.before_optimizer or last.after_backward or before_bwd
        bucket_events = []
        last_done = 0.0
        for raw in self._recorder.take() if self._recorder is not None else []:
            ready = clock.seconds(before_bwd, raw.ready_mark)
            done = clock.seconds(before_bwd, raw.done_mark) if raw.done_mark is not None else ready
            last_done = max(last_done, done)
            bucket_events.append(
                BucketEvent(raw.index, raw.bytes, raw.num_params, max(ready, 0.0), done - ready)
            )
        exposed = max(min(last_done, after_bwd_s) - last_layer_end, 0.0) if bucket_events else 0.0
        self._layers.add_step(forward, backward)
        self._buckets.add_step(bucket_events)
        self._micro_counts.append(len(micros))
        self._steps.append(
            StepRecord(
                step_s=first.data_wait_s + clock.seconds(first.start, end),
                forward_s=forward_s,
                backward_s=backward_s,
                optimizer_s=max(clock.seconds(before_opt, end), 0.0),
                data_wait_s=data_wait_s,
                allreduce_s=sum(e.allreduce_s for e in bucket_events),
                exposed_comm_s=exposed,
            )
        )
        self._peak_bytes = max(self._peak_bytes, psutil.Process().memory_info().rss)
        self._hooked_spans.append(clock.seconds(first.start, end))

    def _stop_flop_count(self, pl_module: pl.LightningModule) -> None:
        if self._flop_mode is None:
            return
        mode, self._flop_mode = self._flop_mode, None
        mode.__exit__(None, None, None)
        if self._compiled:
            self._remove_hooks()  # the activation counters
        if self._log_wrapper is not None and vars(pl_module).get("log") is self._log_wrapper:
            del pl_module.log  # the class's own again (:meth:`_count_synced_logs`)
        self._log_wrapper = None
        self._end_eager()
        self._end_eager = _nothing
        counts = {k: float(sum(v.values())) for k, v in mode.get_flop_counts().items()}
        self._flops_per_step = float(mode.get_total_flops())
        forward = self._flop_forward or counts
        names = _tracker_names(forward, pl_module)
        self._module_flops = exclusive_nested(
            {names[key]: value for key, value in forward.items() if key in names}
        )
        self._forward_only_flops = bool(self._flop_forward)

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        # An emptied hook dict still costs autograd a Python call per parameter per step;
        # None (the state before us) removes the C++ pre-hook that walks it.
        for param in self._hookless_params:
            if not param._backward_hooks:
                param._backward_hooks = None
        self._hookless_params = []
        if self._recorder is not None:
            self._recorder.active = False
        self._in_step = False

    def _records(self, pl_module: pl.LightningModule) -> _Records:
        """Which modules are per-layer records, and the parameters each one holds.

        A record is a module that ran in the window (not a pure container such as
        ``nn.Sequential``), plus any module owning parameters with no record above it
        (the LightningModule itself, say). Every parameter belongs to exactly one.
        A compiled model has none: its layers were not timed.
        """
        if self._compiled:
            return _Records(names=(), params={}, blocks={}, display={})
        ran = [n for n in self._ran if n and n not in self._containers]
        owners: list[tuple[str, int, int]] = []
        seen: set[int] = set()
        for name, module in self._modules.items():
            for param in module.parameters(recurse=False):
                if id(param) not in seen:
                    seen.add(id(param))
                    owners.append((name, param.numel(), param.numel() * param.element_size()))
        params, added = assign_parameters(owners, ran)
        names = [*ran, *added]
        root = type(pl_module).__name__
        return _Records(
            names=tuple(names),
            params=params,
            blocks=block_names(names),
            display={n: (n or root) for n in names},
        )

    def _extension(self, trainer: pl.Trainer, spans: list[float]) -> int:
        """Extra steps for the phase just counted, the same on every rank (rank zero's).

        The room keeps the whole profile within the first half of the run, so a short
        run still trains after it and a run that ends early still gets its window.
        """
        window = self._window_goal if self.profile_epochs is None else 0
        planned_end = self._flop_step + 1 + window
        room = self._updates_in_run(trainer) // 2 - planned_end
        extra = steps_to_cover(spans, self.min_measure_s, max(room, 0))
        return int(trainer.strategy.broadcast(extra, src=0))

    def _updates_in_run(self, trainer: pl.Trainer) -> float:
        """Optimizer updates this run will make (``inf`` when unbounded, 0 if unknown).

        The trainer's own limits, and under the launcher the job's target too (in
        batches; the profiling run is told the whole job's), which stops it first.
        Lightning counts ``global_step`` per optimizer a manual ``training_step`` steps,
        so its estimate is converted by the ratio seen so far.
        """
        try:
            total = float(trainer.estimated_stepping_batches)
        except (MisconfigurationException, RuntimeError, TypeError, ValueError):
            return 0.0
        # a stream (an IterableDataset) has no length: Lightning answers max_steps, -1
        # when unset, and only the job's own length in steps can bound the run
        unknown = total < 0
        if unknown:
            total = math.inf
        updates_done = self._seen_steps + 1
        per_update = max(int(trainer.global_step), 1) / updates_done
        total /= max(per_update, 1.0)
        if self._session is not None:
            settings = self._session.settings
            batches_per_update = max(int(trainer.accumulate_grad_batches), 1)
            epoch_batches = trainer.num_training_batches
            for steps in (settings.target_steps, settings.job_steps):
                if steps is not None:
                    total = min(total, steps / batches_per_update)
            for epochs in (settings.target_epochs, settings.job_epochs):
                if epochs is not None and isinstance(epoch_batches, int):
                    total = min(total, epochs * epoch_batches / batches_per_update)
        return 0.0 if unknown and math.isinf(total) else total

    def _end_window(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Builds the profile from every rank's window, timed as the run trains."""
        self._host_share = self._measured_host_share(pl_module)
        self._data_loading = self._loader_meter.finish(trainer)
        self._remove_hooks()
        self._measuring = False
        if pl_module.device.type == "cuda":
            self._peak_bytes = int(torch.cuda.max_memory_allocated(pl_module.device))
        self.profiled = True
        self._clock.sync()
        clean = [self._clock.seconds(a, b) for a, b in self._clean_marks]
        scale = hook_overhead_scale(self._hooked_spans, clean)
        records = self._records(pl_module)
        means = self._layers.means()
        forward = fold_into_records({n: f for n, (f, _) in means.items()}, records.names)
        backward = fold_into_records({n: b for n, (_, b) in means.items()}, records.names)
        # Steps that compiled are left out (all kept if every step did): the same count
        # on every rank, since each rank measured the same window.
        timed = [s for i, s in enumerate(self._steps) if i not in self._compiling_steps]
        mine = RankMeasurement(
            rank=trainer.global_rank,
            steps=tuple(timed or self._steps),
            layers={
                records.display[n]: (forward.get(n, 0.0), backward.get(n, 0.0))
                for n in records.names
            },
            buckets=self._buckets.buckets(),
            peak_memory_bytes=self._peak_bytes,
        )
        measurements = _gather(without_hook_overhead(mine, scale), trainer.world_size)
        if trainer.global_rank == 0:
            facts = self._facts(trainer, pl_module, records)
            if clean and self._hooked_spans:
                facts = dataclasses.replace(
                    facts,
                    hooks={
                        "scale": round(scale, 4),
                        "hooked_span_s": statistics.median(self._hooked_spans),
                        "clean_span_s": statistics.median(clean),
                        "clean_steps": float(len(clean)),
                    },
                )
            profile = build_profile(measurements, facts)
            path = self._output_path(trainer)
            self.profile = profile
            self.written_path = save_profile(profile, path)
            if self.verbose:
                print(f"srifty: profile written to {self.written_path}", flush=True)
        self._on_window_done(trainer, pl_module)

    def _measured_host_share(self, pl_module: pl.LightningModule) -> dict[str, float] | None:
        """How much of a core the process got while it computed (CPU profiles only).

        Over the window's batches, from each batch's start to its end (data waits, with
        their loading in this process, left out), the training thread's time on a core
        over its time on a core or waiting in the run queue, as the kernel counts them
        (``/proc/thread-self/schedstat``): 1 on an idle machine, less when other work
        shared the cores. A step that blocks (a sleep, a read, a lock) is not denied a
        core while it blocks: CPU seconds per wall second read a 24 ms step that sleeps
        20 ms as 17 % of a core, and the local run was predicted at 10 ms. Where the
        kernel keeps no such account, the thread's CPU seconds per wall second. With the
        account, ``blocked_share`` is the rest of the spans' wall time: the part of a
        step that shared cores do not lengthen.
        A local run of several processes is predicted from it (the launcher measures the
        share its processes get, :func:`~lightning_srifty.launch.local_backend.
        cpu_share_now`), so a profile taken while others used the cores is not
        mistaken for slow work, nor a run among them for fast.
        """
        if pl_module.device.type != "cpu" or self._compute_wall_s <= 0.0:
            return None
        runnable = self._compute_oncpu_s + self._compute_queued_s
        if runnable > 0.0:
            share = self._compute_oncpu_s / runnable
        else:
            share = self._compute_cpu_s / self._compute_wall_s
        host = {
            "cpu_share": round(share, 4),
            "intra_op_threads": float(torch.get_num_threads()),
        }
        if runnable > 0.0:
            # neither on a core nor queued: blocked, which shared cores do not lengthen
            blocked = max(self._compute_wall_s - runnable, 0.0) / self._compute_wall_s
            host["blocked_share"] = round(min(blocked, 1.0), 4)
        return host

    def _on_window_done(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Under the launcher's profile mode: checkpoint here, then stop cleanly."""
        if self._session is not None:
            self._session.on_profile_done(trainer, training_ended=self._training_ended)

    def _output_path(self, trainer: pl.Trainer) -> Path:
        if self._explicit_path is not None:
            return self._explicit_path
        return Path(trainer.default_root_dir) / "srifty" / "profile.json"

    # --------------------------------------------------------------- facts
    def _facts(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, records: _Records
    ) -> ModelFacts:
        flops = fold_into_records(self._module_flops, records.names)
        if self._forward_only_flops:
            # Backward repeats each op once for the weights' gradients and once for the
            # input's, when they need one (the first layer's input does not).
            flops = {
                n: f * (1 + (records.params.get(n, (0, 0))[0] > 0) + (n in self._grad_input))
                for n, f in flops.items()
            }
        activations = fold_into_records(
            {n: float(b) for n, b in self._activation_bytes.items()}, records.names
        )
        layers = tuple(
            LayerInfo(
                name=records.display[n],
                block=records.display.get(records.blocks[n], records.blocks[n]),
                module_type=type(self._modules[n]).__name__,
                param_count=records.params.get(n, (0, 0))[0],
                param_bytes=records.params.get(n, (0, 0))[1],
            )
            for n in records.names
        )
        gradients = tuple(
            GradParam(
                name=name,
                numel=p.numel(),
                dtype=str(p.dtype).removeprefix("torch."),
                bytes=p.numel() * p.element_size(),
            )
            for name, p in pl_module.named_parameters()
            if p.requires_grad
        )
        param_bytes = sum(p.numel() * p.element_size() for p in pl_module.parameters())
        model = trainer.strategy.model
        backend = None
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            backend = str(dist.get_backend(model.process_group))
        micro = int(trainer.accumulate_grad_batches)
        return ModelFacts(
            model_name=type(pl_module).__name__,
            environment=self._environment(trainer, pl_module),
            layers=layers,
            gradients=gradients,
            param_bytes=param_bytes,
            layer_flops={records.display[n]: v for n, v in flops.items()},
            layer_activation_bytes={records.display[n]: int(v) for n, v in activations.items()},
            flops_per_step=self._flops_per_step,
            optimizer_state_bytes=_optimizer_state_bytes(trainer.optimizers),
            peak_kind="cuda_max_allocated" if pl_module.device.type == "cuda" else "cpu_rss",
            warmup_steps=self._flop_step + 1,
            comm_backend=backend,
            created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            dataset_size=_samples_per_epoch(trainer, self._local_batch_size),
            validation=_validation_facts(
                trainer, self._validation_batch_s, self._validation_overhead_s
            ),
            trainer_limits=_trainer_limits(
                trainer,
                micro,
                int(trainer.global_step) - self._window_global_step,
                sum(self._micro_counts),
            ),  # fmt: skip
            script=facts_for(trainer),
            host_share=self._host_share,
            compiled=(
                {"what": self._compiled, "steps_left_out": len(self._compiling_steps)}
                if self._compiled
                else None
            ),
            # no layer records to carry them: the total the eager FLOP step counted
            activation_bytes=sum(self._activation_bytes.values()) if self._compiled else None,
            synced_logs=tuple(self._synced_logs),
            data_loading=self._data_loading,
        )

    def _environment(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Environment:
        device = pl_module.device
        if device.type == "cuda":
            device_name = torch.cuda.get_device_name(device)
            total = torch.cuda.get_device_properties(device).total_memory
            accelerator = accelerator_from_device_name(device_name, total)
        else:
            device_name = f"{device.type} ({platform.machine()})"
            accelerator = "cpu" if device.type == "cpu" else device.type
        placement = detect_placement(self._env)
        math_mode = float32_math()
        return Environment(
            device_name=device_name,
            accelerator=accelerator,
            devices_per_node=trainer.num_devices,
            world_size=trainer.world_size,
            num_nodes=trainer.num_nodes,
            precision=str(trainer.precision),
            local_batch_size=self._local_batch_size,
            torch_version=torch.__version__,
            lightning_version=lightning.__version__,
            instance_type=placement.instance_type,
            region=placement.region,
            accumulate_grad_batches=max(int(trainer.accumulate_grad_batches), 1),
            float32_matmul_precision=math_mode.matmul_precision,
            cudnn_allow_tf32=math_mode.cudnn_allow_tf32,
        )


def _nothing() -> None:
    """Nothing to undo."""


def _gather(mine: RankMeasurement, world_size: int) -> list[RankMeasurement]:
    """Every rank's measurement on every rank (in-memory exchange, not storage)."""
    if world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
        return [mine]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return [m for m in gathered if isinstance(m, RankMeasurement)]


def _tensors(value: Any) -> list[torch.Tensor]:
    """Tensors directly inside a module's args or outputs (tuple, list, dict)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


def _scheduler_times() -> tuple[float, float] | None:
    """This thread's seconds on a core and runnable in the run queue, as the Linux
    scheduler counts them (``None`` where it does not: other systems, no ``/proc``)."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as fh:
            on_cpu_ns, queued_ns, *_ = fh.read().split()
        return int(on_cpu_ns) / 1e9, int(queued_ns) / 1e9
    except (OSError, ValueError):
        return None


def _collect_garbage_untimed() -> None:
    """A full garbage collection now, before timed steps rather than inside them.

    A full (oldest-generation) collection walks every tracked object: about 0.25 s in a
    process that has imported torch, Lightning and SkyPilot. Python runs one whenever a
    quarter more objects have survived into the oldest generation, so a process arriving
    at the window with one due pays it inside a measured step, and a window of a dozen
    1 ms steps then reads 20x slow. Collecting here resets that count; the run pays such
    pauses rarely, once its objects have settled.
    """
    gc.collect()


def _flop_totals(mode: FlopCounterMode) -> dict[str, float]:
    return {key: float(sum(per_op.values())) for key, per_op in mode.get_flop_counts().items()}


def _resolve(clock: Clock, origin: Any, marks: Mapping[str, list[Any]]) -> dict[str, list[float]]:
    return {name: [clock.seconds(origin, m) for m in found] for name, found in marks.items()}


def _backward_span(
    name: str,
    starts: list[float],
    params: Mapping[str, list[float]],
    inputs: Mapping[str, list[float]],
) -> tuple[float, float]:
    """(time in ``name``'s backward, when it last finished), from sorted start offsets.

    A module's backward starts when its output's gradient arrives and ends with the last
    parameter gradient inside it; a subtree without parameters ends when its inputs'
    gradients are ready (an input used elsewhere too would end it late, so parameters
    win where there are any). A module called several times starts once per call: each
    start owns the ends before the next start.
    """
    inside = [t for n, ts in params.items() if n == name or _under(n, name) for t in ts]
    if not inside:
        inside = [t for n, ts in inputs.items() if n == name or _under(n, name) for t in ts]
    total, finish = 0.0, 0.0
    for k, begin in enumerate(starts):
        until = starts[k + 1] if k + 1 < len(starts) else float("inf")
        ends = [t for t in inside if begin <= t < until]
        if ends:
            total += max(ends) - begin
            finish = max(finish, max(ends))
    return total, finish


def _under(name: str, ancestor: str) -> bool:
    """``name`` is a module below ``ancestor`` (every module is below the root ``""``)."""
    return not ancestor or name.startswith(ancestor + ".")


def _is_container(module: torch.nn.Module) -> bool:
    """A module whose forward only calls its children (it computes nothing itself)."""
    if isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)):
        return True
    return type(module).forward is torch.nn.Sequential.forward


def _tracker_names(counts: Mapping[str, Any], root: torch.nn.Module) -> dict[str, str]:
    """The module path of each of ``FlopCounterMode``'s keys.

    Its module tracker names the first module called by its class and the modules
    below by attribute, so a ``training_step`` calling ``self.net(x)`` yields
    ``Net.conv1`` where the LightningModule's path is ``net.conv1``. Each key is
    resolved from the outermost module of that class under which its path exists.
    """
    modules = dict(root.named_modules())
    by_type: dict[str, list[str]] = {}
    for name, module in modules.items():
        by_type.setdefault(type(module).__name__, []).append(name)
    out = {}
    for key in counts:
        head, _, rest = key.partition(".")
        for base in sorted(by_type.get(head, []), key=lambda n: (n.count("."), len(n))):
            full = ".".join(part for part in (base, rest) if part)
            if full in modules:
                out[key] = full
                break
    return out


def _trainer_limits(
    trainer: pl.Trainer, micro_batches: int, window_updates: int, window_batches: int
) -> dict[str, Any]:
    """The script's own ``max_steps``/``max_epochs``, and what converts them to steps.

    Recorded so the launcher can tell before launching whether the script's limits stop
    training before the target it plans for (it never lifts them). The launcher counts
    steps as batches of the training loop; Lightning's ``max_steps`` counts optimizer
    steps (one per ``accumulate_grad_batches`` batches, or one per optimizer a manual
    ``training_step`` steps), so the window's measured ratio goes with it.
    """
    batches = trainer.num_training_batches
    per_epoch = None
    batches_per_epoch = None
    if isinstance(batches, int) and batches > 0:
        per_epoch = -(-batches // max(micro_batches, 1))
        batches_per_epoch = batches
    max_epochs = trainer.max_epochs
    ratio = window_updates / window_batches if window_batches > 0 else 1.0 / max(micro_batches, 1)
    return {
        "max_steps": int(trainer.max_steps),
        "max_epochs": int(max_epochs) if max_epochs is not None else -1,
        "steps_per_epoch": per_epoch,
        "batches_per_epoch": batches_per_epoch,
        "optimizer_steps_per_batch": round(ratio, 6),
        "automatic_optimization": bool(trainer.lightning_module.automatic_optimization),
        "accumulation_schedule": _accumulation_schedule(trainer),
        "world_size": int(trainer.world_size),
        **_time_limit(trainer),
    }


def _time_limit(trainer: pl.Trainer) -> dict[str, float]:
    """``Trainer(max_time=...)`` in seconds, and the training time Lightning's ``Timer``
    has counted so far: the launcher tells where the limit will end the run."""
    timed = time_limit(trainer)
    if timed is None:
        return {}
    return {"max_time_s": round(timed[0], 3), "time_elapsed_s": timed[1]}


def _accumulation_schedule(trainer: pl.Trainer) -> dict[str, int] | None:
    """``GradientAccumulationScheduler``'s epochs and factors (JSON keys are strings), or
    ``None``: the profile saw only its window's epochs' factor, and the script's
    ``max_steps`` converts to batches through every epoch's."""
    from lightning.pytorch.callbacks import GradientAccumulationScheduler

    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(callback, GradientAccumulationScheduler):
            return {str(epoch): int(k) for epoch, k in sorted(callback.scheduling.items())}
    return None


def _optimizer_state_bytes(optimizers: list[Any]) -> int:
    total = 0
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    total += value.numel() * value.element_size()
    return total


def _validation_facts(
    trainer: pl.Trainer, batch_s: list[float], overhead_s: list[float]
) -> dict[str, Any] | None:
    """What validation adds to training: its passes' batches and how often they run.

    Lightning validates every ``val_check_batch`` training batches (a share of the epoch,
    or a count across epochs when ``check_val_every_n_epoch=None``), every
    ``check_val_every_n_epoch`` epochs, each pass ``num_val_batches`` batches per
    process. ``None`` without validation or where a pass's length or period is unknown
    (a stream's epoch). The batch time (with its fetch) is the median of the batches
    timed before the profile (the sanity check's, a pass's first left out), the pass's
    own cost (its loader's start, its epoch-end logging) the median of the timed
    passes'; without any the planner takes the window's forward time per batch and
    nothing per pass.
    """
    if trainer.val_dataloaders is None or not trainer.limit_val_batches:
        return None
    loop = trainer.fit_loop.epoch_loop.val_loop
    if not trainer.num_val_batches:
        try:
            loop.setup_data()  # what Lightning does before the first pass, when no sanity check
        except Exception:  # noqa: BLE001 - the script's loader: pricing it is optional
            return None
    per_pass = sum(trainer.num_val_batches)
    if not math.isfinite(per_pass) or per_pass <= 0:
        return None
    if trainer.val_check_batch is None:
        return None  # set when training data is set up, before any pass
    every_batch = float(trainer.val_check_batch)
    epochs = trainer.check_val_every_n_epoch
    epoch_batches = trainer.num_training_batches
    if epochs is None:
        if not math.isfinite(every_batch):
            return None
        between, per_epoch = every_batch, False
    else:
        if not math.isfinite(epoch_batches) or epoch_batches <= 0:
            return None
        passes = 1 if not math.isfinite(every_batch) else max(int(epoch_batches // every_batch), 1)
        between = float(epoch_batches) * int(epochs) / passes
        per_epoch = isinstance(trainer.val_check_interval, float)
    out: dict[str, Any] = {
        "batches_per_pass": int(per_pass),
        "train_batches_between": between,
        "per_epoch": per_epoch,
        "world_size": int(trainer.world_size),
        "timed_batches": len(batch_s),
    }
    if batch_s:
        out["batch_s"] = statistics.median(batch_s)
    if overhead_s:
        out["pass_overhead_s"] = statistics.median(overhead_s)
    return out


def _samples_per_epoch(trainer: pl.Trainer, local_batch: int) -> int | None:
    """Samples one training epoch consumes on all ranks, when the loader has a length."""
    batches = trainer.num_training_batches
    if not isinstance(batches, int) or batches <= 0 or local_batch <= 0:
        return None
    return batches * local_batch * int(trainer.world_size)
