"""Pure bookkeeping for a running job: progress, cost so far, ETA and drift.

The launcher feeds it progress events and wall-clock time; it never reads files or
clocks itself, so the arithmetic is tested in milliseconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_srifty.core.launch_protocol import ProgressEvent

DRIFT_MIN_SAMPLES = 3
"""Step reports needed before a drift verdict; the first ones include warm-up."""


@dataclass(frozen=True)
class Expectation:
    """What the plan promised for the running cluster."""

    step_s: float
    low_s: float
    high_s: float
    hourly_usd: float
    target_steps: int
    validation_s: float = 0.0
    """Validation seconds per step on the running cluster, beside ``step_s`` (which, like
    the measured steps, leaves the passes out)."""


@dataclass(frozen=True)
class Snapshot:
    """The state shown on the progress display."""

    steps_done: int
    measured_step_s: float | None
    """Median of recent step reports (robust to one slow step)."""
    cost_so_far_usd: float
    elapsed_s: float
    eta_s: float | None
    drift: str
    """``""`` while within the interval, else ``"slower"`` or ``"faster"``."""


TIMED_EVENTS = ("step", "done")
"""Events whose ``step_s`` is a measurement (``done`` carries the attempt's mean)."""


def measured_step_time(events: Sequence[ProgressEvent], window: int = 5) -> float | None:
    """Median step time over the last ``window`` timed reports (None until the first)."""
    samples = [e.step_s for e in events if e.event in TIMED_EVENTS and e.step_s > 0]
    if not samples:
        return None
    return float(statistics.median(samples[-window:]))


def mean_step_time(events: Sequence[ProgressEvent]) -> float | None:
    """Mean seconds per step over every step the events report (None before any).

    Events of several attempts may be passed together: each attempt starts with its
    ``start``/``resumed`` event. An attempt that ended with ``done`` counts with the
    mean ``done`` carries (its whole attempt); one that did not (preempted, still
    running) with its ``step`` reports, each the mean since the report before it.
    """
    total_s, steps = 0.0, 0
    for attempt in _attempts(events):
        begin = attempt[0].step
        done = next((e for e in attempt if e.event == "done" and e.step_s > 0), None)
        if done is not None and done.step > begin:
            total_s += done.step_s * (done.step - begin)
            steps += done.step - begin
            continue
        last = begin
        for event in attempt:
            if event.event == "step":
                if event.step > last and event.step_s > 0:
                    total_s += event.step_s * (event.step - last)
                    steps += event.step - last
                last = event.step
    return total_s / steps if steps else None


WARMUP_REPORTS = 2
"""Step reports of an attempt left out of its steady step time: the first ones carry
restoring the checkpoint, process-group set-up, data-loader workers starting and the
first, slow iterations."""
STEADY_MIN_REPORTS = 3


def steady_step_time(
    events: Sequence[ProgressEvent],
    *,
    warmup_reports: int = WARMUP_REPORTS,
    min_reports: int = STEADY_MIN_REPORTS,
) -> float | None:
    """The current attempt's step time after warm-up: the median of its step reports,
    its first ``warmup_reports`` left out (``None`` until ``min_reports`` remain).

    Unlike :func:`mean_step_time`, start-up time cannot leak in: a job whose true step is
    0.3 s reads 0.3 s however long it took to start.
    """
    attempts = _attempts(events)
    if not attempts:
        return None
    reports = [e.step_s for e in attempts[-1] if e.event == "step" and e.step_s > 0]
    steady = reports[warmup_reports:]
    if len(steady) < max(min_reports, 1):
        return None
    return float(statistics.median(steady))


def steady_spread(
    events: Sequence[ProgressEvent], *, warmup_reports: int = WARMUP_REPORTS
) -> tuple[float, float] | None:
    """10th and 90th percentiles of the current attempt's step reports after warm-up
    (how much the steady step moved while measured; ``None`` before any)."""
    attempts = _attempts(events)
    if not attempts:
        return None
    reports = [e.step_s for e in attempts[-1] if e.event == "step" and e.step_s > 0]
    steady = sorted(reports[warmup_reports:])
    if not steady:
        return None
    return steady[int(0.1 * (len(steady) - 1))], steady[int(round(0.9 * (len(steady) - 1)))]


def _attempts(events: Sequence[ProgressEvent]) -> list[list[ProgressEvent]]:
    """Events split where an attempt starts (events before any start are dropped)."""
    out: list[list[ProgressEvent]] = []
    for event in events:
        if event.event in ("start", "resumed"):
            out.append([event])
        elif out:
            out[-1].append(event)
    return out


def drift_of(events: Sequence[ProgressEvent], expect: Expectation) -> str:
    """``"slower"``/``"faster"`` when the measured time leaves the prediction interval."""
    reports = [e for e in events if e.event == "step" and e.step_s > 0]
    if len(reports) < DRIFT_MIN_SAMPLES:
        return ""
    measured = measured_step_time(reports)
    if measured is None:
        return ""
    if measured > expect.high_s:
        return "slower"
    if measured < expect.low_s:
        return "faster"
    return ""


def snapshot(
    events: Sequence[ProgressEvent], expect: Expectation, *, elapsed_s: float, start_step: int
) -> Snapshot:
    """Progress, cost and ETA after ``elapsed_s`` seconds on the current cluster."""
    steps_done = max((e.step for e in events), default=start_step)
    measured = measured_step_time(events)
    remaining = max(expect.target_steps - steps_done, 0)
    per_step = measured if measured is not None else expect.step_s
    per_step += expect.validation_s
    eta = remaining * per_step if per_step > 0 else None
    return Snapshot(
        steps_done=steps_done,
        measured_step_s=measured,
        cost_so_far_usd=expect.hourly_usd * elapsed_s / 3600.0,
        elapsed_s=elapsed_s,
        eta_s=eta,
        drift=drift_of(events, expect),
    )
