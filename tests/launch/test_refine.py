"""Live refinement: measured steps refit the job's terms, the launcher re-plans and moves
only when that beats the measured cost of moving.

The first tests drive :class:`Refiner` with the real planner on hand-made offers; the
last runs real processes on the local backend, with a slowdown injected into the
script when processes share a node.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.calibration import EVERY_ACCELERATOR, Calibration
from lightning_srifty.core.catalog import GpuSpec, Offer
from lightning_srifty.core.cluster import Cluster, ClusterGroup, Plan
from lightning_srifty.core.launch_protocol import ProgressEvent
from lightning_srifty.core.links import loopback_links
from lightning_srifty.core.monitor import Expectation, mean_step_time, steady_step_time
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.core.planner import PlanRequest, plan, plan_pinned, predict_per_step
from lightning_srifty.core.profile import (
    BatchPoint,
    Environment,
    Memory,
    Profile,
    Spread,
    StepTimes,
)
from lightning_srifty.core.spot import make_policy
from lightning_srifty.io.calibration_io import load_default_calibration
from lightning_srifty.launch.controller import Controller
from lightning_srifty.launch.launcher import local_cluster
from lightning_srifty.launch.local_backend import LocalBackend, LocalTopology
from lightning_srifty.launch.migration import REPLANNED, Candidates, PolicyDecider, plan_key
from lightning_srifty.launch.profiling import run_profile
from lightning_srifty.launch.refine import Refiner

SPECS = {
    "T4": GpuSpec("T4", 8.1, 8.1, 65.0, 320.0, 16.0),
    "A10G": GpuSpec("A10G", 31.2, 62.5, 125.0, 600.0, 24.0),
}
SCRIPT = Path(__file__).resolve().parent / "scripts" / "colocated_slowdown.py"


def _offer(name: str, count: int, hourly: float, acc: str = "T4") -> Offer:
    link = "PCIe" if count > 1 else "none"
    return Offer(
        name, acc, count, 16.0, 8.0 * count, 32.0 * count, "us-west-2", "usw2-az1",
        hourly, None, link, 50.0, links=loopback_links(link, 50.0),
    )  # fmt: skip


QUAD = _offer("quad", 4, 4.0)
SINGLE = _offer("single", 1, 1.0)


def _profile(acc: str = "T4", step_s: float = 0.1) -> Profile:
    return Profile(
        kind="coarse",
        environment=Environment("NVIDIA " + acc, acc, 1, 1, 1, "32-true", 32, "", ""),
        steps=StepTimes(Spread(step_s, step_s, step_s, 10), 0, 0, 0, 0, 0, 10),
        grad_bytes=4 * 1024**2,
        flops_per_step=0.0,
        memory=Memory(0, 0, 0, 0, 0, "unknown"),
        batch_points=(BatchPoint(16, step_s / 2, step_s / 2), BatchPoint(32, step_s, step_s)),
        model_name="Job",
    )


def _refiner(profile: Profile, offers: Sequence[Offer], cal: Calibration) -> Refiner:
    request = PlanRequest(target_steps=10_000, allow_spot=False, mixes=False, max_nodes=4)

    def replan(
        model: PerformanceModel, remaining: int, elapsed_h: float, restart_h: float
    ) -> list[Plan]:
        rest = dataclasses.replace(request, target_steps=max(remaining, 1))
        return list(plan(profile, offers, model, rest).plans)

    return Refiner(
        profile=profile, calibration=cal, gpu_specs=SPECS, replan=replan,
        ran_on=lambda p: p.cluster, objective="cost", checkpoint_s=2.0,
    )  # fmt: skip


def _pinned(profile: Profile, cal: Calibration, name: str, nodes: int) -> Plan:
    request = PlanRequest(target_steps=10_000, allow_spot=False, mixes=False)
    model = PerformanceModel(SPECS, cal)
    return plan_pinned(profile, [QUAD, SINGLE], model, request, [(name, nodes)]).best


def test_the_re_plan_prices_restarts_at_this_attempts_measured_start_up() -> None:
    """A spot alternative's restarts cost what starting this attempt took, not the
    prior ``--restart-delay``."""
    cal = load_default_calibration()
    profile = _profile()
    quad = _pinned(profile, cal, "quad", 1)
    refiner = _refiner(profile, [QUAD, SINGLE], cal)
    asked: list[float] = []
    inner = refiner.replan

    def recording(
        model: PerformanceModel, remaining: int, elapsed_h: float, restart_h: float
    ) -> Sequence[Plan]:
        asked.append(restart_h)
        return inner(model, remaining, elapsed_h, restart_h)

    refiner.replan = recording
    refiner.check(quad, 2 * quad.step_s, 9_000, 0.1, startup_s=90.0)
    assert asked == [pytest.approx(90.0 / 3600.0)]


def test_a_slow_shared_node_refits_colocation_and_moves_to_one_gpu_per_node() -> None:
    cal = load_default_calibration()
    profile = _profile()
    quad = _pinned(profile, cal, "quad", 1)
    refiner = _refiner(profile, [QUAD, SINGLE], cal)
    # one node of four GPUs measured twice as slow as predicted (profiled on a T4 too)
    decision = refiner.check(quad, 2 * quad.step_s, 9_000, 0.1, startup_s=60.0)
    assert decision is not None and decision.reason.startswith(REPLANNED)
    assert decision.plan is not None
    assert max(g.gpus_per_node for g in decision.plan.cluster.groups) == 1
    # the job's co-location term took the blame: its compute was profiled on this GPU
    job = refiner.calibration.job("Job", profile.environment.instance_type)
    assert job is not None and job.colocation_slowdown > 0.15
    assert job.compute_scale == pytest.approx(1.0, abs=0.1)


def test_a_step_inside_the_interval_moves_nothing() -> None:
    cal = load_default_calibration()
    profile = _profile()
    quad = _pinned(profile, cal, "quad", 1)
    refiner = _refiner(profile, [QUAD, SINGLE], cal)
    assert refiner.check(quad, quad.step_s, 9_000, 0.1, startup_s=60.0) is None
    assert refiner.calibration is cal  # nothing learned, nothing kept


def test_moving_must_pay_for_its_measured_cost() -> None:
    cal = load_default_calibration()
    profile = _profile()
    quad = _pinned(profile, cal, "quad", 1)
    refiner = _refiner(profile, [QUAD, SINGLE], cal)
    # the same slowdown, but ten steps are left and starting up took ten minutes
    assert refiner.check(quad, 2 * quad.step_s, 10, 0.1, startup_s=600.0) is None
    assert refiner.last is not None and refiner.last.move is not None
    assert refiner.last.moving_usd > refiner.last.stay_cost_usd - refiner.last.move_cost_usd


def _reports(step_s: float, startup_s: float, count: int) -> list[ProgressEvent]:
    """What rank zero reports for a job whose true step is ``step_s``: one report a
    second, the first also carrying ``startup_s`` of start-up (restore, set-up, the
    first slow iterations) spread over its steps."""
    per_report = max(int(1.0 / step_s), 1)
    out = [ProgressEvent("resumed", 0.0, 25, 0.0, "ckpt", 1)]
    step, now = 25, 0.0
    for i in range(count):
        took = per_report * step_s + (startup_s if i == 0 else 0.0)
        step, now = step + per_report, now + took
        out.append(ProgressEvent("step", now, step, took / per_report, "", 1))
    return out


def test_a_job_on_prediction_with_20_s_of_start_up_never_moves() -> None:
    cal = load_default_calibration()
    profile = _profile()
    quad = _pinned(profile, cal, "quad", 1)
    refiner = _refiner(profile, [QUAD, SINGLE], cal)
    events = _reports(quad.step_s, startup_s=20.0, count=6)  # about 50 steps
    # The mean over the attempt reads the start-up as a slow job, outside the interval...
    assert mean_step_time(events) > 2 * quad.step_high_s
    # ...the steady time after warm-up does not, and the refiner keeps the plan.
    steady = steady_step_time(events)
    assert steady == pytest.approx(quad.step_s)
    assert refiner.check(quad, steady, 9_000, 0.1, startup_s=20.0) is None


def test_a_real_two_fold_slowdown_moves_and_says_why() -> None:
    cal = load_default_calibration()
    profile = _profile()
    quad = _pinned(profile, cal, "quad", 1)
    refiner = _refiner(profile, [QUAD, SINGLE], cal)
    steady = steady_step_time(_reports(2 * quad.step_s, startup_s=20.0, count=6))
    assert steady == pytest.approx(2 * quad.step_s)
    decision = refiner.check(quad, steady, 9_000, 0.1, startup_s=20.0)
    assert decision is not None and decision.plan is not None
    assert "even at the slow end of its prediction" in decision.reason
    assert refiner.last is not None
    assert refiner.last.move_cost_usd < 0.9 * refiner.last.stay_cost_usd


def test_an_unexplained_slowdown_on_one_gpu_type_does_not_make_others_look_cheaper() -> None:
    """On a single GPU nothing shares a node or communicates: the refit cannot tell the
    GPU's share from the job's, so its compute scale slows every GPU type alike and the
    type not yet tried keeps its place against the one measured."""
    cal = load_default_calibration()
    profile = _profile()
    a10g = _offer("a10g", 1, 1.3, acc="A10G")
    single = _pinned(profile, cal, "single", 1)
    refiner = _refiner(profile, [SINGLE, a10g], cal)
    refiner.check(single, 1.6 * single.step_s, 9_000, 0.1, startup_s=5.0)
    job = refiner.last
    assert job is not None and job.refitted_step_s > 1.2 * single.step_s
    from lightning_srifty.fit.refine import refit_job

    refitted = refit_job(cal, profile, single.cluster, 1.6 * single.step_s, gpu_specs=SPECS)
    terms = refitted.job("Job", profile.environment.instance_type)
    assert terms is not None and terms.accelerator == EVERY_ACCELERATOR
    other = Cluster((ClusterGroup(a10g, 1, 1),))

    def ratio(c: Calibration) -> float:
        model = PerformanceModel(SPECS, c)
        return model.predict(profile, other).step_s / model.predict(profile, single.cluster).step_s

    assert ratio(refitted) == pytest.approx(ratio(cal), rel=0.02)


@pytest.mark.slow
def test_local_run_with_a_slowdown_on_shared_nodes_migrates_and_finishes(
    tmp_path: Path,
) -> None:
    """Real processes: 2 on one node sleep each step; the refiner moves the job to nodes
    of 1 process, where it runs at full speed and finishes."""
    run_dir = tmp_path / "run"
    profiled = run_profile(
        str(SCRIPT), (), run_dir=run_dir, checkpoint_uri=str(run_dir / "checkpoints"),
        extra_env={"OMP_NUM_THREADS": "1", "SRIFTY_IMDS": "off", proto.ENV_JOB_STEPS: "300"},
    )  # fmt: skip
    profile = profiled.profile
    acc = profile.environment.accelerator
    duo, solo = _offer("duo", 2, 2.0, acc), _offer("solo", 1, 1.0, acc)
    cal = load_default_calibration()
    backend = LocalBackend(tmp_path / "local", max_nodes=2, max_procs=2)
    request = PlanRequest(target_steps=300, allow_spot=False, mixes=False, max_nodes=2)
    start = plan_pinned(profile, [duo, solo], PerformanceModel({}, cal), request, [("duo", 1)])

    def replan(
        model: PerformanceModel, remaining: int, elapsed_h: float, restart_h: float
    ) -> list[Plan]:
        rest = dataclasses.replace(request, target_steps=max(remaining, 1))
        return list(plan(profile, [duo, solo], model, rest).plans)

    def ran_on(p: Plan) -> Cluster:
        return local_cluster(profile, backend.topology_for(p.cluster))

    refiner = Refiner(
        profile=profile, calibration=cal, gpu_specs={}, replan=replan, ran_on=ran_on,
        checkpoint_s=1.0,
    )  # fmt: skip
    model = PerformanceModel({}, cal)

    def expect(p: Plan) -> Expectation:
        run = predict_per_step(model, profile, ran_on(p))
        return Expectation(run.step_s, run.low_s, run.high_s, p.hourly_usd, 300)

    decider = PolicyDecider(
        policy=make_policy("on-demand"),
        candidates=lambda remaining, elapsed, changeover: Candidates((), start.best),
        home=plan_key(start.best),
        target_steps=300,
        deadline_h=None,
        changeover_h=0.1,
        wait_h=1e-3,
    )
    controller = Controller(
        backend=backend, script=str(SCRIPT),
        script_args=("--colocated-sleep", "0.2"), run_dir=run_dir,
        checkpoint_uri=str(run_dir / "checkpoints"), target_steps=300,
        next_planner=decider, expectation_for=expect,
        extra_env={"SRIFTY_IMDS": "off", "OMP_NUM_THREADS": "1"}, poll_s=0.3, grace_s=30.0,
        trainer_env_for=lambda p: proto.trainer_env(
            nodes=backend.topology_for(p.cluster).nodes,
            devices_per_node=backend.topology_for(p.cluster).procs_per_node,
            root_dir=str(run_dir / "lightning"),
        ),
        refiner=refiner.check, refine_after_steps=20,
    )  # fmt: skip
    summary = controller.run(start.best)
    assert summary.steps_done >= 300
    assert len(summary.migrations) == 1
    move = summary.migrations[0]
    assert move.reason.startswith(REPLANNED), move.reason
    assert "solo" in move.to_plan  # one process per node: nothing shares a node
    first, second = summary.attempts
    assert first.last_step < 300 and second.finished
    logged = [json.loads(line) for line in (run_dir / "migrations.jsonl").read_text().splitlines()]
    assert logged and logged[0]["reason"].startswith(REPLANNED)
    assert refiner.last is not None and refiner.last.measured_step_s > 0.15  # the sleep


def test_local_processes_all_reduce_over_tcp_sockets_as_gloo_does() -> None:
    # gloo has no shared-memory path: two processes of one machine talk over TCP, so
    # each message pays the TCP hop latency on both hops of a two-process ring.
    cal = load_default_calibration()
    model = PerformanceModel({}, cal)
    profile = _profile("T4", 0.01)
    two = predict_per_step(model, profile, local_cluster(profile, LocalTopology(1, 2)))
    one = predict_per_step(model, profile, local_cluster(profile, LocalTopology(1, 1)))
    assert local_cluster(profile, LocalTopology(1, 2)).groups[0].offer.links.isolated_gpus
    assert two.allreduce_s >= 2 * cal.physics.tcp_latency_s > 0.0
    assert one.allreduce_s == 0.0
