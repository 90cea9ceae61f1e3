"""When a probe is worth running: overlapping intervals, and a price below the stake."""

from __future__ import annotations

import dataclasses
import math

import pytest

from lightning_srifty.core.calibration import Calibration, PhysicsConstants
from lightning_srifty.core.catalog import GpuSpec, Offer
from lightning_srifty.core.cluster import Cluster, ClusterGroup, Plan
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.core.probing import decide_probes, interval_value
from lightning_srifty.core.profile import (
    BatchPoint,
    Environment,
    Memory,
    Profile,
    Spread,
    StepTimes,
)


def _plan(itype: str, cost: float, spread: float, hourly: float = 2.0) -> Plan:
    offer = Offer(itype, "T4", 1, 16.0, 4.0, 16.0, "us-east-1", "use1-az1", hourly, None,
                  "none", 25.0)  # fmt: skip
    step = 0.1
    return Plan(
        Cluster((ClusterGroup(offer, 1, 1),)), False, step, step * (1 - spread),
        step * (1 + spread), 32, 1000, cost / hourly, cost, hourly,
    )  # fmt: skip


def _mean_over_median(spread: float) -> float:
    """A plan's figures are expectations at its mean step: the log-normal mean over the
    median for a step interval of ``(1 - spread, 1 + spread)`` times the median."""
    sigma = math.log((1 + spread) / (1 - spread)) / (2 * 1.2816)
    return math.exp(sigma**2 / 2)


def _kind(p: Plan) -> str:
    return p.cluster.groups[0].offer.instance_type


def test_interval_ends_scale_the_objective_with_the_step() -> None:
    """The plan's cost is an expectation at its mean step; the ends scale from there
    (a step of 0.08-0.12 s around 0.1 s: log-normal sigma ln(1.5)/2.563)."""
    p = _plan("a", 100.0, 0.2)
    mean_over_median = _mean_over_median(0.2)
    assert interval_value(p, "cost", "low") == pytest.approx(80.0 / mean_over_median)
    assert interval_value(p, "cost", "high") == pytest.approx(120.0 / mean_over_median)
    assert interval_value(p, "time", "mid") == pytest.approx(p.time_to_target_h)


def test_overlapping_plans_on_other_hardware_are_probed_when_the_stake_is_larger() -> None:
    plans = [_plan("a", 100.0, 0.2), _plan("a", 101.0, 0.2), _plan("b", 110.0, 0.2),
             _plan("c", 200.0, 0.2)]  # fmt: skip
    decision = decide_probes(plans, objective="cost", hardware=_kind, startup_s=300.0)
    assert decision.run
    assert [_kind(p) for p in decision.plans] == ["a", "b"]  # one per hardware; c is out
    assert decision.potential == pytest.approx((120.0 - 88.0) / _mean_over_median(0.2))
    assert decision.cost_usd == pytest.approx(2 * (300 + 10.0) / 3600 * 2.0)


def test_no_overlap_no_probe() -> None:
    plans = [_plan("a", 100.0, 0.1), _plan("b", 150.0, 0.1)]
    decision = decide_probes(plans, objective="cost", hardware=_kind, startup_s=300.0)
    assert not decision.run and "do not overlap" in decision.reason


def test_a_probe_dearer_than_what_it_could_save_is_skipped() -> None:
    plans = [_plan("a", 1.0, 0.2, hourly=50.0), _plan("b", 1.05, 0.2, hourly=50.0)]
    decision = decide_probes(plans, objective="cost", hardware=_kind, startup_s=600.0)
    assert not decision.run and "more than the" in decision.reason
    forced = decide_probes(plans, objective="cost", hardware=_kind, startup_s=600.0, mode="on")
    assert forced.run and len(forced.plans) == 2
    off = decide_probes(plans, objective="cost", hardware=_kind, startup_s=600.0, mode="off")
    assert not off.run


def test_a_cpu_profile_probes_every_kind_of_gpu_in_the_ranking() -> None:
    plans = [_plan("a", 1.0, 0.1), _plan("b", 5.0, 0.1), _plan("c", 9.0, 0.1),
             _plan("d", 9.5, 0.1)]  # fmt: skip
    decision = decide_probes(
        plans, objective="cost", hardware=_kind, startup_s=300.0, unknown_compute=True
    )
    assert [_kind(p) for p in decision.plans] == ["a", "b", "c"]  # at most three
    assert "ran on a CPU" in decision.reason


def test_the_time_objective_weighs_hours() -> None:
    slow = dataclasses.replace(_plan("a", 1.0, 0.3), time_to_target_h=10.0)
    fast = dataclasses.replace(_plan("b", 3.0, 0.3), time_to_target_h=11.0)
    decision = decide_probes([slow, fast], objective="time", hardware=_kind, startup_s=60.0)
    assert decision.run and decision.potential == pytest.approx(
        (13.0 - 7.7) / _mean_over_median(0.3)
    )


