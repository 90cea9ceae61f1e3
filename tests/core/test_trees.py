"""Tree ensembles in array form: evaluation and validation of the JSON shape."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_srifty.core.errors import CalibrationError
from lightning_srifty.core.trees import Tree, TreeEnsemble
from lightning_srifty.core.validate import Reader

STUMP = Tree(
    feature=(0, 0, 0),
    threshold=(0.5, 0.0, 0.0),
    left=(1, -1, -1),
    right=(2, -1, -1),
    value=(0.0, 1.0, 2.0),
)
DEEP = Tree(
    feature=(1, 0, 0, 0, 0),
    threshold=(10.0, -1.0, 0.0, 0.0, 0.0),
    left=(1, 3, -1, -1, -1),
    right=(2, 4, -1, -1, -1),
    value=(0.0, 0.0, 5.0, -1.0, 3.0),
)


def test_ensemble_adds_scaled_leaves_to_the_base() -> None:
    ens = TreeEnsemble(base=0.1, learning_rate=0.5, trees=(STUMP, DEEP))
    x = np.array([[0.2, 20.0], [0.9, 5.0], [-2.0, 5.0]])
    # row 0: stump left 1.0, deep right 5.0; row 1: 2.0 and (x0 > -1) 3.0;
    # row 2: 1.0 and (x0 <= -1) -1.0
    expected = [0.1 + 0.5 * 6.0, 0.1 + 0.5 * 5.0, 0.1 + 0.5 * 0.0]
    assert ens.predict(x).tolist() == pytest.approx(expected)


def test_split_goes_left_on_equality_like_scikit_learn() -> None:
    ens = TreeEnsemble(0.0, 1.0, (STUMP,))
    assert ens.predict(np.array([[0.5, 0.0]])).tolist() == [1.0]


def test_round_trip_through_dict() -> None:
    ens = TreeEnsemble(0.3, 0.1, (STUMP, DEEP))
    back = TreeEnsemble.from_reader(Reader(ens.to_dict(), source="t.json"), 2)
    assert back == ens


def test_a_child_pointing_backwards_is_rejected() -> None:
    bad = STUMP.to_dict() | {"left": [0, -1, -1]}
    with pytest.raises(CalibrationError, match="children must point forward"):
        Tree.from_reader(Reader(bad, source="cal.json", error=CalibrationError), 2)


def test_mismatched_lengths_and_features_are_rejected() -> None:
    short = STUMP.to_dict() | {"value": [0.0]}
    with pytest.raises(CalibrationError, match="value"):
        Tree.from_reader(Reader(short, source="cal.json", error=CalibrationError), 2)
    wide = STUMP.to_dict() | {"feature": [5, 0, 0]}
    with pytest.raises(CalibrationError, match="feature"):
        Tree.from_reader(Reader(wide, source="cal.json", error=CalibrationError), 2)


def test_features_must_be_two_dimensional() -> None:
    with pytest.raises(CalibrationError):
        TreeEnsemble(0.0, 1.0, (STUMP,)).predict(np.array([0.1, 0.2]))


def test_cell_codes_deduplicate_exactly_even_on_split_points() -> None:
    from lightning_srifty.core.trees import cell_codes

    ens = TreeEnsemble(0.3, 0.7, (STUMP, DEEP))
    rng = np.random.default_rng(3)
    x = rng.normal(size=(500, 2)) * 10
    x[:50, 0] = 0.5  # exactly on a split point
    x[50:100, 1] = 10.0
    points = [ens.thresholds(0), ens.thresholds(1)]
    assert points[0].tolist() == [-1.0, 0.5] and points[1].tolist() == [10.0]
    codes = cell_codes(x, points)
    _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    assert len(first) <= 3 * 2
    assert ens.predict(x[first])[inverse].tolist() == ens.predict(x).tolist()
