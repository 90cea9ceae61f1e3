"""The real controller on SkyPilot, through the fake API server's failure scenarios.

Each row scripts what the cloud and the API server do (tests/fakes.py: ClusterScript,
outages, dropped log streams), runs :class:`Controller` with a real
:class:`SkyBackend`, the real spot policy and real ``sky.Task`` objects, on virtual
time, and checks the outcome: the run completes or ends with one clear line, and every
cluster it started is down afterwards (the fake records each ``down``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lightning_srifty.core.cluster import Plan
from lightning_srifty.core.errors import ConfigError, LaunchError
from lightning_srifty.core.monitor import Expectation
from lightning_srifty.core.planner import PlanRequest
from lightning_srifty.core.spot import make_policy
from lightning_srifty.io.cluster_ledger import ClusterLedger
from lightning_srifty.launch.backend import LaunchSpec
from lightning_srifty.launch.controller import Controller, RunSummary
from lightning_srifty.launch.migration import Candidates, PolicyDecider, plan_key
from lightning_srifty.launch.sky_backend import SkyBackend
from lightning_srifty.launch.sky_client import ApiPatience, SkyClient
from lightning_srifty.launch.sky_jobs import SkyJobsBackend
from lightning_srifty.launch.sky_tasks import build_tasks
from tests.fakes import SAVE_S, ApiRestart, ClusterScript, FakeSkyApi, RecordingUI
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
    backend: SkyClient
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
    policy_every_s: float | None = None,
    managed: bool = False,
    interrupt_after_polls: int | None = None,
    keep: bool = False,
    stall_timeout_s: float | None = None,
    grace_s: float | None = None,
) -> Outcome:
    fake = FakeSkyApi(scripts=scripts)
    if prepare is not None:
        prepare(fake)
    backend = make_backend(fake, tmp_path, api=api, managed=managed, keep=keep)
    if isinstance(backend, SkyJobsBackend):
        backend.candidates = (first, OTHER, ON_DEMAND)
    decider = PolicyDecider(
        policy=make_policy("srifty"),
        candidates=lambda remaining, elapsed, changeover: Candidates((HOME, OTHER), ON_DEMAND),
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
        policy_every_s=policy_every_s,
        keep_on_interrupt=keep,
    )
    if stall_timeout_s is not None:
        controller.stall_timeout_s = stall_timeout_s
    if grace_s is not None:
        controller.grace_s = grace_s
    if interrupt_after_polls is not None:
        polls = [0]

        def press_ctrl_c(plan: Plan, snap: object) -> None:
            polls[0] += 1
            if polls[0] >= interrupt_after_polls:
                raise KeyboardInterrupt

        controller.on_update = press_ctrl_c
    summary, error = None, ""
    try:
        summary = controller.run(first)
    except LaunchError as exc:
        error = str(exc)
    except KeyboardInterrupt:
        error = "KeyboardInterrupt"
    ledger = [(e.name, e.state) for e in ClusterLedger(tmp_path).entries()]
    return Outcome(summary, error, fake, backend, controller, decider, ledger)


def make_backend(
    fake: FakeSkyApi,
    run_dir: Path,
    *,
    api: ApiPatience | None = None,
    managed: bool = False,
    keep: bool = False,
) -> SkyClient:
    settings: dict[str, Any] = {
        "sdk": fake,
        "setup": "true",
        "ship_package": False,
        "run_dir": run_dir,
        "checkpoint_uri": "s3://srifty-bucket/run",
        "api": api,
        "keep_clusters": keep,
        "clock": fake.clock.monotonic,
        "sleep": fake.clock.sleep,
        # The log follower's reconnect waits are real and short: the virtual clock runs
        # only as fast as the controller polls, so a follower that waited on it would
        # fall behind a job that, in virtual time, finishes in milliseconds.
        "log_sleep": lambda seconds: time.sleep(0.001),
    }
    if managed:
        return SkyJobsBackend(jobs_sdk=fake.jobs, plugins=fake.api_plugins, **settings)
    return SkyBackend(**settings)


def _launched(outcome: Outcome) -> list[str]:
    return [name for name, _, _ in outcome.fake.launched]


def _assert_all_down(outcome: Outcome) -> None:
    """Nothing the run started may still exist, and the ledger agrees."""
    assert outcome.fake.left_up() == []
    ledger = [(e.name, e.state) for e in ClusterLedger(outcome.controller.run_dir).entries()]
    assert all(state == "down" for _, state in ledger), ledger
    assert {name for name, _ in ledger} == set(_launched(outcome))
    now = outcome.fake.clock.now
    for name in outcome.fake.clusters:
        cluster = outcome.fake.clusters[name]
        taken_back = cluster.reclaim_at is not None and cluster.script.reclaim == "terminate"
        autodown = cluster.autodown_at()
        went_itself = autodown is not None and now >= autodown
        assert name in outcome.fake.downs or taken_back or went_itself, f"{name} still up"


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
    # what each launch cost before its first step, provisioning included, is what the
    # policy priced the move at (not the prior changeover)
    assert len(o.decider.startups_h) == 2
    for hours in o.decider.startups_h:
        assert hours * 3600 >= ClusterScript().provision_s


def hangs_then_relaunched(o: Outcome) -> None:
    """The job hung 200 s into training on an UP cluster: the watchdog took that
    cluster down after the stall timeout and ran the same plan again from the newest
    checkpoint; the spot market heard of no preemption."""
    summary = _completed(o)
    (move,) = summary.migrations
    assert move.reason.startswith("hung (no progress line for "), move.reason
    assert move.from_plan == move.to_plan
    assert summary.attempts[0].hung and summary.attempts[1].hung == ""
    first = o.fake.clusters[_launched(o)[0]]
    assert first.downed_at is not None
    silent = first.downed_at - first.hang_at
    assert o.controller.stall_timeout_s is not None
    assert o.controller.stall_timeout_s <= silent <= o.controller.stall_timeout_s + 60.0
    assert move.resumed_step == first.stored_step(first.downed_at) > 0
    assert o.decider.history[plan_key(HOME)].interruptions == 0
    _assert_all_down(o)


def hangs_again_without_progress(o: Outcome) -> None:
    """Hung at the same step three times in a row: the run gives up in one line."""
    assert o.summary is None
    assert "gave up: the job hung again without getting past step" in o.error, o.error
    assert len(o.fake.launched) == 3
    _assert_all_down(o)


def start_up_hangs_then_relaunched(o: Outcome) -> None:
    """The job went RUNNING and printed nothing, ever (hung before its first progress
    line): after the stall timeout of silence its cluster was taken down and the same
    plan ran again, from the start; nothing bills for the hung one."""
    summary = _completed(o)
    (move,) = summary.migrations
    assert move.reason.startswith("hung (no output for "), move.reason
    assert move.from_plan == move.to_plan
    assert summary.attempts[0].hung and not summary.attempts[0].events
    first = o.fake.clusters[_launched(o)[0]]
    assert first.downed_at is not None
    silent = first.downed_at - first.run_at
    assert o.controller.stall_timeout_s is not None
    assert o.controller.stall_timeout_s <= silent <= o.controller.stall_timeout_s + 60.0
    assert o.decider.history[plan_key(HOME)].interruptions == 0
    _assert_all_down(o)


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


def preempted_then_no_capacity(o: Outcome) -> None:
    summary = _completed(o)
    (move,) = summary.migrations  # one move: from the preempted cluster to where it ran
    assert move.reason.startswith("spot preemption; srifty")
    assert "; then no capacity (launch srifty-2-" in move.reason
    assert move.to_plan == f"{summary.attempts[-1].plan.cluster.describe()} spot use1-az1"
    assert move.resumed_step == move.step_at_preemption > 0
    assert len(summary.attempts) == 3 and summary.attempts[1].no_capacity
    logged = (o.controller.migration_log).read_text().splitlines()
    assert len(logged) == 1


def no_capacity_anywhere(o: Outcome) -> None:
    assert o.summary is None
    assert o.error.startswith("gave up: 20 attempts in a row ended without a new step")


def api_away_for_minutes(o: Outcome) -> None:
    _completed(o)
    assert o.backend.api_retries >= 3


def api_away_too_long(o: Outcome) -> None:
    assert o.summary is None
    assert "the SkyPilot API server was unreachable for 30 min" in o.error
    assert "as long as srifty-launch waits (30 min;" in o.error
    assert "10 min after its job ends" in o.error and "srifty down" in o.error
    assert "\n" not in o.error
    # A failed API call is no reason to stop a healthy job: the cluster trains on ...
    (name,) = _launched(o)
    cluster = o.fake.clusters[name]
    assert o.fake.downs == [] and o.fake.cancels == [] and o.ledger == [(name, "up")]
    assert cluster.job_status(o.fake.clock.now) == "RUNNING"
    # ... to its end, and SkyPilot's autostop takes it down 10 idle minutes later.
    end = cluster.death_at()
    assert cluster.job_status(end) == "SUCCEEDED" and cluster.stored_step(end) == TARGET
    o.fake.clock.now = end + 9 * 60
    assert o.fake.left_up() == [name]
    o.fake.clock.now = end + 10 * 60
    assert o.fake.left_up() == []
    # `srifty down` later finds it gone and says so in the ledger.
    assert make_backend(o.fake, o.controller.run_dir).down_recorded() == [name]


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


def back_to_spot(o: Outcome) -> None:
    summary = _completed(o)
    (move,) = summary.migrations
    assert move.reason.startswith("policy move; srifty: spot up in two zones or more")
    assert move.from_plan.endswith("on-demand use1-az1") and "spot" in move.to_plan
    # Drained: SkyPilot's cancel sent SIGTERM, the job saved, the next one resumed there.
    first = o.fake.clusters[_launched(o)[0]]
    assert first.cancelled_at is not None and _launched(o)[0] in o.fake.cancels
    saved = first.step_at(first.cancelled_at + SAVE_S)
    assert move.resumed_step == saved >= move.step_at_preemption > 0
    assert len(summary.attempts) == 2 and summary.attempts[1].plan.use_spot


def slow_drain_is_no_hang(o: Outcome) -> None:
    """The policy's move drains the on-demand job, which saves for 2 minutes without a
    line (inside the 200 s grace): longer than the 60 s stall timeout, but the job was
    told to stop (saving, not hung), so the move goes ahead with the checkpoint it saved
    and nothing is relaunched in place."""
    back_to_spot(o)
    summary = o.summary
    assert summary is not None
    first = o.fake.clusters[_launched(o)[0]]
    assert first.cancelled_at is not None
    silent = first.death_at() - first.cancelled_at
    limit = o.controller._stall_limit_s(
        Expectation(ON_DEMAND.step_s, ON_DEMAND.step_s, ON_DEMAND.step_s, 0.0, TARGET)
    )
    assert limit < silent < o.controller.grace_s
    assert not any(a.hung for a in summary.attempts)


def on_demand_interrupted(o: Outcome) -> None:
    summary = _completed(o)
    (move,) = summary.migrations
    assert move.reason.startswith("on-demand interruption")
    assert "spot preemption" not in move.reason
    seen = o.decider.history[plan_key(ON_DEMAND)]
    assert seen.interruptions == 0  # not counted against the spot market


def stale_status(o: Outcome) -> None:
    summary = _completed(o)
    (move,) = summary.migrations  # lost the attempt, moved on; no crash
    assert move.reason.startswith("on-demand interruption")
    first = o.fake.clusters[_launched(o)[0]]
    assert first.reclaim_at is not None and first.script.stale_s > 0


def _one_healthy_attempt(o: Outcome) -> RunSummary:
    """Completed on the first cluster: nothing was cancelled, torn down early or moved."""
    summary = _completed(o)
    assert len(summary.attempts) == 1 and summary.migrations == ()
    assert o.fake.cancels == [] and o.fake.duplicate_jobs == []
    assert o.fake.downs == [_launched(o)[0]]  # once, after the job was done
    return summary


def api_restarts_mid_run(o: Outcome) -> None:
    _one_healthy_attempt(o)
    assert sorted(o.fake.dropped) == ["job_status", "status", "status"]
    assert o.backend.api_reissues == 3 and o.fake.restarts == []


def api_restart_before_launch_acted(o: Outcome) -> None:
    _one_healthy_attempt(o)
    assert o.fake.dropped == ["launch"]
    first, second = _launched(o)
    assert first == second  # the same named cluster, launched again
    assert len(o.fake.clusters) == 1


def api_restart_mid_provisioning(o: Outcome) -> None:
    api_restart_before_launch_acted(o)  # launching the name again finished the cluster


def api_restart_after_the_job_was_submitted(o: Outcome) -> None:
    _one_healthy_attempt(o)
    assert o.fake.dropped == ["launch"]
    assert len(_launched(o)) == 1  # its job was found in the queue and followed
    assert "queue" in o.fake.calls


def api_restart_during_teardown(o: Outcome) -> None:
    _completed(o)
    assert o.fake.dropped == ["down"]


def log_stream_restarts(o: Outcome) -> None:
    summary = _one_healthy_attempt(o)
    events = summary.attempts[0].events
    assert len(events) == len({e.to_line() for e in events})  # no duplicates
    assert [e.event for e in events][0] == "start" and events[-1].event == "done"


def api_keeps_restarting(o: Outcome) -> None:
    assert o.summary is None
    assert "the SkyPilot API server dropped the request 6 times in a row" in o.error
    assert "\n" not in o.error
    (name,) = _launched(o)
    assert o.fake.downs == [] and o.fake.cancels == []  # healthy: left to finish
    assert o.fake.clusters[name].job_status(o.fake.clock.now) == "RUNNING"
    o.fake.clock.now = o.fake.clusters[name].death_at() + 600
    assert o.fake.left_up() == []  # and to go by itself (autostop)
    assert make_backend(o.fake, o.controller.run_dir).down_recorded() == [name]


def _restarts(*restarts: ApiRestart) -> Callable[[FakeSkyApi], None]:
    return lambda fake: fake.restarts.extend(restarts)


SCENARIOS: dict[str, tuple[list[ClusterScript], dict[str, Any], Callable[[Outcome], None]]] = {
    "healthy": ([ClusterScript()], {}, healthy),
    "notice-then-terminated": (
        [ClusterScript(preempt_after_s=300, reclaim="terminate"), ClusterScript()],
        {},
        notice_then_terminated,
    ),
    "job-hangs-then-relaunched": (
        [ClusterScript(hang_after_s=200, checkpoint_every_s=100), ClusterScript()],
        {},
        hangs_then_relaunched,
    ),
    "start-up-hangs-then-relaunched": (
        [ClusterScript(hangs_at_start=True), ClusterScript()],
        {},
        start_up_hangs_then_relaunched,
    ),
    "job-hangs-every-time": (
        [ClusterScript(hang_after_s=200, checkpoint_every_s=1e9)] * 3,
        {},
        hangs_again_without_progress,
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
    "preempted-then-no-capacity": (
        [
            ClusterScript(preempt_after_s=300),
            ClusterScript(no_capacity=True),
            ClusterScript(),
        ],
        {},
        preempted_then_no_capacity,
    ),
    "no-capacity-anywhere": ([ClusterScript(no_capacity=True)] * 22, {}, no_capacity_anywhere),
    "api-away-10-min": (
        [ClusterScript()],
        {"prepare": lambda fake: fake.outages.append((400.0, 1000.0))},
        api_away_for_minutes,
    ),
    "api-away-40-min": (
        [ClusterScript(steps_per_s=0.5)],  # still training when the launcher gives up
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
    "on-demand-policy-returns-to-spot": (
        [ClusterScript(), ClusterScript()],
        {"first": ON_DEMAND, "policy_every_s": 300.0},
        back_to_spot,
    ),
    "on-demand-policy-move-drains-slowly": (
        [ClusterScript(save_s=120.0), ClusterScript()],
        {"first": ON_DEMAND, "policy_every_s": 300.0, "stall_timeout_s": 60.0, "grace_s": 200.0},
        slow_drain_is_no_hang,
    ),
    "on-demand-interrupted": (
        [ClusterScript(preempt_after_s=300, notice=False), ClusterScript()],
        {"first": ON_DEMAND},
        on_demand_interrupted,
    ),
    "stale-up-after-the-head-is-gone": (
        [ClusterScript(preempt_after_s=300, notice=False, stale_s=60), ClusterScript()],
        {"first": ON_DEMAND},
        stale_status,
    ),
    "api-restarts-mid-run": (
        [ClusterScript()],
        {
            "prepare": _restarts(
                ApiRestart("status"),
                ApiRestart("job_status", legacy=True),
                ApiRestart("status", effect="done"),
            )  # fmt: skip
        },
        api_restarts_mid_run,
    ),
    "api-restart-before-launch-acted": (
        [ClusterScript()],
        {"prepare": _restarts(ApiRestart("launch"))},
        api_restart_before_launch_acted,
    ),
    "api-restart-mid-provisioning": (
        [ClusterScript()],
        {"prepare": _restarts(ApiRestart("launch", effect="partial", legacy=True))},
        api_restart_mid_provisioning,
    ),
    "api-restart-after-job-submitted": (
        [ClusterScript()],
        {"prepare": _restarts(ApiRestart("launch", effect="done"))},
        api_restart_after_the_job_was_submitted,
    ),
    "api-restart-during-teardown": (
        [ClusterScript()],
        {"prepare": _restarts(ApiRestart("down", effect="done"))},
        api_restart_during_teardown,
    ),
    "log-stream-restarts": (
        [ClusterScript()],
        {"prepare": lambda fake: setattr(fake, "log_interrupts", 3)},
        log_stream_restarts,
    ),
    "api-keeps-restarting": (
        [ClusterScript(steps_per_s=0.5)],
        {"prepare": _restarts(*[ApiRestart("job_status", after=600.0)] * 6)},
        api_keeps_restarting,
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(name: str, tmp_path: Path, sky_offline: object) -> None:
    scripts, options, check = SCENARIOS[name]
    outcome = run(tmp_path, [ClusterScript(**vars(s)) for s in scripts], **options)
    check(outcome)
    _assert_all_down(outcome)


# ------------------------------------------------------------------- managed jobs
def managed_healthy(o: Outcome) -> None:
    summary = _completed(o)
    assert summary.recoveries == 0
    ((name, task, _),) = o.fake.launched
    assert isinstance(task.resources, list)  # ordered candidates
    assert [r.instance_type for r in task.resources] == ["g5.12xlarge", "g4dn.12xlarge",
                                                           "g5.12xlarge"]  # fmt: skip
    assert [r.use_spot for r in task.resources] == [True, True, False]
    assert o.fake.downs == [f"{name}-1"]  # the jobs controller cleaned its cluster up


def managed_recovers_from_notice(o: Outcome) -> None:
    summary = _completed(o)
    assert summary.recoveries == 1 and summary.migrations == ()
    events = summary.attempts[0].events
    preempted = next(e for e in events if e.event == "preempted")
    resumed = next(e for e in events if e.event == "resumed")
    assert resumed.step == preempted.step  # SkyPilot recovered on exit 75; nothing lost


def managed_recovers_from_reclaim(o: Outcome) -> None:
    summary = _completed(o)
    assert summary.recoveries == 1


def managed_slow_recovery_is_no_hang(o: Outcome) -> None:
    """SkyPilot's recovery took longer than the stall timeout (20 min to provision):
    RECOVERING is waiting for nodes, not a hang, so the watchdog let it be."""
    summary = _completed(o)
    assert summary.recoveries == 1 and summary.migrations == ()
    assert all(not a.hung for a in summary.attempts)


def managed_no_capacity_then_next_resource(o: Outcome) -> None:
    summary = _completed(o)
    assert summary.recoveries == 0
    assert len(o.fake.clusters) == 1  # the first ordered resource had no capacity


def managed_no_resource(o: Outcome) -> None:
    assert o.summary is None
    assert "managed job 1 ended FAILED_NO_RESOURCE" in o.error


def managed_setup_fails(o: Outcome) -> None:
    assert o.summary is None
    assert "managed job 1 ended FAILED_SETUP" in o.error


def managed_user_crash(o: Outcome) -> None:
    assert o.summary is None
    assert "ended FAILED: Job exited with exit code 1 (user program failure)" in o.error


def managed_api_away(o: Outcome) -> None:
    _completed(o)
    assert o.backend.api_retries >= 3


def managed_ctrl_c(o: Outcome) -> None:
    assert o.error == "KeyboardInterrupt"
    assert o.fake.managed[1].status == "CANCELLED"  # Ctrl-C cancelled the managed job


def managed_one_job(o: Outcome) -> None:
    """Completed by exactly one managed job that nobody cancelled."""
    summary = _completed(o)
    assert summary.recoveries == 0
    assert list(o.fake.managed) == [1] and o.fake.cancels == []


def managed_resubmitted(o: Outcome) -> None:
    managed_one_job(o)
    assert o.fake.dropped == ["jobs.launch"]
    assert len(o.fake.launched) == 2  # the dropped submission created nothing


def managed_found_in_queue(o: Outcome) -> None:
    managed_one_job(o)
    assert o.fake.dropped == ["jobs.launch"]
    assert len(o.fake.launched) == 1  # the queue had it: not submitted twice


def managed_restarts_mid_run(o: Outcome) -> None:
    managed_one_job(o)
    assert o.fake.dropped == ["jobs.queue_v2", "jobs.queue_v2"]
    assert o.backend.api_reissues == 2


MANAGED: dict[str, tuple[list[ClusterScript], dict[str, Any], Callable[[Outcome], None]]] = {
    "healthy": ([ClusterScript()], {}, managed_healthy),
    "notice-exit-75-recovered": (
        [ClusterScript(preempt_after_s=300), ClusterScript()],
        {},
        managed_recovers_from_notice,
    ),
    "reclaimed-recovered": (
        [ClusterScript(preempt_after_s=300, notice=False), ClusterScript()],
        {},
        managed_recovers_from_reclaim,
    ),
    "slow-recovery-is-no-hang": (
        [ClusterScript(preempt_after_s=300, notice=False), ClusterScript(provision_s=1200.0)],
        {},
        managed_slow_recovery_is_no_hang,
    ),
    "no-capacity-then-next-resource": (
        [ClusterScript(no_capacity=True), ClusterScript()],
        {},
        managed_no_capacity_then_next_resource,
    ),
    "no-resource-anywhere": ([ClusterScript(no_capacity=True)] * 3, {}, managed_no_resource),
    "setup-fails": ([ClusterScript(setup_fails=True)], {}, managed_setup_fails),
    "user-code-crashes": ([ClusterScript(crash_after_s=100)], {}, managed_user_crash),
    "api-away-10-min": (
        [ClusterScript()],
        {"prepare": lambda fake: fake.outages.append((400.0, 1000.0))},
        managed_api_away,
    ),
    "ctrl-c-cancels": ([ClusterScript()], {"interrupt_after_polls": 30}, managed_ctrl_c),
    "api-restart-before-submission-acted": (
        [ClusterScript()],
        {"prepare": _restarts(ApiRestart("jobs.launch"))},
        managed_resubmitted,
    ),
    "api-restart-after-submission": (
        [ClusterScript()],
        {"prepare": _restarts(ApiRestart("jobs.launch", effect="done", legacy=True))},
        managed_found_in_queue,
    ),
    "api-restarts-mid-run": (
        [ClusterScript()],
        {
            "prepare": _restarts(
                ApiRestart("jobs.queue_v2", after=500.0),
                ApiRestart("jobs.queue_v2", legacy=True, after=500.0),
            ),
        },
        managed_restarts_mid_run,
    ),
    "log-stream-restarts": (
        [ClusterScript()],
        {"prepare": lambda fake: setattr(fake, "log_interrupts", 2)},
        managed_one_job,
    ),
}


@pytest.mark.parametrize("name", list(MANAGED))
def test_managed_job_scenario(name: str, tmp_path: Path, sky_offline: object) -> None:
    scripts, options, check = MANAGED[name]
    outcome = run(tmp_path, [ClusterScript(**vars(x)) for x in scripts], managed=True, **options)
    check(outcome)
    assert outcome.fake.left_up() == []  # whatever happened, no cluster is left
    assert all(state == "down" for _, state in outcome.ledger), outcome.ledger


def _with_our_plugin(fake: FakeSkyApi) -> None:
    from lightning_srifty.launch.sky_recovery import PLUGIN_CLASS

    fake.plugins = (PLUGIN_CLASS,)


@pytest.mark.parametrize("plugin", [True, False], ids=["with-plugin", "without-plugin"])
def test_auto_recovery_moves_on_to_the_next_offer_only_with_the_plugin(
    plugin: bool, tmp_path: Path, sky_offline: object
) -> None:
    """Preempted (spot notice, exit 75) on ordered offer #1, g5.12xlarge: with our
    plugin on the server, ``--job-recovery auto`` submits SRIFTY_NEXT_OFFER and SkyPilot
    relaunches on #2, g4dn.12xlarge; without it, EAGER_NEXT_REGION relaunches on #1
    again, and the launcher said so in one line before submitting."""
    outcome = run(
        tmp_path,
        [ClusterScript(preempt_after_s=300), ClusterScript()],
        managed=True,
        prepare=_with_our_plugin if plugin else None,
    )
    summary = _completed(outcome)
    assert summary.recoveries == 1 and summary.migrations == ()
    ((_, task, _),) = outcome.fake.launched
    strategies = {r.job_recovery["strategy"] for r in task.resources}
    assert strategies == {"SRIFTY_NEXT_OFFER" if plugin else "EAGER_NEXT_REGION"}
    first, second = summary.attempts[0].placements
    assert "g5.12xlarge" in first and "[spot]" in first and "us-east-1a" in first
    if plugin:
        assert "g4dn.12xlarge" in second and "[spot]" in second  # ordered offer #2
        assert outcome.backend.notes == []
    else:
        assert second == first  # the preempted offer, first again
        (line,) = [n for n in outcome.backend.notes if "--job-recovery auto" in n]
        assert "EAGER_NEXT_REGION" in line and "offer just preempted first" in line
    events = summary.attempts[0].events
    preempted = next(e for e in events if e.event == "preempted")
    resumed = next(e for e in events if e.event == "resumed")
    assert resumed.step == preempted.step


def test_a_server_without_the_plugin_refuses_next_offer_in_one_line(
    tmp_path: Path, sky_offline: object
) -> None:
    fake = FakeSkyApi(scripts=[ClusterScript()])
    backend = SkyJobsBackend(
        sdk=fake, jobs_sdk=fake.jobs, recovery="SRIFTY_NEXT_OFFER", plugins=fake.api_plugins,
        setup="true", ship_package=False, run_dir=tmp_path, clock=fake.clock.monotonic,
        sleep=fake.clock.sleep,
    )  # fmt: skip
    spec = LaunchSpec(plan=HOME, script="train.py", script_args=(), name="srifty-1", envs={})
    with pytest.raises(LaunchError) as refused:
        backend.launch(spec)
    message = str(refused.value)
    assert "\n" not in message
    assert "ValueError" in message and "'SRIFTY_NEXT_OFFER' is not a valid" in message
    assert fake.managed == {}  # nothing was submitted
    assert "api_plugins" not in fake.calls  # an explicit strategy asks nothing


# ------------------------------------------------------------------------ Ctrl-C
def test_ctrl_c_takes_the_clusters_down(tmp_path: Path, sky_offline: object) -> None:
    outcome = run(tmp_path, [ClusterScript()], interrupt_after_polls=40)
    assert outcome.error == "KeyboardInterrupt"
    _assert_all_down(outcome)


def test_ctrl_c_with_keep_clusters_leaves_them_for_srifty_down(
    tmp_path: Path, sky_offline: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_srifty.cli import down_cmd

    outcome = run(tmp_path, [ClusterScript()], interrupt_after_polls=40, keep=True)
    assert outcome.error == "KeyboardInterrupt"
    (name,) = _launched(outcome)
    assert outcome.fake.left_up() == [name] and outcome.ledger == [(name, "up")]
    # Later: `srifty down RUN_DIR` (its backend talks to the same fake server).
    later = make_backend(outcome.fake, tmp_path)
    assert down_cmd.run(argparse.Namespace(run_dir=str(tmp_path)), backend=later) == 0
    assert outcome.fake.left_up() == [] and name in outcome.fake.downs
    assert [e.state for e in ClusterLedger(tmp_path).entries()] == ["down"]
    assert down_cmd.run(argparse.Namespace(run_dir=str(tmp_path)), backend=later) == 0
    assert "every cluster is down; nothing to do" in capsys.readouterr().out


def test_ctrl_c_while_provisioning_cancels_and_tears_down(
    tmp_path: Path, sky_offline: object
) -> None:
    outcome = run(tmp_path, [ClusterScript(interrupted=True)])
    assert outcome.error == "KeyboardInterrupt"
    assert "api_cancel" in outcome.fake.calls  # the launch request was cancelled
    _assert_all_down(outcome)


def test_ctrl_c_while_a_managed_job_is_submitted_cancels_it_by_name(
    tmp_path: Path, sky_offline: object
) -> None:
    fake = FakeSkyApi(scripts=[ClusterScript()])
    backend = make_backend(fake, tmp_path, managed=True)
    assert isinstance(backend, SkyJobsBackend)
    backend.candidates = (HOME, OTHER)
    real_get = fake.stream_and_get

    def interrupted(request_id: str) -> object:
        real_get(request_id)  # the server took the job ...
        raise KeyboardInterrupt  # ... and the user pressed Ctrl-C before the reply

    fake.stream_and_get = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        backend.launch(LaunchSpec("train.py", (), HOME, {"SRIFTY_TARGET_STEPS": "50"}))
    ((name, state),) = [(e.name, e.state) for e in ClusterLedger(tmp_path).entries()]
    assert state == "launching"  # no id came back, but the ledger has the name
    assert backend.down_recorded() == [name]
    assert fake.managed[1].status in ("CANCELLING", "CANCELLED") and name in fake.cancels
    fake.clock.sleep(60)
    fake.jobs._advance(fake.managed[1])  # noqa: SLF001 - the jobs controller's next step
    assert fake.managed[1].status == "CANCELLED" and fake.left_up() == []


def test_teardown_waits_out_an_api_outage(tmp_path: Path, sky_offline: object) -> None:
    fake = FakeSkyApi(scripts=[ClusterScript()])
    backend = make_backend(fake, tmp_path)
    handle = backend.launch(LaunchSpec("train.py", (), HOME, {"SRIFTY_TARGET_STEPS": "50"}))
    fake.outages.append((fake.clock.now, fake.clock.now + 900.0))  # 15 minutes away
    backend.stop(handle)
    assert fake.left_up() == [] and fake.clock.now >= 900.0
    assert backend.api_retries >= 5


# ------------------------------------------------------------------------ --resume
def test_resume_refuses_while_the_runs_managed_job_lives(
    tmp_path: Path, sky_offline: object, s3_uri: str
) -> None:
    """A resumed run beside its still-running first job would be a second writer on the
    same checkpoints: --resume stops in one line before anything is measured or sent."""
    from lightning_srifty.launch.launcher import LaunchOptions, run_launch

    fake = FakeSkyApi(scripts=[ClusterScript()])
    first = make_backend(fake, tmp_path, managed=True)
    assert isinstance(first, SkyJobsBackend)
    first.candidates = (HOME, OTHER)
    first.launch(LaunchSpec("train.py", (), HOME, {"SRIFTY_TARGET_STEPS": "50"}))
    # The laptop closed; the user comes back and asks to resume the same run.
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('never run: the resume must stop before')\n")
    request = PlanRequest(target_steps=50)
    options = LaunchOptions(script=str(script), script_args=(), request=request,
                            backend="sky-jobs", run_dir=tmp_path, resume=True,
                            assume_yes=True, checkpoint_uri=s3_uri)  # fmt: skip
    again = make_backend(fake, tmp_path, managed=True)
    launched = len(fake.launched)
    with pytest.raises(ConfigError) as error:
        run_launch(options, RecordingUI(), backend=again)
    message = str(error.value)
    assert "managed job 1 (" in message and f"srifty down {tmp_path}" in message
    assert "\n" not in message and len(fake.launched) == launched
    assert fake.cancels == []  # the refusal leaves the live job alone
    # Once it is taken down, nothing blocks the resume any more.
    again.down_recorded()
    fake.clock.sleep(60)
    fake.jobs._advance(fake.managed[1])  # noqa: SLF001 - the jobs controller's next step
    assert again.live_recorded() == []


def test_live_clusters_are_what_skypilot_reports(tmp_path: Path, sky_offline: object) -> None:
    outcome = run(tmp_path, [ClusterScript()], interrupt_after_polls=40, keep=True)
    (name,) = _launched(outcome)
    later = make_backend(outcome.fake, tmp_path)
    assert later.live_recorded() == [f"{name} (UP)"]
    outcome.fake.clusters[name].downed_at = outcome.fake.clock.now  # `sky down` by hand
    assert later.live_recorded() == []


# ------------------------------------------------------------- confirmed teardown
def _send_launch(fake: FakeSkyApi, backend: SkyClient, name: str) -> str:
    """A launch request as srifty-launch sends it (autostop and down included)."""
    (task,) = build_tasks(HOME, script="train.py", name=name, setup="true")
    return fake.launch(task, cluster_name=name, idle_minutes_to_autostop=10, down=True)


def test_a_down_before_the_launch_wrote_its_record_is_checked_again(
    tmp_path: Path, sky_offline: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sky.down`` answers ClusterDoesNotExist while the launch request still waits
    on the server (sky/core.py: down); the cluster comes all the same. The launcher
    died (SIGKILL) after sending it, before noting the request's id."""
    from lightning_srifty.cli import down_cmd

    fake = FakeSkyApi(scripts=[ClusterScript(listed_after_s=30)])
    backend = make_backend(fake, tmp_path)
    name = f"srifty-1-{backend.run_id}"
    ClusterLedger(tmp_path, backend.run_id).mark(name, "launching")
    _send_launch(fake, backend, name)
    assert down_cmd.run(argparse.Namespace(run_dir=str(tmp_path)), backend=backend) == 0
    assert f"down: {name}" in capsys.readouterr().out
    assert name in fake.downs  # it showed up on a second look and was taken down
    assert fake.clock.now >= 30
    fake.clock.now += 3600
    assert fake.left_up() == []
    assert [e.state for e in ClusterLedger(tmp_path).entries()] == ["down"]


