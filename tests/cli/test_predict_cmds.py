"""``srifty predict | calibrate | validate`` end to end through ``main([...])``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_srifty.cli.main import main
from lightning_srifty.core.profile import Memory
from lightning_srifty.io.profile_io import save_profile
from lightning_srifty.io.traces import coarse_profile, load_traces
from tests.io.test_traces import SYNTHETIC_MODELS, planted_step, write_synthetic_traces


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_traces(tmp_path_factory.mktemp("cli") / "traces", noise=0.02)


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


def test_predict_a_trace_model_on_a_placement(shared_data: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    model = shared_data / "pollux-traces" / "bert"
    rc = main(
        [
            "predict",
            "--trace-model",
            str(model),
            "--placement",
            "4444",
            "--local-bsz",
            "8",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["world_size"] == 16 and out["global_batch"] == 128
    assert out["low_s"] <= out["step_s"] <= out["high_s"]
    assert out["step_s"] >= out["compute_s"] > 0.6  # bert's one-GPU compute at b=8 is 0.69 s


def test_calibrate_then_predict_and_validate(traces: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cal = tmp_path / "cal.json"
    assert main(["calibrate", "--traces", str(traces), "--out", str(cal)]) == 0
    out = capsys.readouterr().out
    assert "calibrated on" in out
    # how the fit differs from the shipped default, constant by constant
    assert "default" in out and "this fit" in out and "tcp_efficiency" in out
    assert json.loads(cal.read_text())["kind"] == "srifty-calibration"

    args = [
        "predict",
        "--trace-model",
        str(traces / "beta"),
        "--placement",
        "4444",
        "--local-bsz",
        "16",
        "--json",
    ]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--calibration", str(cal)]) == 0
    tuned = json.loads(capsys.readouterr().out)
    # without --calibration the shipped default predicts; calibrating on this very
    # cluster's rows must bring the prediction closer to what was planted
    params, alpha, beta = SYNTHETIC_MODELS["beta"]
    truth = planted_step(params, alpha, beta, "4444", 16)
    assert abs(tuned["step_s"] - truth) < abs(plain["step_s"] - truth)
    assert tuned["step_s"] == pytest.approx(truth, rel=0.1)
    assert tuned["effective_network_gbps"] > 0 and plain["links"]

    assert (
        main(
            [
                "validate",
                "--traces",
                str(traces),
                "--protocol",
                "lomo",
                "--json",
                "--models",
                "beta",
                "gamma",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["models"]) == {"beta", "gamma"}
    assert summary["overall"]["median_ape"] < 0.05


def test_validate_prints_a_table(traces: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    rc = main(
        [
            "validate",
            "--traces",
            str(traces),
            "--protocol",
            "scale-out",
            "--models",
            "delta",
            "--no-learned",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "delta" in out and "overall" in out


def test_missing_column_is_one_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    root = write_synthetic_traces(tmp_path / "t")
    csv = root / "alpha" / "placements.csv"
    csv.write_text(csv.read_text().replace("sync_time", "sync_s", 1))
    rc = main(["validate", "--traces", str(root), "--protocol", "lomo"])
    assert rc == 2
    err = _one_error_line(capsys)
    assert "missing column 'sync_time'" in err and "placements.csv" in err


def test_nan_row_is_one_line_with_its_row(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    root = write_synthetic_traces(tmp_path / "t")
    csv = root / "beta" / "placements.csv"
    lines = csv.read_text().splitlines()
    lines[3] = "11,4,nan,0.1"
    csv.write_text("\n".join(lines) + "\n")
    rc = main(["calibrate", "--traces", str(root), "--out", str(tmp_path / "c.json")])
    assert rc == 2 and "row 3" in _one_error_line(capsys)


def test_unknown_trace_model_is_one_line(traces: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    rc = main(["predict", "--trace-model", str(traces / "nosuch"), "--placement", "11"])
    assert rc == 2 and "model 'nosuch' has no entry" in _one_error_line(capsys)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--cluster", "g4dn.12xlarge"], "TYPE:N"),
        (["--placement", "40"], "--placement"),
        (["--placement", "55"], "has 4"),
        (["--cluster", "g4dn.12xlarge:3", "--placement", "44"], "3 nodes"),
        (["--local-bsz", "0"], "--local-bsz"),
    ],
)
def test_bad_flags_are_one_line(traces: Path, capsys, extra: list[str], needle: str) -> None:  # type: ignore[no-untyped-def]
    rc = main(["predict", "--trace-model", str(traces / "alpha"), *extra])
    assert rc == 2 and needle in _one_error_line(capsys)


def test_unknown_instance_type_is_one_line(traces: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    rc = main(["predict", "--trace-model", str(traces / "alpha"), "--cluster", "g4dn.12xlarg:2"])
    assert rc == 2
    assert "g4dn.12xlarg" in _one_error_line(capsys)


def test_model_that_does_not_fit_is_one_line(traces: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    t = load_traces(traces, models=["alpha"])
    profile = coarse_profile(t.models["alpha"], t.single_gpu_rows("alpha"), t.hardware)
    huge = Memory(14 * 1024**3, 0, 0, 8 * 1024**3, 0, "unknown")
    path = save_profile(
        profile.__class__(**{**profile.__dict__, "memory": huge}), tmp_path / "p.json"
    )
    rc = main(["predict", "--profile", str(path), "--cluster", "g4dn.12xlarge:1"])
    assert rc != 0
    err = _one_error_line(capsys)
    assert "GiB" in err or "catalog" in err


def test_calibrate_needs_an_input(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["calibrate", "--out", str(tmp_path / "c.json")]) == 2
    assert "--traces" in _one_error_line(capsys)
