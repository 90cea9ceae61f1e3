"""Validation passes, priced into every training batch of the plan.

Lightning interleaves validation with training: every so many training batches (a
share of an epoch by default), each process runs its shard of the validation set
forward. That time is part of the run the plan buys, so the planner adds it to each
training batch's time and cost (not to the step, which the launcher measures without
the passes): a pass's own cost (its loader's start, its epoch-end logging: host work,
kept as measured) and its batches per process at one validation batch's time carried
to the candidate's GPUs like the job's compute, over the training batches between two
passes.

With ``W`` processes (a distributed sampler on both loaders) a pass has ``W0/W`` of the
profiled batches per process; a period given as a share of the epoch shrinks the same
way (so the share of time is unchanged), a period in training batches does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_srifty.core.profile import Profile


@dataclass(frozen=True)
class ValidationCost:
    """What the profiling run saw of validation (``profile.extra["validation"]``)."""

    batch_s: float
    """One validation batch on one process of the profiled hardware."""
    batches_per_pass: int
    """Validation batches per process and pass, at the profiled world size."""
    train_batches_between: float
    """Training batches between two passes, at the profiled world size."""
    per_epoch: bool
    """The period is a share of the epoch (it shrinks with more processes)."""
    world_size: int
    """Processes of the profiling run."""
    timed: bool
    """``batch_s`` was measured; otherwise it is the training step's forward time."""
    pass_overhead_s: float = 0.0
    """A pass's time outside its batches (loader start, epoch-end logging), measured."""

    def seconds_per_batch(self, compute_ratio: np.ndarray, world: np.ndarray) -> np.ndarray:
        """Validation seconds per training batch on clusters of ``world`` processes whose
        compute takes ``compute_ratio`` times the profiled hardware's."""
        shrink = self.world_size / np.maximum(np.asarray(world, dtype=np.float64), 1.0)
        batches = np.maximum(np.ceil(self.batches_per_pass * shrink), 1.0)
        between = self.train_batches_between * (shrink if self.per_epoch else 1.0)
        between = np.maximum(between, 1.0)
        device = self.batch_s * np.asarray(compute_ratio, dtype=np.float64) * batches
        return (self.pass_overhead_s + device) / between


def validation_cost(profile: Profile) -> ValidationCost | None:
    """The profile's validation, or ``None`` where it has none (or an unreadable record:
    ``extra`` is free-form, and a plan without validation is what older profiles got)."""
    raw: Any = profile.extra.get("validation")
    if not isinstance(raw, dict):
        return None
    batches, between = raw.get("batches_per_pass"), raw.get("train_batches_between")
    world = raw.get("world_size", profile.environment.world_size)
    if not isinstance(batches, int) or batches < 1:
        return None
    if not isinstance(between, int | float) or not math.isfinite(between) or between <= 0:
        return None
    if not isinstance(world, int) or world < 1:
        return None
    measured = raw.get("batch_s")
    timed = isinstance(measured, int | float) and math.isfinite(measured) and measured > 0
    batch_s = float(measured) if isinstance(measured, int | float) and timed else 0.0
    if not timed:
        batch_s = float(profile.steps.forward_s)
    if batch_s <= 0:
        return None
    overhead = raw.get("pass_overhead_s", 0.0)
    if not isinstance(overhead, int | float) or not math.isfinite(overhead) or overhead < 0:
        overhead = 0.0
    return ValidationCost(
        batch_s=batch_s,
        batches_per_pass=batches,
        train_batches_between=float(between),
        per_epoch=bool(raw.get("per_epoch", True)),
        world_size=world,
        timed=timed,
        pass_overhead_s=float(overhead),
    )
