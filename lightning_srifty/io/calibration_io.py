"""Fitting a calibration from measurements, and saving/loading it as JSON.

Two stages:

1. **Physics** (:func:`fit_physics`): robust least squares of the analytic model over
   every calibration row, on the step time and, where rows carry it, the measured
   gradient-sync time. Hardware constants (link efficiencies and latencies, overlap,
   two-node factor, per-step overhead, co-location, straggler spread) are shared by
   all jobs; the three terms that also depend on the job (tail fraction, overlap
   window, co-location) get per-job deviations with a Gaussian prior (a mixed-effects
   model). The hardware constants are thus the centre of the jobs seen, which is what
   a job never seen gets; a job whose rows were in the fit keeps its own terms.
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
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from lightning_srifty.core.calibration import (
    FEATURE_NAMES,
    INTER_ALGORITHMS,
    Calibration,
    Correction,
    JobTerms,
    PhysicsConstants,
)
from lightning_srifty.core.candidates import CandidateArrays
from lightning_srifty.core.catalog import GpuSpec
from lightning_srifty.core.errors import CalibrationError
from lightning_srifty.core.perfmodel import PerformanceModel, correction_features
from lightning_srifty.core.profile import Profile
from lightning_srifty.core.trees import Tree, TreeEnsemble
from lightning_srifty.io.jsonfile import read_json, write_json_atomic
from lightning_srifty.io.traces import (
    Measurement,
    TraceSet,
    coarse_profile,
    placement_cluster,
)

# Hardware parameters of the physics fit, fitted in log space: name, lower, upper bound.
# The bounds are physical: a hop inside a node costs microseconds (NCCL over PCIe or
# NVLink), so at most 100 us; without that bound the fit can trade a millisecond
# "latency" per bucket against bandwidth on the Pollux traces, equally well but
# meaningless on other hardware.
_PARAMS = (
    ("intra_bw_efficiency", 1e-3, 2.0),
    ("intra_latency_s", 1e-7, 1e-4),
    ("inter_bw_efficiency", 1e-3, 2.0),
    ("inter_latency_s", 1e-7, 1e-1),
    ("tail_fraction", 1e-3, 1.0),
    ("overlap_window", 1e-3, 1.0),
    ("step_overhead_s", 1e-6, 1.0),
    ("colocation_slowdown", 1e-5, 0.5),
    ("straggler_cv", 1e-5, 0.5),
    ("two_node_factor", 0.5, 4.0),
)
# Per-job terms: deviations from the hardware value, in logit (shares) or log space.
_JOB_TERMS = ("tail_fraction", "overlap_window", "colocation_slowdown")
_SHARES = ("tail_fraction", "overlap_window")
ROW_SIGMA = 0.1
"""Typical log scatter of one measured row around the model; scales the residuals so
the per-job prior below is weighed against data in the same units."""
JOB_EFFECTIVE_ROWS = 50.0
"""Every job weighs in the fit as if it had this many rows, however many it has, so a
job with 2,000 rows cannot dictate the hardware constants (nor one with 20 be ignored)."""
JOB_PRIOR_SIGMA = 0.5
"""Prior spread of a job's own terms around the hardware value (logit or log units):
a job's rows must insist before its terms move far, and terms its rows cannot see
stay at the hardware value."""
SYNC_WEIGHT = 1.0
"""Weight of the measured gradient-synchronisation time, where rows have it: the
exposed communication is fitted to it and the compute to ``step - sync``, which
separates the two better than the step time alone."""
FTOL = 1e-4
QUANTILES = (0.1, 0.9)
_Z90 = 1.2816
MIN_ROWS_FOR_TREES = 50


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

    @property
    def size(self) -> int:
        return int(self.measured_s.shape[0])

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


def _to_vector(physics: PhysicsConstants) -> np.ndarray:
    values = physics.to_dict()
    out = []
    for name, lo, hi in _PARAMS:
        out.append(math.log(min(max(values[name], lo * 1.0001), hi * 0.9999)))
    return np.asarray(out)


def _from_vector(x: np.ndarray, algorithm: str = "ring") -> PhysicsConstants:
    values = {name: float(math.exp(v)) for (name, _, _), v in zip(_PARAMS, x, strict=True)}
    return PhysicsConstants(**values, inter_algorithm=algorithm)


def _job_value(name: str, hardware: float, offset: float) -> float:
    """A job's term: the hardware value moved by ``offset`` in logit or log space."""
    if name in _SHARES:
        p = min(max(hardware, 1e-4), 1 - 1e-4)
        return float(1.0 / (1.0 + math.exp(-(math.log(p / (1 - p)) + offset))))
    return float(max(hardware, 1e-9) * math.exp(offset))


