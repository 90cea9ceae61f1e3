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
values (:class:`JobTerms`). A job never seen gets the hardware values; a job seen only
on other hosts keeps its overlap terms and takes the hardware's co-location.

Bandwidths are efficiencies per transport over absolute physical rates
(:mod:`lightning_srifty.core.links`), never fractions of one cluster's NIC, so they
stay meaningful on instance types the calibration has never seen. A calibration also
records which hardware it was fitted on (:class:`FitSource`), so that a validation can
refit it without one kind of hardware and predict that hardware as unseen.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from lightning_srifty.core.errors import CalibrationError
from lightning_srifty.core.trees import TreeEnsemble
from lightning_srifty.core.validate import Reader, check_version

CALIBRATION_SCHEMA_VERSION = 3
INTER_ALGORITHMS = ("ring", "tree")
EFFICIENCIES = (
    "tcp_efficiency",
    "efa_efficiency",
    "ib_efficiency",
    "nvlink_efficiency",
    "pcie_efficiency",
)
SHARES = ("tail_fraction", "overlap_window")
NUMERIC_CONSTANTS = (
    *EFFICIENCIES,
    "tcp_flow_gbps",
    "tcp_two_way_slowdown",
    "nvlink_latency_s",
    "pcie_latency_s",
    "tcp_latency_s",
    "rdma_latency_s",
    "collective_launch_s",
    *SHARES,
    "step_overhead_s",
    "colocation_slowdown",
    "straggler_cv",
)
"""Every numeric field of :class:`PhysicsConstants`, in a fixed order."""

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
    """Hardware-level constants of the analytic model, in units that transfer.

    Bandwidth constants are *efficiencies per transport*: the share of the physical
    rate (:mod:`lightning_srifty.core.links`) that NCCL achieves over NVLink, PCIe,
    TCP sockets, EFA or InfiniBand. They mean the same on every instance type that
    uses the transport, so a fit on one cluster moves to another; a transport that no
    fitted row used keeps its default, the published figure named in
    :mod:`lightning_srifty.fit.calibration`. Latencies are per ring hop, per transport.
    Fixed per-step costs of data parallelism are explicit: ``collective_launch_s``
    per bucket (NCCL call, DDP bucket bookkeeping, hooks) and ``step_overhead_s`` per
    step, so small latency-bound jobs come out right too.

    Overlap of a coarse profile (no per-layer timings) follows a fluid model of DDP's
    bucketed all-reduce: a share ``tail_fraction`` of the gradient bytes is ready only
    when backward ends (the first layers, embeddings), the rest streams out during the
    last ``overlap_window`` of backward. The communication stream then finishes
    ``max(tail·T, T - window·B)`` after backward ends, for an all-reduce of ``T``
    seconds and a backward of ``B`` (:func:`~lightning_srifty.core.comm.exposed_allreduce_s`).
    """

    tcp_efficiency: float = 0.7
    """Achieved over physical rate for NCCL's socket transport (``min(NIC, flows x
    min(per-flow cap, tcp_flow_gbps))``)."""
    tcp_flow_gbps: float = 10.0
    """What one TCP socket driven by one NCCL thread carries at most (Gbit/s): the
    CPU-bound rate of a single stream."""
    tcp_two_way_slowdown: float = 1.0
    """Slowdown of a tunnelled TCP ring that crosses exactly two nodes. A tunnel makes
    all traffic from one host to the other a single capped flow, so with two nodes the
    ACKs of A's data to B queue in the same capped flow as B's data to A (two-way
    traffic: Zhang, Shenker & Clark, SIGCOMM '91); with three or more nodes each host
    pair carries data one way only and ACKs return in an idle flow. Untunnelled
    sockets return ACKs in flows of their own, and RDMA has no ACK clock. Without a
    per-flow cap (an on-premises network) there is no such queue: data and ACKs share
    each NIC's queue alike on two nodes or sixteen, so the slowdown is not applied."""
    efa_efficiency: float = 0.8
    """Achieved over the EFA interface rate (libfabric, aws-ofi-nccl)."""
    ib_efficiency: float = 0.9
    """Achieved over the InfiniBand HCA rate (verbs, GPUDirect RDMA)."""
    nvlink_efficiency: float = 0.75
    """Achieved over the per-GPU NVLink rate (direct mesh or NVSwitch)."""
    pcie_efficiency: float = 0.6
    """Achieved over the x16 PCIe rate for GPU-to-GPU rings (P2P or through the host)."""
    nvlink_latency_s: float = 2e-6
    """Latency per ring hop inside a node over NVLink."""
    pcie_latency_s: float = 5e-6
    """Latency per ring hop inside a node over PCIe (or through host memory)."""
    tcp_latency_s: float = 50e-6
    """Latency per ring hop across nodes over TCP sockets."""
    rdma_latency_s: float = 10e-6
    """Latency per ring hop across nodes over EFA or InfiniBand."""
    collective_launch_s: float = 50e-6
    """Fixed cost of one bucket's all-reduce on the communication stream (NCCL kernel
    launch, DDP's bucket bookkeeping and communication hooks)."""
    tail_fraction: float = 0.25
    """Share of the all-reduce that cannot overlap backward (gradients ready only at its
    end): what stays exposed when the network is faster than backward. 1 = no overlap."""
    overlap_window: float = 0.75
    """Share of backward during which the other gradients become ready and stream out."""
    step_overhead_s: float = 1e-3
    """Fixed per-step cost of synchronous data parallelism (DDP's reducer preparing and
    finalising the step), paid by every multi-GPU step."""
    colocation_slowdown: float = 0.0
    """Compute slowdown per doubling of the GPUs sharing a node (host PCIe, CPU, data
    loading): ``1 + colocation_slowdown * log2(k)`` on ``k`` GPUs a node
    (:func:`lightning_srifty.core.perfmodel.colocation_load`)."""
    inter_algorithm: str = "ring"
    """NCCL algorithm across nodes, ``"ring"`` or ``"tree"``; calibration picks the one
    the measurements support (it depends on the NCCL version and network, not the model)."""
    straggler_cv: float = 0.0
    """Coefficient of variation of per-GPU step time; a synchronous step waits for the
    slowest of ``p`` workers, ``mean·(1 + cv·E[max of p standard normals])``."""

    def inter_efficiencies(self) -> tuple[float, float, float]:
        """Efficiencies in :data:`~lightning_srifty.core.links.TRANSPORTS` order."""
        return (self.tcp_efficiency, self.efa_efficiency, self.ib_efficiency)

    def intra_efficiencies(self) -> tuple[float, float, float, float]:
        """Efficiencies in :data:`~lightning_srifty.core.links.INTERCONNECTS` order."""
        return (self.nvlink_efficiency, self.nvlink_efficiency, self.pcie_efficiency, 1.0)

    def intra_latencies(self) -> tuple[float, float, float, float]:
        """Per-hop latency in :data:`~lightning_srifty.core.links.INTERCONNECTS` order."""
        return (self.nvlink_latency_s, self.nvlink_latency_s, self.pcie_latency_s, 0.0)

    def inter_latencies(self) -> tuple[float, float, float]:
        """Per-hop latency in :data:`~lightning_srifty.core.links.TRANSPORTS` order."""
        return (self.tcp_latency_s, self.rdma_latency_s, self.rdma_latency_s)

    def to_dict(self) -> dict[str, float]:
        """The numeric constants (what the fit moves)."""
        return {name: float(getattr(self, name)) for name in NUMERIC_CONSTANTS}

    def to_json(self) -> dict[str, Any]:
        """The JSON form: the numbers plus the algorithm name."""
        return {**self.to_dict(), "inter_algorithm": self.inter_algorithm}

    @staticmethod
    def from_reader(r: Reader) -> PhysicsConstants:
        values: dict[str, Any] = {}
        for name in NUMERIC_CONSTANTS:
            if name in SHARES:
                values[name] = r.float(name, minimum=0.0)
                if values[name] > 1.0:
                    raise r.fail(name, f"is a share and must be in [0, 1], got {values[name]}")
            elif name in EFFICIENCIES:
                values[name] = r.float(name, positive=True)
                if values[name] > 2.0:
                    raise r.fail(
                        name, f"is an efficiency and must be in (0, 2], got {values[name]}"
                    )
            else:
                values[name] = r.float(name, minimum=0.0)
        values["inter_algorithm"] = r.choice("inter_algorithm", INTER_ALGORITHMS, "ring")
        return PhysicsConstants(**values)

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


