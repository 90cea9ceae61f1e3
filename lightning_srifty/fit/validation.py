"""Held-out accuracy of the performance model: the validation protocols.

A predicted row never enters the fit that predicts it:

* ``lomo``: calibrate on every other model's multi-GPU rows of the same trace folder,
  predict all multi-GPU rows of the held-out model from its single-GPU rows;
* ``scale-out``: also calibrate on the held-out model's single-node rows, predict its
  multi-node rows;
* ``unseen-hardware``: predict every multi-GPU row of the folder from each model's
  single-GPU rows and the shipped default calibration refitted **without any row of
  the folder's hardware** (recognised by its fingerprint). A folder whose hardware was
  never in the default's data uses the default as it is.
* ``probed``: as ``unseen-hardware``, then the rows a probe would measure on the
  folder's hardware (at most :data:`PROBE_MAX_NODES` nodes of at most
  :data:`PROBE_MAX_GPUS_PER_NODE` GPUs) refit the calibration
  (:func:`~lightning_srifty.fit.calibration.refit_on_probes`), and every other
  multi-GPU row is predicted.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lightning_srifty.core.calibration import Calibration
from lightning_srifty.core.catalog import GpuSpec, Offer
from lightning_srifty.core.cluster import Cluster, ClusterGroup
from lightning_srifty.core.errors import CalibrationError
from lightning_srifty.core.links import AWS_FLOW_CAP_GBPS
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.core.profile import (
    BatchPoint,
    Environment,
    Memory,
    Profile,
    Spread,
    StepTimes,
)
from lightning_srifty.fit import PROTOCOLS
from lightning_srifty.fit.calibration import (
    FitGroup,
    calibrate,
    calibrate_traces,
    fit_group,
    refit_on_probes,
    trace_groups,
)
from lightning_srifty.io.traces import Measurement, TraceSet, coarse_profile, load_traces


@dataclass(frozen=True)
class HeldOutResult:
    """Predictions for one held-out model under a validation protocol."""

    model: str
    rows: tuple[Measurement, ...]
    predicted_s: np.ndarray
    low_s: np.ndarray
    high_s: np.ndarray

    @property
    def measured_s(self) -> np.ndarray:
        return np.asarray([r.step_time for r in self.rows], dtype=np.float64)

    @property
    def ape(self) -> np.ndarray:
        measured = self.measured_s
        return np.asarray(np.abs(self.predicted_s - measured) / measured)

    @property
    def signed(self) -> np.ndarray:
        """``predicted/measured - 1``: negative when the model is too fast."""
        return np.asarray(self.predicted_s / self.measured_s - 1.0)

    @property
    def covered(self) -> np.ndarray:
        m = self.measured_s
        return np.asarray((self.low_s <= m) & (m <= self.high_s))


def split_rows(
    traces: TraceSet, held_out: str, protocol: str
) -> tuple[list[FitGroup], list[Measurement]]:
    """Fit groups and the rows to predict for one ``lomo`` or ``scale-out`` fold."""
    if protocol not in ("lomo", "scale-out"):
        raise CalibrationError(f"--protocol must be lomo or scale-out here, got {protocol!r}")
    fit = trace_groups(traces, [m for m in traces.rows if m != held_out])
    own = [r for r in traces.rows[held_out] if r.replicas > 1]
    if protocol == "scale-out":
        fit.append(fit_group(traces, held_out, [r for r in own if r.nodes == 1]))
        return fit, [r for r in own if r.nodes > 1]
    return fit, own


def predict_rows(
    traces: TraceSet,
    model: str,
    rows: Sequence[Measurement],
    calibration: Calibration,
    gpu_specs: dict[str, GpuSpec] | None = None,
) -> HeldOutResult:
    """The model's predictions for ``rows`` of one model, from its single-GPU rows."""
    group = fit_group(traces, model, rows)
    model_ = PerformanceModel(dict(gpu_specs or {}), calibration)
    out = model_.predict_batch(group.profile, group.candidates, local_batch=group.local_batch)
    return HeldOutResult(model, tuple(rows), out.step_s, out.low_s, out.high_s)


