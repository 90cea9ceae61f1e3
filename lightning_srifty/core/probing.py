"""When to measure before committing: probes of the plans that could be the best.

Srifty profiles on the VMs it prices and Scavenger searches online; both pay a little to
measure so that a long run does not go to the wrong hardware. A probe is a short real
run of the user's job on a candidate (a few dozen steps after warm-up). It is worth
running when the top plans' prediction intervals overlap, so that the ranking could
change once measured, and when what it costs is small against what a better choice
could save. This module decides that, from the ranked plans alone; running the probes
and refitting on them is the launcher's.

Each plan's objective (cost, or time with ``objective="time"``) is read at the ends of
its step-time interval: a plan whose optimistic value beats the best plan's pessimistic
value is a contender. Probing the best plan and the contenders (one per kind of
hardware, best-ranked first) costs their start-up plus the probe's steps at their
price; the potential saving is how much cheaper the best contender could turn out than
the best plan.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from lightning_srifty.core.cluster import Plan

PROBE_MODES = ("auto", "on", "off")
DEFAULT_MAX_PROBES = 3
PROBE_MEASURE_S = 10.0
"""Seconds of steps a probe runs: its first reports are warm-up, the next ones its
steady step (rank zero reports about once a second)."""
VERIFY_SHARE = 0.05
"""Plan #1 alone is probed when it runs a shape the profile never measured and the probe
costs at most this share of the job: a few seconds to check hours of work."""
PROBE_MIN_STEPS = 8
"""Steps a probe runs at least, when each takes longer than a report's second."""


def probe_seconds(step_s: float) -> float:
    """Seconds of steps one probe takes on a plan of this step time (start-up aside)."""
    return max(PROBE_MEASURE_S, PROBE_MIN_STEPS * step_s)


@dataclass(frozen=True)
class ProbeDecision:
    """Which plans to probe, and why (or why not)."""

    plans: tuple[Plan, ...]
    """Best-ranked first; empty when no probe runs."""
    reason: str
    cost_usd: float
    """Estimated price of the probes at their plans' hourly prices."""
    seconds: float
    """Estimated wall time of the probes, one after the other."""
    potential: float
    """How much the best contender could save against plan #1 (dollars, or hours for
    the time objective)."""

    @property
    def run(self) -> bool:
        return bool(self.plans)


def interval_value(plan: Plan, objective: str, end: str) -> float:
    """The plan's objective at one end of its step-time interval (``low``/``mid``/``high``).

    Time and cost both scale with the step time: the work is a number of steps.
    """
    step = {"low": plan.step_low_s, "mid": plan.step_s, "high": plan.step_high_s}[end]
    scale = step / plan.step_s if plan.step_s > 0 else 1.0
    base = plan.time_to_target_h if objective == "time" else plan.cost_usd
    return base * scale


def decide_probes(
    plans: Sequence[Plan],
    *,
    objective: str,
    hardware: Callable[[Plan], Hashable],
    startup_s: float,
    mode: str = "auto",
    max_probes: int = DEFAULT_MAX_PROBES,
    unknown_compute: bool = False,
    unmeasured_shape: str = "",
) -> ProbeDecision:
    """Whether to probe ``plans`` (ranked, best first) before committing to the best.

    Args:
        plans: the planner's ranking.
        objective: ``"cost"``, ``"time"`` or ``"knee"`` (knee compares cost).
        hardware: what one probe measures (instance type in the cloud, the local
            topology on the local backend): plans alike in it share a probe.
        startup_s: seconds from launch to the probe's first step (provisioning included).
        mode: ``"auto"`` (probe when worth it), ``"on"`` (always the contenders, or the
            best plan alone) or ``"off"``.
        max_probes: at most this many plans are probed.
        unknown_compute: the profile says nothing about these GPUs (it ran on a CPU):
            every distinct kind of hardware in the ranking is a contender.
        unmeasured_shape: how plan #1 runs what the profile never measured (e.g. "2
            processes per node"; empty when it did): when no contender is worth a probe,
            plan #1 alone is still probed if that costs at most :data:`VERIFY_SHARE` of
            the job, so the run's own step is measured before it is committed to.
    """
    if mode not in PROBE_MODES:
        raise ValueError(f"probe mode {mode!r} is not one of {PROBE_MODES}")
    if mode == "off" or not plans:
        return ProbeDecision((), "probes are off (--probe off)", 0.0, 0.0, 0.0)
    key = "time" if objective == "time" else "cost"
    best = plans[0]
    worst_best = interval_value(best, key, "high")
    chosen: dict[Hashable, Plan] = {hardware(best): best}
    for p in plans[1:]:
        if len(chosen) >= max_probes:
            break
        kind = hardware(p)
        if kind in chosen:
            continue
        if unknown_compute or interval_value(p, key, "low") < worst_best:
            chosen[kind] = p
    picked = tuple(chosen.values())
    seconds = sum(startup_s + probe_seconds(p.step_high_s) for p in picked)
    cost = sum((startup_s + probe_seconds(p.step_high_s)) / 3600.0 * p.hourly_usd for p in picked)
    contenders = picked[1:]
    potential = max((worst_best - interval_value(p, key, "low") for p in contenders), default=0.0)
    price = seconds / 3600.0 if key == "time" else cost
    unit = "h" if key == "time" else "$"
    if mode == "on":
        why = "--probe on"
        if unknown_compute:
            why += "; the profile ran on a CPU, so no GPU's compute was measured"
        return ProbeDecision(picked, why, cost, seconds, potential)
    if unknown_compute:
        return ProbeDecision(
            picked,
            "the profile ran on a CPU: no GPU's compute was measured (Srifty profiles on the "
            "VMs it prices)",
            cost,
            seconds,
            potential,
        )
    if unmeasured_shape and (not contenders or potential <= price):
        alone = startup_s + probe_seconds(best.step_high_s)
        alone_price = alone / 3600.0 if key == "time" else alone / 3600.0 * best.hourly_usd
        job = interval_value(best, key, "mid")
        if job > 0 and alone_price <= VERIFY_SHARE * job:
            return ProbeDecision(
                (best,),
                f"plan #1 runs {unmeasured_shape}, which the profile never measured: a "
                f"probe checks its step first ({_amount(alone_price, unit)}, "
                f"{alone_price / job:.1%} of the job)",
                alone / 3600.0 * best.hourly_usd,
                alone,
                0.0,
            )
    if not contenders:
        return ProbeDecision(
            (),
            "no probe: the plans' intervals do not overlap (no plan on other hardware beats "
            "plan #1 even at the fast end of its prediction against plan #1's slow end)",
            cost,
            seconds,
            0.0,
        )
    if potential <= price:
        return ProbeDecision(
            (),
            f"no probe: it would cost about {_amount(price, unit)}, more than the "
            f"{_amount(potential, unit)} a better choice could save",
            cost,
            seconds,
            potential,
        )
    return ProbeDecision(
        picked,
        f"the top plans' intervals overlap: a better choice could save up to "
        f"{_amount(potential, unit)}; probing costs about {_amount(price, unit)}",
        cost,
        seconds,
        potential,
    )


def _amount(value: float, unit: str) -> str:
    if unit == "h":
        return f"{value * 60:.1f} min" if value < 1 else f"{value:.1f} h"
    return f"${value:,.2f}" if value >= 1 else f"${value:.3g}"
