"""Cross-GPU scaling, checked two ways on measurements.

1. **Lambda's benchmark**: for every pair of GPUs present in both ``lambda-benchmark``
   and ``gpu_specs.csv``, per precision, the measured throughput ratio (geometric mean
   over models, and the per-model spread), the ratio predicted by peak FLOP/s alone, by
   memory bandwidth alone and by the model's one compute-ratio function
   with datasheet peaks (``blend``: a fixed 50/50 roofline blend, the model before
   achieved utilisation), and the model's one compute-ratio function
   (``core.catalog.device_time_ratio``, ``achieved``: the matrix-product peak times its
   generation's achieved utilisation) with the utilisation refitted *without the pair's
   two GPUs* (``fit.gpu_utilisation``, leave-pair-out: a generation with no other GPU
   in the table gets 1), with each prediction's error, the median absolute error and
   how often the pair is ranked the right way round. The shipped utilisation table is
   printed first.
2. **The same six jobs on three GPUs** (pollux T4, sia A100 and Quadro RTX 6000): each
   set's single-GPU step at every local batch measured on another GPU, predicted by the
   performance model from the source set's single-GPU rows alone (its coarse profile on
   a one-GPU cluster of the target hardware), so host time, the fixed per-step cost and
   the precision path are exercised as in ``srifty predict``. Per-model medians and the
   pooled median per direction; the target is a median of at most 15 % from the T4.
3. **The compute ratio alone on the same traces**: per job and direction, the model's
   device-time ratio against the measured ratio of per-sample costs (the slope of
   one-GPU compute over the local batch, which leaves the host's fixed per-step time
   out), with and without the boards' power limits
   (``core.catalog.with_power_limits``): the T4's 70 W holds it at about 0.77 of its
   boost clock, which its datasheet peak does not say. The clock each board holds is
   printed first.

Run: ``.venv/bin/python benchmarks/bench_gpu_scaling.py [--data-root DIR]``
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import numpy as np

from lightning_srifty.core.catalog import (
    COMPUTE_SHARE,
    PRECISIONS,
    TENSOR_UTILISATION,
    peak_tflops,
    predicted_speed_ratio,
    tensor_utilisation,
)
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.fit.gpu_utilisation import HALF_RATE_KEY, fit_tensor_utilisation
from lightning_srifty.fit.validation import per_sample_transfer, single_gpu_transfer
from lightning_srifty.io.calibration_io import load_default_calibration
from lightning_srifty.io.catalog_io import load_gpu_specs
from lightning_srifty.io.lambda_bench import load_lambda_benchmark, single_gpu_throughput
from lightning_srifty.io.traces import load_traces

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data"
TRACE_SETS = ("pollux-traces", "sia-traces/dgx-ext", "sia-traces/quad")


def left_out_utilisation(
    rows: list,  # type: ignore[type-arg]
    specs: dict,  # type: ignore[type-arg]
    fast: str,
    slow: str,
    precision: str,
) -> float:
    """How the pair's predicted ratio moves when the utilisation is fitted without the
    pair: the shipped factors undone (the generations' and, in fp16, the GeForce
    boards'), the left-out fit's applied."""
    left = fit_tensor_utilisation(rows, specs, exclude=(fast, slow))
    half_rate = left.get(HALF_RATE_KEY, 1.0)
    shipped = tensor_utilisation(fast, precision) / tensor_utilisation(slow, precision)
    refit = tensor_utilisation(fast, precision, left, half_rate) / tensor_utilisation(
        slow, precision, left, half_rate
    )
    return float((refit / shipped) ** COMPUTE_SHARE)


def lambda_pairs(folder: Path) -> None:
    specs = load_gpu_specs()
    rows = load_lambda_benchmark(folder)
    shipped = ", ".join(f"{g} {u:.2f}" for g, u in sorted(TENSOR_UTILISATION.items()))
    print(f"achieved matrix-product utilisation per generation (shipped): {shipped}")
    fitted = fit_tensor_utilisation(rows, specs)
    print(
        "the same refitted on every Lambda row: "
        + ", ".join(f"{g} {u:.2f}" for g, u in sorted(fitted.items()))
    )
    for precision in PRECISIONS:
        measured = {g: t for g, t in single_gpu_throughput(rows, precision).items() if g in specs}
        print(f"\n== {precision}, 1 GPU: {len(measured)} GPUs in both tables ==")
        header = (
            f"{'fast':<16}{'slow':<16}{'meas':>7}{'spread':>14}"
            f"{'flops':>7}{'err%':>6}{'bw':>7}{'err%':>6}{'blend':>7}{'err%':>6}"
            f"{'achvd':>7}{'err%':>6}"
        )
        print(header)
        kinds = ("flops", "bw", "blend", "achieved")
        errors: dict[str, list[float]] = {k: [] for k in kinds}
        agree: dict[str, int] = {k: 0 for k in kinds}
        pairs = 0
        for a, b in itertools.combinations(sorted(measured), 2):
            models = sorted(set(measured[a]) & set(measured[b]))
            if not models:
                continue
            per_model = np.array([measured[a][m] / measured[b][m] for m in models])
            meas = float(np.exp(np.mean(np.log(per_model))))
            fast, slow = (a, b) if meas >= 1.0 else (b, a)
            meas = max(meas, 1.0 / meas)
            spread = per_model if fast == a else 1.0 / per_model
            predictions = {
                "flops": peak_tflops(specs[fast], precision) / peak_tflops(specs[slow], precision),
                "bw": specs[fast].mem_bw_gbps / specs[slow].mem_bw_gbps,
                "blend": math.sqrt(
                    peak_tflops(specs[fast], precision)
                    / peak_tflops(specs[slow], precision)
                    * specs[fast].mem_bw_gbps
                    / specs[slow].mem_bw_gbps
                ),
                "achieved": predicted_speed_ratio(specs[fast], specs[slow], precision)
                * left_out_utilisation(rows, specs, fast, slow, precision),
            }
            cells = []
            for name, predicted in predictions.items():
                error = 100.0 * (predicted / meas - 1.0)
                errors[name].append(abs(math.log(predicted / meas)))
                agree[name] += predicted >= 1.0
                cells.append(f"{predicted:7.2f}{error:6.0f}")
            pairs += 1
            print(
                f"{fast:<16}{slow:<16}{meas:7.2f}"
                f"{f'{spread.min():.2f}..{spread.max():.2f}':>14}" + "".join(cells)
            )
        print(f"-- {pairs} pairs; median |log error| as %, and pairs ranked right:")
        for name in errors:
            median = 100.0 * (math.exp(float(np.median(errors[name]))) - 1.0)
            print(f"   {name:<6} median error {median:5.1f}%   ranked right {agree[name]}/{pairs}")


def trace_pairs(root: Path) -> None:
    model = PerformanceModel(load_gpu_specs(), load_default_calibration())
    sets = {name: load_traces(root / name) for name in TRACE_SETS}
    print("\n== single-GPU step on another GPU, predicted from the source's 1-GPU rows ==")
    for src, dst in itertools.permutations(sets.values(), 2):
        per_job = single_gpu_transfer(model, src, dst)
        every = np.concatenate(list(per_job.values()))
        cells = " ".join(f"{job}:{100 * np.median(e):.0f}" for job, e in per_job.items())
        print(
            f"{src.hardware.gpu:>16} -> {dst.hardware.gpu:<16} median "
            f"{100 * np.median(every):5.1f} %  p90 {100 * np.quantile(every, 0.9):5.1f} %  "
            f"({every.size} rows; per model: {cells})"
        )


def compute_ratio_pairs(root: Path) -> None:
    specs = load_gpu_specs()
    limited = ", ".join(
        f"{name} {spec.sustained_clock:.2f}"
        for name, spec in specs.items()
        if spec.sustained_clock < 1.0
    )
    print(f"\n== clock held under the board's power limit (others 1): {limited} ==")
    model = PerformanceModel(specs, load_default_calibration())
    sets = {name: load_traces(root / name) for name in TRACE_SETS}
    print("per-sample cost ratio, model over measured - 1 (+: target predicted too slow)")
    for src, dst in itertools.permutations(sets.values(), 2):
        per_job = per_sample_transfer(model, src, dst)
        cells = " ".join(f"{job}:{100 * e:+.0f}" for job, e in sorted(per_job.items()))
        print(f"{src.hardware.gpu:>16} -> {dst.hardware.gpu:<16} {cells}")
    # T4 and Quadro RTX 6000 are one generation: the utilisation factor cancels, so
    # the power limit is the only difference between the two predictions
    datasheet = {n: dataclasses.replace(s, sustained_clock=1.0) for n, s in specs.items()}
    turing = [sets["pollux-traces"], sets["sia-traces/quad"]]
    for label, m in (
        ("power limits", model),
        ("datasheet clocks", PerformanceModel(datasheet, load_default_calibration())),
    ):
        errors = [
            abs(math.log1p(e))
            for src, dst in itertools.permutations(turing, 2)
            for e in per_sample_transfer(m, src, dst).values()
        ]
        median = 100.0 * math.expm1(float(np.median(errors)))
        print(
            f"T4 <-> Quadro RTX 6000 with {label:<17} median |error| {median:5.1f} %, "
            f"worst {100.0 * math.expm1(max(errors)):5.1f} % ({len(errors)} job-directions)"
        )


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", type=Path, default=DEFAULT_ROOT)
    args = parser.parse_args()
    lambda_pairs(args.data_root / "lambda-benchmark")
    trace_pairs(args.data_root)
    compute_ratio_pairs(args.data_root)


if __name__ == "__main__":
    main()
