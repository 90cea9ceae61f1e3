"""Held-out accuracy of the performance model on the Pollux traces, with baselines.

Run: ``.venv/bin/python benchmarks/bench_model_accuracy.py [TRACE_DIR]``. Prints, for the
``lomo`` and ``scale-out`` protocols, median and p90 absolute percentage error per model
and overall, for:

* perfect scaling: the one-GPU step time at the same local batch;
* textbook ring: one-GPU compute plus a ring all-reduce at nominal bandwidth, no overlap;
* plain GBR: scikit-learn gradient boosting on simple features (replicas, nodes, local
  batch, one-GPU step time, gradient bytes; all logged, log step time as target)
  trained on the same fit rows;
* srifty physics: the calibrated analytic model alone;
* srifty: physics plus the learned correction (what ``srifty validate`` reports).

It also times ``predict_batch`` on 500,000 random candidates (the planner's budget).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from lightning_srifty.core.calibration import Calibration, PhysicsConstants
from lightning_srifty.core.candidates import CandidateArrays
from lightning_srifty.core.catalog import GpuSpec
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.io.calibration_io import (
    PROTOCOLS,
    FitGroup,
    calibrate,
    fit_correction,
    fit_group,
    split_rows,
)
from lightning_srifty.io.traces import TraceSet, load_traces

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "pollux-traces"
# Rough published peaks (fp32 TFLOP/s, fp16 TFLOP/s, GB/s), used only to time the
# vectorised path over several accelerator types; accuracy figures use none of them.
TIMING_SPECS = {
    name: GpuSpec(name, fp32, fp32, fp16, bw, mem)
    for name, fp32, fp16, bw, mem in (
        ("T4", 8.1, 65.0, 320.0, 16.0),
        ("V100", 15.7, 125.0, 900.0, 16.0),
        ("A10G", 31.2, 125.0, 600.0, 24.0),
        ("A100", 19.5, 312.0, 1555.0, 40.0),
        ("L4", 30.3, 121.0, 300.0, 24.0),
    )
}
METHODS = ("perfect scaling", "textbook ring", "plain GBR", "srifty physics", "srifty")


def _one_gpu_step(traces: TraceSet, model: str) -> dict[int, float]:
    return {r.local_bsz: r.step_time for r in traces.single_gpu_rows(model)}


def _simple_features(group: FitGroup) -> np.ndarray:
    """Replicas, nodes, local batch, one-GPU step at that batch, gradient bytes."""
    points = sorted(group.profile.batch_points, key=lambda p: p.local_batch_size)
    t1 = np.interp(
        group.local_batch, [p.local_batch_size for p in points], [p.step_s for p in points]
    )
    c = group.candidates
    return np.column_stack(
        [
            (c.nodes * c.gpus_per_node).sum(axis=1),
            c.nodes.sum(axis=1),
            group.local_batch,
            t1,
            np.full(group.size, float(group.profile.grad_bytes)),
        ]
    )


def evaluate(traces: TraceSet, protocol: str) -> dict[str, dict[str, np.ndarray]]:
    from sklearn.ensemble import GradientBoostingRegressor

    errors: dict[str, dict[str, np.ndarray]] = {m: {} for m in (*METHODS, "_interval_coverage")}
    nominal = Calibration(
        PhysicsConstants(tail_fraction=1.0, intra_latency_s=0.0, inter_latency_s=0.0)
    )
    for held in traces.rows:
        fit, target = split_rows(traces, held, protocol)
        measured = np.asarray([r.step_time for r in target])
        cal = calibrate(fit, hardware=traces.hardware.describe())
        group = fit_group(traces, held, target)
        predictions = {}
        one = _one_gpu_step(traces, held)
        keys = sorted(one)
        predictions["perfect scaling"] = np.interp(group.local_batch, keys, [one[k] for k in keys])
        for name, calibration in (
            ("textbook ring", nominal),
            ("srifty physics", replace(cal, correction=None)),
            ("srifty", cal),
        ):
            model = PerformanceModel({}, calibration)
            out = model.predict_batch(
                group.profile, group.candidates, local_batch=group.local_batch
            )
            predictions[name] = out.step_s
            if name == "srifty":
                inside = (out.low_s <= measured) & (measured <= out.high_s)
                errors["_interval_coverage"][held] = inside.astype(np.float64)
        x = np.vstack([_simple_features(g) for g in fit if g.size])
        y = np.concatenate([g.measured_s for g in fit if g.size])
        gbr = GradientBoostingRegressor(random_state=0).fit(np.log(x), np.log(y))
        predictions["plain GBR"] = np.exp(gbr.predict(np.log(_simple_features(group))))
        for name, pred in predictions.items():
            errors[name][held] = np.abs(pred - measured) / measured
    return errors


def print_table(protocol: str, errors: dict[str, dict[str, np.ndarray]]) -> None:
    models = list(next(iter(errors.values())))
    print(f"\n=== protocol {protocol}: median / p90 absolute % error ===")
    print(f"{'method':<16}" + "".join(f"{m:>16}" for m in [*models, "overall"]))
    for method in METHODS:
        cells = []
        for m in models:
            e = errors[method][m]
            cells.append(f"{100 * np.median(e):6.1f} /{100 * np.quantile(e, 0.9):6.1f}")
        every = np.concatenate([errors[method][m] for m in models])
        cells.append(f"{100 * np.median(every):6.1f} /{100 * np.quantile(every, 0.9):6.1f}")
        print(f"{method:<16}" + "".join(f"{c:>16}" for c in cells))


def time_predict_batch(traces: TraceSet, n: int = 500_000) -> None:
    rng = np.random.default_rng(0)
    width = 3
    names = np.array(list(TIMING_SPECS), dtype=object)
    cands = CandidateArrays(
        accelerator=names[rng.integers(0, len(names), size=(n, width))],
        gpus_per_node=rng.choice([1, 4, 8], size=(n, width)),
        nodes=np.where(rng.random((n, width)) < 0.5, rng.integers(1, 9, (n, width)), 0),
        nvlink=rng.random((n, width)) < 0.3,
        network_gbps=rng.choice([25.0, 50.0, 100.0, 400.0], size=(n, width)),
        gpu_memory_gib=rng.choice([16.0, 24.0, 40.0, 80.0], size=(n, width)),
    )
    cands.nodes[:, 0] = np.maximum(cands.nodes[:, 0], 1)
    model_name = next(iter(traces.rows))
    group = fit_group(traces, model_name, [r for r in traces.rows[model_name] if r.replicas > 1])
    cal = calibrate([group], learned=False)
    # time the tree path too, whether or not a calibration would keep the trees
    trees = fit_correction([group], cal.physics, require_transfer=False)
    cal = replace(cal, correction=trees)
    text = replace(cands, accelerator=cands.accelerator.astype(str))
    for label, calibration in (("no calibration", None), ("calibrated + trees", cal)):
        model = PerformanceModel(TIMING_SPECS, calibration)
        for kind, arrays in (("object", cands), ("str", text)):
            model.predict_batch(group.profile, arrays)
            start = time.perf_counter()
            out = model.predict_batch(group.profile, arrays)
            took = time.perf_counter() - start
            print(
                f"predict_batch, {n:,} candidates x {width} groups, {len(names)} GPU types, "
                f"{kind} accelerator column, {label}: {took:.3f} s "
                f"({np.isfinite(out.step_s).mean():.0%} finite)"
            )


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_TRACES
    traces = load_traces(folder)
    print(f"traces: {folder} ({traces.hardware.describe()})")
    for protocol in PROTOCOLS:
        start = time.perf_counter()
        errors = evaluate(traces, protocol)
        print_table(protocol, errors)
        inside = np.concatenate(list(errors["_interval_coverage"].values()))
        print(f"srifty 10-90% interval holds {100 * np.mean(inside):.0f}% of held-out rows")
        print(f"({time.perf_counter() - start:.0f} s)")
    time_predict_batch(traces)


if __name__ == "__main__":
    main()
