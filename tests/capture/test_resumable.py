"""ResumableLoader: seeded epoch order, exact mid-epoch resume, resharding on a new world."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_srifty.capture.resumable import ResumableLoader


def _dataset(n: int = 103) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.int64))


def _ids(batches: list[list[torch.Tensor]]) -> list[int]:
    return [int(v) for batch in batches for v in batch[0]]


def test_epoch_order_is_a_permutation_that_depends_on_seed_and_epoch() -> None:
    loader = ResumableLoader(_dataset(), batch_size=10, seed=3)
    first = _ids(list(loader))
    again = _ids(list(ResumableLoader(_dataset(), batch_size=10, seed=3)))
    loader.set_epoch(1)
    second = _ids(list(loader))
    other_seed = _ids(list(ResumableLoader(_dataset(), batch_size=10, seed=4)))
    assert first == again
    assert len(first) == 100 == len(set(first))  # drop_last: 10 full batches of 103
    assert first != second
    assert first != other_seed


def test_resume_mid_epoch_continues_at_the_exact_batch() -> None:
    whole = _ids(list(ResumableLoader(_dataset(), batch_size=8, seed=1)))
    loader = ResumableLoader(_dataset(), batch_size=8, seed=1)
    iterator = iter(loader)
    seen = [next(iterator) for _ in range(5)]
    state = loader.state_dict()

    resumed = ResumableLoader(_dataset(), batch_size=8, seed=1)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert _ids(seen) + _ids(rest) == whole


def test_checkpoint_at_epoch_end_does_not_skip_the_next_epoch() -> None:
    loader = ResumableLoader(_dataset(), batch_size=8, seed=1)
    list(loader)
    state = loader.state_dict()
    resumed = ResumableLoader(_dataset(), batch_size=8, seed=1)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # what Lightning does when the next epoch starts
    assert len(list(resumed)) == len(resumed) == 12


def test_bad_state_version_is_refused() -> None:
    loader = ResumableLoader(_dataset(), batch_size=8)
    with pytest.raises(ValueError, match="state_version"):
        loader.load_state_dict({"state_version": 99, "epoch": 0, "consumed_global": 0})


def test_invalid_batch_size_is_refused() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        ResumableLoader(_dataset(), batch_size=0)
