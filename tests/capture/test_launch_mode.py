"""The callback under the launcher: train mode, target steps, progress lines, bad settings."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import lightning.pytorch as pl
import pytest

from lightning_srifty import SriftyCallback
from lightning_srifty.capture.launch_mode import LaunchSettings, _adopt_early_sigterm
from lightning_srifty.capture.preemption import PreemptionWatcher
from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.launch_protocol import ProgressEvent
from lightning_srifty.io.checkpoint_store import CheckpointRef, open_store


def _train(digits: ModuleType, root: Path, env: dict[str, str], monkeypatch) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    pl.Trainer(
        max_steps=1000,  # the launcher's target wins
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=root,
        callbacks=[SriftyCallback(warmup_steps=1, profile_steps=2, verbose=False)],
    ).fit(digits.DigitsModule(hidden=16), datamodule=digits.DigitsDataModule(batch_size=32))


def test_train_mode_stops_at_target_and_prints_progress_for_cloud_logs(
    digits: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {
        proto.ENV_MODE: proto.MODE_TRAIN,
        proto.ENV_CHECKPOINT_URI: str(tmp_path / "store"),
        proto.ENV_TARGET_STEPS: "30",
        proto.ENV_PROGRESS_STDOUT: "1",
        proto.ENV_CHECKPOINT_EVERY_STEPS: "10",
    }
    _train(digits, tmp_path, env, monkeypatch)
    out = capsys.readouterr().out
    events = [e for e in map(proto.progress_from_log_line, out.splitlines()) if e is not None]
    assert [e.event for e in events][0] == "start"
    assert events[-1].event == "done" and events[-1].step == 30 and events[-1].step_s > 0
    saved = [e.step for e in events if e.event == "checkpoint"]
    assert saved == [10, 20, 30]  # every 10 steps; at the target only the final one
    refs = open_store(str(tmp_path / "store"), keep=10).refs()
    assert refs[0].step == 30 and refs[0].reason == "final"


@pytest.mark.parametrize("mode", [proto.MODE_TRAIN, proto.MODE_PROBE])
def test_a_run_that_is_not_profiling_never_reports_its_profile_too_short(
    mode: str, digits: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launched run resumes from the profiling run's checkpoint and never writes a
    profile: the marker the profiling run leaves when training ended before the window
    once told every finished run's state that it had been cut short."""
    store = str(tmp_path / "store")
    profiled = {proto.ENV_MODE: proto.MODE_PROFILE, proto.ENV_CHECKPOINT_URI: store,
                proto.ENV_STATE_DIR: str(tmp_path / "profile-state"),
                proto.ENV_PROFILE_PATH: str(tmp_path / "profile.json")}  # fmt: skip
    _train(digits, tmp_path, profiled, monkeypatch)
    assert (tmp_path / "profile.json").exists()
    state = tmp_path / "state"
    env = {proto.ENV_MODE: mode, proto.ENV_CHECKPOINT_URI: store,
           proto.ENV_TARGET_STEPS: "12", proto.ENV_STATE_DIR: str(state)}  # fmt: skip
    _train(digits, tmp_path, env, monkeypatch)
    assert (state / proto.ATTACHED_MARKER).exists()
    assert not (state / proto.SHORT_PROFILE_MARKER).exists()


