"""When to measure before committing: probes of the plans that could be the best.

Srifty profiles on the VMs it prices and Scavenger searches online; both pay a little to
measure so that a long run does not go to the wrong hardware. A probe is a short real
run of the user's job on a candidate (a few dozen steps after warm-up). It is worth
running when the top plans' prediction intervals overlap, so that the ranking could
change once measured, and when what it costs is small against what a better choice
could save. This module decides that, from the ranked plans alone; running the probes
and refitting on them is the launcher's.

Each plan's objective (cost, or time with ``objective="time"``) is read at the ends of
its step-time interval: a plan whose optimistic value beats the best plan's pessimistic
value is a contender. Probing the best plan and the contenders (one per kind of
hardware, best-ranked first) costs their start-up plus the probe's steps at their
price; the potential saving is how much cheaper the best contender could turn out than
the best plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_srifty.core.cluster import Cluster, Plan
from lightning_srifty.core.errors import SchemaError
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.core.profile import Profile
from lightning_srifty.core.validate import Reader, check_version

PROBE_MODES = ("auto", "on", "off")
DEFAULT_MAX_PROBES = 3
PROBE_MEASURE_S = 10.0
"""Seconds of steps a probe runs: its first reports are warm-up, the next ones its
steady step (rank zero reports about once a second)."""
VERIFY_SHARE = 0.05
"""Plan #1 alone is probed when it runs a shape the profile never measured and the probe
costs at most this share of the job: a few seconds to check hours of work."""
PROBE_MIN_STEPS = 8
"""Steps a probe runs at least, when each takes longer than a report's second."""


def probe_seconds(step_s: float) -> float:
    """Seconds of steps one probe takes on a plan of this step time (start-up aside)."""
    return max(PROBE_MEASURE_S, PROBE_MIN_STEPS * step_s)


@dataclass(frozen=True)
class ProbeDecision:
    """Which plans to probe, and why (or why not)."""

    plans: tuple[Plan, ...]
    """Best-ranked first; empty when no probe runs."""
    reason: str
    cost_usd: float
    """Estimated price of the probes at their plans' hourly prices."""
    seconds: float
    """Estimated wall time of the probes, one after the other."""
    potential: float
    """How much the best contender could save against plan #1 (dollars, or hours for
    the time objective)."""

    @property
    def run(self) -> bool:
        return bool(self.plans)


def interval_value(plan: Plan, objective: str, end: str) -> float:
    """The plan's objective at one end of its step-time interval (``low``/``high``), or
    its expectation (``mid``).

    Time and cost both scale with the step time (the work is a number of steps), and
    the plan's figures are expectations at its mean step (:attr:`Plan.step_mean_s`), so
    an end's value is the expectation times the end over the mean step.
    """
    mean = plan.step_mean_s
    step = {"low": plan.step_low_s, "mid": mean, "high": plan.step_high_s}[end]
    scale = step / mean if mean > 0 else 1.0
    base = plan.time_to_target_h if objective == "time" else plan.cost_usd
    return base * scale


