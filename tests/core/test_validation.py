"""Validation passes in the plan: priced per training batch, paced like the job's compute."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from lightning_srifty.core.cluster import Cluster, ClusterGroup
from lightning_srifty.core.lognormal import mean_factor, step_sigma
from lightning_srifty.core.planner import PlanRequest, plan_pinned
from lightning_srifty.core.validation import validation_cost
from tests.core.test_planner import MODEL, make_profile, small_catalog

# 100 batches of 50 ms a pass, every 1000 training batches, on the profile's one T4
PASS = {
    "batches_per_pass": 100,
    "train_batches_between": 1000.0,
    "per_epoch": True,
    "world_size": 1,
    "timed_batches": 1,
    "batch_s": 0.05,
}
PER_BATCH_S = 0.05 * 100 / 1000


def _cluster(index: int, nodes: int = 1) -> Cluster:
    o = small_catalog()[index]
    return Cluster((ClusterGroup(o, nodes, o.accelerator_count),))


def test_on_the_profiled_gpu_a_pass_costs_what_the_profile_timed_per_batch() -> None:
    pred = MODEL.predict(make_profile(validation=PASS), _cluster(0), local_batch=32)
    assert pred.validation_s == pytest.approx(PER_BATCH_S)
    plain = MODEL.predict(make_profile(), _cluster(0), local_batch=32)
    assert plain.validation_s == 0.0
    assert pred.step_s == plain.step_s  # the step leaves validation out


def test_a_pass_runs_at_the_pace_of_the_candidates_compute() -> None:
    """A faster GPU runs its forward passes faster too; links play no part."""
    profile = make_profile(validation=PASS)
    t4 = MODEL.predict(profile, _cluster(0), local_batch=32)
    a10g = MODEL.predict(profile, _cluster(4), local_batch=32)
    assert a10g.compute_s < t4.compute_s
    assert a10g.validation_s / t4.validation_s == pytest.approx(a10g.compute_s / t4.compute_s)


def test_more_processes_shard_the_pass_and_an_epochs_period_shrinks_with_it() -> None:
    """Four processes run a quarter of the pass each; a period that is a share of the
    epoch comes four times as often (the epoch has a quarter of the batches), a period
    in training batches does not. A pass is paced by the co-located GPUs' compute, not
    by a synchronous step's slowest process (nothing waits per batch)."""
    by_epoch = make_profile(validation=PASS)
    by_batches = make_profile(validation={**PASS, "per_epoch": False})
    one = [MODEL.predict(p, _cluster(0), local_batch=32) for p in (by_epoch, by_batches)]
    four = [MODEL.predict(p, _cluster(2), local_batch=32) for p in (by_epoch, by_batches)]
    assert one[0].validation_s == one[1].validation_s
    assert four[1].validation_s == pytest.approx(four[0].validation_s / 4)
    pace = four[0].compute_s / one[0].compute_s
    assert one[0].validation_s <= four[0].validation_s < one[0].validation_s * pace


def test_a_passs_own_cost_is_host_time_and_does_not_follow_the_gpu() -> None:
    """Starting a pass's loader and its epoch-end logging run on the host: 0.2 s a pass
    every 1000 batches is 0.2 ms a batch on any GPU, beside the batches' own time."""
    with_overhead = make_profile(validation={**PASS, "pass_overhead_s": 0.2})
    for index in (0, 4):  # the profiled T4 and a faster A10G
        plain = MODEL.predict(make_profile(validation=PASS), _cluster(index), local_batch=32)
        pred = MODEL.predict(with_overhead, _cluster(index), local_batch=32)
        assert pred.validation_s - plain.validation_s == pytest.approx(0.2 / 1000)


def test_an_untimed_pass_takes_the_windows_forward_time() -> None:
    """No sanity check and no pass before the profile: a training batch's forward is
    the nearest measurement of a validation batch."""
    profile = make_profile(validation={**PASS, "timed_batches": 0, "batch_s": None})
    profile = replace(profile, steps=replace(profile.steps, forward_s=0.03))
    cost = validation_cost(profile)
    assert cost is not None and not cost.timed
    assert cost.batch_s == 0.03


@pytest.mark.parametrize(
    "record",
    [
        "yes",
        {**PASS, "batches_per_pass": 0},
        {**PASS, "train_batches_between": math.inf},
        {**PASS, "world_size": "two"},
    ],
)
def test_an_unreadable_record_prices_no_validation(record: object) -> None:
    assert validation_cost(make_profile(validation=record)) is None


def test_the_plans_time_and_cost_include_the_passes_and_its_step_does_not() -> None:
    request = PlanRequest(target_steps=20_000, allow_spot=False)
    pinned = (("g4dn.xlarge", 1),)
    plain = plan_pinned(make_profile(), small_catalog(), MODEL, request, pinned).best
    passes = plan_pinned(make_profile(validation=PASS), small_catalog(), MODEL, request, pinned)
    best = passes.best
    assert best.step_s == plain.step_s and plain.validation_s == 0.0
    assert best.validation_s == pytest.approx(PER_BATCH_S)
    paced = best.step_s + best.validation_s
    spread = step_sigma(paced, best.step_low_s + best.validation_s,
                        best.step_high_s + best.validation_s)  # fmt: skip
    expected_h = best.steps_to_target * paced * float(mean_factor(spread)) / 3600.0
    assert best.time_to_target_h == pytest.approx(expected_h)
    assert best.cost_usd == pytest.approx(best.time_to_target_h * best.hourly_usd)
    assert best.time_to_target_h > plain.time_to_target_h + 20_000 * PER_BATCH_S / 3600 * 0.9
