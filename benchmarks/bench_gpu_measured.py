"""The model against a GPU nobody calibrated on: the traces' jobs measured on an H100.

``benchmarks/gpu/measure_jobs.py`` rebuilt four of the traces' jobs (ResNet-18 CIFAR,
ResNet-50 AMP, BERT-base QA, DeepSpeech2; ``pollux-traces/models.json``) and ran them
on a lent H100 (results in ``benchmarks/gpu/h100-2026-11-27/``). No fit has seen an
H100 row: the Lambda table fits Hopper's tensor utilisation, nothing else. The checks:

1. **Capture**: the step a ``SriftyCallback`` profile records on that GPU against the
   same ``Trainer`` without the callback (median of the same step indices), before
   (``profile-<job>-hooked.json``: per-layer hooks in the window's time) and after the
   hook-free timing.
1c. **H100 profile -> the same H100 at other batches**: each job's profile (one batch)
   predicting the plain steps measured at the other four, beside the model with every
   layer's time counted as work (before its latency was split off).
2. **Traces -> H100**: each job's one-GPU per-sample slope (step time against batch,
   least squares over the batches measured) predicted from each trace hardware's coarse
   profile onto one H100 of a p5.48xlarge, against the slope measured with plain
   PyTorch steps. Slopes, because the traces' steps carry AdaptDL's fixed host work
   (17-120 ms) that the rebuilt jobs do not: the per-sample part is what moves between
   GPUs. fp32 jobs are compared with TF32 matmuls on (the traces' PyTorch default).
   deepspeech2 is printed but not judged: its trace slope is the data loader's (30 ms a
   sample on a T4 against 0.1 ms of H100 compute here; utterance length unknown).
3. **H100 profile -> traces**: the detailed H100 profile (the user's path: profile
   where you are, plan elsewhere) predicting the one-GPU step and slope on the T4, the
   A100 and the Quadro RTX 6000, against the traces. These profiles predate the
   recorded float32 math mode; they ran with TF32 matmuls on (``lightning.json``) and are
   read so.
4. **TF32 off / on on the H100**: the measured per-sample slope with TF32 off (today's
   PyTorch default for matmuls; ``measure_jobs.py`` turns cuDNN's off too) over on,
   beside the model's: per layer from the H100 profile, and whole-step from the traces'
   coarse profiles of GPUs without TF32 (T4, Quadro RTX 6000), where the setting leaves
   the source untouched.

Prints figures only; no target is asserted (issue 17 judges the model on kept-aside
sets). Skips with a reason where ``../shared/data`` or the results are absent.

    .venv/bin/python benchmarks/bench_gpu_measured.py [--data-root DIR] [--results DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from lightning_srifty.core.cluster import Cluster, ClusterGroup
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.core.profile import Profile
from lightning_srifty.fit.validation import single_gpu_steps
from lightning_srifty.io.calibration_io import load_default_calibration
from lightning_srifty.io.catalog_io import load_catalog, load_gpu_specs
from lightning_srifty.io.profile_io import load_profile
from lightning_srifty.io.traces import TraceSet, coarse_profile, load_traces

HERE = Path(__file__).resolve().parent
DEFAULT_ROOT = HERE.parents[1] / "shared" / "data"
DEFAULT_RESULTS = HERE / "gpu" / "h100-2026-11-27"
DEFAULT_TRACES = HERE / "gpu" / "h100-2026-11-28"
KINDS = ("pollux-traces", "sia-traces/dgx-ext", "sia-traces/quad")
JUDGED = ("cifar10", "imagenet", "bert")


def with_math(profile: Profile, matmul: str, cudnn: bool) -> Profile:
    """``profile`` as if run with this float32 matmul precision and cuDNN TF32 flag."""
    env = dataclasses.replace(
        profile.environment, float32_matmul_precision=matmul, cudnn_allow_tf32=cudnn
    )
    return dataclasses.replace(profile, environment=env)


def h100_profile(path: Path) -> Profile:
    """A profile ``measure_jobs.py`` wrote, read with the math mode it ran (TF32 matmuls
    on; cuDNN at its default, on) where it predates the recorded mode."""
    profile = load_profile(path)
    if profile.environment.float32_matmul_precision is None:
        return with_math(profile, "high", True)
    return profile


def slope(points: dict[int, float]) -> float:
    """Least-squares seconds per sample of step time against batch."""
    batches = np.array(sorted(points), dtype=float)
    steps = np.array([points[int(b)] for b in batches])
    design = np.vstack([np.ones_like(batches), batches]).T
    return float(np.linalg.lstsq(design, steps, rcond=None)[0][1])


def one_h100() -> Cluster:
    """One H100 of a p5.48xlarge, the instance the measurements stand for."""
    p5 = next(o for o in load_catalog("bundled").offers if o.instance_type == "p5.48xlarge")
    return Cluster((ClusterGroup(p5, 1, 1),))


def measured_steps(results: Path) -> dict[tuple[str, str], dict[int, float]]:
    """The plain steps of ``steps.json``: per (job, math), the step at each batch."""
    rows: dict[tuple[str, str], dict[int, float]] = {}
    for r in json.loads((results / "steps.json").read_text())["rows"]:
        rows.setdefault((r["job"], r["math"]), {})[r["local_bsz"]] = r["step_s"]
    return rows


def capture(results: Path) -> None:
    runs = json.loads((results / "lightning.json").read_text())
    print(f"== 1. capture on {runs['device']}: profile step / the run without the callback")
    print(
        f"{'job':12s} {'batch':>5s} {'plain ms':>9s} {'hooked':>8s} {'now':>8s} {'now/plain':>9s}"
    )
    ratios = []
    for run in runs["runs"]:
        plain = run["plain_lightning_step_s"]
        before = results / f"profile-{run['job']}-hooked.json"
        hooked = (
            json.loads(before.read_text())["steps"]["step"]["mean_s"] if before.exists() else None
        )
        ratio = run["profile_step_s"] / plain
        ratios.append(ratio)
        print(
            f"{run['job']:12s} {run['local_bsz']:5d} {plain * 1e3:9.2f} "
            f"{'-' if hooked is None else f'{hooked / plain:7.2f}x':>8s} "
            f"{run['profile_step_s'] * 1e3:8.2f} {ratio:9.3f}"
        )
    worst = max(ratios, key=lambda r: abs(math.log(r)))
    print(f"   worst profile/plain now {worst:.3f}; median {statistics.median(ratios):.3f}\n")


def steady_rate(run: dict[str, Any]) -> float:
    """A run's training rate: median batch-end interval after warm-up and window."""
    intervals = run["host_interval_s"]
    skip = min((run.get("profiled_at_batch_end") or 0) + 10, len(intervals) // 2)
    return statistics.median(intervals[max(skip, 5) :] or intervals)


def trace_runs(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Each job's runs from a ``capture_trace.py`` file (schema 1 held one pair)."""
    data = json.loads(path.read_text())
    return {
        name: job["runs"] if "runs" in job else [job["plain"], job["callback"]]
        for name, job in data["jobs"].items()
    }


def capture_repeated(traces: Path) -> None:
    """Section 1b: the code of today, every run's profile against the run it came from."""
    files = sorted(traces.glob("trace-*.json"))
    if not files:
        print(f"   (no capture_trace.py results in {traces})\n")
        return
    print(f"== 1b. capture of today, {len(files)} calls of capture_trace.py ({traces.name})")
    print(
        f"{'call':28s} {'job':12s} {'profile':>8s} {'own run':>8s} {'plain':>8s} "
        f"{'/own':>6s} {'/plain':>7s}"
    )
    own: list[float] = []
    plain_ratios: list[float] = []
    spread: list[float] = []
    for path in files:
        for name, runs in trace_runs(path).items():
            plain = [steady_rate(r) for r in runs if not r["callback"]]
            reference = statistics.median(plain)
            if len(plain) > 1:
                spread.append(max(plain) / min(plain))
            for run in runs:
                if not run["callback"] or "profile_steps" not in run:
                    continue
                profile = run["profile_steps"]["step"]["mean_s"]
                rate = steady_rate(run)
                own.append(profile / rate)
                plain_ratios.append(profile / reference)
                print(
                    f"{path.stem:28s} {name:12s} {profile * 1e3:8.2f} {rate * 1e3:8.2f} "
                    f"{reference * 1e3:8.2f} {own[-1]:6.3f} {plain_ratios[-1]:7.3f}"
                )
    for label, ratios in (("its own run", own), ("the plain runs", plain_ratios)):
        errors = [abs(r - 1) for r in ratios]
        print(
            f"   profile / {label}: median {statistics.median(ratios):.3f}, median |error| "
            f"{100 * statistics.median(errors):.1f} %, worst {100 * max(errors):.1f} % "
            f"over {len(ratios)} runs"
        )
    if spread:
        print(
            f"   noise floor: one job's plain runs on one machine differ by up to "
            f"{100 * (max(spread) - 1):.0f} % (max/min)\n"
        )


def traces_to_h100(model: PerformanceModel, sets: dict[str, TraceSet], results: Path) -> None:
    device = json.loads((results / "steps.json").read_text())["device"]
    h100 = one_h100()
    rows = measured_steps(results)
    print(f"== 2. trace profile -> one H100: per-sample slope (ms/sample), {device}")
    print(f"{'job':12s} {'math':5s} {'from':16s} {'measured':>9s} {'predicted':>9s} {'ratio':>6s}")
    errors = []
    for (job, math_mode), points in rows.items():
        if math_mode == "fp32" and job in ("cifar10", "bert"):
            continue  # strict fp32 (TF32 off) is not what the traces ran
        real = slope(points)
        for traces in sets.values():
            profile = coarse_profile(
                traces.models[job], traces.single_gpu_rows(job), traces.hardware
            )
            predicted = slope(
                {b: model.predict(profile, h100, local_batch=b).step_s for b in points}
            )
            ratio = predicted / real
            if job in JUDGED:
                errors.append(abs(ratio - 1))
            print(
                f"{job:12s} {math_mode:5s} {traces.hardware.gpu[:16]:16s} {real * 1e3:9.3f} "
                f"{predicted * 1e3:9.3f} {ratio:6.2f}{'' if job in JUDGED else '  (not judged)'}"
            )
    print(
        f"   judged jobs: median |slope error| {100 * statistics.median(errors):.0f} %, "
        f"worst {100 * max(errors):.0f} % over {len(errors)}\n"
    )


class AllWork(PerformanceModel):
    """The model before layer latency was split off: every layer's time is work, scaled
    with the batch and by each layer's roofline ratio (the comparison column)."""

    def layer_work(self, profile: Profile) -> list[tuple[Any, float]]:
        return [
            (x, x.forward_s + x.backward_s)
            for x in profile.layers
            if x.forward_s + x.backward_s > 0
        ]


def h100_other_batches(model: PerformanceModel, results: Path) -> None:
    print("== 1c. H100 profile -> the same H100 at the other batches measured (plain steps)")
    print(
        f"{'job':12s} {'batch':>5s} {'meas ms':>8s} {'pred ms':>8s} {'err':>6s} "
        f"{'all work':>8s} {'err':>6s}"
    )
    h100 = one_h100()
    old = AllWork(model.gpu_specs, model.calibration)
    measured = measured_steps(results)
    maths = {"cifar10": "tf32", "imagenet": "amp", "bert": "tf32", "deepspeech2": "fp32"}
    errors: dict[str, list[float]] = {"now": [], "all work": []}
    for job, math_ in maths.items():
        path = results / f"profile-{job}.json"
        if not path.exists():
            continue
        profile = h100_profile(path)
        profiled = profile.environment.step_batch_size
        for b, step in sorted(measured.get((job, math_), {}).items()):
            now = model.predict(profile, h100, local_batch=b).step_s
            before = old.predict(profile, h100, local_batch=b).step_s
            if b != profiled:
                errors["now"].append(abs(now / step - 1))
                errors["all work"].append(abs(before / step - 1))
            cells = [(now, now / step - 1), (before, before / step - 1)]
            shown = " ".join(f"{t * 1e3:8.1f} {100 * e:+5.0f}%" for t, e in cells)
            mark = "  (profiled)" if b == profiled else ""
            print(f"{job:12s} {b:5d} {step * 1e3:8.1f} {shown}{mark}")
        latency = model.layer_latency_s(profile)
        layers = sum(x.forward_s + x.backward_s for x in profile.layers)
        print(
            f"{'':12s} layer latency {latency * 1e3:.1f} ms of {layers * 1e3:.1f} ms of layer time"
        )
    if errors["now"]:
        print(
            f"   other batches: median |error| {100 * statistics.median(errors['now']):.0f} % "
            f"(every layer's time as work: {100 * statistics.median(errors['all work']):.0f} %)\n"
        )


def h100_to_traces(model: PerformanceModel, sets: dict[str, TraceSet], results: Path) -> None:
    print("== 3. H100 profile (SriftyCallback) -> one GPU of each trace hardware")
    old = AllWork(model.gpu_specs, model.calibration)
    old_errors = []
    print(
        f"{'job':12s} {'to':16s} {'batch':>5s} {'meas ms':>8s} {'pred ms':>8s} {'err':>6s} "
        f"{'slope meas':>10s} {'pred':>7s}"
    )
    slope_errors = []
    for job in ("cifar10", "imagenet", "bert", "deepspeech2"):
        path = results / f"profile-{job}.json"
        if not path.exists():
            continue
        profile = h100_profile(path)
        batch = profile.environment.local_batch_size
        for traces in sets.values():
            steps = single_gpu_steps(traces, job)
            if batch not in steps:
                continue
            cluster = Cluster((ClusterGroup(traces.hardware.offer(), 1, 1),))
            predicted = {b: model.predict(profile, cluster, local_batch=b).step_s for b in steps}
            real_slope, pred_slope = slope(steps), slope(predicted)
            if job in JUDGED:
                slope_errors.append(abs(pred_slope / real_slope - 1))
                before = {b: old.predict(profile, cluster, local_batch=b).step_s for b in steps}
                old_errors.append(abs(slope(before) / real_slope - 1))
            err = predicted[batch] / steps[batch] - 1
            print(
                f"{job:12s} {traces.hardware.gpu[:16]:16s} {batch:5d} {steps[batch] * 1e3:8.1f} "
                f"{predicted[batch] * 1e3:8.1f} {100 * err:+5.0f}% {real_slope * 1e3:10.3f} "
                f"{pred_slope * 1e3:7.3f}"
            )
    if slope_errors:
        print(
            f"   judged jobs: median |slope error| {100 * statistics.median(slope_errors):.0f} %"
            f" (every layer's time as work: {100 * statistics.median(old_errors):.0f} %; the"
            " traces' steps also hold AdaptDL's host work, which the H100 run has not)"
        )


def tf32_off_over_on(model: PerformanceModel, sets: dict[str, TraceSet], results: Path) -> None:
    rows = measured_steps(results)
    h100 = one_h100()
    specs = model.gpu_specs
    print("== 4. TF32 off / on, one H100: per-sample slope ratio, measured and modelled")
    print(f"{'job':12s} {'measured':>8s} {'model from':34s} {'model':>6s}")
    for job in ("bert", "cifar10"):
        if (job, "fp32") not in rows or (job, "tf32") not in rows:
            continue
        real = slope(rows[(job, "fp32")]) / slope(rows[(job, "tf32")])
        lines = []
        path = results / f"profile-{job}.json"
        if path.exists():
            # The H100 profile's own GPU gives ratio 1 by construction; a T4 (no TF32:
            # its time does not depend on the setting) is the reference instead:
            # H100_off / H100_on = (T4 / H100_on) / (T4 / H100_off).
            on = model.compute_ratio(with_math(h100_profile(path), "high", True), "T4")
            off = model.compute_ratio(with_math(h100_profile(path), "highest", False), "T4")
            if on is not None and off is not None:
                lines.append(("H100 profile, per layer", on / off))
        for traces in sets.values():
            spec = specs.get(traces.hardware.gpu)
            if spec is None or spec.tf32_tflops != spec.fp32_tflops:
                continue  # an Ampere source would change with the setting too
            profile = coarse_profile(
                traces.models[job], traces.single_gpu_rows(job), traces.hardware
            )
            batches = rows[(job, "tf32")]
            predicted = {
                mode: slope(
                    {
                        b: model.predict(with_math(profile, *mode), h100, local_batch=b).step_s
                        for b in batches
                    }
                )
                for mode in (("high", True), ("highest", False))
            }
            lines.append(
                (f"{traces.hardware.gpu} trace, whole step",
                 predicted[("highest", False)] / predicted[("high", True)])
            )  # fmt: skip
        for k, (source, ratio) in enumerate(lines):
            head = f"{job:12s} {real:8.2f}" if k == 0 else " " * 21
            print(f"{head} {source:34s} {ratio:6.2f}")
    h = specs["H100"]
    print(
        f"   datasheet bound for pure matrix products: TF32/FP32 peak = "
        f"{h.tf32_tflops:g}/{h.fp32_tflops:g} = {h.tf32_tflops / h.fp32_tflops:.2f}\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--data-root", type=Path, default=DEFAULT_ROOT)
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    p.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    args = p.parse_args(argv)
    if not (args.results / "lightning.json").exists():
        print(f"skipped: no GPU results in {args.results} (run benchmarks/gpu/measure_jobs.py)")
        return 0
    capture(args.results)
    capture_repeated(args.traces)
    h100_other_batches(PerformanceModel(load_gpu_specs(), load_default_calibration()), args.results)
    if not all((args.data_root / k).is_dir() for k in KINDS):
        print(f"skipped checks 2-3: the traces are not in {args.data_root}")
        return 0
    model = PerformanceModel(load_gpu_specs(), load_default_calibration())
    sets = {k: load_traces(args.data_root / k) for k in KINDS}
    traces_to_h100(model, sets, args.results)
    h100_to_traces(model, sets, args.results)
    tf32_off_over_on(model, sets, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
