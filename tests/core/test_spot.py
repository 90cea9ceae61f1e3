"""Spot timelines, policies and the replay simulator, on timelines built here and on
windows of the real Can't Be Late traces."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.spot import (
    Action,
    CheckpointModel,
    GreedySpotPolicy,
    Observation,
    OnDemandPolicy,
    Policy,
    SpotJob,
    SpotTimeline,
    SriftyPolicy,
    UniformProgressPolicy,
    combine_timelines,
    make_policy,
    offline_optimal_cost,
    simulate,
    young_daly_interval,
)

GAP = 0.05  # hours per tick (3 min), under the 0.2 h changeover
SPOT, OD = 1.0, 3.0


def timeline(*zones: list[int] | np.ndarray, gap: float = GAP) -> SpotTimeline:
    """Zones given as 0/1 availability per tick."""
    arr = np.asarray([np.asarray(z, dtype=np.int64) for z in zones])
    return SpotTimeline(tuple(f"z{i}" for i in range(len(zones))), gap, arr)


def job(c: float, d_line: float, zones: int = 1, **kw: object) -> SpotJob:
    return SpotJob(c, d_line, tuple([SPOT] * zones), OD, **kw)  # type: ignore[arg-type]


def markov_availability(
    rng: np.random.Generator, ticks: int, p_fail: float, p_back: float
) -> np.ndarray:
    """On/off availability with geometric up and down runs."""
    out = np.empty(ticks, dtype=np.int64)
    up = True
    for t in range(ticks):
        out[t] = up
        up = rng.random() >= p_fail if up else rng.random() < p_back
    return out


SPOT_POLICIES: list[Policy] = [SriftyPolicy(), UniformProgressPolicy(), GreedySpotPolicy()]


@pytest.mark.parametrize("policy", SPOT_POLICIES, ids=lambda p: p.name)
def test_always_available_spot_costs_compute_plus_one_changeover(policy: Policy) -> None:
    c, d = 4.0, 0.2
    result = simulate(policy, timeline([1] * 400), job(c, 8.0, changeover_hours=d))
    assert result.cost == pytest.approx((c + d) * SPOT)
    assert result.finish_hours == pytest.approx(c + d)
    assert result.preemptions == 0 and result.migrations == 0
    assert result.ondemand_hours == 0.0
    assert result.deadline_met


@pytest.mark.parametrize("policy", [*SPOT_POLICIES, OnDemandPolicy()], ids=lambda p: p.name)
def test_never_available_spot_runs_on_demand_and_meets_deadline(policy: Policy) -> None:
    c, d = 4.0, 0.2
    result = simulate(policy, timeline([0] * 400), job(c, 6.0, changeover_hours=d))
    assert result.spot_hours == 0.0
    assert result.deadline_met
    # Every on-demand start pays one changeover; nothing else is paid for.
    starts = sum(e.target == "on-demand" for e in result.events)
    assert starts >= 1
    assert result.ondemand_hours == pytest.approx(c + starts * d)
    assert result.cost == pytest.approx(result.ondemand_hours * OD)


@pytest.mark.parametrize("policy", [GreedySpotPolicy(), OnDemandPolicy()], ids=lambda p: p.name)
def test_never_available_spot_costs_one_on_demand_run(policy: Policy) -> None:
    c, d = 4.0, 0.2
    result = simulate(policy, timeline([0] * 400), job(c, 6.0, changeover_hours=d))
    assert result.cost == pytest.approx((c + d) * OD)
    assert result.cost_ratio == pytest.approx(1.0)


def test_on_demand_reference_cost_is_compute_plus_changeover() -> None:
    result = simulate(OnDemandPolicy(), timeline([1] * 200), job(3.0, 3.5))
    assert result.ondemand_cost == pytest.approx(3.2 * OD)
    assert result.cost == pytest.approx(result.ondemand_cost)


@pytest.mark.parametrize("mode", ["notice", "periodic"])
@pytest.mark.parametrize("policy", [SriftyPolicy(), UniformProgressPolicy()], ids=lambda p: p.name)
def test_deadline_always_met_when_deadline_leaves_two_changeovers(
    policy: Policy, mode: str
) -> None:
    rng = np.random.default_rng(7)
    c, d = 6.0, 0.2
    checkpoint = CheckpointModel("periodic", 0.02, 5.0) if mode == "periodic" else CheckpointModel()
    for trial in range(12):
        slack = [2 * d, 0.5, 1.0, 3.0][trial % 4]
        zones = [markov_availability(rng, 600, 0.08, 0.1) for _ in range(1 + trial % 3)]
        result = simulate(
            policy,
            timeline(*zones),
            job(c, c + slack, len(zones), changeover_hours=d, checkpoint=checkpoint),
        )
        assert result.deadline_met, (trial, result.finish_hours, c + slack)


@dataclass
class Recorder:
    """Wraps a policy and keeps every observation it was given."""

    inner: Policy
    seen: list[Observation] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    def decide(self, observation: Observation) -> Action:
        self.seen.append(observation)
        return self.inner.decide(observation)


def test_policy_sees_only_the_present_tick() -> None:
    rng = np.random.default_rng(3)
    zones = [markov_availability(rng, 500, 0.1, 0.2) for _ in range(3)]
    tl = timeline(*zones)
    start = 40
    recorder = Recorder(SriftyPolicy())
    simulate(recorder, tl, job(5.0, 8.0, 3), start_tick=start)
    assert recorder.seen
    for tick, obs in enumerate(recorder.seen):
        assert obs.time_hours == pytest.approx(tick * GAP)
        assert obs.available == tuple(bool(z[start + tick]) for z in zones)
        # No field carries more than one value per zone.
        for value in vars(obs).values():
            assert not isinstance(value, np.ndarray)
            if isinstance(value, tuple):
                assert len(value) == 3
        # Market counts cover the ticks before this one and nothing later.
        past = np.asarray(zones)[:, : start + tick]
        assert obs.market.hours == pytest.approx((start + tick) * GAP)
        assert obs.market.up_hours == pytest.approx(tuple(past.sum(axis=1) * GAP))
        assert obs.market.any_up_hours == pytest.approx(past.any(axis=0).sum() * GAP)
        assert obs.history.hours == pytest.approx(start * GAP)
        assert obs.history.up_hours == pytest.approx(
            tuple(np.asarray(zones)[:, :start].sum(axis=1) * GAP)
        )


def test_future_availability_does_not_change_past_decisions() -> None:
    rng = np.random.default_rng(11)
    zones = [markov_availability(rng, 500, 0.1, 0.2) for _ in range(2)]
    cut = 60
    changed = [z.copy() for z in zones]
    changed[0][cut:] = 1 - changed[0][cut:]
    runs = []
    for zs in (zones, changed):
        recorder = Recorder(SriftyPolicy())
        simulate(recorder, timeline(*zs), job(5.0, 8.0, 2))
        runs.append([recorder.inner.decide(o) for o in recorder.seen[:cut]])
    assert runs[0] == runs[1]


def test_srifty_migrates_to_another_zone_instead_of_on_demand() -> None:
    # Zone 0 dies at tick 20 for good; zone 1 is up throughout.
    zone0 = [1] * 20 + [0] * 380
    zone1 = [1] * 400
    tl = timeline(zone0, zone1)
    j = job(4.0, 6.0, 2)
    srifty = simulate(SriftyPolicy(), tl, j)
    assert srifty.preemptions == 1 and srifty.migrations == 1
    assert srifty.ondemand_hours == 0.0
    move = [e for e in srifty.events if e.source == "spot:z0"]
    assert move[0].target == "spot:z1" and move[0].reason.startswith("preempted")
    assert move[0].tick == 20 and move[0].lost_hours == pytest.approx(0.2)
    # Uniform Progress stays in its home zone and has to pay on-demand.
    up = simulate(UniformProgressPolicy(home_zone=0), tl, j)
    assert up.ondemand_hours > 0 and srifty.cost < up.cost


def test_srifty_prefers_the_zone_seen_to_be_interrupted_less() -> None:
    flaky = ([1] * 2 + [0]) * 100  # interrupted every 3 ticks before and after the start
    steady = [1] * 300
    tl = timeline(flaky, steady)
    result = simulate(SriftyPolicy(), tl, job(2.0, 4.0, 2), start_tick=150)
    assert result.events[0].target == "spot:z1"


def test_srifty_picks_the_cheaper_zone_when_both_are_steady() -> None:
    tl = timeline([1] * 200, [1] * 200)
    j = SpotJob(2.0, 4.0, (1.5, 0.9), OD)
    result = simulate(SriftyPolicy(), tl, j)
    assert result.events[0].target == "spot:z1"
    assert result.cost == pytest.approx(2.2 * 0.9)


def test_periodic_checkpoint_loses_work_since_last_save() -> None:
    # A long MTBF prior makes the Young/Daly interval longer than the 1 h spot run.
    tl = timeline([1] * 20 + [0] * 300)
    ckpt = CheckpointModel("periodic", cost_hours=0.01, prior_mtbf_hours=1000.0)
    result = simulate(UniformProgressPolicy(), tl, job(3.0, 6.0, checkpoint=ckpt))
    preempted = [e for e in result.events if e.reason.startswith("preempted")]
    # 20 ticks of 0.05 h = 1 h on spot, minus the 0.2 h changeover, all unsaved; the
    # policy restarts on on-demand at once, paying a new changeover on top.
    assert preempted[0].target == "on-demand"
    assert preempted[0].lost_hours == pytest.approx(0.8 + 0.2)
    assert result.deadline_met


def test_notice_checkpoint_keeps_work_on_preemption() -> None:
    tl = timeline([1] * 20 + [0] * 300)
    result = simulate(UniformProgressPolicy(), tl, job(3.0, 6.0))
    preempted = [e for e in result.events if e.reason.startswith("preempted")]
    assert preempted[0].lost_hours == pytest.approx(0.0)


def test_young_daly_interval() -> None:
    assert young_daly_interval(0.1, 50.0) == pytest.approx(math.sqrt(10.0))
    with pytest.raises(ConfigError, match="MTBF"):
        young_daly_interval(0.1, 0.0)


def test_resample_keeps_fewest_nodes_up_per_coarse_tick() -> None:
    tl = SpotTimeline(("a",), 1 / 60, np.array([[4, 4, 3, 4, 4, 4, 0, 4, 4]]), capacity=4)
    coarse = tl.resample(3 / 60)
    assert coarse.nodes_up.tolist() == [[3, 4, 0]]
    assert coarse.available().tolist() == [[False, True, False]]
    assert coarse.available(gang=3).tolist() == [[True, True, False]]


def test_combine_resamples_to_coarsest_gap_and_cuts_to_shortest() -> None:
    fine = SpotTimeline(("a",), 0.1, np.array([[1, 1, 1, 0, 1, 1, 1, 1]]))
    coarse = SpotTimeline(("b",), 0.2, np.array([[1, 0, 1]]))
    both = combine_timelines([fine, coarse])
    assert both.zones == ("a", "b") and both.gap_hours == 0.2
    assert both.nodes_up.tolist() == [[1, 0, 1], [1, 0, 1]]


def test_policy_choosing_a_down_zone_is_an_error() -> None:
    class Bad:
        name = "bad"

        def decide(self, observation: Observation) -> Action:
            return Action.spot(0)

    with pytest.raises(ValueError, match="down now"):
        simulate(Bad(), timeline([0] * 10), job(0.1, 1.0))


def test_bad_job_and_policy_names_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="--deadline-hours"):
        job(5.0, 4.0)
    with pytest.raises(ConfigError, match="uniform-progress"):
        make_policy("cheapest")
    with pytest.raises(ConfigError, match="spot prices"):
        simulate(SriftyPolicy(), timeline([1] * 10, [1] * 10), job(0.1, 1.0, zones=1))


# --------------------------------------------------------------------------- real traces


def _load_2023_02(shared_data: Path) -> SpotTimeline:
    from lightning_srifty.io.spot_traces import load_traces

    folder = shared_data / "spot-traces" / "availability-1node-p3.2xlarge-2023-02"
    return load_traces(sorted(folder.glob("*.json")))


def test_srifty_costs_no_more_than_uniform_progress_on_real_windows(shared_data: Path) -> None:
    tl = _load_2023_02(shared_data)
    od = 3.06
    j_all = SpotJob(48.0, 72.0, tuple([od / 3] * len(tl.zones)), od)
    j_one = SpotJob(48.0, 72.0, (od / 3,), od)
    srifty_all, srifty_one, up_one = [], [], []
    for start in (0, 5000, 10000, 15000):
        r = simulate(SriftyPolicy(), tl, j_all, start_tick=start)
        assert r.deadline_met
        assert offline_optimal_cost(tl, j_all, start_tick=start) <= r.cost + 1e-9
        srifty_all.append(r.cost_ratio)
        for z in (0, 4, 8):  # worst, middle and best zone of the set
            sub = tl.select([z])
            a = simulate(SriftyPolicy(), sub, j_one, start_tick=start)
            b = simulate(UniformProgressPolicy(), sub, j_one, start_tick=start)
            assert a.deadline_met and b.deadline_met
            srifty_one.append(a.cost_ratio)
            up_one.append(b.cost_ratio)
    assert np.mean(srifty_one) <= np.mean(up_one) + 1e-9
    assert np.mean(srifty_all) < np.mean(up_one)
    # Any-zone spot is up ~91 % of the time: all nine zones get close to the spot price.
    assert np.mean(srifty_all) < 0.5


# ------------------------------------------------------------- srifty's slack reserve


def test_srifty_waits_out_an_outage_when_slack_is_ample() -> None:
    # One zone, down for half an hour after 1 h of running; 4 h of work, 6 h to do it.
    tl = timeline([1] * 20 + [0] * 10 + [1] * 400)
    j = job(4.0, 6.0)
    srifty = simulate(SriftyPolicy(), tl, j)
    assert srifty.deadline_met and srifty.ondemand_hours == 0.0
    assert srifty.cost == pytest.approx((4.0 + 2 * 0.2) * SPOT)
    # Uniform Progress falls behind ep(t) during the outage and pays on-demand for it.
    up = simulate(UniformProgressPolicy(), tl, j)
    assert up.ondemand_hours > 0 and up.cost > srifty.cost


def test_srifty_goes_on_demand_when_slack_reaches_the_reserve() -> None:
    # Spot dies for good after 1 h: waiting is right at first, then on-demand must
    # start early enough to keep the reserve, and the deadline is met.
    c, deadline = 4.0, 8.0
    tl = timeline([1] * 20 + [0] * 400)
    recorder = Recorder(SriftyPolicy())
    result = simulate(recorder, tl, job(c, deadline))
    assert result.deadline_met
    switch = next(e for e in result.events if e.target == "on-demand")
    assert switch.time_hours > 1.5  # waited a while instead of paying at once
    obs = recorder.seen[round(switch.time_hours / GAP)]
    reserve = SriftyPolicy().reserve_hours(obs)
    assert reserve > 0
    # It switched on the tick the slack came down to the reserve, not later.
    assert obs.ondemand_slack_hours - obs.changeover_hours - 2 * GAP <= reserve
    assert obs.ondemand_slack_hours - obs.changeover_hours - 2 * GAP > reserve - 2 * GAP


def test_srifty_reserve_grows_with_interruptions_and_shrinks_with_work_left() -> None:
    steady = timeline([1] * 300)
    flaky = timeline(([1] * 4 + [0]) * 60)
    seen: dict[str, list[Observation]] = {}
    for name, tl in (("steady", steady), ("flaky", flaky)):
        recorder = Recorder(SriftyPolicy())
        simulate(recorder, tl, job(3.0, 6.0), start_tick=100)
        seen[name] = recorder.seen
    policy = SriftyPolicy()
    first = {k: policy.reserve_hours(v[0]) for k, v in seen.items()}
    assert first["flaky"] > 5 * first["steady"]
    # Less work left, less slack to keep.
    steady_run = [policy.reserve_hours(o) for o in seen["steady"]]
    assert steady_run[-1] < steady_run[0]


def test_srifty_weighs_old_history_as_one_deadline_at_most() -> None:
    # The job starts into a stormy market after a calm past of D hours or of 10·D hours.
    # Old history is capped at D hours of evidence, so both see the same rates; without
    # the cap the long calm past would hide the storm.
    c, deadline = 2.0, 4.0
    storm = ([1] * 3 + [0]) * 40
    short_calm = int(deadline / GAP)
    reserves = []
    for calm in (short_calm, 10 * short_calm):
        tl = timeline([1] * calm + storm)
        recorder = Recorder(SriftyPolicy())
        simulate(recorder, tl, job(c, deadline), start_tick=calm)
        later = recorder.seen[40]  # 2 h into the job
        reserves.append(SriftyPolicy().reserve_hours(later))
    assert reserves[0] == pytest.approx(reserves[1])


# Repeating on/off patterns of up to 40 ticks, tiled over 480 ticks (24 h).
availability = st.lists(st.booleans(), min_size=1, max_size=40).map(
    lambda bits: np.resize(np.asarray(bits, dtype=np.int64), 480)
)


@settings(max_examples=100, deadline=None)
@given(
    zones=st.lists(availability, min_size=1, max_size=3),
    work=st.floats(0.3, 4.0),
    spare=st.floats(0.0, 3.0),
    start=st.integers(0, 40),
    periodic=st.booleans(),
)
def test_srifty_never_misses_a_deadline_that_on_demand_could_meet(
    zones: list[np.ndarray], work: float, spare: float, start: int, periodic: bool
) -> None:
    d = 0.2
    tl = timeline(*zones)
    checkpoint = CheckpointModel("periodic", 0.02, 5.0) if periodic else CheckpointModel()
    # On-demand from submission needs C + d; any deadline from there on must be met.
    j = job(work, work + d + spare, len(zones), changeover_hours=d, checkpoint=checkpoint)
    result = simulate(SriftyPolicy(), tl, j, start_tick=start)
    assert result.deadline_met, (result.finish_hours, j.deadline_hours)


@pytest.mark.parametrize("spare", [0.0, 0.12, 0.25, 0.37, 0.5])
def test_srifty_meets_every_deadline_on_all_short_adversarial_patterns(spare: float) -> None:
    # Every on/off pattern of the first 10 ticks, spot gone for good afterwards: the
    # market can preempt the job at the worst tick. Slack of up to two changeovers is
    # where a policy that restarts spot without room for the way back fails.
    c, d = 0.5, 0.2
    for bits in itertools.product((0, 1), repeat=10):
        tl = timeline(list(bits) + [0] * 60)
        result = simulate(SriftyPolicy(), tl, job(c, c + d + spare, changeover_hours=d))
        assert result.deadline_met, (bits, spare, result.finish_hours)


# ------------------------------------------------------------------ offline optimum


def _scripted(plan: tuple[str, ...]) -> Policy:
    """A policy that asks for a fixed placement per tick (the oracle knows the future)."""

    class Scripted:
        name = "scripted"

        def decide(self, observation: Observation) -> Action:
            tick = min(round(observation.time_hours / GAP_BRUTE), len(plan) - 1)
            want = plan[tick]
            here = observation.placement
            if want == "idle":
                return Action.stay() if here.kind == "idle" else Action.idle()
            if want == "od":
                return Action.stay() if here.kind == "on-demand" else Action.on_demand()
            zone = int(want[1:])
            if here.kind == "spot" and here.zone == zone:
                return Action.stay()
            return Action.spot(zone)

    return Scripted()


GAP_BRUTE = 0.1


@pytest.mark.parametrize(
    "zones",
    [
        ([1, 1, 0, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0, 1]),
        ([1, 0, 1, 0, 1, 0, 1], [0, 1, 0, 1, 0, 1, 0]),
        ([0, 0, 1, 1, 1, 0, 1], [0, 0, 0, 0, 0, 0, 0]),
        ([1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]),
    ],
)
def test_offline_optimum_equals_brute_force_on_the_tick_grid(
    zones: tuple[list[int], ...],
) -> None:
    # d = 2 ticks, C = 2 ticks, D = 6 ticks: every open-loop schedule is enumerable.
    tl = timeline(*zones, gap=GAP_BRUTE)
    j = SpotJob(0.2, 0.6, (1.0, 0.7), 3.0, changeover_hours=0.2)
    best = math.inf
    for plan in itertools.product(("idle", "z0", "z1", "od"), repeat=6):
        try:
            r = simulate(_scripted(plan), tl, j)
        except ValueError:  # asked for a zone that is down
            continue
        if r.deadline_met:
            best = min(best, r.cost)
    assert offline_optimal_cost(tl, j) == pytest.approx(best)


@settings(max_examples=40, deadline=None)
@given(
    zones=st.lists(availability, min_size=1, max_size=3),
    work=st.floats(0.3, 3.0),
    spare=st.floats(0.0, 3.0),
    start=st.integers(0, 40),
)
def test_offline_optimum_is_a_lower_bound_for_every_policy(
    zones: list[np.ndarray], work: float, spare: float, start: int
) -> None:
    tl = timeline(*zones)
    j = job(work, work + 0.2 + spare, len(zones))
    bound = offline_optimal_cost(tl, j, start_tick=start)
    for policy in [*SPOT_POLICIES, OnDemandPolicy()]:
        result = simulate(policy, tl, j, start_tick=start)
        if result.deadline_met:
            assert bound <= result.cost + 1e-9, policy.name


def test_offline_optimum_on_always_available_spot_is_one_changeover() -> None:
    tl = timeline([1] * 200, [1] * 200)
    j = SpotJob(2.0, 3.0, (1.5, 0.9), OD, changeover_hours=0.2)
    assert offline_optimal_cost(tl, j) == pytest.approx(2.2 * 0.9)
    # With spot never up it is on-demand from the start.
    none = timeline([0] * 200)
    assert offline_optimal_cost(none, job(2.0, 3.0)) == pytest.approx(2.2 * OD)
