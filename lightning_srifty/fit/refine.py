"""Live refinement: a running job's measured step time refits that job's own terms.

Once the job runs on the chosen cluster, its step time is a measurement of *this* job
on *this* hardware. It refits the job's own terms, the way the calibration fit treats
every job (:mod:`lightning_srifty.fit.calibration`), while the hardware constants stay
as calibrated:

* ``compute_scale``: measured over predicted compute (what the roofline transfer or
  the profile missed). One measurement on one GPU type cannot tell a GPU-specific miss
  from a job-wide one (a slower host, data loading), so the scale holds for every GPU
  type: an unexplained slowdown never makes the GPU types not yet tried look cheaper;
* ``colocation_slowdown``: how much GPUs sharing a node slow the job (its data
  loading against the host's CPUs), where the cluster has several GPUs on a node;
* ``tail_fraction``: how much of its all-reduce backward cannot hide, where the
  cluster communicates.

One step time cannot separate them, so each term has a prior around its current value
and the fit is the most probable split (maximum a posteriori): a term the measurement
is insensitive to stays where it was. The compute term's prior is tight when the job
runs on the accelerator it was profiled on (nothing was transferred, so compute is
known) and wide when a roofline ratio carried it to another GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from lightning_srifty.core.calibration import EVERY_ACCELERATOR, Calibration, JobTerms
from lightning_srifty.core.catalog import GpuSpec
from lightning_srifty.core.cluster import Cluster
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.core.profile import Profile

COMPUTE_PRIOR_SIGMA = 0.5
"""Prior spread (log units) of the compute scale after a transfer to another GPU: a
roofline transfer is rarely off by more than a factor of e."""
SAME_DEVICE_COMPUTE_SIGMA = 0.05
"""The same on the profiled accelerator: the profile measured that compute itself."""
TAIL_PRIOR_SIGMA = 0.5
"""Prior spread (logit units) of the tail fraction."""
COLOCATION_PRIOR_SIGMA = 0.2
"""Prior spread of the co-location slowdown per extra GPU on a node (additive: a job
that saturates a shared host can be 20-50 % slower per neighbour)."""
MEASUREMENT_SIGMA = 0.05
"""Log spread of a measured mean step over tens of steps."""


def _logit(p: float) -> float:
    p = min(max(p, 1e-4), 1 - 1e-4)
    return math.log(p / (1 - p))


def _logistic(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-min(max(z, -40.0), 40.0)))


def refit_job(
    calibration: Calibration,
    profile: Profile,
    cluster: Cluster,
    measured_step_s: float,
    *,
    gpu_specs: dict[str, GpuSpec],
) -> Calibration:
    """``calibration`` with ``profile``'s job terms refitted to a step measured on ``cluster``.

    The job is keyed by ``profile.model_name`` (and, for co-location, the profile's
    instance type), as in a calibration fit. ``measured_step_s`` is one optimizer
    update (the profile's own step) with every process on the profile's batch.
    """
    return refit_job_on(calibration, profile, [(cluster, measured_step_s)], gpu_specs=gpu_specs)


def refit_job_on(
    calibration: Calibration,
    profile: Profile,
    measurements: Sequence[tuple[Cluster, float]],
    *,
    gpu_specs: dict[str, GpuSpec],
) -> Calibration:
    """The job's terms refitted to several measured steps at once (probes of several
    clusters, or a running job): each ``(cluster, seconds per optimizer update)``.

    Several measurements on different shapes separate what one cannot: a single-GPU
    probe pins the compute scale, a probe of GPUs sharing a node then shows their
    co-location slowdown, one across GPUs or nodes the exposed communication.
    """
    from scipy.optimize import least_squares  # lazy: only fitting needs scipy

    if not measurements:
        return calibration
    name = profile.model_name or "job"
    profile = replace(profile, model_name=name)
    instance = profile.environment.instance_type or ""
    base = calibration.job(name, instance) or JobTerms(
        name=name,
        tail_fraction=calibration.physics.tail_fraction,
        overlap_window=calibration.physics.overlap_window,
        colocation_slowdown=calibration.physics.colocation_slowdown,
        instance_type=instance,
    )
    clusters = [c for c, _ in measurements]
    shared = any(max(g.gpus_per_node for g in c.groups) > 1 for c in clusters)
    communicates = any(c.world_size > 1 for c in clusters)
    start_scale = base.compute_scale if base.accelerator else 1.0
    same_device = all(
        c.groups[0].offer.accelerator == profile.environment.accelerator for c in clusters
    )
    compute_sigma = SAME_DEVICE_COMPUTE_SIGMA if same_device else COMPUTE_PRIOR_SIGMA

    def terms(x: np.ndarray) -> JobTerms:
        return replace(
            base,
            compute_scale=start_scale * math.exp(float(x[0])),
            accelerator=EVERY_ACCELERATOR,
            colocation_slowdown=max(base.colocation_slowdown + float(x[1]), 0.0)
            if shared
            else base.colocation_slowdown,
            tail_fraction=_logistic(_logit(base.tail_fraction) + float(x[2]))
            if communicates
            else base.tail_fraction,
        )

    def with_terms(x: np.ndarray) -> Calibration:
        others = tuple(j for j in calibration.jobs if j.name != name)
        return replace(calibration, jobs=(*others, terms(x)))

    def residuals(x: np.ndarray) -> np.ndarray:
        model = PerformanceModel(gpu_specs, with_terms(x))
        misfit = [
            math.log(max(model.predict(profile, cluster).step_s, 1e-12) / measured)
            / MEASUREMENT_SIGMA
            for cluster, measured in measurements
        ]
        priors = [x[0] / compute_sigma, x[1] / COLOCATION_PRIOR_SIGMA, x[2] / TAIL_PRIOR_SIGMA]
        return np.array([*misfit, *priors])

    result = least_squares(residuals, np.zeros(3), xtol=1e-6, ftol=1e-8, max_nfev=200)
    return with_terms(result.x)
