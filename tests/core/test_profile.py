"""Profile schema: round trip and errors that name the field."""

from __future__ import annotations

import json

import pytest

from lightning_srifty.core.errors import ProfileError
from lightning_srifty.core.profile import (
    PROFILE_SCHEMA_VERSION,
    BatchPoint,
    Environment,
    Memory,
    Profile,
    Spread,
    StepTimes,
)


def coarse_profile() -> Profile:
    return Profile(
        kind="coarse",
        environment=Environment(
            device_name="NVIDIA T4",
            accelerator="T4",
            devices_per_node=1,
            world_size=1,
            num_nodes=1,
            precision="32-true",
            local_batch_size=32,
            torch_version="2.13.0",
            lightning_version="2.6.6",
        ),
        steps=StepTimes(Spread(0.2, 0.2, 0.21, 10), 0.05, 0.1, 0.02, 0.01, 2, 10),
        grad_bytes=4_000_000,
        flops_per_step=1e12,
        memory=Memory(4_000_000, 4_000_000, 8_000_000, 100_000_000, 0, "unknown"),
        batch_points=(BatchPoint(16, 0.12), BatchPoint(32, 0.2)),
    )


def test_round_trip_through_json() -> None:
    p = coarse_profile()
    again = Profile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again == p


def test_future_version_is_rejected_with_upgrade_hint() -> None:
    d = coarse_profile().to_dict()
    d["schema_version"] = PROFILE_SCHEMA_VERSION + 1
    with pytest.raises(ProfileError, match="upgrade"):
        Profile.from_dict(d, source="p.json")


def test_bad_field_names_file_and_field() -> None:
    d = coarse_profile().to_dict()
    d["environment"]["world_size"] = "two"
    with pytest.raises(ProfileError) as info:
        Profile.from_dict(d, source="p.json")
    assert "p.json" in str(info.value)
    assert "environment.world_size" in str(info.value)
    assert "'two'" in str(info.value)


def test_nested_list_field_is_named_with_index() -> None:
    d = coarse_profile().to_dict()
    d["batch_points"][1]["step_s"] = -1.0
    with pytest.raises(ProfileError, match=r"batch_points\[1\]\.step_s"):
        Profile.from_dict(d, source="p.json")


def test_detailed_profile_without_layers_is_rejected() -> None:
    d = coarse_profile().to_dict()
    d["kind"] = "detailed"
    with pytest.raises(ProfileError, match="layers"):
        Profile.from_dict(d)


def test_step_points_fall_back_to_profiled_step() -> None:
    d = coarse_profile().to_dict()
    d["batch_points"] = []
    p = Profile.from_dict(d)
    (point,) = p.step_points()
    assert point.local_batch_size == 32
    assert point.step_s == pytest.approx(0.2)
