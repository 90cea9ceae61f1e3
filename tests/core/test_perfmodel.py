"""The performance model on hand-built profiles and clusters (milliseconds each)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from lightning_srifty.core.calibration import (
    FEATURE_NAMES,
    Calibration,
    Correction,
    HardwareTerms,
    JobTerms,
    PhysicsConstants,
)
from lightning_srifty.core.candidates import CandidateArrays
from lightning_srifty.core.catalog import TENSOR_UTILISATION, GpuSpec, Offer
from lightning_srifty.core.cluster import Cluster, ClusterGroup
from lightning_srifty.core.errors import PredictionError
from lightning_srifty.core.links import NodeLinks
from lightning_srifty.core.perfmodel import (
    EAGER_OP_S,
    PerformanceModel,
    colocation_load,
    expected_max_z,
    fit_compute_curve,
    loader_floor_s,
    single_process_s,
)
from lightning_srifty.core.profile import (
    BatchPoint,
    DataLoading,
    Environment,
    LayerTiming,
    Memory,
    Profile,
    Spread,
    StepTimes,
)
from lightning_srifty.core.script_trainer import gradient_syncs_per_batch
from lightning_srifty.core.trees import Tree, TreeEnsemble

SPECS = {
    "T4": GpuSpec("T4", 8.1, 8.1, 65.0, 320.0, 16.0),
    "V100": GpuSpec("V100", 15.7, 15.7, 125.0, 900.0, 16.0),
}
GIB = 1024**3
TC = TENSOR_UTILISATION["turing"] / TENSOR_UTILISATION["volta"]
"""A T4's achieved share of its matrix-product peak over a V100's (per generation)."""


def offer(
    acc: str = "T4",
    count: int = 4,
    gbps: float = 50.0,
    mem: float = 16.0,
    link: str = "PCIe",
    name: str = "g4dn.12xlarge",
) -> Offer:
    return Offer(name, acc, count, mem, 48, 192, "us-west-2", "usw2-az1", 3.9, 1.2, link, gbps)


def coarse(
    points: dict[int, float],
    grad_bytes: int = 100 * 1024**2,
    acc: str = "T4",
    static: int = 0,
    activations: int = 0,
    b0: int = 16,
) -> Profile:
    return Profile(
        kind="coarse",
        environment=Environment("NVIDIA " + acc, acc, 1, 1, 1, "32-true", b0, "", ""),
        steps=StepTimes(Spread(points[b0], points[b0], points[b0], 10), 0, 0, 0, 0, 0, 10),
        grad_bytes=grad_bytes,
        flops_per_step=0.0,
        memory=Memory(static, 0, 0, activations, 0, "unknown"),
        batch_points=tuple(BatchPoint(b, t, t) for b, t in points.items()),
    )


PROFILE = coarse({8: 0.10, 16: 0.18, 32: 0.34})
IDEAL = {
    "tcp_efficiency": 1.0,
    "pcie_efficiency": 1.0,
    "nvlink_efficiency": 1.0,
    "ib_efficiency": 1.0,
    "nvlink_latency_s": 0.0,
    "pcie_latency_s": 0.0,
    "tcp_latency_s": 0.0,
    "rdma_latency_s": 0.0,
    "collective_launch_s": 0.0,
    "step_overhead_s": 0.0,
}
PHYS = PhysicsConstants(tail_fraction=1.0, **IDEAL)  # type: ignore[arg-type]
"""No overlap, no latency, links at line rate: step = compute + ring time, by hand."""


def one_group(nodes: int, gpus: int, o: Offer | None = None) -> Cluster:
    return Cluster((ClusterGroup(o or offer(), nodes, gpus),))


def test_compute_curve_is_exact_at_measured_points_and_linear_between() -> None:
    curve = fit_compute_curve(PROFILE)
    assert curve.alpha_s == pytest.approx(0.02) and curve.beta_s == pytest.approx(0.01)
    got = curve.at(np.array([8.0, 12.0, 64.0]))
    assert got.tolist() == pytest.approx([0.10, 0.14, 0.34 + 0.01 * 32])


def test_single_point_profile_is_proportional_to_batch() -> None:
    curve = fit_compute_curve(coarse({16: 0.2}))
    assert curve.at(np.array([32.0])).tolist() == pytest.approx([0.4])


def test_one_gpu_on_the_profiled_accelerator_is_the_profile() -> None:
    model = PerformanceModel(SPECS, Calibration(PHYS))
    pred = model.predict(PROFILE, one_group(1, 1))
    assert pred.step_s == pytest.approx(0.18)
    assert pred.comm_s == 0.0 and pred.global_batch == 16


def test_two_nodes_add_the_ring_time_without_overlap() -> None:
    model = PerformanceModel(SPECS, Calibration(PHYS))
    pred = model.predict(PROFILE, one_group(2, 1))
    ring = 100 * 1024**2 / (50e9 / 8)  # 2 workers: S/beta
    assert pred.allreduce_s == pytest.approx(ring)
    assert pred.step_s == pytest.approx(0.18 + ring)


def test_ring_crossing_nodes_carries_every_gpus_share_through_the_nic() -> None:
    model = PerformanceModel(SPECS, Calibration(PHYS))
    one_each = model.predict(PROFILE, one_group(3, 1)).allreduce_s
    two_each = model.predict(PROFILE, one_group(3, 2)).allreduce_s
    # flat ring over p GPUs: 2(p-1)/p of the gradients through the slowest link (NIC)
    assert two_each / one_each == pytest.approx((2 * 5 / 6) / (2 * 2 / 3))
    inside = model.predict(PROFILE, one_group(1, 4)).allreduce_s
    assert inside == pytest.approx(1.5 * 100 * 1024**2 / 15.75e9)


def test_each_message_pays_the_latency_of_every_hop_on_the_ring() -> None:
    tiny = coarse({16: 0.18}, grad_bytes=1)  # one bucket, no bandwidth term to speak of
    inter = dataclasses.replace(PHYS, tcp_latency_s=1e-3)
    intra = dataclasses.replace(PHYS, pcie_latency_s=1e-3)
    # 2 nodes x 4 GPUs: 14 hops, 2 of them across nodes
    across = PerformanceModel(SPECS, Calibration(inter)).predict(tiny, one_group(2, 4))
    inside = PerformanceModel(SPECS, Calibration(intra)).predict(tiny, one_group(2, 4))
    assert across.allreduce_s == pytest.approx(2e-3, rel=1e-3)
    assert inside.allreduce_s == pytest.approx(12e-3, rel=1e-3)


def test_each_value_logged_with_sync_dist_adds_a_scalar_all_reduce_a_step() -> None:
    """``self.log(..., sync_dist=True)`` all-reduces the value every step: one message
    of four bytes, so its whole cost is the ring's hops, which a profile of one process
    never paid. 2 nodes x 4 GPUs at 1 ms a cross-node hop: 2 ms a value."""
    tiny = coarse({16: 0.18}, grad_bytes=1)
    logs = dataclasses.replace(tiny, extra={"synced_logs": {"per_step": 3, "names": []}})
    model = PerformanceModel(SPECS, Calibration(dataclasses.replace(PHYS, tcp_latency_s=1e-3)))
    plain = model.predict(tiny, one_group(2, 4)).step_s
    logged = model.predict(logs, one_group(2, 4)).step_s
    assert logged - plain == pytest.approx(3 * 2e-3, rel=1e-3)
    # one process reduces nothing
    alone = model.predict(tiny, one_group(1, 1)).step_s
    assert model.predict(logs, one_group(1, 1)).step_s == alone


@pytest.mark.parametrize("detailed", [False, True], ids=["coarse", "detailed"])
def test_a_manual_step_all_reduces_its_gradient_after_each_of_its_backward_passes(
    detailed: bool,
) -> None:
    """A GAN's ``training_step`` steps two optimizers, each after its own backward pass,
    and DDP (with ``find_unused_parameters``, as the launcher runs manual scripts)
    reduces the whole gradient after each: twice the all-reduce of the same step under
    automatic optimisation, each overlapping only its own pass. Measured on Lightning's
    ``generative_adversarial_net.py`` (2 processes, 8.2 MB of gradients): the step
    priced with one all-reduce was 33.8 ms [26.3, 44.0] against 52.9 ms measured."""
    base = PROFILE if detailed else coarse({16: 0.18}, grad_bytes=50_000_000)
    manual = {"automatic_optimization": False, "optimizer_steps_per_batch": 2.0}
    gan = dataclasses.replace(base, extra={**base.extra, "trainer": manual})
    auto = {"automatic_optimization": True, "optimizer_steps_per_batch": 1.0}
    plain = dataclasses.replace(base, extra={**base.extra, "trainer": auto})
    assert (gradient_syncs_per_batch(gan), gradient_syncs_per_batch(plain)) == (2, 1)
    model = PerformanceModel(SPECS, Calibration(PHYS))
    one = model.predict(plain, one_group(2, 4))
    two = model.predict(gan, one_group(2, 4))
    assert two.allreduce_s == pytest.approx(2 * one.allreduce_s)
    assert two.step_s > one.step_s
    assert two.step_s <= one.step_s + one.allreduce_s + 1e-12  # at most a second, unhidden
    assert (
        model.predict(gan, one_group(1, 1)).step_s == model.predict(plain, one_group(1, 1)).step_s
    )


def linked(links: NodeLinks, count: int = 4, acc: str = "T4") -> Offer:
    return dataclasses.replace(offer(acc, count), links=links)


def test_a_nic_faster_than_the_flows_is_paced_by_the_flows() -> None:
    # 2 channels x 1 socket x 10 Gbps per flow = 20 Gbps, below the 100 Gbps NIC
    few = linked(NodeLinks("PCIe", 15.75, "tcp", 100.0, 100.0, 1, 10.0, 1))
    many = linked(NodeLinks("PCIe", 15.75, "tcp", 100.0, 100.0, 1, 10.0, 16))
    phys = dataclasses.replace(PHYS, tcp_flow_gbps=1000.0)
    model = PerformanceModel(SPECS, Calibration(phys))
    slow = model.predict(PROFILE, one_group(2, 1, few))
    fast = model.predict(PROFILE, one_group(2, 1, many))
    assert slow.inter_bytes_s == pytest.approx(20e9 / 8)
    assert fast.inter_bytes_s == pytest.approx(100e9 / 8)
    # one socket's own rate caps every flow too
    capped = PerformanceModel(SPECS, Calibration(dataclasses.replace(phys, tcp_flow_gbps=4.0)))
    assert capped.predict(PROFILE, one_group(2, 1, few)).inter_bytes_s == pytest.approx(8e9 / 8)


def test_two_way_traffic_slows_a_two_node_tunnel_only_behind_a_per_flow_cap() -> None:
    # one tunnelled flow per host pair at 10 Gbps (AWS's 3-tuple rule), against the same
    # overlay on an uncapped on-premises network: only the cap makes ACKs queue behind data
    capped = NodeLinks("PCIe", 15.75, "tcp", 50.0, 50.0, 1, 10.0, 1, True, True)
    uncapped = dataclasses.replace(capped, flow_cap_gbps=math.inf)
    phys = dataclasses.replace(PHYS, tcp_flow_gbps=5.0, tcp_two_way_slowdown=2.0)
    model = PerformanceModel(SPECS, Calibration(phys))
    size = 100 * 1024**2

    def ring_s(links: NodeLinks, nodes: int) -> float:
        return model.predict(PROFILE, one_group(nodes, 1, linked(links))).allreduce_s

    # 2 channels x 1 socket x 5 Gbps = 10 Gbps: both links move the same bytes as fast
    # on three nodes, and two nodes move half as many
    for links in (capped, uncapped):
        assert ring_s(links, 3) == pytest.approx(2 * 2 / 3 * size / (10e9 / 8))
    assert ring_s(capped, 2) == pytest.approx(2.0 * size / (10e9 / 8))
    assert ring_s(uncapped, 2) == pytest.approx(size / (10e9 / 8))


def test_one_efficiency_per_transport_whatever_the_nic() -> None:
    phys = dataclasses.replace(PHYS, tcp_efficiency=0.5, tcp_flow_gbps=1000.0)
    model = PerformanceModel(SPECS, Calibration(phys))
    rates = [
        model.predict(
            PROFILE, one_group(2, 1, linked(NodeLinks("PCIe", 15.75, "tcp", g, g)))
        ).inter_bytes_s
        for g in (10.0, 50.0)
    ]
    assert rates == pytest.approx([0.5 * 10e9 / 8, 0.5 * 50e9 / 8])


def test_a_burst_nic_runs_at_its_peak_only_within_its_baseline() -> None:
    burst = linked(NodeLinks("none", 0.0, "tcp", 2.5, 10.0, 1, math.inf, 16), count=1)
    phys = dataclasses.replace(PHYS, tcp_flow_gbps=1000.0)
    model = PerformanceModel(SPECS, Calibration(phys))
    pred = model.predict(PROFILE, one_group(2, 1, burst))
    size = 100 * 1024**2
    assert pred.allreduce_s == pytest.approx(size / (10e9 / 8))  # the transfer at the peak
    # but on average the NIC moves no more than its baseline: 100 MiB per step at 2.5 Gbps
    assert pred.step_s == pytest.approx(max(0.18 + size / (10e9 / 8), size / (2.5e9 / 8)))


def test_isolated_gpus_send_intra_node_traffic_through_the_network_transport() -> None:
    nvlink = NodeLinks("NVSwitch", 300.0, "ib", 1600.0, 1600.0, 8)
    pods = dataclasses.replace(nvlink, isolated_gpus=True)
    model = PerformanceModel(SPECS, Calibration(PHYS))
    direct = model.predict(PROFILE, one_group(1, 8, linked(nvlink, 8)))
    through_hca = model.predict(PROFILE, one_group(1, 8, linked(pods, 8)))
    assert direct.intra_bytes_s == pytest.approx(300e9)
    assert through_hca.intra_bytes_s == pytest.approx(200e9 / 8)  # one HDR rail per GPU
    # across nodes a ring with one GPU per node drives one rail of eight
    one_each = model.predict(PROFILE, one_group(2, 1, linked(nvlink, 8)))
    assert one_each.inter_bytes_s == pytest.approx(200e9 / 8)


def test_coarse_overlap_hides_all_but_the_tail_until_the_network_is_slower() -> None:
    phys = dataclasses.replace(PHYS, tail_fraction=0.2, overlap_window=0.5)
    model = PerformanceModel(SPECS, Calibration(phys))
    backward = 0.18 * 2 / 3  # coarse profile: backward is 2/3 of compute
    fast = model.predict(PROFILE, one_group(1, 2))  # PCIe: all-reduce << backward
    assert fast.comm_s == pytest.approx(0.2 * fast.allreduce_s)
    slow = model.predict(PROFILE, one_group(8, 1, offer(gbps=5.0)))  # all-reduce > backward
    assert slow.allreduce_s > backward
    assert slow.comm_s == pytest.approx(slow.allreduce_s - 0.5 * backward)


def test_a_jobs_own_terms_apply_to_that_job_only() -> None:
    terms = JobTerms("mine", tail_fraction=1.0, overlap_window=0.0, colocation_slowdown=0.1)
    cal = Calibration(dataclasses.replace(PHYS, tail_fraction=0.1), jobs=(terms,))
    model = PerformanceModel(SPECS, cal)
    mine = dataclasses.replace(PROFILE, model_name="mine")
    other = dataclasses.replace(PROFILE, model_name="other")
    a = model.predict(mine, one_group(2, 4))
    b = model.predict(other, one_group(2, 4))
    assert a.compute_s == pytest.approx((1 + 0.1 * 2) * b.compute_s)  # 4 GPUs: 2 doublings
    assert a.comm_s == pytest.approx(a.allreduce_s)  # tail 1: nothing hidden
    assert b.comm_s < b.allreduce_s
    assert cal.physics_for("other") == cal.physics


def test_colocation_grows_per_doubling_of_the_gpus_on_a_node() -> None:
    cal = Calibration(dataclasses.replace(PHYS, colocation_slowdown=0.2))
    model = PerformanceModel(SPECS, cal)
    alone = model.predict(PROFILE, one_group(8, 1)).compute_s
    shared = [model.predict(PROFILE, one_group(1, k)).compute_s / alone for k in (2, 4, 8)]
    # one neighbour costs the constant; each doubling adds it once more, not per GPU
    assert shared == pytest.approx([1.2, 1.4, 1.6])
    assert colocation_load(np.array([1, 2, 4, 8])).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_predict_equals_predict_batch_on_one_candidate() -> None:
    cal = Calibration(
        PhysicsConstants(tail_fraction=0.4, colocation_slowdown=0.03, straggler_cv=0.02)
    )
    model = PerformanceModel(SPECS, cal)
    cluster = Cluster((ClusterGroup(offer(), 2, 4), ClusterGroup(offer("V100", 8, 25), 1, 8)))
    for kwargs in ({}, {"local_batch": 12}, {"global_batch": 500}):
        single = model.predict(PROFILE, cluster, **kwargs)  # type: ignore[arg-type]
        batch = model.predict_batch(
            PROFILE,
            CandidateArrays.from_clusters([cluster]),
            **kwargs,  # type: ignore[arg-type]
        )
        assert single.step_s == pytest.approx(float(batch.step_s[0]), rel=1e-12)
        assert single.low_s == pytest.approx(float(batch.low_s[0]), rel=1e-12)
        assert single.global_batch == int(batch.global_batch[0])


def test_more_nodes_never_make_communication_cheaper_per_step() -> None:
    model = PerformanceModel(SPECS)
    cands = CandidateArrays.from_clusters([one_group(n, 4) for n in (1, 2, 4, 8, 16)])
    out = model.predict_batch(PROFILE, cands)
    assert np.all(np.diff(out.step_s) >= 0)
    assert out.global_batch.tolist() == [16 * 4 * n for n in (1, 2, 4, 8, 16)]
    assert np.all(out.low_s <= out.step_s) and np.all(out.step_s <= out.high_s)


def test_global_batch_is_split_by_speed_so_groups_finish_together() -> None:
    model = PerformanceModel(SPECS, Calibration(PHYS))
    cluster = Cluster(
        (ClusterGroup(offer(), 1, 4), ClusterGroup(offer("V100", 4, 50, name="p3.8xlarge"), 1, 4))
    )
    pred = model.predict(PROFILE, cluster, global_batch=256)
    t4, v100 = pred.local_batch
    assert v100 > t4
    ratio = model.compute_ratio(PROFILE, "V100")
    assert ratio is not None
    # the intercept is host time (kept); only the per-sample part scales with the GPU
    t4_time = 0.02 + 0.01 * t4
    v100_time = 0.02 + 0.01 * v100 * ratio
    assert abs(t4_time - v100_time) < 0.01 * max(1.0, ratio) + 1e-9
    assert abs(pred.global_batch - 256) <= 8


def test_coarse_cross_gpu_scaling_blends_peak_and_bandwidth() -> None:
    ratio = PerformanceModel(SPECS).compute_ratio(PROFILE, "V100")
    assert ratio == pytest.approx((8.1 * TC / 15.7) ** 0.5 * (320.0 / 900.0) ** 0.5)


def test_a_coarse_profile_keeps_its_fixed_per_step_time_on_another_gpu() -> None:
    model = PerformanceModel(SPECS, Calibration(PHYS))
    ratio = model.compute_ratio(PROFILE, "V100")
    assert ratio is not None
    v100 = model.predict(PROFILE, one_group(1, 1, offer("V100", 1))).step_s
    assert v100 == pytest.approx(0.02 + 0.16 * ratio)  # 0.02 s fixed, 0.01 s per sample


def test_detailed_memory_bound_layers_scale_by_bandwidth() -> None:
    norm = LayerTiming("n", "b", "LayerNorm", 0.01, 0.02, 10, 40, flops=1e6, activation_bytes=10**9)
    prof = dataclasses.replace(PROFILE, kind="detailed", layers=(norm,))
    assert PerformanceModel(SPECS).compute_ratio(prof, "V100") == pytest.approx(320.0 / 900.0)


def test_detailed_per_layer_roofline_scales_compute_bound_layers_by_peak() -> None:
    layer = LayerTiming("l", "b", "Linear", 0.01, 0.02, 10, 40, flops=1e12, activation_bytes=1)
    prof = dataclasses.replace(PROFILE, kind="detailed", layers=(layer,))
    assert PerformanceModel(SPECS).compute_ratio(prof, "V100") == pytest.approx(8.1 * TC / 15.7)


def test_model_too_big_for_the_gpu_is_reported() -> None:
    big = coarse({8: 0.1, 16: 0.18}, static=14 * GIB, activations=int(1 * GIB))
    model = PerformanceModel(SPECS)
    out = model.predict_batch(big, CandidateArrays.from_clusters([one_group(1, 1)]))
    assert not out.fits[0]
    with pytest.raises(PredictionError, match=r"needs 15\.0 GiB per GPU at local batch 16.*16 GiB"):
        model.predict(big, one_group(1, 1))


def test_memory_caps_the_heterogeneous_split() -> None:
    prof = coarse({8: 0.1, 16: 0.18}, static=1 * GIB, activations=int(16 * 0.1 * GIB))
    small = offer("V100", 4, 50, mem=4.0, name="tiny")
    cluster = Cluster((ClusterGroup(offer(), 1, 4), ClusterGroup(small, 1, 4)))
    pred = PerformanceModel(SPECS).predict(prof, cluster, global_batch=256)
    cap = int((4.0 * 0.92 - 1.0) / 0.1)
    assert pred.local_batch[1] <= cap and pred.fits


def test_unknown_accelerator_is_not_a_fit() -> None:
    model = PerformanceModel(SPECS)
    cluster = one_group(1, 1, offer("Mystery9000", 1))
    out = model.predict_batch(PROFILE, CandidateArrays.from_clusters([cluster]))
    assert not out.fits[0] and np.isinf(out.step_s[0])
    with pytest.raises(PredictionError, match="no GPU spec for it"):
        model.predict(PROFILE, cluster)


def test_correction_multiplies_multi_gpu_steps_only() -> None:
    leaf = Tree((0,), (0.0,), (-1,), (-1,), (0.0,))
    doubling = Correction(
        FEATURE_NAMES,
        TreeEnsemble(float(np.log(2.0)), 1.0, (leaf,)),
        TreeEnsemble(float(np.log(1.5)), 1.0, (leaf,)),
        TreeEnsemble(float(np.log(3.0)), 1.0, (leaf,)),
    )
    plain = PerformanceModel(SPECS, Calibration(PHYS))
    fixed = PerformanceModel(SPECS, Calibration(PHYS, correction=doubling))
    cands = CandidateArrays.from_clusters([one_group(1, 1), one_group(2, 4)])
    a, b = plain.predict_batch(PROFILE, cands), fixed.predict_batch(PROFILE, cands)
    assert b.step_s[0] == pytest.approx(a.step_s[0])
    assert b.step_s[1] == pytest.approx(2 * a.step_s[1])
    assert b.low_s[1] == pytest.approx(1.5 * a.step_s[1])
    assert b.high_s[1] == pytest.approx(3 * a.step_s[1])
    spread = PerformanceModel(SPECS, Calibration(PHYS, correction=doubling, model_spread=0.2))
    c = spread.predict_batch(PROFILE, cands)
    widen = 1.2816 * 0.2
    assert c.step_s[1] == pytest.approx(b.step_s[1])
    assert c.low_s[1] == pytest.approx(b.step_s[1] * np.exp(-np.hypot(np.log(0.75), widen)))
    assert c.high_s[1] == pytest.approx(b.step_s[1] * np.exp(np.hypot(np.log(1.5), widen)))


def test_one_process_does_not_take_the_whole_job_scaling_offset() -> None:
    """``model_spread`` is how far a new job's *scaling* may sit off the fit; one process
    scales nothing (its step is the profile's own measured curve), so only the row
    scatter is left, while two processes take both in quadrature."""
    cal = Calibration(PHYS, residual_low=-0.05, residual_high=0.05, model_spread=0.3)
    model = PerformanceModel(SPECS, cal)
    alone, pair = (model.predict(PROFILE, one_group(1, g)) for g in (1, 2))
    assert _width(alone) == pytest.approx((0.05, 0.05))
    both = math.hypot(0.05, 1.2816 * 0.3)
    assert _width(pair) == pytest.approx((both, both))


def test_one_process_on_the_profiled_instance_type_is_as_sure_as_the_profile() -> None:
    """A one-process profile's own run again (same instance type, a batch it measured
    around) is its measurement: the interval is the profile's step spread, not the
    multi-GPU fit's residuals. Off that run (another instance type with the same GPU,
    a batch beyond the profiled ones, two processes) the calibration's interval holds."""
    cal = Calibration(PHYS, residual_low=-0.05, residual_high=0.05)
    model = PerformanceModel(SPECS, cal)
    measured = dataclasses.replace(
        PROFILE,
        environment=dataclasses.replace(PROFILE.environment, instance_type="g4dn.12xlarge"),
        steps=dataclasses.replace(PROFILE.steps, step=Spread(0.18, 0.18, 0.198, 40)),
    )
    # p90 - p50 is 1.2816 sigma of a normal spread: the log ends are (p90 - p50)/mean
    own = (0.198 - 0.18) / 0.18
    home = model.predict(measured, one_group(1, 1), local_batch=16)
    assert _width(home) == pytest.approx((own, own))
    between = model.predict(measured, one_group(1, 1), local_batch=24)
    assert _width(between) == pytest.approx((own, own))
    beyond = model.predict(measured, one_group(1, 1), local_batch=64)
    other_host = model.predict(measured, one_group(1, 1, offer(name="g4dn.16xlarge")))
    pair = model.predict(measured, one_group(1, 2), local_batch=16)
    unnamed = model.predict(PROFILE, one_group(1, 1), local_batch=16)
    for pred in (beyond, other_host, pair, unnamed):
        assert _width(pred) == pytest.approx((0.05, 0.05))


