"""``srifty profile show`` on a profile from a real training run, and on bad files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest

from lightning_srifty.cli.main import main
from lightning_srifty.cli.profile_cmd import phase_split
from lightning_srifty.io.profile_io import load_profile

REPO = Path(__file__).resolve().parents[2]
SRIFTY = Path(sys.executable).parent / "srifty"


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightning_srifty import SriftyCallback
    from tests.capture.conftest import load_digits_example

    digits = load_digits_example()
    root = tmp_path_factory.mktemp("show")
    callback = SriftyCallback(warmup_steps=2, profile_steps=5, verbose=False,
                              env={"SRIFTY_IMDS": "off"})  # fmt: skip
    pl.seed_everything(0)
    pl.Trainer(
        max_steps=8,
        accelerator="cpu",
        devices=1,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[callback],
    ).fit(digits.DigitsModule(hidden=64), datamodule=digits.DigitsDataModule(batch_size=32))
    assert callback.written_path is not None
    return callback.written_path


def test_show_prints_split_layers_and_memory(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profile", "show", str(profile_path), "--top", "2"]) == 0
    out = capsys.readouterr().out
    profile = load_profile(profile_path)
    for phase in ("forward", "backward", "optimizer", "data wait", "communication"):
        assert phase in out
    ranked = sorted(profile.layers, key=lambda x: x.forward_s + x.backward_s, reverse=True)
    layer_table = out.split("Top 2 layers by time")[1].split("memory:")[0]
    assert ranked[0].name in layer_table and ranked[1].name in layer_table
    assert not any(layer.name in layer_table for layer in ranked[2:])
    assert "memory:" in out and "cpu_rss" in out and "DigitsModule" in out


def test_phase_split_covers_the_step(profile_path: Path) -> None:
    profile = load_profile(profile_path)
    split = phase_split(profile)
    assert sum(seconds for _, seconds, _ in split) >= profile.steps.step.mean_s * 0.999
    assert all(0 <= share <= 1 for _, _, share in split)


def test_show_json_is_the_parsed_profile(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profile", "show", str(profile_path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(profile_path.read_text())


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"schema_version": 1, "kind": "detail', "truncated"),
        ('{"schema_version": 7, "kind": "detailed"}', "schema_version"),
        ('{"schema_version": 1, "kind": "detailed", "grad_bytes": "many"}', "environment"),
    ],
)
def test_bad_file_is_one_line_and_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, needle: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    code = main(["profile", "show", str(bad)])
    err = capsys.readouterr().err
    assert code != 0
    assert err.count("\n") == 1 and str(bad) in err and needle in err
    assert "Traceback" not in err


def test_wrong_field_type_names_the_field(
    profile_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(profile_path.read_text())
    data["memory"]["peak_bytes"] = "lots"
    bad = tmp_path / "typed.json"
    bad.write_text(json.dumps(data))
    assert main(["profile", "show", str(bad)]) != 0
    assert "peak_bytes" in capsys.readouterr().err


def test_console_script_reports_missing_file_without_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    done = subprocess.run(
        [str(SRIFTY), "profile", "show", str(missing)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and str(missing) in done.stderr


def test_negative_top_is_a_flag_error(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profile", "show", str(profile_path), "--top", "-1"]) != 0
    assert "--top" in capsys.readouterr().err


def test_show_says_which_float32_math_the_plan_assumes(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The digits run left PyTorch's default: FP32 matmuls, with the one call that
    would let an Ampere or Hopper target use TF32."""
    assert main(["profile", "show", str(profile_path)]) == 0
    flat = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    line = flat.split("float32 math: ")[1].split(" step ")[0]
    assert "matmuls FP32 (float32_matmul_precision 'highest')" in line
    assert "convolutions/RNNs TF32" in line
    assert 'set_float32_matmul_precision("high")' in line


def test_show_says_what_the_loaders_workers_cost_and_the_step_they_allow(
    profile_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(profile_path.read_text())
    assert data["data_loading"] is None  # the digits loader runs in the training process
    assert main(["profile", "show", str(profile_path)]) == 0
    assert "data loading:" not in capsys.readouterr().out
    data["data_loading"] = {"workers": 4, "cpu_s_per_batch": 0.02, "batches": 30}
    path = tmp_path / "loaded.json"
    path.write_text(json.dumps(data))
    assert main(["profile", "show", str(path)]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    line = flat.split("data loading: ")[1]
    assert line.startswith("4 worker(s), 20.000 ms of CPU per batch (30 batches)")
    assert "no step shorter than 5.000 ms" in line
    assert "one for training" in line  # the floor's premise (core/perfmodel.loader_floor_s)


def test_show_splits_a_gpu_profiles_layer_time_into_work_and_latency(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The H100's cifar10 profile: its step grew 0.04 ms a sample from batch 129
    (``steps.json``), so about 5 of its 10.7 ms of layer time is work; the rest is
    latency a plan keeps. A CPU profile has no datasheet roofline: no line."""
    h100 = REPO / "benchmarks" / "gpu" / "h100-2026-11-27" / "profile-cifar10.json"
    assert main(["profile", "show", str(h100), "--top", "0"]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    line = flat.split("layer time: ")[1]
    work = float(line.split(" ms of work")[0])
    latency = float(line.split(" ms of latency")[0].split(" and ")[-1])
    layers = load_profile(h100).layers
    assert work + latency == pytest.approx(
        1e3 * sum(x.forward_s + x.backward_s for x in layers), abs=0.002
    )
    assert 3.0 < work < 7.0 and latency > work
    assert main(["profile", "show", str(profile_path)]) == 0
    assert "layer time:" not in capsys.readouterr().out
