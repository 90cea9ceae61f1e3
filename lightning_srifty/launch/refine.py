"""Re-planning on measured steps: migrate when the measurement says another plan is
better by more than the measured cost of moving.

The controller calls :meth:`Refiner.check` once an attempt has run enough steps to
trust its mean. A mean inside the prediction's 10-90 % interval teaches nothing and
moves nothing; outside it, the running job's step time refits the job's own terms
(:func:`lightning_srifty.fit.refine.refit_job`); the planner then ranks every plan for
the remaining steps with the refitted model, and the current plan is priced by the
same model. A move pays for itself only if the best other plan, plus what moving
costs (this attempt's own start-up time until its first step and one checkpoint, at
the new plan's price), beats staying by more than :attr:`Refiner.margin`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lightning_srifty.core.calibration import Calibration
from lightning_srifty.core.catalog import GpuSpec
from lightning_srifty.core.cluster import Cluster, Plan
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.core.profile import Profile
from lightning_srifty.core.units import format_hours, format_money
from lightning_srifty.launch.migration import REPLANNED, Decision, plan_key

Replanner = Callable[[PerformanceModel, int, float], Sequence[Plan]]
"""``(model, remaining steps, elapsed hours) -> ranked plans``, best first."""


@dataclass(frozen=True)
class Verdict:
    """What a check found (kept for the log and the tests)."""

    measured_step_s: float
    predicted_step_s: float
    refitted_step_s: float
    stay_cost_usd: float
    stay_hours: float
    move: Plan | None
    move_cost_usd: float
    move_hours: float
    moving_usd: float
    moving_s: float


@dataclass
class Refiner:
    """Refits the job on its measured steps and decides whether moving pays off.

    Args:
        profile: the job's profile (its terms are keyed by ``model_name``).
        calibration: the calibration the run was planned with.
        gpu_specs: published peak figures for the model.
        replan: the planner, re-run for the remaining steps.
        ran_on: the cluster the steps were really measured on for a plan (the local
            backend runs a plan's shape scaled down to this machine).
        objective: ``"cost"``, ``"time"`` or ``"knee"`` (knee compares cost).
        checkpoint_s: measured time to write one checkpoint (part of moving).
        margin: the share by which moving must beat staying.
    """

    profile: Profile
    calibration: Calibration
    gpu_specs: dict[str, GpuSpec]
    replan: Replanner
    ran_on: Callable[[Plan], Cluster]
    objective: str = "cost"
    checkpoint_s: float = 0.0
    margin: float = 0.1
    processes_keep_batch: bool = False
    """The steps were measured with every process keeping the profile's batch (the
    local backend's stand-ins); else the plan's global batch split over its GPUs."""
    last: Verdict | None = field(default=None, init=False)

    def check(
        self,
        plan: Plan,
        measured_step_s: float,
        remaining_steps: int,
        elapsed_h: float,
        startup_s: float,
    ) -> Decision | None:
        """A move to a better plan, or ``None`` to stay."""
        from lightning_srifty.fit.refine import refit_job  # lazy: scipy

        cluster = self.ran_on(plan)
        batch = None if self.processes_keep_batch else plan.global_batch
        before = PerformanceModel(self.gpu_specs, self.calibration)
        expected = before.predict(self.profile, cluster, global_batch=batch)
        predicted = expected.step_s
        if expected.low_s <= measured_step_s <= expected.high_s:
            return None  # the prediction holds: nothing to learn, no reason to move
        refitted_cal = refit_job(
            self.calibration,
            self.profile,
            cluster,
            measured_step_s,
            gpu_specs=self.gpu_specs,
            global_batch=batch,
        )
        model = PerformanceModel(self.gpu_specs, refitted_cal)
        refitted = model.predict(self.profile, cluster, global_batch=batch).step_s
        # the plan as it runs: its own step time scaled by what the measurement taught
        stay_step = plan.step_s * measured_step_s / max(predicted, 1e-12)
        stay_hours = remaining_steps * stay_step / 3600.0
        stay_cost = stay_hours * plan.hourly_usd
        ranked = [p for p in self.replan(model, remaining_steps, elapsed_h) if p is not None]
        here = plan_key(plan)
        others = [
            p
            for p in ranked
            if (plan_key(p), p.cluster.describe(), p.use_spot)
            != (here, plan.cluster.describe(), plan.use_spot)
        ]
        best = others[0] if others else None
        moving_s = startup_s + self.checkpoint_s
        verdict = Verdict(
            measured_step_s, predicted, refitted, stay_cost, stay_hours, best,
            best.cost_usd if best else math.inf, best.time_to_target_h if best else math.inf,
            moving_s / 3600.0 * (best.hourly_usd if best else 0.0), moving_s,
        )  # fmt: skip
        self.last = verdict
        if best is None:
            return None
        if self.objective == "time":
            gain = stay_hours - (best.time_to_target_h + moving_s / 3600.0)
            better = gain > self.margin * stay_hours
            saving = f"{format_hours(gain)} sooner"
        else:
            gain = stay_cost - (best.cost_usd + verdict.moving_usd)
            better = gain > self.margin * stay_cost
            saving = f"{format_money(gain)} cheaper"
        if not better:
            return None
        self.calibration = refitted_cal  # later checks start from what this one learned
        market = "spot" if best.use_spot else "on-demand"
        reason = (
            f"{REPLANNED}: {measured_step_s * 1e3:.1f} ms per step against "
            f"{predicted * 1e3:.1f} ms predicted; {best.cluster.describe()} ({market}) is "
            f"{saving} for the remaining {remaining_steps:,} steps, after {moving_s:.0f} s "
            "of moving"
        )
        return Decision(best, reason)
