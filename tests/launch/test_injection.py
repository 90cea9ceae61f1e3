"""Preemption injection for the local backend: fixed intervals and real trace replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.spot import SpotTimeline
from lightning_srifty.io.spot_traces import load_trace
from lightning_srifty.launch.injection import EveryInterval, TraceReplay


def _replay(up: list[int], gap_s: float = 60.0, scale: float = 60.0) -> TraceReplay:
    timeline = SpotTimeline(("z",), gap_s / 3600.0, np.asarray([up]))
    return TraceReplay.from_timeline(timeline, scale)


def test_every_interval() -> None:
    every = EveryInterval(5.0)
    assert not every.should_preempt(4.9, 100.0, training_s=4.9)
    assert every.should_preempt(5.0, 100.0, training_s=5.0)
    # a slow start does not count: five seconds of training do
    assert not every.should_preempt(60.0, 100.0, training_s=1.0)
    assert every.mean_time_between_s() == 5.0
    with pytest.raises(ConfigError, match="--preempt-every"):
        EveryInterval(0.0)


def test_replay_revokes_on_an_up_to_down_transition_only() -> None:
    # one tick per wall second (60 s ticks at 60x): up, up, down, down, up, up
    replay = _replay([1, 1, 0, 0, 1, 1])
    assert not replay.should_preempt(1.5, 1.5)  # still up
    assert replay.should_preempt(2.5, 2.5)  # went down at tick 2 while running
    # An attempt that started during the outage (it moved elsewhere) is not revoked by it.
    assert not replay.should_preempt(1.0, 3.5)
    assert not replay.should_preempt(2.0, 5.5)
    assert replay.should_preempt(3.0, 8.5)  # wraps around: down again at tick 8 = 2
    assert replay.mean_time_between_s() == pytest.approx(4.0)  # 4 up ticks, 1 outage


def test_a_zone_that_never_fails_is_never_revoked() -> None:
    replay = _replay([1, 1, 1])
    assert not replay.should_preempt(100.0, 100.0)
    assert replay.mean_time_between_s() is None
    with pytest.raises(ConfigError, match="--time-scale"):
        TraceReplay.from_timeline(SpotTimeline(("z",), 1.0, np.ones((1, 3))), 0.0)


def test_replaying_a_real_trace(shared_data: Path) -> None:
    path = shared_data / "spot-traces/preemption-1node-p3.2xlarge-2023-04/us-west-2c_v100_1.json"
    timeline = load_trace(path)
    replay = TraceReplay.from_timeline(timeline, time_scale=3600.0)
    up = timeline.available()[0]
    revocations = int(np.count_nonzero(up[:-1] & ~up[1:]))
    assert revocations > 0
    mtbf_h = replay.mean_time_between_s()  # at 3600x, one wall second is one trace hour
    assert mtbf_h == pytest.approx(np.count_nonzero(up) * timeline.gap_hours / revocations)
    first = replay.first_outage_s()
    assert first is not None
    assert replay.should_preempt(first + 1.0, first + 1.0)
