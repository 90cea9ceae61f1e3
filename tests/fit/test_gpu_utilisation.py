"""Achieved matrix-product utilisation per GPU generation, fitted on Lambda's benchmark.

The synthetic test proves the algebra (planted factors come back); the real-data tests
check that the shipped table is the recipe's output and that, fitted without a pair of
GPUs, it predicts that pair's measured speed ratio better than datasheet peaks do.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from lightning_srifty.core.catalog import (
    GPU_GENERATIONS,
    HALF_RATE_ACCUMULATE,
    HALF_RATE_UTILISATION,
    POWER_FAMILIES,
    TENSOR_UTILISATION,
    GpuSpec,
    peak_tflops,
    predicted_speed_ratio,
    sustained_tflops,
    tensor_utilisation,
)
from lightning_srifty.fit.gpu_utilisation import HALF_RATE_KEY, fit_tensor_utilisation
from lightning_srifty.io.catalog_io import load_gpu_specs
from lightning_srifty.io.lambda_bench import (
    LAMBDA_GPU_TO_SPEC,
    LambdaRow,
    load_lambda_benchmark,
    single_gpu_throughput,
)

PLANTED = {"turing": 1.2, "volta": 1.0, "ampere": 1.1, "ada": 1.3, "hopper": 0.6}
PLANTED_HALF_RATE = 1.5


def _synthetic_rows(specs: dict[str, GpuSpec]) -> list[LambdaRow]:
    rows = []
    for lambda_name, name in LAMBDA_GPU_TO_SPEC.items():
        spec = specs[name]
        util = PLANTED[GPU_GENERATIONS[name]]
        for precision in ("fp32", "fp16"):
            half = PLANTED_HALF_RATE if precision == "fp16" and name in HALF_RATE_ACCUMULATE else 1
            # every synthetic model half compute-bound, as the recipe assumes
            rate = math.sqrt(sustained_tflops(spec, precision) * util * half * spec.mem_bw_gbps)
            work = {"conv": 3.0, "matmul": 0.5, "embedding": 900.0}
            throughput = {m: w * rate for m, w in work.items()}
            rows.append(LambdaRow(lambda_name, 1, precision, throughput))
    return rows


def test_planted_utilisation_comes_back_relative_to_the_others() -> None:
    specs = load_gpu_specs()
    fitted = fit_tensor_utilisation(_synthetic_rows(specs), specs, ridge=1e-9)
    # the GeForce boards' 16-bit factor is their own, beside their generations'
    assert fitted.pop(HALF_RATE_KEY) == pytest.approx(PLANTED_HALF_RATE, rel=1e-6)
    assert set(fitted) == set(PLANTED)
    # ratios between generations are what the rows can tell (a common scale cannot)
    for a, b in itertools.combinations(PLANTED, 2):
        assert fitted[a] / fitted[b] == pytest.approx(PLANTED[a] / PLANTED[b], rel=1e-6)


@pytest.fixture(scope="module")
def lambda_rows(shared_data: Path) -> list[LambdaRow]:
    return load_lambda_benchmark(shared_data / "lambda-benchmark")


def test_the_shipped_table_is_the_recipes_output(lambda_rows: list[LambdaRow]) -> None:
    fitted = fit_tensor_utilisation(lambda_rows, load_gpu_specs())
    assert fitted.pop(HALF_RATE_KEY) == pytest.approx(HALF_RATE_UTILISATION, rel=0.05)
    assert set(fitted) <= set(TENSOR_UTILISATION)
    for generation, value in fitted.items():
        assert TENSOR_UTILISATION[generation] == pytest.approx(value, rel=0.05), generation


def test_fitted_without_a_pair_it_predicts_that_pairs_fp16_ratio(
    lambda_rows: list[LambdaRow],
) -> None:
    """measured (median |log error| over 66 pairs): datasheet blend 26.1 %, achieved
    utilisation fitted without the pair, at the clocks the boards' power limits hold,
    11.8 % (16.9 % without the GeForce boards' own factor, 42.7 % and 16.2 % on the 21
    pairs with one; fp32: 21.0 % and 16.8 %)."""
    specs = load_gpu_specs()
    table = single_gpu_throughput(lambda_rows, "fp16")
    blend, achieved, geforce = [], [], []
    for a, b in itertools.combinations(sorted(table), 2):
        common = sorted(set(table[a]) & set(table[b]))
        measured = float(np.mean([math.log(table[a][m] / table[b][m]) for m in common]))
        peaks = math.log(peak_tflops(specs[a], "fp16") / peak_tflops(specs[b], "fp16"))
        held = math.log(sustained_tflops(specs[a], "fp16") / sustained_tflops(specs[b], "fp16"))
        bandwidth = math.log(specs[a].mem_bw_gbps / specs[b].mem_bw_gbps)
        left = fit_tensor_utilisation(lambda_rows, specs, exclude=(a, b))
        half = left.get(HALF_RATE_KEY, 1.0)
        util = math.log(
            tensor_utilisation(a, "fp16", left, half) / tensor_utilisation(b, "fp16", left, half)
        )
        blend.append(abs(0.5 * (peaks + bandwidth) - measured))
        achieved.append(abs(0.5 * (held + util + bandwidth) - measured))
        if a in HALF_RATE_ACCUMULATE or b in HALF_RATE_ACCUMULATE:
            geforce.append(achieved[-1])
    assert len(blend) == 66
    assert np.median(achieved) < 0.8 * np.median(blend)
    assert math.expm1(float(np.median(achieved))) <= 0.13
    # the GeForce boards' halved 16-bit peak, taken at face value, put them 43 % off
    assert len(geforce) == 21
    assert math.expm1(float(np.median(geforce))) <= 0.20


def test_boards_that_share_a_die_differ_by_their_power_limits(
    lambda_rows: list[LambdaRow],
) -> None:
    """Lambda's GPUs that share a die family (A10, RTX 3090, RTX A6000; the three
    A100 boards; the two H100s; RTX 6000 Ada and RTX 4090) at 150-700 W: the
    generation's utilisation cancels in their ratios, so only peaks, bandwidth and the
    power limit tell them apart. Measured (mean |log error| over 16 pair-precisions):
    datasheet clocks 14.7 %, the clocks the limits hold 10.9 % (18.5 and 14.0 % before
    the GeForce boards' 16-bit factor: the RTX 3090 was half the RTX A6000 in fp16, 0.86
    measured); the A10 against the RTX A6000, 0.63 measured, 0.79 by the datasheets,
    0.73 with its 150 W."""
    specs = load_gpu_specs()
    boost = {n: dataclasses.replace(spec, sustained_clock=1.0) for n, spec in specs.items()}
    errors: dict[str, list[float]] = {"held": [], "boost": []}
    for precision in ("fp32", "fp16"):
        table = single_gpu_throughput(lambda_rows, precision)
        for a, b in itertools.combinations(sorted(table), 2):
            if POWER_FAMILIES.get(a) != POWER_FAMILIES.get(b) or a not in POWER_FAMILIES:
                continue
            common = sorted(set(table[a]) & set(table[b]))
            measured = float(np.mean([math.log(table[a][m] / table[b][m]) for m in common]))
            for label, table_specs in (("held", specs), ("boost", boost)):
                ratio = predicted_speed_ratio(table_specs[a], table_specs[b], precision)
                errors[label].append(abs(math.log(ratio) - measured))
    assert len(errors["held"]) == 16
    assert np.mean(errors["held"]) < 0.8 * np.mean(errors["boost"])
