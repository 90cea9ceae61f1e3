"""Pure accumulators: means, bucket ready order, merging ranks into one profile."""

from __future__ import annotations

import pytest

from lightning_srifty.capture.timing import (
    BucketAccumulator,
    BucketEvent,
    LayerAccumulator,
    LayerInfo,
    ModelFacts,
    RankMeasurement,
    StepRecord,
    build_profile,
)
from lightning_srifty.core.profile import Environment, GradParam, Profile

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
