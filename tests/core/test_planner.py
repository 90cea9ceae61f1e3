"""The planner against a brute-force oracle, spot risk against simulation, the front."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_srifty.core.calibration import Calibration, PhysicsConstants
from lightning_srifty.core.catalog import GpuSpec, Offer, band_hourly_rate
from lightning_srifty.core.cluster import Cluster, ClusterGroup, Plan
from lightning_srifty.core.errors import (
    ConfigError,
    InfeasibleError,
    PredictionError,
    ScriptLimitsReachedError,
)
from lightning_srifty.core.perfmodel import PerformanceModel, Prediction
from lightning_srifty.core.planner import (
    PlanRequest,
    _pareto_exact,
    deadline_probability,
    default_checkpoint_s,
    estimate_step_seconds,
    knee_index,
    on_shared_cores,
    pareto_front,
    parse_pinned,
    plan,
    plan_pinned,
    profile_blocked_share,
    profile_core_share,
    result_to_dict,
    spot_expectations,
    young_daly_interval_h,
)
from lightning_srifty.core.profile import (
    BatchPoint,
    DataLoading,
    Environment,
    LayerTiming,
    Memory,
    Profile,
    Spread,
    StatEfficiency,
    StepTimes,
)
from lightning_srifty.core.script_trainer import ScriptTrainer
from lightning_srifty.core.spot import young_daly_interval
from lightning_srifty.core.stateff import steps_to_target

GIB = 1024**3
# Published peaks (NVIDIA T4 and A10G data sheets).
SPECS = {
    "T4": GpuSpec("T4", 8.1, 8.1, 65.0, 320.0, 16.0, "NVIDIA T4 datasheet"),
    "A10G": GpuSpec("A10G", 31.2, 62.5, 125.0, 600.0, 24.0, "NVIDIA A10 datasheet"),
}


def make_profile(
    *, param_bytes: int = 100 * 1024**2, stat: StatEfficiency | None = None, **extra: object
) -> Profile:
    """A coarse single-T4 profile: 0.02 s + 2 ms per sample, local batch 32."""
    points = tuple(BatchPoint(b, 0.02 + 0.002 * b, 0.02 + 0.002 * b) for b in (16, 32, 64))
    return Profile(
        kind="coarse",
        environment=Environment(
            device_name="NVIDIA T4",
            accelerator="T4",
            devices_per_node=1,
            world_size=1,
            num_nodes=1,
            precision="32-true",
            local_batch_size=32,
            torch_version="",
            lightning_version="",
        ),
        steps=StepTimes(Spread(0.084, 0.084, 0.09, 50), 0.0, 0.0, 0.0, 0.0, 0, 50),
        grad_bytes=param_bytes,
        flops_per_step=0.0,
        memory=Memory(param_bytes, param_bytes, 2 * param_bytes, 0, 0, "unknown"),
        batch_points=points,
        stat_efficiency=stat,
        model_name="toy",
        extra=dict(extra),
    )


def offer(
    itype: str,
    acc: str,
    count: int,
    mem: float,
    region: str,
    zone: str,
    od: float | None,
    spot: float | None,
    band: int | None = 1,
) -> Offer:
    link = "none" if count == 1 else "PCIe"
    gbps = 50.0 if count > 1 else 25.0
    return Offer(itype, acc, count, mem, 4.0 * count, 16.0 * count, region, zone, od, spot,
                 link, gbps, band)  # fmt: skip


def small_catalog() -> list[Offer]:
    """A handful of real-looking offers: zones with different spot prices, a type with
    no spot market, and a non-GPU accelerator that is cheap."""
    return [
        offer("g4dn.xlarge", "T4", 1, 16, "us-east-1", "use1-az1", 0.526, 0.21, 0),
        offer("g4dn.xlarge", "T4", 1, 16, "us-east-1", "use1-az2", 0.526, 0.16, 2),
        offer("g4dn.12xlarge", "T4", 4, 16, "us-east-1", "use1-az1", 3.912, 1.40, 1),
        offer("g4dn.12xlarge", "T4", 4, 16, "us-west-2", "usw2-az1", 3.912, 1.10, 3),
        offer("g5.xlarge", "A10G", 1, 24, "us-east-1", "use1-az2", 1.006, None),
        offer("g5.xlarge", "A10G", 1, 24, "us-west-2", "usw2-az3", 1.006, 0.45, 4),
        offer("g5.12xlarge", "A10G", 4, 24, "us-west-2", "usw2-az3", 5.672, 2.10, 1),
        offer("inf2.xlarge", "Inferentia2", 1, 32, "us-east-1", "use1-az1", 0.758, 0.05, 0),
    ]


MODEL = PerformanceModel(SPECS)
SPLITS = (1, 2)


def oracle(
    profile: Profile, offers: list[Offer], request: PlanRequest
) -> list[tuple[float, float, float, str, bool]]:
    """Every cluster of the search space, one ``PerformanceModel.predict`` call each.

    Loops over every zone (no dedupe), every market and node count, and every pair of
    types in a region; returns (cost, time, probability, description, spot) rows. Every
    process runs the profile's own batch, as Lightning's DDP does, and the target's
    samples stay the same: ``ceil(steps·W0/W)`` steps on ``W`` GPUs.
    """
    profiled_world = profile.environment.world_size
    ckpt_h = default_checkpoint_s(profile) / 3600
    gpu_offers = [o for o in offers if o.accelerator in SPECS]
    clusters: list[tuple[Cluster, bool]] = []
    for spot in (False, True):
        priced = [o for o in gpu_offers if o.price(spot) is not None]
        for o in priced:
            for n in range(1, request.max_nodes + 1):
                clusters.append((Cluster((ClusterGroup(o, n, o.accelerator_count),)), spot))
        for a, b in itertools.combinations(priced, 2):
            if a.region != b.region or a.instance_type == b.instance_type:
                continue
            for na, nb in itertools.product(SPLITS, SPLITS):
                if na + nb <= request.max_nodes:
                    groups = (
                        ClusterGroup(a, na, a.accelerator_count),
                        ClusterGroup(b, nb, b.accelerator_count),
                    )
                    clusters.append((Cluster(groups), spot))
    rows = []
    for cluster, spot in clusters:
        try:
            pred = MODEL.predict(profile, cluster, local_batch=profile.environment.local_batch_size)
        except PredictionError:
            continue
        assert request.target_steps is not None
        steps = math.ceil(request.target_steps * profiled_world / cluster.world_size)
        # The step is log-normal: time and cost at its mean, the odds over its spread.
        sigma = math.log(pred.high_s / pred.low_s) / (2 * 1.2816)
        work_h = steps * pred.step_s / 3600
        rate = sum(g.nodes * band_hourly_rate(g.offer.interruption_band) for g in cluster.groups)
        args = (np.array([rate if spot else 0.0]), ckpt_h, request.restart_delay_h,
                request.deadline_h)  # fmt: skip
        mean = spot_expectations(np.array([work_h * math.exp(sigma**2 / 2)]), *args)
        odds = spot_expectations(np.array([work_h]), *args, sigma=np.array([sigma]))
        hourly = cluster.hourly_price(spot)
        assert hourly is not None
        rows.append((
            hourly * float(mean.billed_h[0]), float(mean.time_h[0]),
            float(odds.deadline_probability[0]), cluster.describe(), spot,
        ))  # fmt: skip
    return rows


@pytest.mark.parametrize(
    ("objective", "deadline_h", "budget"),
    [("cost", None, None), ("cost", 0.9, None), ("time", None, 3.0), ("time", None, None)],
)
def test_planner_finds_the_brute_force_optimum(
    objective: str, deadline_h: float | None, budget: float | None
) -> None:
    profile = make_profile()
    request = PlanRequest(
        target_steps=20_000, deadline_h=deadline_h, budget_usd=budget, objective=objective,
        max_nodes=4, mix_node_counts=SPLITS, min_deadline_probability=0.5,
    )  # fmt: skip
    rows = oracle(profile, small_catalog(), request)
    feasible = [
        r for r in rows
        if (deadline_h is None or (r[1] <= deadline_h and r[2] >= 0.5))
        and (budget is None or r[0] <= budget)
    ]  # fmt: skip
    assert feasible, "the oracle space must contain a feasible plan"
    key = (lambda r: (r[0], r[1])) if objective == "cost" else (lambda r: (r[1], r[0]))
    truth = min(feasible, key=key)
    best = plan(profile, small_catalog(), MODEL, request).best
    assert best.cost_usd == pytest.approx(truth[0], rel=1e-9)
    assert best.time_to_target_h == pytest.approx(truth[1], rel=1e-9)
    assert (best.cluster.describe(), best.use_spot) == (truth[3], truth[4])


def test_plans_keep_the_cheapest_zone_and_never_use_non_gpu_or_missing_spot() -> None:
    request = PlanRequest(target_steps=5_000, max_nodes=2, top_k=50)
    result = plan(make_profile(), small_catalog(), MODEL, request)
    for p in result.plans:
        for g in p.cluster.groups:
            assert g.offer.accelerator != "Inferentia2"
            if p.use_spot:
                assert g.offer.spot_price is not None
            if g.offer.instance_type == "g4dn.xlarge" and p.use_spot:
                assert g.offer.zone == "use1-az2"  # $0.16 beats $0.21 in use1-az1
    spot_g5 = [p for p in result.plans if p.use_spot and "g5.xlarge" in p.cluster.describe()]
    assert all(g.offer.region == "us-west-2" for p in spot_g5 for g in p.cluster.groups)


def test_limits_regions_families_and_gpus_are_respected() -> None:
    request = PlanRequest(
        target_steps=5_000, regions=("us-west-2",), exclude_families=("g5",), max_gpus=4,
        top_k=50,
    )  # fmt: skip
    result = plan(make_profile(), small_catalog(), MODEL, request)
    for p in result.plans:
        assert p.cluster.world_size <= 4
        assert all(g.offer.region == "us-west-2" for g in p.cluster.groups)
        assert all(g.offer.family != "g5" for g in p.cluster.groups)
    only_g5 = plan(make_profile(), small_catalog(), MODEL, replace(request, exclude_families=(),
                   families=("g5",)))  # fmt: skip
    assert all(g.offer.family == "g5" for p in only_g5.plans for g in p.cluster.groups)


def test_memory_filter_keeps_only_gpus_that_hold_the_model() -> None:
    # 3.8 GiB params -> 15.2 GiB with grads and Adam state: over 92% of a T4's 16 GiB,
    # within an A10G's 24 GiB.
    big = make_profile(param_bytes=int(3.8 * GIB))
    result = plan(big, small_catalog(), MODEL, PlanRequest(target_steps=1_000, top_k=50))
    assert result.plans
    assert all(g.offer.accelerator == "A10G" for p in result.plans for g in p.cluster.groups)
    huge = make_profile(param_bytes=6 * GIB)
    with pytest.raises(InfeasibleError, match="fits the model in GPU memory"):
        plan(huge, small_catalog(), MODEL, PlanRequest(target_steps=1_000))


def test_infeasible_deadline_and_budget_say_what_is_achievable() -> None:
    profile = make_profile()
    fastest = plan(profile, small_catalog(), MODEL, PlanRequest(target_steps=50_000,
                   objective="time")).best  # fmt: skip
    with pytest.raises(InfeasibleError) as err:
        plan(profile, small_catalog(), MODEL,
             PlanRequest(target_steps=50_000, deadline_h=fastest.time_to_target_h / 2))  # fmt: skip
    assert f"the fastest plan needs {fastest.time_to_target_h:.1f} h > deadline" in str(err.value)
    deadline = fastest.time_to_target_h * 3
    cheapest = plan(profile, small_catalog(), MODEL,
                    PlanRequest(target_steps=50_000, deadline_h=deadline)).best  # fmt: skip
    tight = PlanRequest(target_steps=50_000, deadline_h=deadline, budget_usd=cheapest.cost_usd / 2)
    with pytest.raises(InfeasibleError) as err:
        plan(profile, small_catalog(), MODEL, tight)
    assert f"costs ${cheapest.cost_usd:,.2f} > budget" in str(err.value)


def test_baselines_are_the_cheapest_hourly_and_fastest_single_node() -> None:
    profile = make_profile()
    result = plan(profile, small_catalog(), MODEL, PlanRequest(target_steps=10_000))
    labels = [b.label for b in result.baselines]
    assert labels[0].startswith("cheapest $/h")
    cheapest = result.baselines[0]
    singles = [o for o in small_catalog() if o.accelerator in SPECS and o.ondemand_price]
    assert cheapest.hourly_usd == min(o.ondemand_price or 0 for o in singles)
    assert cheapest.cluster.nodes == 1 and not cheapest.use_spot
    fastest = result.baselines[1]
    # fastest by the expected step (the mean of its log-normal), as the plans are timed
    step_of = {o.instance_type: estimate_step_seconds(MODEL, profile, o, 1) for o in singles}
    assert fastest.step_mean_s == pytest.approx(min(step_of.values()))
    on_demand = result.baselines[2]
    assert not on_demand.use_spot and on_demand.cost_usd >= result.best.cost_usd


def test_a_plan_whose_step_the_loader_sets_says_what_would_shorten_it() -> None:
    layer = LayerTiming("l", "b", "Linear", 0.02, 0.04, 10, 40, flops=1e11, activation_bytes=1)
    detailed = replace(make_profile(), kind="detailed", layers=(layer,))
    request = PlanRequest(target_steps=10_000, objective="time")
    assert not any("loader" in n for n in plan(detailed, small_catalog(), MODEL, request).notes)
    # 4 workers spend 0.6 CPU-s a batch of 32: with the offers' 4 vCPUs per GPU no step
    # beats 0.15 s, where the T4 alone takes 0.084 s
    loaded = replace(detailed, data_loading=DataLoading(4, 0.6, 40))
    result = plan(loaded, small_catalog(), MODEL, request)
    assert result.best.step_s >= 0.15
    [note] = [n for n in result.notes if "loader" in n]
    assert "4 worker(s)" in note and "18.8 ms of CPU a sample" in note
    assert f"more vCPUs per GPU than {result.best.cluster.groups[0].offer.instance_type}" in note


def test_estimate_step_seconds_is_the_models_mean_step_and_inf_when_it_cannot_run() -> None:
    profile = make_profile()
    o = small_catalog()[2]
    cluster = Cluster((ClusterGroup(o, 2, 4),))
    pred = MODEL.predict(profile, cluster, local_batch=32)
    # the mean of the step's log-normal: what the planner prices the plan at
    sigma = math.log(pred.high_s / pred.low_s) / (2 * 1.2816)
    expected = pred.step_s * math.exp(sigma**2 / 2)
    assert estimate_step_seconds(MODEL, profile, o, 2) == pytest.approx(expected)
    # More GPUs than the profile's batch has samples: every GPU still runs 32.
    assert math.isfinite(estimate_step_seconds(MODEL, profile, o, 16))
    assert estimate_step_seconds(MODEL, profile, small_catalog()[-1], 1) == math.inf
    too_big = make_profile(param_bytes=8 * GIB)  # params, grads, 2x Adam state > 16 GiB
    assert estimate_step_seconds(MODEL, too_big, o, 1) == math.inf


def test_every_plan_runs_the_profiled_batch_on_each_process_and_keeps_the_samples() -> None:
    """What Lightning's DDP runs: the script's batch per process, the global batch grows."""
    profile = make_profile()
    result = plan(profile, small_catalog(), MODEL, PlanRequest(target_steps=10_000, top_k=30))
    assert {p.per_process_batch for p in result.plans} == {32}
    assert any(p.cluster.world_size > 1 for p in result.plans)
    for p in result.plans:
        assert p.global_batch == 32 * p.cluster.world_size
        samples = p.steps_to_target * p.global_batch
        assert 10_000 * 32 <= samples < 10_000 * 32 + p.global_batch
        single = MODEL.predict(profile, p.cluster, local_batch=32)
        assert p.step_s == pytest.approx(single.step_s)
    doc = result_to_dict(result, PlanRequest(target_steps=10_000))
    assert doc["per_process_batch"] == 32 and doc["base_global_batch"] == 32


def test_a_profile_on_two_processes_counts_its_target_at_that_scale() -> None:
    base = make_profile()
    two = replace(base, environment=replace(base.environment, world_size=2, devices_per_node=2))
    result = plan(two, small_catalog(), MODEL, PlanRequest(target_steps=1_000, top_k=30))
    for p in result.plans:
        # 1,000 steps of 2 x 32 samples, whatever the cluster.
        assert p.steps_to_target == math.ceil(1_000 * 2 / p.cluster.world_size)


def test_stat_efficiency_grows_the_batch_and_rescales_steps() -> None:
    stat = StatEfficiency(grad_sqr=1.0, grad_var=200.0, batch_size=32)  # B_noise = 200
    profile = make_profile(stat=stat)
    result = plan(profile, small_catalog(), MODEL, PlanRequest(target_steps=10_000, top_k=30))
    assert result.batch.noise_scale == pytest.approx(200.0)
    grown = [p for p in result.plans if p.cluster.world_size > 1]
    assert grown
    for p in grown:
        assert p.global_batch == 32 * p.cluster.world_size
        expected = math.ceil(float(steps_to_target(10_000, 32, p.global_batch, 200.0)))
        assert p.steps_to_target == expected
        assert expected > 10_000 * 32 / p.global_batch  # sub-linear: more samples needed


def test_epochs_need_a_dataset_size_and_use_the_profile_extra() -> None:
    with pytest.raises(ConfigError, match="--dataset-size"):
        plan(make_profile(), small_catalog(), MODEL, PlanRequest(epochs=2.0))
    result = plan(make_profile(dataset_size=50_000), small_catalog(), MODEL,
                  PlanRequest(epochs=2.0))  # fmt: skip
    assert result.target_steps_at_base == math.ceil(2.0 * 50_000 / 32)
    best = result.best
    assert best.steps_to_target == math.ceil(result.target_steps_at_base / best.cluster.world_size)


def test_steps_are_batches_under_gradient_accumulation() -> None:
    """A step is one batch of the loop; the model prices an update of two batches."""
    base = make_profile(dataset_size=50_000)
    env = replace(base.environment, accumulate_grad_batches=2)
    accumulated = replace(base, environment=env)
    result = plan(accumulated, small_catalog(), MODEL, PlanRequest(epochs=2.0))
    assert result.target_steps_at_base == math.ceil(2.0 * 50_000 / 32)
    assert result.batch.base_global_batch == 32 and result.batch.batches_per_update == 2
    pinned = plan_pinned(
        accumulated, small_catalog(), MODEL, PlanRequest(epochs=2.0), [("g4dn.xlarge", 1)]
    ).best
    update = MODEL.predict(accumulated, pinned.cluster).step_s  # 64 samples per update
    assert pinned.step_s == pytest.approx(update / 2)
    assert pinned.per_process_batch == 32


def test_the_scripts_own_devices_and_num_nodes_bound_the_search() -> None:
    profile = make_profile()
    request = PlanRequest(target_steps=10_000, top_k=50, gpus_per_node=2)
    result = plan(profile, small_catalog(), MODEL, request)
    for p in result.plans:
        assert all(g.gpus_per_node == 2 for g in p.cluster.groups)
        assert all(g.offer.accelerator_count >= 2 for g in p.cluster.groups)
        assert "(2 GPU/node)" in p.cluster.describe()
    exact = plan(profile, small_catalog(), MODEL, replace(request, num_nodes=2, top_k=50))
    assert exact.plans and all(p.cluster.nodes == 2 for p in exact.plans)
    with pytest.raises(InfeasibleError, match="no candidate"):
        plan(profile, small_catalog(), MODEL, replace(request, gpus_per_node=8))


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"target_steps": 0}, {"target_steps": 5, "objective": "fast"},
     {"target_steps": 5, "max_nodes": 0}, {"target_steps": 5, "allow_spot": False,
      "allow_ondemand": False}],
)  # fmt: skip
def test_bad_requests_are_config_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        PlanRequest(**kwargs)  # type: ignore[arg-type]


def test_json_document_is_versioned_and_lists_baselines_and_front() -> None:
    request = PlanRequest(target_steps=10_000, objective="knee")
    result = plan(make_profile(), small_catalog(), MODEL, request)
    doc = result_to_dict(result, request)
    assert doc["schema_version"] == 1
    assert doc["plans"][0]["rank"] == 1
    front = [(f["time_h"], f["cost_usd"]) for f in doc["pareto_front"]]
    assert (result.best.time_to_target_h, result.best.cost_usd) in front
    times = [t for t, _ in front]
    costs = [c for _, c in front]
    assert times == sorted(times) and costs == sorted(costs, reverse=True)


def _with_limits(profile: Profile, **limits: object) -> Profile:
    """``profile`` with the Trainer limits ``SriftyCallback`` records in ``extra["trainer"]``."""
    return replace(profile, extra={**profile.extra, "trainer": dict(limits)})


def _by_shape(result_plans: tuple[Plan, ...] | list[Plan]) -> dict[tuple[str, bool], Plan]:
    return {(p.cluster.describe(), p.use_spot): p for p in result_plans}


def test_a_scripts_max_steps_prices_each_run_to_its_stop_and_prefers_runs_that_reach() -> None:
    """max_steps=500 with a 2,000-step target: one GPU stops at 500, four or more reach the
    target (500 steps of 4x the samples). Time and cost are linear in the work, so the
    one-GPU run costs a quarter of its unlimited price; plans that reach rank first."""
    free_profile = make_profile()
    limited = _with_limits(
        free_profile, max_steps=500, automatic_optimization=True,
        batches_per_epoch=1_000_000, world_size=1,
    )  # fmt: skip
    request = ScriptTrainer.of(limited).constrain(PlanRequest(target_steps=2_000, top_k=50))
    assert request.script_stop is not None
    result = plan(limited, small_catalog(), MODEL, request)
    free = plan(free_profile, small_catalog(), MODEL, PlanRequest(target_steps=2_000, top_k=50))
    assert free.best.cluster.world_size < 4  # without the stop a small cluster wins
    assert result.plans and all(p.cluster.world_size >= 4 for p in result.plans)
    assert all(p.stops_at_step is None for p in result.plans)
    assert any("end some runs before the target" in note for note in result.notes)
    stopped = {b.label: b for b in result.baselines}["cheapest $/h that fits (SkyPilot default)"]
    unlimited = {b.label: b for b in free.baselines}["cheapest $/h that fits (SkyPilot default)"]
    assert stopped.cluster.world_size == 1 and stopped.stops_at_step == 500
    assert stopped.stopped_by == "max_steps=500" and stopped.steps_to_target == 2_000
    assert stopped.cost_usd == pytest.approx(unlimited.cost_usd * 500 / 2_000)
    assert stopped.time_to_target_h == pytest.approx(unlimited.time_to_target_h * 500 / 2_000)
    doc = result_to_dict(result, request)
    assert {d["stops_at_step"] for d in doc["plans"]} == {None}


def test_a_scripts_max_time_ends_every_run_at_it_and_ranks_by_the_work_each_buys() -> None:
    """max_time of 10 min against a target no plan reaches in it: every on-demand run
    trains for 10 minutes (at its mean step) and bills that; the plans are ranked by
    cost per whole target, so the pick is the unlimited run's pick."""
    free_profile = make_profile()
    limited = _with_limits(free_profile, max_time_s=600.0, world_size=1)
    request = ScriptTrainer.of(limited).constrain(
        PlanRequest(target_steps=10_000_000, top_k=50, allow_spot=False)
    )
    result = plan(limited, small_catalog(), MODEL, request)
    free = plan(free_profile, small_catalog(), MODEL, replace(request, script_stop=None))
    assert _by_shape([result.best]).keys() == _by_shape([free.best]).keys()
    unlimited = _by_shape(free.plans)
    for p in result.plans:
        assert p.stopped_by == "max_time=0:10:00" and p.stops_at_step is not None
        whole = unlimited[(p.cluster.describe(), p.use_spot)]
        mean_batch_s = whole.time_to_target_h * 3600 / whole.steps_to_target
        assert p.stops_at_step == math.floor(600.0 / mean_batch_s)
        assert 0.0 <= 600.0 - p.time_to_target_h * 3600 < mean_batch_s + 1e-6
        assert p.cost_usd == pytest.approx(p.hourly_usd * p.time_to_target_h)
    assert any("end every run before the target" in note for note in result.notes)


