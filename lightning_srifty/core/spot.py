"""Spot availability timelines, deadline-aware policies and the replay simulator.

The model is the one of *Can't Be Late* (Wu et al., NSDI'24): a job needs ``C`` hours of
compute before a deadline ``D``; on every tick of a trace a policy runs it on spot (only
where spot is up), on on-demand (always up, ``K`` times dearer) or leaves it idle; every
(re)start on a new instance costs a changeover delay ``d`` with no progress while the
instance is paid for. We add zones: one timeline holds several zones on the same ticks,
and a policy may migrate between them.

Policies see only the present. The simulator hands :meth:`Policy.decide` an
:class:`Observation` built from the current tick's availability vector and running
counts of what was seen so far, never the timeline itself, so no policy can peek at
future availability. The same interface drives the live controller.

Everything here is pure: numbers in, records out; prices are plain floats (the CLI looks
them up in the catalog).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

import numpy as np

from lightning_srifty.core.catalog import band_hourly_rate
from lightning_srifty.core.errors import ConfigError

PlacementKind = Literal["idle", "spot", "on-demand"]
ActionKind = Literal["stay", "spot", "on-demand", "idle"]
CheckpointMode = Literal["notice", "periodic"]
CHECKPOINT_MODES: tuple[str, ...] = ("notice", "periodic")
POLICY_NAMES: tuple[str, ...] = ("srifty", "uniform-progress", "greedy-spot", "on-demand")
DEFAULT_CHANGEOVER_HOURS = 0.2

# ---------------------------------------------------------------------------------------
# Timeline
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SpotTimeline:
    """Spot capacity of several zones on one shared tick grid.

    ``nodes_up[z, t]`` is how many of ``capacity`` nodes zone ``z`` can hold at tick ``t``.
    A single-node trace has ``capacity == 1``. A job of ``capacity`` nodes is an
    all-or-nothing gang: spot counts as available only when every node is up.
    """

    zones: tuple[str, ...]
    gap_hours: float
    nodes_up: np.ndarray
    """Integer array of shape ``(len(zones), ticks)``."""
    capacity: int = 1

    def __post_init__(self) -> None:
        if not self.zones:
            raise ConfigError("a spot timeline needs at least one zone")
        if not (self.gap_hours > 0 and math.isfinite(self.gap_hours)):
            raise ConfigError(f"tick gap must be a positive number of hours, got {self.gap_hours}")
        if self.nodes_up.ndim != 2 or self.nodes_up.shape[0] != len(self.zones):
            raise ConfigError(
                f"nodes_up must have shape ({len(self.zones)}, ticks), got {self.nodes_up.shape}"
            )
        if self.capacity < 1:
            raise ConfigError(f"capacity must be at least 1 node, got {self.capacity}")

    @property
    def ticks(self) -> int:
        return int(self.nodes_up.shape[1])

    @property
    def hours(self) -> float:
        return self.ticks * self.gap_hours

    def available(self, gang: int | None = None) -> np.ndarray:
        """Boolean ``(zones, ticks)``: spot can hold a gang of ``gang`` nodes (default all)."""
        need = self.capacity if gang is None else gang
        if not 1 <= need <= self.capacity:
            raise ConfigError(f"gang size must be 1..{self.capacity} nodes, got {need}")
        return np.asarray(self.nodes_up >= need)

    def select(self, zones: Sequence[int]) -> SpotTimeline:
        """The same timeline restricted to the zones at the given indices."""
        idx = list(zones)
        return SpotTimeline(
            zones=tuple(self.zones[i] for i in idx),
            gap_hours=self.gap_hours,
            nodes_up=self.nodes_up[idx],
            capacity=self.capacity,
        )

    def resample(self, gap_hours: float) -> SpotTimeline:
        """Coarsens to ``gap_hours`` ticks, keeping the fewest nodes up within each new tick.

        Taking the minimum is the conservative reading: an interruption anywhere inside a
        coarse tick preempts a job that ran through it.
        """
        if gap_hours < self.gap_hours:
            raise ConfigError(
                f"can only coarsen a timeline ({self.gap_hours} h ticks), not to {gap_hours} h"
            )
        ratio = gap_hours / self.gap_hours
        count = int(self.ticks // ratio)
        if count < 1:
            raise ConfigError(
                f"timeline of {self.hours:.3f} h is shorter than one {gap_hours} h tick"
            )
        starts = np.floor(np.arange(count) * ratio).astype(int)
        ends = np.minimum(np.ceil((np.arange(count) + 1) * ratio).astype(int), self.ticks)
        out = np.stack(
            [self.nodes_up[:, s:e].min(axis=1) for s, e in zip(starts, ends, strict=True)], axis=1
        )
        return replace(self, gap_hours=gap_hours, nodes_up=out)


def combine_timelines(parts: Sequence[SpotTimeline]) -> SpotTimeline:
    """Stacks zones from several timelines onto one grid.

    Timelines are aligned by tick index; different gaps are resampled to the coarsest and
    the result is cut to the shortest. All parts must have the same node capacity.
    """
    if not parts:
        raise ConfigError("no spot timelines to combine")
    capacities = {p.capacity for p in parts}
    if len(capacities) != 1:
        raise ConfigError(f"cannot mix traces of different node counts: {sorted(capacities)}")
    gap = max(p.gap_hours for p in parts)
    same = [p if math.isclose(p.gap_hours, gap) else p.resample(gap) for p in parts]
    ticks = min(p.ticks for p in same)
    return SpotTimeline(
        zones=tuple(z for p in same for z in p.zones),
        gap_hours=gap,
        nodes_up=np.concatenate([p.nodes_up[:, :ticks] for p in same], axis=0),
        capacity=parts[0].capacity,
    )


# ---------------------------------------------------------------------------------------
# Checkpointing
# ---------------------------------------------------------------------------------------


def young_daly_interval(checkpoint_cost_hours: float, mtbf_hours: float) -> float:
    """First-order optimal checkpoint interval ``sqrt(2 · C_ckpt · MTBF)`` (Young 1974).

    Checkpointing more often wastes time writing; less often loses more work per failure;
    this interval balances the two to first order.
    """
    if checkpoint_cost_hours <= 0:
        raise ConfigError(f"checkpoint cost must be > 0 hours, got {checkpoint_cost_hours}")
    if mtbf_hours <= 0:
        raise ConfigError(f"MTBF must be > 0 hours, got {mtbf_hours}")
    return math.sqrt(2.0 * checkpoint_cost_hours * mtbf_hours)


@dataclass(frozen=True)
class CheckpointModel:
    """How much work a preemption destroys.

    ``notice`` (the default) assumes the job saves within the cloud's preemption notice
    (two minutes on AWS, enough for a single-GPU model state), so a preemption costs only
    the changeover; this is the model *Can't Be Late* evaluates. ``periodic`` saves every
    Young/Daly interval, paying ``cost_hours`` per save, and loses the work since the last
    save on preemption; the MTBF in the interval is estimated online from the
    interruptions seen so far, starting from ``prior_mtbf_hours`` (by default the Spot
    Advisor's middle band) weighted as one observed interruption.
    """

    mode: CheckpointMode = "notice"
    cost_hours: float = 0.0
    prior_mtbf_hours: float = field(default_factory=lambda: 1.0 / band_hourly_rate(None))

    def __post_init__(self) -> None:
        if self.mode not in CHECKPOINT_MODES:
            raise ConfigError(
                f"checkpoint mode must be one of {CHECKPOINT_MODES}, got {self.mode!r}"
            )
        if self.mode == "periodic" and not self.cost_hours > 0:
            raise ConfigError("periodic checkpointing needs a checkpoint cost > 0 hours")
        if not self.prior_mtbf_hours > 0:
            raise ConfigError(f"prior MTBF must be > 0 hours, got {self.prior_mtbf_hours}")

    def interval_hours(self, up_hours_seen: float, interruptions_seen: int) -> float:
        """Young/Daly interval with the MTBF pooled from what was observed so far."""
        mtbf = (up_hours_seen + self.prior_mtbf_hours) / (interruptions_seen + 1)
        return young_daly_interval(self.cost_hours, mtbf)


# ---------------------------------------------------------------------------------------
# Policy interface
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where the job is: nowhere, spot in zone ``zone``, or on-demand."""

    kind: PlacementKind = "idle"
    zone: int | None = None

    @property
    def running(self) -> bool:
        return self.kind != "idle"

    def label(self, zones: Sequence[str]) -> str:
        if self.kind == "spot" and self.zone is not None:
            return f"spot:{zones[self.zone]}"
        return self.kind


IDLE = Placement()
ON_DEMAND = Placement("on-demand")


@dataclass(frozen=True)
class Action:
    """A policy's decision for the current tick, with a reason for the migration log."""

    kind: ActionKind
    zone: int | None = None
    reason: str = ""

    @staticmethod
    def stay(reason: str = "") -> Action:
        return Action("stay", reason=reason)

    @staticmethod
    def spot(zone: int, reason: str = "") -> Action:
        return Action("spot", zone=zone, reason=reason)

    @staticmethod
    def on_demand(reason: str = "") -> Action:
        return Action("on-demand", reason=reason)

    @staticmethod
    def idle(reason: str = "") -> Action:
        return Action("idle", reason=reason)


@dataclass(frozen=True)
class MarketCounts:
    """Counts of what the spot market did over a stretch of the past, per zone and overall.

    Only sums over ticks already seen, so a policy built on them cannot peek ahead.
    """

    hours: float
    """Hours watched."""
    up_hours: tuple[float, ...]
    """Per zone: hours spot was up."""
    interruptions: tuple[int, ...]
    """Per zone: up-to-down transitions."""
    any_up_hours: float
    """Hours spot was up in at least one zone."""
    any_interruptions: int
    """Transitions from spot up somewhere to spot down everywhere (market-wide outages)."""

    def since(self, earlier: MarketCounts) -> MarketCounts:
        """What happened between ``earlier`` and these counts."""
        return MarketCounts(
            hours=self.hours - earlier.hours,
            up_hours=tuple(a - b for a, b in zip(self.up_hours, earlier.up_hours, strict=True)),
            interruptions=tuple(
                a - b for a, b in zip(self.interruptions, earlier.interruptions, strict=True)
            ),
            any_up_hours=self.any_up_hours - earlier.any_up_hours,
            any_interruptions=self.any_interruptions - earlier.any_interruptions,
        )


@dataclass(frozen=True)
class Observation:
    """Everything a policy may know at one tick: the present and counts of the past."""

    time_hours: float
    """Hours since the job was submitted."""
    gap_hours: float
    """How long until the next decision."""
    progress_hours: float
    """Compute done, including work not yet checkpointed."""
    unsaved_hours: float
    """Part of ``progress_hours`` a preemption would destroy."""
    job_hours: float
    deadline_hours: float
    changeover_hours: float
    changeover_left_hours: float
    """Restart delay still to pay on the current placement."""
    placement: Placement
    preempted: bool
    """The spot placement was lost at this tick (the job is now idle)."""
    available: tuple[bool, ...]
    """Spot availability of every zone at this tick only."""
    spot_prices: tuple[float, ...]
    """$/h per zone for the whole job (all gang nodes)."""
    ondemand_price: float
    market: MarketCounts
    """What the market did from when it was first watched until now."""
    history: MarketCounts
    """The part of :attr:`market` seen before the job was submitted.

    ``market`` minus ``history`` is what happened during this job. Policies use the
    split to weigh old history less than the present: spot markets drift over days.
    """

    @property
    def up_hours_seen(self) -> tuple[float, ...]:
        """Per zone: hours spot was seen up before now (since the market was first watched)."""
        return self.market.up_hours

    @property
    def interruptions_seen(self) -> tuple[int, ...]:
        """Per zone: up-to-down transitions seen up to now."""
        return self.market.interruptions

    @property
    def remaining_hours(self) -> float:
        """Compute still needed if nothing is lost."""
        return max(self.job_hours - self.progress_hours, 0.0)

    @property
    def remaining_at_risk_hours(self) -> float:
        """Compute still needed if a preemption destroyed the unsaved work now."""
        return self.remaining_hours + self.unsaved_hours

    @property
    def time_left_hours(self) -> float:
        return self.deadline_hours - self.time_hours

    @property
    def expected_progress_hours(self) -> float:
        """Uniform Progress's target ``ep(t) = t · C / D``."""
        return self.time_hours * self.job_hours / self.deadline_hours

    @property
    def ondemand_slack_hours(self) -> float:
        """Spare hours left if the job went on-demand now and stayed there.

        Switching costs a changeover unless already on on-demand, where only what is
        left of the current changeover counts.
        """
        switch = (
            self.changeover_left_hours
            if self.placement.kind == "on-demand"
            else self.changeover_hours
        )
        return self.time_left_hours - self.remaining_at_risk_hours - switch


class Policy(Protocol):
    """Decides once per tick. Must not keep hidden state between calls."""

    @property
    def name(self) -> str: ...

    def decide(self, observation: Observation) -> Action: ...


# ---------------------------------------------------------------------------------------
# Policies
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OnDemandPolicy:
    """Always on-demand: the cost reference every spot policy is measured against."""

    name: str = "on-demand"

    def decide(self, observation: Observation) -> Action:
        if observation.placement.kind == "on-demand":
            return Action.stay()
        return Action.on_demand("on-demand only")


@dataclass(frozen=True)
class GreedySpotPolicy:
    """Spot in the home zone whenever it is up; idle otherwise; on-demand for good only
    when the Can't Be Late safety net ``R < C_left + 2d`` fires."""

    home_zone: int = 0
    name: str = "greedy-spot"

    def decide(self, observation: Observation) -> Action:
        obs = observation
        if _cbl_safety_net(obs):
            if obs.placement.kind == "on-demand":
                return Action.stay()
            return Action.on_demand("safety net: deadline needs on-demand")
        if obs.placement.kind == "spot":
            return Action.stay()
        if obs.available[self.home_zone]:
            return Action.spot(self.home_zone, "spot up in home zone")
        if obs.placement.running:
            return Action.idle("spot down")
        return Action.stay()


@dataclass(frozen=True)
class UniformProgressPolicy:
    """Can't Be Late's Uniform Progress (NSDI'24 §5), single home zone.

    Our reading of the paper: use spot whenever it is up; when it is down and progress is
    behind ``ep(t) = t·C/D``, run on-demand; once on on-demand, leave it only after being
    ``2d`` ahead of ``ep(t)`` (hysteresis, so one changeover to spot and one back cannot
    put the job behind again); safety net: on-demand for good once ``R < C_left + 2d``.
    """

    home_zone: int = 0
    name: str = "uniform-progress"

    def decide(self, observation: Observation) -> Action:
        obs = observation
        if _cbl_safety_net(obs):
            if obs.placement.kind == "on-demand":
                return Action.stay()
            return Action.on_demand("safety net: deadline needs on-demand")
        ep = obs.expected_progress_hours
        up = obs.available[self.home_zone]
        if obs.placement.kind == "on-demand":
            if obs.progress_hours < ep + 2 * obs.changeover_hours:
                return Action.stay()
            if up:
                return Action.spot(self.home_zone, "ahead of uniform progress, spot up")
            return Action.idle("ahead of uniform progress")
        if obs.placement.kind == "spot":
            return Action.stay()
        if up:
            return Action.spot(self.home_zone, "spot up in home zone")
        if obs.progress_hours < ep:
            return Action.on_demand("behind uniform progress, spot down")
        return Action.stay()


def _cbl_safety_net(obs: Observation) -> bool:
    return obs.time_left_hours < obs.remaining_at_risk_hours + 2 * obs.changeover_hours


@dataclass(frozen=True)
class SriftyPolicy:
    """Deadline-aware, multi-zone: spend slack on waiting for spot, keep enough for the end.

    Slack (time left minus the work left, see :attr:`Observation.ondemand_slack_hours`)
    is the resource. Waiting through an outage spends it without spending money;
    on-demand buys it back at ``K`` times the spot price. Seen as a flow, an hour of
    on-demand bought now costs what the same hour costs later, and later the job knows
    more (spot may come back and make it unnecessary), so on-demand is best deferred —
    *unless* the job runs out of slack while work is left: from then on every hour is
    on-demand, even while spot is up, because a changeover no longer fits. What the job
    needs slack for near the deadline is the changeovers that let it follow spot: ``d``
    for every preemption (restart elsewhere) and ``d`` more for every market-wide outage
    (back from on-demand to spot). Uniform Progress instead keeps slack proportional to
    the work left at the initial slack ratio, and so buys on-demand early even when the
    slack is ample. This policy keeps a
    **reserve** of ``R · d · (λ_zone + λ_any)`` (``R`` the work left, ``λ_zone`` the
    interruptions per up-hour of the zone it prefers, ``λ_any`` the market-wide outages
    per up-hour) and spends any slack above it waiting instead of paying for on-demand.

    Rates are estimated online from :class:`MarketCounts`: what happened during the job
    counts in full; older history counts as at most one deadline's worth of hours (spot
    markets drift over days, so a month-old average must not outvote the present), and a
    weak prior of ``prior_interruptions_per_hour`` over one hour covers a market never
    seen before.

    Rules, in order, all from the present observation:

    1. Safety net: if the slack is under two ticks, go (or stay) on-demand. Slack falls
       by at most one tick between decisions, so the job can always still switch and
       finish in time; no rule below spends slack that would take it under this line.
    2. Running on spot that is still up: stay.
    3. On on-demand with spot up: leave if the slack pays a round trip (two
       changeovers) and one of: spot is up in two zones or more (a preemption can
       migrate instead of coming back), the round trip leaves the reserve intact, or the
       job is ``2d`` ahead of Uniform Progress's ``ep(t)`` (where Uniform Progress itself
       would leave).
    4. Idle or just preempted, spot up somewhere and the slack pays one more changeover:
       (re)start in the zone with the lowest expected cost per useful hour (price times
       ``1 + λ·d``).
    5. No spot anywhere: wait while the slack stays above the reserve (plus the
       changeover on-demand will cost), otherwise on-demand.

    With one zone the market-wide rate is the zone's own and the reserve is ``2·d·λ·R``.
    """

    name: str = "srifty"
    prior_interruptions_per_hour: float = 0.1
    """Weak prior for a market with no history: one interruption per 10 h of uptime,
    weighted as one observed hour, so the market's own history dominates within hours."""

    def decide(self, observation: Observation) -> Action:
        obs = observation
        d = obs.changeover_hours
        slack = obs.ondemand_slack_hours
        kind = obs.placement.kind
        net = 2 * obs.gap_hours
        if slack < net:
            if kind == "on-demand":
                return Action.stay()
            return Action.on_demand("safety net: slack below two ticks")
        if kind == "spot":
            return Action.stay()

        rates, any_rate = self._rates(obs)
        best = self._best_zone(obs, rates, only_up=True)
        reserve = self._reserve(obs, rates, any_rate)
        if kind == "on-demand":
            if best is None or slack - 2 * d < net:
                return Action.stay()
            if sum(obs.available) >= 2:
                return Action.spot(best, "spot up in two zones or more")
            if slack - 2 * d >= reserve + net:
                return Action.spot(best, "slack above the reserve pays a round trip")
            if obs.progress_hours >= obs.expected_progress_hours + 2 * d:
                return Action.spot(best, "ahead of uniform progress")
            return Action.stay()
        if best is not None and slack - d >= net:
            return Action.spot(best, "migrating to another zone" if obs.preempted else "spot up")
        if slack - d - net > reserve:
            if kind == "idle":
                return Action.stay()
            return Action.idle("no spot in any zone, slack above the reserve: wait")
        return Action.on_demand("no spot in any zone, slack down to the reserve")

    def reserve_hours(self, obs: Observation) -> float:
        """Slack to keep for the changeovers of the work left: ``R · d · (λ_zone + λ_any)``."""
        return self._reserve(obs, *self._rates(obs))

    def _reserve(self, obs: Observation, rates: tuple[float, ...], any_rate: float) -> float:
        zone = self._best_zone(obs, rates, only_up=False)
        zone_rate = 0.0 if zone is None else rates[zone]
        return obs.remaining_at_risk_hours * obs.changeover_hours * (zone_rate + any_rate)

    def _rate(
        self, during: tuple[float, float], before: tuple[float, float], obs: Observation
    ) -> float:
        """Events per hour: the job's own window in full, older history capped at ``D`` hours."""
        events, hours = during
        old_events, old_hours = before
        weight = min(1.0, obs.deadline_hours / old_hours) if old_hours > 0 else 0.0
        return (events + weight * old_events + self.prior_interruptions_per_hour) / (
            hours + weight * old_hours + 1.0
        )

    def _rates(self, obs: Observation) -> tuple[tuple[float, ...], float]:
        """Interruptions per up-hour of every zone, and market-wide outages per up-hour."""
        old = obs.history
        new = obs.market.since(old)
        zones = tuple(
            self._rate(
                (new.interruptions[z], new.up_hours[z]),
                (old.interruptions[z], old.up_hours[z]),
                obs,
            )
            for z in range(len(obs.available))
        )
        anywhere = self._rate(
            (new.any_interruptions, new.any_up_hours),
            (old.any_interruptions, old.any_up_hours),
            obs,
        )
        return zones, anywhere

    @staticmethod
    def _best_zone(obs: Observation, rates: tuple[float, ...], *, only_up: bool) -> int | None:
        """Zone with the lowest expected cost per useful hour, ``price · (1 + λ·d)``: each
        interruption costs a changeover, so the useful share of a paid hour is
        ``1 / (1 + λ·d)``."""
        best: tuple[float, int] | None = None
        for zone, up in enumerate(obs.available):
            if only_up and not up:
                continue
            cost = obs.spot_prices[zone] * (1.0 + rates[zone] * obs.changeover_hours)
            if best is None or cost < best[0]:
                best = (cost, zone)
        return None if best is None else best[1]


def make_policy(name: str, home_zone: int = 0) -> Policy:
    """Builds a policy by its CLI name."""
    if name == "srifty":
        return SriftyPolicy()
    if name == "uniform-progress":
        return UniformProgressPolicy(home_zone=home_zone)
    if name == "greedy-spot":
        return GreedySpotPolicy(home_zone=home_zone)
    if name == "on-demand":
        return OnDemandPolicy()
    raise ConfigError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")


# ---------------------------------------------------------------------------------------
# Simulator
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpotJob:
    """What to replay: the job, its deadline and what restarts and instances cost."""

    job_hours: float
    deadline_hours: float
    spot_prices: tuple[float, ...]
    """$/h per zone of the timeline, for the whole job."""
    ondemand_price: float
    changeover_hours: float = DEFAULT_CHANGEOVER_HOURS
    checkpoint: CheckpointModel = field(default_factory=CheckpointModel)

    def __post_init__(self) -> None:
        if not self.job_hours > 0:
            raise ConfigError(f"--job-hours must be > 0, got {self.job_hours}")
        if not self.deadline_hours >= self.job_hours:
            raise ConfigError(
                f"--deadline-hours ({self.deadline_hours}) must be at least --job-hours "
                f"({self.job_hours})"
            )
        if not self.changeover_hours >= 0:
            raise ConfigError(f"--changeover-hours must be >= 0, got {self.changeover_hours}")
        if not self.ondemand_price > 0:
            raise ConfigError(f"on-demand price must be > 0 $/h, got {self.ondemand_price}")
        if any(not p >= 0 for p in self.spot_prices):
            raise ConfigError(f"spot prices must be >= 0 $/h, got {self.spot_prices}")


@dataclass(frozen=True)
class MigrationEvent:
    """One change of placement, for the log the controller and the CLI show."""

    tick: int
    time_hours: float
    reason: str
    source: str
    target: str
    lost_hours: float
    """Changeover to pay on the new placement plus work destroyed by a preemption."""


@dataclass(frozen=True)
class SimulationResult:
    """Outcome of replaying one job under one policy."""

    policy: str
    zones: tuple[str, ...]
    start_tick: int
    cost: float
    ondemand_cost: float
    """What running the job on on-demand from the start costs (one changeover included)."""
    finish_hours: float | None
    """Hours from submission to completion; ``None`` if it never finished."""
    deadline_hours: float
    job_hours: float
    spot_hours: float
    ondemand_hours: float
    preemptions: int
    migrations: int
    """Restarts on a new instance after the job had already run somewhere."""
    events: tuple[MigrationEvent, ...]

    @property
    def deadline_met(self) -> bool:
        return self.finish_hours is not None and self.finish_hours <= self.deadline_hours + 1e-9

    @property
    def cost_ratio(self) -> float:
        return self.cost / self.ondemand_cost

    def to_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "zones": list(self.zones),
            "start_tick": self.start_tick,
            "job_hours": self.job_hours,
            "deadline_hours": self.deadline_hours,
            "cost": self.cost,
            "ondemand_cost": self.ondemand_cost,
            "cost_ratio": self.cost_ratio,
            "finish_hours": self.finish_hours,
            "deadline_met": self.deadline_met,
            "spot_hours": self.spot_hours,
            "ondemand_hours": self.ondemand_hours,
            "preemptions": self.preemptions,
            "migrations": self.migrations,
            "events": [
                {
                    "tick": e.tick,
                    "time_hours": e.time_hours,
                    "reason": e.reason,
                    "from": e.source,
                    "to": e.target,
                    "lost_hours": e.lost_hours,
                }
                for e in self.events
            ],
        }