@dataclass(frozen=True)
class _Layout:
    """Where each job's terms sit in the parameter vector of the mixed-effects fit."""

    jobs: tuple[str, ...]
    terms: tuple[tuple[str, ...], ...]
    """Per job, the terms its rows can see (``overlap_window`` only across nodes)."""

    @property
    def size(self) -> int:
        return len(_PARAMS) + sum(len(t) for t in self.terms)

    def unpack(self, x: np.ndarray, algorithm: str) -> tuple[PhysicsConstants, list[JobTerms]]:
        physics = _from_vector(x[: len(_PARAMS)], algorithm)
        values = physics.to_dict()
        out, i = [], len(_PARAMS)
        for job, terms in zip(self.jobs, self.terms, strict=True):
            own = {name: values[name] for name in _JOB_TERMS}
            for name in terms:
                own[name] = _job_value(name, values[name], float(x[i]))
                i += 1
            out.append(
                JobTerms(
                    name=job,
                    tail_fraction=own["tail_fraction"],
                    overlap_window=own["overlap_window"],
                    colocation_slowdown=own["colocation_slowdown"],
                )
            )
        return physics, out


def fit_physics(
    groups: Sequence[FitGroup],
    gpu_specs: dict[str, GpuSpec] | None = None,
    start: PhysicsConstants | None = None,
) -> tuple[PhysicsConstants, tuple[JobTerms, ...]]:
    """Hardware constants and every job's own terms, in one mixed-effects fit.

    Robust least squares on ``log(predicted/measured)`` of the step time, plus, where
    rows carry it, the exposed communication against the measured sync time and the
    compute against ``step - sync``. Each job weighs the same
    (:data:`JOB_EFFECTIVE_ROWS`); its own terms are deviations from the hardware value
    with a Gaussian prior (:data:`JOB_PRIOR_SIGMA`), so the hardware constants are the
    centre of the jobs seen, which is the best guess for a job never seen.
    """
    from scipy.optimize import least_squares  # lazy: only fitting needs scipy
    from scipy.sparse import lil_matrix

    usable = [g for g in groups if g.size > 0]
    if not usable:
        raise CalibrationError("no multi-GPU rows to calibrate from")
    specs = dict(gpu_specs or {})
    jobs = tuple(dict.fromkeys(g.model for g in usable))
    rows_of = {j: sum(g.size for g in usable if g.model == j) for j in jobs}
    across = {j: any(g.multi_node for g in usable if g.model == j) for j in jobs}
    layout = _Layout(
        jobs,
        tuple(tuple(t for t in _JOB_TERMS if t != "overlap_window" or across[j]) for j in jobs),
    )
    weights = [math.sqrt(JOB_EFFECTIVE_ROWS / rows_of[g.model]) / ROW_SIGMA for g in usable]
    job_of = [jobs.index(g.model) for g in usable]

    def residuals(x: np.ndarray, algorithm: str) -> np.ndarray:
        physics, terms = layout.unpack(x, algorithm)
        parts = []
        for g, w, j in zip(usable, weights, job_of, strict=True):
            model = PerformanceModel(specs, Calibration(physics=physics.for_job(terms[j])))
            out = model._evaluate(g.profile, g.candidates, g.local_batch, None)
            parts.append(w * np.log(np.maximum(out["step"], 1e-12) / g.measured_s))
            if g.sync_s is not None:
                compute_measured = np.maximum(g.measured_s - g.sync_s, 1e-3 * g.measured_s)
                # a worker's own compute; waiting for stragglers counts as sync time
                own = np.maximum(out["mean_compute"], 1e-12)
                parts.append(w * SYNC_WEIGHT * (out["step"] - own - g.sync_s) / g.measured_s)
                parts.append(w * SYNC_WEIGHT * np.log(own / compute_measured))
        parts.append(x[len(_PARAMS) :] / JOB_PRIOR_SIGMA)
        return np.concatenate(parts)

    # Sparsity: hardware constants touch every residual, a job's terms only its rows.
    n_res = sum(g.size * (3 if g.sync_s is not None else 1) for g in usable)
    sparsity = lil_matrix((n_res + layout.size - len(_PARAMS), layout.size), dtype=np.int8)
    sparsity[:, : len(_PARAMS)] = 1
    starts = np.cumsum([0] + [len(t) for t in layout.terms]) + len(_PARAMS)
    row = 0
    for g, j in zip(usable, job_of, strict=True):
        span = g.size * (3 if g.sync_s is not None else 1)
        sparsity[row : row + span, starts[j] : starts[j + 1]] = 1
        row += span
    for k in range(layout.size - len(_PARAMS)):
        sparsity[n_res + k, len(_PARAMS) + k] = 1

    lower = np.concatenate(
        [np.log([lo for _, lo, _ in _PARAMS]), np.full(layout.size - len(_PARAMS), -np.inf)]
    )
    upper = np.concatenate(
        [np.log([hi for _, _, hi in _PARAMS]), np.full(layout.size - len(_PARAMS), np.inf)]
    )
    guess = np.concatenate(
        [_to_vector(start or PhysicsConstants()), np.zeros(layout.size - len(_PARAMS))]
    )
    best: Any = None
    best_algorithm = "ring"
    for algorithm in INTER_ALGORITHMS:
        result = least_squares(
            residuals, guess, bounds=(lower, upper), loss="soft_l1", f_scale=1.0,
            max_nfev=200, args=(algorithm,), jac_sparsity=sparsity, ftol=FTOL, xtol=FTOL,
        )  # fmt: skip
        if best is None or result.cost < best.cost:
            best, best_algorithm = result, algorithm
    physics, terms = layout.unpack(best.x, best_algorithm)
    sized = tuple(replace(t, rows=rows_of[t.name]) for t in terms)
    return physics, sized


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
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per job: correction features and ``log(measured/predicted)`` of its rows."""
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
        parts.setdefault(g.model, []).append((x, np.log(g.measured_s / out["step"])))
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


def correction_transfers(data: dict[str, tuple[np.ndarray, np.ndarray]], seed: int = 0) -> bool:
    """Whether trees fitted on the other jobs shrink each job's error (pooled median).

    The correction is only worth applying if what it learns is a property of the
    hardware rather than of the jobs it saw; leaving each job out in turn is the test.
    """
    before, after = [], []
    for job, (x, y) in data.items():
        others = {k: v for k, v in data.items() if k != job}
        (median,) = _fit_trees(others, [("squared_error", 0.5)], seed)
        before.append(np.abs(y))
        after.append(np.abs(y - median.predict(x)))
    return float(np.median(np.concatenate(after))) < float(np.median(np.concatenate(before)))


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
    fitted without a job do not predict that job better than the physics alone
    (:func:`correction_transfers`; it needs at least two jobs to tell).
    """
    data = _correction_data(groups, physics, dict(gpu_specs or {}), jobs)
    if sum(len(y) for _, y in data.values()) < MIN_ROWS_FOR_TREES:
        return None
    if require_transfer and (len(data) < 2 or not correction_transfers(data, seed)):
        return None
    losses = [("squared_error", 0.5), ("quantile", QUANTILES[0]), ("quantile", QUANTILES[1])]
    fitted = _fit_trees(data, losses, seed)
    sample = np.vstack([x for x, _ in data.values()])
    ensembles = [_export_gbr(gbr, sample) for gbr in fitted]
    return Correction(FEATURE_NAMES, ensembles[0], ensembles[1], ensembles[2], QUANTILES)