def test_a_run_priced_part_way_is_stopped_by_the_limits_left() -> None:
    """At step 400 of a script with max_steps=500, the 1,600 steps left on one GPU stop
    after 100: priced at 100 steps' time, what the resumed run trains."""
    free_profile = make_profile()
    limited = _with_limits(free_profile, max_steps=500, automatic_optimization=False)
    stop = ScriptTrainer.of(limited).stop
    assert stop is not None
    request = PlanRequest(target_steps=1_600, top_k=50, script_stop=stop.after(400, 0.0))
    pinned = plan_pinned(limited, small_catalog(), MODEL, request, [("g4dn.xlarge", 1)])
    free = plan_pinned(
        free_profile, small_catalog(), MODEL, replace(request, script_stop=None),
        [("g4dn.xlarge", 1)],
    )  # fmt: skip
    best, whole = (
        pinned.best,
        _by_shape(free.plans)[(pinned.best.cluster.describe(), pinned.best.use_spot)],
    )
    assert best.stops_at_step == 100 and best.steps_to_target == 1_600
    assert best.cost_usd == pytest.approx(whole.cost_usd * 100 / 1_600)


def test_limits_spent_where_the_run_stands_are_named_not_read_as_no_fitting_gpu() -> None:
    """A run resumed after 25 s of a 25 s max_time trains nothing on any cluster: the
    planner says which limit, from where, and not that no GPU fits the model."""
    limited = _with_limits(make_profile(), max_time_s=25.0, time_elapsed_s=2.0)
    stop = ScriptTrainer.of(limited).stop
    assert stop is not None
    spent = PlanRequest(target_steps=5_000, script_stop=stop.after(630, 25.0))
    for search in (
        lambda: plan(limited, small_catalog(), MODEL, spent),
        lambda: plan_pinned(limited, small_catalog(), MODEL, spent, [("g4dn.xlarge", 1)]),
    ):
        with pytest.raises(ScriptLimitsReachedError, match=r"max_time=0:00:25.*step 630"):
            search()
    almost = replace(spent, script_stop=stop.after(630, 24.0))  # one second left: plans
    assert plan(limited, small_catalog(), MODEL, almost).best.stopped_by == "max_time=0:00:25"


