"""The profiling run's view of a script's Trainer: what it fixes, LightningCLI, no callback.

Real ``lightning.Trainer`` objects and a real ``LightningCLI`` in this process, with the
wrapper installed only for the duration of each test.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

from lightning_srifty import SriftyCallback
from lightning_srifty.capture.script_facts import facts_for, installed
from lightning_srifty.core import launch_protocol as proto


def test_a_plain_script_fixes_what_it_passes(tmp_path: Path) -> None:
    with installed({}):
        trainer = pl.Trainer(devices=1, strategy="auto", num_nodes=1, logger=False,
                             default_root_dir=tmp_path)  # fmt: skip
    facts = facts_for(trainer)
    assert facts == {
        "entry_point": "script",
        "explicit": {"strategy": "auto", "devices": 1, "num_nodes": 1},
    }
    assert facts_for(pl.Trainer(logger=False, default_root_dir=tmp_path)) is None  # undone


def test_environment_defaults_are_not_the_scripts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PL_TRAINER_DEVICES", "1")
    with installed({}):
        trainer = pl.Trainer(logger=False, default_root_dir=tmp_path)
    facts = facts_for(trainer)
    assert facts is not None and facts["explicit"] == {}


def test_lightning_cli_counts_only_values_other_than_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("jsonargparse")
    from lightning.pytorch.cli import LightningCLI

    monkeypatch.chdir(tmp_path)
    env = {"PL_TRAINER_DEFAULT_ROOT_DIR": str(tmp_path / "run" / "lightning"),
           "PL_TRAINER_NUM_NODES": "1", "PL_TRAINER_DEVICES": "1"}  # fmt: skip
    with installed(env):
        cli = LightningCLI(
            BoringModel,
            BoringDataModule,
            run=False,
            args=["--trainer.strategy=ddp", "--trainer.logger=false"],
        )
    facts = facts_for(cli.trainer)
    assert facts == {"entry_point": "lightning_cli", "explicit": {"strategy": "ddp"}}
    # LightningCLI passed default_root_dir=None and devices="auto"; the launcher's values won.
    assert cli.trainer.default_root_dir == env["PL_TRAINER_DEFAULT_ROOT_DIR"]
    assert cli.trainer.num_devices == 1


def test_fit_without_the_callback_stops_before_training(tmp_path: Path) -> None:
    env = {proto.ENV_STATE_DIR: str(tmp_path / "state")}
    model = BoringModel()
    with installed(env):
        trainer = pl.Trainer(max_steps=5, logger=False, default_root_dir=tmp_path)
        with pytest.raises(SystemExit) as stopped:
            trainer.fit(model)
    assert stopped.value.code == proto.NO_CALLBACK_EXIT_CODE
    assert "SriftyCallback" in (tmp_path / "state" / proto.NO_CALLBACK_MARKER).read_text()
    assert trainer.global_step == 0


def test_fit_with_the_callback_trains(tmp_path: Path) -> None:
    with installed({}):
        trainer = pl.Trainer(max_steps=3, logger=False, default_root_dir=tmp_path,
                             enable_checkpointing=False, enable_progress_bar=False,
                             callbacks=[SriftyCallback(warmup_steps=1, profile_steps=1,
                                                       verbose=False)])  # fmt: skip
        trainer.fit(BoringModel())
    assert trainer.global_step == 3


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="needs a process that sees no GPU"
)
@pytest.mark.parametrize(
    ("hidden", "said"),
    [(True, "the local backend runs every process on this machine's CPU"),
     (False, "this machine has no GPU to profile on")],
    ids=["local-backend", "no-gpu"],
)  # fmt: skip
def test_a_trainer_fixed_to_a_gpu_that_is_not_there_stops_in_one_line(
    hidden: bool, said: str, tmp_path: Path
) -> None:
    """Lightning's own error says "No supported gpu backend found!" and nothing of what
    to do (seen profiling Lightning's ``generative_adversarial_net.py``)."""
    env = {proto.ENV_STATE_DIR: str(tmp_path / "state")}
    if hidden:
        env["CUDA_VISIBLE_DEVICES"] = ""
    with installed(env), pytest.raises(SystemExit) as stopped:
        pl.Trainer(accelerator="gpu", devices=1, logger=False, default_root_dir=tmp_path)
    assert stopped.value.code == proto.NO_GPU_EXIT_CODE
    marker = (tmp_path / "state" / proto.NO_GPU_FOR_PROFILE_MARKER).read_text()
    assert "Trainer(accelerator='gpu')" in marker and said in marker
    assert "leave accelerator= out" in marker


def test_a_trainer_that_fails_for_another_reason_raises_its_own_error(tmp_path: Path) -> None:
    env = {proto.ENV_STATE_DIR: str(tmp_path / "state")}
    with installed(env), pytest.raises(Exception, match="precision") as raised:
        pl.Trainer(accelerator="cpu", precision="bogus", logger=False, default_root_dir=tmp_path)
    assert not isinstance(raised.value, SystemExit)
    assert not (tmp_path / "state" / proto.NO_GPU_FOR_PROFILE_MARKER).exists()
