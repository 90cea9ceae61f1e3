"""Progress bookkeeping: cost, ETA and drift verdicts."""

from __future__ import annotations

import pytest

from lightning_srifty.core.errors import SchemaError
from lightning_srifty.core.launch_protocol import ProgressEvent
from lightning_srifty.core.monitor import Expectation, drift_of, measured_step_time, snapshot

EXPECT = Expectation(step_s=0.10, low_s=0.08, high_s=0.12, hourly_usd=3.6, target_steps=1000)


def steps(*times: float, start: int = 0) -> list[ProgressEvent]:
    return [
        ProgressEvent("step", 1000.0 + i, start + 10 * (i + 1), step_s=t)
        for i, t in enumerate(times)
    ]


def test_cost_and_eta_follow_measured_time() -> None:
    snap = snapshot(steps(0.2, 0.2, 0.2), EXPECT, elapsed_s=1800, start_step=0)
    assert snap.steps_done == 30
    assert snap.cost_so_far_usd == pytest.approx(1.8)
    assert snap.eta_s == pytest.approx((1000 - 30) * 0.2)


def test_eta_uses_prediction_before_first_report() -> None:
    snap = snapshot([], EXPECT, elapsed_s=0, start_step=100)
    assert snap.steps_done == 100
    assert snap.measured_step_s is None
    assert snap.eta_s == pytest.approx(900 * 0.10)


@pytest.mark.parametrize(
    ("times", "verdict"),
    [((0.1, 0.1, 0.11), ""), ((0.2, 0.19, 0.21), "slower"), ((0.05, 0.05, 0.06), "faster")],
)
def test_drift_leaves_interval(times, verdict) -> None:
    assert drift_of(steps(*times), EXPECT) == verdict


def test_no_drift_verdict_before_enough_samples() -> None:
    assert drift_of(steps(0.5, 0.5), EXPECT) == ""


def test_median_ignores_one_straggler() -> None:
    assert measured_step_time(steps(0.1, 5.0, 0.1, 0.1, 0.1)) == pytest.approx(0.1)


def test_progress_line_round_trip_and_bad_line() -> None:
    event = ProgressEvent("checkpoint", 12.5, 40, checkpoint="ckpt-40")
    assert ProgressEvent.from_line(event.to_line()) == event
    with pytest.raises(SchemaError, match="progress.jsonl"):
        ProgressEvent.from_line('{"event": "st', source="progress.jsonl")
    with pytest.raises(SchemaError, match="event"):
        ProgressEvent.from_line('{"event": "nope", "time": 1, "step": 1}', source="p")