def _log_ratios(groups: Sequence[FitGroup], preds: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """``log(measured/predicted)`` per job over all its groups."""
    out: dict[str, list[np.ndarray]] = {}
    for g, p in zip(groups, preds, strict=True):
        if g.size:
            out.setdefault(g.model, []).append(np.log(g.measured_s / p))
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
        metrics={
            "physics_median_ape": float(np.median(ape_own)),
            "physics_p90_ape": float(np.quantile(ape_own, 0.9)),
            "unseen_job_median_ape": float(np.median(ape_unseen)),
            "unseen_job_p90_ape": float(np.quantile(ape_unseen, 0.9)),
        },
    )


def save_calibration(calibration: Calibration, path: str | os.PathLike[str]) -> Path:
    """Writes the calibration atomically as versioned JSON."""
    return write_json_atomic(path, calibration.to_dict())


def load_calibration(path: str | os.PathLike[str]) -> Calibration:
    """Loads and validates a calibration; errors name the file and the field."""
    return Calibration.from_dict(read_json(path, CalibrationError), source=str(path))


PROTOCOLS = ("lomo", "scale-out")


@dataclass(frozen=True)
class HeldOutResult:
    """Predictions for one held-out model under a validation protocol."""

    model: str
    rows: tuple[Measurement, ...]
    predicted_s: np.ndarray
    low_s: np.ndarray
    high_s: np.ndarray

    @property
    def ape(self) -> np.ndarray:
        measured = np.asarray([r.step_time for r in self.rows])
        return np.asarray(np.abs(self.predicted_s - measured) / measured)


