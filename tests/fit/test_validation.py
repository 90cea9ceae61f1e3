"""The held-out protocols: a predicted row never reaches the fit that predicts it.

Synthetic folders prove the bookkeeping (which rows enter which fit); the accuracy on
real measurements is in ``tests/fit/test_real_accuracy.py``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lightning_srifty.core.calibration import Calibration
from lightning_srifty.core.errors import CalibrationError
from lightning_srifty.fit.calibration import calibrate_traces, fit_group, refit_on_probes
from lightning_srifty.fit.validation import (
    cross_validate,
    predict_rows,
    probe_revealed,
    split_rows,
    summarise,
    unseen_hardware_calibration,
)
from lightning_srifty.io.traces import TraceSet, load_traces
from tests.io.test_traces import scaled, write_synthetic_traces


@pytest.mark.parametrize(
    ("protocol", "held"),
    [("lomo", lambda r: r.replicas > 1), ("scale-out", lambda r: r.nodes > 1)],
)
def test_held_out_rows_never_reach_the_fit(
    synthetic: TraceSet, protocol: str, held: object
) -> None:
    base = cross_validate(synthetic, protocol, models=["beta"], learned=False)[0]
    perturbed = cross_validate(
        scaled(synthetic, "beta", held, 3.0), protocol, models=["beta"], learned=False
    )[0]
    assert perturbed.predicted_s.tolist() == base.predicted_s.tolist()
    assert perturbed.high_s.tolist() == base.high_s.tolist()
    # ...while the held-out truth did change, and training rows do matter:
    assert float(np.median(perturbed.ape)) > 0.5
    trained = cross_validate(
        scaled(synthetic, "alpha", held, 3.0), protocol, models=["beta"], learned=False
    )[0]
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
    with pytest.raises(CalibrationError, match="--protocol must be one of"):
        cross_validate(synthetic, "random")


@pytest.fixture(scope="module")
def two_kinds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Calibration]:
    """A data root with two kinds of hardware and a calibration fitted on both."""
    root = tmp_path_factory.mktemp("data")
    write_synthetic_traces(root / "kind-a", noise=0.02)
    write_synthetic_traces(
        root / "kind-b", noise=0.02, seed=1, hardware_changes={"inter_node_gbps": 25}
    )
    sets = [(name, load_traces(root / name)) for name in ("kind-a", "kind-b")]
    return root, calibrate_traces(sets, learned=False)


def test_unseen_hardware_refits_without_any_row_of_that_hardware(
    two_kinds: tuple[Path, Calibration],
) -> None:
    root, base = two_kinds
    assert [s.name for s in base.sources] == ["kind-a", "kind-b"]
    a = load_traces(root / "kind-a")
    refit, used = unseen_hardware_calibration(a, base, data_root=root, learned=False)
    assert used == ["kind-b"] and refit.rows < base.rows
    got = cross_validate(
        a, "unseen-hardware", base=base, data_root=root, models=["beta"], learned=False
    )[0]
    # tripling every row of kind-a changes nothing the refit saw...
    tripled = scaled(a, "beta", lambda r: r.replicas > 1, 3.0)
    again = cross_validate(
        tripled, "unseen-hardware", base=base, data_root=root, models=["beta"], learned=False
    )[0]
    assert again.predicted_s.tolist() == got.predicted_s.tolist()
    assert float(np.median(again.ape)) > 0.5


def test_hardware_the_calibration_never_saw_uses_it_as_it_is(
    two_kinds: tuple[Path, Calibration], tmp_path: Path
) -> None:
    _, base = two_kinds
    new = load_traces(
        write_synthetic_traces(tmp_path / "kind-c", hardware_changes={"gpus_per_node": 8})
    )
    same, used = unseen_hardware_calibration(new, base, data_root=tmp_path)
    assert same is base and used == ["kind-a", "kind-b"]
    got = cross_validate(new, "unseen-hardware", base=base, models=["alpha"])[0]
    direct = predict_rows(new, "alpha", [r for r in new.rows["alpha"] if r.replicas > 1], base)
    assert got.predicted_s.tolist() == direct.predicted_s.tolist()


def test_refitting_without_the_other_sets_is_a_clear_error(
    two_kinds: tuple[Path, Calibration], tmp_path: Path
) -> None:
    root, base = two_kinds
    a = load_traces(root / "kind-a")
    with pytest.raises(CalibrationError, match=r"kind-b is not under .*--data-root"):
        unseen_hardware_calibration(a, base, data_root=tmp_path)


def test_summary_reports_bias_and_interval_coverage(synthetic: TraceSet) -> None:
    results = cross_validate(synthetic, "lomo", models=["alpha", "gamma"], learned=False)
    summary = summarise(results, "lomo")
    assert set(summary["models"]) == {"alpha", "gamma"}
    every = np.concatenate([r.ape for r in results])
    assert summary["overall"]["median_ape"] == pytest.approx(float(np.median(every)))
    assert summary["overall"]["rows"] == every.size
    assert 0.0 <= summary["overall"]["interval_coverage"] <= 1.0


def test_probed_reveals_only_what_a_probe_measures(two_kinds: tuple[Path, Calibration]) -> None:
    root, base = two_kinds
    a = load_traces(root / "kind-a")
    got = cross_validate(a, "probed", base=base, data_root=root, models=["beta"], learned=False)
    (beta,) = got
    # every multi-GPU row beyond one or two nodes of one or two GPUs is predicted ...
    expected = [r for r in a.rows["beta"] if r.replicas > 1 and not probe_revealed(r)]
    assert list(beta.rows) == expected
    assert all(r.nodes > 2 or max(r.placement) > 2 for r in beta.rows)
    # ... the probe's own rows are not, and they reach the refit ...
    revealed = scaled(a, "beta", lambda r: r.replicas > 1 and probe_revealed(r), 1.5)
    moved = cross_validate(
        revealed, "probed", base=base, data_root=root, models=["beta"], learned=False
    )[0]
    assert moved.predicted_s.tolist() != beta.predicted_s.tolist()
    # ... while the predicted rows never do
    hidden = scaled(a, "beta", lambda r: r.replicas > 1 and not probe_revealed(r), 3.0)
    same = cross_validate(
        hidden, "probed", base=base, data_root=root, models=["beta"], learned=False
    )[0]
    assert same.predicted_s.tolist() == beta.predicted_s.tolist()


def test_a_probe_refit_moves_the_calibration_towards_the_probed_hardware(
    two_kinds: tuple[Path, Calibration], tmp_path: Path
) -> None:
    _, base = two_kinds
    # hardware whose network is four times slower than any the calibration saw
    slow = load_traces(
        write_synthetic_traces(tmp_path / "slow", noise=0.02, hardware_changes={"nodes": 16})
    )
    slow = scaled(slow, "alpha", lambda r: r.nodes > 1, 1.6)
    probed = [r for r in slow.rows["alpha"] if r.replicas > 1 and probe_revealed(r)]
    refit = refit_on_probes(base, [fit_group(slow, "alpha", probed)])
    # the probed instance type gets constants of its own; every other keeps the base's
    kind = slow.hardware.instance_type
    assert [h.instance_type for h in refit.hardware_terms] == [kind]
    assert refit.physics_on(kind) != base.physics
    assert refit.physics == base.physics and refit.physics_on("other.type") == base.physics
    far = [r for r in slow.rows["alpha"] if r.nodes > 2]
    before = predict_rows(slow, "alpha", far, base)
    after = predict_rows(slow, "alpha", far, refit)
    assert np.median(after.ape) < np.median(before.ape)
    assert refit.physics_on(kind).inter_algorithm == base.physics.inter_algorithm
    assert refit_on_probes(base, []) is base


def test_a_probes_measured_link_centres_the_refit_of_its_type_only(
    two_kinds: tuple[Path, Calibration], tmp_path: Path
) -> None:
    _, base = two_kinds
    slow = load_traces(write_synthetic_traces(tmp_path / "slow", noise=0.02))
    kind = slow.hardware.instance_type
    probed = [r for r in slow.rows["alpha"] if r.replicas > 1 and probe_revealed(r)]
    measured = {kind: {"tcp_efficiency": 0.05}}
    alone = refit_on_probes(base, [], evidence=measured)  # the measurement, no steps
    assert alone.physics_on(kind).tcp_efficiency == pytest.approx(0.05)
    assert alone.hardware_terms[0].evidence == ("tcp_efficiency",)
    assert alone.physics == base.physics
    fitted = refit_on_probes(base, [fit_group(slow, "alpha", probed)], evidence=measured)
    free = refit_on_probes(base, [fit_group(slow, "alpha", probed)])
    got, unguided = fitted.physics_on(kind).tcp_efficiency, free.physics_on(kind).tcp_efficiency
    # the measured rate pulls the fit towards it, against rows that say otherwise
    assert abs(math.log(got / 0.05)) < abs(math.log(unguided / 0.05))