def _detailed(bucket_bytes: int) -> Profile:
    layers = tuple(
        LayerTiming(f"l{i}", "b", "Linear", 0.01, 0.02, 1, bucket_bytes, 0.0, 0) for i in range(4)
    )
    steps = StepTimes(Spread(0.14, 0.14, 0.14, 10), 0.04, 0.08, 0.02, 0.0, 0, 10)
    return dataclasses.replace(
        coarse({16: 0.14}),
        kind="detailed",
        layers=layers,
        steps=steps,
        grad_bytes=4 * bucket_bytes,
    )


def test_detailed_profile_uses_the_bucket_event_simulation() -> None:
    size = 30 * 1024**2  # one bucket per layer (above the 25 MiB cap)
    prof = _detailed(size)
    beta = 50e9 / 8
    per_bucket = size / beta  # 2 nodes, 1 GPU each: S/beta per bucket
    model = PerformanceModel(SPECS, Calibration(PHYS))
    pred = model.predict(prof, one_group(2, 1))
    # backward 0.08 s; bucket i ready at 0.02*(i+1); one stream
    free = 0.0
    for i in range(4):
        free = max(free, 0.02 * (i + 1)) + per_bucket
    expected = 0.04 + max(free, 0.08) + 0.02
    assert pred.step_s == pytest.approx(expected, rel=1e-9)
    assert pred.allreduce_s == pytest.approx(4 * per_bucket)


