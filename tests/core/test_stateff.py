"""Statistical efficiency: the noise-scale formulas against hand-computed values."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.stateff import (
    efficiency,
    noise_scale_from_adascale,
    robust_noise_scale,
    steps_to_target,
)


def test_efficiency_is_one_at_the_base_batch_and_falls_with_batch() -> None:
    e = efficiency(np.array([100.0, 200.0, 1000.0]), 100.0, 100.0)
    assert e[0] == pytest.approx(1.0)
    assert e[1] == pytest.approx(200.0 / 300.0)
    assert e[2] == pytest.approx(200.0 / 1100.0)


def test_steps_scale_perfectly_far_below_the_noise_scale() -> None:
    steps = steps_to_target(10_000, 32, 64, noise_scale=1e9)
    assert float(steps) == pytest.approx(5_000, rel=1e-6)


def test_steps_saturate_far_above_the_noise_scale() -> None:
    floor = 10_000 * 32 / (1_000 + 32)
    steps = steps_to_target(10_000, 32, np.array([1e6, 1e9]), noise_scale=1_000)
    assert steps[1] == pytest.approx(floor, rel=1e-5)
    assert steps[0] > steps[1]


def test_infinite_noise_scale_means_perfect_scaling() -> None:
    assert float(efficiency(4096.0, 128.0, math.inf)) == 1.0


def test_adascale_reading_multiplies_by_the_reference_batch() -> None:
    assert noise_scale_from_adascale(2.0, 10.0, 128) == pytest.approx(640.0)
    assert noise_scale_from_adascale(0.0, 10.0, 128) == math.inf
    with pytest.raises(ConfigError):
        noise_scale_from_adascale(1.0, 1.0, 0)


def test_bad_batches_are_rejected() -> None:
    with pytest.raises(ConfigError):
        efficiency(0.0, 128.0, 10.0)


def test_pollux_ratio_is_not_a_per_batch_variance(shared_data) -> None:  # type: ignore[no-untyped-def]
    """The documented reading: grad_var/grad_sqr does not shrink as 1/B across runs."""
    folder = shared_data / "pollux-traces" / "cifar10"
    medians = {}
    for batch in (128, 4096):
        with open(folder / f"validation-{batch}.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        sqr = [float(r["grad_sqr"]) for r in rows]
        var = [float(r["grad_var"]) for r in rows]
        medians[batch] = robust_noise_scale(sqr, var, 1)
    # A per-batch variance would make the 4096 ratio 32x smaller; it is larger.
    assert medians[4096] > medians[128]
