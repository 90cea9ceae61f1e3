"""Steps on clusters of different sizes add up to what they are worth."""

from __future__ import annotations

import pytest

from lightning_srifty.core.errors import SchemaError
from lightning_srifty.core.steps import StepLedger


def test_one_world_size_throughout_is_a_plain_count() -> None:
    ledger = StepLedger(target_base=100)
    assert ledger.start(25, 1.0) == 100
    assert ledger.base_at(60) == 60 and ledger.remaining_base(60) == 40


def test_a_bigger_cluster_needs_fewer_steps_for_the_same_samples() -> None:
    ledger = StepLedger(target_base=100)  # 100 steps of one process
    # profiled to step 25, then four processes: each step is worth four
    assert ledger.start(25, 4.0) == 25 + 19  # ceil(75 / 4)
    # preempted at step 35 (worth 25 + 40 = 65), resumed on two processes
    assert ledger.base_at(35) == 65
    assert ledger.start(35, 2.0) == 35 + 18  # ceil(35 / 2)
    assert ledger.base_at(53) == 101  # the last step overshoots by at most one step


def test_a_resume_behind_the_newest_attempt_counts_from_where_it_went_back() -> None:
    ledger = StepLedger(target_base=1000)
    ledger.start(0, 1.0)
    ledger.start(100, 2.0)  # ran from 100 at two base steps a step
    # that attempt crashed; its last checkpoint was at step 130
    assert ledger.base_at(130) == 160
    # and if even that one is gone, the step 90 checkpoint of the first attempt counts
    assert ledger.base_at(90) == 90
    assert ledger.start(130, 1.0) == 130 + 840


def test_the_ledger_survives_json_and_rejects_nonsense() -> None:
    ledger = StepLedger(target_base=500)
    ledger.start(25, 1.0)
    ledger.start(40, 3.0)
    again = StepLedger.from_dict(ledger.to_dict())
    assert again == ledger
    bad = ledger.to_dict()
    bad["segments"][1]["base_per_step"] = 0
    with pytest.raises(SchemaError, match="base_per_step"):
        StepLedger.from_dict(bad, source="steps.json")
    with pytest.raises(ValueError):
        StepLedger(target_base=1).start(0, 0.0)