def test_bad_batch_arguments_are_rejected() -> None:
    model = PerformanceModel(SPECS)
    with pytest.raises(PredictionError):
        model.predict(PROFILE, one_group(1, 1), local_batch=4, global_batch=8)
    with pytest.raises(PredictionError):
        model.predict(PROFILE, one_group(1, 1), local_batch=0)


def test_string_and_object_accelerator_columns_agree() -> None:
    model = PerformanceModel(SPECS)
    clusters = [one_group(2, 4), one_group(1, 4, offer("V100", 4)), one_group(3, 1)]
    obj = CandidateArrays.from_clusters(clusters)
    text = dataclasses.replace(obj, accelerator=obj.accelerator.astype(str))
    assert model.predict_batch(PROFILE, obj).step_s.tolist() == (
        model.predict_batch(PROFILE, text).step_s.tolist()
    )


def test_step_time_spread_adds_a_straggler_cost_that_grows_with_workers() -> None:
    noisy = dataclasses.replace(
        PROFILE,
        steps=dataclasses.replace(
            PROFILE.steps, step=Spread(0.18, 0.18, 0.18 + 1.2816 * 0.018, 50)
        ),
    )
    overlap = PhysicsConstants(tail_fraction=1e-3, overlap_window=1.0)
    model = PerformanceModel(SPECS, Calibration(overlap))
    cands = CandidateArrays.from_clusters([one_group(1, 1), one_group(1, 4), one_group(16, 4)])
    quiet, loud = model.predict_batch(PROFILE, cands), model.predict_batch(noisy, cands)
    assert loud.step_s[0] == pytest.approx(quiet.step_s[0])
    pred = model.predict(noisy, one_group(1, 4))
    # E[max of 4 standard normals] = 1.0294 (order-statistics tables)
    assert pred.compute_s == pytest.approx(0.18 * (1 + 0.1 * 1.0294), rel=1e-4)
    gain = loud.step_s / quiet.step_s
    assert 1.0 < gain[1] < gain[2]


