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
from lightning_srifty.core.links import loopback_links
from lightning_srifty.core.monitor import Expectation
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.core.planner import PlanRequest, plan
from lightning_srifty.core.profile import Profile
from lightning_srifty.core.spot import make_policy
from lightning_srifty.io.calibration_io import load_default_calibration
from lightning_srifty.launch.controller import Controller
from lightning_srifty.launch.launcher import LaunchOptions, probe_and_replan
from lightning_srifty.launch.local_backend import LocalBackend
from lightning_srifty.launch.migration import Candidates, PolicyDecider, plan_key
from lightning_srifty.launch.profiling import run_profile
from tests.fakes import RecordingUI

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
    done = run_profile(str(SCRIPT), ARGS, run_dir=run_dir,
                       checkpoint_uri=str(run_dir / "checkpoints"), extra_env=ENV)  # fmt: skip
    return done.profile, run_dir


def _probe(
    profile: Profile, run_dir: Path, offers: list[Offer], request: PlanRequest
) -> tuple[object, RecordingUI, object]:
    backend = LocalBackend(run_dir, max_nodes=2, max_procs=2)
    model = PerformanceModel({}, load_default_calibration())
    result = plan(profile, offers, model, request)
    controller = Controller(
        backend=backend, script=str(SCRIPT), script_args=ARGS, run_dir=run_dir,
        checkpoint_uri=str(run_dir / "checkpoints"), target_steps=100,
        next_planner=PolicyDecider(
            make_policy("on-demand"), lambda r, e: Candidates((), result.best),
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
    again, _ = probe_and_replan(options, ui, profile, offers, model, request, result,
                                controller, backend)  # fmt: skip
    return result, ui, again


def test_a_probe_that_changes_the_plan(profiled: tuple[Profile, Path]) -> None:
    """Two processes sharing a node look cheapest on paper; probed, they sleep on every
    batch, and the plan moves to one process per node."""
    profile, run_dir = profiled
    acc = profile.environment.accelerator
    offers = [_offer("duo", 2, 2.0, acc), _offer("solo", 1, 1.3, acc)]
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
    assert len(manifests) == 1 and "step000000013" in manifests[0]


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
