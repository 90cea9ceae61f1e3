"""The calibration record: per-hardware physics constants and a learned correction.

A calibration is fitted once per kind of hardware (by ``srifty calibrate``) from
measured multi-GPU step times, and then makes every prediction on that hardware more
accurate. Its :class:`PhysicsConstants` are *hardware* constants: link efficiencies
(effective over nominal bandwidth), per-message latencies, how much of the all-reduce
overlaps backward for a typical job, a per-step framework overhead. They transfer to
models the calibration has never seen.

Three quantities also depend on the job itself: how late in backward its gradients
become ready (``tail_fraction``, ``overlap_window``) and how much its compute slows
when GPUs share a node (``colocation_slowdown``: host PCIe, CPU data loading). The fit
treats them as per-job deviations from the hardware value (a mixed-effects model), so
the hardware constants describe the typical job rather than absorbing one job's
quirks, and a job whose own multi-GPU rows were in the calibration keeps its own
values (:class:`JobTerms`). A job never seen gets the hardware values.

Efficiencies are stored relative to the nominal figures (link type, NIC Gbps) so they
stay meaningful when a candidate has a different NIC than the calibration cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from lightning_srifty.core.errors import CalibrationError
from lightning_srifty.core.trees import TreeEnsemble
from lightning_srifty.core.validate import Reader, check_version

CALIBRATION_SCHEMA_VERSION = 2
INTER_ALGORITHMS = ("ring", "tree")

FEATURE_NAMES = (
    "log_replicas",
    "log_nodes",
    "gpus_per_node",
    "log_comm_over_compute",
    "exposed_share",
)
"""Inputs of the learned correction: ratios and logs that mean the same on any hardware.
Deliberately nothing that identifies a training model (gradient bytes, absolute step
time): with a handful of models in a trace set, trees would learn each model's own
residual and fail on the next model."""


@dataclass(frozen=True)
class PhysicsConstants:
    """Hardware-level constants of the analytic model.

    The defaults are what the model assumes with no calibration at all: nominal link
    bandwidths, NCCL-like per-hop latencies (a few microseconds inside a node, tens
    across a TCP network), a moderate overlap and no extra overhead.

    Overlap of a coarse profile (no per-layer timings) follows a fluid model of DDP's
    bucketed all-reduce: a share ``tail_fraction`` of the gradient bytes is ready only
    when backward ends (the first layers, embeddings), the rest streams out during the
    last ``overlap_window`` of backward. The communication stream then finishes
    ``max(tail·T, T - window·B)`` after backward ends, for an all-reduce of ``T``
    seconds and a backward of ``B`` (:func:`~lightning_srifty.core.comm.exposed_allreduce_s`).
    """

    intra_bw_efficiency: float = 1.0
    """Effective over nominal intra-node (NVLink/PCIe) bandwidth."""
    intra_latency_s: float = 10e-6
    """Latency per ring hop and per bucket inside a node."""
    inter_bw_efficiency: float = 1.0
    """Effective over nominal inter-node (NIC Gbps) bandwidth."""
    inter_latency_s: float = 50e-6
    """Latency per ring hop and per bucket across nodes."""
    tail_fraction: float = 0.25
    """Share of the all-reduce that cannot overlap backward (gradients ready only at its
    end): what stays exposed when the network is faster than backward. 1 = no overlap."""
    overlap_window: float = 0.75
    """Share of backward during which the other gradients become ready and stream out."""
    two_node_factor: float = 1.0
    """Multiplier on the all-reduce time when exactly two nodes take part. Some stacks
    run a two-node ring markedly slower per byte than larger rings (on the Pollux T4
    cluster by about 1.5x, in every model alike; NCCL choosing another algorithm or
    fewer channels for two nodes is the likely cause). 1 = no such effect; the fit
    leaves it at 1 when the calibration has no two-node rows."""
    step_overhead_s: float = 0.0
    """Fixed per-step cost of synchronous data parallelism (hooks, launches)."""
    colocation_slowdown: float = 0.0
    """Compute slowdown per extra GPU sharing a node (host PCIe, CPU, data loading)."""
    inter_algorithm: str = "ring"
    """NCCL algorithm across nodes, ``"ring"`` or ``"tree"``; calibration picks the one
    the measurements support (it depends on the NCCL version and network, not the model)."""
    straggler_cv: float = 0.0
    """Coefficient of variation of per-GPU step time; a synchronous step waits for the
    slowest of ``p`` workers, ``mean·(1 + cv·E[max of p standard normals])``."""

    def to_dict(self) -> dict[str, float]:
        return {
            "intra_bw_efficiency": self.intra_bw_efficiency,
            "intra_latency_s": self.intra_latency_s,
            "inter_bw_efficiency": self.inter_bw_efficiency,
            "inter_latency_s": self.inter_latency_s,
            "tail_fraction": self.tail_fraction,
            "overlap_window": self.overlap_window,
            "two_node_factor": self.two_node_factor,
            "step_overhead_s": self.step_overhead_s,
            "colocation_slowdown": self.colocation_slowdown,
            "straggler_cv": self.straggler_cv,
        }

    def to_json(self) -> dict[str, Any]:
        """The JSON form: the numbers plus the algorithm name."""
        return {**self.to_dict(), "inter_algorithm": self.inter_algorithm}

    @staticmethod
    def from_reader(r: Reader) -> PhysicsConstants:
        constants = PhysicsConstants(
            intra_bw_efficiency=r.float("intra_bw_efficiency", positive=True),
            intra_latency_s=r.float("intra_latency_s", minimum=0.0),
            inter_bw_efficiency=r.float("inter_bw_efficiency", positive=True),
            inter_latency_s=r.float("inter_latency_s", minimum=0.0),
            tail_fraction=r.float("tail_fraction", positive=True),
            overlap_window=r.float("overlap_window", minimum=0.0),
            two_node_factor=r.float("two_node_factor", 1.0, positive=True),
            step_overhead_s=r.float("step_overhead_s", minimum=0.0),
            colocation_slowdown=r.float("colocation_slowdown", 0.0, minimum=0.0),
            straggler_cv=r.float("straggler_cv", 0.0, minimum=0.0),
            inter_algorithm=r.choice("inter_algorithm", INTER_ALGORITHMS, "ring"),
        )
        for key in ("tail_fraction", "overlap_window"):
            value = getattr(constants, key)
            if value > 1.0:
                raise r.fail(key, f"is a share and must be in [0, 1], got {value}")
        return constants

    def for_job(self, job: JobTerms | None) -> PhysicsConstants:
        """These constants with a job's own measured terms substituted (if any)."""
        if job is None:
            return self
        return replace(
            self,
            tail_fraction=job.tail_fraction,
            overlap_window=job.overlap_window,
            colocation_slowdown=job.colocation_slowdown,
        )


