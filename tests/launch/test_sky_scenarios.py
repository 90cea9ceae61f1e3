"""The real controller on SkyPilot, through the fake API server's failure scenarios.

Each row scripts what the cloud and the API server do (tests/fakes.py: ClusterScript,
outages, dropped log streams), runs :class:`Controller` with a real
:class:`SkyBackend`, the real spot policy and real ``sky.Task`` objects, on virtual
time, and checks the outcome: the run completes or ends with one clear line, and every
cluster it started is down afterwards (the fake records each ``down``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lightning_srifty.core.cluster import Plan
from lightning_srifty.core.errors import LaunchError
from lightning_srifty.core.monitor import Expectation
from lightning_srifty.core.spot import make_policy
from lightning_srifty.io.cluster_ledger import ClusterLedger
from lightning_srifty.launch.controller import Controller, RunSummary
from lightning_srifty.launch.migration import Candidates, PolicyDecider, plan_key
from lightning_srifty.launch.sky_backend import ApiPatience, SkyBackend
from tests.fakes import ClusterScript, FakeSkyApi
from tests.launch.test_sky_backend import homogeneous

TARGET = 2000
"""Steps; at the fake's 2 steps a virtual second, about 17 virtual minutes of training."""
HOME = homogeneous("g5.12xlarge", "use1-az1", 2, use_spot=True)
OTHER = homogeneous("g4dn.12xlarge", "use1-az2", 2, use_spot=True)
ON_DEMAND = homogeneous("g5.12xlarge", "use1-az1", 2, use_spot=False)


@dataclass
class Outcome:
    summary: RunSummary | None
    error: str
    fake: FakeSkyApi
    backend: SkyBackend
    controller: Controller
    decider: PolicyDecider
    ledger: list[tuple[str, str]] = field(default_factory=list)


def run(
    tmp_path: Path,
    scripts: list[ClusterScript],
    *,
    first: Plan = HOME,
    prepare: Callable[[FakeSkyApi], None] | None = None,
    api: ApiPatience | None = None,
) -> Outcome:
    fake = FakeSkyApi(scripts=scripts)
    if prepare is not None:
        prepare(fake)
    backend = SkyBackend(
        sdk=fake,
        setup="true",
        ship_package=False,
        run_dir=tmp_path,
        checkpoint_uri="s3://srifty-bucket/run",
        api=api,
        clock=fake.clock.monotonic,
        sleep=fake.clock.sleep,
        # The log follower's reconnect waits are real and short: the virtual clock runs
        # only as fast as the controller polls, so a follower that waited on it would
        # fall behind a job that, in virtual time, finishes in milliseconds.
        log_sleep=lambda seconds: time.sleep(0.001),
    )
    decider = PolicyDecider(
        policy=make_policy("srifty"),
        candidates=lambda remaining, elapsed: Candidates((HOME, OTHER), ON_DEMAND),
        home=plan_key(first),
        target_steps=TARGET,
        deadline_h=None,
        changeover_h=0.05,
        wait_h=60.0 / 3600.0,
    )
    controller = Controller(
        backend=backend,
        script="train.py",
        script_args=("--seed", "3"),
        run_dir=tmp_path,
        checkpoint_uri="s3://srifty-bucket/run",
        target_steps=TARGET,
        next_planner=decider,
        expectation_for=lambda p: Expectation(p.step_s, p.step_s, p.step_s, p.hourly_usd, TARGET),
        progress_is_local=False,
        poll_s=10.0,
        wait_s=60.0,
        clock=fake.clock.monotonic,
        sleep=fake.clock.sleep,
        wall=fake.clock.time,
    )
    summary, error = None, ""
    try:
        summary = controller.run(first)
    except LaunchError as exc:
        error = str(exc)
    ledger = [(e.name, e.state) for e in ClusterLedger(tmp_path).entries()]
    return Outcome(summary, error, fake, backend, controller, decider, ledger)


def _launched(outcome: Outcome) -> list[str]:
    return [name for name, _, _ in outcome.fake.launched]


def _assert_all_down(outcome: Outcome) -> None:
    """Nothing the run started may still exist, and the ledger agrees."""
    assert outcome.fake.left_up() == []
    assert all(state == "down" for _, state in outcome.ledger), outcome.ledger
    assert {name for name, _ in outcome.ledger} == set(_launched(outcome))


def _completed(outcome: Outcome) -> RunSummary:
    assert outcome.error == "", outcome.error
    assert outcome.summary is not None
    assert outcome.summary.steps_done == TARGET
    return outcome.summary


# ------------------------------------------------------------------------- scenarios
def healthy(o: Outcome) -> None:
    summary = _completed(o)
    assert len(summary.attempts) == 1 and summary.migrations == ()
    assert o.fake.downs == _launched(o)  # torn down once the job was done


def notice_then_terminated(o: Outcome) -> None:
    summary = _completed(o)
    (move,) = summary.migrations
    assert move.reason.startswith("spot preemption; srifty")
    # The job saved on its notice: the next attempt resumed at the very step.
    assert move.resumed_step == move.step_at_preemption > 0
    assert summary.attempts[0].state.value == "preempted"
    first = _launched(o)[0]
    assert first in o.fake.downs  # downed during the notice window, before AWS took it
    assert o.decider.history[plan_key(HOME)].interruptions == 1


def notice_then_stopped(o: Outcome) -> None:
    notice_then_terminated(o)


