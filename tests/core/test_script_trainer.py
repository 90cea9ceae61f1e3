"""What a script fixes in its own Trainer(...): read from the profile, kept by every plan."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.planner import PlanRequest
from lightning_srifty.core.script_trainer import ScriptStop, ScriptTrainer, device_count
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


def _stop_of(**limits: object) -> ScriptStop | None:
    profile = make_profile()
    return ScriptStop.of(dataclasses.replace(profile, extra={"trainer": dict(limits)}))


def test_lightnings_no_limit_spellings_stop_nothing() -> None:
    """Lightning writes max_steps=-1 and max_epochs=None (or -1) for "no limit"."""
    stop = _stop_of(max_steps=-1, max_epochs=None, max_time_s=None, batches_per_epoch=100)
    assert stop is not None and stop.steps_on(1) == (None, "") and stop.time_setting == ""
    assert _stop_of(max_steps=True, max_time_s=float("inf")) == ScriptStop(profiled_world=1)
    assert ScriptStop.of(make_profile()) is None  # an old profile recorded no limits


def test_max_epochs_count_fewer_steps_on_more_processes_and_max_steps_counts_updates() -> None:
    """An epoch of 100 batches on 2 processes is 50 batches on 4; under
    accumulate_grad_batches=4 an epoch of 13 batches makes ceil(13/4) = 4 updates, the
    last one short (Lightning steps at an epoch's last batch)."""
    stop = _stop_of(max_epochs=3, batches_per_epoch=100, world_size=2)
    assert stop is not None and stop.steps_on(4) == (150, "max_epochs=3")
    profile = make_profile()
    env = dataclasses.replace(profile.environment, accumulate_grad_batches=4)
    limits = {"max_steps": 8, "automatic_optimization": True, "batches_per_epoch": 13}
    accumulated = dataclasses.replace(profile, environment=env, extra={"trainer": limits})
    stop = ScriptStop.of(accumulated)
    # Each epoch of 13 batches makes 4 updates (batches 4, 8, 12 and the last): 8 updates
    # are two whole epochs, 26 batches.
    assert stop is not None and stop.steps_on(1) == (26, "max_steps=8")


def test_the_constrained_request_carries_the_scripts_stop() -> None:
    profile = make_profile()
    timed = dataclasses.replace(profile, extra={"trainer": {"max_time_s": 25.0}})
    request = ScriptTrainer.of(timed).constrain(PlanRequest(target_steps=10))
    assert (
        request.script_stop is not None and request.script_stop.time_setting == "max_time=0:00:25"
    )


def test_a_run_resumed_part_way_has_the_limits_left_after_what_it_trained() -> None:
    """max_steps=100 (no accumulation) and max_time=60 s: at step 30 after 20 s of
    training, 70 steps and 40 s are left; past the limit nothing is."""
    stop = _stop_of(max_steps=100, max_time_s=60.0, automatic_optimization=False)
    assert stop is not None and stop.steps_left_on(1) == (100, "max_steps=100")
    later = stop.after(30, 20.0)
    assert later.steps_left_on(1) == (70, "max_steps=100") and later.time_left_s == 40.0
    assert (
        stop.after(130, 90.0).steps_left_on(1)[0] == 0 and stop.after(130, 90.0).time_left_s == 0.0
    )
    assert stop.steps_on(1) == later.steps_on(1)  # the script's own limit does not move
