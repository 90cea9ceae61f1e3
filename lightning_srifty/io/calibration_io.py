"""Fitting a calibration from measurements, and saving/loading it as JSON.

Two stages, both per *hardware*, never per training model:

1. **Physics constants** (link efficiencies and latencies, overlap exponent, per-step
   overhead, co-location slowdown) by robust least squares on the log error of the
   analytic model over every calibration row (:func:`fit_physics`).
2. **Learned correction**: scikit-learn gradient-boosted trees on transferable features
   predict the remaining multiplicative residual; two quantile models (0.1/0.9) give
   the interval. The trees are exported to JSON arrays and evaluated by
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

# Parameter vector of the physics fit, in log space: name, lower, upper bound.
_PARAMS = (
    ("intra_bw_efficiency", 1e-3, 2.0),
    ("intra_latency_s", 1e-7, 1e-2),
    ("inter_bw_efficiency", 1e-3, 2.0),
    ("inter_latency_s", 1e-7, 1e-1),
    ("gamma", 1.0, 10.0),
    ("step_overhead_s", 1e-6, 1.0),
    ("colocation_slowdown", 1e-5, 0.5),
    ("straggler_cv", 1e-5, 0.5),
)
QUANTILES = (0.1, 0.9)
MIN_ROWS_FOR_TREES = 50


@dataclass(frozen=True)
class FitGroup:
    """Rows of one training model on one hardware, ready for vectorised scoring."""

    model: str
    profile: Profile
    candidates: CandidateArrays
    local_batch: np.ndarray
    measured_s: np.ndarray

    @property
    def size(self) -> int:
        return int(self.measured_s.shape[0])


def fit_group(traces: TraceSet, model: str, rows: Sequence[Measurement]) -> FitGroup:
    """Pairs ``rows`` with the coarse profile from the model's single-GPU rows."""
    profile = coarse_profile(traces.models[model], traces.single_gpu_rows(model), traces.hardware)
    clusters = [placement_cluster(r.placement, traces.hardware) for r in rows]
    return FitGroup(
        model=model,
        profile=profile,
        candidates=CandidateArrays.from_clusters(clusters),
        local_batch=np.asarray([r.local_bsz for r in rows], dtype=np.int64),
        measured_s=np.asarray([r.step_time for r in rows], dtype=np.float64),
    )


def analytic_predictions(
    groups: Sequence[FitGroup], physics: PhysicsConstants, gpu_specs: dict[str, GpuSpec]
) -> list[np.ndarray]:
    """Step times of the physics model alone (no learned correction)."""
    model = PerformanceModel(gpu_specs, Calibration(physics=physics))
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


def fit_physics(
    groups: Sequence[FitGroup],
    gpu_specs: dict[str, GpuSpec] | None = None,
    start: PhysicsConstants | None = None,
) -> PhysicsConstants:
    """Least squares on ``log(predicted/measured)`` over all rows, each model weighted
    equally (so a model with many rows cannot dictate the hardware constants)."""
    from scipy.optimize import least_squares  # lazy: only fitting needs scipy

    usable = [g for g in groups if g.size > 0]
    if not usable:
        raise CalibrationError("no multi-GPU rows to calibrate from")
    specs = dict(gpu_specs or {})
    weights = [1.0 / math.sqrt(g.size) for g in usable]

    def residuals(x: np.ndarray, algorithm: str) -> np.ndarray:
        preds = analytic_predictions(usable, _from_vector(x, algorithm), specs)
        parts = [
            w * np.log(np.maximum(p, 1e-12) / g.measured_s)
            for w, p, g in zip(weights, preds, usable, strict=True)
        ]
        return np.concatenate(parts)

    lower = np.log([lo for _, lo, _ in _PARAMS])
    upper = np.log([hi for _, _, hi in _PARAMS])
    best: Any = None
    best_algorithm = "ring"
    guess = _to_vector(start or PhysicsConstants())
    for algorithm in INTER_ALGORITHMS:
        result = least_squares(
            residuals, guess, bounds=(lower, upper), loss="soft_l1", f_scale=0.1,
            max_nfev=300, args=(algorithm,),
        )  # fmt: skip
        if best is None or result.cost < best.cost:
            best, best_algorithm = result, algorithm
    return _from_vector(best.x, best_algorithm)


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