def decide_probes(
    plans: Sequence[Plan],
    *,
    objective: str,
    hardware: Callable[[Plan], Hashable],
    startup_s: float,
    mode: str = "auto",
    max_probes: int = DEFAULT_MAX_PROBES,
    unknown_compute: bool = False,
    unmeasured_shape: str = "",
) -> ProbeDecision:
    """Whether to probe ``plans`` (ranked, best first) before committing to the best.

    Args:
        plans: the planner's ranking.
        objective: ``"cost"``, ``"time"`` or ``"knee"`` (knee compares cost).
        hardware: what one probe measures (instance type in the cloud, the local
            topology on the local backend): plans alike in it share a probe.
        startup_s: seconds from launch to the probe's first step (provisioning included).
        mode: ``"auto"`` (probe when worth it), ``"on"`` (always the contenders, or the
            best plan alone) or ``"off"``.
        max_probes: at most this many plans are probed.
        unknown_compute: the profile says nothing about these GPUs (it ran on a CPU):
            every distinct kind of hardware in the ranking is a contender.
        unmeasured_shape: how plan #1 runs what the profile never measured (e.g. "2
            processes per node"; empty when it did): when no contender is worth a probe,
            plan #1 alone is still probed if that costs at most :data:`VERIFY_SHARE` of
            the job, so the run's own step is measured before it is committed to.
    """
    if mode not in PROBE_MODES:
        raise ValueError(f"probe mode {mode!r} is not one of {PROBE_MODES}")
    if mode == "off" or not plans:
        return ProbeDecision((), "probes are off (--probe off)", 0.0, 0.0, 0.0)
    key = "time" if objective == "time" else "cost"
    best = plans[0]
    worst_best = interval_value(best, key, "high")
    chosen: dict[Hashable, Plan] = {hardware(best): best}
    for p in plans[1:]:
        if len(chosen) >= max_probes:
            break
        kind = hardware(p)
        if kind in chosen:
            continue
        if unknown_compute or interval_value(p, key, "low") < worst_best:
            chosen[kind] = p
    picked = tuple(chosen.values())
    seconds = sum(startup_s + probe_seconds(p.step_high_s) for p in picked)
    cost = sum((startup_s + probe_seconds(p.step_high_s)) / 3600.0 * p.hourly_usd for p in picked)
    contenders = picked[1:]
    potential = max((worst_best - interval_value(p, key, "low") for p in contenders), default=0.0)
    price = seconds / 3600.0 if key == "time" else cost
    unit = "h" if key == "time" else "$"
    if mode == "on":
        why = "--probe on"
        if unknown_compute:
            why += "; the profile ran on a CPU, so no GPU's compute was measured"
        return ProbeDecision(picked, why, cost, seconds, potential)
    if unknown_compute:
        return ProbeDecision(
            picked,
            "the profile ran on a CPU: no GPU's compute was measured (Srifty profiles on the "
            "VMs it prices)",
            cost,
            seconds,
            potential,
        )
    if unmeasured_shape and (not contenders or potential <= price):
        alone = startup_s + probe_seconds(best.step_high_s)
        alone_price = alone / 3600.0 if key == "time" else alone / 3600.0 * best.hourly_usd
        job = interval_value(best, key, "mid")
        if job > 0 and alone_price <= VERIFY_SHARE * job:
            return ProbeDecision(
                (best,),
                f"plan #1 runs {unmeasured_shape}, which the profile never measured: a "
                f"probe checks its step first ({_amount(alone_price, unit)}, "
                f"{alone_price / job:.1%} of the job)",
                alone / 3600.0 * best.hourly_usd,
                alone,
                0.0,
            )
    if not contenders:
        return ProbeDecision(
            (),
            "no probe: the plans' intervals do not overlap (no plan on other hardware beats "
            "plan #1 even at the fast end of its prediction against plan #1's slow end)",
            cost,
            seconds,
            0.0,
        )
    if potential <= price:
        return ProbeDecision(
            (),
            f"no probe: it would cost about {_amount(price, unit)}, more than the "
            f"{_amount(potential, unit)} a better choice could save",
            cost,
            seconds,
            potential,
        )
    return ProbeDecision(
        picked,
        f"the top plans' intervals overlap: a better choice could save up to "
        f"{_amount(potential, unit)}; probing costs about {_amount(price, unit)}",
        cost,
        seconds,
        potential,
    )


def _amount(value: float, unit: str) -> str:
    if unit == "h":
        return f"{value * 60:.1f} min" if value < 1 else f"{value:.1f} h"
    return f"${value:,.2f}" if value >= 1 else f"${value:.3g}"