def test_a_profile_without_recorded_limits_stops_no_run() -> None:
    """A script without recorded limits plans as before: nothing is stopped."""
    request = ScriptTrainer.of(make_profile()).constrain(PlanRequest(target_steps=2_000))
    assert request.script_stop is None
    result = plan(make_profile(), small_catalog(), MODEL, request)
    assert all(p.stops_at_step is None and p.stopped_by == "" for p in result.plans)


# ----------------------------------------------------------------------- spot risk


def test_young_daly_matches_spot_module() -> None:
    got = young_daly_interval_h(np.array([0.02]), np.array([50.0]))
    assert float(got[0]) == pytest.approx(young_daly_interval(0.02, 50.0))


def test_spot_expectations_without_risk_is_on_demand() -> None:
    out = spot_expectations(np.array([3.0, 5.0]), np.array([0.0, 0.0]), 0.01, 0.1, 4.0)
    assert out.time_h.tolist() == [3.0, 5.0]
    assert out.deadline_probability.tolist() == [1.0, 0.0]
    assert out.preemptions.tolist() == [0.0, 0.0]


def _simulate(work: float, rate: float, ckpt: float, restart: float, tau: float,
              runs: int, rng: np.random.Generator) -> np.ndarray:  # fmt: skip
    """Wall times of runs that checkpoint every ``tau`` of work and restart on preemption."""
    times = np.empty(runs)
    for r in range(runs):
        done = clock = 0.0
        next_fail = rng.exponential(1 / rate)  # running time until the next preemption
        while done < work - 1e-12:
            segment = min(tau, work - done)
            need = segment + (ckpt if done + segment < work - 1e-12 else 0.0)
            if next_fail >= need:
                clock += need
                next_fail -= need
                done += segment
            else:
                clock += next_fail + restart
                next_fail = rng.exponential(1 / rate)
        times[r] = clock
    return times


