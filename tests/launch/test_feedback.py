"""Measured step times written back as calibration input when a run drifts."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_srifty.core.errors import CalibrationError
from lightning_srifty.fit.calibration import profile_fit_groups
from lightning_srifty.io.profile_io import load_profile
from lightning_srifty.launch.feedback import RanOn, write_feedback
from tests.core.test_profile import coarse_profile


def test_a_cloud_measurement_becomes_a_calibration_row(tmp_path: Path) -> None:
    ran_on = RanOn("g4dn.12xlarge", "us-west-2", nodes=2, devices_per_node=4)
    path = write_feedback(tmp_path, coarse_profile(), ran_on, 0.35, attempt=1)
    profile = load_profile(path)
    env = profile.environment
    assert (env.instance_type, env.region, env.num_nodes, env.world_size) == (
        "g4dn.12xlarge", "us-west-2", 2, 8,
    )  # fmt: skip
    assert profile.steps.step.mean_s == 0.35
    assert profile.extra["srifty_feedback"]["measured_step_s"] == 0.35
    groups, described = profile_fit_groups([str(path)])
    assert groups[0].measured_s.tolist() == [0.35]
    assert "g4dn.12xlarge" in described[0]


def test_a_local_measurement_is_kept_but_not_calibrated_against_the_catalog(
    tmp_path: Path,
) -> None:
    path = write_feedback(tmp_path, coarse_profile(), RanOn(None, None, 1, 2), 0.01, attempt=2)
    assert load_profile(path).environment.instance_type is None
    with pytest.raises(CalibrationError, match="instance_type"):
        profile_fit_groups([str(path)])