@dataclass(frozen=True)
class LinkEvidence:
    """What a probe's all-reduce timings say about the link its ring is paced by."""

    constants: dict[str, float] = field(default_factory=dict)
    """Refitted constants: the link's efficiency (and its per-hop latency, where the
    small buffers show one above the collective's launch cost)."""
    measured_gbps: float = 0.0
    """Bus bandwidth measured (Gbit/s): ``2(p-1)/p`` bytes per byte reduced, over the
    time per byte of the larger buffers."""
    predicted_gbps: float = 0.0
    """What the model's constants give the same ring before the probe (Gbit/s)."""
    link: str = ""
    """The link's name (``"tcp"``, ``"PCIe"``, ...)."""


def link_evidence(
    model: PerformanceModel,
    profile: Profile,
    cluster: Cluster,
    allreduce: Sequence[tuple[int, float]],
) -> LinkEvidence | None:
    """The effective rate and latency of the link that paces ``cluster``'s ring, from
    all-reduce timings among its processes (``(bytes, seconds)``); ``None`` when they
    cannot tell (fewer than two sizes, one process, or no time per byte).

    A ring all-reduce of ``S`` bytes over ``p`` processes takes
    ``launch + 2(p-1)·latency + 2(p-1)/p · S / rate`` (:mod:`~lightning_srifty.core.comm`):
    a line through the timings gives the rate (slope) and the latency (intercept). The
    slowest link in the ring paces it: the network across nodes, else the GPUs' own link.
    Its efficiency is scaled by measured over predicted rate, as the model's rates are
    efficiency times a physical rate.
    """
    world = cluster.world_size
    points = sorted((int(b), float(t)) for b, t in allreduce if b > 0 and t > 0)
    if world < 2 or len({b for b, _ in points}) < 2:
        return None
    sizes = np.asarray([b for b, _ in points], dtype=np.float64)
    times = np.asarray([t for _, t in points], dtype=np.float64)
    slope, intercept = np.polyfit(sizes, times, 1)
    if not slope > 0:
        return None
    ring = 2.0 * (world - 1) / world
    measured = ring / float(slope)  # bytes/s on the ring's slowest link
    pred = model.predict(profile, cluster, local_batch=profile.environment.step_batch_size)
    links = cluster.groups[0].offer.node_links
    phys = model.calibration.physics_on(_single_type(cluster))
    across = cluster.nodes > 1 and pred.inter_bytes_s <= pred.intra_bytes_s
    if across or links.isolated_gpus:
        name, link = f"{links.transport}_efficiency", links.transport
        latency = "tcp_latency_s" if links.transport == "tcp" else "rdma_latency_s"
        predicted = pred.inter_bytes_s if across else pred.intra_bytes_s
    else:
        nvlink = links.interconnect in ("NVSwitch", "NVLink")
        name = "nvlink_efficiency" if nvlink else "pcie_efficiency"
        latency = "nvlink_latency_s" if nvlink else "pcie_latency_s"
        link, predicted = links.interconnect, pred.intra_bytes_s
    if not (math.isfinite(predicted) and predicted > 0):
        return None
    constants = {name: getattr(phys, name) * measured / predicted}
    hop = (float(intercept) - phys.collective_launch_s) / (2.0 * (world - 1))
    if hop > 0:
        constants[latency] = hop
    return LinkEvidence(constants, measured * 8e-9, predicted * 8e-9, link)


def _single_type(cluster: Cluster) -> str:
    kinds = {g.offer.instance_type for g in cluster.groups}
    return kinds.pop() if len(kinds) == 1 else ""