def test_plan_one_on_a_shape_the_profile_never_measured_is_checked_when_cheap() -> None:
    """No contender, but plan #1 runs more processes per node than the profile did: a
    probe of it alone runs if it costs at most 5 % of the job, and not otherwise."""
    long_job = [_plan("a", 100.0, 0.1), _plan("b", 150.0, 0.1)]  # 50 h at $2/h
    decision = decide_probes(long_job, objective="cost", hardware=_kind, startup_s=300.0,
                             unmeasured_shape="4 processes per node")  # fmt: skip
    assert [_kind(p) for p in decision.plans] == ["a"]
    assert "4 processes per node" in decision.reason and "never measured" in decision.reason
    probe_usd = (300.0 + 10.0) / 3600.0 * 2.0
    assert decision.cost_usd == pytest.approx(probe_usd)
    short_job = [_plan("a", 20 * probe_usd * 0.9, 0.1), _plan("b", 150.0, 0.1)]
    skipped = decide_probes(short_job, objective="cost", hardware=_kind, startup_s=300.0,
                            unmeasured_shape="4 processes per node")  # fmt: skip
    assert not skipped.run and "do not overlap" in skipped.reason  # > 5 % of the job
    measured = decide_probes(long_job, objective="cost", hardware=_kind, startup_s=300.0)
    assert not measured.run  # the profile ran this shape: nothing to check


def test_link_evidence_reads_a_rings_rate_and_latency_from_its_timings() -> None:
    """Timings of a ring at half the model's rate, with 0.2 ms per hop, built from the
    ring's own algebra (2(p-1)/p bytes per byte on the slowest link): the efficiency
    halves and the hop latency is read back."""
    from lightning_srifty.core.calibration import Calibration, PhysicsConstants
    from lightning_srifty.core.links import loopback_links
    from lightning_srifty.core.perfmodel import PerformanceModel
    from lightning_srifty.core.probing import link_evidence
    from tests.core.test_perfmodel import PROFILE

    o = Offer("duo", "T4", 2, 16.0, 8.0, 64.0, "r", "z", 1.0, None, "PCIe", 40.0,
              links=loopback_links("PCIe", 40.0))  # fmt: skip
    cluster = Cluster((ClusterGroup(o, 1, 2),))
    phys = PhysicsConstants(pcie_efficiency=0.6, collective_launch_s=50e-6)
    model = PerformanceModel({}, Calibration(phys))
    rate = model.predict(PROFILE, cluster).intra_bytes_s / 2  # half what the model thinks
    hop, p = 2e-4, 2
    timings = [(s, 50e-6 + 2 * (p - 1) * hop + 2 * (p - 1) / p * s / rate)
               for s in (1 << 16, 1 << 20, 1 << 22)]  # fmt: skip
    got = link_evidence(model, PROFILE, cluster, timings)
    assert got is not None and got.link == "PCIe"
    assert got.constants["pcie_efficiency"] == pytest.approx(0.3, rel=1e-6)
    assert got.constants["pcie_latency_s"] == pytest.approx(hop, rel=1e-6)
    assert got.measured_gbps == pytest.approx(got.predicted_gbps / 2, rel=1e-6)
    assert link_evidence(model, PROFILE, cluster, timings[:1]) is None  # one size: no slope
    solo = Cluster((ClusterGroup(o, 1, 1),))
    assert link_evidence(model, PROFILE, solo, timings) is None  # one process: no ring


def test_a_t4_profile_probes_another_gpu_type_but_not_another_t4_at_the_same_premium() -> None:
    """The model's intervals carry what a profile cannot show: a V100 predicted 45 %
    dearer than the T4 the job was profiled on may still turn out cheaper (its compute
    came through the compute ratio), so it is a contender; a second T4 type at the same
    premium runs what the profile measured, so it is not."""
    specs = {
        "T4": GpuSpec("T4", 8.1, 8.1, 65.0, 320.0, 16.0),
        "V100": GpuSpec("V100", 15.7, 15.7, 125.0, 900.0, 16.0),
    }
    profile = Profile(
        kind="coarse",
        environment=Environment("NVIDIA T4", "T4", 1, 1, 1, "32-true", 16, "", ""),
        steps=StepTimes(Spread(0.2, 0.2, 0.2, 10), 0, 0, 0, 0, 0, 10),
        grad_bytes=100 * 1024**2,
        flops_per_step=0.0,
        memory=Memory(0, 0, 0, 0, 0, "unknown"),
        batch_points=(BatchPoint(16, 0.2, 0.2), BatchPoint(32, 0.4, 0.4)),
    )
    model = PerformanceModel(specs, Calibration(physics=PhysicsConstants()))
    steps = 100_000

    def plan(itype: str, acc: str, premium: float) -> Plan:
        offer = Offer(itype, acc, 1, 16.0, 8.0, 61.0, "us-east-1", "use1-az1", 1.0, None,
                      "none", 10.0)  # fmt: skip
        cluster = Cluster((ClusterGroup(offer, 1, 1),))
        pred = model.predict(profile, cluster)
        base = model.predict(profile, Cluster((ClusterGroup(home, 1, 1),))).step_s
        hourly = premium * base / pred.step_s  # the same predicted cost x premium
        hours = steps * pred.step_s / 3600.0
        return Plan(cluster, False, pred.step_s, pred.low_s, pred.high_s, 16, steps, hours,
                    hours * hourly, hourly)  # fmt: skip

    home = Offer("g4dn.xlarge", "T4", 1, 16.0, 4.0, 16.0, "us-east-1", "use1-az1", 1.0, None,
                 "none", 25.0)  # fmt: skip
    best = plan("g4dn.xlarge", "T4", 1.0)
    for other, acc, probed in (("p3.2xlarge", "V100", True), ("g4dn.2xlarge", "T4", False)):
        rival = plan(other, acc, 1.45)
        assert rival.cost_usd == pytest.approx(1.45 * best.cost_usd)
        decision = decide_probes([best, rival], objective="cost", hardware=_kind, startup_s=60.0)
        assert (rival in decision.plans) is probed, other
