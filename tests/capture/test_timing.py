"""Pure accumulators: means, bucket ready order, merging ranks into one profile."""

from __future__ import annotations

import pytest

from lightning_srifty.capture.timing import (
    MAX_EXTENSION_FACTOR,
    BucketAccumulator,
    BucketEvent,
    CallSpan,
    LayerAccumulator,
    LayerInfo,
    ModelFacts,
    RankMeasurement,
    StepRecord,
    assign_parameters,
    block_names,
    build_profile,
    exclusive_calls,
    exclusive_nested,
    fold_into_records,
    hook_overhead_scale,
    steps_to_cover,
    without_hook_overhead,
)
from lightning_srifty.core.profile import Bucket, Environment, GradParam, Profile

ENV = Environment("cpu (x86_64)", "cpu", 2, 2, 1, "32-true", 8, "2.x", "2.x")


def test_layer_means_divide_by_steps() -> None:
    acc = LayerAccumulator()
    acc.add_step({"a": 1.0, "b": 2.0}, {"a": 3.0})
    acc.add_step({"a": 3.0}, {"a": 1.0, "b": 4.0})
    assert acc.means() == {"a": (2.0, 2.0), "b": (1.0, 2.0)}


def test_bucket_order_follows_ready_time_not_index() -> None:
    acc = BucketAccumulator()
    for step in range(3):
        acc.add_step(
            [
                BucketEvent(index=0, bytes=100, num_params=2, ready_offset_s=0.5, allreduce_s=0.1),
                BucketEvent(index=1, bytes=300, num_params=5, ready_offset_s=0.2 + step * 0.01,
                            allreduce_s=0.2),
            ]
        )  # fmt: skip
    buckets = {b.index: b for b in acc.buckets()}
    assert buckets[1].ready_order == 0 and buckets[0].ready_order == 1
    assert buckets[1].ready_offset_s == pytest.approx(0.21)
    assert buckets[0].allreduce_s == pytest.approx(0.1)
    assert buckets[1].bytes == 300 and buckets[1].num_params == 5


def _rank(rank: int, step_s: float, layer: tuple[float, float]) -> RankMeasurement:
    steps = tuple(
        StepRecord(step_s=step_s, forward_s=0.1, backward_s=0.2, optimizer_s=0.05,
                   data_wait_s=0.01, allreduce_s=0.03, exposed_comm_s=0.01)
        for _ in range(4)
    )  # fmt: skip
    return RankMeasurement(rank, steps, {"fc": layer}, (), peak_memory_bytes=1000 * (rank + 1))


def test_build_profile_averages_layers_and_keeps_every_rank() -> None:
    facts = ModelFacts(
        model_name="M",
        environment=ENV,
        layers=(LayerInfo("fc", "fc", "Linear", 6, 24),),
        gradients=(GradParam("fc.weight", 4, "float32", 16), GradParam("fc.bias", 2, "float32", 8)),
        param_bytes=24,
        layer_flops={"fc": 96.0},
        layer_activation_bytes={"fc": 64},
        flops_per_step=96.0,
        optimizer_state_bytes=24,
        peak_kind="cpu_rss",
        warmup_steps=1,
        comm_backend="gloo",
    )
    profile = build_profile([_rank(1, 0.5, (0.02, 0.04)), _rank(0, 0.3, (0.04, 0.08))], facts)
    assert [r.rank for r in profile.ranks] == [0, 1]
    assert profile.layers[0].forward_s == pytest.approx(0.03)
    assert profile.layers[0].backward_s == pytest.approx(0.06)
    assert profile.steps.step.mean_s == pytest.approx(0.4)
    assert profile.steps.step.count == 8 and profile.steps.measured_steps == 4
    assert profile.grad_bytes == 24 and profile.memory.peak_bytes == 2000
    assert profile.communication is not None and profile.communication.backend == "gloo"
    assert profile.blocks[0].flops == 96.0
    assert Profile.from_dict(profile.to_dict()) == profile


def test_build_profile_needs_a_measurement() -> None:
    with pytest.raises(ValueError, match="at least one"):
        build_profile([], None)  # type: ignore[arg-type]


def test_self_time_subtracts_direct_sub_calls_only() -> None:
    # root(10) -> a(6) -> a.x(2), and root -> b(3); b is called again outside root (1).
    calls = [
        CallSpan("", -1, 10.0),
        CallSpan("a", 0, 6.0),
        CallSpan("a.x", 1, 2.0),
        CallSpan("b", 0, 3.0),
        CallSpan("b", -1, 1.0),
    ]
    assert exclusive_calls(calls) == {"": 1.0, "a": 4.0, "a.x": 2.0, "b": 4.0}


def test_nested_values_follow_paths_through_unmeasured_modules() -> None:
    # "a.seq" is not measured, so "a.seq.0" is a direct descendant of "a".
    inclusive = {"": 12.0, "a": 9.0, "a.seq.0": 4.0, "a.seq.1": 3.0, "b": 2.0}
    assert exclusive_nested(inclusive) == {
        "": 1.0, "a": 2.0, "a.seq.0": 4.0, "a.seq.1": 3.0, "b": 2.0
    }  # fmt: skip


