"""Live refinement: a running job's measured step time refits that job's own terms.

Once the job runs on the chosen cluster, its step time is a measurement of *this* job
on *this* hardware. It refits the job's own terms, the way the calibration fit treats
every job (:mod:`lightning_srifty.fit.calibration`), while the hardware constants stay
as calibrated:

* the compute scales: measured over predicted compute (what the roofline transfer or
  the profile missed), one per GPU type a run measured, so a probed plan is priced at
  what its probe ran. One GPU type's miss cannot be told from a job-wide one (a slower
  host, data loading), so a type no run measured takes the measured types' geometric
  mean: an unexplained slowdown never makes the GPU types not yet tried look cheaper.
  The profiled GPU keeps the profile's measurement unless a run on it measured again;
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
"""Prior spread of the co-location slowdown per doubling of the GPUs on a node
(additive: a job that saturates a shared host can be 20-50 % slower with one
neighbour)."""
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
    profiled = profile.environment.accelerator
    gpus = list(dict.fromkeys(g.offer.accelerator for c in clusters for g in c.groups))
    starts = np.log([base.compute_scale_on(a, profiled) for a in gpus])
    sigmas = np.asarray(
        [SAME_DEVICE_COMPUTE_SIGMA if a == profiled else COMPUTE_PRIOR_SIGMA for a in gpus]
    )
    kept = tuple((a, v) for a, v in base.measured_scales if a not in gpus)

    def terms(x: np.ndarray) -> JobTerms:
        scales = np.exp(starts + x[: len(gpus)])
        measured = (*kept, *zip(gpus, (float(v) for v in scales), strict=True))
        coloc, tail = x[len(gpus) :]
        return replace(
            base,
            measured_scales=measured,
            # what a GPU no run measured takes: the measured GPUs' geometric mean
            compute_scale=math.exp(sum(math.log(v) for _, v in measured) / len(measured)),
            accelerator=EVERY_ACCELERATOR,
            colocation_slowdown=max(base.colocation_slowdown + float(coloc), 0.0)
            if shared
            else base.colocation_slowdown,
            tail_fraction=_logistic(_logit(base.tail_fraction) + float(tail))
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
        coloc, tail = x[len(gpus) :]
        priors = [
            *(x[: len(gpus)] / sigmas),
            coloc / COLOCATION_PRIOR_SIGMA,
            tail / TAIL_PRIOR_SIGMA,
        ]
        return np.array([*misfit, *priors])

    result = least_squares(residuals, np.zeros(len(gpus) + 2), xtol=1e-6, ftol=1e-8, max_nfev=200)
    return with_terms(result.x)
