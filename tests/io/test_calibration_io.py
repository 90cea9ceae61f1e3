"""Calibration: planted constants come back, trees export exactly, no leakage."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from lightning_srifty.core.calibration import CALIBRATION_SCHEMA_VERSION, Calibration
from lightning_srifty.core.errors import CalibrationError
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.io.calibration_io import (
    FitGroup,
    _export_gbr,
    analytic_predictions,
    calibrate,
    cross_validate,
    fit_correction,
    fit_group,
    load_calibration,
    save_calibration,
    split_rows,
)
from lightning_srifty.io.traces import TraceSet, load_traces
from tests.io.test_traces import PLANTED, write_synthetic_traces


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> TraceSet:
    return load_traces(write_synthetic_traces(tmp_path_factory.mktemp("traces"), noise=0.02))


def _groups(traces: TraceSet) -> list[FitGroup]:
    return [
        fit_group(traces, m, [r for r in rows if r.replicas > 1]) for m, rows in traces.rows.items()
    ]


@pytest.fixture(scope="module")
def fitted(synthetic: TraceSet) -> Calibration:
    return calibrate(_groups(synthetic), hardware="synthetic")


@pytest.fixture(scope="module")
def with_trees(synthetic: TraceSet, fitted: Calibration) -> Calibration:
    """``fitted`` with a correction forced on (for the file format tests)."""
    trees = fit_correction(
        _groups(synthetic), fitted.physics, jobs=fitted.jobs, require_transfer=False
    )
    return dataclasses.replace(fitted, correction=trees)


def test_planted_hardware_constants_are_recovered(fitted: Calibration) -> None:
    phys = fitted.physics
    assert phys.inter_bw_efficiency * 50 / 8 == pytest.approx(PLANTED["inter_gbytes_s"], rel=0.1)
    assert phys.intra_bw_efficiency * 15.75 == pytest.approx(PLANTED["intra_gbytes_s"], rel=0.15)
    assert phys.tail_fraction == pytest.approx(PLANTED["tail_fraction"], rel=0.15)
    assert phys.overlap_window == pytest.approx(PLANTED["overlap_window"], rel=0.15)
    assert phys.two_node_factor == pytest.approx(1.0, rel=0.1)
    assert fitted.metrics["physics_median_ape"] < 0.03
    assert fitted.rows > 100
    # the rows scatter around the planted physics: there is nothing for trees to learn
    assert fitted.correction is None


def test_correction_is_kept_when_it_carries_over_to_jobs_it_did_not_see(
    synthetic: TraceSet,
) -> None:
    # an effect the physics lacks, alike in every job: 3+ node steps 30 % slower
    bent = synthetic
    for model in synthetic.rows:
        bent = _scaled(bent, model, lambda r: r.nodes >= 3, 1.3)
    cal = calibrate(_groups(bent))
    assert cal.correction is not None
    plain = dataclasses.replace(cal, correction=None)
    group = _groups(bent)[0]
    measured = group.measured_s
    with_trees = PerformanceModel({}, cal).predict_batch(
        group.profile, group.candidates, local_batch=group.local_batch
    )
    without = PerformanceModel({}, plain).predict_batch(
        group.profile, group.candidates, local_batch=group.local_batch
    )
    err = np.median(np.abs(with_trees.step_s / measured - 1))
    assert err < np.median(np.abs(without.step_s / measured - 1))


def test_calibration_round_trips_through_json(with_trees: Calibration, tmp_path: Path) -> None:
    assert with_trees.correction is not None and with_trees.jobs
    path = save_calibration(with_trees, tmp_path / "cal.json")
    assert load_calibration(path) == with_trees
    assert json.loads(path.read_text())["schema_version"] == CALIBRATION_SCHEMA_VERSION


def test_newer_schema_and_bad_fields_are_rejected(with_trees: Calibration, tmp_path: Path) -> None:
    doc = with_trees.to_dict()
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc | {"schema_version": 99}))
    with pytest.raises(CalibrationError, match="upgrade lightning-srifty"):
        load_calibration(path)
    path.write_text(json.dumps(doc | {"physics": doc["physics"] | {"tail_fraction": 2.0}}))
    with pytest.raises(CalibrationError, match=r"cal\.json.*physics\.tail_fraction"):
        load_calibration(path)
    path.write_text(json.dumps(doc | {"schema_version": 1}))
    with pytest.raises(CalibrationError, match="re-run srifty calibrate"):
        load_calibration(path)
    corr = doc["correction"] | {"feature_names": ["x"]}
    path.write_text(json.dumps(doc | {"correction": corr}))
    with pytest.raises(CalibrationError, match="feature_names"):
        load_calibration(path)


def test_a_jobs_own_tail_is_fitted_and_kept_to_that_job(tmp_path: Path) -> None:
    # beta's all-reduce is mostly shorter than its backward: its rows show the tail
    traces = load_traces(write_synthetic_traces(tmp_path, noise=0.02, tails={"beta": 0.8}))
    groups = {
        m: fit_group(traces, m, [r for r in rows if r.replicas > 1])
        for m, rows in traces.rows.items()
    }
    cal = calibrate(list(groups.values()), learned=False)
    beta = cal.job("beta")
    assert beta is not None and beta.rows == groups["beta"].size
    hardware = cal.physics.tail_fraction
    assert abs(beta.tail_fraction - 0.8) < abs(hardware - 0.8) / 2
    assert hardware == pytest.approx(PLANTED["tail_fraction"], abs=0.1)
    assert cal.job("never-seen") is None and cal.physics_for("never-seen") == cal.physics
    own = analytic_predictions([groups["beta"]], cal.physics, {}, cal.jobs)[0]
    unseen = analytic_predictions([groups["beta"]], cal.physics, {})[0]
    measured = groups["beta"].measured_s
    assert np.median(np.abs(own / measured - 1)) < np.median(np.abs(unseen / measured - 1))


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


def _scaled(traces: TraceSet, model: str, keep: object, factor: float) -> TraceSet:
    rows = dict(traces.rows)
    rows[model] = tuple(
        dataclasses.replace(r, step_time=r.step_time * factor, sync_time=r.sync_time * factor)
        if keep(r)  # type: ignore[operator]
        else r
        for r in traces.rows[model]
    )
    return dataclasses.replace(traces, rows=rows)


@pytest.mark.parametrize(
    ("protocol", "held"),
    [("lomo", lambda r: r.replicas > 1), ("scale-out", lambda r: r.nodes > 1)],
)
def test_held_out_rows_never_reach_the_fit(
    synthetic: TraceSet, protocol: str, held: object
) -> None:
    base = cross_validate(synthetic, protocol, models=["beta"])[0]
    perturbed = cross_validate(_scaled(synthetic, "beta", held, 3.0), protocol, models=["beta"])[0]
    assert perturbed.predicted_s.tolist() == base.predicted_s.tolist()
    assert perturbed.high_s.tolist() == base.high_s.tolist()
    # ...while the held-out truth did change, and training rows do matter:
    assert float(np.median(perturbed.ape)) > 0.5
    trained = cross_validate(_scaled(synthetic, "alpha", held, 3.0), protocol, models=["beta"])[0]
    assert trained.predicted_s.tolist() != base.predicted_s.tolist()


def test_split_rows_are_disjoint(synthetic: TraceSet) -> None:
    for protocol in ("lomo", "scale-out"):
        fit, target = split_rows(synthetic, "gamma", protocol)
        fit_models = {g.model for g in fit}
        assert ("gamma" in fit_models) == (protocol == "scale-out")
        if protocol == "scale-out":
            own = next(g for g in fit if g.model == "gamma")
            assert set(own.candidates.nodes.sum(axis=1).tolist()) == {1}
            assert all(r.nodes > 1 for r in target)
    with pytest.raises(CalibrationError, match="--protocol"):
        split_rows(synthetic, "gamma", "random")