PROBE_RECORD_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ProbeRecord:
    """What one probe measured, against what the model predicted: ``probe-<n>.json`` in
    the run folder, the evidence the plan was made again on."""

    index: int
    plan: str
    """The plan probed, as described to the user."""
    instance_type: str
    """The hardware the measurement counts for (``""``: a mix of types, whose job terms
    alone are refitted)."""
    nodes: int
    """Nodes and processes per node that really ran (scaled down on the local backend)."""
    procs_per_node: int
    stand_in: bool
    """Processes on this machine stood in for the plan's hardware (local backend)."""
    predicted_step_s: float
    predicted_low_s: float
    predicted_high_s: float
    measured_step_s: float | None
    """Steady seconds per step (``None``: the probe measured nothing)."""
    steps: int
    elapsed_s: float
    cost_usd: float
    """What the probe cost at its plan's price (launch to stop)."""
    allreduce: tuple[tuple[int, float], ...] = ()
    """``(bytes, seconds)`` of the collective-bandwidth measurement (two processes or more)."""
    measured_gbps: float | None = None
    """Bus bandwidth the collective measurement shows (Gbit/s)."""
    predicted_gbps: float | None = None
    """The same link as the model predicted it before the probe (Gbit/s)."""
    measured_low_s: float | None = None
    """10th percentile of the probe's steady step reports (``None``: none reported)."""
    measured_high_s: float | None = None
    """90th percentile of the probe's steady step reports."""
    schema_version: int = PROBE_RECORD_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "kind": "srifty-probe",
            "index": self.index,
            "plan": self.plan,
            "instance_type": self.instance_type,
            "nodes": self.nodes,
            "procs_per_node": self.procs_per_node,
            "stand_in": self.stand_in,
            "predicted_step_s": self.predicted_step_s,
            "predicted_low_s": self.predicted_low_s,
            "predicted_high_s": self.predicted_high_s,
            "measured_step_s": self.measured_step_s,
            "steps": self.steps,
            "elapsed_s": self.elapsed_s,
            "cost_usd": self.cost_usd,
            "allreduce": [list(x) for x in self.allreduce],
            "measured_gbps": self.measured_gbps,
            "predicted_gbps": self.predicted_gbps,
            "measured_low_s": self.measured_low_s,
            "measured_high_s": self.measured_high_s,
        }

    @staticmethod
    def from_dict(data: Any, *, source: str | None = None) -> ProbeRecord:
        """Validates ``data``; errors name ``source`` and the field."""
        r = Reader(data, source=source, error=SchemaError)
        version = check_version(r, PROBE_RECORD_SCHEMA_VERSION, kind="probe record")
        if r.raw("kind", "srifty-probe") != "srifty-probe":
            raise r.fail("kind", "must be 'srifty-probe' (is this a profile or a calibration?)")
        pairs = r.raw("allreduce", [])
        if not isinstance(pairs, list) or not all(
            isinstance(x, list) and len(x) == 2 and all(isinstance(v, int | float) for v in x)
            for x in pairs
        ):
            raise r.fail("allreduce", "expected a list of [bytes, seconds] pairs")
        measured = r.raw("measured_step_s", None)
        return ProbeRecord(
            index=r.int("index", minimum=1),
            plan=r.str("plan"),
            instance_type=r.str("instance_type", ""),
            nodes=r.int("nodes", minimum=1),
            procs_per_node=r.int("procs_per_node", minimum=1),
            stand_in=bool(r.raw("stand_in", False)),
            predicted_step_s=r.float("predicted_step_s", positive=True),
            predicted_low_s=r.float("predicted_low_s", positive=True),
            predicted_high_s=r.float("predicted_high_s", positive=True),
            measured_step_s=None if measured is None else r.float("measured_step_s", positive=True),
            steps=r.int("steps", 0, minimum=0),
            elapsed_s=r.float("elapsed_s", 0.0, minimum=0.0),
            cost_usd=r.float("cost_usd", 0.0, minimum=0.0),
            allreduce=tuple((int(b), float(t)) for b, t in pairs),
            measured_gbps=_optional(r, "measured_gbps"),
            predicted_gbps=_optional(r, "predicted_gbps"),
            measured_low_s=_optional(r, "measured_low_s"),
            measured_high_s=_optional(r, "measured_high_s"),
            schema_version=version,
        )


def _optional(r: Reader, key: str) -> float | None:
    return None if r.raw(key, None) is None else float(r.float(key, minimum=0.0))
