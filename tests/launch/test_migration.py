"""The spot policies deciding live migrations: zones, prices per work-hour, waiting."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_srifty.core.catalog import Offer
from lightning_srifty.core.cluster import Cluster, ClusterGroup, Plan
from lightning_srifty.core.spot import make_policy
from lightning_srifty.launch.migration import (
    Candidates,
    PolicyDecider,
    move_kind,
    plan_key,
    true_move,
)


def _plan(itype: str, zone: str, *, spot: bool, hourly: float, step_s: float = 1.0) -> Plan:
    offer = Offer(
        instance_type=itype,
        accelerator="T4",
        accelerator_count=1,
        gpu_memory_gib=16.0,
        vcpus=4.0,
        memory_gib=16.0,
        region="us-west-2",
        zone=zone,
        ondemand_price=hourly,
        spot_price=hourly if spot else None,
        intra_node_link="none",
        network_gbps=25.0,
    )
    cluster = Cluster((ClusterGroup(offer, 1, 1),))
    # steps_to_target 0: not planned for a target, step times compare as they are
    return Plan(cluster, spot, step_s, step_s, step_s, 32, 0, 1.0, hourly, hourly)


HOME = _plan("g4dn.xlarge", "usw2-az1", spot=True, hourly=0.3)
OTHER = _plan("g4dn.xlarge", "usw2-az2", spot=True, hourly=0.35)
ON_DEMAND = _plan("g4dn.xlarge", "usw2-az1", spot=False, hourly=1.0)


def _decider(policy: str, spot=(HOME, OTHER), deadline_h: float | None = 10.0) -> PolicyDecider:
    return PolicyDecider(
        policy=make_policy(policy),
        candidates=lambda remaining, elapsed, changeover: Candidates(tuple(spot), ON_DEMAND),
        home=plan_key(HOME),
        target_steps=3600 * 4,  # 4 hours of work at 1 s per step
        deadline_h=deadline_h,
        changeover_h=0.1,
        wait_h=0.05,
    )


def test_srifty_migrates_to_another_zone_when_home_is_revoked() -> None:
    decision = _decider("srifty").decide(
        steps_done=3600, elapsed_h=1.0, cooling=frozenset({plan_key(HOME)}), preempted=True
    )
    assert decision.plan == OTHER
    assert decision.reason.startswith("srifty")


def test_uniform_progress_waits_for_its_home_zone_while_ahead() -> None:
    decider = _decider("uniform-progress")
    cooling = frozenset({plan_key(HOME)})
    ahead = decider.decide(steps_done=3600, elapsed_h=1.0, cooling=cooling, preempted=True)
    assert ahead.plan is None  # 1 h done of 4 after 1 h of 10: ahead of t*C/D, so wait
    behind = decider.decide(steps_done=3600, elapsed_h=5.0, cooling=cooling, preempted=False)
    assert behind.plan == ON_DEMAND  # 1 h done after 5 h: behind uniform progress
    back = decider.decide(steps_done=3600, elapsed_h=1.0, cooling=frozenset(), preempted=False)
    assert back.plan == HOME


def test_on_demand_policy_always_takes_on_demand() -> None:
    decision = _decider("on-demand").decide(
        steps_done=0, elapsed_h=0.0, cooling=frozenset(), preempted=True
    )
    assert decision.plan == ON_DEMAND


def test_prices_compare_per_hour_of_work_not_per_hour() -> None:
    slow_cheap = _plan("g4dn.xlarge", "usw2-az2", spot=True, hourly=0.4, step_s=2.0)
    fast_dear = _plan("g5.xlarge", "usw2-az3", spot=True, hourly=0.6, step_s=1.0)
    decider = _decider("srifty", spot=(HOME, slow_cheap, fast_dear))
    decision = decider.decide(
        steps_done=0, elapsed_h=0.0, cooling=frozenset({plan_key(HOME)}), preempted=True
    )
    # 0.4 $/h at 2 s/step is 0.8 $ per hour of 1 s/step work; 0.6 $/h at 1 s/step is 0.6.
    assert decision.plan == fast_dear


def test_a_step_that_carries_more_samples_is_more_work() -> None:
    """A 4-GPU plan's step takes longer but the remaining work needs a quarter of them."""
    remaining = 3600 * 4
    one = dataclasses.replace(
        _plan("g4dn.xlarge", "usw2-az2", spot=True, hourly=0.3, step_s=1.0),
        steps_to_target=remaining,
    )
    offer = dataclasses.replace(one.cluster.groups[0].offer, instance_type="g4dn.12xlarge",
                                accelerator_count=4, zone="usw2-az3")  # fmt: skip
    four = dataclasses.replace(
        one, cluster=Cluster((ClusterGroup(offer, 1, 4),)), step_s=1.5, step_low_s=1.5,
        step_high_s=1.5, hourly_usd=1.0, steps_to_target=remaining // 4,
    )  # fmt: skip
    decider = _decider("srifty", spot=(HOME, one, four))
    decision = decider.decide(
        steps_done=0, elapsed_h=0.0, cooling=frozenset({plan_key(HOME)}), preempted=True
    )
    # Per hour of one-GPU work: 0.3 $ on one GPU; 1.0 $/h x 1.5 s / 4 = 0.375 $ on four.
    assert decision.plan == one
    cheap_four = dataclasses.replace(four, hourly_usd=0.7)  # 0.7 x 1.5 / 4 = 0.26 < 0.3
    decider = _decider("srifty", spot=(HOME, one, cheap_four))
    decision = decider.decide(
        steps_done=0, elapsed_h=0.0, cooling=frozenset({plan_key(HOME)}), preempted=True
    )
    assert decision.plan == cheap_four