@pytest.mark.parametrize("launched", [True, False], ids=["launched", "plain"])
def test_a_resume_inside_an_epoch_is_called_unreliable_only_where_it_is(
    launched: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning warns that a mid-epoch resume whose loader lacks ``state_dict`` "can
    cause unreliable results". The launcher's rebuilt loaders resume at the exact batch,
    so there the warning would only alarm (seen on Lightning's ``basics/transformer.py``);
    a plain Lightning resume of the same loader still gets it."""
    import warnings

    store = str(tmp_path / "store")
    env = {proto.ENV_MODE: proto.MODE_TRAIN, proto.ENV_CHECKPOINT_URI: store,
           proto.ENV_TARGET_STEPS: "4"}  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    def fit(target: int, **fit_args: object) -> list[str]:
        monkeypatch.setenv(proto.ENV_TARGET_STEPS, str(target))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            pl.Trainer(max_steps=target if not launched else -1, logger=False,
                       enable_checkpointing=False, enable_progress_bar=False,
                       enable_model_summary=False, default_root_dir=tmp_path,
                       callbacks=[SriftyCallback(verbose=False)],
                       ).fit(_Shuffled(False), **fit_args)  # fmt: skip
        return [str(w.message) for w in seen]

    fit(4)  # 4 of an epoch's 10 batches, saved at the target
    newest = open_store(store).refs()[0]
    assert newest.step == 4
    if not launched:
        monkeypatch.delenv(proto.ENV_MODE)
        monkeypatch.delenv(proto.ENV_CHECKPOINT_URI)
        fetched = open_store(store).fetch_latest(tmp_path / "fetched")
        assert fetched is not None
        said = fit(6, ckpt_path=str(fetched[0]))
    else:
        said = fit(6)
        assert open_store(store).refs()[0].step == 6
    unreliable = [m for m in said if "ended before the epoch ended" in m]
    assert bool(unreliable) != launched, said


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({proto.ENV_MODE: "turbo", proto.ENV_CHECKPOINT_URI: "/x"}, "SRIFTY_MODE='turbo'"),
        ({proto.ENV_MODE: proto.MODE_TRAIN}, "SRIFTY_CHECKPOINT_URI is not"),
        (
            {proto.ENV_MODE: "train", proto.ENV_CHECKPOINT_URI: "/x", proto.ENV_TARGET_STEPS: "x"},
            "SRIFTY_TARGET_STEPS='x' is not an integer",
        ),
    ],
)
def test_bad_launcher_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LaunchSettings.from_env(env)


def test_no_launcher_means_no_launch_mode() -> None:
    assert LaunchSettings.from_env({}) is None


def test_log_lines_with_prefixes_parse_and_others_do_not() -> None:
    event = proto.ProgressEvent("step", 1.0, 5, step_s=0.1)
    line = f"(head, rank=0, pid=7) {proto.PROGRESS_LINE_PREFIX}{event.to_line()}"
    assert proto.progress_from_log_line(line) == event
    assert proto.progress_from_log_line("Epoch 0: 100%") is None


def test_trainer_env_shapes_a_plain_trainer_for_the_plan() -> None:
    env = proto.trainer_env(nodes=2, devices_per_node=2, root_dir="/runs/x/lightning")
    assert env == {
        "PL_TRAINER_DEVICES": "2",
        "PL_TRAINER_NUM_NODES": "2",
        "PL_TRAINER_STRATEGY": "ddp",
        "PL_TRAINER_DEFAULT_ROOT_DIR": "/runs/x/lightning",
        proto.ENV_WORLD_SIZE: "4",
    }
    single = proto.trainer_env(nodes=1, devices_per_node=1, root_dir=None)
    assert "PL_TRAINER_STRATEGY" not in single and single[proto.ENV_WORLD_SIZE] == "1"


def test_lightning_takes_the_env_as_defaults_and_the_script_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for key, value in proto.trainer_env(
        nodes=1, devices_per_node=3, root_dir=str(tmp_path)
    ).items():
        monkeypatch.setenv(key, value)
    plain = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    assert plain.num_devices == 3 and plain.default_root_dir == str(tmp_path)
    pinned = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    assert pinned.num_devices == 1  # what SriftyCallback's world-size check then catches


def test_the_scripts_own_limits_bound_the_launchers_target(
    digits: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        proto.ENV_MODE: proto.MODE_TRAIN,
        proto.ENV_CHECKPOINT_URI: str(tmp_path / "store"),
        proto.ENV_TARGET_STEPS: "5000",
        proto.ENV_PROGRESS_PATH: str(tmp_path / "progress.jsonl"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    trainer = pl.Trainer(
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[SriftyCallback(warmup_steps=1, profile_steps=2, verbose=False)],
    )
    trainer.fit(digits.DigitsModule(hidden=16), datamodule=digits.DigitsDataModule(batch_size=256))
    assert trainer.current_epoch == 2 and trainer.global_step == 2 * (1797 // 256)
    assert trainer.max_epochs == 2  # not lifted to the launcher's -1


def test_a_fractional_epochs_target_stops_inside_the_epoch(
    digits: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        proto.ENV_MODE: proto.MODE_TRAIN,
        proto.ENV_CHECKPOINT_URI: str(tmp_path / "store"),
        proto.ENV_TARGET_EPOCHS: "1.5",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    trainer = pl.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        accumulate_grad_batches=2,
        default_root_dir=tmp_path,  # the profile lands here, not in the working directory
        callbacks=[SriftyCallback(warmup_steps=1, profile_steps=2, verbose=False)],
    )
    trainer.fit(digits.DigitsModule(hidden=16), datamodule=digits.DigitsDataModule(batch_size=64))
    # 1797 // 64 = 28 batches an epoch, 14 optimizer steps: one and a half epochs is 21.
    assert trainer.global_step == 14 + 7


def test_a_sigterm_lightning_took_before_training_becomes_the_runs_notice() -> None:
    """SIGTERM between Lightning's handler and the watcher's (first workers starting,
    sanity check): without the hand-over Lightning ends the fit saving nothing."""
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    connector = trainer._signal_connector
    connector.register_signal_handlers()  # as Trainer._run does before the fit stage
    watcher = PreemptionWatcher({"SRIFTY_IMDS": "off"})
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not trainer.received_sigterm and time.monotonic() < deadline:
            time.sleep(0.01)  # the handler runs in the main thread, between bytecodes
        assert trainer.received_sigterm  # Lightning's handler took it
        watcher.start()  # on_train_start
        _adopt_early_sigterm(trainer, watcher)
        assert watcher.should_checkpoint() and "SIGTERM" in watcher.reason
        assert not trainer.received_sigterm  # no SIGTERMException at the first batch
    finally:
        watcher.close()
        connector.teardown()


class _Shuffled(pl.LightningModule):
    """Dropout and a shuffled plain loader: the loss of each step depends on the order
    and on the generator's state alike; ``losses`` keeps each step's exact loss."""

    def __init__(self, paired: bool) -> None:
        super().__init__()
        import torch

        self.paired = paired
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3),
                                       torch.nn.Linear(16, 2))  # fmt: skip
        self.losses: dict[int, str] = {}

    def train_dataloader(self) -> object:
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        g = torch.Generator().manual_seed(0)
        data = TensorDataset(
            torch.randn(160, 8, generator=g), torch.randint(0, 2, (160,), generator=g)
        )
        loader = DataLoader(data, batch_size=16, shuffle=True)  # 10 batches an epoch
        if not self.paired:
            return loader
        short = DataLoader(TensorDataset(*data[:48]), batch_size=16, shuffle=True)
        return {"long": loader, "short": short}

    def training_step(self, batch: object, batch_idx: int) -> object:
        import torch

        pairs = list(batch.values()) if isinstance(batch, dict) else [batch]
        loss = sum(torch.nn.functional.cross_entropy(self.net(x), y) for x, y in pairs)
        self.losses[self.global_step + 1] = float(loss.detach()).hex()
        return loss

    def configure_optimizers(self) -> object:
        import torch

        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def _fit_to(
    steps: int, store: Path, paired: bool, monkeypatch: pytest.MonkeyPatch
) -> dict[int, str]:
    pl.seed_everything(0)
    return _fit_module(_Shuffled(paired), steps, store, monkeypatch)


def _fit_module(
    module: _Shuffled,
    steps: int,
    store: Path,
    monkeypatch: pytest.MonkeyPatch,
    reload_every: int = 0,
) -> dict[int, str]:
    """Trains ``module`` under the launcher to ``steps`` (checkpoints in ``store``)."""
    monkeypatch.setenv(proto.ENV_MODE, proto.MODE_TRAIN)
    monkeypatch.setenv(proto.ENV_CHECKPOINT_URI, str(store))
    monkeypatch.setenv(proto.ENV_TARGET_STEPS, str(steps))
    pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, default_root_dir=store.parent,
               reload_dataloaders_every_n_epochs=reload_every,
               callbacks=[SriftyCallback(warmup_steps=1, profile_steps=2, verbose=False)],
               ).fit(module)  # fmt: skip
    return module.losses


@pytest.mark.parametrize("paired", [False, True], ids=["one-loader", "a-dict-of-loaders"])
def test_a_resume_from_an_epochs_last_batch_draws_the_next_epochs_order_as_uninterrupted(
    paired: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run stops at the epoch's last batch (its checkpoint closes the epoch): the
    next epoch's orders are drawn when Lightning creates its loader iterators, which a
    resumed Lightning does before ``on_train_start``, where the generators used to be
    restored; the resumed epoch then ran in other orders than the uninterrupted one."""
    whole = _fit_to(30, tmp_path / "whole", paired, monkeypatch)
    first = _fit_to(10, tmp_path / "split", paired, monkeypatch)
    refs = open_store(str(tmp_path / "split"), keep=10).refs()
    assert refs[0].step == 10  # the epoch's last batch
    second = _fit_to(30, tmp_path / "split", paired, monkeypatch)
    assert sorted(first) == list(range(1, 11)) and sorted(second) == list(range(11, 31))
    assert {**first, **second} == whole


class _SeededShuffle(_Shuffled):
    """A shuffled loader ordered by the script's own seeded generator (the way to make
    a ``DataLoader`` reproducible that PyTorch documents), with or without workers."""

    def __init__(self, workers: int = 0, persistent: bool = False) -> None:
        super().__init__(False)
        self.workers, self.persistent = workers, persistent

    def train_dataloader(self) -> object:
        import torch
        from torch.utils.data import DataLoader

        return DataLoader(_Augmenting(), batch_size=16, shuffle=True,
                          generator=torch.Generator().manual_seed(7),
                          num_workers=self.workers,
                          persistent_workers=self.persistent)  # fmt: skip


@pytest.mark.parametrize(
    ("stop", "workers", "persistent", "reload"),
    [(4, 0, False, 0), (10, 0, False, 0), (14, 0, False, 0), (14, 2, False, 0),
     (14, 2, True, 0), (10, 0, False, 1), (14, 0, False, 1)],
    ids=["first-epoch", "epoch-end", "second-epoch", "workers", "persistent-workers",
         "reloaded-at-epoch-end", "reloaded-inside-epoch"],
)  # fmt: skip
def test_a_loader_seeded_by_the_script_resumes_at_its_exact_batch(
    stop: int,
    workers: int,
    persistent: bool,
    reload: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``DataLoader(shuffle=True, generator=torch.Generator().manual_seed(7))`` draws every
    epoch's order, and its workers' base seeds, from the script's generator. The loader
    was left as it was, so a resume started a new process's generator at the seed again:
    every batch after a resume inside an epoch differed from the uninterrupted run. A
    script that reloads its loaders every epoch makes a new generator each time: a
    resume into a new build keeps it at its seed, one inside a build restores it."""

    def fit(steps: int, store: Path) -> dict[int, str]:
        pl.seed_everything(0)
        module = _SeededShuffle(workers, persistent)
        return _fit_module(module, steps, store, monkeypatch, reload_every=reload)

    whole = fit(30, tmp_path / "whole")
    first = fit(stop, tmp_path / "split")
    assert open_store(str(tmp_path / "split")).refs()[0].step == stop
    second = fit(30, tmp_path / "split")
    assert sorted(second) == list(range(stop + 1, 31))
    assert {**first, **second} == whole


class _Augmenting:
    """A map-style dataset that draws a random augmentation in ``__getitem__`` from the
    torch, numpy and ``random`` generators of whatever process loads it (a DataLoader
    worker's, seeded from the iterator's base seed), as torchvision transforms do."""

    def __init__(self) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(160, 8, generator=g)
        self.y = torch.randint(0, 2, (160,), generator=g)

    def __len__(self) -> int:
        return 160

    def __getitem__(self, index: int) -> object:
        import random

        import numpy as np
        import torch

        shift = float(np.random.uniform(-0.1, 0.1)) + random.uniform(-0.1, 0.1)
        return self.x[index] + 0.1 * torch.randn(8) + shift, self.y[index]


class _AugmentedInWorkers(_Shuffled):
    def __init__(self, workers: int) -> None:
        super().__init__(False)
        self.workers = workers

    def train_dataloader(self) -> object:
        from torch.utils.data import DataLoader

        context = "forkserver" if self.workers else None
        return DataLoader(_Augmenting(), batch_size=16, shuffle=True, num_workers=self.workers,
                          multiprocessing_context=context)  # fmt: skip


def _fit_augmented(
    steps: int, store: Path, workers: int, monkeypatch: pytest.MonkeyPatch
) -> dict[int, str]:
    pl.seed_everything(0, workers=True)
    return _fit_module(_AugmentedInWorkers(workers), steps, store, monkeypatch)


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "two-workers"])
def test_a_resume_inside_an_epoch_replays_the_augmentations_its_workers_drew(
    workers: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each DataLoader iterator seeds its workers from a base seed it draws when it is
    created, and each worker's generators advance with every sample it loads. A resume
    inside the epoch used to start new workers from a new base seed that had loaded
    nothing, so every augmentation after the handover differed (measured: step 8 on).
    Workers from a fork server: a fork in a process that has run threads can hang."""
    whole = _fit_augmented(25, tmp_path / "whole", workers, monkeypatch)
    first = _fit_augmented(7, tmp_path / "split", workers, monkeypatch)
    refs = open_store(str(tmp_path / "split"), keep=10).refs()
    assert refs[0].step == 7  # inside the first epoch (10 batches)
    second = _fit_augmented(25, tmp_path / "split", workers, monkeypatch)
    assert sorted(second) == list(range(8, 26))
    assert {**first, **second} == whole


@pytest.mark.parametrize(
    ("reload_every", "workers", "stop"),
    [(1, 0, 13), (1, 2, 13), (2, 0, 15), (2, 2, 20), (1, 0, 10), (1, 2, 10)],
    ids=["every-epoch-inside", "every-epoch-inside-workers", "every-2-between-reloads",
         "every-2-at-an-epoch-end-workers", "every-epoch-at-an-epoch-end",
         "every-epoch-at-an-epoch-end-workers"],
)  # fmt: skip
def test_a_script_that_reloads_its_loaders_resumes_at_the_exact_batch(
    reload_every: int, workers: int, stop: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``reload_dataloaders_every_n_epochs`` Lightning rebuilds the training loaders
    on a schedule its checkpoints do not keep, and in a reload epoch makes two iterators
    over them. Measured before: every batch after a resume differed (the positions of
    dropped loaders restored into live ones; the resumed Lightning reloading a step late;
    in a reload epoch with workers, the second iterator's order drawn from the first's
    generator). Epochs of 10 batches; the augmentations are drawn in the workers."""

    def fit(steps: int, store: Path) -> dict[int, str]:
        pl.seed_everything(0, workers=True)
        module = _AugmentedInWorkers(workers)
        return _fit_module(module, steps, store, monkeypatch, reload_every=reload_every)

    whole = fit(30, tmp_path / "whole")
    first = fit(stop, tmp_path / "split")
    assert open_store(str(tmp_path / "split"), keep=10).refs()[0].step == stop
    second = fit(30, tmp_path / "split")
    assert sorted(second) == list(range(stop + 1, 31))
    assert {**first, **second} == whole


class _ReloadedLoader(_Shuffled):
    """What scripts reload for: a curriculum (``"epoch"``: the data grows with the
    epoch; 5, 5, 7, 7, 9 batches when reloaded every 2 epochs) or a new random subset
    (``"subset"``: 128 of the 160 samples drawn from the global generator, 8 batches)."""

    def __init__(self, kind: str) -> None:
        super().__init__(False)
        self.kind = kind

    def train_dataloader(self) -> object:
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        data = super().train_dataloader().dataset  # type: ignore[attr-defined]
        if self.kind == "epoch":
            chosen = data[: 80 + 16 * min(self.current_epoch, 5)]
        else:
            chosen = data[torch.randperm(160)[:128]]
        return DataLoader(TensorDataset(*chosen), batch_size=16, shuffle=True)


@pytest.mark.parametrize(
    ("kind", "reload_every", "stops"),
    [("epoch", 2, (7,)), ("epoch", 2, (13,)), ("epoch", 2, (10, 20)), ("subset", 1, (13,)),
     ("subset", 2, (11, 19)), ("subset", 1, (8, 16))],
    ids=["curriculum-between-reloads", "curriculum-in-a-reload-epoch",
         "curriculum-epoch-end-then-between", "subset-every-epoch", "subset-twice",
         "subset-every-epoch-at-epoch-ends"],
)  # fmt: skip
def test_a_reloaded_loader_that_reads_the_epoch_or_draws_resumes_as_built(
    kind: str,
    reload_every: int,
    stops: tuple[int, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A resumed Lightning builds its loaders when it starts, in the epoch it resumes in
    and with the new process's generators: a curriculum resumed between two reloads, or
    a subset drawn anew, trained other batches from the resume on (measured). The
    resumed build replays the last reload's: its epoch and its generators."""

    def fit(steps: int, store: Path) -> dict[int, str]:
        pl.seed_everything(0)
        module = _ReloadedLoader(kind)
        return _fit_module(module, steps, store, monkeypatch, reload_every=reload_every)

    whole = fit(30, tmp_path / "whole")
    split: dict[int, str] = {}
    for stop in (*stops, 30):
        split.update(fit(stop, tmp_path / "split"))
        assert open_store(str(tmp_path / "split"), keep=10).refs()[0].step == stop
    assert split == whole


class _DistributedOrder(_Shuffled):
    """Shuffled by a ``DistributedSampler`` (one replica): its order is the epoch's."""

    def __init__(self) -> None:
        super().__init__(False)

    def train_dataloader(self) -> object:
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        from torch.utils.data.distributed import DistributedSampler

        g = torch.Generator().manual_seed(0)
        data = TensorDataset(
            torch.randn(160, 8, generator=g), torch.randint(0, 2, (160,), generator=g)
        )
        order = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True)
        return DataLoader(data, batch_size=16, sampler=order)


def test_a_run_continued_past_its_target_keeps_each_epochs_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target reached inside an epoch: the final checkpoint used to be saved at the
    train end, after Lightning had counted the epoch as done, so a longer run resumed
    from it numbered every later epoch one ahead, and a DistributedSampler (ordered by
    epoch) trained other batches from the first resumed one on (measured: step 8)."""

    def fit(steps: int, store: Path) -> dict[int, str]:
        pl.seed_everything(0)
        return _fit_module(_DistributedOrder(), steps, store, monkeypatch)

    whole = fit(25, tmp_path / "whole")
    first = fit(7, tmp_path / "split")
    (final,) = open_store(str(tmp_path / "split"), keep=10).refs()
    assert (final.step, final.reason) == (7, "final")
    second = fit(25, tmp_path / "split")
    assert sorted(second) == list(range(8, 26))
    assert {**first, **second} == whole


class _PersistentWorkers(_AugmentedInWorkers):
    """Augmenting workers that persist from epoch to epoch; ``in_order=False`` hands
    each batch to whichever worker is free, ``pin_memory`` pins what they made."""

    def __init__(self, workers: int, in_order: bool = True, pin_memory: bool = False) -> None:
        super().__init__(workers)
        self.in_order, self.pin_memory = in_order, pin_memory

    def train_dataloader(self) -> object:
        from torch.utils.data import DataLoader

        kept = {"persistent_workers": True, "multiprocessing_context": "forkserver"}
        return DataLoader(_Augmenting(), batch_size=16, shuffle=True, num_workers=self.workers,
                          in_order=self.in_order, pin_memory=self.pin_memory,
                          **kept)  # fmt: skip


@pytest.mark.parametrize(
    ("stops", "pin_memory", "reload_every"),
    [((25,), False, 0), ((20, 27), True, 0), ((13,), False, 2), ((25,), False, 2),
     ((13,), False, 1)],
    ids=["inside-the-third-epoch", "epoch-end-then-inside-pinned", "reloaded-between-reloads",
         "inside-a-reload-epoch", "reloaded-every-epoch"],
)  # fmt: skip
def test_persistent_workers_resume_the_draws_they_carried_from_earlier_epochs(
    stops: tuple[int, ...],
    pin_memory: bool,
    reload_every: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Persistent workers seed their generators once and carry them from epoch to epoch:
    a resume started new workers from a new base seed, so every augmentation after it
    differed (measured: from the first resumed batch on). Each worker now reports its
    generators with its batches, and a resume starts its workers from those the pass
    began with. Two workers, epochs of 10 batches; in the last three cases the loader is
    rebuilt every 2 epochs (resumed in epoch 1, whose pass began on epoch 0's workers,
    and in epoch 2, a reload epoch) or every epoch. In a reload epoch Lightning leaves
    its first iterator over the new loader after the workers' prefetch, and the batches
    they loaded for it are discarded: their draws count too (measured before: from the
    first resumed batch on)."""

    def fit(steps: int, store: Path) -> dict[int, str]:
        pl.seed_everything(0, workers=True)
        module = _PersistentWorkers(2, pin_memory=pin_memory)
        return _fit_module(module, steps, store, monkeypatch, reload_every=reload_every)

    whole = fit(35, tmp_path / "whole")
    split: dict[int, str] = {}
    for stop in (*stops, 35):
        part = fit(stop, tmp_path / "split")
        assert sorted(part) == list(range(len(split) + 1, stop + 1))
        split.update(part)
    assert split == whole


@pytest.mark.parametrize(
    ("in_order", "told"), [(True, False), (False, True)], ids=["in-order", "any-order"]
)
def test_persistent_workers_whose_draws_cannot_replay_are_told_so(
    in_order: bool,
    told: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With ``in_order=False`` no two runs hand out batches alike: the attempt's log
    says the workers' draws start afresh on a resume; in order, they replay."""
    _fit_module(_PersistentWorkers(1, in_order=in_order), 3, tmp_path / "store", monkeypatch)
    said = capsys.readouterr().err
    assert ("DataLoader(persistent_workers=True) over a stream" in said) == told


class _CountsEpochs(_Shuffled):
    """Sets an attribute at each epoch start: state outside the checkpoint."""

    def __init__(self) -> None:
        super().__init__(False)
        self.epoch_starts = 0

    def on_train_epoch_start(self) -> None:
        self.epoch_starts += 1


class _EpochLogger(pl.Callback):
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pl_module.log("started", 1.0)


@pytest.mark.parametrize("hooked", [True, False], ids=["hooks", "none"])
def test_a_resume_inside_an_epoch_names_the_epoch_start_hooks_it_skips(
    hooked: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Lightning does not call ``on_train_epoch_start`` on a restart inside an epoch:
    the module's hook and a callback's ran before the checkpoint and are not repeated.
    The attempt says which (Lightning's own callbacks, a progress bar among them, are
    not named), and says nothing where the script has none."""
    store = tmp_path / "store"
    monkeypatch.setenv(proto.ENV_MODE, proto.MODE_TRAIN)
    monkeypatch.setenv(proto.ENV_CHECKPOINT_URI, str(store))
    modules = []
    for target in (5, 12):  # stops at batch 5 of 10, then resumes inside that epoch
        monkeypatch.setenv(proto.ENV_TARGET_STEPS, str(target))
        module = _CountsEpochs() if hooked else _Shuffled(False)
        extra = [_EpochLogger()] if hooked else []
        pl.seed_everything(0)
        pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=True,
                   enable_model_summary=False, default_root_dir=tmp_path,
                   callbacks=[SriftyCallback(warmup_steps=1, profile_steps=2, verbose=False),
                              *extra],
                   ).fit(module)  # fmt: skip
        modules.append(module)
    said = " ".join(capsys.readouterr().err.split())
    named = "_CountsEpochs.on_train_epoch_start, _EpochLogger.on_train_epoch_start ran"
    assert ("resumed inside epoch 0, where Lightning does not call" in said) == hooked
    assert (named in said) == hooked
    assert "TQDMProgressBar" not in said
    if hooked:  # what the note warns of: the resumed process counted only epoch 1
        assert [m.epoch_starts for m in modules] == [1, 1]  # type: ignore[attr-defined]


ACCUMULATING = Path(__file__).resolve().parent / "scripts" / "accumulating.py"


def _run_accumulating(
    store: Path, log: Path, target: int, *args: str, processes: int = 1, sleep_s: float = 0.0
) -> int:
    env = {
        **os.environ,
        proto.ENV_MODE: proto.MODE_TRAIN,
        proto.ENV_CHECKPOINT_URI: str(store),
        proto.ENV_TARGET_STEPS: str(target),
        proto.ENV_STATE_DIR: str(store.parent / "state"),
        "LOSS_LOG": str(log),
        "STEP_SLEEP_S": str(sleep_s),
        "OMP_NUM_THREADS": "1",
    }
    runner = [sys.executable]
    if processes > 1:
        env.update(proto.trainer_env(nodes=1, devices_per_node=processes, root_dir=None))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        runner += ["-m", "torch.distributed.run", "--nproc-per-node", str(processes),
                   "--master-addr", "127.0.0.1", "--master-port", str(port)]  # fmt: skip
    done = subprocess.run(  # noqa: S603 - fixed argv
        [*runner, str(ACCUMULATING), *args], env=env, cwd=store.parent,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if processes > 1 and done.returncode == 1:
        # torchrun ends 1 when its processes fail; each preempted one is listed by code
        ranks = re.findall(r"exitcode\s*:\s*(-?\d+)", done.stderr)
        assert set(ranks) == {str(proto.PREEMPTED_EXIT_CODE)}, done.stderr[-3000:]
        assert len(ranks) >= processes, done.stderr[-3000:]
        return proto.PREEMPTED_EXIT_CODE
    assert done.returncode in (0, proto.PREEMPTED_EXIT_CODE), done.stderr[-3000:]
    return done.returncode


@pytest.mark.parametrize("hangs", [True, False], ids=["hangs", "healthy"])
def test_a_silent_job_writes_its_stacks_before_it_is_stopped_and_a_healthy_one_does_not(
    hangs: bool, tmp_path: Path
) -> None:
    """Under ``SRIFTY_STALL_DUMP_S`` a job whose progress lines stop writes every thread's
    stack to its log and keeps running (the launcher decides what to do); one whose lines
    keep coming, though it runs longer than that, writes none. On a cloud backend the
    launcher cannot signal the job's processes for their stacks; this needs nobody to."""
    env = {**os.environ, proto.ENV_MODE: proto.MODE_TRAIN,
           proto.ENV_CHECKPOINT_URI: str(tmp_path / "store"),
           proto.ENV_TARGET_STEPS: "40", proto.ENV_STATE_DIR: str(tmp_path / "state"),
           proto.ENV_PROGRESS_PATH: str(tmp_path / "progress.jsonl"),
           proto.ENV_STALL_DUMP_S: "2", "STEP_SLEEP_S": "0.1", "OMP_NUM_THREADS": "1",
           "HANG_AT": "5" if hangs else "0"}  # fmt: skip
    err = tmp_path / "stderr.txt"
    with open(err, "w") as sink:
        argv = [sys.executable, str(ACCUMULATING), "--accumulate", "1"]
        job = subprocess.Popen(  # noqa: S603 - fixed argv
            argv, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=sink
        )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and job.poll() is None:
                if hangs and "hang_here" in err.read_text():
                    break
                time.sleep(0.2)
            alive = job.poll() is None
        finally:
            job.kill()
            job.wait()
    said = err.read_text()
    if hangs:
        assert alive, said[-3000:]  # the dump ends nothing
        assert "Timeout (0:00:02)!" in said and "training_step" in said, said[-3000:]
    else:
        assert job.returncode in (0, -signal.SIGKILL) and not alive
        assert "Timeout (" not in said, said[-3000:]
        lines = (tmp_path / "progress.jsonl").read_text().splitlines()
        assert ProgressEvent.from_line(lines[-1]).event == "done"  # 40 steps of 0.1 s


def _batch_losses(log: Path) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in log.read_text().splitlines():
        done, loss = line.split()
        out.setdefault(int(done), []).append(loss)
    return out


def _batch_losses_of(
    root: Path, target: int, *args: str, processes: int = 1
) -> dict[int, list[str]]:
    root.mkdir()
    log = root / "losses.txt"
    assert _run_accumulating(root / "store", log, target, *args, processes=processes) == 0
    return _batch_losses(log)


def _preempted_then_resumed(
    tmp_path: Path,
    sigterm_at: int,
    *args: str,
    processes: int = 1,
    sleep_s: float = 0.0,
    target: int = 40,
) -> tuple[CheckpointRef, dict[int, list[str]], dict[int, list[str]]]:
    """``target`` batches of ``accumulating.py`` uninterrupted, and split by a SIGTERM at
    batch ``sigterm_at`` (exit 75) and a resume: the newest checkpoint of the split run,
    the uninterrupted run's losses, and the split run's (both parts, every batch once)."""
    whole = _batch_losses_of(tmp_path / "whole", target, *args, processes=processes)
    split = tmp_path / "split"
    split.mkdir()
    log = split / "losses.txt"
    signal_args = ("--sigterm-at", str(sigterm_at))
    code = _run_accumulating(
        split / "store", log, target, *signal_args, *args, processes=processes, sleep_s=sleep_s
    )
    assert code == proto.PREEMPTED_EXIT_CODE
    newest = open_store(str(split / "store"), keep=10).refs()[0]
    assert newest.reason == "emergency"
    first = _batch_losses(log)
    assert sorted(first) == list(range(1, newest.step + 1))
    log.unlink()
    assert _run_accumulating(split / "store", log, target, *args, processes=processes) == 0
    second = _batch_losses(log)
    assert sorted(second) == list(range(newest.step + 1, target + 1))
    return newest, whole, {**first, **second}


@pytest.mark.parametrize(
    ("sigterm_at", "saved_at"), [(14, 16), (20, 23)], ids=["inside-a-cycle", "at-an-epoch-end"]
)
def test_a_preemption_inside_an_accumulation_cycle_saves_at_its_optimizer_step(
    sigterm_at: int, saved_at: int, tmp_path: Path
) -> None:
    """A checkpoint holds no accumulated gradient: one taken after the 14th batch (two
    batches into a cycle of three) resumed with those two batches' gradients lost, and
    every loss after differed from the uninterrupted run's. The notice now waits for the
    cycle's optimizer step (batch 16). One at an epoch's last batch (20, where Lightning
    steps on a partial cycle) waits for the epoch's end, and then for the next cycle's
    step (23)."""
    newest, whole, split = _preempted_then_resumed(tmp_path, sigterm_at)
    assert newest.step == saved_at
    assert split == whole


def test_a_preemption_under_an_accumulation_schedule_resumes_with_the_epochs_factor(
    tmp_path: Path,
) -> None:
    """``GradientAccumulationScheduler`` sets the epoch's factor in the epoch-start hook
    a mid-epoch restart skips: preempted inside the third epoch (3 batches an update
    there), the resumed epoch stepped every batch and every later loss differed. The
    notice at batch 25 (5 of the epoch, inside a cycle) is also taken at batch 26."""
    newest, whole, split = _preempted_then_resumed(tmp_path, 25, "--schedule")
    assert newest.step == 26
    assert split == whole


@pytest.mark.parametrize(
    ("sigterm_at", "saved_at"), [(15, 15), (20, 21)], ids=["inside-an-epoch", "at-its-end"]
)
def test_a_preemption_keeps_the_epochs_validation_and_plateau_step(
    sigterm_at: int, saved_at: int, tmp_path: Path
) -> None:
    """Lightning does not step ``ReduceLROnPlateau`` at the end of the epoch it restarted
    in: preempted at batch 15, the epoch's end kept its learning rate where the
    uninterrupted run halved it, and every loss from batch 22 on differed. Preempted at
    the epoch's last batch (20), the checkpoint came before the epoch's validation pass
    and plateau step, which the resume then skipped; it now waits for the epoch's end."""
    plateau = ("--accumulate", "1", "--plateau")
    newest, whole, split = _preempted_then_resumed(tmp_path, sigterm_at, *plateau)
    assert newest.step == saved_at
    assert split == whole


def test_a_preemption_inside_an_swa_epoch_keeps_swas_learning_rate_schedule(
    tmp_path: Path,
) -> None:
    """Lightning skips ``on_train_epoch_start`` on a mid-epoch restart, and that is where
    ``StochasticWeightAveraging`` builds its ``SWALR``: preempted at batch 15 (SWA from
    the second epoch, batches 11-20), the resumed epoch ended without an SWA step, the
    learning rate trailed by an epoch and every loss from batch 22 on differed."""
    swa = ("--accumulate", "1", "--swa-from", "2")
    newest, whole, split = _preempted_then_resumed(tmp_path, 15, *swa)
    assert newest.step == 15
    assert split == whole


@pytest.mark.slow
def test_ranks_told_of_a_preemption_inside_a_cycle_save_together_at_its_optimizer_step(
    tmp_path: Path,
) -> None:
    """Two DDP processes (5 batches an epoch each, cycles of 3): rank 1 alone gets the
    SIGTERM, inside its 7th batch; the vote tells rank 0 (a round about a second: 0.25 s
    batches), both wait for the cycle's optimizer step and save there together, and the
    resumed pair trains every later batch as the uninterrupted pair does."""
    newest, whole, split = _preempted_then_resumed(
        tmp_path, 7, "--sigterm-rank", "1", processes=2, sleep_s=0.25
    )
    assert 7 <= newest.step < 40
    # a full cycle's optimizer step; an epoch's last batch (5) waits for the epoch's end
    assert (newest.step - 1) % 5 + 1 == 3, newest.step
    assert split == whole


@pytest.mark.slow
@pytest.mark.parametrize(
    "loader", ["per-epoch", "persistent", "seeded-per-rank"], ids=lambda x: str(x)
)
def test_ranks_whose_workers_augment_resume_each_ranks_draws_after_a_preemption(
    loader: str, tmp_path: Path
) -> None:
    """Two DDP processes seeded apart, each loading its batches in two workers that draw
    a random shift per sample: rank 1 is preempted inside its 7th batch (the second
    epoch), and the resumed pair trains every later batch as the uninterrupted pair
    does. Measured before: the resumed epoch's workers took the indices of epoch 0's
    order (a resumed Lightning creates the iterator, whose workers start drawing at once,
    before it sets the sampler's epoch), and their augmentations came from a new base
    seed. Persistent workers carry their generators from epoch 0 into the resumed epoch:
    each rank's are restored from its own report. A loader with the script's own
    generator, seeded apart per rank, draws its workers' base seeds from it: each rank's
    is restored from its own state (before, the epochs after the resumed one differed)."""
    more = {"per-epoch": (), "persistent": ("--persistent",), "seeded-per-rank": ("--seeded",)}[
        loader
    ]
    newest, whole, split = _preempted_then_resumed(
        tmp_path, 7, "--sigterm-rank", "1", "--accumulate", "1", "--augment-workers", "2",
        *more, processes=2, sleep_s=0.25, target=20,
    )  # fmt: skip
    assert 7 <= newest.step < 20 and newest.step % 5 != 0, newest.step  # inside an epoch
    assert split == whole


@pytest.mark.slow
@pytest.mark.parametrize(
    ("reload_every", "workers", "sigterm_at"),
    [(2, 0, 7), (1, 2, 6)],
    ids=["between-reloads", "in-a-reload-epoch-workers"],
)
def test_ranks_that_reload_their_loaders_resume_each_ranks_subset_after_a_preemption(
    reload_every: int, workers: int, sigterm_at: int, tmp_path: Path
) -> None:
    """Two DDP processes seeded apart, each rebuilding its loader under
    ``reload_dataloaders_every_n_epochs`` from a random subset its own generators draw
    (4 batches an epoch each): rank 1 is preempted inside the second epoch, and the
    resumed pair trains every later batch as the uninterrupted pair does. Each rank's
    build state travels in the checkpoint per rank; a resumed pair that rebuilt both
    ranks from rank 0's would train rank 1 on rank 0's subset from the resume on."""
    newest, whole, split = _preempted_then_resumed(
        tmp_path, sigterm_at, "--sigterm-rank", "1", "--accumulate", "1",
        "--reload-every", str(reload_every), "--augment-workers", str(workers),
        processes=2, sleep_s=0.25, target=16,
    )  # fmt: skip
    assert sigterm_at <= newest.step < 16 and newest.step % 4 != 0, newest.step
    assert split == whole


@pytest.mark.parametrize(
    ("max_epochs", "saved"), [(2, (11, "profile-end")), (1, (10, "final"))], ids=["more", "last"]
)
def test_a_window_ending_at_an_epochs_last_batch_hands_over_where_a_resume_is_exact(
    max_epochs: int, saved: tuple[int, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window (2 + 8 batches) ends at the epoch's last batch, before its end: the
    handover waits a batch. Where that batch was the script's last (``max_epochs=1``),
    training ends there and the run is reported complete; the waiting handover once left
    no checkpoint and no ``profile-done`` at all."""
    monkeypatch.setenv(proto.ENV_MODE, proto.MODE_PROFILE)
    monkeypatch.setenv(proto.ENV_CHECKPOINT_URI, str(tmp_path / "store"))
    monkeypatch.setenv(proto.ENV_STATE_DIR, str(tmp_path / "state"))
    monkeypatch.setenv(proto.ENV_PROGRESS_PATH, str(tmp_path / "progress.jsonl"))
    pl.seed_everything(0)
    callback = SriftyCallback(warmup_steps=2, profile_steps=8, verbose=False, min_measure_s=0)
    pl.Trainer(max_epochs=max_epochs, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
               callbacks=[callback]).fit(_Shuffled(False))  # fmt: skip
    newest = open_store(str(tmp_path / "store")).refs()[0]
    assert (newest.step, newest.reason) == saved
    lines = (tmp_path / "progress.jsonl").read_text().splitlines()
    done = [e for e in map(ProgressEvent.from_line, lines) if e.event == "profile-done"]
    assert [e.step for e in done] == [saved[0]]
    ended = (tmp_path / "state" / proto.TRAINING_ENDED_MARKER).exists()
    assert ended == (saved[1] == "final")


def test_validation_by_the_clock_does_not_hold_a_save(tmp_path: Path) -> None:
    """``val_check_interval`` as a time is read on each rank's own clock, so ranks could
    disagree on whether a pass is due: a save never waits for one (it would leave one
    rank saving and exiting while the other trains on). Batch-counted validation does."""
    from datetime import timedelta

    from lightning_srifty.capture.launch_mode import _save_waits_for

    class Recorder(pl.Callback):
        def __init__(self) -> None:
            self.waits: list[str | None] = []

        def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
            if trainer.fit_loop.epoch_loop.batch_progress.current.processed < 10:
                self.waits.append(_save_waits_for(trainer))  # not the epoch's last batch

    class Validated(_Shuffled):
        def validation_step(self, batch: object, batch_idx: int) -> None:
            return None

        def val_dataloader(self) -> object:
            return self.train_dataloader()

    for interval, expected in ((timedelta(seconds=0), None), (1, "validation")):
        recorder = Recorder()
        pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False,
                   default_root_dir=tmp_path, val_check_interval=interval,
                   num_sanity_val_steps=0, callbacks=[recorder]).fit(Validated(False))  # fmt: skip
        assert len(recorder.waits) == 9
        assert all((w is None) if expected is None else expected in str(w) for w in recorder.waits)


_DUMP_PROBE = """
import os, signal, sys, time
if sys.argv[1] == "own-handler":
    signal.signal(signal.SIGUSR2, lambda *_: print("own handler ran", flush=True))
from lightning_srifty.capture.launch_mode import dump_stacks_on_request
def stuck_here():
    dump_stacks_on_request()
    os.kill(os.getpid(), signal.SIGUSR2)
    time.sleep(0.5)
stuck_here()
print("alive after the dump", flush=True)
"""


@pytest.mark.parametrize("script", ["default", "own-handler"])
def test_a_stack_dump_request_leaves_the_job_running(script: str) -> None:
    """``kill -USR2`` writes the stacks and nothing else: SIGUSR2's default action ends
    a process, and chaining to it killed the ranks of a stuck job that was asked where
    it hung. A handler the script installed still runs."""
    done = subprocess.run([sys.executable, "-c", _DUMP_PROBE, script],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "alive after the dump" in done.stdout
    assert "stuck_here" in done.stderr  # the stack, written by faulthandler
    assert ("own handler ran" in done.stdout) == (script == "own-handler")
