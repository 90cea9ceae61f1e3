"""The planner: the best VM mix for a profiled job under a deadline or a budget.

Search space (every candidate is evaluated, none sampled):

* **Units.** The catalog has one offer per instance type and zone. Zones only change
  prices and interruption bands, so for each (instance type, region, market) only the
  cheapest zone is kept, with its zone id, as one *unit*. A multi-node group is placed
  in that one zone (gang-scheduled jobs want one placement group and no cross-zone
  traffic); the two groups of a mix may sit in different zones of the same region.
* **Homogeneous candidates.** Every unit × nodes ``1..max_nodes`` (default 64), within
  ``max_gpus``.
* **Two-type mixes.** Every pair of distinct instance types in the same region and the
  same market (both spot or both on-demand), with node counts ``(a, b)`` drawn from
  ``mix_node_counts`` (default 1, 2, 3, 4, 6, 8, 12, 16) and ``a + b <= max_nodes``.
  Three-type mixes are not searched.

The performance model does not depend on region, zone or market, so it is evaluated
once per distinct (type, nodes) and (type pair, split), then broadcast to all units: a
few hundred thousand candidates cost one vectorised model call each for the two shapes.

Batch semantics: the batch that runs. Lightning's DDP keeps the script's
``DataLoader(batch_size=b)`` on every process, so on ``W`` processes a step (one batch of
the training loop on each process) consumes ``b·W`` samples; the launcher never splits a
batch. The planner prices exactly that: every GPU of every candidate runs the profiled
per-process batch (groups of a two-type mix too: the slowest group paces the step), and
a target given in steps at the profiled scale (``W0`` processes) means the same number of
samples everywhere, ``ceil(steps0·W0/W)`` steps on ``W`` processes. With gradient
statistics in the profile (``stat_efficiency``) the steps are rescaled further by
:func:`lightning_srifty.core.stateff.steps_to_target` (a larger global batch needs more
samples for the same progress). The model prices an optimizer update (``k`` batches
under ``accumulate_grad_batches=k``); plans report seconds per batch.

Spot risk. A gang of ``n`` nodes is preempted ``n`` times as often as one node, at the
rate of the zone's Spot Advisor band (:func:`band_hourly_rate`). The job checkpoints at
the Young/Daly interval, loses on average half an interval per preemption and waits a
restart delay; :func:`spot_expectations` gives the expected time, billed hours and
probability of meeting the deadline.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_srifty.core.candidates import CandidateArrays, StepTimeArrays
from lightning_srifty.core.catalog import Offer, band_hourly_rate
from lightning_srifty.core.cluster import Cluster, ClusterGroup, Plan
from lightning_srifty.core.errors import (
    ConfigError,
    InfeasibleError,
    PredictionError,
    ScriptLimitsReachedError,
)
from lightning_srifty.core.links import NodeLinks
from lightning_srifty.core.lognormal import mean_factor, step_sigma
from lightning_srifty.core.perfmodel import PerformanceModel, Prediction
from lightning_srifty.core.profile import Profile
from lightning_srifty.core.script_trainer import ScriptStop
from lightning_srifty.core.stateff import steps_to_target as stateff_steps

OBJECTIVES = ("cost", "time", "knee")
NON_GPU_ACCELERATORS = frozenset(
    {"Inferentia", "Inferentia2", "Trainium", "Trainium2", "Gaudi HL-205", "Qualcomm AI100"}
)
"""Accelerators that do not run CUDA training code; searched only if profiled on them."""
DEFAULT_MIX_NODE_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16)
DEFAULT_RESTART_DELAY_H = 5.0 / 60.0
CHECKPOINT_FIXED_S = 10.0
"""Seconds to pause, serialise and start an upload regardless of size."""
CHECKPOINT_WRITE_BYTES_S = 200e6
"""Sustained checkpoint write rate to object storage (about 200 MB/s from one node)."""
_POISSON_EXACT_MAX_MEAN = 30.0


# ---------------------------------------------------------------------------------------
# Request and result records
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanRequest:
    """What the user asked for: the target, the constraints and the search limits."""

    target_steps: int | None = None
    """Steps (batches of the training loop on each process) at the profiled world size."""
    epochs: float | None = None
    dataset_size: int | None = None
    """Samples per epoch; falls back to ``profile.extra["dataset_size"]``."""
    deadline_h: float | None = None
    budget_usd: float | None = None
    objective: str = "cost"
    allow_spot: bool = True
    allow_ondemand: bool = True
    regions: tuple[str, ...] = ()
    max_nodes: int = 64
    max_gpus: int | None = None
    families: tuple[str, ...] = ()
    exclude_families: tuple[str, ...] = ()
    mixes: bool = True
    mix_node_counts: tuple[int, ...] = DEFAULT_MIX_NODE_COUNTS
    restart_delay_h: float = DEFAULT_RESTART_DELAY_H
    checkpoint_cost_s: float | None = None
    """Seconds to write one checkpoint; estimated from the model state when ``None``."""
    min_deadline_probability: float = 0.9
    """A spot plan meets the deadline only if it does so with at least this probability."""
    top_k: int = 10
    gpus_per_node: int | None = None
    """Processes per node the script fixes itself (``Trainer(devices=N)``): only nodes
    with at least N GPUs, using N of them."""
    num_nodes: int | None = None
    """Nodes the script fixes itself (``Trainer(num_nodes=N)``): exactly N."""
    script_stop: ScriptStop | None = None
    """The script's own ``max_steps``/``max_epochs``/``max_time``, less what the run had
    done when priced (:meth:`ScriptStop.after`): each plan is priced to where they end its
    run (set by ``ScriptTrainer.constrain``; the launcher's re-plans count them from the
    newest checkpoint)."""

    def __post_init__(self) -> None:
        if (self.target_steps is None) == (self.epochs is None):
            raise ConfigError("give exactly one of --target-steps N or --epochs E")
        if self.target_steps is not None and self.target_steps < 1:
            raise ConfigError(f"--target-steps must be >= 1, got {self.target_steps}")
        if self.epochs is not None and not (self.epochs > 0 and math.isfinite(self.epochs)):
            raise ConfigError(f"--epochs must be a positive number, got {self.epochs}")
        if self.dataset_size is not None and self.dataset_size < 1:
            raise ConfigError(f"--dataset-size must be >= 1, got {self.dataset_size}")
        if self.objective not in OBJECTIVES:
            raise ConfigError(
                f"--objective {self.objective!r} is not valid: use one of {', '.join(OBJECTIVES)}"
            )
        if self.max_nodes < 1:
            raise ConfigError(f"--max-nodes must be >= 1, got {self.max_nodes}")
        if self.max_gpus is not None and self.max_gpus < 1:
            raise ConfigError(f"--max-gpus must be >= 1, got {self.max_gpus}")
        if self.restart_delay_h < 0:
            raise ConfigError("--restart-delay must not be negative")
        if self.checkpoint_cost_s is not None and self.checkpoint_cost_s <= 0:
            raise ConfigError("--checkpoint-cost must be a positive duration")
        if not 0.0 <= self.min_deadline_probability <= 1.0:
            raise ConfigError("--confidence must be between 0 and 1")
        if self.top_k < 1:
            raise ConfigError(f"--top must be >= 1, got {self.top_k}")
        if not self.allow_spot and not self.allow_ondemand:
            raise ConfigError("both spot and on-demand are disabled: nothing to plan")
        if any(n < 1 for n in self.mix_node_counts):
            raise ConfigError("mix node counts must be >= 1")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise ConfigError(f"GPUs per node must be >= 1, got {self.gpus_per_node}")
        if self.num_nodes is not None and not 1 <= self.num_nodes <= self.max_nodes:
            raise ConfigError(
                f"the script's num_nodes={self.num_nodes} is outside 1..--max-nodes "
                f"{self.max_nodes}"
            )


@dataclass(frozen=True)
class SearchSpace:
    """How many candidates of each shape were evaluated (printed by the CLI/benchmark)."""

    units: int
    """(instance type, region, market) after dedupe to the cheapest zone."""
    instance_types: int
    homogeneous: int
    mixes: int
    model_rows: int
    """Distinct clusters the performance model evaluated."""

    @property
    def total(self) -> int:
        return self.homogeneous + self.mixes


@dataclass(frozen=True)
class PlanResult:
    """Ranked plans, baselines beside them, and the time-cost Pareto front."""

    plans: tuple[Plan, ...]
    baselines: tuple[Plan, ...]
    """Labelled: cheapest $/h that fits, fastest single node, on-demand only."""
    front: tuple[tuple[float, float], ...]
    """(hours, dollars) of the feasible Pareto front, fastest first."""
    space: SearchSpace
    target_steps_at_base: int
    """The target in steps at the profiled world size."""
    batch: BatchSemantics
    notes: tuple[str, ...] = field(default=())

    @property
    def best(self) -> Plan:
        return self.plans[0]


# ---------------------------------------------------------------------------------------
# Pure numeric building blocks
# ---------------------------------------------------------------------------------------


def young_daly_interval_h(checkpoint_h: np.ndarray, mtbf_h: np.ndarray) -> np.ndarray:
    """Vectorised ``sqrt(2·C·MTBF)``, as :func:`lightning_srifty.core.spot.young_daly_interval`.

    Infinite MTBF (no preemptions) gives an infinite interval: never checkpoint.
    """
    return np.sqrt(2.0 * np.asarray(checkpoint_h, float) * np.asarray(mtbf_h, float))


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF via Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7), numpy only."""
    z = np.abs(x) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = 1.0 - poly * np.exp(-z * z)
    return 0.5 * (1.0 + np.sign(x) * erf)


