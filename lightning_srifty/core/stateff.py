"""Statistical efficiency: how many more steps a larger global batch needs.

A larger batch averages away gradient noise, but once the batch exceeds the gradient
noise scale ``B_noise`` (McCandlish et al. 2018) extra samples buy little. Relative to
a batch ``B0``, one step at batch ``B`` is worth ``E(B) = (B_noise + B0)/(B_noise + B)``
times as many samples (Pollux, OSDI'21), so reaching the same target takes
``steps0 · (B0/B) / E(B)`` steps at ``B``.

Reading the gradient statistics. ``B_noise = tr(Sigma)/|G|^2`` with ``tr(Sigma)`` the
*per-sample* gradient variance. Pollux/AdaptDL's ``grad_var`` (the ``validation-*.csv``
files) is not per-sample: AdaScale normalises it to the job's *initial* batch ``B_ref``
(its gain is ``(var + sqr)/(var/scale + sqr)`` with ``scale = B/B_ref``), so
``B_noise = B_ref · grad_var/grad_sqr``. The data agree: across the cifar10 runs at
128..4096 the ratio ``grad_var/grad_sqr`` at mid-training grows only ~4x while the
batch grows 32x, so it is not a per-batch variance (that would shrink as 1/B).
:class:`~lightning_srifty.core.profile.StatEfficiency` stores the per-sample reading,
so its ``noise_scale`` needs no reference batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.profile import Profile


def noise_scale_from_adascale(grad_sqr: float, grad_var: float, reference_batch: int) -> float:
    """``B_noise`` in samples from AdaScale statistics normalised to ``reference_batch``."""
    if reference_batch < 1:
        raise ConfigError(f"reference batch must be >= 1, got {reference_batch}")
    if grad_var < 0 or grad_sqr < 0:
        raise ConfigError(f"gradient statistics must be >= 0, got {grad_sqr}, {grad_var}")
    if grad_sqr == 0:
        return math.inf
    return reference_batch * grad_var / grad_sqr


def robust_noise_scale(
    grad_sqr: Sequence[float], grad_var: Sequence[float], reference_batch: int
) -> float:
    """Median ``B_noise`` over a run's recorded points (single points are noisy)."""
    ratios = [
        noise_scale_from_adascale(s, v, reference_batch)
        for s, v in zip(grad_sqr, grad_var, strict=True)
        if s > 0
    ]
    if not ratios:
        raise ConfigError("no gradient statistics with grad_sqr > 0")
    return float(np.median(ratios))


def profile_noise_scale(profile: Profile) -> float | None:
    """``B_noise`` of a profile, or ``None`` when it recorded no gradient statistics."""
    stats = profile.stat_efficiency
    return None if stats is None else stats.noise_scale


def efficiency(batch: np.ndarray | float, base_batch: float, noise_scale: float) -> np.ndarray:
    """``E(B) = (B_noise + B0)/(B_noise + B)``: value of one sample at ``B`` vs ``B0``.

    An infinite noise scale (pure noise, or unknown and assumed large) gives 1: every
    sample counts fully, which is the perfect-scaling assumption.
    """
    b = np.asarray(batch, dtype=np.float64)
    if base_batch <= 0 or np.any(b <= 0):
        raise ConfigError("batch sizes must be positive")
    if math.isinf(noise_scale):
        return np.ones_like(b)
    if noise_scale < 0:
        raise ConfigError(f"noise scale must be >= 0, got {noise_scale}")
    return np.asarray((noise_scale + base_batch) / (noise_scale + b))


def steps_to_target(
    steps0: float, base_batch: float, batch: np.ndarray | float, noise_scale: float
) -> np.ndarray:
    """Steps needed at ``batch`` to match ``steps0`` steps at ``base_batch``.

    Samples needed grow by ``1/E(B)``: ``steps0·B0/(B·E(B))``
    ``= steps0·(B_noise + B)/(B_noise + B0)·B0/B``. A batch well below ``B_noise``
    scales perfectly; no batch gets below ``steps0·B0/(B_noise + B0)`` steps.
    """
    if steps0 < 0:
        raise ConfigError(f"steps must be >= 0, got {steps0}")
    b = np.asarray(batch, dtype=np.float64)
    return np.asarray(steps0 * base_batch / (b * efficiency(b, base_batch, noise_scale)))