def simulate(
    policy: Policy,
    timeline: SpotTimeline,
    job: SpotJob,
    *,
    start_tick: int = 0,
    gang: int | None = None,
) -> SimulationResult:
    """Replays ``job`` submitted at ``start_tick`` of ``timeline`` under ``policy``.

    Availability at tick ``t`` holds for the whole tick. A spot placement whose zone is
    down at ``t`` is preempted before the policy decides. Past the end of the trace spot
    counts as unavailable everywhere, so a run always ends. The run stops when the job
    finishes, or at ``max(3·D, D + C + d)`` hours if the policy never finishes it.
    """
    if len(job.spot_prices) != len(timeline.zones):
        raise ConfigError(f"{len(job.spot_prices)} spot prices for {len(timeline.zones)} zones")
    if not 0 <= start_tick < timeline.ticks:
        raise ConfigError(f"start tick {start_tick} outside the trace (0..{timeline.ticks - 1})")
    horizon_ticks = (
        int(
            math.ceil(
                max(
                    3 * job.deadline_hours,
                    job.deadline_hours + job.job_hours + job.changeover_hours,
                )
                / timeline.gap_hours
            )
        )
        + 1
    )
    full = timeline.available(gang)
    window = full[:, start_tick : start_tick + horizon_ticks]
    rows = [tuple(col) for col in window.T.tolist()]
    # Market history from the start of the trace up to each tick (the past only).
    falls = np.zeros_like(full, dtype=np.int64)
    falls[:, 1:] = full[:, :-1] & ~full[:, 1:]
    up_before = np.cumsum(full, axis=1) - full
    falls_so_far = np.cumsum(falls, axis=1)
    anywhere = np.asarray(full.any(axis=0))
    any_falls = np.zeros(anywhere.shape, dtype=np.int64)
    any_falls[1:] = anywhere[:-1] & ~anywhere[1:]
    any_up_before = np.cumsum(anywhere) - anywhere
    any_falls_so_far = np.cumsum(any_falls)

    last = full.shape[1] - 1
    zones_n = len(timeline.zones)
    gap = timeline.gap_hours
    d = job.changeover_hours
    ckpt = job.checkpoint
    periodic = ckpt.mode == "periodic"
    horizon = horizon_ticks * gap
    never = tuple(False for _ in range(zones_n))
    prices = tuple(float(p) for p in job.spot_prices)

    def counts(tick: int) -> MarketCounts:
        return MarketCounts(
            hours=tick * gap,
            up_hours=tuple((up_before[:, tick] * gap).tolist()),
            interruptions=tuple(falls_so_far[:, tick].tolist()),
            any_up_hours=float(any_up_before[tick]) * gap,
            any_interruptions=int(any_falls_so_far[tick]),
        )

    history = counts(start_tick)
    placement = IDLE
    progress = 0.0
    saved = 0.0
    changeover_left = 0.0
    ckpt_write_left = 0.0
    cost = spot_hours = ondemand_hours = 0.0
    preemptions = migrations = 0
    has_run = False
    events: list[MigrationEvent] = []
    finish: float | None = None
    tick = 0
    while tick * gap < horizon:
        now = tick * gap
        current = rows[tick] if tick < len(rows) else never
        market = counts(min(start_tick + tick, last))
        preempted = False
        lost = 0.0
        source = placement
        if placement.kind == "spot" and placement.zone is not None and not current[placement.zone]:
            preempted = True
            preemptions += 1
            lost = progress - saved
            progress = saved
            placement = IDLE
            changeover_left = ckpt_write_left = 0.0
        obs = Observation(
            time_hours=now,
            gap_hours=gap,
            progress_hours=progress,
            unsaved_hours=progress - saved,
            job_hours=job.job_hours,
            deadline_hours=job.deadline_hours,
            changeover_hours=d,
            changeover_left_hours=changeover_left,
            placement=placement,
            preempted=preempted,
            available=current,
            spot_prices=prices,
            ondemand_price=job.ondemand_price,
            market=market,
            history=history,
        )
        action = policy.decide(obs)
        target = _apply(action, placement, current, policy.name)
        if preempted and target == IDLE:
            events.append(
                MigrationEvent(tick, now, "preempted", source.label(timeline.zones), "idle", lost)
            )
        if target != placement:
            if target.running:
                if has_run:
                    migrations += 1
                has_run = True
                changeover_left = d
                saved = progress  # a voluntary move saves first; after preemption nothing unsaved
                ckpt_write_left = 0.0
            why = ("preempted: " if preempted else "") + (action.reason or action.kind)
            if target.running or not preempted:
                events.append(
                    MigrationEvent(
                        tick,
                        now,
                        why,
                        source.label(timeline.zones),
                        target.label(timeline.zones),
                        (d if target.running else 0.0) + lost,
                    )
                )
            placement = target

        # Advance one tick.
        if placement.running:
            price = (
                prices[placement.zone]
                if placement.kind == "spot" and placement.zone is not None
                else job.ondemand_price
            )
            budget = gap
            step = min(changeover_left, budget)
            changeover_left -= step
            budget -= step
            interval = (
                ckpt.interval_hours(sum(market.up_hours), sum(market.interruptions))
                if periodic and placement.kind == "spot"
                else math.inf
            )
            while budget > 1e-12 and progress < job.job_hours - 1e-12:
                if ckpt_write_left > 0:
                    step = min(ckpt_write_left, budget)
                    ckpt_write_left -= step
                    budget -= step
                    if ckpt_write_left <= 1e-12:
                        ckpt_write_left = 0.0
                        saved = progress
                    continue
                until_ckpt = saved + interval - progress
                step = min(budget, job.job_hours - progress, until_ckpt)
                progress += step
                budget -= step
                if progress - saved >= interval - 1e-12:
                    ckpt_write_left = ckpt.cost_hours
            if not (periodic and placement.kind == "spot"):
                saved = progress  # saved at the preemption notice; on-demand is never preempted
            used = gap - budget
            cost += price * used
            if placement.kind == "spot":
                spot_hours += used
            else:
                ondemand_hours += used
            if progress >= job.job_hours - 1e-12:
                finish = now + used
                break
        tick += 1

    return SimulationResult(
        policy=policy.name,
        zones=timeline.zones,
        start_tick=start_tick,
        cost=cost,
        ondemand_cost=job.ondemand_price * (job.job_hours + d),
        finish_hours=finish,
        deadline_hours=job.deadline_hours,
        job_hours=job.job_hours,
        spot_hours=spot_hours,
        ondemand_hours=ondemand_hours,
        preemptions=preemptions,
        migrations=migrations,
        events=tuple(events),
    )