def test_expected_max_of_normals_matches_order_statistics() -> None:
    got = expected_max_z(np.array([1, 2, 3, 10, 100, 1024, 1025, 10**6]))
    # 1/sqrt(pi), 3/(2 sqrt(pi)), and tabulated values for 10 and 100
    assert got[:5].tolist() == pytest.approx([0.0, 0.5642, 0.8463, 1.5388, 2.5076], abs=2e-4)
    assert np.all(np.diff(got) > 0)
    assert got[6] == pytest.approx(got[5], rel=0.02)  # the asymptote joins the table
    assert got[7] < np.sqrt(2 * np.log(10**6))


def test_core_model_imports_without_torch_sky_or_scikit_learn() -> None:
    import subprocess
    import sys

    script = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'sky', 'sklearn', 'scipy', 'lightning'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import lightning_srifty.core.perfmodel, lightning_srifty.core.stateff\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_host_time_does_not_speed_up_on_a_faster_gpu() -> None:
    # 0.14 s per step: 0.10 s of forward/backward/optimizer on the T4, 0.04 s waiting
    # for the data loader on the host.
    layer = LayerTiming("l", "b", "Linear", 0.02, 0.06, 10, 40, flops=1e12, activation_bytes=1)
    steps = StepTimes(Spread(0.14, 0.14, 0.14, 10), 0.02, 0.06, 0.02, 0.04, 0, 10)
    prof = dataclasses.replace(
        coarse({16: 0.14}), kind="detailed", layers=(layer,), steps=steps, batch_points=()
    )
    model = PerformanceModel(SPECS, Calibration(physics=PHYS))
    assert model.host_share(prof) == pytest.approx(0.04 / 0.14)
    v100 = model.predict(prof, one_group(1, 1, offer("V100", 1))).step_s
    device = 0.10 * 8.1 * TC / 15.7  # compute-bound: by the achieved peak ratio
    assert v100 == pytest.approx(device + 0.04)
    t4 = model.predict(prof, one_group(1, 1, offer("T4", 1))).step_s
    assert t4 == pytest.approx(0.14)  # on the profiled GPU nothing changes
    assert model.host_share(PROFILE) == 0.0  # a coarse profile has no split


