"""``SriftyCallback``: profile a window of training steps and write one profile.

One line of integration, ``Trainer(callbacks=[SriftyCallback()])``. The callback skips
warm-up steps, counts FLOPs on the last warm-up step (the counter slows that step, so
it is never timed), then times ``profile_steps`` steps (or ``profile_epochs`` epochs):

* phases from Lightning hooks: forward (batch start → ``on_before_backward``), backward
  (→ ``on_after_backward``, which under DDP includes waiting for the last bucket),
  optimizer (``on_before_optimizer_step`` → batch end) and data wait (previous batch end
  → batch start);
* per leaf module: forward from module pre/post forward hooks; backward from *tensor*
  hooks (on the module's outputs for the start, on its parameters and grad-requiring
  inputs for the end). Tensor hooks rather than ``register_full_backward_hook`` because
  full backward hooks wrap outputs in a view that an in-place op (``ReLU(inplace=True)``)
  may not modify, and they fire too early for a first layer whose input needs no grad;
* under DDP, each bucket's ready time and all-reduce time from a communication hook
  (:mod:`~lightning_srifty.capture.ddp`).

Marks come from a clock: ``time.perf_counter`` on CPU, CUDA events on GPU resolved with
one synchronise per measured step, never per layer. After the window every module and
parameter hook is removed; the DDP hook (which torch cannot remove) turns pass-through.
Every rank measures; rank zero gathers all ranks and writes the profile.

Later issues hang off :meth:`SriftyCallback._on_window_done` (profile mode: checkpoint
and ``trainer.should_stop = True``) and :meth:`state_dict` (resume without re-profiling).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import time
from collections.abc import Mapping
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
    gather_rng_states,
    restore_rng_state,
    rng_state_for_this_rank,
)
from lightning_srifty.capture.environment import accelerator_from_device_name, detect_placement
from lightning_srifty.capture.launch_mode import LaunchSession, LaunchSettings
from lightning_srifty.capture.timing import (
    BucketAccumulator,
    BucketEvent,
    LayerAccumulator,
    LayerInfo,
    ModelFacts,
    RankMeasurement,
    StepRecord,
    build_profile,
)
from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.launch_protocol import ATTACHED_MARKER, ENV_PROFILE_PATH, ENV_STATE_DIR
from lightning_srifty.core.profile import Environment, GradParam, Profile
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


class SriftyCallback(pl.Callback):
    """Profiles a window of training steps and writes ``profile.json`` on rank zero.

    Args:
        warmup_steps: Steps skipped before measuring (at least one is used: the FLOP
            count runs on the last warm-up step).
        profile_steps: Steps measured. Ignored when ``profile_epochs`` is set.
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
        self.warmup_steps = max(warmup_steps, 1)
        self.profile_steps = profile_steps
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
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.profiled = bool(state_dict.get("profiled", False))
        rng = state_dict.get("rng")
        self._pending_rng = list(rng) if isinstance(rng, list) else None

    def _reset_window(self) -> None:
        self._clock: Clock = CpuClock()
        self._seen_steps = 0
        self._epochs_in_window = 0
        self._measuring = False
        self._in_step = False
        self._handles: list[RemovableHandle] = []
        self._hookless_params: list[torch.Tensor] = []
        self._recorder: ddp.BucketRecorder | None = None
        self._flop_mode: FlopCounterMode | None = None
        self._layer_flops: dict[str, float] = {}
        self._flops_per_step = 0.0
        self._leaves: dict[str, torch.nn.Module] = {}
        self._forward_order: list[str] = []
        self._activation_bytes: dict[str, int] = {}
        self._layers = LayerAccumulator()
        self._buckets = BucketAccumulator()
        self._steps: list[StepRecord] = []
        self._peak_bytes = 0
        self._local_batch_size = 1
        self._last_end_host: float | None = None
        self._data_wait_s = 0.0
        self._marks: dict[str, Any] = {}
        self._fwd: dict[str, list[tuple[Any, Any]]] = {}
        self._fwd_open: dict[str, Any] = {}
        self._bwd_start: dict[str, list[Any]] = {}
        self._bwd_end: dict[str, list[Any]] = {}

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
            if self._pending_rng:
                # Last, after every restore step, so nothing draws in between.
                state = rng_state_for_this_rank(self._pending_rng)
                if state is not None:
                    restore_rng_state(state)
            self._pending_rng = None
            self._session.on_train_start(trainer)
        if self.profiled:
            return
        self._clock = CudaClock() if pl_module.device.type == "cuda" else CpuClock()
        self._leaves = {
            name: module
            for name, module in pl_module.named_modules()
            if name and not any(True for _ in module.children())
        }
        model = trainer.strategy.model
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            recorder = ddp.BucketRecorder(mark=self._clock.mark, process_group=model.process_group)
            if ddp.attach(model, recorder):
                self._recorder = recorder

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.profiled:
            return
        now = time.perf_counter()
        self._data_wait_s = now - self._last_end_host if self._last_end_host is not None else 0.0
        if self._seen_steps == self.warmup_steps - 1:
            self._flop_mode = FlopCounterMode(display=False)
            self._flop_mode.__enter__()
        if self._seen_steps == self.warmup_steps:
            self._start_window(pl_module, batch)
        if self._measuring:
            self._in_step = True
            self._fwd, self._fwd_open, self._bwd_start, self._bwd_end = {}, {}, {}, {}
            self._marks = {"start": self._clock.mark()}
            if self._recorder is not None:
                self._recorder.take()

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        if self._measuring:
            self._marks.setdefault("before_backward", self._clock.mark())

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._measuring:
            self._marks["after_backward"] = self._clock.mark()

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        self._stop_flop_count(pl_module)
        if self._measuring:
            self._marks.setdefault("before_optimizer", self._clock.mark())

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
        self._stop_flop_count(pl_module)
        if self._measuring:
            self._marks["end"] = self._clock.mark()
            self._in_step = False
            self._finish_step()
            if self.profile_epochs is None and len(self._steps) >= self.profile_steps:
                self._end_window(trainer, pl_module)
        self._seen_steps += 1
        self._last_end_host = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._measuring and self.profile_epochs is not None:
            self._epochs_in_window += 1
            if self._epochs_in_window >= self.profile_epochs:
                self._end_window(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Training ended inside the window: keep what was measured rather than nothing."""
        self._stop_flop_count(pl_module)
        if self._measuring:
            self._end_window(trainer, pl_module)
        if self._session is not None:
            self._session.on_train_end(trainer)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._stop_flop_count(pl_module)
        self._remove_hooks()

    # -------------------------------------------------------------- window
    def _start_window(self, pl_module: pl.LightningModule, batch: Any) -> None:
        try:
            self._local_batch_size = int(extract_batch_size(batch))
        except (MisconfigurationException, RecursionError, TypeError):
            self._local_batch_size = 1
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        for name, module in self._leaves.items():
            self._handles.append(module.register_forward_pre_hook(self._pre_forward_hook(name)))
            self._handles.append(module.register_forward_hook(self._forward_hook(name)))
            for param in module.parameters(recurse=False):
                if param.requires_grad:
                    if param._backward_hooks is None:
                        self._hookless_params.append(param)
                    self._handles.append(param.register_hook(self._grad_end_hook(name)))
        if self._recorder is not None:
            self._recorder.active = True
        self._measuring = True

    def _pre_forward_hook(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            if not self._in_step:
                return
            self._fwd_open[name] = self._clock.mark()
            for tensor in _tensors(args):
                if tensor.requires_grad:
                    tensor.register_hook(self._grad_end_hook(name))

        return hook

    def _forward_hook(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if not self._in_step:
                return
            end = self._clock.mark()
            self._fwd.setdefault(name, []).append((self._fwd_open.pop(name, end), end))
            if name not in self._forward_order:
                self._forward_order.append(name)
            outputs = _tensors(output)
            self._activation_bytes[name] = sum(t.numel() * t.element_size() for t in outputs)
            for tensor in outputs:
                if tensor.requires_grad:
                    tensor.register_hook(self._grad_start_hook(name))

        return hook

    def _grad_start_hook(self, name: str) -> Any:
        def hook(grad: torch.Tensor) -> None:
            self._bwd_start.setdefault(name, []).append(self._clock.mark())

        return hook

    def _grad_end_hook(self, name: str) -> Any:
        def hook(grad: torch.Tensor) -> None:
            if self._in_step:
                self._bwd_end.setdefault(name, []).append(self._clock.mark())

        return hook

    def _finish_step(self) -> None:
        """Resolves this step's marks into durations (one synchronise on CUDA)."""
        clock, marks = self._clock, self._marks
        clock.sync()
        start, end = marks["start"], marks["end"]
        before_bwd = marks.get("before_backward", start)
        after_bwd = marks.get("after_backward", before_bwd)
        before_opt = marks.get("before_optimizer", after_bwd)
        forward = {
            name: sum(max(clock.seconds(a, b), 0.0) for a, b in spans)
            for name, spans in self._fwd.items()
        }
        backward: dict[str, float] = {}
        last_layer_end = 0.0
        for name, starts in self._bwd_start.items():
            ends = self._bwd_end.get(name, [])
            begin = min(clock.seconds(before_bwd, m) for m in starts)
            finish = max((clock.seconds(before_bwd, m) for m in ends), default=begin)
            backward[name] = max(finish - begin, 0.0)
            last_layer_end = max(last_layer_end, finish)
        after_bwd_s = clock.seconds(before_bwd, after_bwd)
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
        self._steps.append(
            StepRecord(
                step_s=self._data_wait_s + clock.seconds(start, end),
                forward_s=max(clock.seconds(start, before_bwd), 0.0),
                backward_s=max(after_bwd_s, 0.0),
                optimizer_s=max(clock.seconds(before_opt, end), 0.0),
                data_wait_s=self._data_wait_s,
                allreduce_s=sum(e.allreduce_s for e in bucket_events),
                exposed_comm_s=exposed,
            )
        )
        self._peak_bytes = max(self._peak_bytes, psutil.Process().memory_info().rss)

    def _stop_flop_count(self, pl_module: pl.LightningModule) -> None:
        if self._flop_mode is None:
            return
        mode, self._flop_mode = self._flop_mode, None
        mode.__exit__(None, None, None)
        counts = mode.get_flop_counts()
        self._flops_per_step = float(mode.get_total_flops())
        self._layer_flops = {}
        for name in self._leaves:
            for key, per_op in counts.items():
                if key.endswith("." + name):
                    self._layer_flops[name] = float(sum(per_op.values()))
                    break

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

    def _end_window(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._remove_hooks()
        self._measuring = False
        self.profiled = True
        if pl_module.device.type == "cuda":
            self._peak_bytes = int(torch.cuda.max_memory_allocated(pl_module.device))
        mine = RankMeasurement(
            rank=trainer.global_rank,
            steps=tuple(self._steps),
            layers=self._layers.means(),
            buckets=self._buckets.buckets(),
            peak_memory_bytes=self._peak_bytes,
        )
        measurements = _gather(mine, trainer.world_size)
        if trainer.global_rank == 0:
            profile = build_profile(measurements, self._facts(trainer, pl_module))
            path = self._output_path(trainer)
            self.profile = profile
            self.written_path = save_profile(profile, path)
            if self.verbose:
                print(f"srifty: profile written to {self.written_path}", flush=True)
        self._on_window_done(trainer, pl_module)

    def _on_window_done(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Under the launcher's profile mode: checkpoint here, then stop cleanly."""
        if self._session is not None:
            self._session.on_profile_done(trainer)

    def _output_path(self, trainer: pl.Trainer) -> Path:
        if self._explicit_path is not None:
            return self._explicit_path
        return Path(trainer.default_root_dir) / "srifty" / "profile.json"

    # --------------------------------------------------------------- facts
    def _facts(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> ModelFacts:
        order = self._forward_order + [n for n in self._leaves if n not in self._forward_order]
        ran = [n for n in order if n in self._forward_order] or order
        layers = tuple(_layer_info(name, self._leaves[name]) for name in ran)
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
        return ModelFacts(
            model_name=type(pl_module).__name__,
            environment=self._environment(trainer, pl_module),
            layers=layers,
            gradients=gradients,
            param_bytes=param_bytes,
            layer_flops=dict(self._layer_flops),
            layer_activation_bytes={n: self._activation_bytes.get(n, 0) for n in ran},
            flops_per_step=self._flops_per_step,
            optimizer_state_bytes=_optimizer_state_bytes(trainer.optimizers),
            peak_kind="cuda_max_allocated" if pl_module.device.type == "cuda" else "cpu_rss",
            warmup_steps=self.warmup_steps,
            comm_backend=backend,
            created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            dataset_size=_samples_per_epoch(trainer, self._local_batch_size),
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
        )


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


def _layer_info(name: str, module: torch.nn.Module) -> LayerInfo:
    params = list(module.parameters(recurse=False))
    return LayerInfo(
        name=name,
        block=name.split(".", 1)[0],
        module_type=type(module).__name__,
        param_count=sum(p.numel() for p in params),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
    )


def _optimizer_state_bytes(optimizers: list[Any]) -> int:
    total = 0
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    total += value.numel() * value.element_size()
    return total


def _samples_per_epoch(trainer: pl.Trainer, local_batch: int) -> int | None:
    """Samples one training epoch consumes on all ranks, when the loader has a length."""
    batches = trainer.num_training_batches
    if not isinstance(batches, int) or batches <= 0 or local_batch <= 0:
        return None
    return batches * local_batch * int(trainer.world_size)
