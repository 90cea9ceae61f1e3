"""Probes on the local backend: real processes measure the plans that could be best.

The local backend stands in for the cloud: a plan's shape runs scaled to this machine's
processes, as for training. ``colocated_slowdown.py`` sleeps on every batch when the
job shares its node with another of its processes, as a job whose data loading
saturates a shared host would; the profile (one process) cannot show that.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.catalog import Offer
from lightning_srifty.core.launch_protocol import ProgressEvent
from lightning_srifty.core.links import loopback_links
from lightning_srifty.core.monitor import Expectation
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.core.planner import PlanRequest, PlanResult, plan
from lightning_srifty.core.profile import Profile
from lightning_srifty.core.spot import make_policy
from lightning_srifty.io.calibration_io import load_default_calibration
from lightning_srifty.io.probe_io import load_probe_record
from lightning_srifty.launch.controller import Controller
from lightning_srifty.launch.launcher import LaunchOptions, probe_and_replan
from lightning_srifty.launch.local_backend import LocalBackend
from lightning_srifty.launch.migration import Candidates, PolicyDecider, plan_key
from lightning_srifty.launch.profiling import run_profile
from tests.fakes import RecordingUI
from tests.launch.e2e import events, handover_step

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "scripts" / "colocated_slowdown.py"
ARGS = ("--colocated-sleep", "0.2")
ENV = {"SRIFTY_IMDS": "off", "OMP_NUM_THREADS": "1"}


def _offer(name: str, count: int, hourly: float, acc: str) -> Offer:
    link = "PCIe" if count > 1 else "none"
    return Offer(
        name, acc, count, 16.0, 8.0 * count, 32.0 * count, "us-west-2", "usw2-az1",
        hourly, None, link, 50.0, links=loopback_links(link, 50.0),
    )  # fmt: skip


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Profile, Path]:
    run_dir = tmp_path_factory.mktemp("probe") / "run"
    # The job's length, as the launcher tells its profiling run (the controllers below
    # train to step 100)
    env = {**ENV, proto.ENV_JOB_STEPS: "100"}
    done = run_profile(str(SCRIPT), ARGS, run_dir=run_dir,
                       checkpoint_uri=str(run_dir / "checkpoints"), extra_env=env)  # fmt: skip
    return done.profile, run_dir


def _probe(
    profile: Profile, run_dir: Path, offers: list[Offer], request: PlanRequest
) -> tuple[PlanResult, RecordingUI, PlanResult]:
    result, ui, again, _ = _probe_model(profile, run_dir, offers, request)
    return result, ui, again


def _probe_model(
    profile: Profile, run_dir: Path, offers: list[Offer], request: PlanRequest
) -> tuple[PlanResult, RecordingUI, PlanResult, PerformanceModel]:
    backend = LocalBackend(run_dir, max_nodes=2, max_procs=2)
    model = PerformanceModel({}, load_default_calibration())
    result = plan(profile, offers, model, request)
    controller = Controller(
        backend=backend, script=str(SCRIPT), script_args=ARGS, run_dir=run_dir,
        checkpoint_uri=str(run_dir / "checkpoints"), target_steps=100,
        next_planner=PolicyDecider(
            make_policy("on-demand"), lambda r, e, c: Candidates((), result.best),
            plan_key(result.best), 100, None, 0.1, 1e-3,
        ),
        expectation_for=lambda p: Expectation(p.step_s, p.step_low_s, p.step_high_s, 0.0, 100),
        extra_env=ENV, poll_s=0.3,
        trainer_env_for=lambda p: proto.trainer_env(
            nodes=backend.topology_for(p.cluster).nodes,
            devices_per_node=backend.topology_for(p.cluster).procs_per_node,
            root_dir=str(run_dir / "lightning"),
        ),
    )  # fmt: skip
    options = LaunchOptions(script=str(SCRIPT), script_args=ARGS, request=request, run_dir=run_dir)
    ui = RecordingUI()
    again, refitted = probe_and_replan(options, ui, profile, offers, model, request, result,
                                       controller, backend)  # fmt: skip
    return result, ui, again, refitted


def test_a_probe_that_changes_the_plan(profiled: tuple[Profile, Path]) -> None:
    """Two processes sharing a node look cheapest on paper (0.8 per GPU-hour against
    1.3: a loaded machine's noisier profile does not tip it); probed, they sleep on
    every batch, and the plan moves to one process per node."""
    profile, run_dir = profiled
    acc = profile.environment.accelerator
    offers = [_offer("duo", 2, 1.6, acc), _offer("solo", 1, 1.3, acc)]
    request = PlanRequest(target_steps=2_000_000, allow_spot=False, mixes=False, max_nodes=2)
    before, ui, after = _probe(profile, run_dir, offers, request)
    assert before.best.cluster.groups[0].gpus_per_node == 2  # duo, on the profile alone
    assert any(m.startswith("probing ") for m in ui.messages), ui.messages
    probes = [m for m in ui.messages if m.startswith("probe ")]
    assert len(probes) >= 2, ui.messages
    duo = next(m for m in probes if "duo" in m)
    assert "ms per step measured against" in duo
    assert after.best.cluster.groups[0].gpus_per_node == 1  # solo: nothing shares a node
    changed = next(m for m in ui.messages if "the plan changed from" in m)
    assert "the probes cost $" in changed and "cheaper than plan #1 as measured" in changed
    # probes wrote no checkpoint: the only one is still the profiling run's
    manifests = [p.name for p in (run_dir / "checkpoints" / "manifests").iterdir()]
    assert len(manifests) == 1 and f"step{handover_step(run_dir):09d}" in manifests[0]


def test_a_probe_refits_the_probed_hardware_and_leaves_the_rest(
    profiled: tuple[Profile, Path],
) -> None:
    """The probe of two processes sharing a host measures their all-reduce and a step far
    slower than predicted: duo's own hardware terms move (its host's co-location), the
    plan leaves duo, and the hardware no probe ran on keeps the shipped constants."""
    profile, run_dir = profiled
    for old in run_dir.glob("probe-*.json"):
        old.unlink()
    # What probes of these numbers left in this folder before (the first test's, or a
    # run probing again on --resume): steady 9 s steps, which no probe here measures.
    stale = [ProgressEvent("resumed", 0.0, 13, 0.0, "", 2)]
    stale += [ProgressEvent("step", float(i), 13 + i, 9.0, "", 2) for i in range(1, 11)]
    for index in (1, 2, 3):
        (run_dir / f"probe-{index}.jsonl").write_text("".join(e.to_line() + "\n" for e in stale))
    acc = profile.environment.accelerator
    spare = _offer("spare", 1, 60.0, acc)  # far dearer than the rest: never a contender
    offers = [_offer("duo", 2, 1.6, acc), _offer("solo", 1, 1.3, acc), spare]
    request = PlanRequest(target_steps=2_000_000, allow_spot=False, mixes=False, max_nodes=2)
    before, ui, after, refitted = _probe_model(profile, run_dir, offers, request)
    assert before.best.cluster.groups[0].offer.instance_type == "duo"
    assert after.best.cluster.groups[0].offer.instance_type != "duo"

    shipped = load_default_calibration()
    cal = refitted.calibration
    probed = {h.instance_type: h for h in cal.hardware_terms}
    assert "duo" in probed and "spare" not in probed
    # sharing duo's host slowed every step: its co-location term, and no other type's
    assert probed["duo"].physics.colocation_slowdown > 2 * shipped.physics.colocation_slowdown
    assert cal.physics == shipped.physics and cal.physics_on("spare") == shipped.physics

    # the record of duo's probe: its steps and its collective-bandwidth measurement
    records = [load_probe_record(p) for p in sorted(run_dir.glob("probe-*.json"))]
    duo = next(r for r in records if r.instance_type == "duo")
    assert duo.stand_in and duo.nodes * duo.procs_per_node == 2
    assert duo.measured_step_s is not None and duo.measured_step_s > duo.predicted_high_s
    # measured by this probe's own run, not read from the leftover lines
    assert duo.measured_step_s < 9.0 and duo.elapsed_s > duo.steps * 0.2  # it slept 0.2 s a step
    # its steps count from the checkpoint it resumed, not the profiling run's as well
    ran = events(run_dir, f"probe-{duo.index}.jsonl")
    assert ran[0].event == "resumed" and ran[0].step == handover_step(run_dir) > 0
    assert duo.steps == max(e.step for e in ran) - ran[0].step
    assert len({b for b, _ in duo.allreduce}) >= 2 and all(t > 0 for _, t in duo.allreduce)
    assert duo.measured_gbps is not None and duo.measured_gbps > 0
    assert duo.cost_usd == pytest.approx(duo.elapsed_s / 3600 * 1.6)
    assert load_probe_record(run_dir / f"probe-{duo.index}.json") == duo
    # the spread of its steady steps: the shape it ran is now as sure as that
    assert duo.measured_low_s is not None and duo.measured_high_s is not None
    assert duo.measured_low_s <= duo.measured_step_s <= duo.measured_high_s
    shape = next(p for p in cal.probed if p.instance_type == "duo")
    assert (shape.nodes, shape.gpus_per_node) == (duo.nodes, duo.procs_per_node)
    k = profile.environment.accumulate_grad_batches
    assert shape.step_s == pytest.approx(duo.measured_step_s * k)
    assert shape.low_s == pytest.approx(duo.measured_low_s * k)

    said = "\n".join(ui.messages)
    assert "Gbps measured against" in said and "duo's hardware terms refitted on" in said
    assert f"the job's compute measured by the probes, against the prediction: {acc} x" in said
    assert "colocation_slowdown" in said
    assert "saved net of the probes" in said


def test_a_probe_skipped_because_the_intervals_do_not_overlap(
    profiled: tuple[Profile, Path],
) -> None:
    profile, run_dir = profiled
    acc = profile.environment.accelerator
    probes_before = sorted(run_dir.glob("probe-*"))
    # Plan #1 runs one process per node, as the profile did: nothing to check either.
    offers = [_offer("duo", 2, 9.0, acc), _offer("solo", 1, 1.0, acc)]
    request = PlanRequest(target_steps=2_000_000, allow_spot=False, mixes=False, max_nodes=1)
    before, ui, after = _probe(profile, run_dir, offers, request)
    assert before.best.cluster.groups[0].gpus_per_node == 1
    assert any("no probe: the plans' intervals do not overlap" in m for m in ui.messages)
    assert not any(m.startswith("probe ") for m in ui.messages)
    assert after is before
    assert sorted(run_dir.glob("probe-*")) == probes_before  # nothing ran


def test_the_probe_mode_is_checked(tmp_path: Path) -> None:
    from lightning_srifty.core.errors import ConfigError

    with pytest.raises(ConfigError, match="--probe 'sometimes' is not valid"):
        LaunchOptions(script="x.py", script_args=(), request=PlanRequest(target_steps=1),
                      probe="sometimes")  # fmt: skip
    assert (
        dataclasses.replace(
            LaunchOptions(script="x.py", script_args=(), request=PlanRequest(target_steps=1)),
            probe="off",
        ).probe
        == "off"
    )