def test_work_a_job_does_only_as_one_process_is_added_to_one_process_alone() -> None:
    """1,000 operations moving 4 GB each step, only when the job runs alone (the traces'
    AdaptDL statistics): 10 ms of host on any GPU, 12.5 ms of the T4's 320 GB/s and
    4.4 ms of the V100's 900 GB/s; a step of two processes does none of it."""
    alone = {"single_process": {"ops": 1000, "bytes": 4e9}}
    prof = dataclasses.replace(PROFILE, extra=alone)
    assert prof.single_process_work == (1000, 4e9)
    model = PerformanceModel(SPECS, Calibration(physics=PHYS))
    for acc, extra_s in (("T4", 4e9 / 320e9), ("V100", 1000 * EAGER_OP_S)):
        cluster = one_group(1, 1, offer(acc, 1))
        without = model.predict(PROFILE, cluster).step_s
        assert model.predict(prof, cluster).step_s == pytest.approx(without + extra_s)
    for cluster in (one_group(1, 2), one_group(2, 1)):
        assert model.predict(prof, cluster).step_s == pytest.approx(
            model.predict(PROFILE, cluster).step_s
        )
    assert single_process_s(1000, 4e9, math.inf) == pytest.approx(1000 * EAGER_OP_S)


def test_a_faster_gpu_waits_for_the_loaders_workers_that_a_slower_one_never_waited_for() -> None:
    # 0.10 s a step of device work on the T4 and no wait for data; 4 workers spend
    # 0.28 CPU-s on each batch of 16, so they deliver one every 0.07 s given 4 cores
    layer = LayerTiming("l", "b", "Linear", 0.02, 0.06, 10, 40, flops=1e12, activation_bytes=1)
    steps = StepTimes(Spread(0.10, 0.10, 0.10, 10), 0.02, 0.06, 0.02, 0.0, 0, 10)
    plain = dataclasses.replace(
        coarse({16: 0.10}), kind="detailed", layers=(layer,), steps=steps, batch_points=()
    )
    loaded = dataclasses.replace(plain, data_loading=DataLoading(4, 0.28, 50))
    model = PerformanceModel(SPECS, Calibration(physics=PHYS))
    v100 = one_group(1, 1, offer("V100", 1))
    device = 0.10 * 8.1 * TC / 15.7  # compute-bound: by the achieved peak ratio
    assert device < 0.07
    assert model.predict(plain, v100).step_s == pytest.approx(device)
    assert model.predict(loaded, v100).step_s == pytest.approx(0.07)
    # on the profiled GPU the loader kept up, as measured
    assert model.predict(loaded, one_group(1, 1, offer("T4", 1))).step_s == pytest.approx(0.10)
    # a node of 3 vCPUs runs 3 of the 4 workers at once, and the training thread
    # takes its compute's share of those cores
    small = Offer("small", "V100", 1, 16.0, 3, 16, "us-west-2", "usw2-az1", 3.0, 1.0, "PCIe", 10)
    assert model.predict(loaded, one_group(1, 1, small)).step_s == pytest.approx(
        (0.28 + device) / 3
    )
    # 4 vCPUs: all 4 workers run, but not beside training; 5: training has its own core
    four = dataclasses.replace(small, vcpus=4)
    assert model.predict(loaded, one_group(1, 1, four)).step_s == pytest.approx((0.28 + device) / 4)
    five = dataclasses.replace(small, vcpus=5)
    assert model.predict(loaded, one_group(1, 1, five)).step_s == pytest.approx(0.07)
    # a coarse profile measured no loader: nothing changes
    assert model.predict(dataclasses.replace(loaded, kind="coarse"), v100).step_s < 0.07
    # validation passes run at the GPU's pace, not the training loader's
    passes = {"validation": {"batches_per_pass": 10, "train_batches_between": 100, "batch_s": 0.03}}
    one = CandidateArrays.from_clusters([v100])
    paced = [
        model.predict_batch(dataclasses.replace(p, extra=passes), one).validation_s
        for p in (plain, loaded)
    ]
    assert paced[0] is not None and paced[1] is not None and paced[0][0] > 0
    assert paced[1][0] == pytest.approx(paced[0][0])