def deadline_probability(
    slack_h: np.ndarray,
    mean_preemptions: np.ndarray,
    interval_h: np.ndarray,
    restart_h: float,
    exact: np.ndarray | None = None,
) -> np.ndarray:
    """``P(sum of delays <= slack)`` when preemptions are Poisson and each costs ``d``
    plus a lost share of the interval.

    Each preemption adds ``d + U·τ`` with ``U`` uniform on [0, 1) (it strikes anywhere
    in the interval since the last checkpoint). ``K`` is Poisson with the given mean,
    so the total delay is compound Poisson. Rows in ``exact`` (mean up to 30) sum the
    mixture over ``k``: exact for ``k = 0, 1``, a normal Irwin-Hall approximation for
    ``k >= 2``. Other rows use the normal approximation of the compound Poisson sum
    (mean ``m·(d + τ/2)``, variance ``m·E[(d + Uτ)^2]``), good for large means.
    """
    slack = np.asarray(slack_h, dtype=np.float64)
    mean = np.asarray(mean_preemptions, dtype=np.float64)
    tau = np.where(np.isfinite(interval_h), interval_h, 0.0)
    d = restart_h
    out = np.where((slack >= 0) & np.isfinite(mean), 1.0, 0.0)
    risky = np.flatnonzero((slack >= 0) & (mean > 0) & np.isfinite(mean))
    if risky.size == 0:
        return out
    s, mu, t = slack[risky], mean[risky], tau[risky]
    second_moment = d * d + d * t + t * t / 3.0
    spread = np.sqrt(mu * second_moment)
    centre = s - mu * (d + t / 2.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        approx = _normal_cdf(centre / np.where(spread > 0, spread, 1.0))
    out[risky] = np.where(spread > 0, approx, (centre >= 0).astype(float))
    pick = (mu <= _POISSON_EXACT_MAX_MEAN) & (t > 0)
    if exact is not None:
        pick &= np.asarray(exact)[risky]
    rows = risky[pick]
    if rows.size == 0:
        return out
    s, mu, t = s[pick], mu[pick], t[pick]
    pmf = np.exp(-mu)
    total = pmf.copy()  # k = 0: no delay, slack >= 0
    pmf = pmf * mu
    total += pmf * np.clip((s - d) / t, 0.0, 1.0)  # k = 1: d + U·τ <= s
    active = np.arange(rows.size)
    k = 1
    while active.size:
        k += 1
        pmf = pmf * mu[active] / k
        room = s[active] - k * d
        gain = pmf * np.where(
            room <= 0,
            0.0,
            _normal_cdf((room - k * t[active] / 2.0) / (t[active] * math.sqrt(k / 12))),
        )
        total[active] += gain
        # Drop rows whose remaining terms are negligible or can no longer fit.
        keep = (room > 0) & ((pmf > 1e-12) | (k < mu[active]))
        active, pmf = active[keep], pmf[keep]
    out[rows] = np.minimum(total, 1.0)
    return out


_UNCERTAIN_NODES = 12
"""Gauss-Legendre nodes over the step's log-normal where the deadline is uncertain."""
_Z_CAP = 4.5
"""The step's log-normal is integrated over ``|z| <= 4.5`` (all but 7e-6 of it)."""
_BRACKET = 1e-3
"""Rows whose odds are bracketed this tightly in closed form take the bracket's middle."""


def _normal_pdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def uncertain_deadline_probability(
    deadline_h: float,
    run_h: np.ndarray,
    preemptions: np.ndarray,
    interval_h: np.ndarray,
    restart_h: float,
    sigma: np.ndarray,
    exact: np.ndarray | None = None,
) -> np.ndarray:
    """``P(T0(S) + preemption delays <= D)`` with the step ``S`` log-normal.

    ``run_h`` is the running time ``T0`` (work plus checkpoints) and ``preemptions``
    the expected number of preemptions, both at the median step; at step ``S`` both
    scale by ``S/median`` (Poisson given ``S``). With ``z = ln(S/median)/sigma`` the
    run misses the deadline for sure beyond ``z* = ln(D/T0)/sigma``.

    * Rows without preemptions: the closed form ``Phi(z*)`` (1 where ``z* >= 4.5``).
    * Rows with preemptions (``exact`` ones only, the rows that can be chosen): the
      odds lie between ``Phi(z*)`` (the delays never fit worse than nothing) and
      ``Phi(zu)·P(K <= m)`` with ``zu = min(z*, 4.5)``, ``K`` Poisson at the run's
      length at ``zu`` and ``m`` (0-2) the preemptions that fit in the slack left at
      ``zu`` even losing a whole interval each. Where that bracket is narrower than
      :data:`_BRACKET` its middle is taken; elsewhere :func:`deadline_probability` is
      integrated over ``z`` up to ``zu`` (Gauss-Legendre, :data:`_UNCERTAIN_NODES`
      nodes weighted by the normal density): ``Phi(zu)`` times the mean delay
      probability below it. A plain Gauss-Hermite rule over all ``z`` would integrate
      across the jump at ``z*`` and be off by up to a node's weight: against a fine
      grid over 400 random rows (up to 15 preemptions), 0.18 at worst with 9
      Gauss-Hermite nodes, 0.007 with this rule (8 nodes: 0.03).
    * Rows with ``sigma == 0``, and rows outside ``exact`` that have preemptions:
      :func:`deadline_probability` at the median step, exactly as before the step's
      uncertainty was counted.
    """
    t0 = np.asarray(run_h, dtype=np.float64)
    mean_k = np.broadcast_to(np.asarray(preemptions, dtype=np.float64), t0.shape)
    tau = np.broadcast_to(np.asarray(interval_h, dtype=np.float64), t0.shape)
    sig = np.broadcast_to(np.asarray(sigma, dtype=np.float64), t0.shape)
    chosen = np.ones(t0.shape, bool) if exact is None else np.asarray(exact, dtype=bool)
    spread = sig > 0
    if not spread.any():
        return deadline_probability(deadline_h - t0, mean_k, tau, restart_h, exact=chosen)
    rows = np.flatnonzero(spread & chosen & (mean_k > 0))
    rows = rows[np.isfinite(t0[rows])]
    # the step is integrated out of these below: no Poisson mixture at the median
    mixture = chosen.copy()
    mixture[rows] = False
    out = deadline_probability(deadline_h - t0, mean_k, tau, restart_h, exact=mixture)
    calm = np.flatnonzero(spread & (mean_k == 0))
    calm = calm[np.isfinite(t0[calm])]
    if calm.size:
        with np.errstate(divide="ignore"):
            z = np.log(max(deadline_h, 0.0) / t0[calm]) / sig[calm]
        near = np.flatnonzero(z < _Z_CAP)  # the others are 1 already (T0 <= D)
        out[calm[near]] = _normal_cdf(z[near])
    if rows.size == 0:
        return out
    if deadline_h <= 0:
        out[rows] = 0.0
        return out
    s, k, t, run0 = sig[rows], mean_k[rows], tau[rows], t0[rows]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_room = np.log(deadline_h / run0)  # sigma·z*
        cap = s * _Z_CAP
        below_cap = log_room < cap
        scale = np.exp(np.where(below_cap, log_room, cap))  # S/median at zu
        k_top = k * scale
        room = deadline_h - run0 * scale
        worst = restart_h + t
        at_most = np.exp(-k_top) * (
            1.0 + k_top * (room >= worst) + 0.5 * k_top * k_top * (room >= 2.0 * worst)
        )
        at_most = np.where(k_top < np.inf, at_most, 0.0)
    upper = np.ones(rows.size)
    lower = at_most * _normal_cdf(np.array([_Z_CAP]))[0]
    top = np.full(rows.size, _Z_CAP)
    idx = np.flatnonzero(below_cap)
    top[idx] = log_room[idx] / s[idx]
    upper[idx] = _normal_cdf(top[idx])
    lower[idx] = upper[idx] * at_most[idx]
    live = top > -_Z_CAP
    upper[~live] = lower[~live] = 0.0
    out[rows] = 0.5 * (upper + lower)
    loose = live & (upper - lower > _BRACKET)
    if not loose.any():
        return out
    rows, top = rows[loose], top[loose]
    x, w = np.polynomial.legendre.leggauss(_UNCERTAIN_NODES)
    z = -_Z_CAP + (top[:, None] + _Z_CAP) * (x[None, :] + 1.0) / 2.0
    weight = w[None, :] * _normal_pdf(z)
    scale = np.exp(sig[rows, None] * z)
    run = t0[rows, None] * scale
    p = deadline_probability(
        (deadline_h - run).ravel(),
        (mean_k[rows, None] * scale).ravel(),
        np.repeat(tau[rows], _UNCERTAIN_NODES),
        restart_h,
    ).reshape(run.shape)
    mean_p = np.sum(weight * p, axis=1) / np.sum(weight, axis=1)
    out[rows] = _normal_cdf(top) * mean_p
    return out


@dataclass(frozen=True)
class SpotOutcome:
    """Expected behaviour of many runs under preemption (arrays of equal shape)."""

    time_h: np.ndarray
    """Expected wall time: work, checkpoints, lost work and restart delays."""
    billed_h: np.ndarray
    """Expected instance-hours billed per node (restart delays are not billed)."""
    interval_h: np.ndarray
    """Young/Daly checkpoint interval (inf when never preempted)."""
    preemptions: np.ndarray
    """Expected number of preemptions of the gang."""
    deadline_probability: np.ndarray


def spot_expectations(
    work_h: np.ndarray,
    rate_per_h: np.ndarray,
    checkpoint_h: float,
    restart_h: float,
    deadline_h: float | None,
    sigma: np.ndarray | float = 0.0,
    exact: np.ndarray | None = None,
) -> SpotOutcome:
    """Expected time, billed time and deadline probability of runs that get preempted,
    with ``work_h`` at the median step and the step log-normal of spread ``sigma``.

    Model. Preemptions of the gang arrive as a Poisson process of rate ``λ`` per running
    hour (``λ`` = nodes × per-node rate). The job checkpoints every ``τ = sqrt(2·C/λ)``
    (Young/Daly with MTBF ``1/λ``), so running ``W`` hours of work takes
    ``T0 = W·(1 + C/τ)``. Each preemption loses on average ``τ/2`` of work and waits
    ``d`` to restart, so with ``K`` preemptions the wall time is ``T0 + K·(τ/2 + d)``.
    The expected number solves ``E[K] = λ·(T0 + E[K]·τ/2)`` (only running time is
    exposed), i.e. ``E[K] = λ·T0/(1 - λ·τ/2)``; runs with ``λ·τ/2 >= 1`` never finish.

    Step uncertainty. Time, billed time and preemptions are linear in the work, so their
    expectations over a log-normal step are their values at the median work times
    ``exp(sigma²/2)``: ``time_h``, ``billed_h`` and ``preemptions`` are expectations
    over both the preemptions and the step.

    Deadline. Wall time is ``T0(S)`` plus the preemption delays; the probability that
    it stays within ``D`` is :func:`uncertain_deadline_probability` (the step integrated
    out, with the exact Poisson mixture, for the ``exact`` rows, by default those whose
    expected time meets the deadline, the ones that can be chosen; the delays alone at
    the median step elsewhere). Rates of zero reduce to the on-demand case: ``T0 = W``,
    probability ``P(W(S) <= D)``, 1 or 0 when ``sigma`` is 0.
    """
    work = np.asarray(work_h, dtype=np.float64)
    sig = np.broadcast_to(np.asarray(sigma, dtype=np.float64), work.shape)
    rate = np.broadcast_to(np.asarray(rate_per_h, dtype=np.float64), work.shape)
    has_risk = rate > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        mtbf = np.where(has_risk, 1.0 / np.where(has_risk, rate, 1.0), np.inf)
        interval = young_daly_interval_h(np.full(work.shape, checkpoint_h), mtbf)
        overhead = np.where(has_risk, checkpoint_h / interval, 0.0)
        t0 = work * (1.0 + overhead)
        lost = np.where(has_risk, interval / 2.0, 0.0)
        exposure = 1.0 - rate * lost
        preemptions = np.where(exposure > 0, rate * t0 / exposure, np.inf)
        preemptions = np.where(has_risk, preemptions, 0.0)
        time_h = t0 + preemptions * (lost + restart_h)
        billed = t0 + preemptions * lost
    if sig.any():
        mean = mean_factor(sig)
        with np.errstate(invalid="ignore"):
            exp_time, exp_billed, exp_k = time_h * mean, billed * mean, preemptions * mean
    else:
        exp_time, exp_billed, exp_k = time_h, billed, preemptions
    if deadline_h is None:
        probability = np.ones(work.shape)
    else:
        probability = uncertain_deadline_probability(
            deadline_h,
            t0,
            preemptions,
            interval,
            restart_h,
            sig,
            exact=exp_time <= deadline_h if exact is None else exact,
        )
    return SpotOutcome(exp_time, exp_billed, interval, exp_k, probability)


def _pareto_exact(t: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Sort-based front: a point is dominated by a faster one no dearer, or a tie in
    time that is cheaper."""
    n = t.size
    order = np.lexsort((c, t))
    ts, cs = t[order], c[order]
    new_time = np.r_[True, ts[1:] != ts[:-1]]
    starts = np.flatnonzero(new_time)
    group = np.cumsum(new_time) - 1
    group_min = cs[starts][group]
    before = np.r_[np.inf, np.minimum.accumulate(cs)[:-1]]
    prev_min = before[starts][group]
    dominated = (prev_min <= cs) | (group_min < cs)
    mask = np.empty(n, dtype=bool)
    mask[order] = ~dominated
    return mask


def _dominated_by(
    front_t: np.ndarray, front_c: np.ndarray, t: np.ndarray, c: np.ndarray
) -> np.ndarray:
    """Points strictly dominated by a front given sorted by time (costs falling)."""
    pos = np.searchsorted(front_t, t, side="right") - 1
    safe = np.maximum(pos, 0)
    ft, fc = front_t[safe], front_c[safe]
    return (pos >= 0) & (fc <= c) & ~((ft == t) & (fc == c))


_PREFILTER_MIN = 20_000
_PREFILTER_SAMPLE = 2_000


def pareto_front(time: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Boolean mask of points no other point dominates (both objectives minimised).

    ``a`` dominates ``b`` when it is no worse in both and better in one; identical
    points do not dominate each other, so duplicates on the front all stay.

    Large inputs are first thinned against the front of the fastest and the cheapest
    few thousand points (a point dominated by a real point is off the front, and
    dominance is transitive, so the survivors have the same front); the exact sort then
    runs on the few survivors.
    """
    t = np.asarray(time, dtype=np.float64)
    c = np.asarray(cost, dtype=np.float64)
    if t.shape != c.shape or t.ndim != 1:
        raise ValueError("time and cost must be 1-D arrays of equal length")
    if t.size == 0:
        return np.zeros(0, dtype=bool)
    if t.size < _PREFILTER_MIN:
        return _pareto_exact(t, c)
    k = _PREFILTER_SAMPLE
    sample = np.unique(np.r_[np.argpartition(t, k)[:k], np.argpartition(c, k)[:k]])
    sample_front = sample[_pareto_exact(t[sample], c[sample])]
    ft, fc = t[sample_front], c[sample_front]
    order = np.lexsort((fc, ft))
    survivors = np.flatnonzero(~_dominated_by(ft[order], fc[order], t, c))
    mask = np.zeros(t.size, dtype=bool)
    mask[survivors[_pareto_exact(t[survivors], c[survivors])]] = True
    return mask


def knee_index(time: np.ndarray, cost: np.ndarray) -> int:
    """Index of the knee of a Pareto front: the point farthest from the chord.

    Both axes are normalised to [0, 1] over the front so hours and dollars weigh the
    same; the chord joins the fastest and the cheapest points.
    """
    t = np.asarray(time, dtype=np.float64)
    c = np.asarray(cost, dtype=np.float64)
    if t.size == 0:
        raise ValueError("empty front")
    if t.size <= 2:
        return int(np.argmin(c))
    tn = (t - t.min()) / max(float(np.ptp(t)), 1e-300)
    cn = (c - c.min()) / max(float(np.ptp(c)), 1e-300)
    a, b = int(np.argmin(t)), int(np.argmin(c))
    dx, dy = tn[b] - tn[a], cn[b] - cn[a]
    norm = math.hypot(dx, dy)
    if norm == 0:
        return a
    distance = np.abs(dy * (tn - tn[a]) - dx * (cn - cn[a])) / norm
    return int(np.argmax(distance))


# ---------------------------------------------------------------------------------------
# Search space
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Units:
    offers: tuple[Offer, ...]
    """Cheapest-zone offer of each unit."""
    spot: np.ndarray
    price: np.ndarray
    rate: np.ndarray
    """Preemptions per node-hour (0 on-demand)."""
    type_index: np.ndarray
    region: np.ndarray
    type_offers: tuple[Offer, ...]
    """One representative offer per distinct instance type (hardware facts)."""
    per_node: int | None = None
    """GPUs each node runs when the script fixes ``devices`` (all of them otherwise)."""

    def gpus_used(self, offer: Offer) -> int:
        return offer.accelerator_count if self.per_node is None else self.per_node


def _eligible(offer: Offer, request: PlanRequest, profiled_on: str) -> bool:
    if offer.accelerator_count < 1 or not offer.accelerator or offer.accelerator_fraction < 1:
        return False
    if offer.accelerator in NON_GPU_ACCELERATORS and offer.accelerator != profiled_on:
        return False
    if request.gpus_per_node is not None and offer.accelerator_count < request.gpus_per_node:
        return False
    if request.regions and offer.region not in request.regions:
        return False
    if request.families and offer.family not in request.families:
        return False
    return offer.family not in request.exclude_families


def build_units(offers: Sequence[Offer], request: PlanRequest, profiled_on: str) -> _Units:
    """Keeps the cheapest zone per (instance type, region, market); drops ineligible."""
    best: dict[tuple[str, str, bool], Offer] = {}
    for offer in offers:
        if not _eligible(offer, request, profiled_on):
            continue
        for spot in (False, True):
            if (spot and not request.allow_spot) or (not spot and not request.allow_ondemand):
                continue
            price = offer.price(spot)
            if price is None or price <= 0:
                continue
            key = (offer.instance_type, offer.region, spot)
            kept = best.get(key)
            if kept is None or price < (kept.price(spot) or math.inf):
                best[key] = offer
    keys = sorted(best)
    type_names = sorted({k[0] for k in keys})
    type_pos = {name: i for i, name in enumerate(type_names)}
    first: dict[str, Offer] = {}
    for key in keys:
        first.setdefault(key[0], best[key])
    chosen = tuple(best[k] for k in keys)
    markets = [k[2] for k in keys]
    return _Units(
        offers=chosen,
        spot=np.array(markets, dtype=bool),
        price=np.array([o.price(m) for o, m in zip(chosen, markets, strict=True)], dtype=float),
        rate=np.array(
            [
                band_hourly_rate(o.interruption_band) if m else 0.0
                for o, m in zip(chosen, markets, strict=True)
            ],
            dtype=float,
        ),
        type_index=np.array([type_pos[k[0]] for k in keys], dtype=np.int64),
        region=np.array([k[1] for k in keys], dtype=object),
        type_offers=tuple(first[name] for name in type_names),
        per_node=request.gpus_per_node,
    )


def _candidate_arrays(
    type_offers: Sequence[Offer],
    types: np.ndarray,
    nodes: np.ndarray,
    per_node: int | None = None,
) -> CandidateArrays:
    """(n, G) model input for rows of type indices and node counts (nodes 0 = absent);
    ``per_node`` GPUs of each node run (all of them when ``None``)."""
    acc = np.array([o.accelerator for o in type_offers], dtype=object)
    gpn = np.array(
        [o.accelerator_count if per_node is None else per_node for o in type_offers],
        dtype=np.int64,
    )
    distinct: dict[NodeLinks, int] = {}
    link = np.array(
        [distinct.setdefault(o.node_links, len(distinct)) for o in type_offers], dtype=np.int64
    )
    mem = np.array([o.gpu_memory_gib for o in type_offers], dtype=float)
    names = np.array([o.instance_type for o in type_offers], dtype=object)
    vcpus = np.array([o.vcpus for o in type_offers], dtype=float)
    return CandidateArrays(
        acc[types],
        gpn[types],
        nodes,
        link[types],
        mem[types],
        tuple(distinct),
        names[types],
        vcpus[types],
    )


@dataclass(frozen=True)
class BatchSemantics:
    """The batch that runs, and how the step count moves with the world (module doc)."""

    per_process_batch: int
    """Samples in one batch of the training loop on each process (the script's own)."""
    batches_per_update: int
    """Batches per optimizer update (``accumulate_grad_batches``)."""
    profiled_world: int
    """Processes the profile ran on: targets in steps are counted at this scale."""
    noise_scale: float | None

    @property
    def base_global_batch(self) -> int:
        """Samples per step at the profiled world size."""
        return self.per_process_batch * self.profiled_world

    def global_batch(self, world: int) -> int:
        """Samples per step on ``world`` processes."""
        return self.per_process_batch * world

    def steps_on(self, steps0: float, world: np.ndarray | int) -> np.ndarray:
        """Steps on ``world`` processes worth ``steps0`` steps at the profiled scale.

        The same samples (``ceil(steps0·W0/W)``); with a noise scale, the samples the
        larger update batch needs for the same progress (counted per update).
        """
        return np.ceil(steps0 * self._steps_per_base(world) - 1e-9)

    def base_per_step(self, world: int) -> float:
        """Steps at the profiled scale that one step on ``world`` processes is worth."""
        return 1.0 / float(self._steps_per_base(world))

    def _steps_per_base(self, world: np.ndarray | int) -> np.ndarray:
        w = np.maximum(np.asarray(world, dtype=np.float64), 1.0)
        if self.noise_scale is None:
            return self.profiled_world / w
        update = float(self.per_process_batch * self.batches_per_update)
        return stateff_steps(1.0, update * self.profiled_world, update * w, self.noise_scale)

    def describe(self, world: int | None = None) -> str:
        """``per-process batch 32, global 64 on 2 processes`` (and the update batch)."""
        text = f"per-process batch {self.per_process_batch}"
        if world is not None:
            text += f", global batch {self.global_batch(world)} on {world} process"
            text += "es" if world != 1 else ""
        if self.batches_per_update > 1:
            text += f" ({self.batches_per_update} batches per optimizer update)"
        return text


def batch_semantics(profile: Profile) -> BatchSemantics:
    env = profile.environment
    stats = profile.stat_efficiency
    return BatchSemantics(
        per_process_batch=env.local_batch_size,
        batches_per_update=env.accumulate_grad_batches,
        profiled_world=env.world_size,
        noise_scale=None if stats is None else stats.noise_scale,
    )


def _predict(
    model: PerformanceModel, profile: Profile, cand: CandidateArrays, sem: BatchSemantics
) -> StepTimeArrays:
    """Seconds per step (batch) with every process on the script's own batch."""
    out = model.predict_batch(profile, cand, local_batch=profile.environment.step_batch_size)
    k = sem.batches_per_update
    if k == 1:
        return out
    return dataclasses.replace(
        out,
        step_s=out.step_s / k,
        low_s=out.low_s / k,
        high_s=out.high_s / k,
        local_batch=out.local_batch // k,
        global_batch=out.global_batch // k,
    )


def predict_per_step(model: PerformanceModel, profile: Profile, cluster: Cluster) -> Prediction:
    """The model's prediction for ``cluster`` in the planner's units: seconds per step
    (one batch on every process), each process on the script's own batch."""
    pred = model.predict(profile, cluster, local_batch=profile.environment.step_batch_size)
    return per_batch(pred, profile.environment.accumulate_grad_batches)


def per_batch(pred: Prediction, batches_per_update: int) -> Prediction:
    """A prediction of one optimizer update of ``k`` batches, per batch."""
    k = batches_per_update
    if k == 1:
        return pred
    return dataclasses.replace(
        pred,
        step_s=pred.step_s / k,
        low_s=pred.low_s / k,
        high_s=pred.high_s / k,
        compute_s=pred.compute_s / k,
        comm_s=pred.comm_s / k,
        allreduce_s=pred.allreduce_s / k,
        local_batch=tuple(b // k for b in pred.local_batch),
        global_batch=pred.global_batch // k,
    )


def estimate_step_seconds(
    model: PerformanceModel, profile: Profile, offer: Offer, nodes: int
) -> float:
    """Expected seconds per step of ``nodes`` × ``offer`` under the planner's batch rules:
    the mean of the step's log-normal with the script's validation passes per step, what
    the planner prices, so that SkyPilot's optimizer ranks by the same expected time and
    cost.

    For SkyPilot's ``Task.set_time_estimator`` hook; infinite when the model does not
    fit or the accelerator is unknown, so SkyPilot's optimizer never picks it.
    """
    cand = _candidate_arrays((offer,), np.zeros((1, 1), np.int64), np.array([[nodes]]))
    out = _predict(model, profile, cand, batch_semantics(profile))
    if not bool(out.fits[0]):
        return math.inf
    paced, spread = _pace(out.step_s, out.low_s, out.high_s, out.validation_s)
    return float(paced[0] * mean_factor(spread[0]))


def _pace(
    step: np.ndarray, low: np.ndarray, high: np.ndarray, validation: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """The run's median seconds per batch (the step and the script's validation passes
    between steps) and its log-normal spread: what time and cost are priced at."""
    extra = np.zeros(np.shape(step)) if validation is None else validation
    return step + extra, step_sigma(step + extra, low + extra, high + extra)


def target_steps_at_base(profile: Profile, request: PlanRequest) -> int:
    """Steps at the profiled world size the request asks for (epochs converted)."""
    if request.target_steps is not None:
        return request.target_steps
    size = request.dataset_size
    if size is None:
        raw = profile.extra.get("dataset_size")
        if isinstance(raw, int | float) and raw >= 1:
            size = int(raw)
    if size is None:
        raise ConfigError(
            "--epochs needs the number of samples per epoch: pass --dataset-size N, or "
            "record it in the profile (SriftyCallback stores extra['dataset_size'] when the "
            "train dataloader has a length); or give --target-steps instead"
        )
    base = batch_semantics(profile).base_global_batch
    assert request.epochs is not None
    return max(1, math.ceil(request.epochs * size / base))


def default_checkpoint_s(profile: Profile) -> float:
    """Seconds to write weights and optimizer state at :data:`CHECKPOINT_WRITE_BYTES_S`."""
    m = profile.memory
    state = m.param_bytes + m.optimizer_state_bytes
    return CHECKPOINT_FIXED_S + state / CHECKPOINT_WRITE_BYTES_S


# ---------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Table:
    """Every candidate as columns; groups a/b index units (b = -1 when homogeneous)."""

    unit_a: np.ndarray
    nodes_a: np.ndarray
    unit_b: np.ndarray
    nodes_b: np.ndarray
    spot: np.ndarray
    step: np.ndarray
    low: np.ndarray
    high: np.ndarray
    validation: np.ndarray
    """Validation seconds per training batch (not in ``step``; in ``time_h``)."""
    global_batch: np.ndarray
    ok: np.ndarray
    """Fits in memory, known accelerator, within GPU limits and batch rules."""
    hourly: np.ndarray
    steps: np.ndarray
    time_h: np.ndarray
    cost: np.ndarray
    probability: np.ndarray
    interval_h: np.ndarray
    rate: np.ndarray
    trained: np.ndarray
    """Steps the run trains: ``steps``, or fewer where the script's own limits stop it."""
    stopped_by: np.ndarray
    """0: the run reaches the target; 1: the script's step limit; 2: its ``max_time``."""

    @property
    def progress(self) -> np.ndarray:
        """The share of the target each run trains (1 where it reaches it)."""
        return np.where(self.steps > 0, self.trained / np.maximum(self.steps, 1), 1.0)

    def take(self, mask: np.ndarray) -> _Table:
        return _Table(**{k: getattr(self, k)[mask] for k in self.__dataclass_fields__})


STOPPED_BY_STEPS = 1
STOPPED_BY_TIME = 2


def _script_stops(
    stop: ScriptStop | None,
    steps: np.ndarray,
    world: np.ndarray,
    paced: np.ndarray,
    sigma: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Steps each run trains before the script's own limits end it, and which limit.

    ``max_steps``/``max_epochs`` give a step on each world size (an epoch has fewer
    batches on more processes); ``max_time`` ends the run when Lightning's ``Timer`` has
    counted it, at the run's mean step, validation included (what the time is priced at).
    Both count from where the run is priced (``ScriptStop.done_steps``/``done_time_s``).
    """
    trained = np.asarray(steps, dtype=np.float64).copy()
    stopped_by = np.zeros(trained.shape, dtype=np.int8)
    if stop is None:
        return trained, stopped_by
    for w in np.unique(world):
        limit, _ = stop.steps_left_on(int(w))
        if limit is not None:
            cut = (world == w) & (trained > limit)
            trained[cut], stopped_by[cut] = float(limit), STOPPED_BY_STEPS
    time_left_s = stop.time_left_s
    if time_left_s is not None:
        mean_step = paced * mean_factor(sigma)
        with np.errstate(divide="ignore", invalid="ignore"):
            timed = np.floor(time_left_s / mean_step)
        cut = np.isfinite(timed) & (timed < trained)
        trained[cut], stopped_by[cut] = np.maximum(timed[cut], 0.0), STOPPED_BY_TIME
    return trained, stopped_by


def _mix_pairs(units: _Units) -> np.ndarray:
    """(M, 2) unit index pairs: distinct types, same region, same market."""
    pairs = []
    key = np.array([f"{r}|{int(s)}" for r, s in zip(units.region, units.spot, strict=True)])
    order = np.lexsort((units.type_index, key))
    sorted_key = key[order]
    bounds = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1], True])
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        members = order[lo:hi]
        if members.size < 2:
            continue
        i, j = np.triu_indices(members.size, 1)
        pairs.append(np.stack([members[i], members[j]], axis=1))
    return np.concatenate(pairs) if pairs else np.zeros((0, 2), dtype=np.int64)


def evaluate(
    profile: Profile,
    offers: Sequence[Offer],
    model: PerformanceModel,
    request: PlanRequest,
    *,
    odds_everywhere: bool = False,
) -> tuple[_Table, SearchSpace, int, BatchSemantics, _Units]:
    """Every candidate's step time, time to target, expected cost and deadline odds.

    The step is log-normal (median and 10-90 % interval from the model), so time and
    cost are expectations at the mean step and the deadline odds count the step's
    uncertainty. Spot rows whose expected time misses the deadline cannot be chosen:
    their odds count only the preemptions at the median step unless
    ``odds_everywhere`` (a pinned cluster, whose every row is shown).
    """
    sem = batch_semantics(profile)
    steps0 = target_steps_at_base(profile, request)
    units = build_units(offers, request, profile.environment.accelerator)
    if not units.offers:
        raise InfeasibleError(_no_units_message(offers, request))
    n_types = len(units.type_offers)
    gpn = np.array([units.gpus_used(o) for o in units.type_offers], dtype=np.int64)

    # Homogeneous: model on (type, nodes), broadcast to units.
    node_range = np.arange(1, request.max_nodes + 1, dtype=np.int64)
    if request.num_nodes is not None:
        node_range = np.array([request.num_nodes], dtype=np.int64)
    types_h = np.repeat(np.arange(n_types), node_range.size)
    nodes_h = np.tile(node_range, n_types)
    out_h = _predict(
        model, profile,
        _candidate_arrays(units.type_offers, types_h[:, None], nodes_h[:, None], units.per_node),
        sem,
    )  # fmt: skip
    u_count = len(units.offers)
    hom_unit = np.repeat(np.arange(u_count), node_range.size)
    hom_nodes = np.tile(node_range, u_count)
    hom_row = units.type_index[hom_unit] * node_range.size + np.tile(
        np.arange(node_range.size), u_count
    )

    # Mixes: model on (type pair, split), broadcast to unit pairs.
    pairs = _mix_pairs(units) if request.mixes else np.zeros((0, 2), dtype=np.int64)
    splits = np.array(
        [
            (a, b)
            for a in sorted(set(request.mix_node_counts))
            for b in sorted(set(request.mix_node_counts))
            if a + b <= request.max_nodes
            and (request.num_nodes is None or a + b == request.num_nodes)
        ],
        dtype=np.int64,
    ).reshape(-1, 2)
    model_rows = types_h.size
    if pairs.size and splits.size:
        type_pairs = units.type_index[pairs]
        codes = type_pairs[:, 0] * n_types + type_pairs[:, 1]
        distinct, pair_pos = np.unique(codes, return_inverse=True)
        ta, tb = np.divmod(distinct, n_types)
        s = splits.shape[0]
        mix_types = np.stack([np.repeat(ta, s), np.repeat(tb, s)], axis=1)
        mix_nodes = np.tile(splits, (distinct.size, 1))
        out_m = _predict(
            model,
            profile,
            _candidate_arrays(units.type_offers, mix_types, mix_nodes, units.per_node),
            sem,
        )
        model_rows += mix_types.shape[0]
        mix_unit_a = np.repeat(pairs[:, 0], s)
        mix_unit_b = np.repeat(pairs[:, 1], s)
        mix_na = np.tile(splits[:, 0], pairs.shape[0])
        mix_nb = np.tile(splits[:, 1], pairs.shape[0])
        mix_row = np.repeat(pair_pos, s) * s + np.tile(np.arange(s), pairs.shape[0])
    else:
        out_m = None
        mix_unit_a = mix_unit_b = mix_na = mix_nb = mix_row = np.zeros(0, dtype=np.int64)

    def col(name: str) -> np.ndarray:
        parts = [getattr(out_h, name)[hom_row]]
        if out_m is not None:
            parts.append(getattr(out_m, name)[mix_row])
        return np.concatenate(parts)

    unit_a = np.concatenate([hom_unit, mix_unit_a])
    unit_b = np.concatenate([np.full(hom_unit.size, -1), mix_unit_b])
    nodes_a = np.concatenate([hom_nodes, mix_na])
    nodes_b = np.concatenate([np.zeros(hom_unit.size, np.int64), mix_nb])
    safe_b = np.maximum(unit_b, 0)
    has_b = unit_b >= 0
    world = nodes_a * gpn[units.type_index[unit_a]] + np.where(
        has_b, nodes_b * gpn[units.type_index[safe_b]], 0
    )
    step, low, high = col("step_s"), col("low_s"), col("high_s")
    validation = col("validation_s") if out_h.validation_s is not None else np.zeros(step.shape)
    paced, sigma = _pace(step, low, high, validation)
    global_batch = col("global_batch")
    ok = col("fits") & np.isfinite(step) & (step > 0)
    if request.max_gpus is not None:
        ok &= world <= request.max_gpus
    steps = sem.steps_on(steps0, world)
    hourly = units.price[unit_a] * nodes_a + np.where(has_b, units.price[safe_b] * nodes_b, 0.0)
    rate = units.rate[unit_a] * nodes_a + np.where(has_b, units.rate[safe_b] * nodes_b, 0.0)
    spot = units.spot[unit_a]
    trained, stopped_by = _script_stops(request.script_stop, steps, world, paced, sigma)
    ok &= trained > 0  # a run the script ends before its first step buys nothing
    work_h = np.where(ok, trained * paced / 3600.0, np.inf)
    ckpt_s = request.checkpoint_cost_s or default_checkpoint_s(profile)
    outcome = spot_expectations(
        work_h,
        rate,
        ckpt_s / 3600.0,
        request.restart_delay_h,
        request.deadline_h,
        sigma=sigma,
        exact=np.ones(work_h.shape, bool) if odds_everywhere else None,
    )
    ok &= np.isfinite(outcome.time_h)
    table = _Table(
        unit_a=unit_a,
        nodes_a=nodes_a,
        unit_b=unit_b,
        nodes_b=nodes_b,
        spot=spot,
        step=step,
        low=low,
        high=high,
        validation=validation,
        global_batch=global_batch,
        ok=ok,
        hourly=hourly,
        steps=steps,
        time_h=outcome.time_h,
        cost=hourly * outcome.billed_h,
        probability=outcome.deadline_probability,
        interval_h=outcome.interval_h,
        rate=rate,
        trained=trained,
        stopped_by=stopped_by,
    )
    space = SearchSpace(
        units=u_count,
        instance_types=n_types,
        homogeneous=int(hom_unit.size),
        mixes=int(mix_unit_a.size),
        model_rows=int(model_rows),
    )
    return table, space, steps0, sem, units


# ---------------------------------------------------------------------------------------
# Choosing
# ---------------------------------------------------------------------------------------


def _meets(table: _Table, request: PlanRequest) -> np.ndarray:
    mask = table.ok.copy()
    if request.deadline_h is not None:
        mask &= table.time_h <= request.deadline_h
        mask &= table.probability >= request.min_deadline_probability
    if request.budget_usd is not None:
        mask &= table.cost <= request.budget_usd
    return mask


def _no_units_message(offers: Sequence[Offer], request: PlanRequest) -> str:
    """Why no instance type is left to search (the script's own devices, usually)."""
    if request.gpus_per_node is not None:
        widest = max((o.accelerator_count for o in offers), default=0)
        return (
            f"no candidate cluster: the script fixes Trainer(devices={request.gpus_per_node}) "
            f"but no allowed instance type has that many GPUs (the most is {widest}); lower "
            "devices= in the script, or widen --regions/--families"
        )
    return (
        "no candidate cluster: no instance type in the allowed regions, families and "
        "markets has a GPU the job can train on (widen --regions or --families)"
    )


def _check_limits_left(table: _Table, stop: ScriptStop | None) -> None:
    """Raises :class:`ScriptLimitsReachedError` where the script's own limits end every
    candidate before its first step (no other reason leaves a run 0 steps to train)."""
    if stop is None or (table.trained > 0).any():
        return
    settings = sorted({_stop_setting(stop, int(c), 1) for c in np.unique(table.stopped_by) if c})
    where = f"step {stop.done_steps:,}"
    if stop.max_time_s is not None:
        where += f" after {dt.timedelta(seconds=round(stop.done_time_s))} of training"
    raise ScriptLimitsReachedError(
        f"the script's own Trainer({', '.join(s for s in settings if s)}) leaves no step to "
        f"train from {where}: a run there only ends; lift the limit in the script to train "
        "further"
    )


def _infeasible_message(table: _Table, request: PlanRequest) -> str:
    fits = table.ok
    if not fits.any():
        return (
            "no candidate cluster can run this job: no instance type in the search space "
            "fits the model in GPU memory with a known accelerator (widen --regions, "
            "--families, --max-nodes/--max-gpus, or allow spot/on-demand)"
        )
    parts = []
    if request.deadline_h is not None:
        fastest = float(table.time_h[fits].min())
        on_time = fits & (table.time_h <= request.deadline_h)
        if fastest > request.deadline_h:
            parts.append(
                f"the fastest plan needs {fastest:.1f} h > deadline {request.deadline_h:.3g} h"
            )
        elif not (on_time & (table.probability >= request.min_deadline_probability)).any():
            best = float(table.probability[on_time].max())
            parts.append(
                f"no plan meets the deadline {request.deadline_h:.3g} h with probability >= "
                f"{request.min_deadline_probability:.0%} (best {best:.0%}, counting the step "
                "time's uncertainty and spot preemptions; lower --confidence, extend "
                "--deadline, or use on-demand)"
            )
        else:
            meeting = on_time & (table.probability >= request.min_deadline_probability)
            cheapest = float(table.cost[meeting].min())
            budget = request.budget_usd or math.inf
            parts.append(
                f"the cheapest plan meeting the deadline costs ${cheapest:,.2f} > budget "
                f"${budget:,.2f}"
            )
    elif request.budget_usd is not None:
        cheapest = float(table.cost[fits].min())
        parts.append(
            f"the cheapest plan costs ${cheapest:,.2f} > budget ${request.budget_usd:,.2f}"
        )
    return "no plan meets the constraints: " + "; ".join(parts)


def _smallest_first(
    primary: np.ndarray, secondary: np.ndarray, idx: np.ndarray, k: int
) -> np.ndarray:
    """The best ``k`` of ``idx`` by (primary, secondary), with every tie of the k-th.

    A partition instead of a full sort: over a million candidates this is ten times
    faster, and the caller asks again with a larger ``k`` if it needs more.
    """
    if idx.size > k:
        p = primary[idx]
        threshold = np.partition(p, k - 1)[k - 1]
        idx = idx[p <= threshold]
    return idx[np.lexsort((secondary[idx], primary[idx]))]


def _ranking(
    table: _Table, mask: np.ndarray, objective: str, front: np.ndarray, pool: int
) -> np.ndarray:
    """At least ``pool`` candidates of ``mask`` (all if fewer), best first.

    ``front`` holds the indices of the Pareto front of ``mask`` (used by ``knee``).
    """
    idx = np.flatnonzero(mask)
    if objective == "cost":
        return _smallest_first(table.cost, table.time_h, idx, pool)
    if objective == "time":
        return _smallest_first(table.time_h, table.cost, idx, pool)
    t, c = table.time_h[front], table.cost[front]
    knee = knee_index(t, c)
    tn = (t - t.min()) / max(float(np.ptp(t)), 1e-300)
    cn = (c - c.min()) / max(float(np.ptp(c)), 1e-300)
    # After the knee, the rest of the front by closeness to it (normalised axes).
    distance = np.hypot(tn - tn[knee], cn - cn[knee])
    return front[np.argsort(distance, kind="stable")]


def _front_of(table: _Table, mask: np.ndarray) -> np.ndarray:
    idx = np.flatnonzero(mask)
    front = idx[pareto_front(table.time_h[idx], table.cost[idx])]
    return front[np.argsort(table.time_h[front], kind="stable")]


def _stop_setting(stop: ScriptStop | None, code: int, world: int) -> str:
    """The script's setting that ends a run stopped with ``code`` (``_script_stops``)."""
    if stop is None or code == 0:
        return ""
    return stop.time_setting if code == STOPPED_BY_TIME else stop.steps_left_on(world)[1]


def _per_target(table: _Table) -> _Table:
    """``table`` with each run's time and cost per whole target (what a run the script
    stops early would need for all of it): plans are ranked on the work they buy."""
    share = table.progress
    with np.errstate(divide="ignore", invalid="ignore"):
        return dataclasses.replace(
            table,
            time_h=np.where(share > 0, table.time_h / share, np.inf),
            cost=np.where(share > 0, table.cost / share, np.inf),
        )


def _reaching(table: _Table, mask: np.ndarray) -> np.ndarray:
    """The rows of ``mask`` whose run reaches the target, if any does: a plan the script
    stops early is chosen only when none reaches it."""
    reaching = mask & (table.stopped_by == 0)
    return reaching if reaching.any() else mask


def _plan(
    table: _Table, units: _Units, i: int, label: str = "", stop: ScriptStop | None = None
) -> Plan:
    offer_a = units.offers[int(table.unit_a[i])]
    groups = [ClusterGroup(offer_a, int(table.nodes_a[i]), units.gpus_used(offer_a))]
    if table.unit_b[i] >= 0:
        offer_b = units.offers[int(table.unit_b[i])]
        groups.append(ClusterGroup(offer_b, int(table.nodes_b[i]), units.gpus_used(offer_b)))
    spot = bool(table.spot[i])
    interval = float(table.interval_h[i])
    cluster = Cluster(tuple(groups))
    return Plan(
        cluster=cluster,
        use_spot=spot,
        step_s=float(table.step[i]),
        step_low_s=float(table.low[i]),
        step_high_s=float(table.high[i]),
        validation_s=float(table.validation[i]),
        global_batch=int(table.global_batch[i]),
        per_process_batch=int(table.global_batch[i]) // max(cluster.world_size, 1),
        steps_to_target=int(table.steps[i]),
        time_to_target_h=float(table.time_h[i]),
        cost_usd=float(table.cost[i]),
        hourly_usd=float(table.hourly[i]),
        deadline_probability=float(table.probability[i]),
        checkpoint_interval_s=interval * 3600.0 if spot and math.isfinite(interval) else None,
        preemptions_per_hour=float(table.rate[i]),
        label=label,
        stops_at_step=int(table.trained[i]) if table.stopped_by[i] else None,
        stopped_by=_stop_setting(stop, int(table.stopped_by[i]), cluster.world_size),
    )


def _top(
    table: _Table, units: _Units, order: np.ndarray, k: int, stop: ScriptStop | None = None
) -> list[Plan]:
    """First ``k`` plans of ``order`` with distinct (cluster, market), best kept."""
    seen: set[tuple[str, bool]] = set()
    plans = []
    for i in order:
        plan = _plan(table, units, int(i), stop=stop)
        key = (plan.cluster.describe(), plan.use_spot)
        if key in seen:
            continue
        seen.add(key)
        plans.append(plan)
        if len(plans) == k:
            break
    return plans


def _baselines(table: _Table, units: _Units, request: PlanRequest, objective: str) -> list[Plan]:
    stop = request.script_stop
    single_od = table.ok & ~table.spot & (table.unit_b < 0) & (table.nodes_a == 1)
    out = []
    if single_od.any():
        idx = np.flatnonzero(single_od)
        cheapest = idx[np.lexsort((table.step[idx], table.hourly[idx]))[0]]
        out.append(
            _plan(table, units, int(cheapest), "cheapest $/h that fits (SkyPilot default)", stop)
        )
        mean_step = table.step[idx] * mean_factor(
            step_sigma(table.step[idx], table.low[idx], table.high[idx])
        )
        fastest = idx[np.lexsort((table.hourly[idx], mean_step))[0]]
        out.append(_plan(table, units, int(fastest), "fastest single node", stop))
    on_demand = _reaching(table, _meets(table, request) & ~table.spot)
    if on_demand.any():
        ranked = _per_target(table)
        front = _front_of(ranked, on_demand) if objective == "knee" else on_demand[:0]
        best = _ranking(ranked, on_demand, objective, front, 1)[0]
        out.append(_plan(table, units, int(best), "best on-demand only", stop))
    return out


def _batch_note(sem: BatchSemantics, steps0: int) -> str:
    """What a plan's steps and batch mean, in one phrase."""
    samples = steps0 * sem.base_global_batch
    text = (
        f"every process keeps the script's batch of {sem.per_process_batch} (global batch "
        f"{sem.per_process_batch} x GPUs); the target is {steps0:,} steps on "
        f"{sem.profiled_world} process{'es' if sem.profiled_world != 1 else ''}, "
        f"{samples:,} samples, on any cluster"
    )
    if sem.noise_scale is not None:
        text += f", rescaled by statistical efficiency (noise scale {sem.noise_scale:.3g})"
    return text


def _stop_notes(table: _Table, chosen_from: np.ndarray, stop: ScriptStop | None) -> list[str]:
    """What the script's own limits do to the plans, in one phrase (none if nothing)."""
    if stop is None or not table.stopped_by[table.ok].any():
        return []
    if (table.stopped_by[chosen_from] == 0).any():
        return [
            "the script's own Trainer limits end some runs before the target: those are "
            "priced to where they stop, and ranked below every plan that reaches it"
        ]
    return [
        "the script's own Trainer limits end every run before the target: each plan is "
        "priced to where it stops, and ranked by its time and cost per whole target"
    ]


def plan(
    profile: Profile,
    offers: Sequence[Offer],
    model: PerformanceModel,
    request: PlanRequest,
) -> PlanResult:
    """Ranks every candidate cluster for ``profile`` and returns the best ``top_k``.

    Raises:
        InfeasibleError: nothing meets the deadline/budget; the message says what the
            fastest and the cheapest achievable plans need.
        ConfigError: the target cannot be computed (epochs without a dataset size).
    """
    table, space, steps0, sem, units = evaluate(profile, offers, model, request)
    _check_limits_left(table, request.script_stop)
    meets = _meets(table, request)
    if not meets.any():
        raise InfeasibleError(_infeasible_message(table, request))
    meets = _reaching(table, meets)
    ranked = _per_target(table)
    on_front = _front_of(ranked, meets)
    available = int(meets.sum())
    pool = 64 * request.top_k
    while True:
        order = _ranking(ranked, meets, request.objective, on_front, pool)
        plans = _top(table, units, order, request.top_k, request.script_stop)
        if len(plans) == request.top_k or order.size >= available or pool >= available:
            break
        pool = available
    notes = [_batch_note(sem, steps0), *_stop_notes(table, meets, request.script_stop)]
    notes.extend(_loader_notes(profile, model, plans[0] if plans else None))
    return PlanResult(
        plans=tuple(plans),
        baselines=tuple(_baselines(table, units, request, request.objective)),
        front=tuple((float(table.time_h[i]), float(table.cost[i])) for i in on_front),
        space=space,
        target_steps_at_base=steps0,
        batch=sem,
        notes=tuple(notes),
    )


def _loader_notes(profile: Profile, model: PerformanceModel, best: Plan | None) -> list[str]:
    """Where the training loader's workers, not the GPU, set plan #1's step: what would
    shorten it (the model's loader floor, :class:`~lightning_srifty.core.profile.DataLoading`)."""
    loading = profile.data_loading
    if loading is None or best is None:
        return []
    try:
        predicted = model.predict(profile, best.cluster, local_batch=best.per_process_batch or None)
    except PredictionError:
        return []
    if not predicted.loader_bound:
        return []
    group = best.cluster.groups[0]
    per_process = group.offer.vcpus / max(group.gpus_per_node, 1)
    per_sample = loading.cpu_s_per_sample(profile.environment.local_batch_size)
    if loading.workers < per_process:
        remedy = (
            f"more num_workers (up to the {per_process:g} vCPUs per process of "
            f"{group.offer.instance_type})"
        )
    else:
        remedy = (
            f"more vCPUs per GPU than {group.offer.instance_type}'s {per_process:g}, "
            f"with num_workers to match,"
        )
    return [
        f"plan #1's step is set by the training loader's {loading.workers} worker(s) "
        f"({per_sample * 1e3:.3g} ms of CPU a sample), not by its GPUs: {remedy} or "
        f"cheaper samples would shorten it"
    ]


def parse_pinned(text: str) -> tuple[tuple[str, int], ...]:
    """``"g4dn.12xlarge:2,p3.8xlarge:1"`` -> ((type, nodes), ...) for ``--cluster``.

    Raises:
        ConfigError: not one or two ``TYPE:N`` groups with ``N >= 1`` and distinct types.
    """
    groups = []
    for part in text.split(","):
        name, sep, count = part.strip().rpartition(":")
        if not sep or not name or not count.isdigit() or int(count) < 1:
            raise ConfigError(
                f"--cluster {text!r} is not valid: use TYPE:N[,TYPE:N], e.g. g4dn.12xlarge:2"
            )
        groups.append((name, int(count)))
    if len(groups) > 2:
        raise ConfigError(f"--cluster {text!r}: at most two instance types (a two-type mix)")
    if len({name for name, _ in groups}) != len(groups):
        raise ConfigError(f"--cluster {text!r} names an instance type twice")
    return tuple(groups)


def plan_pinned(
    profile: Profile,
    offers: Sequence[Offer],
    model: PerformanceModel,
    request: PlanRequest,
    pinned: Sequence[tuple[str, int]],
) -> PlanResult:
    """Prices the one cluster shape the user pinned (``--cluster TYPE:N[,TYPE:N]``).

    The shape is not searched; where it runs is (zones and markets the request allows),
    with the same model, spot expectations and memory check as :func:`plan`. A shape
    that cannot run is refused; one that misses the deadline or budget is still
    returned, with a note that says by how much.

    Raises:
        ConfigError: a type is not in the catalog, or the request's regions exclude it.
        InfeasibleError: the model does not fit the pinned shape, or it has no price.
    """
    described = ",".join(f"{name}:{nodes}" for name, nodes in pinned)
    known = {o.instance_type for o in offers}
    for name, _ in pinned:
        if name not in known:
            raise ConfigError(
                f"--cluster {described}: {name!r} is not an instance type of the catalog "
                "(or has no accelerator the job can train on)"
            )
    counts = dict(pinned)
    if request.num_nodes is not None and sum(counts.values()) != request.num_nodes:
        raise ConfigError(
            f"--cluster {described} has {sum(counts.values())} node(s) but the script fixes "
            f"Trainer(num_nodes={request.num_nodes}); pin that many nodes or change the script"
        )
    per_node = request.gpus_per_node
    for name in counts:
        widest = max(o.accelerator_count for o in offers if o.instance_type == name)
        if per_node is not None and widest < per_node:
            raise ConfigError(
                f"--cluster {described}: {name} has {widest} GPU(s) per node but the script "
                f"fixes Trainer(devices={per_node}); pin a type with at least {per_node}"
            )
    wide = dataclasses.replace(
        request,
        families=(),
        exclude_families=(),
        max_gpus=None,
        max_nodes=sum(counts.values()),
        mixes=len(pinned) == 2,
        mix_node_counts=tuple(sorted(set(counts.values()))),
    )
    subset = [o for o in offers if o.instance_type in counts]
    table, space, steps0, sem, units = evaluate(profile, subset, model, wide, odds_everywhere=True)
    names = np.array([o.instance_type for o in units.offers], dtype=object)
    a = names[table.unit_a] if names.size else np.zeros(0, dtype=object)
    b = np.where(table.unit_b >= 0, names[np.maximum(table.unit_b, 0)], "") if names.size else a
    if len(pinned) == 1:
        ((name, nodes),) = pinned
        shape = (a == name) & (table.nodes_a == nodes) & (table.unit_b < 0)
    else:
        (n1, c1), (n2, c2) = pinned
        shape = ((a == n1) & (table.nodes_a == c1) & (b == n2) & (table.nodes_b == c2)) | (
            (a == n2) & (table.nodes_a == c2) & (b == n1) & (table.nodes_b == c1)
        )
    runnable = shape & table.ok
    if not shape.any():
        raise InfeasibleError(
            f"--cluster {described}: no priced offer of that shape in the allowed regions and "
            "markets (two types must share a region)"
        )
    _check_limits_left(table.take(shape), request.script_stop)
    if not runnable.any():
        raise InfeasibleError(
            f"--cluster {described} cannot run this job: the model does not fit its GPU memory, "
            "its accelerator is unknown, or it has more GPUs than the global batch has samples"
        )
    meets = runnable & _meets(table, request)
    notes = [
        f"pinned to {described}: only its zones and markets were compared",
        _batch_note(sem, steps0),
    ]
    pool_mask = meets
    if not meets.any():
        pool_mask = runnable
        why = _infeasible_message(table.take(runnable), request).split(": ", 1)[-1]
        notes.append(f"the pinned cluster misses the constraints: {why}")
    ranked = _per_target(table)
    front = _front_of(ranked, pool_mask)
    order = _ranking(ranked, pool_mask, request.objective, front, int(pool_mask.sum()))
    plans = _top(table, units, order, request.top_k, request.script_stop)
    notes.extend(_stop_notes(table, pool_mask, request.script_stop))
    return PlanResult(
        plans=tuple(plans),
        baselines=(),
        front=tuple((float(table.time_h[i]), float(table.cost[i])) for i in front),
        space=dataclasses.replace(space, homogeneous=int(shape.sum()), mixes=0),
        target_steps_at_base=steps0,
        batch=sem,
        notes=tuple(notes),
    )


def offers_by_type(offers: Sequence[Offer]) -> Mapping[str, Offer]:
    """First offer of each instance type (hardware facts are the same in every zone)."""
    out: dict[str, Offer] = {}
    for offer in offers:
        out.setdefault(offer.instance_type, offer)
    return out


PLAN_SCHEMA_VERSION = 1


def plan_to_dict(plan_: Plan) -> dict[str, Any]:
    """JSON-ready description of one plan (groups with region and zone ids).

    ``step_s`` is the median step with its 10-90 % ends; ``time_to_target_h`` and
    ``cost_usd`` are expectations at ``step_mean_s`` (the log-normal of spread
    ``step_sigma``), what the plans are ranked by.
    """
    return {
        "label": plan_.label,
        "cluster": plan_.cluster.describe(),
        "market": "spot" if plan_.use_spot else "on-demand",
        "groups": [
            {
                "instance_type": g.offer.instance_type,
                "accelerator": g.offer.accelerator,
                "nodes": g.nodes,
                "gpus_per_node": g.gpus_per_node,
                "region": g.offer.region,
                "zone": g.offer.zone,
            }
            for g in plan_.cluster.groups
        ],
        "gpus": plan_.cluster.world_size,
        "step_s": plan_.step_s,
        "step_low_s": plan_.step_low_s,
        "step_high_s": plan_.step_high_s,
        "step_mean_s": plan_.step_mean_s,
        "step_sigma": plan_.step_sigma,
        "validation_s": plan_.validation_s,
        "per_process_batch": plan_.per_process_batch,
        "global_batch": plan_.global_batch,
        "steps_to_target": plan_.steps_to_target,
        "time_to_target_h": plan_.time_to_target_h,
        "cost_usd": plan_.cost_usd,
        "hourly_usd": plan_.hourly_usd,
        "deadline_probability": plan_.deadline_probability,
        "checkpoint_interval_s": plan_.checkpoint_interval_s,
        "preemptions_per_hour": plan_.preemptions_per_hour,
        "stops_at_step": plan_.stops_at_step,
        "stopped_by": plan_.stopped_by,
    }


def result_to_dict(result: PlanResult, request: PlanRequest) -> dict[str, Any]:
    """The versioned document ``srifty plan --json`` prints."""
    best = result.best
    return {
        "schema_version": PLAN_SCHEMA_VERSION,
        "kind": "srifty-plan",
        "request": {
            "target_steps": request.target_steps,
            "epochs": request.epochs,
            "dataset_size": request.dataset_size,
            "deadline_h": request.deadline_h,
            "budget_usd": request.budget_usd,
            "objective": request.objective,
            "spot": request.allow_spot,
            "regions": list(request.regions),
            "max_nodes": request.max_nodes,
            "max_gpus": request.max_gpus,
            "families": list(request.families),
            "exclude_families": list(request.exclude_families),
            "restart_delay_h": request.restart_delay_h,
            "min_deadline_probability": request.min_deadline_probability,
        },
        "target_steps_at_base": result.target_steps_at_base,
        "per_process_batch": result.batch.per_process_batch,
        "batches_per_update": result.batch.batches_per_update,
        "profiled_world_size": result.batch.profiled_world,
        "base_global_batch": result.batch.base_global_batch,
        "search_space": {
            "units": result.space.units,
            "instance_types": result.space.instance_types,
            "homogeneous": result.space.homogeneous,
            "mixes": result.space.mixes,
            "total": result.space.total,
            "model_rows": result.space.model_rows,
        },
        "plans": [dict(plan_to_dict(p), rank=i + 1) for i, p in enumerate(result.plans)],
        "baselines": [
            dict(
                plan_to_dict(b),
                saving_usd=b.cost_usd - best.cost_usd,
                saving_h=b.time_to_target_h - best.time_to_target_h,
            )
            for b in result.baselines
        ],
        "pareto_front": [{"time_h": t, "cost_usd": c} for t, c in result.front],
        "notes": list(result.notes),
    }


WHOLE_CORE_SHARE = 0.95
"""A CPU profile's share of a core at or above which it had a core to itself."""


def profile_core_share(profile: Profile) -> float | None:
    """The share of a core a CPU profile's training thread got while it computed (from
    ``extra["host"]``, written by the callback); ``None`` when it was not measured or
    the profile ran several intra-op threads (then not comparable with the one-thread
    processes a local run starts)."""
    host = profile.extra.get("host")
    if not isinstance(host, dict):
        return None
    share, threads = host.get("cpu_share"), host.get("intra_op_threads", 1.0)
    if not isinstance(share, int | float) or not isinstance(threads, int | float):
        return None
    if share <= 0.0 or threads != 1.0:
        return None
    return min(float(share), 1.0)


def profile_blocked_share(profile: Profile) -> float:
    """The share of a CPU profile's compute time its training thread was blocked (a
    sleep, a read, a lock: neither on a core nor queued for one; ``extra["host"]``, written
    by the callback); 0 when it was not measured."""
    host = profile.extra.get("host")
    blocked = host.get("blocked_share") if isinstance(host, dict) else None
    if not isinstance(blocked, int | float) or not math.isfinite(blocked):
        return 0.0
    return min(max(float(blocked), 0.0), 1.0)


def on_shared_cores(
    pred: Prediction,
    profile_share: float,
    alone_share: float,
    run_shares: Sequence[float],
    blocked_share: float = 0.0,
) -> Prediction:
    """``pred`` for local processes that share this machine's cores, from a CPU profile
    that got ``profile_share`` of a core (CPU seconds per second of wall time), given
    what one spinning process (``alone_share``) and then ``len(run_shares)`` of them
    (``run_shares``) got just now.

    On CPU "devices" every part of a step (layers, optimizer, gloo's all-reduce) runs on
    cores the processes share with each other and with whatever else the machine runs.
    The work of a step is what it is; its wall time is the work over the share of a core
    the process gets, and the scheduler decides the shares: fair per thread, or per
    session (Linux autogroups: a session's processes split one share), or a VM's quota.
    Two estimates of the run's share: what its processes' stand-ins got now, and, when
    the profile did not have a whole core, the profile's share split the way the machine
    splits it now (``alone_share`` over the run's). The middle factor is their geometric
    mean and the interval spans both, so a machine whose load moved between the profile
    and the run says so with a wider interval. Data-parallel processes wait for each
    other at every all-reduce, so the run goes at its slowest process's pace: the share
    that counts is the smallest one measured, not their mean. The ``blocked_share`` of
    the compute that the profile spent blocked (sleeping, reading) is not lengthened by
    a smaller share of a core: a step that sleeps 20 ms of its 24 on two processes
    sharing one core takes 28 ms, not 48.
    """
    if not run_shares or alone_share <= 0.0:
        return pred
    profile_share = min(max(profile_share, 0.02), 1.0)
    now = min(max(min(run_shares), 0.02), 1.0)
    factors = [profile_share / now]
    if profile_share < WHOLE_CORE_SHARE:  # a whole core says nothing of others' load
        factors.append(max(min(alone_share, 1.0) / now, 1.0))
    mid = math.exp(sum(math.log(f) for f in factors) / len(factors))
    blocked_s = min(max(blocked_share, 0.0), 1.0) * pred.compute_s

    def scaled(seconds: float, factor: float) -> float:
        kept = min(blocked_s, seconds)
        return (seconds - kept) * factor + kept

    return dataclasses.replace(
        pred,
        step_s=scaled(pred.step_s, mid),
        low_s=scaled(pred.low_s, min(factors)),
        high_s=scaled(pred.high_s, max(factors)),
        compute_s=scaled(pred.compute_s, mid),
        comm_s=pred.comm_s * mid,
        allreduce_s=pred.allreduce_s * mid,
    )
