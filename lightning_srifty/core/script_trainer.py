"""What a script fixes in its own ``Trainer(...)``: constraints on every plan.

The profiling run records the shape arguments a script passes itself
(``profile.extra["script"]``, see :mod:`lightning_srifty.capture.script_facts`). The
launcher's ``PL_TRAINER_*`` defaults cannot override them, so the planner must meet
them: ``devices=2`` means two processes on each node, ``num_nodes=2`` exactly two nodes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.profile import Profile

DDP_STRATEGIES = frozenset(
    {
        "ddp",
        "ddp_find_unused_parameters_true",
        "ddp_find_unused_parameters_false",
        "ddp_spawn",
        "ddp_fork",
        "ddp_notebook",
        "auto",
        "DDPStrategy",
    }
)
"""Strategies the performance model prices (synchronous data parallel)."""
CPU_ACCELERATORS = frozenset({"cpu", "CPUAccelerator"})


def device_count(value: Any) -> int | None:
    """Processes per node a ``devices=`` value asks for; ``None`` for ``"auto"``/``-1``
    (as many as the node has, which the launcher sets)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 1 else None
    if isinstance(value, (list, tuple)):
        return len(value) or None
    if isinstance(value, str):
        text = value.strip()
        if text in ("auto", "-1", ""):
            return None
        if "," in text:
            return len([part for part in text.split(",") if part.strip()]) or None
        try:
            number = int(text)
        except ValueError:
            return None
        return number if number >= 1 else None
    return None