def test_without_a_deadline_it_waits_rather_than_pay_on_demand() -> None:
    decider = _decider("srifty", spot=(HOME,), deadline_h=None)
    cooling = frozenset({plan_key(HOME)})
    assert (
        decider.decide(steps_done=0, elapsed_h=50.0, cooling=cooling, preempted=True).plan is None
    )
    assert (
        decider.decide(steps_done=0, elapsed_h=50.0, cooling=frozenset(), preempted=False).plan
        == HOME
    )


def test_a_tight_deadline_sends_srifty_to_on_demand() -> None:
    decider = _decider("srifty", spot=(HOME,), deadline_h=4.5)
    decision = decider.decide(
        steps_done=3600, elapsed_h=1.3, cooling=frozenset({plan_key(HOME)}), preempted=True
    )
    assert decision.plan == ON_DEMAND  # 3 h of work left in 3.2 h: no slack to wait


def test_work_the_scripts_own_limits_leave_undone_does_not_count_against_the_deadline() -> None:
    """The tight deadline above, but the script's ``max_time`` ends every plan half-way
    through the work left: 1.5 h of work in 3.2 h has slack, so srifty does not pay for
    on-demand; a plan that still reaches the target puts the whole 3 h back."""
    remaining = 3600 * 3

    def stopping(plan: Plan, share: float) -> Plan:
        stop = None if share >= 1 else int(remaining * share)
        return dataclasses.replace(plan, steps_to_target=remaining, stops_at_step=stop)

    def decide(home_share: float) -> Plan | None:
        decider = _decider("srifty", deadline_h=4.5)
        decider.candidates = lambda remaining_, elapsed, changeover: Candidates(
            (stopping(HOME, home_share),), stopping(ON_DEMAND, 0.5)
        )
        return decider.decide(
            steps_done=3600, elapsed_h=1.3, cooling=frozenset({plan_key(HOME)}), preempted=True
        ).plan

    assert decide(home_share=0.5) is None  # waits for spot: the work left fits
    assert decide(home_share=1.0) == stopping(ON_DEMAND, 0.5)  # the furthest plan counts


def test_the_next_move_is_priced_at_the_changeover_this_run_measured() -> None:
    """3 h of work left in 3.6 h: at the prior half-hour changeover a move and the slack
    to follow spot do not fit, so srifty goes on-demand; once this run's launches have
    taken 20 and 40 s, the move does fit and it follows spot. The re-plan prices its
    spot restarts at the same measured changeover."""
    asked: list[float] = []

    def candidates(remaining: int, elapsed: float, changeover: float) -> Candidates:
        asked.append(changeover)
        return Candidates((HOME, OTHER), ON_DEMAND)

    decider = dataclasses.replace(_decider("srifty", deadline_h=4.6), changeover_h=0.5)
    decider.candidates = candidates

    def move() -> Plan | None:
        return decider.decide(
            steps_done=3600, elapsed_h=1.0, cooling=frozenset({plan_key(HOME)}), preempted=True
        ).plan

    assert move() == ON_DEMAND
    decider.observe_startup(20 / 3600)
    decider.observe_startup(40 / 3600)
    decider.observe_startup(float("nan"))  # not a duration: ignored
    assert decider.changeover_now_h == pytest.approx(30 / 3600)
    assert move() == OTHER
    assert asked == [0.5, pytest.approx(30 / 3600)]


def test_history_feeds_the_rate_estimates() -> None:
    decider = _decider("srifty")
    decider.record(plan_key(OTHER), 2.0, preempted=True)
    decider.record(plan_key(OTHER), 1.0, preempted=True)
    seen = decider.history[plan_key(OTHER)]
    assert (seen.up_hours, seen.interruptions) == (3.0, 2)
    with pytest.raises(KeyError):
        _ = decider.history[plan_key(HOME)]


def test_a_move_is_labelled_by_what_really_changes() -> None:
    other_type = _plan("g5.xlarge", "usw2-az1", spot=True, hourly=0.4)
    both = _plan("g5.xlarge", "usw2-az2", spot=True, hourly=0.4)
    reason = "srifty: migrating to another zone"
    assert true_move(reason, HOME, OTHER) == reason
    assert true_move(reason, HOME, other_type) == (
        "srifty: migrating to another instance type in the same zone"
    )
    assert true_move(reason, HOME, both) == (
        "srifty: migrating to another instance type in another zone"
    )
    assert true_move("srifty: spot up", HOME, other_type) == "srifty: spot up"
    assert move_kind(HOME, HOME) == "the same instance type and zone"
