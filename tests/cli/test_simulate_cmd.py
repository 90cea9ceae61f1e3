"""``srifty simulate``: JSON output, prices, and one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_srifty.cli.main import main

GAP_S = 180


def write_trace(path: Path, data: list[int]) -> Path:
    path.write_text(json.dumps({"metadata": {"gap_seconds": GAP_S}, "data": data}))
    return path


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_fields_on_synthetic_always_up_zone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "us-east-1a_v100_1.json", [0] * 400)  # 0 = available
    doc = run_json(
        capsys, "--trace", str(trace), "--job-hours", "5", "--deadline-hours", "8",
        "--spot-price-ratio", "0.25",
    )  # fmt: skip
    expected = {
        "schema_version", "policy", "zones", "cost", "ondemand_cost", "cost_ratio",
        "finish_hours", "deadline_met", "preemptions", "migrations", "events", "nodes",
    }  # fmt: skip
    assert expected <= set(doc)
    assert doc["policy"] == "srifty" and doc["zones"] == ["us-east-1a"]
    # p3.2xlarge on-demand in us-east-1 is $3.06/h in the bundled catalog.
    assert doc["cost"] == pytest.approx(0.25 * 3.06 * (5 + 0.2))
    assert doc["ondemand_cost"] == pytest.approx(3.06 * 5.2)
    assert doc["cost_ratio"] == pytest.approx(0.25)
    assert doc["deadline_met"] is True and doc["finish_hours"] == pytest.approx(5.2)
    assert doc["events"][0]["to"] == "spot:us-east-1a"


def test_migration_log_in_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_trace(tmp_path / "us-east-1a_v100_1.json", [0] * 40 + [1] * 400)
    b = write_trace(tmp_path / "us-east-1c_v100_1.json", [0] * 440)
    doc = run_json(capsys, "--trace", str(a), str(b), "--job-hours", "6", "--deadline-hours", "9")
    assert doc["preemptions"] == 1 and doc["migrations"] == 1
    move = doc["events"][1]
    assert (move["from"], move["to"], move["tick"]) == ("spot:us-east-1a", "spot:us-east-1c", 40)
    assert move["lost_hours"] == pytest.approx(0.2)


def test_real_traces_table_and_json(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = shared_data / "spot-traces" / "availability-1node-p3.2xlarge-2023-02"
    traces = [str(p) for p in sorted(folder.glob("*.json"))]
    doc = run_json(capsys, "--trace", *traces, "--job-hours", "12", "--deadline-hours", "18",
                   "--policy", "uniform-progress", "--start-hour", "24")  # fmt: skip
    assert doc["deadline_met"] is True and len(doc["zones"]) == 9
    assert 0 < doc["cost_ratio"] <= 1.0 + 1e-9
    assert (
        main(["simulate", "--trace", *traces, "--job-hours", "12", "--deadline-hours", "18"]) == 0
    )
    assert "deadline met" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--job-hours", "5", "--deadline-hours", "4"], "--deadline-hours"),
        (["--job-hours", "-1", "--deadline-hours", "4"], "--job-hours"),
        (["--job-hours", "1", "--deadline-hours", "4", "--spot-price-ratio", "2"],
         "--spot-price-ratio"),
        (["--job-hours", "1", "--deadline-hours", "4", "--start-hour", "9999"], "--start-hour"),
        (["--job-hours", "1", "--deadline-hours", "4", "--home-zone", "x"], "--home-zone"),
        (["--job-hours", "1", "--deadline-hours", "4", "--checkpoint", "periodic"],
         "--checkpoint-cost-hours"),
        (["--job-hours", "1", "--deadline-hours", "4", "--instance-type", "p99.x"], "p99.x"),
    ],
)  # fmt: skip
def test_bad_flags_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    trace = write_trace(tmp_path / "us-east-1a_v100_1.json", [0] * 100)
    assert main(["simulate", "--trace", str(trace), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_bad_trace_file_names_file_and_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "us-east-1a_v100_1.json"
    bad.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [0, 1, "up"]}))
    assert main(["simulate", "--trace", str(bad), "--job-hours", "1", "--deadline-hours", "2"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "data[2]" in err and "Traceback" not in err
