"""How much of its matrix-product peak each GPU generation achieves, from Lambda's benchmark.

A datasheet's tensor-core peak is not what training reaches, and the shortfall is not
the same on every architecture: Hopper's peak doubled Ampere's while the kernels that
reach it (FP8, warp-specialised GEMMs) are rarely what a PyTorch training step runs.
So the matrix-product side of the roofline takes one *achieved-utilisation* factor per
GPU generation (:data:`~lightning_srifty.core.catalog.TENSOR_UTILISATION`), relative
to the others: only ratios between GPUs matter when a profile moves from one to another.

The recipe: Lambda's single-GPU training throughput (fp32 and fp16, ten models) is
``log(samples/s) = a[model, precision] + s·log(peak·u[generation]) + (1-s)·log(bandwidth)``
(``peak`` at the clock the board's power limit lets it hold:
:func:`~lightning_srifty.core.catalog.sustained_tflops`)
with ``s`` the whole-step compute share of the model
(:data:`~lightning_srifty.core.catalog.COMPUTE_SHARE`, not fitted); linear least squares
for the per-model work ``a`` and ``log u`` with a ridge prior pulling ``log u`` to 0
(:data:`RIDGE`: a generation with one GPU in the table moves only as far as its rows
insist). One factor per generation, shared by both precisions (the same tensor-core
pipeline), and one more on the fp16 rows of the GeForce boards, whose listed 16-bit peak
is the halved FP32-accumulate rate
(:data:`~lightning_srifty.core.catalog.HALF_RATE_ACCUMULATE`), under
:data:`HALF_RATE_KEY`. No per-row constant: a model's work ``a`` cancels in every ratio.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from lightning_srifty.core.catalog import (
    COMPUTE_SHARE,
    GPU_GENERATIONS,
    HALF_RATE_ACCUMULATE,
    PRECISIONS,
    GpuSpec,
    sustained_tflops,
)
from lightning_srifty.io.lambda_bench import LambdaRow, single_gpu_throughput

HALF_RATE_KEY = "half-rate fp16"
"""Key of the GeForce boards' 16-bit factor in :func:`fit_tensor_utilisation`'s answer
(:data:`~lightning_srifty.core.catalog.HALF_RATE_UTILISATION`)."""
RIDGE = 1.0
"""Prior precision of ``log u`` around 0 (a factor e either way at one sigma, against
rows that each weigh 1 in log units)."""


def fit_tensor_utilisation(
    rows: Sequence[LambdaRow],
    specs: Mapping[str, GpuSpec],
    *,
    exclude: Sequence[str] = (),
    ridge: float = RIDGE,
) -> dict[str, float]:
    """Achieved matrix-product utilisation per GPU generation (relative, around 1), and
    the GeForce boards' 16-bit factor under :data:`HALF_RATE_KEY` where rows inform it.

    Args:
        rows: Lambda's benchmark rows (both precisions).
        specs: the GPU table (peaks, bandwidth).
        exclude: spec-table GPU names left out of the fit (leave-pair-out checks).
        ridge: prior precision of ``log u`` around 0.
    """
    observations = []
    for precision in PRECISIONS:
        for gpu, per_model in single_gpu_throughput(list(rows), precision).items():
            if gpu in exclude or gpu not in specs or gpu not in GPU_GENERATIONS:
                continue
            for model, samples_s in per_model.items():
                observations.append((precision, model, gpu, math.log(samples_s)))
    generations = sorted({GPU_GENERATIONS[g] for _, _, g, _ in observations})
    works = sorted({(p, m) for p, m, _, _ in observations})
    if not observations:
        return {}
    half_rate = [p == "fp16" and g in HALF_RATE_ACCUMULATE for p, _, g, _ in observations]
    factors = len(generations) + (1 if any(half_rate) else 0)
    x = np.zeros((len(observations) + factors, len(works) + factors))
    y = np.zeros(x.shape[0])
    for i, (precision, model, gpu, log_rate) in enumerate(observations):
        spec = specs[gpu]
        x[i, works.index((precision, model))] = 1.0
        x[i, len(works) + generations.index(GPU_GENERATIONS[gpu])] = COMPUTE_SHARE
        if half_rate[i]:
            x[i, len(works) + len(generations)] = COMPUTE_SHARE
        y[i] = log_rate - (
            COMPUTE_SHARE * math.log(sustained_tflops(spec, precision))
            + (1.0 - COMPUTE_SHARE) * math.log(spec.mem_bw_gbps)
        )
    for k in range(factors):
        x[len(observations) + k, len(works) + k] = math.sqrt(ridge)
    solution = np.linalg.lstsq(x, y, rcond=None)[0]
    out = {g: float(math.exp(solution[len(works) + k])) for k, g in enumerate(generations)}
    if factors > len(generations):
        out[HALF_RATE_KEY] = float(math.exp(solution[len(works) + len(generations)]))
    return out