EVERY_ACCELERATOR = "*"
"""``JobTerms.accelerator`` for the job-wide compute scale: every GPU type no run of
the job measured takes it (see :meth:`JobTerms.compute_scale_on`)."""


@dataclass(frozen=True)
class JobTerms:
    """One job's own overlap and co-location terms, fitted from its own multi-GPU rows.

    They are physical properties of the job, not corrections: where in backward its
    gradients become ready (``tail_fraction``, ``overlap_window``: properties of the
    network's layer order, the same on any hardware) and how much its compute slows
    when GPUs share a node (``colocation_slowdown``: its data loading against the
    host's CPUs, a property of the job *on that host*, hence keyed by
    ``instance_type``). A short single-node multi-GPU run measures ``tail_fraction``
    and ``colocation_slowdown``; ``overlap_window`` shows only once the all-reduce
    outlasts backward (across nodes), so a job without such rows keeps the hardware
    value.
    """

    name: str
    tail_fraction: float
    overlap_window: float
    colocation_slowdown: float
    rows: int = 0
    """How many of the job's rows the terms were fitted on."""
    instance_type: str = ""
    """The hardware the co-location term was measured on (the profile's instance type)."""
    compute_scale: float = 1.0
    """Measured over predicted compute of the job on ``accelerator``: what a run of the
    job showed that the roofline transfer did not. After a refit it is the job-wide
    scale (the geometric mean of :attr:`measured_scales`) that GPUs no run measured
    take (:meth:`compute_scale_on`)."""
    accelerator: str = ""
    """The GPU ``compute_scale`` applies to (empty: none; :data:`EVERY_ACCELERATOR`: all
    of them, when one measurement cannot tell the GPU's share from the job's)."""
    measured_scales: tuple[tuple[str, float], ...] = ()
    """``(accelerator, scale)`` for each GPU a run of the job measured (a probe, the
    running job): there the measurement, not a transfer, sets the compute."""

    def compute_scale_on(self, accelerator: str, profiled: str) -> float:
        """The compute scale of a group on ``accelerator`` for a profile taken on
        ``profiled``.

        A GPU a run measured takes its own scale. A GPU none measured takes the job-wide
        one (:data:`EVERY_ACCELERATOR`: a miss on one GPU type may be the job's, e.g. its
        data loading, and must not make untried types look cheaper), except the profiled
        GPU, whose compute the profile itself measured: a miss on other GPUs says
        nothing about it. Terms written before per-GPU scales existed apply their
        job-wide scale everywhere, as they did.
        """
        own = dict(self.measured_scales)
        if accelerator in own:
            return own[accelerator]
        if self.accelerator == accelerator:
            return self.compute_scale
        if self.accelerator == EVERY_ACCELERATOR and (accelerator != profiled or not own):
            return self.compute_scale
        return 1.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "instance_type": self.instance_type,
            "compute_scale": self.compute_scale,
            "accelerator": self.accelerator,
            "tail_fraction": self.tail_fraction,
            "overlap_window": self.overlap_window,
            "colocation_slowdown": self.colocation_slowdown,
            "rows": self.rows,
        }
        if self.measured_scales:  # written only where a run measured one (older readers)
            out["measured_scales"] = [[a, v] for a, v in self.measured_scales]
        return out

    @staticmethod
    def from_reader(r: Reader) -> JobTerms:
        terms = JobTerms(
            name=r.str("name"),
            tail_fraction=r.float("tail_fraction", positive=True),
            overlap_window=r.float("overlap_window", minimum=0.0),
            colocation_slowdown=r.float("colocation_slowdown", minimum=0.0),
            rows=r.int("rows", 0, minimum=0),
            instance_type=r.str("instance_type", ""),
            compute_scale=r.float("compute_scale", 1.0, positive=True),
            accelerator=r.str("accelerator", ""),
            measured_scales=_measured_scales(r),
        )
        for key in ("tail_fraction", "overlap_window"):
            if getattr(terms, key) > 1.0:
                raise r.fail(key, f"is a share and must be in [0, 1], got {getattr(terms, key)}")
        return terms