def default_data_root() -> Path:
    """``$SRIFTY_SHARED_DATA`` or ``../shared/data`` from the working directory."""
    return Path(os.environ.get("SRIFTY_SHARED_DATA", "../shared/data"))


def unseen_hardware_calibration(
    traces: TraceSet,
    base: Calibration,
    *,
    data_root: str | os.PathLike[str] | None = None,
    gpu_specs: dict[str, GpuSpec] | None = None,
    learned: bool = True,
) -> tuple[Calibration, list[str]]:
    """``base`` refitted without ``traces``' hardware, and the sets it was refitted on.

    Raises:
        CalibrationError: the other measurement sets named in ``base``'s provenance are
            not under ``data_root``.
    """
    fingerprint = traces.hardware.fingerprint
    if not any(s.fingerprint == fingerprint for s in base.sources):
        return base, [s.name for s in base.sources]
    root = Path(data_root) if data_root is not None else default_data_root()
    others = [s for s in base.sources if s.fingerprint != fingerprint]
    if not others:
        raise CalibrationError(
            "the calibration was fitted only on this folder's hardware; nothing is left "
            "to refit without it"
        )
    loaded = []
    for source in others:
        folder = root / source.name
        if not (folder / "hardware.json").is_file():
            raise CalibrationError(
                f"refitting without {traces.hardware.describe()} needs the other measurement "
                f"sets of the calibration; {source.name} is not under {root} (set "
                "--data-root or SRIFTY_SHARED_DATA)"
            )
        loaded.append((source.name, load_traces(folder)))
    return calibrate_traces(loaded, gpu_specs=gpu_specs, learned=learned), [n for n, _ in loaded]


PROBE_MAX_NODES = 2
"""Nodes a probe runs at most (one and two nodes of the candidate type)."""
PROBE_MAX_GPUS_PER_NODE = 2
"""GPUs per node a probe uses at most."""


def probe_revealed(row: Measurement) -> bool:
    """Whether a probe of the row's hardware would have measured this row."""
    return row.nodes <= PROBE_MAX_NODES and max(row.placement) <= PROBE_MAX_GPUS_PER_NODE


def probed_calibration(
    traces: TraceSet,
    base: Calibration,
    *,
    data_root: str | os.PathLike[str] | None = None,
    gpu_specs: dict[str, GpuSpec] | None = None,
    learned: bool = True,
    models: Sequence[str] | None = None,
) -> Calibration:
    """``base`` without ``traces``' hardware, refitted on the rows a probe would reveal
    (multi-GPU rows of ``models``, every model when ``None``, within the probe's size)."""
    unseen, _ = unseen_hardware_calibration(
        traces, base, data_root=data_root, gpu_specs=gpu_specs, learned=learned
    )
    groups = [
        fit_group(traces, m, [r for r in traces.rows[m] if r.replicas > 1 and probe_revealed(r)])
        for m in (models or traces.rows)
    ]
    return refit_on_probes(unseen, groups, gpu_specs)


def cross_validate(
    traces: TraceSet,
    protocol: str,
    *,
    gpu_specs: dict[str, GpuSpec] | None = None,
    learned: bool = True,
    models: Sequence[str] | None = None,
    base: Calibration | None = None,
    data_root: str | os.PathLike[str] | None = None,
) -> list[HeldOutResult]:
    """Runs ``protocol`` over every model (or ``models``) and returns the predictions.

    ``base`` is the calibration the ``unseen-hardware`` protocol starts from (the
    shipped default when ``None``).
    """
    if protocol not in PROTOCOLS:
        raise CalibrationError(
            f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}"
        )
    names = list(models or traces.rows)
    unknown = [m for m in names if m not in traces.rows]
    if unknown:
        raise CalibrationError(
            f"no model {', '.join(unknown)} in {traces.root} "
            f"(models: {', '.join(sorted(traces.rows))})"
        )
    if protocol in ("unseen-hardware", "probed"):
        if base is None:
            from lightning_srifty.io.calibration_io import load_default_calibration

            base = load_default_calibration()
        if protocol == "probed":
            # every model is probed, as a user probing the hardware would run each job
            calibration = probed_calibration(
                traces, base, data_root=data_root, gpu_specs=gpu_specs, learned=learned
            )
        else:
            calibration, _ = unseen_hardware_calibration(
                traces, base, data_root=data_root, gpu_specs=gpu_specs, learned=learned
            )
        hidden = protocol == "probed"
        return [
            predict_rows(
                traces,
                m,
                [
                    r
                    for r in traces.rows[m]
                    if r.replicas > 1 and not (hidden and probe_revealed(r))
                ],
                calibration,
                gpu_specs,
            )
            for m in names
        ]
    results = []
    for held_out in names:
        fit, target = split_rows(traces, held_out, protocol)
        calibration = calibrate(
            fit, hardware=traces.hardware.describe(), gpu_specs=gpu_specs, learned=learned
        )
        results.append(predict_rows(traces, held_out, target, calibration, gpu_specs))
    return results


