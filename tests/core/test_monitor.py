"""Progress bookkeeping: cost, ETA and drift verdicts."""

from __future__ import annotations

import pytest

from lightning_srifty.core.errors import SchemaError
from lightning_srifty.core.launch_protocol import ProgressEvent
from lightning_srifty.core.monitor import (
    Expectation,
    drift_of,
    mean_step_time,
    measured_step_time,
    snapshot,
)

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


def test_run_mean_weights_each_report_by_its_steps_across_attempts() -> None:
    first = [
        ProgressEvent("start", 0.0, 0),
        ProgressEvent("step", 1.0, 10, step_s=0.1),  # 10 steps at 0.1 s
        ProgressEvent("checkpoint", 1.1, 10, checkpoint="c"),
        ProgressEvent("step", 2.0, 40, step_s=0.2),  # 30 steps at 0.2 s
    ]
    second = [
        ProgressEvent("resumed", 5.0, 35, checkpoint="c"),  # lost 5 steps, counted again
        ProgressEvent("step", 6.0, 45, step_s=0.4),  # 10 steps at 0.4 s
    ]
    expected = (10 * 0.1 + 30 * 0.2 + 10 * 0.4) / 50
    assert mean_step_time(first + second) == pytest.approx(expected)
    assert measured_step_time(first + second) == pytest.approx(0.2)  # median of recent reports
    assert mean_step_time(first[:1]) is None
    # A finished attempt counts with the mean its "done" carries over the whole attempt.
    finished = [*second, ProgressEvent("done", 9.0, 95, step_s=0.3)]
    assert mean_step_time(first + finished) == pytest.approx((7.0 + 60 * 0.3) / 100)
