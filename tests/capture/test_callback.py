"""SriftyCallback on a real Lightning Trainer (CPU, single process)."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lightning_srifty import SriftyCallback
from lightning_srifty.core.errors import ConfigError, ProfileError
from lightning_srifty.core.profile import Profile
from lightning_srifty.io.profile_io import load_profile, save_profile

BATCH = 32
HIDDEN = 128
STEPS_PER_EPOCH = 1797 // BATCH  # digits has 1797 images; drop_last=True


def _trainer(root: Path, callback: SriftyCallback, max_steps: int, **kw: Any) -> pl.Trainer:
    return pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        deterministic=True,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        callbacks=[callback],
        **kw,
    )


def _hook_snapshot(model: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], ...]]:
    snap = {}
    for name, module in model.named_modules():
        snap[f"module:{name}"] = tuple(
            tuple(getattr(module, attr).keys())
            for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                         "_backward_pre_hooks")
        )  # fmt: skip
    for name, param in model.named_parameters():
        hooks = param._backward_hooks
        snap[f"param:{name}"] = ((-1,) if hooks is None else tuple(hooks.keys()),)
    return snap


@pytest.fixture(scope="module")
def profiled_run(digits: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pl.seed_everything(0)
    root = tmp_path_factory.mktemp("run")
    model = digits.DigitsModule(hidden=HIDDEN)
    before = _hook_snapshot(model)
    callback = SriftyCallback(warmup_steps=3, profile_steps=12, verbose=False)
    _trainer(root, callback, max_steps=20).fit(
        model, datamodule=digits.DigitsDataModule(batch_size=BATCH)
    )
    return {"root": root, "model": model, "callback": callback, "before": before}


def test_profile_written_to_default_path(profiled_run: dict[str, Any]) -> None:
    path = profiled_run["root"] / "srifty" / "profile.json"
    assert profiled_run["callback"].written_path == path
    profile = load_profile(path)
    assert profile == profiled_run["callback"].profile
    env = profile.environment
    assert (env.accelerator, env.world_size, env.num_nodes, env.local_batch_size) == (
        "cpu", 1, 1, BATCH,
    )  # fmt: skip
    assert env.precision == "32-true" and env.torch_version == torch.__version__
    assert profile.steps.warmup_steps == 3 and profile.steps.measured_steps == 12
    assert profile.communication is None and profile.buckets == ()
    assert [r.rank for r in profile.ranks] == [0]
    digits_samples = 1797  # scikit-learn's digits; the loader drops the last partial batch
    assert profile.extra["dataset_size"] == (digits_samples // BATCH) * BATCH


def test_layers_in_execution_order_with_blocks(profiled_run: dict[str, Any]) -> None:
    profile = profiled_run["callback"].profile
    assert [x.name for x in profile.layers] == ["body.0", "body.1", "body.2", "body.3", "head",
                                                "loss"]  # fmt: skip
    assert [b.name for b in profile.blocks] == ["body", "head", "loss"]
    linear = [x for x in profile.layers if x.module_type == "Linear"]
    assert all(x.forward_s > 0 and x.backward_s > 0 for x in linear)


def test_layer_times_are_a_sane_fraction_of_the_step(profiled_run: dict[str, Any]) -> None:
    profile: Profile = profiled_run["callback"].profile
    layer_sum = sum(x.forward_s + x.backward_s for x in profile.layers)
    phases = profile.steps.forward_s + profile.steps.backward_s
    assert 0.2 < layer_sum / phases < 1.05
    step = profile.steps
    assert step.forward_s + step.backward_s + step.optimizer_s < step.step.mean_s * 1.01
    assert step.step.p50_s <= step.step.p90_s


def test_a_full_collection_the_process_has_due_runs_before_the_window(
    digits: ModuleType, tmp_path: Path
) -> None:
    """The process reaches the window with an oldest-generation collection due.

    The model keeps 300 000 new objects from the last warm-up step with collection off,
    as a long-running process accumulates them, and turns collection back on in the
    window's first step; low thresholds then make Python run the full collection within
    a few hundred allocations (CPython's ``gc_collect_generations``: generation 2 once
    its count passes the threshold and pending objects exceed a quarter of the old).
    """
    warmup = 3
    full_collections: list[bool] = []  # whether each one ran inside the window
    callback = SriftyCallback(warmup_steps=warmup, profile_steps=4, verbose=False)

    class Hoarding(digits.DigitsModule):  # type: ignore[misc, name-defined]
        hoard: list[list[int]] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.global_step == warmup - 1:
                gc.disable()
                self.hoard = [[] for _ in range(300_000)]
            if self.global_step == warmup:
                gc.enable()
            return super().training_step(batch, batch_idx)

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full_collections.append(callback._measuring)

    thresholds = gc.get_threshold()
    gc.set_threshold(50, 1, 1)
    gc.callbacks.append(on_gc)
    try:
        _trainer(tmp_path, callback, max_steps=warmup + 4).fit(
            Hoarding(hidden=HIDDEN), datamodule=digits.DigitsDataModule(batch_size=BATCH)
        )
    finally:
        gc.callbacks.remove(on_gc)
        gc.set_threshold(*thresholds)
        gc.enable()
    assert callback.profile is not None
    assert full_collections and not any(full_collections)


def test_gradient_bytes_equal_parameter_sizes(profiled_run: dict[str, Any]) -> None:
    profile: Profile = profiled_run["callback"].profile
    expected = 4 * ((64 + 1) * HIDDEN + (HIDDEN + 1) * HIDDEN + (HIDDEN + 1) * 10)
    assert profile.grad_bytes == expected
    assert sum(g.bytes for g in profile.gradients) == expected
    assert {g.dtype for g in profile.gradients} == {"float32"}
    assert profile.memory.param_bytes == expected
    # SGD with momentum keeps one buffer per parameter
    assert profile.memory.optimizer_state_bytes == expected
    assert profile.memory.peak_kind == "cpu_rss" and profile.memory.peak_bytes > expected


def test_flops_and_activations_follow_the_layer_shapes(profiled_run: dict[str, Any]) -> None:
    profile: Profile = profiled_run["callback"].profile
    fwd = {"body.0": 2 * BATCH * 64 * HIDDEN, "body.2": 2 * BATCH * HIDDEN * HIDDEN,
           "head": 2 * BATCH * HIDDEN * 10}  # fmt: skip
    # backward costs two forwards, except the first layer: its input needs no gradient
    expected = {"body.0": 2 * fwd["body.0"], "body.2": 3 * fwd["body.2"], "head": 3 * fwd["head"]}
    flops = {x.name: x.flops for x in profile.layers if x.name in expected}
    assert flops == pytest.approx(expected)
    assert profile.flops_per_step == pytest.approx(sum(expected.values()))
    activations = {x.name: x.activation_bytes for x in profile.layers}
    assert activations["body.0"] == BATCH * HIDDEN * 4 and activations["head"] == BATCH * 10 * 4


def test_no_hook_remains_after_the_window(profiled_run: dict[str, Any]) -> None:
    assert _hook_snapshot(profiled_run["model"]) == profiled_run["before"]


def test_profile_json_round_trip(profiled_run: dict[str, Any], tmp_path: Path) -> None:
    profile: Profile = profiled_run["callback"].profile
    assert load_profile(save_profile(profile, tmp_path / "p.json")) == profile


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["steps"].update(forward_s="fast"), "steps.forward_s"),
        (lambda d: d.update(schema_version=99), "schema_version"),
        (lambda d: d["environment"].pop("world_size"), "environment.world_size"),
    ],
)
def test_bad_profile_files_name_the_field(
    profiled_run: dict[str, Any], tmp_path: Path, mutate: Any, field: str
) -> None:
    data = json.loads((profiled_run["root"] / "srifty" / "profile.json").read_text())
    mutate(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ProfileError) as err:
        load_profile(bad)
    assert str(bad) in str(err.value) and field.split(".")[-1] in str(err.value)


def test_truncated_profile_file(profiled_run: dict[str, Any], tmp_path: Path) -> None:
    text = (profiled_run["root"] / "srifty" / "profile.json").read_text()
    bad = tmp_path / "cut.json"
    bad.write_text(text[: len(text) // 2])
    with pytest.raises(ProfileError, match="cut.json"):
        load_profile(bad)


def test_launcher_env_and_epoch_window(digits: ModuleType, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "p.json"
    callback = SriftyCallback(
        warmup_steps=2,
        profile_epochs=1,
        profile_path=tmp_path / "ignored.json",
        env={
            "SRIFTY_PROFILE_PATH": str(target),
            "SRIFTY_STATE_DIR": str(tmp_path / "state"),
            "SRIFTY_IMDS": "off",
        },
        verbose=False,
    )
    _trainer(tmp_path, callback, max_steps=STEPS_PER_EPOCH + 3).fit(
        digits.DigitsModule(hidden=32), datamodule=digits.DigitsDataModule(batch_size=BATCH)
    )
    assert not (tmp_path / "ignored.json").exists()
    assert (tmp_path / "state" / "callback-attached").is_file()
    assert load_profile(target).steps.measured_steps == STEPS_PER_EPOCH - 2


def test_resumed_run_does_not_profile_twice(digits: ModuleType, tmp_path: Path) -> None:
    first = SriftyCallback(warmup_steps=1, profile_steps=3, verbose=False)
    trainer = _trainer(tmp_path / "a", first, max_steps=6)
    model = digits.DigitsModule(hidden=32)
    trainer.fit(model, datamodule=digits.DigitsDataModule(batch_size=BATCH))
    ckpt = tmp_path / "a.ckpt"
    trainer.save_checkpoint(ckpt)
    assert first.state_dict()["profiled"] is True

    second = SriftyCallback(warmup_steps=1, profile_steps=3, verbose=False)
    _trainer(tmp_path / "b", second, max_steps=12).fit(
        digits.DigitsModule(hidden=32),
        datamodule=digits.DigitsDataModule(batch_size=BATCH),
        ckpt_path=ckpt,
    )
    assert second.profiled is True
    assert second.written_path is None
    assert not (tmp_path / "b" / "srifty" / "profile.json").exists()


def test_training_ending_inside_the_window_keeps_what_was_measured(
    digits: ModuleType, tmp_path: Path
) -> None:
    callback = SriftyCallback(warmup_steps=2, profile_steps=50, verbose=False)
    _trainer(tmp_path, callback, max_steps=6).fit(
        digits.DigitsModule(hidden=32), datamodule=digits.DigitsDataModule(batch_size=BATCH)
    )
    assert load_profile(tmp_path / "srifty" / "profile.json").steps.measured_steps == 4


def test_tiny_steps_are_measured_for_a_minimum_time_within_the_run(
    digits: ModuleType, tmp_path: Path
) -> None:
    """A step of about a millisecond: 1 hook-free and 4 window steps are ~5 ms of timing.

    Both span less than 1 s, so both grow to 10x their counts; the 20-step run of
    ``profiled_run`` has no room and keeps its counts.
    """
    callback = SriftyCallback(warmup_steps=3, profile_steps=4, min_measure_s=1.0, verbose=False)
    _trainer(tmp_path, callback, max_steps=400).fit(
        digits.DigitsModule(hidden=32), datamodule=digits.DigitsDataModule(batch_size=BATCH)
    )
    profile = load_profile(tmp_path / "srifty" / "profile.json")
    assert profile.steps.step.p50_s * 4 < 1.0  # short enough that both phases grow
    assert profile.extra["hooks"]["clean_steps"] == 10
    assert (profile.steps.warmup_steps, profile.steps.measured_steps) == (1 + 10 + 1, 40)
    assert profile.steps.step.count == 40


@pytest.mark.parametrize(
    "kwargs",
    [{"warmup_steps": -1}, {"profile_steps": 0}, {"profile_epochs": 0}, {"min_measure_s": -1.0}],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        SriftyCallback(**kwargs)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_profile_uses_events_and_max_allocated(digits: ModuleType, tmp_path: Path) -> None:
    callback = SriftyCallback(warmup_steps=3, profile_steps=10, verbose=False)
    pl.Trainer(
        max_steps=15,
        accelerator="gpu",
        devices=1,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[callback],
    ).fit(digits.DigitsModule(hidden=1024), datamodule=digits.DigitsDataModule(batch_size=256))
    profile = load_profile(tmp_path / "srifty" / "profile.json")
    assert profile.memory.peak_kind == "cuda_max_allocated"
    assert profile.memory.peak_bytes >= profile.memory.param_bytes
    assert profile.environment.accelerator != "cpu"
    layer_sum = sum(x.forward_s + x.backward_s for x in profile.layers)
    assert 0.05 < layer_sum / (profile.steps.forward_s + profile.steps.backward_s) < 1.05


def test_cpu_profile_records_the_share_of_a_core_it_got(profiled_run: dict[str, Any]) -> None:
    # The training thread's CPU seconds per second of the batches' wall time: positive,
    # at most one core (a little slack for the clocks' granularity).
    profile: Profile = profiled_run["callback"].profile
    host = profile.extra["host"]
    assert host["intra_op_threads"] == torch.get_num_threads()
    assert 0.0 < host["cpu_share"] <= 1.05


class _Sleeping(pl.LightningModule):
    """Each step computes about 10 ms on one thread, then sleeps 50 ms (a blocking read)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(256, 256)

    def train_dataloader(self) -> torch.utils.data.DataLoader[tuple[torch.Tensor, ...]]:
        x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=4)

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        until = time.thread_time() + 0.01
        y = self.net(batch[0])
        while time.thread_time() < until:
            y = torch.tanh(y @ self.net.weight.detach())
        time.sleep(0.05)
        return self.net(batch[0]).pow(2).mean() + 0 * y.sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.skipif(
    not Path("/proc/thread-self/schedstat").exists(), reason="needs Linux's per-thread schedstat"
)
def test_a_step_that_blocks_is_not_read_as_a_core_denied(tmp_path: Path) -> None:
    """The share of a core is time on a core over time runnable (on a core or queued for
    one), as the kernel counts it: a step that sleeps 50 ms of its 60 was read as a
    sixth of a core (CPU seconds per wall second), and the local run of such a job was
    predicted 2.4x too fast (10 ms for 24 ms measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        callback = SriftyCallback(warmup_steps=2, profile_steps=5, min_measure_s=0, verbose=False)
        pl.Trainer(max_steps=8, accelerator="cpu", devices=1, default_root_dir=tmp_path,
                   logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, callbacks=[callback]).fit(_Sleeping())  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert callback.profile is not None
    share = callback.profile.extra["host"]["cpu_share"]
    per_wall_second = callback._compute_cpu_s / callback._compute_wall_s
    assert per_wall_second < 0.4  # the old reading: the sleep counted as a core denied
    assert share > max(0.5, 1.5 * per_wall_second), (share, per_wall_second)
    # 50 ms of each ~60 ms step asleep, which shared cores do not lengthen
    assert 0.5 < callback.profile.extra["host"]["blocked_share"] < 0.95


def test_the_profile_takes_its_compute_time_from_hook_free_steps(
    profiled_run: dict[str, Any],
) -> None:
    # Of 3 warm-up steps, the second is timed with no hook (the first is cold, the FLOP
    # count runs on the third).
    profile: Profile = profiled_run["callback"].profile
    hooks = profile.extra["hooks"]
    assert hooks["clean_steps"] == 1
    assert 0 < hooks["scale"] <= 1
    expected = min(hooks["clean_span_s"] / hooks["hooked_span_s"], 1.0)
    assert hooks["scale"] == pytest.approx(expected, abs=1e-4)
    # the phases keep their shares of the hooked window, so they still fit in the step
    s = profile.steps
    assert s.forward_s + s.backward_s + s.optimizer_s <= s.step.mean_s - s.data_wait_s + 1e-9


def test_two_warm_up_steps_leave_none_hook_free_and_keep_the_hooked_times(
    digits: ModuleType, tmp_path: Path
) -> None:
    callback = SriftyCallback(warmup_steps=2, profile_steps=4, verbose=False)
    _trainer(tmp_path, callback, max_steps=10).fit(
        digits.DigitsModule(hidden=32), datamodule=digits.DigitsDataModule(batch_size=BATCH)
    )
    profile = load_profile(tmp_path / "srifty" / "profile.json")
    assert "hooks" not in profile.extra
    assert profile.steps.measured_steps == 4


class _Speech(pl.LightningModule):
    """A conv + bidirectional GRU + CTC model, as deepspeech.pytorch trains: the CTC
    lengths are CPU tensors whatever the device (valid PyTorch)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(16, 32, 5, padding=2)
        self.rnn = torch.nn.GRU(32, 32, bidirectional=True)
        self.fc = torch.nn.Linear(64, 10)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        spect, targets = batch
        x = self.conv(spect).permute(2, 0, 1)  # (time, batch, features)
        log_probs = self.fc(self.rnn(x)[0]).log_softmax(-1)
        t, n, _ = log_probs.shape
        in_len = torch.full((n,), t, dtype=torch.long)  # on the CPU
        tgt_len = torch.full((n,), targets.shape[1], dtype=torch.long)
        return torch.nn.functional.ctc_loss(log_probs, targets, in_len, tgt_len)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize(
    "accelerator",
    ["cpu", pytest.param("gpu", marks=[
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    ])],
)  # fmt: skip
def test_a_ctc_model_with_host_lengths_trains_under_the_callback(
    accelerator: str, tmp_path: Path
) -> None:
    """On a GPU this step raised under a plain FlopCounterMode (seen on an H100)."""
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(16, 40, generator=g), torch.randint(1, 10, (8,), generator=g))
            for _ in range(64)]  # fmt: skip
    callback = SriftyCallback(warmup_steps=2, profile_steps=3, verbose=False)
    pl.Trainer(
        max_steps=8,
        accelerator=accelerator,
        devices=1,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[callback],
    ).fit(_Speech(), train_dataloaders=torch.utils.data.DataLoader(data, batch_size=8))
    profile = load_profile(tmp_path / "srifty" / "profile.json")
    assert profile.flops_per_step > 0  # the convolution and the GRU were counted
    assert {x.module_type for x in profile.layers} >= {"Conv1d", "GRU", "Linear"}