def offline_optimal_cost(
    timeline: SpotTimeline, job: SpotJob, *, start_tick: int = 0, gang: int | None = None
) -> float:
    """Lower bound on what any policy can pay for ``job``: the cheapest schedule that
    knows the whole future trace.

    A dynamic program over ticks, placements (idle, spot in each zone, on-demand) and
    whole ticks of progress finds the cheapest way to finish by the deadline, paying the
    changeover on every start and losing the placement when its zone goes down, as
    :func:`simulate` does. To stay on the tick grid it rounds in the schedule's favour:
    the changeover and the work are rounded *down* to whole ticks and the deadline *up*,
    so every schedule the simulator can play is also feasible here at no more cost, and
    the result is a true lower bound (exact when ``d``, ``C`` and ``D`` are multiples of
    the tick). Checkpoint costs are ignored, which only lowers it further.

    It exists so the benchmark has a reference: how close an online policy gets to what
    was possible on that stretch of trace, and how much is inherent to the market.

    Returns:
        The cost in $ (compare with :attr:`SimulationResult.cost`); ``inf`` if even
        on-demand from the start could not make the deadline.
    """
    if len(job.spot_prices) != len(timeline.zones):
        raise ConfigError(f"{len(job.spot_prices)} spot prices for {len(timeline.zones)} zones")
    if not 0 <= start_tick < timeline.ticks:
        raise ConfigError(f"start tick {start_tick} outside the trace (0..{timeline.ticks - 1})")
    gap = timeline.gap_hours
    eps = 1e-9
    change = int(math.floor(job.changeover_hours / gap + eps))
    work = int(math.floor(job.job_hours / gap + eps))
    ticks = int(math.ceil(job.deadline_hours / gap - eps))
    if work == 0:
        return 0.0
    zones_n = len(timeline.zones)
    span = ticks + change + 1
    up = np.ones((zones_n + 1, span), dtype=bool)  # last row: on-demand, always up
    up[:zones_n] = False  # past the end of the trace spot is down, as in simulate()
    part = timeline.available(gang)[:, start_tick : start_tick + span]
    up[:zones_n, : part.shape[1]] = part
    step = np.array([*job.spot_prices, job.ondemand_price], dtype=float) * gap
    # holds[p, t]: placement p stays up through the changeover ticks t .. t + change - 1.
    downs = np.concatenate([np.zeros((zones_n + 1, 1)), np.cumsum(~up, axis=1)], axis=1)
    holds = np.zeros_like(up)
    holds[:, : span - change + 1] = (downs[:, change:] - downs[:, : span - change + 1]) == 0

    inf = math.inf
    running = np.full((zones_n + 1, work), inf)  # [placement, progress] after changeover
    idle = np.full(work, inf)
    idle[0] = 0.0
    arriving = np.full((change + 1, zones_n + 1, work), inf)  # starts ending their changeover
    best_done = inf
    for t in range(ticks):
        slot = t % (change + 1)
        np.minimum(running, arriving[slot], out=running)
        arriving[slot].fill(inf)
        down = ~up[:, t]
        if down.any():
            idle = np.minimum(idle, running[down].min(axis=0))
            running[down] = inf
        idle = np.minimum(idle, running.min(axis=0))  # any state may stop and wait
        if change == 0:
            ok = up[:, t]
            running[ok] = np.minimum(running[ok], idle[None, :])
        else:
            ok = holds[:, t]
            land = arriving[(t + change) % (change + 1)]
            land[ok] = np.minimum(land[ok], idle[None, :] + change * step[ok][:, None])
        best_done = min(best_done, float((running[:, work - 1] + step).min()))
        running[:, 1:] = running[:, :-1] + step[:, None]
        running[:, 0] = inf
    return best_done


def _apply(
    action: Action, placement: Placement, available: tuple[bool, ...], policy: str
) -> Placement:
    if action.kind == "stay":
        return placement
    if action.kind == "idle":
        return IDLE
    if action.kind == "on-demand":
        return ON_DEMAND
    if action.kind == "spot":
        zone = action.zone
        if zone is None or not 0 <= zone < len(available):
            raise ValueError(f"policy {policy!r} chose spot zone {zone}, not a zone index")
        if not available[zone]:
            raise ValueError(f"policy {policy!r} chose spot zone {zone}, which is down now")
        return Placement("spot", zone)
    raise ValueError(f"policy {policy!r} returned unknown action {action.kind!r}")
