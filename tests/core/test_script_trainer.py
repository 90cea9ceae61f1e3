"""What a script fixes in its own Trainer(...): read from the profile, kept by every plan."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.planner import PlanRequest
from lightning_srifty.core.script_trainer import ScriptTrainer, device_count
from tests.core.test_planner import make_profile


@pytest.mark.parametrize(
    ("value", "count"),
    [(2, 2), ("2", 2), ([0, 1], 2), ("0,1,2", 3), ("auto", None), (-1, None), ("-1", None),
     (0, None), (True, None), (None, None), ("gpu", None)],
)  # fmt: skip
def test_device_counts_follow_lightnings_spellings(value: object, count: int | None) -> None:
    assert device_count(value) == count


def _fixed(explicit: dict[str, object], entry: str = "script") -> ScriptTrainer:
    profile = make_profile()
    extra = {**profile.extra, "script": {"entry_point": entry, "explicit": explicit}}
    return ScriptTrainer.of(dataclasses.replace(profile, extra=extra))


def test_a_profile_without_the_record_constrains_nothing() -> None:
    fixed = ScriptTrainer.of(make_profile())
    request = PlanRequest(target_steps=10)
    assert not fixed.recorded and fixed.constrain(request) is request and not fixed.notes()


def test_devices_and_num_nodes_become_the_requests_limits() -> None:
    fixed = _fixed({"devices": 2, "num_nodes": 3, "strategy": "ddp"})
    request = fixed.constrain(PlanRequest(target_steps=10))
    assert (request.gpus_per_node, request.num_nodes) == (2, 3)
    assert "the script fixes Trainer(devices=2, num_nodes=3, strategy='ddp')" in fixed.notes()[0]
    with pytest.raises(ConfigError, match="--max-nodes is 2"):
        fixed.constrain(PlanRequest(target_steps=10, max_nodes=2))
    with pytest.raises(ConfigError, match="--max-gpus is 1"):
        fixed.constrain(PlanRequest(target_steps=10, max_gpus=1))


def test_a_strategy_the_model_cannot_price_is_said() -> None:
    notes = _fixed({"strategy": "fsdp"}).notes()
    assert any("not DDP" in n for n in notes)
    assert not any("not DDP" in n for n in _fixed({"strategy": "DDPStrategy"}).notes())


def test_cpu_and_lightning_cli_are_recognised() -> None:
    assert _fixed({"accelerator": "cpu"}).trains_on_cpu
    assert not _fixed({"accelerator": "gpu"}).trains_on_cpu
    assert _fixed({}, entry="lightning_cli").lightning_cli
