"""How the performance model is calibrated: one place for the whole fit.

Two stages:

1. **Physics** (:func:`fit_physics`): robust least squares of the analytic model over
   every calibration row, on the step time and, where rows carry it, the measured
   gradient-sync time. Hardware constants (one efficiency and one latency per
   transport, the fixed per-bucket and per-step costs, overlap, co-location,
   straggler spread) are shared by every job and every kind of hardware; each has a
   prior (:data:`PRIORS`), the published figure it falls back to when no fitted row
   uses it (no EFA rows: the EFA efficiency stays at its prior). The terms that also
   depend on the job get deviations with a Gaussian prior (a mixed-effects model):
   where its gradients become ready (per job, on any hardware) and how much sharing a
   node slows it (per job and hardware). The hardware constants are thus the centre
   of the jobs seen, which is what a job never seen gets. The fit is deterministic
   (fixed start at the priors, tight tolerances) and holds at its prior every constant
   the rows cannot identify, so the shipped calibration is reproduced by its recipe.
   :func:`refit_on_probes` runs the same fit on probe rows of new hardware, centred
   on an existing calibration.
2. **Learned correction** (:func:`fit_correction`): scikit-learn gradient-boosted trees
   on transferable features predict the remaining multiplicative residual, two
   quantile models (0.1/0.9) the interval, kept only if they help jobs left out of
   their fit. The trees are exported to JSON arrays and evaluated by
   :mod:`lightning_srifty.core.trees`; no pickle is ever written or read.

scikit-learn and scipy are imported lazily, only when fitting.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lightning_srifty.core.calibration import (
    EVERY_ACCELERATOR,
    FEATURE_NAMES,
    INTER_ALGORITHMS,
    NUMERIC_CONSTANTS,
    SHARES,
    Calibration,
    Correction,
    FitSource,
    HardwareTerms,
    JobTerms,
    PhysicsConstants,
    ProbedStep,
)
from lightning_srifty.core.candidates import CandidateArrays
from lightning_srifty.core.catalog import GpuSpec
from lightning_srifty.core.cluster import Cluster
from lightning_srifty.core.errors import CalibrationError
from lightning_srifty.core.perfmodel import PerformanceModel, correction_features
from lightning_srifty.core.profile import Profile
from lightning_srifty.core.trees import Tree, TreeEnsemble
from lightning_srifty.io.traces import Measurement, TraceSet, coarse_profile, placement_cluster


@dataclass(frozen=True)
class Prior:
    """Bounds and prior of one hardware constant (fitted in log space)."""

    low: float
    high: float
    centre: float
    sigma: float
    """Prior spread in natural-log units (1 = a factor e either way)."""
    source: str


PRIORS: dict[str, Prior] = {
    "tcp_efficiency": Prior(
        0.01,
        1.0,
        0.4,
        1.0,
        "NCCL over TCP sockets reaches 30-50 % of a cloud NIC in published nccl-tests "
        "runs (NVIDIA/nccl issues #209, #450; 0.4 is the middle); nccl-tests #83: NCCL "
        "is paced by its slowest socket, not the NIC's aggregate",
    ),
    "tcp_flow_gbps": Prior(
        0.5,
        100.0,
        10.0,
        1.0,
        "one TCP stream on one server core: about 10 Gbit/s at a 1500-byte MTU",
    ),
    "tcp_two_way_slowdown": Prior(
        1.0,
        3.0,
        1.0 + 1e-3,
        0.5,
        "none assumed: two-way TCP traffic slows ACK-clocked flows (Zhang, Shenker & Clark, "
        "SIGCOMM '91), how much depends on the path; only a TCP cluster's two-node rows "
        "measure it",
    ),
    "efa_efficiency": Prior(
        0.05,
        1.0,
        0.8,
        0.5,
        "aws-ofi-nccl on p4d: about 57 GB/s bus bandwidth on 4 x 100 Gbps EFA between "
        "two nodes (NVIDIA/nccl issue #527)",
    ),
    "ib_efficiency": Prior(
        0.05,
        1.0,
        0.9,
        0.5,
        "NCCL over InfiniBand verbs with GPUDirect RDMA runs close to line rate "
        "(about 23-24 GB/s per 200 Gb/s HDR port in nccl-tests)",
    ),
    "nvlink_efficiency": Prior(
        0.05,
        1.0,
        0.75,
        0.5,
        "nccl-tests all-reduce on one 8 x A100 NVSwitch node: about 230 GB/s bus "
        "bandwidth of 300 GB/s per GPU (NVIDIA/nccl issue #527)",
    ),
    "pcie_efficiency": Prior(
        0.05,
        1.0,
        0.6,
        0.7,
        "GPU-to-GPU rings over PCIe reach 50-80 % of the x16 rate, less through the "
        "host (NVIDIA/nccl issue #1530)",
    ),
    "nvlink_latency_s": Prior(1e-7, 1e-4, 2e-6, 1.5, "NCCL tuning model: ~0.6 us per NVLink hop"),
    "pcie_latency_s": Prior(
        1e-7, 5e-4, 5e-6, 1.5, "NCCL tuning model: ~1 us per PCIe hop, more through host memory"
    ),
    "tcp_latency_s": Prior(
        1e-6, 3e-4, 50e-6, 1.5, "TCP round trips inside a VPC or a host: tens of us"
    ),
    "rdma_latency_s": Prior(1e-7, 1e-4, 10e-6, 1.5, "NCCL tuning model: ~5 us per IB hop"),
    "collective_launch_s": Prior(
        1e-6, 5e-3, 50e-6, 1.5, "one NCCL kernel launch plus DDP bucket bookkeeping"
    ),
    "tail_fraction": Prior(1e-3, 1.0, 0.25, 1.0, "typical DDP bucket order"),
    "overlap_window": Prior(1e-3, 1.0, 0.75, 1.0, "typical DDP bucket order"),
    "step_overhead_s": Prior(1e-6, 1.0, 1e-3, 2.0, "DDP reducer prepare/finalize per step"),
    "colocation_slowdown": Prior(1e-5, 0.5, 0.02, 1.5, "shared host PCIe and CPUs"),
    "straggler_cv": Prior(1e-5, 0.5, 0.01, 1.5, "run-to-run variation of GPU step time"),
}
"""Bounds and priors of every numeric :class:`PhysicsConstants` field, with sources.

