"""Preemption injection for the local backend (demo and tests).

``--preempt-every S`` revokes each attempt once it has trained ``S`` seconds, counted
from its first step report: where an attempt takes longer than ``S`` to start (one
loaded core here: about 16 s), counting from the launch revoked every attempt at its
first step report, and a test's run became dozens of short attempts.
``--preempt-trace FILE --time-scale X`` replays a real spot trace: wall
time ``t`` maps to trace time ``t * X``, and the running attempt is revoked when the
trace's zone goes from available to unavailable while it runs (a revocation is that
transition; an attempt started during an outage has, by then, moved elsewhere). An
attempt is never revoked before it reports a training step, so every attempt makes
progress and the run always ends. Only spot plans are revoked (the controller never
asks on an on-demand plan); the trace's availability also tells the live policy when
spot is back (:meth:`TraceReplay.spot_available`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.spot import SpotTimeline


@dataclass(frozen=True)
class EveryInterval:
    """Revokes each attempt once it has trained ``seconds`` (from its first step report)."""

    seconds: float
    max_preemptions: int = 1_000_000

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ConfigError(f"--preempt-every must be a positive duration, got {self.seconds}")

    def should_preempt(
        self, attempt_elapsed_s: float, total_elapsed_s: float, training_s: float
    ) -> bool:
        return training_s >= self.seconds

    def mean_time_between_s(self) -> float | None:
        return self.seconds


@dataclass(frozen=True)
class TraceReplay:
    """Revokes the attempt when the trace zone is unavailable at the scaled time."""

    available: np.ndarray
    """Boolean per tick for the zone being replayed."""
    gap_s: float
    time_scale: float
    zone: str

    @staticmethod
    def from_timeline(timeline: SpotTimeline, time_scale: float, zone: int = 0) -> TraceReplay:
        if not time_scale > 0:
            raise ConfigError(f"--time-scale must be positive, got {time_scale}")
        return TraceReplay(
            available=timeline.available()[zone],
            gap_s=timeline.gap_hours * 3600.0,
            time_scale=time_scale,
            zone=timeline.zones[zone],
        )

    def tick_at(self, total_elapsed_s: float) -> int:
        """The trace tick (not wrapped) at ``total_elapsed_s`` wall seconds."""
        return int(total_elapsed_s * self.time_scale / self.gap_s)

    def should_preempt(
        self, attempt_elapsed_s: float, total_elapsed_s: float, training_s: float = 0.0
    ) -> bool:
        """True when the zone went from up to down since this attempt started (the
        market does not wait for training to start: ``training_s`` is not used)."""
        first = self.tick_at(max(total_elapsed_s - attempt_elapsed_s, 0.0))
        last = self.tick_at(total_elapsed_s)
        ticks = np.arange(first, last + 1)[-(len(self.available) + 1) :] % len(self.available)
        up = self.available.astype(bool)[ticks]
        return bool(np.any(up[:-1] & ~up[1:]))

    def spot_available(self, total_elapsed_s: float) -> bool:
        """Whether the replayed zone has spot capacity now (what the live policy sees)."""
        tick = self.tick_at(total_elapsed_s) % len(self.available)
        return bool(self.available[tick])

    def mean_time_between_s(self) -> float | None:
        """Mean length of the trace's available runs, in wall seconds (None: no outage)."""
        up = self.available.astype(bool)
        starts_of_outages = int(np.count_nonzero(up[:-1] & ~up[1:]))
        if starts_of_outages == 0:
            return None
        return float(np.count_nonzero(up)) * self.gap_s / self.time_scale / starts_of_outages

    def first_outage_s(self) -> float | None:
        """Wall seconds until the trace first shows the zone unavailable (None: never)."""
        down = np.flatnonzero(~self.available.astype(bool))
        if down.size == 0:
            return None
        return float(down[0]) * self.gap_s / self.time_scale