@dataclass(frozen=True)
class ScriptTrainer:
    """The shape a script fixes itself, and how it builds its ``Trainer``."""

    devices: int | None = None
    """Processes per node (``None``: the launcher decides)."""
    num_nodes: int | None = None
    strategy: str | None = None
    accelerator: str | None = None
    precision: str | None = None
    lightning_cli: bool = False
    """Built by ``LightningCLI``: the plan's shape goes in as ``--trainer.*`` arguments."""
    recorded: bool = False
    """The profiling run recorded the script's arguments (old profiles did not)."""
    stop: ScriptStop | None = field(default=None, compare=False)
    """Where the script's own limits end training (``None``: the profile recorded none)."""

    @staticmethod
    def of(profile: Profile) -> ScriptTrainer:
        raw = profile.extra.get("script")
        stop = ScriptStop.of(profile)
        if not isinstance(raw, dict):
            return ScriptTrainer(stop=stop)
        explicit = raw.get("explicit")
        explicit = explicit if isinstance(explicit, dict) else {}
        nodes = explicit.get("num_nodes")
        return ScriptTrainer(
            devices=device_count(explicit.get("devices")),
            num_nodes=nodes if isinstance(nodes, int) and not isinstance(nodes, bool) else None,
            strategy=_text(explicit.get("strategy")),
            accelerator=_text(explicit.get("accelerator")),
            precision=_text(explicit.get("precision")),
            lightning_cli=raw.get("entry_point") == "lightning_cli",
            recorded=True,
            stop=stop,
        )

    @property
    def fixes_strategy(self) -> bool:
        return self.strategy is not None and self.strategy != "auto"

    @property
    def trains_on_cpu(self) -> bool:
        return self.accelerator in CPU_ACCELERATORS

    def constrain(self, request: Any) -> Any:
        """``request`` (a :class:`~lightning_srifty.core.planner.PlanRequest`) limited to
        the script's devices per node and node count, and priced to where the script's own
        ``max_steps``/``max_epochs``/``max_time`` end training.

        Raises:
            ConfigError: the script's values contradict the request's own limits.
        """
        changes: dict[str, Any] = {}
        if self.devices is not None:
            if request.max_gpus is not None and self.devices > request.max_gpus:
                raise ConfigError(
                    f"the script fixes Trainer(devices={self.devices}) but --max-gpus is "
                    f"{request.max_gpus}"
                )
            changes["gpus_per_node"] = self.devices
        if self.num_nodes is not None:
            if self.num_nodes > request.max_nodes:
                raise ConfigError(
                    f"the script fixes Trainer(num_nodes={self.num_nodes}) but --max-nodes is "
                    f"{request.max_nodes}"
                )
            changes["num_nodes"] = self.num_nodes
        if self.stop is not None:
            changes["script_stop"] = self.stop
        return dataclasses.replace(request, **changes) if changes else request

    def notes(self) -> list[str]:
        """What the plan takes from the script, and what the model cannot price."""
        out = []
        fixed = [
            f"{name}={value!r}"
            for name, value in (
                ("devices", self.devices),
                ("num_nodes", self.num_nodes),
                ("strategy", self.strategy),
                ("accelerator", self.accelerator),
            )
            if value is not None
        ]
        if fixed:
            out.append(f"the script fixes Trainer({', '.join(fixed)}); every plan keeps it")
        if self.fixes_strategy and self.strategy not in DDP_STRATEGIES:
            out.append(
                f"the script's strategy={self.strategy!r} is not DDP; the model prices data-"
                "parallel DDP, so its predictions may be off for this job"
            )
        return out


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class ScriptStop:
    """The script's own ``Trainer(max_steps=, max_epochs=, max_time=)``, as the profiling
    run recorded them (``profile.extra["trainer"]``).

    srifty-launch never lifts them, so a plan is priced to where they end training: a plan
    whose run stops before the target costs what that run bills, not the target.
    """

    max_steps: int | None = None
    """Optimizer steps (Lightning's ``max_steps``; ``None``: unlimited)."""
    max_epochs: int | None = None
    batches_per_epoch: int | None = None
    """Batches of the training loop in an epoch, on :attr:`profiled_world` processes."""
    profiled_world: int = 1
    automatic_optimization: bool | None = None
    accumulate_grad_batches: int = 1
    accumulation_schedule: tuple[tuple[int, int], ...] = ()
    """``GradientAccumulationScheduler``'s (epoch, factor) pairs, when it is used."""
    optimizer_steps_per_batch: float | None = None
    """Measured by the profile (a manual step may step several optimizers, or none:
    ``max_steps`` then never ends training); ``None``: not recorded, taken as ``1/k``."""
    max_time_s: float | None = None
    """``Trainer(max_time=...)``: seconds of training Lightning's ``Timer`` allows."""
    done_steps: int = 0
    """Steps the job's counter had reached when the run is priced (its checkpoint)."""
    done_time_s: float = 0.0
    """Training time Lightning's ``Timer`` had counted by then."""

    @staticmethod
    def of(profile: Profile) -> ScriptStop | None:
        """The limits ``profile`` recorded, or ``None`` where it recorded none."""
        limits = profile.extra.get("trainer")
        if not isinstance(limits, dict):
            return None
        k = max(profile.environment.accumulate_grad_batches, 1)
        per_epoch = _count(limits.get("batches_per_epoch"))
        if per_epoch is None and _count(limits.get("steps_per_epoch")) is not None:
            per_epoch = int(limits["steps_per_epoch"]) * k
        ratio = limits.get("optimizer_steps_per_batch")
        limit_s = limits.get("max_time_s")
        auto = limits.get("automatic_optimization")
        return ScriptStop(
            max_steps=_count(limits.get("max_steps")),
            max_epochs=_count(limits.get("max_epochs")),
            batches_per_epoch=per_epoch,
            profiled_world=_count(limits.get("world_size")) or profile.environment.world_size,
            automatic_optimization=auto if isinstance(auto, bool) else None,
            accumulate_grad_batches=k,
            accumulation_schedule=_schedule_pairs(limits.get("accumulation_schedule")),
            optimizer_steps_per_batch=(
                float(ratio)
                if isinstance(ratio, int | float) and not isinstance(ratio, bool)
                else None
            ),
            max_time_s=(
                float(limit_s)
                if isinstance(limit_s, int | float)
                and not isinstance(limit_s, bool)
                and limit_s > 0
                and math.isfinite(limit_s)
                else None
            ),
        )

    def after(self, steps: int, time_s: float) -> ScriptStop:
        """The limits left once the job's counter reads ``steps`` after ``time_s`` of
        training: what a run resumed there can still train."""
        return dataclasses.replace(self, done_steps=max(steps, 0), done_time_s=max(time_s, 0.0))

    @property
    def time_left_s(self) -> float | None:
        """Training time ``max_time`` still allows (``None``: no time limit)."""
        if self.max_time_s is None:
            return None
        return max(self.max_time_s - self.done_time_s, 0.0)

    def steps_left_on(self, world: int) -> tuple[int | None, str]:
        """:meth:`steps_on` counted from :attr:`done_steps`: the steps a run resumed there
        trains on ``world`` processes before the script's step limits end it."""
        limit, setting = self.steps_on(world)
        if limit is None:
            return None, ""
        return max(limit - self.done_steps, 0), setting

    def steps_on(self, world: int) -> tuple[int | None, str]:
        """Where ``max_steps``/``max_epochs`` stop training on ``world`` processes, in
        steps (batches of the training loop; ``None``: no limit known), and which setting.

        Lightning's ``max_steps`` counts optimizer steps: ``accumulate_grad_batches``
        batches make one (and an epoch's last batch; :func:`batches_for_updates`), a
        manual ``training_step`` stepping two optimizers makes two per batch (the profile
        measured that ratio). Each process keeps its batch, so an epoch takes fewer steps
        on more processes: batches per epoch scale by profiled world size over ``world``.
        """
        k = self.accumulate_grad_batches
        found: list[tuple[int, str]] = []
        on_world = None
        if self.batches_per_epoch is not None:
            on_world = math.ceil(self.batches_per_epoch * self.profiled_world / max(world, 1))
        ratio = self.optimizer_steps_per_batch
        if ratio is None:
            ratio = 1.0 / k  # profiles from before the ratio was measured
        if self.max_steps is not None:
            setting = f"max_steps={self.max_steps}"
            if self.automatic_optimization is True and on_world is not None:
                schedule = dict(self.accumulation_schedule) or {0: k}
                if self.accumulation_schedule:
                    schedule = {0: 1, **schedule}  # the scheduler's default before its first
                found.append((batches_for_updates(self.max_steps, schedule, on_world), setting))
            elif ratio > 0:
                found.append((math.ceil(self.max_steps / ratio - 1e-9), setting))
        if self.max_epochs is not None and on_world is not None:
            found.append((self.max_epochs * on_world, f"max_epochs={self.max_epochs}"))
        if not found:
            return None, ""
        return min(found)

    @property
    def time_setting(self) -> str:
        """``max_time=0:00:25``, as the user would read it (empty without a limit)."""
        if self.max_time_s is None:
            return ""
        return f"max_time={dt.timedelta(seconds=round(self.max_time_s))}"