def test_loader_workers_and_the_training_thread_share_the_cores_each_process_gets() -> None:
    # 4 workers, 0.2 CPU-s a batch, training 0.1 s a step
    batch, compute = 0.2, 0.1
    cores = np.asarray([8.0, 5.0, 4.0, 2.0, np.nan])
    floor = loader_floor_s(np.full(5, batch), 4, cores, np.full(5, compute))
    assert floor[0] == pytest.approx(batch / 4)  # a core each and several to spare
    # one core to spare: the shared bound may pass the workers' alone, never the compute
    assert floor[1] == pytest.approx((batch + compute) / 5) and floor[1] < compute
    # no core to spare: the workers lose what training takes
    assert floor[2] == pytest.approx((batch + compute) / 4) and floor[2] > batch / 4
    assert floor[3] == pytest.approx((batch + compute) / 2)
    assert floor[4] == pytest.approx(batch / 4)  # vCPUs unknown: as if each had a core


def test_efa_nodes_use_their_rails_and_a_mix_with_tcp_nodes_falls_back_to_sockets() -> None:
    phys = dataclasses.replace(PHYS, efa_efficiency=0.5, tcp_efficiency=1.0, tcp_flow_gbps=1000.0)
    model = PerformanceModel(SPECS, Calibration(phys))
    # 4 EFA interfaces of 100 Gbps, 4 GPU rails; TCP sockets leave through one card
    efa = NodeLinks("NVSwitch", 300.0, "efa", 400.0, 400.0, 4, 5.0, 16, socket_gbps=100.0)
    full = model.predict(PROFILE, one_group(2, 4, linked(efa, 4)))
    assert full.inter_bytes_s == pytest.approx(0.5 * 400e9 / 8)
    half = model.predict(PROFILE, one_group(2, 2, linked(efa, 4)))
    assert half.inter_bytes_s == pytest.approx(0.5 * 200e9 / 8)  # two of four rails
    tcp = NodeLinks("PCIe", 15.75, "tcp", 400.0, 400.0, 1, 5.0, 16)
    mixed = Cluster(
        (ClusterGroup(linked(efa, 4), 1, 4), ClusterGroup(linked(tcp, 4, acc="V100"), 1, 4))
    )
    assert not mixed.uses_efa and one_group(2, 4, linked(efa, 4)).uses_efa
    # NCCL runs one network: the EFA node talks over its sockets, through one 100 Gbps
    # card, slower than the TCP node's 32 flows x 5 Gbps; that card paces the pair
    pred = model.predict(PROFILE, mixed, global_batch=64)
    assert pred.inter_bytes_s == pytest.approx(100e9 / 8)
    alone = NodeLinks("NVSwitch", 300.0, "efa", 400.0, 400.0, 4, 5.0, 16, socket_gbps=100.0)
    efa_mix = Cluster(
        (ClusterGroup(linked(alone, 4), 1, 4), ClusterGroup(linked(efa, 4, acc="V100"), 1, 4))
    )
    assert efa_mix.uses_efa