class _Validated(pl.LightningModule):
    """A regressor with a validation set: 10 training batches an epoch, 6 validation."""

    def __init__(self, val_sleep_s: float) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
        self.val_sleep_s = val_sleep_s

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        time.sleep(self.val_sleep_s)  # a pass worth pricing, whatever this machine's speed

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    @staticmethod
    def loader(n: int) -> torch.utils.data.DataLoader:
        data = torch.utils.data.TensorDataset(torch.randn(n, 8), torch.randn(n, 1))
        return torch.utils.data.DataLoader(data, batch_size=4)


@pytest.mark.parametrize(
    ("interval", "every_n_epochs", "between", "per_epoch"),
    [(1.0, 1, 10.0, True), (0.5, 2, 10.0, True), (4, None, 4.0, False)],
)
def test_validation_passes_are_recorded_with_their_period(
    tmp_path: Path,
    interval: float,
    every_n_epochs: int | None,
    between: float,
    per_epoch: bool,
) -> None:
    """What validation adds to a run: its batches per pass, the training batches between
    passes as Lightning schedules them, and one batch timed in the sanity check (its
    first batch warms up)."""
    callback = SriftyCallback(warmup_steps=2, profile_steps=3, verbose=False)
    model = _Validated(val_sleep_s=0.02)
    _trainer(
        tmp_path, callback, max_steps=12, val_check_interval=interval,
        check_val_every_n_epoch=every_n_epochs,
    ).fit(model, _Validated.loader(40), _Validated.loader(24))  # fmt: skip
    profile = load_profile(tmp_path / "srifty" / "profile.json")
    record = profile.extra["validation"]
    assert record["batches_per_pass"] == 6
    assert record["train_batches_between"] == between
    assert record["per_epoch"] is per_epoch
    assert record["timed_batches"] == 1  # Lightning's 2 sanity batches, the first left out
    assert record["batch_s"] >= 0.02
    assert 0.0 <= record["pass_overhead_s"] < 0.02 * 6  # outside the batches


def test_no_validation_record_without_a_validation_loader(tmp_path: Path) -> None:
    callback = SriftyCallback(warmup_steps=2, profile_steps=3, verbose=False)
    _trainer(tmp_path, callback, max_steps=6).fit(_Validated(0.0), _Validated.loader(40))
    assert "validation" not in load_profile(tmp_path / "srifty" / "profile.json").extra