def summarise(results: Sequence[HeldOutResult], protocol: str) -> dict[str, Any]:
    """Median and p90 absolute percentage error per model and overall.

    Also the median signed error (negative: predictions too fast) and how often the
    10-90 % interval holds the measurement.
    """
    kept = [r for r in results if len(r.rows)]
    per_model = {
        r.model: {
            "rows": len(r.rows),
            "median_ape": float(np.median(r.ape)),
            "p90_ape": float(np.quantile(r.ape, 0.9)),
            "median_signed": float(np.median(r.signed)),
            "interval_coverage": float(np.mean(r.covered)),
        }
        for r in kept
    }
    if not kept:
        raise CalibrationError("no multi-GPU rows to validate on")
    every = np.concatenate([r.ape for r in kept])
    signed = np.concatenate([r.signed for r in kept])
    covered = np.concatenate([r.covered for r in kept])
    return {
        "protocol": protocol,
        "models": per_model,
        "overall": {
            "rows": int(every.size),
            "median_ape": float(np.median(every)),
            "p90_ape": float(np.quantile(every, 0.9)),
            "median_signed": float(np.median(signed)),
            "interval_coverage": float(np.mean(covered)),
            "median_of_model_medians": float(
                np.median([m["median_ape"] for m in per_model.values()])
            ),
        },
    }


def single_gpu_steps(traces: TraceSet, model: str, *, less_sync: bool = False) -> dict[int, float]:
    """Mean measured one-GPU step per local batch (its compute with ``less_sync``: the
    step minus the one-GPU hook's sync time)."""
    by: dict[int, list[float]] = {}
    for r in traces.single_gpu_rows(model):
        by.setdefault(r.local_bsz, []).append(r.step_time - (r.sync_time if less_sync else 0.0))
    return {b: float(np.mean(v)) for b, v in by.items()}


def single_gpu_transfer(
    model: PerformanceModel, source: TraceSet, target: TraceSet
) -> dict[str, np.ndarray]:
    """Cross-GPU check: each job's one-GPU step on ``target``'s hardware predicted from
    ``source``'s one-GPU rows alone (its coarse profile on a one-GPU cluster of the
    target), at every local batch both measured; absolute relative error per job."""
    cluster = Cluster((ClusterGroup(target.hardware.offer(), 1, 1),))
    out = {}
    for job in source.rows:
        if job not in target.rows:
            continue
        profile = coarse_profile(source.models[job], source.single_gpu_rows(job), source.hardware)
        measured = single_gpu_steps(target, job)
        lo, hi = min(single_gpu_steps(source, job)), max(single_gpu_steps(source, job))
        errors = [
            abs(model.predict(profile, cluster, local_batch=batch).step_s - step) / step
            for batch, step in sorted(measured.items())
            if lo <= batch <= hi  # compare where the source measured too
        ]
        if errors:
            out[job] = np.asarray(errors)
    return out


