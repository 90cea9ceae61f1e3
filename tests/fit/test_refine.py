"""Refitting a job's own terms on measured runs: each GPU type a run measured is priced
at what it ran, and the profiled GPU keeps the profile's measurement."""

from __future__ import annotations

import dataclasses
import math

import pytest

from lightning_srifty.core.calibration import Calibration
from lightning_srifty.core.catalog import GpuSpec, Offer
from lightning_srifty.core.cluster import Cluster, ClusterGroup
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.core.profile import (
    BatchPoint,
    Environment,
    Memory,
    Profile,
    Spread,
    StepTimes,
)
from lightning_srifty.fit.calibration import ProbeRun, refit_on_probe_runs
from lightning_srifty.fit.refine import refit_job_on
from lightning_srifty.io.calibration_io import load_default_calibration

SPECS = {
    "T4": GpuSpec("T4", 8.1, 8.1, 65.0, 320.0, 16.0),
    "A10G": GpuSpec("A10G", 31.2, 62.5, 125.0, 600.0, 24.0),
    "V100": GpuSpec("V100", 15.7, 15.7, 125.0, 900.0, 16.0),
    "L4": GpuSpec("L4", 30.3, 60.0, 121.0, 300.0, 24.0),
}


def _one_gpu(acc: str) -> Cluster:
    offer = Offer(
        f"{acc.lower()}-box", acc, 1, 24.0, 8, 32, "us-west-2", "usw2-az1", 1.0, None,
        "none", 25.0,
    )  # fmt: skip
    return Cluster((ClusterGroup(offer, 1, 1),))


def _profile() -> Profile:
    """A T4 profile with a fixed per-step part (0.04 s) a transfer keeps as host time."""
    return Profile(
        kind="coarse",
        environment=Environment("NVIDIA T4", "T4", 1, 1, 1, "32-true", 32, "", ""),
        steps=StepTimes(Spread(0.2, 0.2, 0.2, 10), 0, 0, 0, 0, 0, 10),
        grad_bytes=4 * 1024**2,
        flops_per_step=0.0,
        memory=Memory(0, 0, 0, 0, 0, "unknown"),
        batch_points=(BatchPoint(16, 0.12, 0.12), BatchPoint(32, 0.2, 0.2)),
        model_name="Job",
    )


def _steps(cal: Calibration, profile: Profile) -> dict[str, tuple[float, float, float]]:
    model = PerformanceModel(SPECS, cal)
    out = {}
    for acc in SPECS:
        p = model.predict(profile, _one_gpu(acc))
        out[acc] = (p.step_s, p.low_s, p.high_s)
    return out


def test_each_measured_gpu_takes_its_own_measurement_and_the_profiled_one_keeps_its_own() -> None:
    """Probes on two other GPU types, one 2x slower than predicted (a host-bound job on a
    slow host: host time cannot be scaled by a GPU ratio), one 30 % faster. Before,
    one job-wide scale fitted both badly and moved the profiled T4 too."""
    cal = load_default_calibration()
    profile = _profile()
    before = _steps(cal, profile)
    measured = {"A10G": 2.0 * before["A10G"][0], "V100": 0.7 * before["V100"][0]}
    after = _steps(
        refit_job_on(
            cal, profile, [(_one_gpu(a), s) for a, s in measured.items()], gpu_specs=SPECS
        ),
        profile,
    )
    for acc, step in measured.items():
        assert after[acc][0] == pytest.approx(step, rel=0.03)
        # measured there: its compute is no transfer, its interval narrows
        width = math.log(after[acc][2] / after[acc][1])
        assert width < 0.8 * math.log(before[acc][2] / before[acc][1])
    assert after["T4"] == pytest.approx(before["T4"])
    # a type no run measured takes the measured types' geometric mean: a job-wide miss
    scales = [after[a][0] / before[a][0] for a in measured]
    assert after["L4"][0] / before["L4"][0] == pytest.approx(math.prod(scales) ** 0.5, rel=1e-6)


def test_a_rerun_on_the_profiled_gpu_rescales_it_and_every_untried_type() -> None:
    """The live refinement of a job running on the profiled GPU type, measured 1.6x
    slower: nothing tells the GPU's share from the job's, so the untried types move by
    the same factor and keep their place against it. (The profile measured this GPU
    too, so the refit splits the difference: its prior there is as tight as the run.)"""
    cal = load_default_calibration()
    profile = _profile()
    before = _steps(cal, profile)
    after = _steps(
        refit_job_on(cal, profile, [(_one_gpu("T4"), 1.6 * before["T4"][0])], gpu_specs=SPECS),
        profile,
    )
    factor = after["T4"][0] / before["T4"][0]
    assert factor > 1.2
    for acc in ("A10G", "V100", "L4"):
        assert after[acc][0] / before[acc][0] == pytest.approx(factor, rel=1e-6)