def reclaimed_without_notice(o: Outcome) -> None:
    summary = _completed(o)
    (move,) = summary.migrations
    assert move.reason.startswith("spot preemption")
    assert move.resumed_step <= move.step_at_preemption  # work since the last save is lost
    assert _launched(o)[0] not in o.fake.downs  # it was already gone


def partial_preemption(o: Outcome) -> None:
    summary = _completed(o)
    (move,) = summary.migrations
    assert move.reason.startswith("spot preemption")
    first = o.fake.clusters[_launched(o)[0]]
    assert first.reclaim_at is not None and first.downed_at is not None
    waited = first.downed_at - first.reclaim_at
    assert o.backend.init_timeout_s <= waited <= o.backend.init_timeout_s + 30  # no hang
    assert _launched(o)[0] in o.fake.downs


def no_capacity_then_other_zone(o: Outcome) -> None:
    summary = _completed(o)
    assert summary.migrations[0].reason.startswith("no capacity")
    second_task = o.fake.launched[1][1]
    (res,) = second_task.resources
    assert res.instance_type == OTHER.cluster.groups[0].offer.instance_type


def no_capacity_anywhere(o: Outcome) -> None:
    assert o.summary is None
    assert o.error.startswith("gave up after 10 attempts")


def api_away_for_minutes(o: Outcome) -> None:
    _completed(o)
    assert o.backend.api_retries >= 3


def api_away_too_long(o: Outcome) -> None:
    assert o.summary is None
    assert "the SkyPilot API server was unreachable for" in o.error
    assert "more than the 30 min srifty-launch waits" in o.error
    assert "\n" not in o.error


def log_stream_drops(o: Outcome) -> None:
    summary = _completed(o)
    events = summary.attempts[0].events
    assert len(events) == len({e.to_line() for e in events})  # no duplicates
    assert [e.event for e in events][0] == "start" and events[-1].event == "done"


def log_lost_and_notice(o: Outcome) -> None:
    summary = _completed(o)
    (move,) = summary.migrations  # no log: the notice window and the vanished cluster decide
    assert move.reason.startswith("spot preemption")


def setup_fails(o: Outcome) -> None:
    assert o.summary is None
    assert "setup failed on srifty-1-" in o.error and "FAILED_SETUP" in o.error
    assert o.fake.downs == _launched(o)


def user_code_crashes(o: Outcome) -> None:
    assert o.summary is None
    assert o.error.startswith("training failed on 2x g5.12xlarge")
    assert "the job on srifty-1-" in o.error and "sky logs" in o.error


def on_demand_interrupted(o: Outcome) -> None:
    summary = _completed(o)
    (move,) = summary.migrations
    assert move.reason.startswith("on-demand interruption")
    assert "spot preemption" not in move.reason
    seen = o.decider.history[plan_key(ON_DEMAND)]
    assert seen.interruptions == 0  # not counted against the spot market


SCENARIOS: dict[str, tuple[list[ClusterScript], dict[str, Any], Callable[[Outcome], None]]] = {
    "healthy": ([ClusterScript()], {}, healthy),
    "notice-then-terminated": (
        [ClusterScript(preempt_after_s=300, reclaim="terminate"), ClusterScript()],
        {},
        notice_then_terminated,
    ),
    "notice-then-stopped": (
        [ClusterScript(preempt_after_s=300, reclaim="stop"), ClusterScript()],
        {},
        notice_then_stopped,
    ),
    "reclaimed-without-notice": (
        [ClusterScript(preempt_after_s=400, notice=False), ClusterScript()],
        {},
        reclaimed_without_notice,
    ),
    "partial-preemption-init": (
        [ClusterScript(preempt_after_s=300, notice=False, reclaim="partial"), ClusterScript()],
        {},
        partial_preemption,
    ),
    "no-capacity-then-other-zone": (
        [ClusterScript(no_capacity=True), ClusterScript()],
        {},
        no_capacity_then_other_zone,
    ),
    "no-capacity-anywhere": ([ClusterScript(no_capacity=True)] * 12, {}, no_capacity_anywhere),
    "api-away-10-min": (
        [ClusterScript()],
        {"prepare": lambda fake: fake.outages.append((400.0, 1000.0))},
        api_away_for_minutes,
    ),
    "api-away-40-min": (
        [ClusterScript()],
        {
            "prepare": lambda fake: fake.outages.append((400.0, 2800.0)),
            "api": ApiPatience(patience_s=1800.0),
        },
        api_away_too_long,
    ),
    "log-stream-drops": (
        [ClusterScript()],
        {"prepare": lambda fake: setattr(fake, "log_drops", 4)},
        log_stream_drops,
    ),
    "log-lost-and-notice": (
        [ClusterScript(preempt_after_s=300), ClusterScript()],
        {"prepare": lambda fake: setattr(fake, "log_dead_first", 1)},
        log_lost_and_notice,
    ),
    "setup-fails": ([ClusterScript(setup_fails=True)], {}, setup_fails),
    "user-code-crashes": ([ClusterScript(crash_after_s=200)], {}, user_code_crashes),
    "on-demand-interrupted": (
        [ClusterScript(preempt_after_s=300, notice=False), ClusterScript()],
        {"first": ON_DEMAND},
        on_demand_interrupted,
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(name: str, tmp_path: Path, sky_offline: object) -> None:
    scripts, options, check = SCENARIOS[name]
    outcome = run(tmp_path, [ClusterScript(**vars(s)) for s in scripts], **options)
    check(outcome)
    _assert_all_down(outcome)
