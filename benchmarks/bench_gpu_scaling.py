"""Cross-GPU scaling: Lambda's measured 1-GPU throughput vs the published spec table.

For every pair of GPUs present in both ``lambda-benchmark`` and ``gpu_specs.csv`` it
prints, per precision, the measured throughput ratio (geometric mean over models, and
the per-model spread), the ratio predicted by peak FLOP/s alone, by memory bandwidth
alone and by the roofline blend of ``core.catalog.predicted_speed_ratio`` (fixed 50/50
weight, not fitted), with each prediction's error. Ends with the median absolute error
of each predictor and how often it ranks the pair the right way round.

Run: ``.venv/bin/python benchmarks/bench_gpu_scaling.py [path/to/lambda-benchmark]``
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np

from lightning_srifty.core.catalog import PRECISIONS, peak_tflops, predicted_speed_ratio
from lightning_srifty.io.catalog_io import load_gpu_specs
from lightning_srifty.io.lambda_bench import load_lambda_benchmark, single_gpu_throughput

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "lambda-benchmark"


def main(folder: Path) -> None:
    specs = load_gpu_specs()
    rows = load_lambda_benchmark(folder)
    for precision in PRECISIONS:
        measured = {g: t for g, t in single_gpu_throughput(rows, precision).items() if g in specs}
        print(f"\n== {precision}, 1 GPU: {len(measured)} GPUs in both tables ==")
        header = (
            f"{'fast':<16}{'slow':<16}{'meas':>7}{'spread':>14}"
            f"{'flops':>7}{'err%':>6}{'bw':>7}{'err%':>6}{'blend':>7}{'err%':>6}"
        )
        print(header)
        errors: dict[str, list[float]] = {"flops": [], "bw": [], "blend": []}
        agree: dict[str, int] = {"flops": 0, "bw": 0, "blend": 0}
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
                "blend": predicted_speed_ratio(specs[fast], specs[slow], precision),
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


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DATA)
