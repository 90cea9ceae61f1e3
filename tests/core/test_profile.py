"""Profile schema: round trip and errors that name the field."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lightning_srifty.core.errors import ProfileError
from lightning_srifty.core.profile import (
    PROFILE_SCHEMA_VERSION,
    BatchPoint,
    DataLoading,
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


def test_the_loaders_measured_cost_round_trips_and_a_bad_one_names_its_field() -> None:
    p = dataclasses.replace(coarse_profile(), data_loading=DataLoading(4, 0.012, 50))
    assert Profile.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert Profile.from_dict(coarse_profile().to_dict()).data_loading is None  # older files
    d = p.to_dict()
    d["data_loading"]["workers"] = 0
    with pytest.raises(ProfileError, match=r"data_loading\.workers"):
        Profile.from_dict(d, source="p.json")


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


def test_a_compiled_models_profile_has_no_layers_and_loads() -> None:
    """A ``torch.compile``'d model is timed whole (``capture/compiled.py``)."""
    d = coarse_profile().to_dict()
    d["kind"] = "detailed"
    d["extra"] = {"compiled": {"what": "Net is compiled (torch.compile)", "steps_left_out": 1}}
    profile = Profile.from_dict(d)
    assert profile.layers == ()
    assert profile.extra["compiled"]["steps_left_out"] == 1


def test_step_points_fall_back_to_profiled_step() -> None:
    d = coarse_profile().to_dict()
    d["batch_points"] = []
    p = Profile.from_dict(d)
    (point,) = p.step_points()
    assert point.local_batch_size == 32
    assert point.step_s == pytest.approx(0.2)


def test_an_old_profile_without_the_math_mode_loads_with_its_releases_defaults() -> None:
    """Profiles written before the float32 math mode was recorded still load; the mode
    is then PyTorch's default for the release that took them (TF32 matmuls off from
    1.12, cuDNN TF32 always on by default)."""
    d = coarse_profile().to_dict()
    for key in ("float32_matmul_precision", "cudnn_allow_tf32"):
        del d["environment"][key]
    env = Profile.from_dict(d).environment
    assert (env.float32_matmul_precision, env.cudnn_allow_tf32) == (None, None)
    assert env.matmul_tf32 is False and env.cudnn_tf32 is True
    d["environment"]["torch_version"] = "1.11.0+cu113"
    assert Profile.from_dict(d).environment.matmul_tf32 is True
    d["environment"]["torch_version"] = ""  # a coarse profile assembled from totals
    assert Profile.from_dict(d).environment.matmul_tf32 is True


@pytest.mark.parametrize(
    ("matmul", "cudnn", "expected"),
    [
        ("highest", True, (False, True)),
        ("high", False, (True, False)),
        ("medium", True, (True, True)),
    ],
)
def test_the_recorded_math_mode_round_trips_and_decides_tf32(
    matmul: str, cudnn: bool, expected: tuple[bool, bool]
) -> None:
    p = coarse_profile()
    p = dataclasses.replace(
        p,
        environment=dataclasses.replace(
            p.environment, float32_matmul_precision=matmul, cudnn_allow_tf32=cudnn
        ),
    )
    again = Profile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again == p
    assert (again.environment.matmul_tf32, again.environment.cudnn_tf32) == expected


@pytest.mark.parametrize(
    ("field", "value"), [("float32_matmul_precision", "fast"), ("cudnn_allow_tf32", "yes")]
)
def test_a_bad_math_mode_names_the_field(field: str, value: str) -> None:
    d = coarse_profile().to_dict()
    d["environment"][field] = value
    with pytest.raises(ProfileError, match=field):
        Profile.from_dict(d, source="p.json")


def test_work_done_only_as_one_process_round_trips_and_a_bad_one_names_its_field() -> None:
    d = coarse_profile().to_dict()
    d["extra"] = {"single_process": {"ops": 2189, "bytes": 8.3e9}}
    assert Profile.from_dict(d).single_process_work == (2189, 8.3e9)
    assert coarse_profile().single_process_work == (0, 0.0)  # none recorded
    d["extra"]["single_process"]["ops"] = -1
    with pytest.raises(ProfileError, match=r"extra\.single_process\.ops"):
        Profile.from_dict(d, source="p.json")
    d["extra"]["single_process"] = {"ops": 1}
    with pytest.raises(ProfileError, match=r"extra\.single_process\.bytes"):
        Profile.from_dict(d, source="p.json")