@dataclass(frozen=True)
class JobTerms:
    """One job's own overlap and co-location terms, fitted from its own multi-GPU rows.

    They are physical properties of the job on this hardware, not corrections: where
    in backward its gradients become ready, and how much its compute slows when GPUs
    share a node (its data loading may saturate the host CPUs). A short single-node
    multi-GPU run measures ``tail_fraction`` and ``colocation_slowdown``;
    ``overlap_window`` shows only once the all-reduce outlasts backward (across
    nodes), so a job without such rows keeps the hardware value.
    """

    name: str
    tail_fraction: float
    overlap_window: float
    colocation_slowdown: float
    rows: int = 0
    """How many of the job's rows the terms were fitted on."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tail_fraction": self.tail_fraction,
            "overlap_window": self.overlap_window,
            "colocation_slowdown": self.colocation_slowdown,
            "rows": self.rows,
        }

    @staticmethod
    def from_reader(r: Reader) -> JobTerms:
        terms = JobTerms(
            name=r.str("name"),
            tail_fraction=r.float("tail_fraction", positive=True),
            overlap_window=r.float("overlap_window", minimum=0.0),
            colocation_slowdown=r.float("colocation_slowdown", minimum=0.0),
            rows=r.int("rows", 0, minimum=0),
        )
        for key in ("tail_fraction", "overlap_window"):
            if getattr(terms, key) > 1.0:
                raise r.fail(key, f"is a share and must be in [0, 1], got {getattr(terms, key)}")
        return terms


@dataclass(frozen=True)
class Correction:
    """Multiplicative correction ``exp(tree(x))`` with a quantile interval."""

    feature_names: tuple[str, ...]
    median: TreeEnsemble
    low: TreeEnsemble
    high: TreeEnsemble
    quantiles: tuple[float, float] = (0.1, 0.9)

    def to_dict(self) -> dict[str, Any]:
        return {
            "feature_names": list(self.feature_names),
            "quantiles": list(self.quantiles),
            "median": self.median.to_dict(),
            "low": self.low.to_dict(),
            "high": self.high.to_dict(),
        }

    @staticmethod
    def from_reader(r: Reader) -> Correction:
        names = r.raw("feature_names")
        if not isinstance(names, list) or tuple(names) != FEATURE_NAMES:
            raise r.fail(
                "feature_names",
                f"must be {list(FEATURE_NAMES)} (this lightning-srifty's features); got {names!r}",
            )
        n = len(FEATURE_NAMES)
        quantiles = r.floats("quantiles", [0.1, 0.9])
        if len(quantiles) != 2 or not 0.0 < quantiles[0] < quantiles[1] < 1.0:
            raise r.fail("quantiles", f"must be two increasing numbers in (0, 1), got {quantiles}")
        median, low, high = (r.child(k) for k in ("median", "low", "high"))
        assert median is not None and low is not None and high is not None
        return Correction(
            feature_names=FEATURE_NAMES,
            median=TreeEnsemble.from_reader(median, n),
            low=TreeEnsemble.from_reader(low, n),
            high=TreeEnsemble.from_reader(high, n),
            quantiles=(quantiles[0], quantiles[1]),
        )


@dataclass(frozen=True)
class Calibration:
    """Everything ``srifty calibrate`` learned about one kind of hardware."""

    physics: PhysicsConstants
    residual_low: float = -0.15
    """Log-ratio quantile (measured/predicted) used as the lower interval when there is
    no learned correction; the default ±15 % is a placeholder for uncalibrated use."""
    residual_high: float = 0.15
    correction: Correction | None = None
    model_spread: float = 0.0
    """Spread (std of log ratio) of the per-model median error of the physics fit: how
    much a model never seen in calibration may sit off the fitted line as a whole.
    Widens the learned interval, whose quantiles only see row-to-row scatter."""
    jobs: tuple[JobTerms, ...] = ()
    """Own terms of the jobs whose multi-GPU rows entered the fit (see :class:`JobTerms`)."""
    hardware: str = ""
    """What it was fitted on, e.g. ``"16x g4dn.12xlarge (4x T4, PCIe, 50 Gbps)"``."""
    fitted_on: tuple[str, ...] = ()
    """Names of the training models whose rows entered the fit."""
    rows: int = 0
    metrics: dict[str, float] = field(default_factory=dict, compare=False)
    schema_version: int = CALIBRATION_SCHEMA_VERSION

    def job(self, name: str | None) -> JobTerms | None:
        """The fitted terms of job ``name``, or ``None`` if its rows were not in the fit."""
        if not name:
            return None
        return next((j for j in self.jobs if j.name == name), None)

    def physics_for(self, name: str | None) -> PhysicsConstants:
        """Hardware constants, with job ``name``'s own terms where the fit has them."""
        return self.physics.for_job(self.job(name))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "kind": "srifty-calibration",
            "hardware": self.hardware,
            "fitted_on": list(self.fitted_on),
            "rows": self.rows,
            "physics": self.physics.to_json(),
            "jobs": [j.to_dict() for j in self.jobs],
            "residual_low": self.residual_low,
            "residual_high": self.residual_high,
            "correction": self.correction.to_dict() if self.correction else None,
            "model_spread": self.model_spread,
            "metrics": dict(self.metrics),
        }

    @staticmethod
    def from_dict(data: Any, *, source: str | None = None) -> Calibration:
        """Validates ``data``; errors name ``source`` and the field."""
        r = Reader(data, source=source, error=CalibrationError)
        version = check_version(r, CALIBRATION_SCHEMA_VERSION, kind="calibration")
        if version < CALIBRATION_SCHEMA_VERSION:
            raise r.fail(
                "schema_version",
                f"calibration schema version {version} was written by an older "
                "lightning-srifty whose overlap model (Pollux exponent) this one no longer "
                "uses; re-run srifty calibrate on the same measurements",
            )
        if r.raw("kind", "srifty-calibration") != "srifty-calibration":
            raise r.fail("kind", "must be 'srifty-calibration' (is this a profile or a plan?)")
        physics = r.child("physics")
        assert physics is not None
        correction = r.child("correction", None)
        metrics = r.raw("metrics", {})
        if not isinstance(metrics, dict):
            raise r.fail("metrics", "expected an object")
        fitted = r.raw("fitted_on", [])
        if not isinstance(fitted, list) or not all(isinstance(x, str) for x in fitted):
            raise r.fail("fitted_on", "expected a list of model names")
        low = r.float("residual_low")
        high = r.float("residual_high")
        if low > high:
            raise r.fail("residual_low", f"must not exceed residual_high ({low} > {high})")
        return Calibration(
            physics=PhysicsConstants.from_reader(physics),
            residual_low=low,
            residual_high=high,
            correction=Correction.from_reader(correction) if correction else None,
            jobs=tuple(JobTerms.from_reader(j) for j in r.children("jobs", [])),
            model_spread=r.float("model_spread", 0.0, minimum=0.0),
            hardware=r.str("hardware", ""),
            fitted_on=tuple(fitted),
            rows=r.int("rows", 0, minimum=0),
            metrics={str(k): float(v) for k, v in metrics.items()},
            schema_version=version,
        )