def test_folding_moves_container_time_to_the_nearest_record() -> None:
    values = {"": 5.0, "body": 1.0, "body.0": 2.0, "head": 3.0}
    assert fold_into_records(values, ["body.0", "head"]) == {"body.0": 2.0, "head": 3.0}
    assert fold_into_records(values, ["", "body.0"]) == {"": 9.0, "body.0": 2.0}


def test_every_parameter_lands_in_exactly_one_record() -> None:
    owners = [
        ("enc.attn", 30, 120),  # MultiheadAttention's own in_proj
        ("enc.attn.out_proj", 10, 40),  # used by the attention's forward, never called
        ("head", 5, 20),
        ("", 1, 4),  # a parameter on the LightningModule itself
    ]
    totals, added = assign_parameters(owners, ["enc.attn", "head"])
    assert totals == {"enc.attn": (40, 160), "head": (5, 20), "": (1, 4)}
    assert added == ("",)
    assert sum(c for c, _ in totals.values()) == sum(n for _, n, _ in owners)


def test_blocks_descend_through_single_child_wrappers() -> None:
    records = ["model", "model.embedding", "model.tx.layers.0.attn", "model.tx.norm", "model.out"]
    assert block_names(records) == {
        "model": "model",
        "model.embedding": "model.embedding",
        "model.tx.layers.0.attn": "model.tx",
        "model.tx.norm": "model.tx",
        "model.out": "model.out",
    }
    assert block_names(["body.0", "body.2", "head"]) == {
        "body.0": "body", "body.2": "body", "head": "head"
    }  # fmt: skip


def test_hook_overhead_is_the_ratio_of_median_spans_and_never_above_one() -> None:
    hooked = [0.030, 0.025, 0.026, 0.090]  # one slow outlier: medians ignore it
    clean = [0.011, 0.009, 0.010]
    assert hook_overhead_scale(hooked, clean) == pytest.approx(0.010 / 0.028)
    # hooks only add time: a slower clean phase (noise, a clock change) scales nothing
    assert hook_overhead_scale([0.010], [0.012]) == 1.0
    assert hook_overhead_scale([], clean) == 1.0
    assert hook_overhead_scale(hooked, []) == 1.0


def test_removing_hook_overhead_shrinks_compute_and_keeps_waits_and_network() -> None:
    step = StepRecord(
        step_s=0.040, forward_s=0.012, backward_s=0.016, optimizer_s=0.004,
        data_wait_s=0.005, allreduce_s=0.006, exposed_comm_s=0.003,
    )  # fmt: skip
    bucket = Bucket(index=0, bytes=4096, num_params=2, ready_order=0,
                    ready_offset_s=0.008, allreduce_s=0.006)  # fmt: skip
    measured = RankMeasurement(
        rank=1, steps=(step,), layers={"fc": (0.010, 0.014)}, buckets=(bucket,),
        peak_memory_bytes=123,
    )  # fmt: skip
    half = without_hook_overhead(measured, 0.5)
    (s,) = half.steps
    # compute (step less data wait and exposed communication) halves: 0.032 -> 0.016
    assert s.step_s == pytest.approx(0.005 + 0.016 + 0.003)
    assert (s.forward_s, s.backward_s, s.optimizer_s) == pytest.approx((0.006, 0.008, 0.002))
    assert (s.data_wait_s, s.allreduce_s, s.exposed_comm_s) == (0.005, 0.006, 0.003)
    assert half.layers["fc"] == pytest.approx((0.005, 0.007))
    assert half.buckets[0].ready_offset_s == pytest.approx(0.004)
    assert half.buckets[0].allreduce_s == 0.006
    assert (half.rank, half.peak_memory_bytes) == (1, 123)
    assert without_hook_overhead(measured, 1.0) is measured


def test_a_phase_of_tiny_steps_grows_tenfold_when_it_spans_too_little_time() -> None:
    # 3 steps of 2 ms and one 40 ms outlier span 44 ms, less than 0.1 s: 30 steps in all
    assert MAX_EXTENSION_FACTOR == 10
    assert steps_to_cover([0.002, 0.040, 0.002], 0.1, room=1000) == 30 - 3
    # 20 steps of 2 ms: 200 in all, whatever the exact time each took (the same decision
    # from launch to launch)
    assert steps_to_cover([0.002] * 20, 0.1, room=1000) == 200 - 20
    assert steps_to_cover([0.004] * 20, 0.1, room=1000) == 200 - 20


def test_a_phase_never_grows_past_its_room_nor_when_it_is_long_enough() -> None:
    assert steps_to_cover([0.002] * 20, 0.1, room=7) == 7
    assert steps_to_cover([0.002] * 20, 0.1, room=-3) == 0
    assert steps_to_cover([0.05] * 3, 0.1, room=1000) == 0  # 150 ms already
    assert steps_to_cover([0.002] * 20, 0.0, room=1000) == 0  # the floor turned off
    assert steps_to_cover([], 0.1, room=1000) == 0
    assert steps_to_cover([0.002] * 20, 0.1, room=float("inf")) == 180