def per_sample_transfer(
    model: PerformanceModel, source: TraceSet, target: TraceSet, min_batches: int = 3
) -> dict[str, float]:
    """Cross-GPU check of the compute ratio alone: per job, the model's ratio of
    ``target``'s device time to ``source``'s over the measured ratio of their
    per-sample costs, minus 1 (positive: ``target`` predicted too slow).

    The per-sample cost is the slope of one-GPU compute (step minus sync) against the
    local batch, fitted on each set over the batches both measured (at least
    ``min_batches`` each). The slope leaves out the fixed per-step time, which is the
    host's (Python, launches, the loader's hand-off) and differs with the host: what
    is left is what the GPU sets, the part the compute ratio is for.
    """
    out = {}
    for job in source.rows:
        if job not in target.rows:
            continue
        src = single_gpu_steps(source, job, less_sync=True)
        dst = single_gpu_steps(target, job, less_sync=True)
        lo, hi = max(min(src), min(dst)), min(max(src), max(dst))
        slopes = []
        for costs in (src, dst):
            batches = [b for b in sorted(costs) if lo <= b <= hi]
            if len(batches) < min_batches:
                break
            slopes.append(float(np.polyfit(batches, [costs[b] for b in batches], 1)[0]))
        if len(slopes) < 2 or min(slopes) <= 0:
            continue
        profile = coarse_profile(source.models[job], source.single_gpu_rows(job), source.hardware)
        ratio = model.compute_ratio(profile, target.hardware.gpu)
        if ratio is not None:
            out[job] = ratio / (slopes[1] / slopes[0]) - 1.0
    return out


@dataclass(frozen=True)
class NetworkRate:
    """Two nodes of one instance type all-reducing a gradient, as the model predicts."""

    instance_type: str
    per_node_gbps: float
    """The effective network rate per node the model uses (links and efficiency)."""
    algorithm_gbps: float
    """The gradient's size over the all-reduce time (S/T)."""
    bus_gbps: float
    """NCCL-tests' bus bandwidth, ``S/T x 2(p-1)/p`` for ``p`` GPUs: what each GPU's
    (and, on two nodes, each node's network) link carries per second in a ring
    all-reduce, the figure nccl-tests compares with the hardware's peak whatever the
    rank count (``doc/PERFORMANCE.md``)."""
    floor_gbps: float
    """30 % of ``min(NIC, 5 Gbps, one TCP flow's cap)``: what one flow reaches anywhere."""


def two_node_network_rates(
    model: PerformanceModel, offers: Iterable[Offer], grad_bytes: int = 256 * 1024**2
) -> list[NetworkRate]:
    """The network rate every instance type gets under ``model``, two nodes of it
    all-reducing ``grad_bytes`` (one entry per type, in the order first seen)."""
    out: list[NetworkRate] = []
    seen: set[str] = set()
    for offer in offers:
        if offer.instance_type in seen:
            continue
        seen.add(offer.instance_type)
        acc = offer.accelerator
        profile = Profile(
            kind="coarse",
            environment=Environment("NVIDIA " + acc, acc, 1, 1, 1, "32-true", 8, "", ""),
            steps=StepTimes(Spread(0.5, 0.5, 0.5, 10), 0, 0, 0, 0, 0, 10),
            grad_bytes=grad_bytes,
            flops_per_step=0.0,
            memory=Memory(0, 0, 0, 0, 0, "unknown"),
            batch_points=(BatchPoint(8, 0.5, 0.5),),
        )
        cluster = Cluster((ClusterGroup(offer, 2, offer.accelerator_count),))
        pred = model.predict(profile, cluster)
        cap = offer.node_links.flow_cap_gbps
        cap = cap if math.isfinite(cap) else AWS_FLOW_CAP_GBPS
        algorithm = grad_bytes * 8 / pred.allreduce_s / 1e9
        ranks = 2 * offer.accelerator_count
        out.append(
            NetworkRate(
                offer.instance_type,
                per_node_gbps=pred.inter_bytes_s * 8 / 1e9,
                algorithm_gbps=algorithm,
                bus_gbps=algorithm * 2 * (ranks - 1) / ranks,
                floor_gbps=0.3 * min(offer.network_gbps, AWS_FLOW_CAP_GBPS, cap),
            )
        )
    return out
