"""After a preemption: ask the deadline-aware spot policy where to go next.

The policies in :mod:`lightning_srifty.core.spot` decide on an
:class:`~lightning_srifty.core.spot.Observation`: zones with availability and prices,
progress, deadline and the history of interruptions. This module builds that
observation from live plans and turns the policy's action back into a plan, or into
"wait", so the same policy code drives the replay simulator and ``srifty-launch``.

How the live world maps onto the policy's:

* **Zones** are spot offers (instance type and zone). Zone 0 is the job's *home*, the
  offer of the first plan (Uniform Progress stays in its home zone); the others are the
  best spot plan in each further zone, in the planner's order. An offer cooling down
  after a preemption is unavailable; every other one counts as up, because a cloud only
  tells whether it has capacity when asked (a failed launch is a preemption of length
  zero for the controller).
* **Time and progress** are in hours of work on the slowest candidate (steps counted at
  the profiled world size, so a cluster whose steps carry more samples does more work
  per step), so a faster plan
  finishes early rather than late (deadline reasoning stays on the safe side), and
  prices become dollars per such hour (a fast expensive plan can be the cheaper one).
* **Market counts** are what the controller saw: hours it ran on each offer and the
  revocations there; a decision that finds no offer available counts as a market-wide
  outage. A live job has no market history from before it was submitted.
* **Actions**: ``spot`` launches that zone's plan, ``on-demand`` the best on-demand plan,
  ``idle``/``stay`` wait and ask again.
* **Placement**: after a preemption the job is idle. While it runs on on-demand the
  controller asks again on a timer with ``placement="on-demand"``, so the policy can
  send it back to spot as the simulator does (``Observation.placement``).
* **Availability**: where the launcher knows the spot market (the local backend replaying
  a trace), ``spot_up=False`` marks every spot offer unavailable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lightning_srifty.core.cluster import Plan
from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.spot import IDLE, ON_DEMAND, MarketCounts, Observation, Policy

OfferKey = tuple[str, str]
"""(instance type, zone)."""


def plan_key(plan: Plan) -> OfferKey:
    """The offer a single-group plan runs on (the first group's, for mixes)."""
    offer = plan.cluster.groups[0].offer
    return (offer.instance_type, offer.zone)


@dataclass
class ZoneHistory:
    """What the controller saw of one offer: hours it ran there, and revocations."""

    up_hours: float = 0.0
    interruptions: int = 0


@dataclass(frozen=True)
class Candidates:
    """Plans for the remaining work: best spot plan per offer, best on-demand plan."""

    spot: tuple[Plan, ...]
    on_demand: Plan | None


REPLANNED = "re-planned on measured steps"
"""How a live-refinement move's reason begins (the controller logs it as it is)."""


@dataclass(frozen=True)
class Decision:
    """Where to go next; ``plan is None`` means wait and ask again."""

    plan: Plan | None
    reason: str


CandidateSource = Callable[[int, float, float], Candidates]
"""``(remaining steps, elapsed hours, changeover hours) -> Candidates`` (the planner,
re-run, pricing a spot plan's restarts at the changeover)."""


@dataclass
class PolicyDecider:
    """Drives a :class:`~lightning_srifty.core.spot.Policy` with live plans.

    Args:
        policy: The spot policy (``srifty``, ``uniform-progress``, ...).
        candidates: Re-plans the remaining work.
        home: The offer of the first plan (the policy's zone 0).
        target_steps: Steps the whole job needs.
        deadline_h: The deadline since launch (``None``: no deadline).
        changeover_h: Restart and provisioning delay of a move until this run has
            measured one (``--restart-delay``); then the mean of the measured ones
            (:meth:`observe_startup`).
        wait_h: How long a "wait" lasts before the policy is asked again.
    """

    policy: Policy
    candidates: CandidateSource
    home: OfferKey
    target_steps: int
    deadline_h: float | None
    changeover_h: float
    wait_h: float
    history: dict[OfferKey, ZoneHistory] = field(default_factory=dict)
    outages: int = 0
    """Decisions that found no spot offer available right after one that found some
    (the live stand-in for a market-wide outage)."""
    _any_up_before: bool = True
    startups_h: list[float] = field(default_factory=list)
    """Measured hours from each attempt's launch to its first step."""

    @property
    def changeover_now_h(self) -> float:
        """The changeover the next move is priced at: what this run's launches took
        (their mean), or the prior ``changeover_h`` before the first one stepped."""
        if not self.startups_h:
            return self.changeover_h
        return sum(self.startups_h) / len(self.startups_h)

    def observe_startup(self, hours: float) -> None:
        """One attempt took ``hours`` from its launch to its first step."""
        if math.isfinite(hours) and hours >= 0:
            self.startups_h.append(hours)

    def record(self, key: OfferKey, ran_hours: float, preempted: bool) -> None:
        """Accounts one attempt on ``key`` (what the policy's rate estimates learn from)."""
        seen = self.history.setdefault(key, ZoneHistory())
        seen.up_hours += max(ran_hours, 0.0)
        seen.interruptions += int(preempted)

    def decide(
        self,
        *,
        steps_done: int,
        elapsed_h: float,
        cooling: frozenset[OfferKey],
        preempted: bool,
        on_demand_now: bool = False,
        spot_up: bool = True,
    ) -> Decision:
        """The policy's choice for the remaining work, as a plan or a wait.

        Args:
            steps_done: Steps the job has reached.
            elapsed_h: Hours since the launch.
            cooling: Offers to treat as unavailable (recently revoked).
            preempted: The job just lost its spot placement.
            on_demand_now: The job is running on on-demand (a timer's question); a
                ``stay`` or ``idle`` answer then keeps it there.
            spot_up: False when the spot market is known to be down everywhere.
        """
        remaining = max(self.target_steps - steps_done, 1)
        changeover_h = self.changeover_now_h
        found = self.candidates(remaining, elapsed_h, changeover_h)
        spot = _one_per_offer(found.spot)
        others = [p for p in spot if plan_key(p) != self.home]
        home = next((p for p in spot if plan_key(p) == self.home), None)
        zones: list[Plan | None] = [home, *others]
        keys = [self.home, *(plan_key(p) for p in others)]
        known = [p for p in [*zones, found.on_demand] if p is not None]
        if not known:
            raise ConfigError("no plan can run the remaining work (catalog filters too tight?)")

        def per_base_step_s(p: Plan) -> float:
            # a step of a bigger cluster does more of the work (its plan needs fewer)
            paced = p.step_s + p.validation_s
            return paced * p.steps_to_target / remaining if p.steps_to_target else paced

        slowest = max(per_base_step_s(p) for p in known)

        def per_work_hour(p: Plan | None) -> float:
            return math.inf if p is None else p.hourly_usd * per_base_step_s(p) / slowest

        hours_per_step = slowest / 3600.0
        # The script's own limits may end the run before the target: the work left is
        # what the plan that trains furthest does (never less than any plan will run).
        work_left = remaining * max(_share_trained(p) for p in known)
        seen = [self.history.get(k, ZoneHistory()) for k in keys]
        available = tuple(
            spot_up and p is not None and k not in cooling for p, k in zip(zones, keys, strict=True)
        )
        if self._any_up_before and not any(available):
            self.outages += 1
        self._any_up_before = any(available)
        market = MarketCounts(
            hours=elapsed_h,
            up_hours=tuple(z.up_hours for z in seen),
            interruptions=tuple(z.interruptions for z in seen),
            any_up_hours=sum(z.up_hours for z in self.history.values()),
            any_interruptions=self.outages,
        )
        nothing_before = MarketCounts(0.0, (0.0,) * len(keys), (0,) * len(keys), 0.0, 0)
        observation = Observation(
            time_hours=elapsed_h,
            gap_hours=self.wait_h,
            progress_hours=steps_done * hours_per_step,
            unsaved_hours=0.0,
            job_hours=(steps_done + work_left) * hours_per_step,
            deadline_hours=math.inf if self.deadline_h is None else self.deadline_h,
            changeover_hours=changeover_h,
            changeover_left_hours=0.0,
            placement=ON_DEMAND if on_demand_now else IDLE,
            preempted=preempted,
            available=available,
            spot_prices=tuple(per_work_hour(p) for p in zones),
            ondemand_price=per_work_hour(found.on_demand),
            market=market,
            history=nothing_before,
        )
        action = self.policy.decide(observation)
        why = f"{self.policy.name}: {action.reason}" if action.reason else self.policy.name
        if action.kind == "spot" and action.zone is not None and zones[action.zone] is not None:
            return Decision(zones[action.zone], why)
        if on_demand_now:
            return Decision(None, why)  # stay where it is: only a move to spot is acted on
        if action.kind == "on-demand" and found.on_demand is not None:
            return Decision(found.on_demand, why)
        return Decision(None, why)


POLICY_ZONE_MOVE = "migrating to another zone"
"""What the policy says when it picks another of its "zones", which live are offers."""


def move_kind(src: Plan, dst: Plan) -> str:
    """What really changes between two plans: zone, instance type, both, or neither."""
    types = ({g.offer.instance_type for g in p.cluster.groups} for p in (src, dst))
    zones = ({g.offer.zone for g in p.cluster.groups} for p in (src, dst))
    same_type = next(types) == next(types)
    same_zone = next(zones) == next(zones)
    if same_type and same_zone:
        return "the same instance type and zone"
    if same_type:
        return "another zone"
    if same_zone:
        return "another instance type in the same zone"
    return "another instance type in another zone"


def true_move(reason: str, src: Plan, dst: Plan) -> str:
    """The policy's reason with its generic "another zone" replaced by the real move.

    The policy's zones are offers (instance type and zone), so its "another zone" may
    be another instance type in the same zone.
    """
    if POLICY_ZONE_MOVE not in reason:
        return reason
    return reason.replace(POLICY_ZONE_MOVE, f"migrating to {move_kind(src, dst)}")


def _share_trained(plan: Plan) -> float:
    """The share of the remaining work ``plan`` trains before the script's own
    ``max_steps``/``max_epochs``/``max_time`` end it (1: it reaches the target)."""
    if plan.stops_at_step is None or not plan.steps_to_target:
        return 1.0
    return min(max(plan.stops_at_step / plan.steps_to_target, 0.0), 1.0)


def _one_per_offer(plans: Sequence[Plan]) -> list[Plan]:
    """The first (best-ranked) plan of each offer, in the planner's order."""
    seen: dict[OfferKey, Plan] = {}
    for p in plans:
        seen.setdefault(plan_key(p), p)
    return list(seen.values())