def split_rows(
    traces: TraceSet, held_out: str, protocol: str
) -> tuple[list[FitGroup], list[Measurement]]:
    """Fit groups and the rows to predict for one fold; the two never share a row.

    ``lomo``: fit on every other model's multi-GPU rows; predict all multi-GPU rows of
    ``held_out``. ``scale-out``: also fit on ``held_out``'s single-node multi-GPU rows;
    predict its multi-node rows.
    """
    if protocol not in PROTOCOLS:
        raise CalibrationError(
            f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}"
        )
    fit: list[FitGroup] = []
    for model, rows in traces.rows.items():
        if model == held_out:
            continue
        multi = [r for r in rows if r.replicas > 1]
        fit.append(fit_group(traces, model, multi))
    own = [r for r in traces.rows[held_out] if r.replicas > 1]
    if protocol == "scale-out":
        single_node = [r for r in own if r.nodes == 1]
        fit.append(fit_group(traces, held_out, single_node))
        target = [r for r in own if r.nodes > 1]
    else:
        target = own
    return fit, target


def cross_validate(
    traces: TraceSet,
    protocol: str,
    *,
    gpu_specs: dict[str, GpuSpec] | None = None,
    learned: bool = True,
    models: Sequence[str] | None = None,
) -> list[HeldOutResult]:
    """Runs ``protocol`` over every model (or ``models``) and returns the predictions."""
    results = []
    for held_out in models or list(traces.rows):
        fit, target = split_rows(traces, held_out, protocol)
        calibration = calibrate(
            fit, hardware=traces.hardware.describe(), gpu_specs=gpu_specs, learned=learned
        )
        group = fit_group(traces, held_out, target)
        model = PerformanceModel(dict(gpu_specs or {}), calibration)
        out = model.predict_batch(group.profile, group.candidates, local_batch=group.local_batch)
        results.append(HeldOutResult(held_out, tuple(target), out.step_s, out.low_s, out.high_s))
    return results


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
            )
        )
        described.append(cluster.describe())
    return groups, described