def fit_correction(
    groups: Sequence[FitGroup],
    physics: PhysicsConstants,
    gpu_specs: dict[str, GpuSpec] | None = None,
    *,
    seed: int = 0,
) -> Correction | None:
    """Boosted trees on the log residual of the physics model (median + quantiles)."""
    from sklearn.ensemble import GradientBoostingRegressor  # lazy: only fitting needs it

    specs = dict(gpu_specs or {})
    model = PerformanceModel(specs, Calibration(physics=physics))
    feats, targets, weights = [], [], []
    for g in groups:
        if g.size == 0:
            continue
        out = model._evaluate(g.profile, g.candidates, g.local_batch, None)
        world = (g.candidates.nodes * g.candidates.gpus_per_node).sum(axis=1)
        nodes = g.candidates.nodes.sum(axis=1)
        gmax = np.where(g.candidates.nodes > 0, g.candidates.gpus_per_node, 0).max(axis=1)
        x = correction_features(world, nodes, gmax, out["allreduce"], out["compute"])
        feats.append(x)
        targets.append(np.log(g.measured_s / out["step"]))
        weights.append(np.full(g.size, 1.0 / g.size))
    if not feats:
        return None
    x_all = np.vstack(feats)
    y_all = np.concatenate(targets)
    w_all = np.concatenate(weights) * len(feats)
    if x_all.shape[0] < MIN_ROWS_FOR_TREES:
        return None
    common = {"n_estimators": 60, "max_depth": 3, "learning_rate": 0.1, "subsample": 0.8,
              "min_samples_leaf": 20, "random_state": seed}  # fmt: skip
    ensembles = []
    for loss, alpha in (("squared_error", 0.5), ("quantile", QUANTILES[0]),
                        ("quantile", QUANTILES[1])):  # fmt: skip
        extra = {"alpha": alpha} if loss == "quantile" else {}
        gbr = GradientBoostingRegressor(loss=loss, **common, **extra)
        gbr.fit(x_all, y_all, sample_weight=w_all)
        ensembles.append(_export_gbr(gbr, x_all))
    return Correction(FEATURE_NAMES, ensembles[0], ensembles[1], ensembles[2], QUANTILES)


def calibrate(
    groups: Sequence[FitGroup],
    *,
    hardware: str = "",
    gpu_specs: dict[str, GpuSpec] | None = None,
    learned: bool = True,
) -> Calibration:
    """Physics fit, then the learned correction, then interval quantiles."""
    physics = fit_physics(groups, gpu_specs)
    preds = analytic_predictions(groups, physics, dict(gpu_specs or {}))
    logs = np.concatenate(
        [np.log(g.measured_s / p) for g, p in zip(groups, preds, strict=True) if g.size]
    )
    ape = np.abs(np.expm1(-logs))
    per_model: dict[str, list[np.ndarray]] = {}
    for g, p in zip(groups, preds, strict=True):
        if g.size:
            per_model.setdefault(g.model, []).append(np.log(g.measured_s / p))
    offsets = [float(np.median(np.concatenate(v))) for v in per_model.values()]
    spread = float(np.std(offsets, ddof=1)) if len(offsets) > 1 else 0.0
    correction = fit_correction(groups, physics, gpu_specs) if learned else None
    rows = int(sum(g.size for g in groups))
    return Calibration(
        physics=physics,
        residual_low=float(np.quantile(logs, QUANTILES[0])),
        residual_high=float(np.quantile(logs, QUANTILES[1])),
        correction=correction,
        model_spread=spread,
        hardware=hardware,
        fitted_on=tuple(sorted({g.model for g in groups})),
        rows=rows,
        metrics={
            "physics_median_ape": float(np.median(ape)),
            "physics_p90_ape": float(np.quantile(ape, 0.9)),
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