def test_spot_expectations_agree_with_a_simulated_preemption_process() -> None:
    work, rate, ckpt, restart, deadline = 10.0, 0.2, 0.05, 0.1, 11.0
    out = spot_expectations(np.array([work]), np.array([rate]), ckpt, restart, deadline)
    tau = float(out.interval_h[0])
    times = _simulate(work, rate, ckpt, restart, tau, 4000, np.random.default_rng(7))
    assert float(out.time_h[0]) == pytest.approx(times.mean(), rel=0.03)
    assert float(out.deadline_probability[0]) == pytest.approx(np.mean(times <= deadline), abs=0.06)


@pytest.mark.parametrize(
    ("slack", "mean", "tau", "restart", "tolerance"),
    [(0.3, 0.5, 0.6, 0.1, 0.01), (1.0, 3.0, 0.5, 0.08, 0.01), (4.0, 12.0, 0.4, 0.2, 0.01),
     (25.0, 60.0, 0.5, 0.1, 0.03)],
)  # fmt: skip
def test_deadline_probability_matches_sampled_compound_poisson(
    slack: float, mean: float, tau: float, restart: float, tolerance: float
) -> None:
    rng = np.random.default_rng(11)
    k = rng.poisson(mean, 40_000)
    lost = rng.uniform(0, tau, int(k.sum()))
    delay = k * restart + np.bincount(np.repeat(np.arange(k.size), k), lost, k.size)
    sampled = float(np.mean(delay <= slack))
    got = deadline_probability(np.array([slack]), np.array([mean]), np.array([tau]), restart)
    assert float(got[0]) == pytest.approx(sampled, abs=tolerance + 0.01)


