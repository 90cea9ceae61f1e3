"""Measured step times fed back as calibration data when a run drifts from its prediction.

When the measured step time leaves the prediction interval, the launcher writes what it
saw as a *measured profile*: the profiling run's profile with the environment of the
cluster that really ran and the measured step time. That is exactly the input
``srifty calibrate --profiles`` fits on (one row per profile), so the next plan for a
similar job starts from a model corrected by this run.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

from lightning_srifty.core.profile import Profile, Spread


@dataclasses.dataclass(frozen=True)
class RanOn:
    """The cluster that produced a measurement."""

    instance_type: str | None
    """Catalog type (cloud runs); ``None`` for the local backend's processes."""
    region: str | None
    nodes: int
    devices_per_node: int


def measured_profile(profile: Profile, ran_on: RanOn, measured_step_s: float) -> Profile:
    """``profile`` re-labelled with the cluster that ran and its measured mean step.

    ``measured_step_s`` is per step (one batch on every process); a profile's step is an
    optimizer update of ``accumulate_grad_batches`` batches, so it is scaled to that.
    """
    measured_step_s *= profile.environment.accumulate_grad_batches
    env = dataclasses.replace(
        profile.environment,
        instance_type=ran_on.instance_type,
        region=ran_on.region,
        num_nodes=ran_on.nodes,
        devices_per_node=ran_on.devices_per_node,
        world_size=ran_on.nodes * ran_on.devices_per_node,
    )
    step = Spread(mean_s=measured_step_s, p50_s=measured_step_s, p90_s=measured_step_s, count=1)
    steps = dataclasses.replace(profile.steps, step=step)
    extra = dict(profile.extra)
    extra["srifty_feedback"] = {"measured_step_s": measured_step_s, "at": time.time()}
    return dataclasses.replace(profile, environment=env, steps=steps, extra=extra)


def write_feedback(
    folder: Path, profile: Profile, ran_on: RanOn, measured_step_s: float, *, attempt: int
) -> Path:
    """Writes one measured profile under ``folder``; returns its path."""
    from lightning_srifty.io.profile_io import save_profile

    label = re.sub(r"[^A-Za-z0-9.]+", "-", ran_on.instance_type or "local")
    path = folder / f"attempt-{attempt}-{label}-{ran_on.nodes}x{ran_on.devices_per_node}.json"
    folder.mkdir(parents=True, exist_ok=True)
    return save_profile(measured_profile(profile, ran_on, measured_step_s), path)
