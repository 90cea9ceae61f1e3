"""The fit itself, on synthetic traces: planted constants come back, trees export exactly.

The synthetic folders follow planted constants through an independent re-statement of
the textbook formulas (:func:`tests.io.test_traces.planted_step`). These tests prove
the *algebra* of the fit (that it recovers what was planted, keeps a job's own terms
to that job, keeps trees only when they transfer); they say nothing about accuracy on
real hardware, which ``tests/fit/test_real_accuracy.py`` measures on real traces.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lightning_srifty.core.calibration import Calibration, PhysicsConstants
from lightning_srifty.core.links import NCCL_TCP_CHANNELS
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.fit.calibration import (
    PRIORS,
    FitGroup,
    _export_gbr,
    analytic_predictions,
    calibrate,
    calibrate_traces,
    fit_correction,
    fit_group,
    fit_physics,
    hardware_conformal_widening,
    trace_groups,
)
from lightning_srifty.io.traces import TraceSet, load_traces
from tests.io.test_traces import PLANTED, scaled, write_synthetic_traces


@pytest.fixture(scope="module")
def fitted(synthetic: TraceSet) -> Calibration:
    return calibrate(trace_groups(synthetic), hardware="synthetic")


def _effective_gbytes_s(phys: object) -> tuple[float, float]:
    """(across nodes, inside a node) for the synthetic cluster: one socket per NCCL
    connection from a pod, its traffic to another host tunnelled as one flow capped at
    10 Gbps in the placement group, 50 Gbps NIC."""
    eff = phys.tcp_efficiency  # type: ignore[attr-defined]
    flow = phys.tcp_flow_gbps  # type: ignore[attr-defined]
    inter = min(50.0, 10.0, NCCL_TCP_CHANNELS * flow) * eff / 8
    intra = NCCL_TCP_CHANNELS * flow * eff / 8
    return inter, intra


def test_planted_link_rates_and_overlap_are_recovered(fitted: Calibration) -> None:
    phys = fitted.physics
    inter, intra = _effective_gbytes_s(phys)
    assert inter == pytest.approx(PLANTED["inter_gbytes_s"], rel=0.1)
    assert intra == pytest.approx(PLANTED["intra_gbytes_s"], rel=0.15)
    assert phys.tail_fraction == pytest.approx(PLANTED["tail_fraction"], rel=0.15)
    assert phys.overlap_window == pytest.approx(PLANTED["overlap_window"], rel=0.15)
    assert fitted.metrics["physics_median_ape"] < 0.03
    assert fitted.rows > 100
    # the rows scatter around the planted physics: there is nothing for trees to learn
    assert fitted.correction is None


def test_constants_no_row_informs_stay_at_their_published_priors(fitted: Calibration) -> None:
    phys = fitted.physics
    # a TCP-only cluster says nothing about EFA, InfiniBand or NVLink
    for name in ("efa_efficiency", "ib_efficiency", "nvlink_efficiency"):
        assert getattr(phys, name) == pytest.approx(PRIORS[name].centre, rel=0.05)
        assert PRIORS[name].source


def test_every_constant_has_physical_bounds_and_a_named_source() -> None:
    for name, prior in PRIORS.items():
        assert prior.low < prior.centre < prior.high, name
        assert len(prior.source) > 10, name
    for name in ("tcp_efficiency", "efa_efficiency", "ib_efficiency", "nvlink_efficiency"):
        assert PRIORS[name].high <= 1.0  # no transport beats its line rate


def test_correction_is_kept_when_it_carries_over_to_jobs_it_did_not_see(
    synthetic: TraceSet,
) -> None:
    # an effect the physics lacks, alike in every job: 3+ node steps 30 % slower
    bent = synthetic
    for model in synthetic.rows:
        bent = scaled(bent, model, lambda r: r.nodes >= 3, 1.3)
    cal = calibrate(trace_groups(bent))
    assert cal.correction is not None
    plain = dataclasses.replace(cal, correction=None)
    group = trace_groups(bent)[0]
    measured = group.measured_s
    with_trees = PerformanceModel({}, cal).predict_batch(
        group.profile, group.candidates, local_batch=group.local_batch
    )
    without = PerformanceModel({}, plain).predict_batch(
        group.profile, group.candidates, local_batch=group.local_batch
    )
    err = np.median(np.abs(with_trees.step_s / measured - 1))
    assert err < np.median(np.abs(without.step_s / measured - 1))


def test_a_jobs_own_tail_is_fitted_and_kept_to_that_job(tmp_path: object) -> None:
    # beta's all-reduce is mostly shorter than its backward: its rows show the tail
    traces = load_traces(
        write_synthetic_traces(tmp_path, noise=0.02, tails={"beta": 0.8})  # type: ignore[arg-type]
    )
    groups: dict[str, FitGroup] = {
        m: fit_group(traces, m, [r for r in rows if r.replicas > 1])
        for m, rows in traces.rows.items()
    }
    cal = calibrate(list(groups.values()), learned=False)
    beta = cal.job("beta", traces.hardware.instance_type)
    assert beta is not None and beta.rows == groups["beta"].size
    hardware = cal.physics.tail_fraction
    assert abs(beta.tail_fraction - 0.8) < abs(hardware - 0.8) / 2
    assert hardware == pytest.approx(PLANTED["tail_fraction"], abs=0.1)
    assert cal.job("never-seen") is None and cal.physics_for("never-seen") == cal.physics
    own = analytic_predictions([groups["beta"]], cal.physics, {}, cal.jobs)[0]
    unseen = analytic_predictions([groups["beta"]], cal.physics, {})[0]
    measured = groups["beta"].measured_s
    assert np.median(np.abs(own / measured - 1)) < np.median(np.abs(unseen / measured - 1))
    # elsewhere the job keeps its overlap (its layer order) but not this host's co-location
    away = cal.job("beta", "another-instance-type")
    assert away is not None and away.tail_fraction == beta.tail_fraction
    assert away.colocation_slowdown == cal.physics.colocation_slowdown


def test_exported_trees_predict_exactly_like_scikit_learn() -> None:
    from sklearn.ensemble import GradientBoostingRegressor

    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 4))
    y = np.sin(x[:, 0]) + 0.3 * x[:, 1] * x[:, 2]
    for loss, extra in (("squared_error", {}), ("quantile", {"alpha": 0.9})):
        gbr = GradientBoostingRegressor(loss=loss, n_estimators=30, max_depth=3, **extra)
        gbr.fit(x, y)
        exported = _export_gbr(gbr, x)
        probe = rng.normal(size=(200, 4))
        assert exported.predict(probe) == pytest.approx(gbr.predict(probe), abs=1e-10)


def test_forced_trees_export_for_the_file_format(synthetic: TraceSet, fitted: Calibration) -> None:
    trees = fit_correction(
        trace_groups(synthetic), fitted.physics, jobs=fitted.jobs, require_transfer=False
    )
    assert trees is not None and trees.median.trees


def test_the_fit_is_the_recipes_answer_not_the_optimisers_start(synthetic: TraceSet) -> None:
    groups = trace_groups(synthetic)
    recipe, _ = fit_physics(groups)
    elsewhere = PhysicsConstants(
        tcp_efficiency=0.9, tcp_flow_gbps=3.0, tail_fraction=0.7, overlap_window=0.2,
        step_overhead_s=1e-5, tcp_latency_s=2e-4, colocation_slowdown=0.1,
    )  # fmt: skip
    moved, _ = fit_physics(groups, start=elsewhere)
    ours, theirs = recipe.to_dict(), moved.to_dict()
    assert {k: theirs[k] / v for k, v in ours.items() if abs(theirs[k] / v - 1) > 0.05} == {}
    assert moved.inter_algorithm == recipe.inter_algorithm
    # what no row can tell is its prior exactly, not wherever the optimiser stopped
    for name in ("efa_efficiency", "ib_efficiency", "nvlink_efficiency", "nvlink_latency_s"):
        assert ours[name] == pytest.approx(PRIORS[name].centre, rel=1e-6)


def test_leaving_a_kind_of_hardware_out_measures_how_far_a_new_one_sits(
    tmp_path: object,
) -> None:
    from pathlib import Path

    root = Path(str(tmp_path))
    a = load_traces(write_synthetic_traces(root / "a", noise=0.02))
    b = load_traces(
        write_synthetic_traces(
            root / "b", noise=0.02, seed=1, hardware_changes={"inter_node_gbps": 25}
        )
    )
    # kind b is 40 % slower on every multi-GPU row than the physics says
    for model in b.rows:
        b = scaled(b, model, lambda r: r.replicas > 1, 1.4)
    spread, widening = hardware_conformal_widening([("a", a), ("b", b)])
    assert spread > 0.1 and widening >= 0.0
    same, none = hardware_conformal_widening([("a", a), ("a2", a)])
    assert (same, none) == (0.0, 0.0)  # one kind of hardware: nothing to leave out
    cal = calibrate_traces([("a", a), ("b", b)], learned=False)
    assert cal.hardware_spread == pytest.approx(spread) and cal.seen_hardware == (("T4", "tcp"),)
    again = Calibration.from_dict(cal.to_dict())
    assert again.hardware_spread == cal.hardware_spread
    assert again.seen_hardware == cal.seen_hardware