def batches_for_updates(updates: int, schedule: dict[int, int] | int, epoch_batches: int) -> int:
    """Batches of the training loop Lightning runs for ``updates`` optimizer steps under
    automatic optimisation: one step every ``k`` batches of an epoch and one at its last
    batch, so an epoch of ``epoch_batches`` makes ``ceil(epoch_batches / k)`` steps (a
    measured steps-per-batch ratio is off by the epoch's remainder). ``schedule`` maps the
    epoch a factor starts at to ``k`` (``GradientAccumulationScheduler``), or is one ``k``.
    """
    factors = {0: schedule} if isinstance(schedule, int) else dict(schedule)
    starts = sorted(factors)

    def factor(epoch: int) -> int:
        return max(factors[max(e for e in starts if e <= epoch)] if epoch >= starts[0] else 1, 1)

    batches, left, epoch = 0, updates, 0
    while left > 0:
        k = factor(epoch)
        per_epoch = -(-epoch_batches // k)
        if epoch >= starts[-1]:  # the last factor holds from here on
            epochs, rest = divmod(left, per_epoch)
            return batches + epochs * epoch_batches + rest * k
        if left < per_epoch:
            return batches + left * k
        batches, left, epoch = batches + epoch_batches, left - per_epoch, epoch + 1
    return batches


def _count(value: Any) -> int | None:
    """A positive whole number, else ``None`` (Lightning's -1 and ``None`` mean no limit)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _schedule_pairs(recorded: Any) -> tuple[tuple[int, int], ...]:
    """``{"0": 1, "4": 2}`` (the recorded ``GradientAccumulationScheduler``) as sorted pairs."""
    if not isinstance(recorded, dict) or not recorded:
        return ()
    try:
        return tuple(sorted((int(epoch), max(int(k), 1)) for epoch, k in recorded.items()))
    except (TypeError, ValueError):
        return ()


def gradient_syncs_per_batch(profile: Profile) -> int:
    """Gradient all-reduces a data-parallel run makes per training batch.

    A manual ``training_step`` (``automatic_optimization=False``, a GAN) runs a backward
    pass before each of its optimizer steps, and DDP all-reduces after every backward
    pass; the launcher runs such scripts with ``find_unused_parameters``, which reduces
    the whole gradient each time (the parameters a pass did not use as zeros). The count
    is the profile's optimizer steps a batch (:meth:`ScriptStop.of`); 1 otherwise.
    """
    stop = ScriptStop.of(profile)
    if stop is None or stop.automatic_optimization is not False:
        return 1
    ratio = stop.optimizer_steps_per_batch
    return max(int(round(ratio)), 1) if ratio is not None and ratio >= 1 else 1