def test_the_launchers_probe_refit_prices_each_probed_type_at_its_probe() -> None:
    """:func:`refit_on_probe_runs`, what ``srifty-launch`` replans with after probes:
    each probed type is predicted at its measured step, the profiled type unchanged."""
    cal = load_default_calibration()
    profile = _profile()
    before = _steps(cal, profile)
    runs = [
        ProbeRun(_one_gpu("A10G"), "a10g-box", 1.5 * before["A10G"][0]),
        ProbeRun(_one_gpu("V100"), "v100-box", 0.8 * before["V100"][0]),
    ]
    after = _steps(refit_on_probe_runs(cal, profile, runs, SPECS), profile)
    assert after["A10G"][0] == pytest.approx(runs[0].step_s, rel=0.03)
    assert after["V100"][0] == pytest.approx(runs[1].step_s, rel=0.03)
    assert after["T4"] == pytest.approx(before["T4"])


def test_a_plan_of_the_shape_a_probe_ran_is_as_sure_as_the_probe() -> None:
    """After the refit the probed shape is predicted at its probe, but its interval was
    the calibration's row residual (about +-12 %), so a probed plan that meets a
    deadline with a 5 % margin was given up at 0.9 confidence. The shape a probe ran (its
    instance type, nodes, processes per node and batch) now spans the probe's own step
    reports; every other shape keeps the model's interval."""
    cal = load_default_calibration()
    profile = _profile()
    model = PerformanceModel(SPECS, cal)
    measured = 1.5 * model.predict(profile, _one_gpu("A10G")).step_s
    spread = (0.98 * measured, 1.03 * measured)
    runs = [
        ProbeRun(_one_gpu("A10G"), "a10g-box", measured, spread_s=spread),
        ProbeRun(_one_gpu("V100"), "v100-box", 0.2, spread_s=None),  # no spread reported
        ProbeRun(_one_gpu("L4"), "", 0.3, spread_s=(0.29, 0.31)),  # a mix: no one type
    ]
    refitted = refit_on_probe_runs(cal, profile, runs, SPECS)
    assert [
        (p.instance_type, p.nodes, p.gpus_per_node, p.local_batch) for p in refitted.probed
    ] == [("a10g-box", 1, 1, 32)]
    after = PerformanceModel(SPECS, refitted)
    probed = after.predict(profile, _one_gpu("A10G"))
    assert probed.low_s <= spread[0] * 1.0001 and probed.high_s >= spread[1] * 0.9999
    assert probed.low_s >= min(probed.step_s, measured) * 0.98 * 0.9999
    assert probed.high_s <= max(probed.step_s, measured) * 1.03 * 1.0001
    wide = model.predict(profile, _one_gpu("A10G"))
    assert (probed.high_s - probed.low_s) / probed.step_s < 0.5 * (
        (wide.high_s - wide.low_s) / wide.step_s
    )
    # another batch, another node count and another job are not what the probe ran
    for p in (
        after.predict(profile, _one_gpu("A10G"), local_batch=16),
        after.predict(profile, _nodes("A10G", 2)),
        after.predict(dataclasses.replace(profile, model_name="Other"), _one_gpu("A10G")),
        after.predict(profile, _one_gpu("V100")),
    ):
        assert (p.high_s - p.low_s) / p.step_s > 0.15
    # a later probe of the same shape replaces the earlier one
    again = refit_on_probe_runs(
        refitted,
        profile,
        [ProbeRun(_one_gpu("A10G"), "a10g-box", measured, spread_s=(measured, measured))],
        SPECS,
    )
    assert [(p.low_s, p.high_s) for p in again.probed] == [(measured, measured)]


def _nodes(acc: str, nodes: int) -> Cluster:
    return Cluster((ClusterGroup(_one_gpu(acc).groups[0].offer, nodes, 1),))


def test_a_slow_network_on_a_probed_type_is_not_taken_for_its_compute() -> None:
    """A one-process probe times the job's compute alone; a two-node probe of the same
    type, far slower than predicted, adds its network. The one-process shape stays at
    what its probe measured (the two-node miss goes to the type's link terms), where one
    compute scale fitted to both would price it between the two."""
    cal = load_default_calibration()
    profile = _profile()
    model = PerformanceModel(SPECS, cal)
    alone = 1.3 * model.predict(profile, _one_gpu("A10G")).step_s
    pair = 3.0 * model.predict(profile, _nodes("A10G", 2)).step_s
    runs = [
        ProbeRun(_one_gpu("A10G"), "a10g-box", alone),
        ProbeRun(_nodes("A10G", 2), "a10g-box", pair),
    ]
    after = PerformanceModel(SPECS, refit_on_probe_runs(cal, profile, runs, SPECS))
    assert after.predict(profile, _one_gpu("A10G")).step_s == pytest.approx(alone, rel=0.03)
    assert after.predict(profile, _nodes("A10G", 2)).step_s > 2.0 * (pair / 3.0)
