"""What a script fixes in its own ``Trainer(...)``: constraints on every plan.

The profiling run records the shape arguments a script passes itself
(``profile.extra["script"]``, see :mod:`lightning_srifty.capture.script_facts`). The
launcher's ``PL_TRAINER_*`` defaults cannot override them, so the planner must meet
them: ``devices=2`` means two processes on each node, ``num_nodes=2`` exactly two nodes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
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

    @staticmethod
    def of(profile: Profile) -> ScriptTrainer:
        raw = profile.extra.get("script")
        if not isinstance(raw, dict):
            return ScriptTrainer()
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
        )

    @property
    def fixes_strategy(self) -> bool:
        return self.strategy is not None and self.strategy != "auto"

    @property
    def trains_on_cpu(self) -> bool:
        return self.accelerator in CPU_ACCELERATORS

    def constrain(self, request: Any) -> Any:
        """``request`` (a :class:`~lightning_srifty.core.planner.PlanRequest`) limited to
        the script's devices per node and node count.

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
