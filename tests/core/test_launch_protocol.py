"""What the launcher tells the nodes: the Trainer's shape and the profiled stack."""

from __future__ import annotations

import pytest

from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.errors import ConfigError


def test_gpu_plans_name_the_accelerator_and_cpu_ones_leave_it_to_lightning() -> None:
    gpu = proto.trainer_env(nodes=2, devices_per_node=4, root_dir=None, accelerator="gpu")
    assert gpu["PL_TRAINER_ACCELERATOR"] == "gpu"
    cpu = proto.trainer_env(nodes=1, devices_per_node=1, root_dir=None)
    assert "PL_TRAINER_ACCELERATOR" not in cpu
    assert "--trainer.accelerator=gpu" in proto.lightning_cli_args(gpu)


@pytest.mark.parametrize(
    ("torch_version", "lightning_version", "expected"),
    [
        ("2.13.0+cpu", "2.6.6", ("2.13.0", "2.6.6")),
        ("2.13.0+cu126", "2.6.0rc1", ("2.13.0", "2.6.0rc1")),
        ("2.13.0", "2.6.6.post1", ("2.13.0", "2.6.6.post1")),
    ],
)
def test_nodes_get_the_release_the_profile_ran(
    torch_version: str, lightning_version: str, expected: tuple[str, str]
) -> None:
    env = proto.stack_env(torch_version, lightning_version)
    assert (env[proto.ENV_TORCH_VERSION], env[proto.ENV_LIGHTNING_VERSION]) == expected


@pytest.mark.parametrize("torch_version", ["2.13.0a0+git1234abc", "", "nightly"])
def test_a_build_no_index_has_is_refused_in_one_line(torch_version: str) -> None:
    with pytest.raises(ConfigError, match="torch_version .* is not a release"):
        proto.stack_env(torch_version, "2.6.6")


def test_a_probes_collective_timings_travel_in_its_progress_line() -> None:
    from lightning_srifty.core.errors import SchemaError
    from lightning_srifty.core.launch_protocol import ProgressEvent

    event = ProgressEvent("collective", 1.0, 3, allreduce=((65536, 1e-4), (1 << 20, 2e-3)))
    assert ProgressEvent.from_line(event.to_line()) == event
    plain = ProgressEvent("step", 1.0, 3, 0.2)
    assert "allreduce" not in plain.to_line()  # lines of other events are as before
    with pytest.raises(SchemaError, match=r"p\.jsonl.*allreduce.*\[bytes, seconds\]"):
        ProgressEvent.from_line(
            '{"event":"collective","time":1,"step":3,"allreduce":[[65536,-1]]}', source="p.jsonl"
        )


def test_the_scripts_reason_for_ending_travels_in_its_done_line() -> None:
    """A ``done`` before the target says which of the script's rules ended training; a
    line without one (the target reached, or an older job) reads as no reason."""
    from lightning_srifty.core.launch_protocol import ProgressEvent

    why = "its Trainer(max_time=0:00:04) was reached after 0:00:04 of training"
    event = ProgressEvent("done", 1.0, 134, 0.02, reason=why)
    assert ProgressEvent.from_line(event.to_line()).reason == why
    reached = ProgressEvent("done", 1.0, 1000, 0.02)
    assert "reason" not in reached.to_line()
    assert ProgressEvent.from_line('{"event":"done","time":1,"step":3}').reason == ""