def test_deadline_probability_edges() -> None:
    got = deadline_probability(
        np.array([-0.1, 0.0, 2.0]), np.array([1.0, 0.0, 0.0]), np.array([0.5, np.inf, np.inf]),
        0.1,
    )  # fmt: skip
    assert got.tolist() == [0.0, 1.0, 1.0]


# ------------------------------------------------------------------------- Pareto


def _brute_front(points: list[tuple[float, float]]) -> list[bool]:
    def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
        return a[0] <= b[0] and a[1] <= b[1] and (a[0] < b[0] or a[1] < b[1])

    return [not any(dominates(q, p) for q in points) for p in points]


coords = st.integers(0, 12).map(float) | st.floats(0.0, 100.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(coords, coords), min_size=1, max_size=60))
def test_pareto_front_is_exactly_the_non_dominated_set(points: list[tuple[float, float]]) -> None:
    t = np.array([p[0] for p in points])
    c = np.array([p[1] for p in points])
    assert pareto_front(t, c).tolist() == _brute_front(points)


def test_pareto_prefilter_keeps_the_exact_front_on_large_inputs() -> None:
    rng = np.random.default_rng(3)
    t = np.round(rng.lognormal(0, 1, 60_000), 2)
    c = np.round(5.0 / t + rng.exponential(1.0, t.size), 2)
    assert np.array_equal(pareto_front(t, c), _pareto_exact(t, c))