def _measured_scales(r: Reader) -> tuple[tuple[str, float], ...]:
    """A job's ``measured_scales``: ``[accelerator, positive scale]`` pairs (optional)."""
    raw = r.raw("measured_scales", [])
    if not isinstance(raw, list) or not all(
        isinstance(x, list)
        and len(x) == 2
        and isinstance(x[0], str)
        and isinstance(x[1], (int, float))
        and not isinstance(x[1], bool)
        and math.isfinite(x[1])
        and x[1] > 0
        for x in raw
    ):
        raise r.fail("measured_scales", "expected a list of [accelerator, positive scale] pairs")
    return tuple((str(a), float(v)) for a, v in raw)


@dataclass(frozen=True)
class HardwareTerms:
    """Hardware constants measured on one instance type by probes of it.

    A calibration's :class:`PhysicsConstants` are the centre of every kind of hardware it
    was fitted on; a probe measures one instance type where the plan would run (its
    effective link rates, how much sharing its host slows a job, its per-step host
    time). Those measurements hold for that instance type only, so they are kept apart
    and used for clusters made of it alone; every other instance type keeps the
    calibration's constants.
    """

    instance_type: str
    physics: PhysicsConstants
    rows: int = 0
    """How many measured steps the constants were refitted on."""
    evidence: tuple[str, ...] = ()
    """Constants set by a direct measurement (a collective-bandwidth measurement)
    rather than by the step times alone."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_type": self.instance_type,
            "physics": self.physics.to_json(),
            "rows": self.rows,
            "evidence": list(self.evidence),
        }

    @staticmethod
    def from_reader(r: Reader) -> HardwareTerms:
        physics = r.child("physics")
        assert physics is not None
        evidence = r.raw("evidence", [])
        if not isinstance(evidence, list) or not all(e in NUMERIC_CONSTANTS for e in evidence):
            raise r.fail("evidence", f"expected a list of constant names, got {evidence!r}")
        return HardwareTerms(
            instance_type=r.str("instance_type"),
            physics=PhysicsConstants.from_reader(physics),
            rows=r.int("rows", 0, minimum=0),
            evidence=tuple(evidence),
        )


@dataclass(frozen=True)
class ProbedStep:
    """One probe's measurement of the job on one shape: the job, ``nodes`` nodes of one
    instance type with ``gpus_per_node`` processes each, every process at
    ``local_batch``.

    A plan of exactly that shape runs what the probe ran, so its step is as sure as the
    probe's measurement, not as the calibration's fit across rows (the refit moves the
    prediction to it, but not the interval)."""

    model: str
    instance_type: str
    nodes: int
    gpus_per_node: int
    local_batch: int
    """Samples per process per optimizer step (the profile's step batch)."""
    step_s: float
    """Measured seconds per optimizer step."""
    low_s: float
    """10th percentile of the probe's step reports (``step_s`` where it reported one)."""
    high_s: float
    """90th percentile of the probe's step reports."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "instance_type": self.instance_type,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "local_batch": self.local_batch,
            "step_s": self.step_s,
            "low_s": self.low_s,
            "high_s": self.high_s,
        }

    @staticmethod
    def from_reader(r: Reader) -> ProbedStep:
        step = r.float("step_s", positive=True)
        low = r.float("low_s", positive=True)
        high = r.float("high_s", positive=True)
        if not low <= step <= high:
            raise r.fail("step_s", f"must lie within [low_s, high_s] ({low}, {step}, {high})")
        return ProbedStep(
            model=r.str("model"),
            instance_type=r.str("instance_type"),
            nodes=r.int("nodes", minimum=1),
            gpus_per_node=r.int("gpus_per_node", minimum=1),
            local_batch=r.int("local_batch", minimum=1),
            step_s=step,
            low_s=low,
            high_s=high,
        )


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
class FitSource:
    """One set of measurements a calibration was fitted on."""

    name: str
    """Short name, e.g. the trace folder's path below the data root (``sia-traces/quad``)."""
    hardware: str
    """Human description of the cluster."""
    fingerprint: str
    """Stable digest of the hardware facts (see :func:`hardware_fingerprint`): two trace
    folders measured on the same hardware share it."""
    models: tuple[str, ...] = ()
    rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hardware": self.hardware,
            "fingerprint": self.fingerprint,
            "models": list(self.models),
            "rows": self.rows,
        }

    @staticmethod
    def from_reader(r: Reader) -> FitSource:
        models = r.raw("models", [])
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise r.fail("models", "expected a list of model names")
        return FitSource(
            name=r.str("name"),
            hardware=r.str("hardware", ""),
            fingerprint=r.str("fingerprint"),
            models=tuple(models),
            rows=r.int("rows", 0, minimum=0),
        )