def test_a_teardown_cancels_the_launch_request_first(tmp_path: Path, sky_offline: object) -> None:
    fake = FakeSkyApi(scripts=[ClusterScript(listed_after_s=30)])
    backend = make_backend(fake, tmp_path)
    name = f"srifty-1-{backend.run_id}"
    request = _send_launch(fake, backend, name)
    ClusterLedger(tmp_path, backend.run_id).mark(name, "launching", request_id=request)
    assert make_backend(fake, tmp_path).down_recorded() == [name]
    assert "api_cancel" in fake.calls and fake.clock.now < 30  # no need to look again
    fake.clock.now += 3600
    assert fake.left_up() == [] and fake.downs == []  # the cluster never came


def test_srifty_down_after_the_jobs_controller_stopped_is_one_line(
    tmp_path: Path, sky_offline: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_srifty.cli import down_cmd

    fake = FakeSkyApi(scripts=[ClusterScript()])
    backend = make_backend(fake, tmp_path, managed=True)
    assert isinstance(backend, SkyJobsBackend)
    backend.candidates = (HOME,)
    handle = backend.launch(LaunchSpec("train.py", (), HOME, {"SRIFTY_TARGET_STEPS": "50"}))
    fake.clock.sleep(3600)  # the launcher was closed (--keep-clusters); the job ended
    fake.jobs.stop_controller()  # and SkyPilot's jobs controller stopped itself
    later = make_backend(fake, tmp_path, managed=True)
    capsys.readouterr()
    assert down_cmd.run(argparse.Namespace(run_dir=str(tmp_path)), backend=later) == 0
    out = capsys.readouterr().out.splitlines()
    assert any("jobs controller is stopped" in line and "has ended" in line for line in out)
    assert [e.state for e in ClusterLedger(tmp_path).entries()] == ["down"]
    assert fake.cancels == []
    # Following such a job still reads how it ended (a refresh starts the controller).
    assert backend.status(handle).value == "succeeded"