def test_knee_is_the_bend_of_the_front() -> None:
    t = np.array([1.0, 2.0, 10.0])
    c = np.array([10.0, 3.0, 1.0])
    assert knee_index(t, c) == 1


def test_pinned_cluster_is_priced_where_it_runs_not_searched() -> None:
    profile = make_profile()
    request = PlanRequest(target_steps=20_000, top_k=5)
    result = plan_pinned(profile, small_catalog(), MODEL, request, parse_pinned("g4dn.12xlarge:2"))
    assert {p.cluster.describe() for p in result.plans} == {"2x g4dn.12xlarge"}
    assert result.baselines == ()
    # The same shape, compared across its zones and markets, priced as the search prices it.
    free = plan(profile, small_catalog(), MODEL, replace(request, top_k=200))
    same = [p for p in free.plans if p.cluster.describe() == "2x g4dn.12xlarge"]
    assert result.best.cost_usd == pytest.approx(min(p.cost_usd for p in same))
    assert result.best.cost_usd >= free.best.cost_usd


def test_pinned_mix_and_a_missed_deadline_are_said_not_hidden() -> None:
    pinned = parse_pinned("g5.12xlarge:1,g5.xlarge:2")
    request = PlanRequest(target_steps=2_000_000, deadline_h=1.0, top_k=3)
    result = plan_pinned(make_profile(), small_catalog(), MODEL, request, pinned)
    assert result.best.cluster.describe() in ("1x g5.12xlarge + 2x g5.xlarge",
                                              "2x g5.xlarge + 1x g5.12xlarge")  # fmt: skip
    assert any("misses the constraints" in note for note in result.notes)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("g4dn.12xlarge", "use TYPE:N"),
        ("g4dn.12xlarge:0", "use TYPE:N"),
        ("a:1,b:1,c:1", "at most two"),
        ("g5.xlarge:1,g5.xlarge:2", "twice"),
    ],
)
def test_bad_pins_are_config_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_pinned(text)


def test_pinning_an_unknown_or_too_small_type_is_refused() -> None:
    request = PlanRequest(target_steps=100)
    with pytest.raises(ConfigError, match="'p9.huge' is not an instance type"):
        plan_pinned(make_profile(), small_catalog(), MODEL, request, (("p9.huge", 1),))
    huge = make_profile(param_bytes=8 * 1024**3)  # weights, grads, Adam: 32 GiB > 16 GiB
    with pytest.raises(InfeasibleError, match="cannot run this job"):
        plan_pinned(huge, small_catalog(), MODEL, request, (("g4dn.xlarge", 1),))


def test_time_a_step_spent_blocked_is_not_lengthened_by_shared_cores() -> None:
    """Two processes on one core each get half of it; a 24 ms step that sleeps 20 ms
    computes 4 ms, which takes 8 ms at half a core: 28 ms, not the 48 ms of scaling the
    sleep too."""
    pred = _local_prediction(0.024)
    shared = on_shared_cores(pred, 1.0, 1.0, [0.5, 0.5], blocked_share=20 / 24)
    assert shared.step_s == pytest.approx(0.028)
    assert shared.compute_s == pytest.approx(0.028)
    assert on_shared_cores(pred, 1.0, 1.0, [0.5, 0.5]).step_s == pytest.approx(0.048)
    # all blocked: nothing to lengthen
    assert on_shared_cores(pred, 1.0, 1.0, [0.5], blocked_share=1.0).step_s == pytest.approx(0.024)