def _hundred_layers(flops: float) -> Profile:
    """100 Linear layers of ``flops`` each, 20 us apiece (2 ms of device time) on a T4."""
    layers = tuple(
        LayerTiming(f"l{i}", "b", "Linear", 5e-6, 15e-6, 10, 40, flops=flops, activation_bytes=1)
        for i in range(100)
    )
    steps = StepTimes(Spread(0.002, 0.002, 0.002, 10), 0.0005, 0.0015, 0.0, 0.0, 0, 10)
    return dataclasses.replace(
        coarse({16: 0.002}), kind="detailed", layers=layers, steps=steps, batch_points=()
    )


def test_a_step_of_many_tiny_layers_is_bound_by_its_kernel_launches() -> None:
    """Layers whose T4 time is work (near their roofline) scale to a V100, but cannot
    run in less than 100 x (1 forward + 2 backward) launches."""
    prof = _hundred_layers(1e8)
    model = PerformanceModel(SPECS, Calibration(physics=PHYS))
    work = sum(w for _, w in model.layer_work(prof))
    assert work == pytest.approx(0.002)  # 20 us a layer is within its roofline's reach
    v100 = model.predict(prof, one_group(1, 1, offer("V100", 1))).step_s
    assert v100 == pytest.approx(100 * 3 * 5e-6)  # the roofline alone says less
    assert 0.002 * model.compute_ratio(prof, "V100") < v100
    t4 = model.predict(prof, one_group(1, 1, offer("T4", 1))).step_s
    assert t4 == pytest.approx(0.002)  # measured where it ran: above the floor, unchanged


def test_layer_time_far_above_its_roofline_is_latency_no_gpu_or_batch_shortens() -> None:
    """1e6 FLOPs take 20 us on the T4, ~50x their roofline: the time is launches and
    latency, so a faster GPU runs them in about the same time and a larger batch adds
    only the work. Counted as work, the V100 read ~0.9 ms and batch 32 twice the step."""
    prof = _hundred_layers(1e6)
    model = PerformanceModel(SPECS, Calibration(physics=PHYS))
    latency = model.layer_latency_s(prof)
    assert 0.0019 < latency < 0.002
    v100 = model.predict(prof, one_group(1, 1, offer("V100", 1))).step_s
    assert v100 == pytest.approx(0.002, rel=0.01)
    t4 = one_group(1, 1, offer("T4", 1))
    assert model.predict(prof, t4).step_s == pytest.approx(0.002)
    doubled = model.predict(prof, t4, local_batch=32).step_s
    assert doubled == pytest.approx(0.002 + (0.002 - latency), rel=1e-6)
    # measured at two batches, the line's intercept holds the latency: kept on the V100
    points = (BatchPoint(16, 0.002, 0.002), BatchPoint(32, 0.0021, 0.0021))
    two = dataclasses.replace(prof, batch_points=points)
    assert model.predict(two, one_group(1, 1, offer("V100", 1))).step_s > 0.0019


def _with_glue(flops: float, glue_s: float) -> Profile:
    """:func:`_hundred_layers` plus one container whose own time (``glue_s``: a residual
    add, Python) has no FLOPs or bytes the capture could count."""
    prof = _hundred_layers(flops)
    glue = LayerTiming("block", "b", "Block", glue_s / 2, glue_s / 2, 0, 0, 0.0, 0)
    total = 0.002 + glue_s
    steps = dataclasses.replace(
        prof.steps,
        step=Spread(total, total, total, 10),
        forward_s=prof.steps.forward_s + glue_s / 2,
        backward_s=prof.steps.backward_s + glue_s / 2,
    )
    return dataclasses.replace(prof, layers=(*prof.layers, glue), steps=steps)


@pytest.mark.parametrize(
    ("flops", "glue_grows"),
    [(1e8, True), (1e6, False)],
    ids=["counted-layers-busy", "counted-layers-latency-bound"],
)
def test_uncounted_layer_time_is_split_as_the_counted_layers_split_theirs(
    flops: float, glue_grows: bool
) -> None:
    """A container's own 1 ms grows with the batch where the counted layers show the GPU
    busy (their time is work), and stays per step where they show it latency-bound. Taken
    as work whatever the counted layers said, it doubled with the batch in both."""
    model = PerformanceModel(SPECS, Calibration(physics=PHYS))
    t4 = one_group(1, 1, offer("T4", 1))
    without = model.predict(_hundred_layers(flops), t4, local_batch=32).step_s
    with_glue = model.predict(_with_glue(flops, 0.001), t4, local_batch=32).step_s
    glue_at_32 = with_glue - without
    if glue_grows:
        assert glue_at_32 == pytest.approx(0.002, rel=1e-6)
    else:
        assert 0.001 <= glue_at_32 < 0.00105  # the counted layers: at most 5 % work


