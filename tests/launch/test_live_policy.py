"""The live spot policy on the local backend: asked on a timer, it brings the job back to
spot when a replayed trace shows spot again; injected revocations hit spot plans only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.catalog import Offer
from lightning_srifty.core.cluster import Cluster, ClusterGroup, Plan
from lightning_srifty.core.monitor import Expectation
from lightning_srifty.core.spot import make_policy
from lightning_srifty.launch.controller import Controller
from lightning_srifty.launch.injection import EveryInterval, TraceReplay
from lightning_srifty.launch.local_backend import LocalBackend
from lightning_srifty.launch.migration import Candidates, PolicyDecider, plan_key
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

SCRIPT = REPO_ROOT / "examples" / "train_digits.py"
TARGET = 10_000
STEP_S = 1.44
"""The plans' step time: 2500 steps are one hour of work for the policy (the job: 4 h)."""


def _plan(zone: str, *, spot: bool, hourly: float) -> Plan:
    offer = Offer(
        instance_type="g4dn.xlarge",
        accelerator="T4",
        accelerator_count=1,
        gpu_memory_gib=16.0,
        vcpus=4.0,
        memory_gib=16.0,
        region="us-west-2",
        zone=zone,
        ondemand_price=1.0,
        spot_price=hourly if spot else None,
        intra_node_link="none",
        network_gbps=25.0,
    )
    cluster = Cluster((ClusterGroup(offer, 1, 1),))
    # steps_to_target 0: the same plans for any remaining work (step times compare as is)
    return Plan(cluster, spot, STEP_S, STEP_S, STEP_S, 64, 0, 4.0, hourly * 4, hourly)


HOME = _plan("usw2-az1", spot=True, hourly=0.30)
OTHER = _plan("usw2-az2", spot=True, hourly=0.32)
ON_DEMAND = _plan("usw2-az1", spot=False, hourly=1.0)


class _ScaledDecider(PolicyDecider):
    """The policy's clock here runs in plan hours (a step stands for 1.44 s), so its 2 h
    changeover stands for the trace's restarts, not for this machine's few seconds."""

    def observe_startup(self, hours: float) -> None:
        pass


def controller(
    tmp_path: Path, target: int, policy: str, preemptions: object, deadline_h: float | None
) -> Controller:
    decider = _ScaledDecider(
        policy=make_policy(policy),
        candidates=lambda remaining, elapsed, changeover: Candidates((HOME, OTHER), ON_DEMAND),
        home=plan_key(HOME),
        target_steps=target,
        deadline_h=deadline_h,
        changeover_h=2.0,
        wait_h=2.0 / 3600.0,
    )
    return Controller(
        backend=LocalBackend(tmp_path / "local", max_nodes=1, max_procs=1),
        script=str(SCRIPT),
        script_args=("--hidden", "512"),
        run_dir=tmp_path,
        checkpoint_uri=str(tmp_path / "checkpoints"),
        target_steps=target,
        next_planner=decider,
        expectation_for=lambda p: Expectation(p.step_s, p.step_s, p.step_s, p.hourly_usd, target),
        extra_env={"SRIFTY_IMDS": "off"},
        preemptions=preemptions,  # type: ignore[arg-type]
        poll_s=0.3,
        wait_s=2.0,
        policy_every_s=2.0,
        grace_s=30.0,
        # the launcher shapes the script's Trainer through PL_TRAINER_* (logs in the run)
        trainer_env_for=lambda p: proto.trainer_env(
            nodes=1, devices_per_node=1, root_dir=str(tmp_path / "lightning")
        ),
    )


def test_the_policy_brings_an_on_demand_job_back_when_spot_returns(tmp_path: Path) -> None:
    # Spot up for 16 s, down for 14 s, then up for good (2 wall seconds per trace tick).
    available = np.array([1] * 8 + [0] * 7 + [1] * 300, dtype=bool)
    trace = TraceReplay(available=available, gap_s=3600.0, time_scale=1800.0, zone="usw2-az1")
    assert trace.spot_available(10.0) and not trace.spot_available(20.0)
    assert trace.spot_available(31.0)
    # A 4 h job, 8 h deadline, 2 h changeovers: with spot down and up to ~2.8 h done the
    # srifty policy has no slack above its reserve to wait with, so it goes on-demand;
    # back on spot, two zones up and slack for a round trip send it to spot again.
    ctl = controller(tmp_path, TARGET, "srifty", trace, deadline_h=8.0)
    run = ctl.run(HOME)

    assert run.steps_done == TARGET
    first, second = run.migrations[:2]
    # 1. The trace revoked spot: spot down everywhere, too little slack to wait: on-demand.
    assert first.reason.startswith("spot preemption; srifty: no spot in any zone")
    assert first.to_plan.endswith("on-demand usw2-az1")
    # 2. Asked again on its timer while on on-demand, the policy went back to spot once
    #    the trace showed spot again (not before), and the job drained to a checkpoint.
    assert second.reason.startswith("policy move; srifty")
    assert second.from_plan.endswith("on-demand usw2-az1") and " spot " in second.to_plan
    assert second.at_s >= 30.0 - 1.0
    for move in (first, second):
        assert move.resumed_step == move.step_at_preemption > 0  # nothing lost
    assert [a.plan.use_spot for a in run.attempts][:3] == [True, False, True]
    # Only the spot market's own revocation counts; the drained on-demand job does not.
    assert isinstance(ctl.next_planner, PolicyDecider)
    assert sum(z.interruptions for z in ctl.next_planner.history.values()) == 1


def test_injected_revocations_never_hit_an_on_demand_plan(tmp_path: Path) -> None:
    every = EveryInterval(1.0)  # would revoke every attempt after a second, if spot
    run = controller(tmp_path, 600, "on-demand", every, deadline_h=None).run(ON_DEMAND)
    assert run.steps_done == 600
    assert len(run.attempts) == 1 and run.migrations == ()
    assert not run.attempts[0].plan.use_spot