@pytest.mark.parametrize(
    ("host", "expected"),
    [({"cpu_share": 1.0, "blocked_share": 0.25}, 0.25), ({"cpu_share": 1.0}, 0.0),
     ({"blocked_share": "x"}, 0.0), ({"blocked_share": 1.5}, 1.0), (None, 0.0)],
)  # fmt: skip
def test_a_profiles_blocked_share_reads_as_none_where_it_was_not_measured(
    host: dict[str, object] | None, expected: float
) -> None:
    extra = {} if host is None else {"host": host}
    profile = replace(make_profile(), extra=extra)
    assert profile_blocked_share(profile) == expected


def _local_prediction(step_s: float) -> Prediction:
    return Prediction(step_s, 0.8 * step_s, 1.25 * step_s, step_s, 0.0, 0.0, (32,), 64, True,
                      (0.0,), ())  # fmt: skip


def test_local_processes_on_shared_cores_slow_by_the_share_they_lose() -> None:
    pred = _local_prediction(0.020)
    # An idle machine: a whole core then and now, for each of two processes.
    same = on_shared_cores(pred, 1.0, 1.0, [1.0, 1.0])
    assert (same.step_s, same.low_s, same.high_s) == (pred.step_s, pred.low_s, pred.high_s)
    # Four processes that get half a core each on an otherwise idle machine take twice
    # the wall time per step of a profile that had a core to itself.
    halved = on_shared_cores(pred, 1.0, 1.0, [0.5, 0.5, 0.5, 0.5])
    assert halved.step_s == pytest.approx(2 * pred.step_s)
    assert halved.high_s == pytest.approx(2 * pred.high_s)
    # A session that gets a third of the machine, split among its processes (Linux
    # autogroups): the profile had 1/3, one process now 1/3, two now 1/6 each. Both
    # estimates say twice the profile's step.
    split = on_shared_cores(pred, 1 / 3, 1 / 3, [1 / 6, 1 / 6])
    assert split.step_s == pytest.approx(2 * pred.step_s)
    assert split.low_s == pytest.approx(2 * pred.low_s)
    assert split.high_s == pytest.approx(2 * pred.high_s)
    # Load that went away between the profile (1/3 of a core) and now (a core each):
    # the interval spans now's three times faster and the profile's load split as the
    # machine splits it now (no slower than the model).
    moved = on_shared_cores(pred, 1 / 3, 1.0, [1.0, 1.0])
    assert moved.low_s == pytest.approx(pred.low_s / 3)
    assert moved.high_s == pytest.approx(pred.high_s)
    assert moved.low_s < moved.step_s < pred.step_s
    # Synchronous data parallelism waits for the slowest process at every step: one
    # process on a third of a core makes the step three times the profile's.
    straggler = on_shared_cores(pred, 1.0, 1.0, [1.0, 1 / 3])
    assert straggler.step_s == pytest.approx(3 * pred.step_s)
    assert on_shared_cores(pred, 0.7, 0.7, []) == pred  # nothing measured: the model


@pytest.mark.parametrize(
    ("host", "share"),
    [({"cpu_share": 0.6, "intra_op_threads": 1.0}, 0.6),
     ({"cpu_share": 0.8, "intra_op_threads": 2.0}, None),
     ({"cpu_share": 1.3, "intra_op_threads": 1.0}, 1.0),
     ({"cpu_share": "x"}, None), ({"cpu_share": 0.0}, None), (None, None)],
)  # fmt: skip
def test_profile_core_share_reads_what_the_callback_wrote(
    host: dict[str, object] | None, share: float | None
) -> None:
    profile = make_profile(**({"host": host} if host is not None else {}))
    assert profile_core_share(profile) == (None if share is None else pytest.approx(share))


# ------------------------------------------------------- step-time uncertainty


def test_a_wide_interval_costs_more_on_average_at_the_same_median() -> None:
    """Time and cost are expectations over the step's log-normal: its mean, sampled."""
    work, sigmas = 4.0, np.array([0.05, 0.4])
    out = spot_expectations(np.full(2, work), np.array([0.0, 0.3]), 0.01, 0.1, None, sigma=sigmas)
    flat = spot_expectations(np.full(2, work), np.array([0.0, 0.3]), 0.01, 0.1, None)
    z = np.random.default_rng(3).standard_normal(400_000)
    for i, sigma in enumerate(sigmas):
        sampled = float(np.mean(np.exp(sigma * z)))  # mean step over the median
        assert float(out.time_h[i]) == pytest.approx(float(flat.time_h[i]) * sampled, rel=5e-3)
        assert float(out.billed_h[i]) == pytest.approx(float(flat.billed_h[i]) * sampled, rel=5e-3)


def test_the_narrow_interval_is_ranked_cheaper_at_the_same_median_cost() -> None:
    """A T4 (the profiled GPU, narrow interval) and an A10G (compute carried from the T4,
    wide) priced so that their median costs tie: the planner ranks the T4 first, by the
    ratio of the two log-normal means."""
    profile = make_profile()
    t4 = offer("g4dn.xlarge", "T4", 1, 16, "us-east-1", "use1-az1", 0.526, None)
    predict = {
        o.accelerator: MODEL.predict(profile, Cluster((ClusterGroup(o, 1, 1),)), local_batch=32)
        for o in (t4, replace(t4, instance_type="g5.xlarge", accelerator="A10G"))
    }
    price = 0.526 * predict["T4"].step_s / predict["A10G"].step_s
    a10g = offer("g5.xlarge", "A10G", 1, 24, "us-east-1", "use1-az2", price, None)
    request = PlanRequest(target_steps=20_000, max_nodes=1, mixes=False, allow_spot=False)
    plans = plan(profile, [a10g, t4], MODEL, request).plans
    assert [p.cluster.groups[0].offer.accelerator for p in plans] == ["T4", "A10G"]
    sigma = {p.cluster.groups[0].offer.accelerator: math.log(p.step_high_s / p.step_low_s)
             / (2 * 1.2816) for p in plans}  # fmt: skip
    assert sigma["A10G"] > 2 * sigma["T4"] > 0
    ratio = math.exp((sigma["A10G"] ** 2 - sigma["T4"] ** 2) / 2)
    assert plans[1].cost_usd / plans[0].cost_usd == pytest.approx(ratio, rel=1e-6)
    assert plans[1].step_mean_s / plans[1].step_s == pytest.approx(
        math.exp(sigma["A10G"] ** 2 / 2), rel=1e-9
    )