The bounds are physical (no transport beats its line rate, so an efficiency is at
most 1; a hop inside a node costs microseconds, so at most 100 us, and a TCP hop
at most 300 us, a slow round trip inside one data centre);
without them a fit can trade a millisecond "latency" per bucket against bandwidth,
equally well on one cluster but meaningless on another. The priors matter only for
a constant no fitted row informs."""

_NAMES = NUMERIC_CONSTANTS
_JOB_SHARES = ("tail_fraction", "overlap_window")
"""Per-job terms (the job's layer order), the same on every hardware."""
ROW_SIGMA = 0.1
"""Typical log scatter of one measured row around the model; scales the residuals so
the priors are weighed against data in the same units."""
GROUP_EFFECTIVE_ROWS = 50.0
"""Every (job, hardware) group weighs in the fit as if it had this many rows, however
many it has, so a job with 2,000 rows cannot dictate the hardware constants (nor one
with 20 be ignored)."""
JOB_PRIOR_SIGMA = 0.5
"""Prior spread of a job's own terms around the hardware value (logit or log units):
a job's rows must insist before its terms move far, and terms its rows cannot see
stay at the hardware value."""
SYNC_WEIGHT = 1.0
"""Weight of the measured gradient-synchronisation time, where rows have it: the
exposed communication is fitted to it and the compute to ``step - sync``, which
separates the two better than the step time alone."""
QUANTILES = (0.1, 0.9)
_Z90 = 1.2816
MIN_ROWS_FOR_TREES = 50
MIN_TREE_GAIN = 0.05
"""Trees are kept only if they cut the held-out jobs' median error by at least this
share: a smaller gain is within what fitting noise can buy."""


@dataclass(frozen=True)
class FitGroup:
    """Rows of one training model on one hardware, ready for vectorised scoring."""

    model: str
    profile: Profile
    candidates: CandidateArrays
    local_batch: np.ndarray
    measured_s: np.ndarray
    sync_s: np.ndarray | None = None
    """Measured gradient-synchronisation (exposed communication) time per row, if known."""
    source: str = ""
    """Fingerprint of the hardware the rows were measured on."""
    compute_scale: float = 1.0
    """Measured over predicted compute of the job on these rows' GPUs, known from a refit
    of the job's own terms (a probe): the hardware fit must not take it for a hardware
    constant."""

    @property
    def size(self) -> int:
        return int(self.measured_s.shape[0])

    @property
    def instance_type(self) -> str:
        return self.profile.environment.instance_type or ""

    @property
    def multi_node(self) -> bool:
        """Whether any row spans nodes (where the all-reduce outlasts backward)."""
        return bool(np.any(self.candidates.nodes.sum(axis=1) > 1))


def fit_group(traces: TraceSet, model: str, rows: Sequence[Measurement]) -> FitGroup:
    """Pairs ``rows`` with the coarse profile from the model's single-GPU rows."""
    profile = coarse_profile(traces.models[model], traces.single_gpu_rows(model), traces.hardware)
    clusters = [placement_cluster(r.placement, traces.hardware) for r in rows]
    candidates = CandidateArrays.from_clusters(clusters)
    # fixed-width strings: the fit scores these rows thousands of times
    candidates = replace(candidates, accelerator=candidates.accelerator.astype(str))
    return FitGroup(
        model=model,
        profile=profile,
        candidates=candidates,
        local_batch=np.asarray([r.local_bsz for r in rows], dtype=np.int64),
        measured_s=np.asarray([r.step_time for r in rows], dtype=np.float64),
        sync_s=np.asarray([r.sync_time for r in rows], dtype=np.float64),
        source=traces.hardware.fingerprint,
    )


def trace_groups(traces: TraceSet, models: Sequence[str] | None = None) -> list[FitGroup]:
    """One group per model with the multi-GPU rows of a trace folder."""
    return [
        fit_group(traces, model, [r for r in rows if r.replicas > 1])
        for model, rows in traces.rows.items()
        if models is None or model in models
    ]


def trace_source(traces: TraceSet, name: str) -> FitSource:
    """Provenance record of a trace folder used in a fit."""
    return FitSource(
        name=name,
        hardware=traces.hardware.describe(),
        fingerprint=traces.hardware.fingerprint,
        models=tuple(traces.rows),
        rows=sum(1 for rows in traces.rows.values() for r in rows if r.replicas > 1),
    )


def analytic_predictions(
    groups: Sequence[FitGroup],
    physics: PhysicsConstants,
    gpu_specs: dict[str, GpuSpec],
    jobs: Sequence[JobTerms] = (),
) -> list[np.ndarray]:
    """Step times of the physics model alone (no learned correction)."""
    model = PerformanceModel(gpu_specs, Calibration(physics=physics, jobs=tuple(jobs)))
    return [
        model.predict_batch(g.profile, g.candidates, local_batch=g.local_batch).step_s
        for g in groups
    ]


def _to_vector(physics: PhysicsConstants, priors: Mapping[str, Prior] | None = None) -> np.ndarray:
    values = physics.to_dict()
    table = priors or PRIORS
    out = []
    for name in _NAMES:
        p = table[name]
        out.append(math.log(min(max(values[name], p.low * 1.0001), p.high * 0.9999)))
    return np.asarray(out)


def _from_vector(x: np.ndarray, algorithm: str = "ring") -> PhysicsConstants:
    values = {name: float(math.exp(v)) for name, v in zip(_NAMES, x, strict=True)}
    return PhysicsConstants(**values, inter_algorithm=algorithm)


def _shifted(name: str, hardware: float, offset: float) -> float:
    """A job's term: the hardware value moved by ``offset`` in logit or log space."""
    if name in SHARES:
        p = min(max(hardware, 1e-4), 1 - 1e-4)
        z = min(max(math.log(p / (1 - p)) + offset, -40.0), 40.0)
        return float(1.0 / (1.0 + math.exp(-z)))
    return float(max(hardware, 1e-9) * math.exp(min(max(offset, -40.0), 40.0)))


@dataclass(frozen=True)
class _Layout:
    """Where each job's terms sit in the parameter vector of the mixed-effects fit.

    After the hardware constants come, per job, its overlap terms (``tail_fraction``,
    and ``overlap_window`` when some row of the job crosses nodes), then, per (job,
    hardware) group with several GPUs on a node, its co-location term.
    """

    jobs: tuple[str, ...]
    job_terms: tuple[tuple[str, ...], ...]
    colocated: tuple[tuple[str, str], ...]
    """(job, instance type) pairs with their own co-location term."""

    @property
    def hardware_size(self) -> int:
        return len(_NAMES)

    @property
    def size(self) -> int:
        return self.hardware_size + sum(len(t) for t in self.job_terms) + len(self.colocated)

    def job_slice(self, job: str) -> slice:
        start = self.hardware_size
        for name, terms in zip(self.jobs, self.job_terms, strict=True):
            if name == job:
                return slice(start, start + len(terms))
            start += len(terms)
        raise KeyError(job)

    def colocation_index(self, job: str, instance_type: str) -> int | None:
        key = (job, instance_type)
        if key not in self.colocated:
            return None
        return self.hardware_size + sum(len(t) for t in self.job_terms) + self.colocated.index(key)

    def unpack(self, x: np.ndarray, algorithm: str) -> tuple[PhysicsConstants, list[JobTerms]]:
        physics = _from_vector(x[: self.hardware_size], algorithm)
        values = physics.to_dict()
        out = []
        for job, terms in zip(self.jobs, self.job_terms, strict=True):
            own = {name: values[name] for name in _JOB_SHARES}
            for name, offset in zip(terms, x[self.job_slice(job)], strict=True):
                own[name] = _shifted(name, values[name], float(offset))
            kinds = [k for j, k in self.colocated if j == job] or [""]
            for kind in kinds:
                index = self.colocation_index(job, kind)
                coloc = values["colocation_slowdown"]
                if index is not None:
                    coloc = _shifted("colocation_slowdown", coloc, float(x[index]))
                out.append(
                    JobTerms(
                        name=job,
                        tail_fraction=own["tail_fraction"],
                        overlap_window=own["overlap_window"],
                        colocation_slowdown=coloc,
                        instance_type=kind,
                    )
                )
        return physics, out


def _layout(groups: Sequence[FitGroup]) -> _Layout:
    jobs = tuple(dict.fromkeys(g.model for g in groups))
    across = {j: any(g.multi_node for g in groups if g.model == j) for j in jobs}
    terms = tuple(tuple(t for t in _JOB_SHARES if t != "overlap_window" or across[j]) for j in jobs)
    colocated = tuple(
        dict.fromkeys(
            (g.model, g.instance_type) for g in groups if np.any(g.candidates.gpus_per_node > 1)
        )
    )
    return _Layout(jobs, terms, colocated)


def _terms_for(terms: Sequence[JobTerms], group: FitGroup) -> JobTerms | None:
    mine = [t for t in terms if t.name == group.model]
    here = next((t for t in mine if t.instance_type == group.instance_type), None)
    return here or (mine[0] if mine else None)


def fit_physics(
    groups: Sequence[FitGroup],
    gpu_specs: dict[str, GpuSpec] | None = None,
    start: PhysicsConstants | None = None,
    *,
    priors: Mapping[str, Prior] | None = None,
    hold_unidentified: bool = True,
    algorithms: Sequence[str] = INTER_ALGORITHMS,
) -> tuple[PhysicsConstants, tuple[JobTerms, ...]]:
    """Hardware constants and every job's own terms, in one mixed-effects fit.

    Robust least squares on ``log(predicted/measured)`` of the step time, plus, where
    rows carry it, the exposed communication against the measured sync time and the
    compute against ``step - sync``. Each (job, hardware) group weighs the same
    (:data:`GROUP_EFFECTIVE_ROWS`); the hardware constants are pulled towards their
    ``priors`` (:data:`PRIORS` unless given); a job's own terms are deviations from the
    hardware value with a Gaussian prior (:data:`JOB_PRIOR_SIGMA`).

    The answer is the recipe's, not the optimiser's: every fit starts from the priors'
    centres (or ``start``), runs to tight tolerances, and a constant the rows cannot
    identify (the data shrink its prior spread by less than :data:`HOLD_SHRINK`, and
    they accept its prior value, :data:`HOLD_COST`) is held at its prior and the rest
    refitted, so a flat valley of the fit never leaves a constant wherever the
    optimiser happened to stop. ``hold_unidentified=False`` skips the holding. NCCL's
    inter-node algorithm is ``"ring"`` unless ``"tree"`` fits clearly better
    (:data:`ALGORITHM_MARGIN`).
    """
    usable = [g for g in groups if g.size > 0]
    if not usable:
        raise CalibrationError("no multi-GPU rows to calibrate from")
    table = dict(priors or PRIORS)
    specs = dict(gpu_specs or {})
    held: dict[str, float] = {}
    first = start or PhysicsConstants(
        **{n: table[n].centre for n in _NAMES},  # type: ignore[arg-type]
    )
    # NCCL's ring first; the other algorithms start from its answer with its holds (and
    # any of their own), and must beat it clearly
    outcome = _fit_held(usable, specs, table, first, held, algorithms[0], hold_unidentified)
    for algorithm in algorithms[1:]:
        other = _fit_held(
            usable, specs, table, outcome.physics, dict(held), algorithm, hold_unidentified
        )
        if other.cost < outcome.cost * (1.0 - ALGORITHM_MARGIN):
            outcome = other
    return outcome.physics, outcome.jobs


def _fit_held(
    usable: Sequence[FitGroup],
    specs: dict[str, GpuSpec],
    table: Mapping[str, Prior],
    start: PhysicsConstants,
    held: dict[str, float],
    algorithm: str,
    hold_unidentified: bool,
) -> _Outcome:
    """Fits, holds what the rows cannot identify at its prior, refits until none is left
    (``held`` grows in place)."""
    while True:
        outcome = _fit_once(usable, specs, table, start, held, algorithm)
        newly = [n for n in outcome.unidentified if n not in held] if hold_unidentified else []
        if not newly:
            return outcome
        held.update({n: table[n].centre for n in newly})
        # the next round starts where this one ended: the held constants alone move
        start = outcome.physics


HOLD_SHRINK = 0.5
"""A constant is identified when the rows shrink its prior spread (standard deviation)
to less than this share; otherwise the fit holds it at its prior, provided the rows
accept the prior value (:data:`HOLD_COST`)."""
HOLD_COST = 1.0
"""How much the robust cost may grow when the unidentified constants are moved to their
priors together, the others left where they are (1 = two units of chi-square: within
about 1.4 standard deviations)."""
ALGORITHM_MARGIN = 0.01
"""Share by which the tree's fit must beat the ring's (robust cost) to be chosen: the
ring is NCCL's choice for the large messages that dominate a gradient, and a near tie
must not flip with the platform's rounding."""
FIT_TOL = 1e-10
FIT_MAX_NFEV = 400


@dataclass(frozen=True)
class _Outcome:
    physics: PhysicsConstants
    jobs: tuple[JobTerms, ...]
    cost: float
    unidentified: tuple[str, ...]
    """Free hardware constants whose prior spread the rows shrank by too little."""


def _fit_once(
    usable: Sequence[FitGroup],
    specs: dict[str, GpuSpec],
    table: Mapping[str, Prior],
    start: PhysicsConstants,
    held: Mapping[str, float],
    algorithm: str,
) -> _Outcome:
    """One robust MAP fit with ``held`` constants fixed at their values."""
    from scipy.optimize import least_squares  # lazy: only fitting needs scipy
    from scipy.sparse import lil_matrix

    layout = _layout(usable)
    hw = layout.hardware_size
    free = np.asarray([n not in held for n in _NAMES])
    nfree = int(free.sum())
    weights = [math.sqrt(GROUP_EFFECTIVE_ROWS / g.size) / ROW_SIGMA for g in usable]
    own_columns = []
    for g in usable:
        cols = list(range(layout.job_slice(g.model).start, layout.job_slice(g.model).stop))
        coloc = layout.colocation_index(g.model, g.instance_type)
        if coloc is not None:
            cols.append(coloc)
        own_columns.append([c - hw + nfree for c in cols])
    centres = np.log([table[n].centre for n in _NAMES])
    # a hardware term that jobs deviate from is the centre of those jobs, not a prior's
    covered = {t for terms in layout.job_terms for t in terms}
    if layout.colocated:
        covered.add("colocation_slowdown")
    sigmas = np.asarray([np.inf if n in covered else table[n].sigma for n in _NAMES])
    lows = np.log([table[n].low for n in _NAMES])
    highs = np.log([table[n].high for n in _NAMES])
    base = _to_vector(start, table)
    for n, value in held.items():
        base[_NAMES.index(n)] = math.log(min(max(value, table[n].low), table[n].high))

    def full(x: np.ndarray) -> np.ndarray:
        hw_x = base.copy()
        hw_x[free] = x[:nfree]
        return np.concatenate([hw_x, x[nfree:]])

    def residuals(x: np.ndarray, algorithm: str) -> np.ndarray:
        physics, terms = layout.unpack(full(x), algorithm)
        parts = []
        for g, w in zip(usable, weights, strict=True):
            phys = physics.for_job(_terms_for(terms, g))
            model = PerformanceModel(specs, _with_compute(phys, g))
            out = model._evaluate(g.profile, g.candidates, g.local_batch, None)
            parts.append(w * np.log(np.maximum(out["step"], 1e-12) / g.measured_s))
            if g.sync_s is not None:
                compute_measured = np.maximum(g.measured_s - g.sync_s, 1e-3 * g.measured_s)
                # a worker's own compute; waiting for stragglers counts as sync time
                own = np.maximum(out["mean_compute"], 1e-12)
                parts.append(w * SYNC_WEIGHT * (out["step"] - own - g.sync_s) / g.measured_s)
                parts.append(w * SYNC_WEIGHT * np.log(own / compute_measured))
        parts.append((x[:nfree] - centres[free]) / sigmas[free])
        parts.append(x[nfree:] / JOB_PRIOR_SIGMA)
        return np.concatenate(parts)

    # Sparsity: hardware constants touch every residual, a job's terms only its rows.
    size = nfree + layout.size - hw
    n_data = sum(g.size * (3 if g.sync_s is not None else 1) for g in usable)
    sparsity = lil_matrix((n_data + size, size), dtype=np.int8)
    sparsity[:n_data, :nfree] = 1
    row = 0
    for g, cols in zip(usable, own_columns, strict=True):
        span = g.size * (3 if g.sync_s is not None else 1)
        for c in cols:
            sparsity[row : row + span, c] = 1
        row += span
    for k in range(size):
        sparsity[n_data + k, k] = 1

    lower = np.concatenate([lows[free], np.full(layout.size - hw, -np.inf)])
    upper = np.concatenate([highs[free], np.full(layout.size - hw, np.inf)])
    guess = np.concatenate([base[free], np.zeros(layout.size - hw)])
    guess = np.clip(guess, lower + 1e-9, upper - 1e-9)
    best = least_squares(
        residuals, guess, bounds=(lower, upper), loss="soft_l1", f_scale=1.0,
        max_nfev=FIT_MAX_NFEV, args=(algorithm,), jac_sparsity=sparsity,
        ftol=FIT_TOL, xtol=FIT_TOL, gtol=FIT_TOL,
    )  # fmt: skip
    physics, terms = layout.unpack(full(best.x), algorithm)
    # a job's terms count the rows of its hardware, or all its rows where they are shared
    sized = tuple(
        replace(
            t,
            rows=sum(
                g.size
                for g in usable
                if g.model == t.name and t.instance_type in ("", g.instance_type)
            ),
        )
        for t in terms
    )
    names = [n for n in _NAMES if n not in held]
    shrink = _posterior_shrink(best.jac, n_data, nfree, [table[n].sigma for n in names])
    at_bound = (best.x[:nfree] <= lower[:nfree] + 1e-6) | (best.x[:nfree] >= upper[:nfree] - 1e-6)
    # flat where it stopped is not enough: the rows must also accept the prior values,
    # all of them at once (a tiny co-location slowdown is flat in log space, yet rows
    # reject a large one; two latencies each harmless alone may not be together)
    candidates = [i for i in range(nfree) if shrink[i] > HOLD_SHRINK and not at_bound[i]]

    def cost_with_priors(indices: Sequence[int]) -> float:
        moved = best.x.copy()
        for i in indices:
            moved[i] = centres[_NAMES.index(names[i])]
        return _robust_cost(residuals(moved, algorithm)) - float(best.cost)

    alone = sorted(candidates, key=lambda i: (cost_with_priors([i]), i))
    chosen: list[int] = []
    for i in alone:
        if cost_with_priors([*chosen, i]) <= HOLD_COST:
            chosen.append(i)
    unidentified = [names[i] for i in sorted(chosen)]
    return _Outcome(physics, sized, float(best.cost), tuple(unidentified))


def _with_compute(phys: PhysicsConstants, group: FitGroup) -> Calibration:
    """A calibration of ``phys`` alone, with the group's known compute scale."""
    name = group.profile.model_name
    if group.compute_scale == 1.0 or not name:
        return Calibration(physics=phys)
    carried = JobTerms(
        name=name,
        tail_fraction=phys.tail_fraction,
        overlap_window=phys.overlap_window,
        colocation_slowdown=phys.colocation_slowdown,
        compute_scale=group.compute_scale,
        accelerator=EVERY_ACCELERATOR,
    )
    return Calibration(physics=phys, jobs=(carried,))


def _robust_cost(residuals: np.ndarray) -> float:
    """``least_squares``'s cost with ``loss="soft_l1"``: ``sum(sqrt(1 + r²) - 1)``."""
    return float(np.sum(np.sqrt(1.0 + np.square(residuals)) - 1.0))


def _posterior_shrink(
    jac: Any, n_data: int, nfree: int, prior_sigmas: Sequence[float]
) -> np.ndarray:
    """Posterior over prior standard deviation of each free hardware constant.

    The information of the rows (``JᵀJ`` of the weighted data residuals, job terms
    marginalised through their own priors) plus each constant's prior information,
    inverted: what the fit knows about the constant with every correlated constant and
    job term free to move. 1 means the rows taught nothing.
    """
    dense = jac.toarray() if hasattr(jac, "toarray") else np.asarray(jac)
    data = dense[:n_data]
    info = data.T @ data
    prior = np.zeros(info.shape[0])
    prior[:nfree] = 1.0 / np.square(np.asarray(prior_sigmas, dtype=np.float64))
    prior[nfree:] = 1.0 / JOB_PRIOR_SIGMA**2
    cov = np.linalg.pinv(info + np.diag(prior), hermitian=True)
    return np.sqrt(np.maximum(np.diag(cov)[:nfree], 0.0)) * np.sqrt(prior[:nfree])


def _export_gbr(estimator: Any, sample: np.ndarray) -> TreeEnsemble:
    """Turns a fitted ``GradientBoostingRegressor`` into plain arrays.

    The constant the boosting starts from is recovered from one prediction rather than
    from private attributes, so the export survives scikit-learn refactors.
    """
    trees = []
    for stage in estimator.estimators_[:, 0]:
        t = stage.tree_
        trees.append(
            Tree(
                feature=tuple(int(f) if f >= 0 else 0 for f in t.feature),
                threshold=tuple(float(v) for v in t.threshold),
                left=tuple(int(v) for v in t.children_left),
                right=tuple(int(v) for v in t.children_right),
                value=tuple(float(v) for v in t.value[:, 0, 0]),
            )
        )
    partial = TreeEnsemble(0.0, float(estimator.learning_rate), tuple(trees))
    base = float(estimator.predict(sample[:1])[0] - partial.predict(sample[:1])[0])
    return replace(partial, base=base)


def _correction_data(
    groups: Sequence[FitGroup],
    physics: PhysicsConstants,
    specs: dict[str, GpuSpec],
    jobs: Sequence[JobTerms],
    by: str = "model",
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per job (``by="model"``) or per hardware (``by="source"``): correction features
    and ``log(measured/predicted)`` of its rows."""
    model = PerformanceModel(specs, Calibration(physics=physics, jobs=tuple(jobs)))
    parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for g in groups:
        if g.size == 0:
            continue
        out = model._evaluate(g.profile, g.candidates, g.local_batch, None)
        world = (g.candidates.nodes * g.candidates.gpus_per_node).sum(axis=1)
        nodes = g.candidates.nodes.sum(axis=1)
        gmax = np.where(g.candidates.nodes > 0, g.candidates.gpus_per_node, 0).max(axis=1)
        x = correction_features(
            world, nodes, gmax, out["allreduce"], out["compute"], out["step"] - out["compute"]
        )
        key = g.model if by == "model" else g.source
        parts.setdefault(key, []).append((x, np.log(g.measured_s / out["step"])))
    return {
        job: (np.vstack([x for x, _ in v]), np.concatenate([y for _, y in v]))
        for job, v in parts.items()
    }


def _fit_trees(
    data: dict[str, tuple[np.ndarray, np.ndarray]], losses: Sequence[tuple[str, float]], seed: int
) -> list[Any]:
    """Gradient-boosted trees over every job's rows, each job weighing the same."""
    from sklearn.ensemble import GradientBoostingRegressor  # lazy: only fitting needs it

    x_all = np.vstack([x for x, _ in data.values()])
    y_all = np.concatenate([y for _, y in data.values()])
    w_all = np.concatenate([np.full(len(y), len(data) / len(y)) for _, y in data.values()])
    common = {"n_estimators": 60, "max_depth": 3, "learning_rate": 0.1, "subsample": 0.8,
              "min_samples_leaf": 20, "random_state": seed}  # fmt: skip
    out = []
    for loss, alpha in losses:
        extra = {"alpha": alpha} if loss == "quantile" else {}
        gbr = GradientBoostingRegressor(loss=loss, **common, **extra)
        out.append(gbr.fit(x_all, y_all, sample_weight=w_all))
    return out


def transfer_gain(data: dict[str, tuple[np.ndarray, np.ndarray]], seed: int = 0) -> float:
    """How much trees fitted on the other jobs shrink each job's error: the share by
    which the pooled median absolute log error falls (negative when it grows).

    The correction is only worth applying if what it learns is a property of the
    hardware rather than of the jobs it saw; leaving each job out in turn is the test.
    """
    before, after = [], []
    for job, (x, y) in data.items():
        others = {k: v for k, v in data.items() if k != job}
        (median,) = _fit_trees(others, [("squared_error", 0.5)], seed)
        before.append(np.abs(y))
        after.append(np.abs(y - median.predict(x)))
    ratio = float(np.median(np.concatenate(after))) / float(np.median(np.concatenate(before)))
    return 1.0 - ratio


def fit_correction(
    groups: Sequence[FitGroup],
    physics: PhysicsConstants,
    gpu_specs: dict[str, GpuSpec] | None = None,
    jobs: Sequence[JobTerms] = (),
    *,
    seed: int = 0,
    require_transfer: bool = True,
) -> Correction | None:
    """Boosted trees on the log residual of the physics model (median + quantiles).

    Returns ``None`` when there are too few rows, or (``require_transfer``) when trees
    fitted without a job do not predict that job better than the physics alone by at
    least :data:`MIN_TREE_GAIN` (:func:`transfer_gain`; it needs two jobs to tell), or,
    when the rows come from several kinds of hardware, when trees fitted without one
    kind do not predict it better by as much.
    """
    specs = dict(gpu_specs or {})
    data = _correction_data(groups, physics, specs, jobs)
    if sum(len(y) for _, y in data.values()) < MIN_ROWS_FOR_TREES:
        return None
    if require_transfer:
        if len(data) < 2 or transfer_gain(data, seed) < MIN_TREE_GAIN:
            return None
        # a calibration that spans several kinds of hardware is used on hardware it has
        # never seen: the trees must also help a kind of hardware left out of their fit
        kinds = _correction_data(groups, physics, specs, jobs, by="source")
        if len(kinds) > 1 and transfer_gain(kinds, seed) < MIN_TREE_GAIN:
            return None
    losses = [("squared_error", 0.5), ("quantile", QUANTILES[0]), ("quantile", QUANTILES[1])]
    fitted = _fit_trees(data, losses, seed)
    sample = np.vstack([x for x, _ in data.values()])
    ensembles = [_export_gbr(gbr, sample) for gbr in fitted]
    return Correction(FEATURE_NAMES, ensembles[0], ensembles[1], ensembles[2], QUANTILES)


def _log_ratios(groups: Sequence[FitGroup], preds: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """``log(measured/predicted)`` per (job, hardware) over all its rows."""
    out: dict[str, list[np.ndarray]] = {}
    for g, p in zip(groups, preds, strict=True):
        if g.size:
            out.setdefault(f"{g.model}@{g.source}", []).append(np.log(g.measured_s / p))
    return {k: np.concatenate(v) for k, v in out.items()}


def new_job_spread(offsets: Sequence[float]) -> float:
    """Predictive spread (log units) of where a job never seen sits off the model.

    ``offsets`` are the median log errors of the calibration jobs scored with the
    hardware values. A new job is one more draw: a Student-t prediction interval,
    ``s·sqrt(1 + 1/K)·t(0.9, K-1)``, expressed as the normal-equivalent sigma that the
    model combines with the row scatter.
    """
    from scipy.stats import t as student_t  # lazy: only fitting needs scipy

    k = len(offsets)
    if k < 2:
        return 0.0
    s = float(np.std(offsets, ddof=1))
    return s * math.sqrt(1.0 + 1.0 / k) * float(student_t.ppf(0.9, k - 1)) / _Z90


def calibrate(
    groups: Sequence[FitGroup],
    *,
    hardware: str = "",
    gpu_specs: dict[str, GpuSpec] | None = None,
    learned: bool = True,
    sources: Sequence[FitSource] = (),
) -> Calibration:
    """Physics fit (hardware constants and job terms), the learned correction, intervals.

    The interval has two parts added in quadrature: the scatter of rows around their
    own job's level (quantiles of the residuals with each job's own terms, centred on
    the job's median), and how far a whole job may sit off the model
    (:func:`new_job_spread`, from the jobs scored *as if unseen*, with the hardware
    values instead of their own terms: the error a new job meets).
    """
    specs = dict(gpu_specs or {})
    physics, jobs = fit_physics(groups, specs)
    own = _log_ratios(groups, analytic_predictions(groups, physics, specs, jobs))
    unseen = _log_ratios(groups, analytic_predictions(groups, physics, specs))
    within = np.concatenate([v - np.median(v) for v in own.values()])
    spread = new_job_spread([float(np.median(v)) for v in unseen.values()])
    correction = fit_correction(groups, physics, specs, jobs) if learned else None
    rows = int(sum(g.size for g in groups))
    ape_own = np.abs(np.expm1(-np.concatenate(list(own.values()))))
    ape_unseen = np.abs(np.expm1(-np.concatenate(list(unseen.values()))))
    return Calibration(
        physics=physics,
        residual_low=float(np.quantile(within, QUANTILES[0])),
        residual_high=float(np.quantile(within, QUANTILES[1])),
        correction=correction,
        model_spread=spread,
        jobs=jobs,
        hardware=hardware,
        fitted_on=tuple(sorted({g.model for g in groups})),
        rows=rows,
        sources=tuple(sources),
        seen_hardware=seen_hardware(groups),
        metrics={
            "physics_median_ape": float(np.median(ape_own)),
            "physics_p90_ape": float(np.quantile(ape_own, 0.9)),
            "unseen_job_median_ape": float(np.median(ape_unseen)),
            "unseen_job_p90_ape": float(np.quantile(ape_unseen, 0.9)),
        },
    )


def calibrate_traces(
    trace_sets: Sequence[tuple[str, TraceSet]],
    *,
    gpu_specs: dict[str, GpuSpec] | None = None,
    learned: bool = True,
    conformal: bool = True,
) -> Calibration:
    """Calibration on the multi-GPU rows of named trace folders, with provenance.

    With several kinds of hardware (and ``conformal``), the interval on hardware the fit
    never saw is widened by :func:`hardware_conformal_widening`.
    """
    groups = [g for _, t in trace_sets for g in trace_groups(t)]
    sources = [trace_source(t, name) for name, t in trace_sets]
    calibration = calibrate(
        groups,
        hardware="; ".join(dict.fromkeys(t.hardware.describe() for _, t in trace_sets)),
        gpu_specs=gpu_specs,
        learned=learned,
        sources=sources,
    )
    if conformal and len({t.hardware.fingerprint for _, t in trace_sets}) > 1:
        spread, widening = hardware_conformal_widening(trace_sets, gpu_specs=gpu_specs)
        calibration = replace(calibration, hardware_spread=spread, unseen_widening=widening)
    return calibration


def group_hardware(group: FitGroup) -> tuple[str, str]:
    """(accelerator, inter-node transport) of a group's first row."""
    links = group.candidates.links[int(group.candidates.link_index[0, 0])]
    return str(group.candidates.accelerator[0, 0]), links.transport


def seen_hardware(groups: Sequence[FitGroup]) -> tuple[tuple[str, str], ...]:
    """The (accelerator, transport) pairs some group with rows was measured on."""
    return tuple(sorted({group_hardware(g) for g in groups if g.size}))


CONFORMAL_LEVEL = 0.8
"""Share of a left-out kind of hardware's rows the widened 10-90 % interval must hold:
its nominal coverage."""


def hardware_conformal_widening(
    trace_sets: Sequence[tuple[str, TraceSet]],
    *,
    gpu_specs: dict[str, GpuSpec] | None = None,
    level: float = CONFORMAL_LEVEL,
) -> tuple[float, float]:
    """``(hardware_spread, unseen_widening)`` from leaving one kind of hardware out.

    Each kind of hardware in turn is left out: the calibration refitted on the others
    (physics only, no widening of its own) predicts its multi-GPU rows. Two things are
    read from the misses:

    * where each left-out kind sits off the model as a whole (its median log ratio):
      a new kind is one more draw, so the spread is the Student-t predictive spread of
      these offsets (:func:`new_job_spread`), combined in quadrature with the interval;
    * how far rows still fall outside that widened 10-90 % interval,
      ``max(log(low/y), log(y/high), 0)`` (conformalised quantile regression, Romano
      et al. 2019): the ``level`` quantile of these scores, every kind of hardware
      weighing the same whatever its row count, is added to both ends.

    With few kinds of hardware both are rough; they can only tell what the kinds seen
    show.
    """
    by_kind: dict[str, list[tuple[str, TraceSet]]] = {}
    for name, traces in trace_sets:
        by_kind.setdefault(traces.hardware.fingerprint, []).append((name, traces))
    if len(by_kind) < 2:
        return 0.0, 0.0
    specs = dict(gpu_specs or {})
    left_out = []
    for kind, held in by_kind.items():
        others = [x for k, sets in by_kind.items() if k != kind for x in sets]
        fitted = calibrate_traces(others, gpu_specs=specs, learned=False, conformal=False)
        model = PerformanceModel(specs, fitted)
        parts = []
        for _, traces in held:
            for group in trace_groups(traces):
                if group.size:
                    out = model.predict_batch(
                        group.profile, group.candidates, local_batch=group.local_batch
                    )
                    parts.append((group.measured_s, out.step_s, out.low_s, out.high_s))
        if parts:
            left_out.append(tuple(np.concatenate([p[i] for p in parts]) for i in range(4)))
    if not left_out:
        return 0.0, 0.0
    offsets = [float(np.median(np.log(y / step))) for y, step, _, _ in left_out]
    spread = new_job_spread(offsets)
    scores, weights = [], []
    for y, step, low, high in left_out:
        low_log = -np.hypot(np.log(step / np.maximum(low, 1e-12)), _Z90 * spread)
        high_log = np.hypot(np.log(np.maximum(high, 1e-12) / step), _Z90 * spread)
        below = np.log(step / y) + low_log
        above = np.log(y / step) - high_log
        scores.append(np.maximum(np.maximum(below, above), 0.0))
        weights.append(np.full(y.size, 1.0 / y.size))
    every = np.concatenate(scores)
    weight = np.concatenate(weights)
    order = np.argsort(every)
    cumulative = np.cumsum(weight[order]) / weight.sum()
    index = int(np.searchsorted(cumulative, level))
    return spread, float(every[order][min(index, every.size - 1)])


PROBE_PRIOR_SIGMA = 1.0
"""Prior spread (log units) of a hardware constant around the calibration's value when
probes on new hardware refit it: a transport's efficiency on one cluster says only
roughly what it is on another, so a probe's rows may move it far (a factor e at one
sigma); what they cannot identify stays as calibrated."""
EVIDENCE_SIGMA = 0.1
"""Prior spread (log units) of a constant a probe measured directly (a link's
efficiency and latency from its collective-bandwidth measurement): the step times may
still move it, by about 10 %."""


def probe_priors(
    physics: PhysicsConstants,
    sigma: float = PROBE_PRIOR_SIGMA,
    evidence: Mapping[str, float] | None = None,
) -> dict[str, Prior]:
    """:data:`PRIORS` re-centred on a calibration's constants, for a refit on new rows;
    constants in ``evidence`` (measured directly) are centred on what was measured,
    with the narrow :data:`EVIDENCE_SIGMA`."""
    values = {**physics.to_dict(), **(evidence or {})}
    out = {}
    for name in _NAMES:
        p = PRIORS[name]
        centre = min(max(values[name], p.low * 1.0001), p.high * 0.9999)
        if evidence and name in evidence:
            out[name] = Prior(p.low, p.high, centre, EVIDENCE_SIGMA, "measured by a probe")
        else:
            out[name] = Prior(p.low, p.high, centre, sigma, f"calibrated value ({p.source})")
    return out


def refit_on_probes(
    calibration: Calibration,
    groups: Sequence[FitGroup],
    gpu_specs: dict[str, GpuSpec] | None = None,
    *,
    evidence: Mapping[str, Mapping[str, float]] | None = None,
) -> Calibration:
    """``calibration`` refitted to probe measurements of the hardware it will predict.

    A probe is a short run of the job at one and two nodes of one or two GPUs on a
    candidate instance type. Its rows (``groups``, one per job and hardware; the
    profile's instance type names the hardware) refit that instance type's constants
    (transport efficiencies and latencies: its effective link rates; co-location;
    per-step host time) and each probed job's own terms, in the same mixed-effects fit
    as :func:`fit_physics`, with the calibration's values as the priors' centres
    (:func:`probe_priors`): constants the probe cannot identify are held at the
    calibration's value, the NCCL algorithm is kept. ``evidence`` maps an instance type
    to constants a probe measured directly (its collective-bandwidth measurement: see
    :func:`lightning_srifty.fit.probes.link_evidence`), which centre their priors.

    Each probed instance type gets constants of its own (:class:`HardwareTerms`), fitted
    on its rows alone; every other instance type keeps the calibration's. The probed
    jobs' terms replace their old ones for the probed instance types, keeping a compute
    scale a refit of the job found. The interval and the learned correction are the
    calibration's; the probed hardware counts as seen, so its predictions lose the
    unseen-hardware widening. Used by ``srifty validate --protocol probed`` and by the
    launcher's probes alike.
    """
    usable = [g for g in groups if g.size > 0]
    measured = dict(evidence or {})
    kinds = list(dict.fromkeys([*(g.instance_type for g in usable), *measured]))
    if not kinds:
        return calibration
    hardware = {h.instance_type: h for h in calibration.hardware_terms}
    jobs: list[JobTerms] = []
    for kind in kinds:
        start = calibration.physics_on(kind)
        direct = dict(measured.get(kind, {}))
        mine = [_carry_compute(calibration, g) for g in usable if g.instance_type == kind]
        if mine:
            physics, fitted = fit_physics(
                mine,
                gpu_specs,
                start,
                priors=probe_priors(start, evidence=direct),
                algorithms=(start.inter_algorithm,),
            )
            jobs.extend(_keep_compute(calibration, t) for t in fitted)
        else:
            values = {**start.to_dict(), **_clamped(direct)}
            physics = PhysicsConstants(**values, inter_algorithm=start.inter_algorithm)  # type: ignore[arg-type]
        rows = sum(g.size for g in mine)
        hardware[kind] = HardwareTerms(kind, physics, rows, tuple(sorted(direct)))
    refitted = {(j.name, j.instance_type) for j in jobs}
    kept = tuple(j for j in calibration.jobs if (j.name, j.instance_type) not in refitted)
    seen = tuple(sorted({*calibration.seen_hardware, *seen_hardware(usable)}))
    return replace(
        calibration,
        jobs=(*kept, *jobs),
        rows=calibration.rows + sum(g.size for g in usable),
        seen_hardware=seen if calibration.seen_hardware else (),
        hardware_terms=tuple(hardware.values()),
    )


@dataclass(frozen=True)
class ProbeRun:
    """What one probe ran and measured, as the refit reads it."""

    cluster: Cluster
    """The cluster the probe's processes ran on (labelled with its instance type)."""
    instance_type: str
    """The one instance type it ran (``""`` for a mix: no one type's constants)."""
    step_s: float
    """Measured seconds per optimizer update, every process at the profile's batch."""
    link: Mapping[str, float] = field(default_factory=dict)
    """Link constants its collective-bandwidth measurement gave (may be empty)."""
    spread_s: tuple[float, float] | None = None
    """10th and 90th percentiles of its step reports (``None``: not reported)."""


def refit_on_probe_runs(
    calibration: Calibration,
    profile: Profile,
    runs: Sequence[ProbeRun],
    gpu_specs: dict[str, GpuSpec],
) -> Calibration:
    """The calibration after probes, as ``srifty-launch`` replans with it: first the
    job's own terms (a compute scale per GPU type a probe ran, from its one-process
    probes where it had one, else from all its probes with the job's co-location and
    overlap: :func:`~lightning_srifty.fit.refine.refit_job_on`), then
    each probed instance type's hardware constants on its own probes
    (:func:`refit_on_probes`), centred on the links the probes measured. Instance
    types no probe ran on keep their constants.
    """
    from lightning_srifty.fit.refine import refit_job_on  # lazy: scipy

    if not runs:
        return calibration
    name = profile.model_name or "job"
    # One process measures the job's compute alone; a GPU type only probed with more
    # than one gives its compute with co-location and communication mixed in, which
    # the job-level refit would otherwise take for compute (the hardware refit below
    # explains those with the type's own link terms).
    alone = [r for r in runs if r.cluster.world_size == 1]
    timed = {g.offer.accelerator for r in alone for g in r.cluster.groups}
    first = alone + [
        r
        for r in runs
        if r.cluster.world_size > 1 and not {g.offer.accelerator for g in r.cluster.groups} <= timed
    ]
    refitted = refit_job_on(
        calibration, profile, [(r.cluster, r.step_s) for r in first], gpu_specs=gpu_specs
    )
    env = profile.environment
    evidence: dict[str, dict[str, float]] = {}
    rows: dict[str, list[ProbeRun]] = {}
    for run in runs:
        if run.instance_type:
            rows.setdefault(run.instance_type, []).append(run)
            evidence.setdefault(run.instance_type, {}).update(run.link)
    groups = [
        FitGroup(
            model=name,
            profile=replace(profile, model_name=name, environment=replace(env, instance_type=kind)),
            candidates=CandidateArrays.from_clusters([r.cluster for r in done]),
            local_batch=np.full(len(done), env.step_batch_size, dtype=np.int64),
            measured_s=np.asarray([r.step_s for r in done], dtype=np.float64),
            source=kind,
        )
        for kind, done in rows.items()
    ]
    refitted = refit_on_probes(refitted, groups, gpu_specs, evidence=evidence)
    return replace(refitted, probed=_merged_probes(calibration.probed, probed_steps(profile, runs)))


def probed_steps(profile: Profile, runs: Sequence[ProbeRun]) -> tuple[ProbedStep, ...]:
    """The probes that ran one instance type in one shape and reported the spread of
    their steps, as :class:`ProbedStep` records of the job at the profile's step batch (a
    probe of a mix of types or shapes is a measurement of that mix only, which a plan
    never runs again exactly; one with no spread says nothing of how sure it is)."""
    name = profile.model_name or "job"
    out = []
    for run in runs:
        if not run.instance_type or len(run.cluster.groups) != 1 or run.spread_s is None:
            continue
        group = run.cluster.groups[0]
        low, high = run.spread_s
        out.append(
            ProbedStep(
                model=name,
                instance_type=run.instance_type,
                nodes=group.nodes,
                gpus_per_node=group.gpus_per_node,
                local_batch=profile.environment.step_batch_size,
                step_s=run.step_s,
                low_s=min(low, run.step_s),
                high_s=max(high, run.step_s),
            )
        )
    return tuple(out)


def _merged_probes(old: Sequence[ProbedStep], new: Sequence[ProbedStep]) -> tuple[ProbedStep, ...]:
    """``old`` with every shape ``new`` measured again replaced by its newer measurement."""

    def shape(p: ProbedStep) -> tuple[str, str, int, int, int]:
        return p.model, p.instance_type, p.nodes, p.gpus_per_node, p.local_batch

    fresh = {shape(p) for p in new}
    return tuple(p for p in old if shape(p) not in fresh) + tuple(new)


def _clamped(values: Mapping[str, float]) -> dict[str, float]:
    """Constants held inside their physical bounds (:data:`PRIORS`)."""
    return {n: min(max(float(v), PRIORS[n].low), PRIORS[n].high) for n, v in values.items()}


def _carry_compute(calibration: Calibration, group: FitGroup) -> FitGroup:
    """``group`` with the compute scale a refit of its job already found for its GPU."""
    old = calibration.job(group.profile.model_name or group.model, group.instance_type)
    if old is None:
        return group
    accelerator = str(group.candidates.accelerator[0, 0])
    scale = old.compute_scale_on(accelerator, group.profile.environment.accelerator)
    return group if scale == 1.0 else replace(group, compute_scale=scale)


def _keep_compute(calibration: Calibration, terms: JobTerms) -> JobTerms:
    """Fitted job terms that keep the compute scales of the job's old terms."""
    old = calibration.job(terms.name, terms.instance_type)
    if old is None or not (old.accelerator or old.measured_scales):
        return terms
    return replace(
        terms,
        compute_scale=old.compute_scale,
        accelerator=old.accelerator,
        measured_scales=old.measured_scales,
    )


def optional_catalog_io() -> Any:
    """The catalog loader module, or ``None`` in an installation without it."""
    try:
        return importlib.import_module("lightning_srifty.io.catalog_io")
    except ModuleNotFoundError:
        return None


def profile_fit_groups(paths: Sequence[str]) -> tuple[list[FitGroup], list[str]]:
    """Calibration rows from profiles of the user's own multi-GPU runs.

    Each profile contributes one row: its measured mean step on the cluster named by its
    environment (instance type from the catalog, nodes, GPUs per node). Its compute
    basis is the profile's own compute (step minus exposed communication).
    """
    from lightning_srifty.core.cluster import Cluster, ClusterGroup
    from lightning_srifty.io.profile_io import load_profile

    groups, described = [], []
    for path in paths:
        profile = load_profile(path)
        env = profile.environment
        if env.world_size < 2:
            raise CalibrationError(
                "a single-GPU profile has no gradient synchronisation to calibrate from; "
                "give profiles of multi-GPU runs",
                source=str(path), field="environment.world_size",
            )  # fmt: skip
        if not env.instance_type:
            raise CalibrationError(
                "is missing: calibration needs to know the hardware the run used",
                source=str(path), field="environment.instance_type",
            )  # fmt: skip
        catalog_io = optional_catalog_io()
        if catalog_io is None:
            raise CalibrationError(
                "the instance catalog is not available to look up its network and links",
                source=str(path),
            )
        offer = catalog_io.load_catalog().offer(env.instance_type)
        per_node = max(env.world_size // max(env.num_nodes, 1), 1)
        cluster = Cluster((ClusterGroup(offer, env.num_nodes, per_node),))
        groups.append(
            FitGroup(
                model=profile.model_name or str(path),
                profile=profile,
                candidates=CandidateArrays.from_clusters([cluster]),
                local_batch=np.asarray([env.local_batch_size], dtype=np.int64),
                measured_s=np.asarray([profile.steps.step.mean_s], dtype=np.float64),
                source=env.instance_type,
            )
        )
        described.append(cluster.describe())
    return groups, described