def hardware_fingerprint(facts: dict[str, Any]) -> str:
    """Order-independent digest of hardware facts (GPU, counts, links, network).

    Free-text notes are left out, so rewording a ``hardware.json`` note does not make
    the same cluster look new.
    """
    keys = ("gpu", "gpu_memory_gib", "gpus_per_node", "intra_node_link", "inter_node_gbps")
    canonical = {k: facts.get(k) for k in keys}
    canonical = {k: (float(v) if isinstance(v, int | float) else v) for k, v in canonical.items()}
    text = json.dumps(canonical, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
    sources: tuple[FitSource, ...] = ()
    """The measurement sets (one per kind of hardware) the fit used: the provenance."""
    seen_hardware: tuple[tuple[str, str], ...] = ()
    """(accelerator, inter-node transport) pairs the fit's rows were measured on."""
    hardware_spread: float = 0.0
    """Spread (std of log ratio) of where a whole kind of hardware the fit never saw sits
    off the model: a Student-t predictive spread of the leave-one-hardware-out offsets,
    as :attr:`model_spread` is for jobs. Applies on hardware outside
    :attr:`seen_hardware`."""
    unseen_widening: float = 0.0
    """How much wider (log units, each side) the 10-90 % interval is on hardware the fit
    never saw (an (accelerator, transport) pair not in :attr:`seen_hardware`), on top of
    :attr:`hardware_spread`: the conformal quantile of leave-one-hardware-out misses (see
    :func:`lightning_srifty.fit.calibration.hardware_conformal_widening`). The row and
    job spreads above were measured on the fit's own hardware; a new accelerator or
    transport is off by more, and only leaving whole hardware out shows how much."""
    metrics: dict[str, float] = field(default_factory=dict, compare=False)
    schema_version: int = CALIBRATION_SCHEMA_VERSION
    hardware_terms: tuple[HardwareTerms, ...] = ()
    """Constants refitted on probes of single instance types (see :class:`HardwareTerms`):
    they replace :attr:`physics` for clusters of that instance type alone."""
    probed: tuple[ProbedStep, ...] = ()
    """What probes measured, shape by shape: a plan of one of these shapes is as sure as
    its probe (see :class:`ProbedStep`)."""

    def physics_on(self, instance_type: str) -> PhysicsConstants:
        """The hardware constants for a cluster of ``instance_type`` alone: a probe's
        where one measured it, the calibration's otherwise."""
        found = next((h for h in self.hardware_terms if h.instance_type == instance_type), None)
        return self.physics if found is None else found.physics

    def is_seen(self, accelerator: str, transport: str) -> bool:
        """Whether the fit measured this accelerator over this transport (or the
        calibration records no hardware, as a hand-made one)."""
        return not self.seen_hardware or (accelerator, transport) in self.seen_hardware

    def job(self, name: str | None, instance_type: str | None = None) -> JobTerms | None:
        """Job ``name``'s terms, ``None`` if its rows were not in the fit.

        Its overlap terms are the job's wherever they were measured; its co-location
        term only where ``instance_type`` matches the hardware it was measured on, or
        where the terms name no hardware (written by hand); elsewhere the hardware
        value stands in.
        """
        if not name:
            return None
        mine = [j for j in self.jobs if j.name == name]
        if not mine:
            return None
        here = next((j for j in mine if instance_type and j.instance_type == instance_type), None)
        if here is None:  # terms naming no host apply on every host
            here = next((j for j in mine if not j.instance_type), None)
        if here is not None:
            return here
        # a job measured elsewhere: co-location is the host's as much as the job's (one
        # job's fitted values differ up to 200x between hosts, with no order shared by
        # the jobs), so the hardware value, the typical job's, stands in
        return replace(
            mine[0], colocation_slowdown=self.physics.colocation_slowdown, instance_type=""
        )

    def physics_for(self, name: str | None, instance_type: str | None = None) -> PhysicsConstants:
        """Hardware constants, with job ``name``'s own terms where the fit has them."""
        return self.physics.for_job(self.job(name, instance_type))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "kind": "srifty-calibration",
            "hardware": self.hardware,
            "fitted_on": list(self.fitted_on),
            "rows": self.rows,
            "sources": [x.to_dict() for x in self.sources],
            "physics": self.physics.to_json(),
            "jobs": [j.to_dict() for j in self.jobs],
            "residual_low": self.residual_low,
            "residual_high": self.residual_high,
            "correction": self.correction.to_dict() if self.correction else None,
            "model_spread": self.model_spread,
            "seen_hardware": [list(x) for x in self.seen_hardware],
            "hardware_spread": self.hardware_spread,
            "unseen_widening": self.unseen_widening,
            "metrics": dict(self.metrics),
            "hardware_terms": [h.to_dict() for h in self.hardware_terms],
            "probed": [x.to_dict() for x in self.probed],
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
                "lightning-srifty whose link constants (fractions of one cluster's NIC) "
                "this one no longer uses; re-run srifty calibrate on the same measurements",
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
        seen = r.raw("seen_hardware", [])
        if not isinstance(seen, list) or not all(
            isinstance(x, list) and len(x) == 2 and all(isinstance(v, str) for v in x) for x in seen
        ):
            raise r.fail("seen_hardware", "expected a list of [accelerator, transport] pairs")
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
            sources=tuple(FitSource.from_reader(x) for x in r.children("sources", [])),
            seen_hardware=tuple((str(a), str(t)) for a, t in seen),
            hardware_spread=r.float("hardware_spread", 0.0, minimum=0.0),
            unseen_widening=r.float("unseen_widening", 0.0, minimum=0.0),
            metrics={str(k): float(v) for k, v in metrics.items()},
            schema_version=version,
            hardware_terms=tuple(
                HardwareTerms.from_reader(h) for h in r.children("hardware_terms", [])
            ),
            probed=tuple(ProbedStep.from_reader(x) for x in r.children("probed", [])),
        )