@pytest.mark.parametrize("deadline", [6.0, 8.0, 9.0, 12.0])
def test_on_demand_deadline_odds_count_the_step_spread_as_sampled(deadline: float) -> None:
    work, sigma = 8.0, 0.3
    steps = work * np.exp(sigma * np.random.default_rng(5).standard_normal(200_000))
    sampled = float(np.mean(steps <= deadline))
    out = spot_expectations(
        np.array([work]), np.array([0.0]), 0.01, 0.1, deadline, sigma=np.array([sigma])
    )
    assert float(out.deadline_probability[0]) == pytest.approx(sampled, abs=0.005)


@pytest.mark.parametrize(
    ("work", "rate", "sigma", "deadline"),
    [(10.0, 0.2, 0.1, 11.5), (10.0, 0.05, 0.3, 12.0), (5.0, 0.5, 0.2, 6.0),
     (10.0, 0.02, 0.25, 10.5), (20.0, 1.0, 0.15, 26.0), (3.0, 0.1, 0.02, 3.3),
     (10.0, 1e-4, 0.2, 11.0), (0.5, 0.002, 0.4, 0.6)],
)  # fmt: skip
def test_spot_deadline_odds_with_an_uncertain_step_match_sampling(
    work: float, rate: float, sigma: float, deadline: float
) -> None:
    """Sampled: a log-normal step, then Poisson preemptions over the run it makes, each
    costing the restart plus a uniform share of the Young/Daly interval."""
    ckpt, restart = 0.05, 0.1
    tau = math.sqrt(2 * ckpt / rate)
    rng = np.random.default_rng(17)
    run = work * (1 + ckpt / tau) * np.exp(sigma * rng.standard_normal(100_000))
    k = rng.poisson(rate * run / (1 - rate * tau / 2))
    lost = rng.uniform(0, tau, int(k.sum()))
    delay = k * restart + np.bincount(np.repeat(np.arange(k.size), k), lost, k.size)
    sampled = float(np.mean(run + delay <= deadline))
    out = spot_expectations(
        np.array([work]), np.array([rate]), ckpt, restart, deadline, sigma=np.array([sigma]),
        exact=np.array([True]),
    )  # fmt: skip
    assert float(out.deadline_probability[0]) == pytest.approx(sampled, abs=0.015)


def test_a_zero_width_interval_gives_exactly_the_median_figures() -> None:
    rng = np.random.default_rng(2)
    n = 400
    work = rng.uniform(0.5, 20.0, n)
    rate = np.where(rng.random(n) < 0.3, 0.0, rng.uniform(0.001, 1.0, n))
    deadline = 12.0
    old = spot_expectations(work, rate, 0.05, 0.1, deadline)
    new = spot_expectations(work, rate, 0.05, 0.1, deadline, sigma=np.zeros(n))
    for name in ("time_h", "billed_h", "preemptions", "deadline_probability"):
        assert np.array_equal(getattr(new, name), getattr(old, name)), name
    t0 = work * (1 + np.where(rate > 0, 0.05 / old.interval_h, 0.0))
    delays_only = deadline_probability(
        deadline - t0, old.preemptions, old.interval_h, 0.1, exact=old.time_h <= deadline
    )
    assert np.array_equal(new.deadline_probability, delays_only)
    # and through the planner: a model with no interval prices the median step
    flat = PerformanceModel(SPECS, Calibration(PhysicsConstants(), residual_low=0.0,
                                               residual_high=0.0))  # fmt: skip
    request = PlanRequest(target_steps=20_000, deadline_h=1.0, max_gpus=1, mixes=False,
                          families=("g4dn",), min_deadline_probability=0.0)  # fmt: skip
    profile = make_profile()
    plans = plan(profile, small_catalog(), flat, request).plans
    assert {p.use_spot for p in plans} == {True, False}
    for p in plans:
        assert p.step_low_s == p.step_s == p.step_high_s and p.step_mean_s == p.step_s
        g = p.cluster.groups[0]
        rate_p = band_hourly_rate(g.offer.interruption_band) if p.use_spot else 0.0
        out = spot_expectations(np.array([20_000 * p.step_s / 3600]), np.array([rate_p]),
                                default_checkpoint_s(profile) / 3600, request.restart_delay_h,
                                1.0)  # fmt: skip
        assert p.time_to_target_h == float(out.time_h[0])
        assert p.cost_usd == p.hourly_usd * float(out.billed_h[0])
        assert p.deadline_probability == float(out.deadline_probability[0])


def test_a_deadline_refused_for_the_steps_own_uncertainty_names_confidence() -> None:
    """On-demand only, a deadline just past the expected time: no preemption risk, but
    the step's spread leaves well under 90 % odds; the refusal says so and how to fix."""
    profile = make_profile()
    on_demand = PlanRequest(target_steps=50_000, objective="time", allow_spot=False)
    fastest = plan(profile, small_catalog(), MODEL, on_demand).best
    deadline = fastest.time_to_target_h * 1.001
    with pytest.raises(InfeasibleError) as err:
        plan(profile, small_catalog(), MODEL, replace(on_demand, deadline_h=deadline))
    text = str(err.value)
    assert "--confidence" in text and "probability >= 90%" in text
    odds = float(text.split("(best ")[1].split("%")[0]) / 100
    sigma = math.log(fastest.step_high_s / fastest.step_low_s) / (2 * 1.2816)
    median_h = fastest.time_to_target_h / math.exp(sigma**2 / 2)
    z = np.random.default_rng(1).standard_normal(200_000)
    sampled = float(np.mean(median_h * np.exp(sigma * z) <= deadline))
    assert 0.5 < odds < 0.9 and odds == pytest.approx(sampled, abs=0.015)
