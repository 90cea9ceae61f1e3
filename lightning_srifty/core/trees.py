"""Gradient-boosted regression trees as plain arrays, evaluated with numpy.

The learned correction is fitted with scikit-learn in :mod:`lightning_srifty.io`, then
exported tree by tree (feature, threshold, left, right, value arrays) into the
calibration JSON. Evaluating it here needs neither scikit-learn nor pickles, so a
calibration file is data, never code, and the planner stays numpy-only.

The split convention is scikit-learn's: go left when ``x[feature] <= threshold``; a
leaf has ``left == right == -1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from lightning_srifty.core.errors import CalibrationError
from lightning_srifty.core.validate import Reader

LEAF = -1


@dataclass(frozen=True)
class Tree:
    """One regression tree in array form (node 0 is the root)."""

    feature: tuple[int, ...]
    threshold: tuple[float, ...]
    left: tuple[int, ...]
    right: tuple[int, ...]
    value: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "feature": list(self.feature),
            "threshold": list(self.threshold),
            "left": list(self.left),
            "right": list(self.right),
            "value": list(self.value),
        }

    @staticmethod
    def from_reader(r: Reader, n_features: int) -> Tree:
        tree = Tree(
            feature=r.ints("feature"),
            threshold=r.floats("threshold"),
            left=r.ints("left"),
            right=r.ints("right"),
            value=r.floats("value"),
        )
        size = len(tree.feature)
        if size == 0:
            raise r.fail("feature", "a tree needs at least one node")
        for name in ("threshold", "left", "right", "value"):
            if len(getattr(tree, name)) != size:
                raise r.fail(name, f"has {len(getattr(tree, name))} entries, feature has {size}")
        for i in range(size):
            leaf = tree.left[i] == LEAF
            if leaf != (tree.right[i] == LEAF):
                raise r.fail(f"left[{i}]", "a node must have both children or none")
            if not leaf:
                if not (i < tree.left[i] < size and i < tree.right[i] < size):
                    raise r.fail(f"left[{i}]", f"children must point forward inside 0..{size - 1}")
                if not 0 <= tree.feature[i] < n_features:
                    raise r.fail(f"feature[{i}]", f"must be in 0..{n_features - 1}")
        return tree


@dataclass(frozen=True)
class TreeEnsemble:
    """``base + learning_rate * sum(tree(x))``, the additive form of boosting."""

    base: float
    learning_rate: float
    trees: tuple[Tree, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "learning_rate": self.learning_rate,
            "trees": [t.to_dict() for t in self.trees],
        }

    @staticmethod
    def from_reader(r: Reader, n_features: int) -> TreeEnsemble:
        return TreeEnsemble(
            base=r.float("base"),
            learning_rate=r.float("learning_rate", minimum=0.0),
            trees=tuple(Tree.from_reader(t, n_features) for t in r.children("trees")),
        )

    @cached_property
    def _arrays(self) -> list[tuple[np.ndarray, ...]]:
        return [
            (
                np.asarray(t.feature, dtype=np.int64),
                np.asarray(t.threshold, dtype=np.float64),
                np.asarray(t.left, dtype=np.int64),
                np.asarray(t.right, dtype=np.int64),
                np.asarray(t.value, dtype=np.float64),
            )
            for t in self.trees
        ]

    def thresholds(self, feature: int) -> np.ndarray:
        """Sorted distinct split points on ``feature`` (the cells of the ensemble)."""
        found = [th[(left != LEAF) & (feat == feature)] for feat, th, left, _, _ in self._arrays]
        return np.unique(np.concatenate(found)) if found else np.zeros(0)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Evaluates all trees on ``features`` of shape (n, n_features), vectorised."""
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2:
            raise CalibrationError(f"tree features must be 2-D, got shape {x.shape}")
        n = x.shape[0]
        rows = np.arange(n)
        total = np.zeros(n, dtype=np.float64)
        for feature, threshold, left, right, value in self._arrays:
            node = np.zeros(n, dtype=np.int64)
            active = left[node] != LEAF
            while active.any():
                idx = rows[active]
                at = node[idx]
                go_left = x[idx, feature[at]] <= threshold[at]
                node[idx] = np.where(go_left, left[at], right[at])
                active[idx] = left[node[idx]] != LEAF
            total += value[node]
        return self.base + self.learning_rate * total


def cell_codes(features: np.ndarray, split_points: list[np.ndarray]) -> np.ndarray:
    """One integer per row naming the cell of the threshold grid it falls in.

    Rows with the same code take the same branch at every split of every tree (the
    count of split points strictly below ``x`` decides each ``x <= t`` test), so an
    ensemble needs evaluating once per distinct code: exact deduplication even when a
    feature is continuous.
    """
    x = np.asarray(features, dtype=np.float64)
    codes = np.zeros(x.shape[0], dtype=np.int64)
    for j, points in enumerate(split_points):
        codes = codes * (len(points) + 1) + np.searchsorted(points, x[:, j], side="left")
    return codes
