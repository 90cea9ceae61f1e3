"""Re-planning on measured steps: migrate only when the measurement says another plan is
better by more than the measured cost of moving, and more than its own uncertainty.

The controller calls :meth:`Refiner.check` once an attempt has run enough steps to
trust its *steady* step time (the median after warm-up: restore, process-group set-up
and the first iterations never count). A step inside the prediction's 10-90 %
interval teaches nothing and moves nothing. Outside it, the running job's step refits
the job's own terms (:func:`lightning_srifty.fit.refine.refit_job`): co-location and
overlap where the shape can explain it, and a compute scale for the GPU type it runs
on that every type not yet tried takes too, so an unexplained slowdown never makes
them look cheaper (the profiled type keeps the profile's own measurement).
The planner then ranks every plan for the remaining steps with the refitted model.

Refinement must not lose money. Staying is priced by the measurement; an alternative
only by a prediction, so it is taken at the pessimistic end of its interval (its high
step time), plus what moving costs (this attempt's own start-up time until its first
step and one checkpoint, at the new plan's price). The job moves only if that still
beats staying by more than :attr:`Refiner.margin`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lightning_srifty.core.calibration import Calibration
from lightning_srifty.core.catalog import GpuSpec
from lightning_srifty.core.cluster import Cluster, Plan
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.core.planner import batch_semantics, predict_per_step
from lightning_srifty.core.profile import Profile
from lightning_srifty.core.units import format_hours, format_money
from lightning_srifty.launch.migration import REPLANNED, Decision, plan_key

Replanner = Callable[[PerformanceModel, int, float, float], Sequence[Plan]]
"""``(model, remaining steps at the profiled scale, elapsed hours, restart hours) ->
plans``, best first; spot plans price their restarts at the measured start-up."""


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
    """The alternative at the pessimistic end of its interval, moving included."""
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
    last: Verdict | None = field(default=None, init=False)

    def check(
        self,
        plan: Plan,
        measured_step_s: float,
        remaining_base: float,
        elapsed_h: float,
        startup_s: float,
    ) -> Decision | None:
        """A move to a better plan, or ``None`` to stay.

        Args:
            plan: the plan running now.
            measured_step_s: its steady seconds per step (one batch on every process).
            remaining_base: steps left, counted at the profiled world size.
            elapsed_h: hours since the launch.
            startup_s: this attempt's time from launch to its first step.
        """
        from lightning_srifty.fit.refine import refit_job  # lazy: scipy

        cluster = self.ran_on(plan)
        batches = batch_semantics(self.profile)
        before = PerformanceModel(self.gpu_specs, self.calibration)
        expected = predict_per_step(before, self.profile, cluster)
        predicted = expected.step_s
        if expected.low_s <= measured_step_s <= expected.high_s:
            return None  # the prediction holds: nothing to learn, no reason to move
        refitted_cal = refit_job(
            self.calibration,
            self.profile,
            cluster,
            measured_step_s * batches.batches_per_update,
            gpu_specs=self.gpu_specs,
        )
        model = PerformanceModel(self.gpu_specs, refitted_cal)
        refitted = predict_per_step(model, self.profile, cluster).step_s
        # the plan as it runs: its own step time scaled by what the measurement showed
        # (the measured step leaves validation passes out; the plan prices them apart)
        stay_step = plan.step_s * measured_step_s / max(predicted, 1e-12) + plan.validation_s
        stay_steps = float(batches.steps_on(remaining_base, plan.cluster.world_size))
        stay_hours = stay_steps * stay_step / 3600.0
        stay_cost = stay_hours * plan.hourly_usd
        remaining = max(int(math.ceil(remaining_base)), 1)
        ranked = [
            p for p in self.replan(model, remaining, elapsed_h, startup_s / 3600.0) if p is not None
        ]
        here = (plan_key(plan), plan.cluster.describe(), plan.use_spot)
        others = [p for p in ranked if (plan_key(p), p.cluster.describe(), p.use_spot) != here]
        moving_s = startup_s + self.checkpoint_s

        def pessimistic(p: Plan) -> tuple[float, float]:
            """(hours, dollars) of ``p`` at the slow end of its interval, moving included
            (the plan's figures are expectations at its mean step)."""
            slow = max(p.step_high_s / max(p.step_mean_s, 1e-12), 1.0)
            moving_usd = moving_s / 3600.0 * p.hourly_usd
            return p.time_to_target_h * slow + moving_s / 3600.0, p.cost_usd * slow + moving_usd

        key = 0 if self.objective == "time" else 1
        best = min(others, key=lambda p: pessimistic(p)[key], default=None)
        hours, dollars = pessimistic(best) if best is not None else (math.inf, math.inf)
        verdict = Verdict(
            measured_step_s, predicted, refitted, stay_cost, stay_hours, best, dollars, hours,
            moving_s / 3600.0 * (best.hourly_usd if best else 0.0), moving_s,
        )  # fmt: skip
        self.last = verdict
        if best is None:
            return None
        if self.objective == "time":
            gain = stay_hours - hours
            better = gain > self.margin * stay_hours
            saving = f"{format_hours(gain)} sooner"
        else:
            gain = stay_cost - dollars
            better = gain > self.margin * stay_cost
            saving = f"{format_money(gain)} cheaper"
        if not better:
            return None
        self.calibration = refitted_cal  # later checks start from what this one learned
        market = "spot" if best.use_spot else "on-demand"
        reason = (
            f"{REPLANNED}: {measured_step_s * 1e3:.1f} ms per step against "
            f"{predicted * 1e3:.1f} ms predicted; {best.cluster.describe()} ({market}) is "
            f"{saving} for the rest of the run even at the slow end of its prediction, "
            f"after {moving_s:.0f} s of moving"
        )
        return Decision(best, reason)