def test_a_profile_with_no_counted_layer_keeps_every_layer_as_work() -> None:
    prof = _with_glue(1e6, 0.001)
    only_glue = dataclasses.replace(prof, layers=prof.layers[-1:])
    model = PerformanceModel(SPECS, Calibration(physics=PHYS))
    assert model.layer_work(only_glue) == [(only_glue.layers[0], 0.001)]


def test_hardware_the_calibration_never_saw_gets_a_wider_interval() -> None:
    cal = Calibration(
        PHYS,
        residual_low=-0.1,
        residual_high=0.1,
        seen_hardware=(("T4", "tcp"),),
        hardware_spread=0.2,
        unseen_widening=0.05,
    )
    model = PerformanceModel(SPECS, cal)
    seen = model.predict(PROFILE, one_group(2, 1))
    assert math.log(seen.high_s / seen.step_s) == pytest.approx(0.1)
    assert math.log(seen.step_s / seen.low_s) == pytest.approx(0.1)
    # the T4 profile's compute carried to the V100 is unsure on its own (tested below);
    # read that part off a calibration with no hardware widening
    plain = PerformanceModel(SPECS, Calibration(PHYS, residual_low=-0.1, residual_high=0.1))

    def carried(cluster: Cluster) -> float:
        width = math.log(
            plain.predict(PROFILE, cluster).high_s / plain.predict(PROFILE, cluster).step_s
        )
        return math.sqrt(width**2 - 0.1**2)

    unseen = model.predict(PROFILE, one_group(2, 1, offer("V100", 4)))
    # a whole new kind of hardware may sit off (in quadrature), plus the conformal margin
    wide = math.hypot(0.1, 1.2816 * 0.2) + 0.05
    transfer = carried(one_group(2, 1, offer("V100", 4)))
    assert transfer > 0.1
    assert math.log(unseen.high_s / unseen.step_s) == pytest.approx(math.hypot(wide, transfer))
    assert math.log(unseen.step_s / unseen.low_s) == pytest.approx(math.hypot(wide, transfer))
    # one GPU: no synchronisation, nothing the calibration's hardware could change
    alone = model.predict(PROFILE, one_group(1, 1, offer("V100", 4)))
    transfer = carried(one_group(1, 1, offer("V100", 4)))
    assert math.log(alone.high_s / alone.step_s) == pytest.approx(math.hypot(0.1, transfer))


def _width(prediction: object) -> tuple[float, float]:
    high = math.log(prediction.high_s / prediction.step_s)  # type: ignore[attr-defined]
    low = math.log(prediction.step_s / prediction.low_s)  # type: ignore[attr-defined]
    return low, high


def test_compute_carried_to_another_gpu_type_is_as_unsure_as_its_device_and_host_parts() -> None:
    """The interval of a one-GPU step on another GPU type: device time through the
    compute ratio (sigma 0.27, from Lambda's leave-pair-out error), host time kept from a
    host it never ran on (a factor of two at the 10/90 % ends). On the profiled type the
    profile's own measurement stands, with no widening."""
    exact = Calibration(PHYS, residual_low=0.0, residual_high=0.0)
    model = PerformanceModel(SPECS, exact)
    gpu_bound = coarse({16: 0.16, 32: 0.32})  # no fixed part: all device time
    host_bound = coarse({16: 0.05, 32: 0.05})  # no per-sample part: all host time
    for profile in (gpu_bound, host_bound):
        home = model.predict(profile, one_group(1, 1))
        assert home.low_s == pytest.approx(home.step_s)
        assert home.high_s == pytest.approx(home.step_s)
    device = _width(model.predict(gpu_bound, one_group(1, 1, offer("V100", 4))))
    assert device == pytest.approx((1.2816 * 0.27, 1.2816 * 0.27), rel=1e-3)
    host = model.predict(host_bound, one_group(1, 1, offer("V100", 4)))
    assert host.step_s == pytest.approx(0.05)  # kept as measured
    assert _width(host) == pytest.approx((math.log(2.0), math.log(2.0)), rel=1e-3)
    # half and half: the two independent parts add in quadrature, by their shares
    mixed = coarse({16: 0.10, 32: 0.15})  # 0.05 s fixed + 0.05 s per 16 samples on the T4
    pred = model.predict(mixed, one_group(1, 1, offer("V100", 4)))
    device_s = pred.step_s - 0.05
    sigma = math.hypot(device_s * 0.27, 0.05 * math.log(2.0) / 1.2816) / pred.step_s
    assert _width(pred) == pytest.approx((1.2816 * sigma, 1.2816 * sigma), rel=1e-3)


def test_a_probed_instance_types_own_terms_apply_to_clusters_of_it_alone() -> None:
    """A probe measured g4dn's network at half the calibration's rate: clusters of g4dn
    alone see it, another type and a mix of the two keep the calibration's constants."""
    probed = offer(name="g4dn.12xlarge")
    other = offer(name="g5.12xlarge")
    slow = dataclasses.replace(PHYS, tcp_efficiency=0.5)
    cal = Calibration(PHYS, hardware_terms=(HardwareTerms("g4dn.12xlarge", slow, rows=2),))
    model = PerformanceModel(SPECS, cal)
    shipped = PerformanceModel(SPECS, Calibration(PHYS))
    ring = 100 * 1024**2 / (50e9 / 8)  # 2 nodes of one GPU: S / line rate
    assert model.predict(PROFILE, one_group(2, 1, probed)).allreduce_s == pytest.approx(2 * ring)
    assert model.predict(PROFILE, one_group(2, 1, other)).allreduce_s == pytest.approx(ring)
    mix = Cluster((ClusterGroup(probed, 1, 1), ClusterGroup(other, 1, 1)))
    assert model.predict(PROFILE, mix).step_s == shipped.predict(PROFILE, mix).step_s
    # the batch path splits the candidates by hardware and puts them back in order
    clusters = [one_group(2, 1, other), one_group(2, 1, probed), mix, one_group(3, 1, probed)]
    batch = model.predict_batch(PROFILE, CandidateArrays.from_clusters(clusters))
    one_by_one = [model.predict(PROFILE, c).step_s for c in clusters]
    assert batch.step_s.tolist() == pytest.approx(one_by_one)
    assert cal.physics_on("g5.12xlarge") == PHYS and cal.physics_on("g4dn.12xlarge") == slow
