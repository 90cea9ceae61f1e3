"""The step's log-normal read off a 10-90 % interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_srifty.core.lognormal import mean_factor, step_sigma


def test_sigma_is_read_back_from_the_10_and_90_percent_ends_of_samples() -> None:
    rng = np.random.default_rng(4)
    for sigma in (0.05, 0.3, 0.7):
        samples = 2.0 * np.exp(sigma * rng.standard_normal(400_000))
        low, high = np.quantile(samples, [0.1, 0.9])
        assert float(step_sigma(2.0, low, high)) == pytest.approx(sigma, rel=0.01)
        assert float(mean_factor(sigma)) * 2.0 == pytest.approx(samples.mean(), rel=0.005)


def test_an_asymmetric_interval_uses_its_geometric_middle() -> None:
    # ends at x0.8 and x1.5: the two log half-widths averaged
    expected = (math.log(1.5) + math.log(1 / 0.8)) / (2 * 1.2816)
    assert float(step_sigma(1.0, 0.8, 1.5)) == pytest.approx(expected)


def test_no_width_or_no_prediction_has_no_spread() -> None:
    got = step_sigma(
        np.array([1.0, 1.0, np.inf, 0.0, 1.0]),
        np.array([1.0, 0.0, 1.0, 0.0, np.nan]),
        np.array([1.0, 2.0, np.inf, 0.0, 2.0]),
    )
    assert got.tolist() == [0.0, 0.0, 0.0, 0.0, 0.0]
    assert float(mean_factor(0.0)) == 1.0
