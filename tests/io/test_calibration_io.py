"""Calibration files: round trip, every malformed file named, and the shipped default."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lightning_srifty.core.calibration import (
    CALIBRATION_SCHEMA_VERSION,
    EVERY_ACCELERATOR,
    Calibration,
    HardwareTerms,
    ProbedStep,
)
from lightning_srifty.core.errors import CalibrationError
from lightning_srifty.io.calibration_io import (
    calibration_or_default,
    load_calibration,
    load_default_calibration,
    save_calibration,
)
from lightning_srifty.io.traces import load_traces


@pytest.fixture(scope="module")
def default() -> Calibration:
    return load_default_calibration()


def test_the_default_calibration_round_trips_through_json(
    default: Calibration, tmp_path: Path
) -> None:
    path = save_calibration(default, tmp_path / "cal.json")
    assert load_calibration(path) == default
    assert json.loads(path.read_text())["schema_version"] == CALIBRATION_SCHEMA_VERSION
    assert calibration_or_default(None) == default
    assert calibration_or_default(path) == default


def test_the_default_names_where_it_came_from(default: Calibration) -> None:
    assert {s.name for s in default.sources} == {
        "pollux-traces",
        "sia-traces/dgx-ext",
        "sia-traces/quad",
    }
    assert default.rows == sum(s.rows for s in default.sources)
    assert len({s.fingerprint for s in default.sources}) == 3
    assert set(default.fitted_on) == {"bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"}


def test_the_defaults_provenance_matches_the_shared_data(
    default: Calibration, shared_data: Path
) -> None:
    for source in default.sources:
        traces = load_traces(shared_data / source.name)
        assert traces.hardware.fingerprint == source.fingerprint
        multi = sum(1 for rows in traces.rows.values() for r in rows if r.replicas > 1)
        assert multi == source.rows


def test_probed_hardware_terms_round_trip_and_are_checked(
    default: Calibration, tmp_path: Path
) -> None:
    slower = dataclasses.replace(default.physics, tcp_efficiency=0.1, colocation_slowdown=0.3)
    probed = dataclasses.replace(
        default,
        hardware_terms=(HardwareTerms("g4dn.12xlarge", slower, 3, ("tcp_efficiency",)),),
    )
    path = save_calibration(probed, tmp_path / "cal.json")
    again = load_calibration(path)
    assert again == probed and again.physics_on("g4dn.12xlarge") == slower
    doc = probed.to_dict()
    doc["hardware_terms"][0]["evidence"] = ["warp_speed"]
    _write(path, doc)
    with pytest.raises(CalibrationError, match=r"cal\.json.*hardware_terms\[0\]\.evidence"):
        load_calibration(path)


def test_per_gpu_measured_compute_scales_round_trip_and_are_checked(
    default: Calibration, tmp_path: Path
) -> None:
    job = dataclasses.replace(
        default.jobs[0],
        compute_scale=1.2,
        accelerator=EVERY_ACCELERATOR,
        measured_scales=(("A100", 1.8), ("Quadro RTX 6000", 0.8)),
    )
    refitted = dataclasses.replace(default, jobs=(job, *default.jobs[1:]))
    path = save_calibration(refitted, tmp_path / "cal.json")
    assert load_calibration(path) == refitted
    doc = refitted.to_dict()
    doc["jobs"][0]["measured_scales"] = [["A100", -1.0]]
    _write(path, doc)
    with pytest.raises(CalibrationError, match=r"cal\.json.*jobs\[0\]\.measured_scales.*positive"):
        load_calibration(path)
    # a file without per-GPU scales (written before them) reads as before
    assert "measured_scales" not in default.to_dict()["jobs"][0]


def test_probed_shapes_round_trip_and_a_step_outside_its_spread_is_named(
    default: Calibration, tmp_path: Path
) -> None:
    probe = ProbedStep("bert", "g5.xlarge", 1, 1, 16, 0.20, 0.19, 0.22)
    refitted = dataclasses.replace(default, probed=(probe,))
    path = save_calibration(refitted, tmp_path / "cal.json")
    assert load_calibration(path) == refitted
    doc = refitted.to_dict()
    doc["probed"][0]["low_s"] = 0.25
    _write(path, doc)
    with pytest.raises(CalibrationError, match=r"cal\.json.*probed\[0\]\.step_s.*low_s"):
        load_calibration(path)
    doc["probed"][0] = {**probe.to_dict(), "nodes": 0}
    _write(path, doc)
    with pytest.raises(CalibrationError, match=r"probed\[0\]\.nodes"):
        load_calibration(path)
    # a file written before probed shapes were kept reads as none
    del doc["probed"]
    _write(path, doc)
    assert load_calibration(path).probed == ()


def _write(path: Path, doc: dict) -> Path:  # type: ignore[type-arg]
    path.write_text(json.dumps(doc))
    return path


def test_other_schema_versions_and_bad_fields_name_the_file_and_field(
    default: Calibration, tmp_path: Path
) -> None:
    doc = default.to_dict()
    path = tmp_path / "cal.json"
    _write(path, doc | {"schema_version": 99})
    with pytest.raises(CalibrationError, match="upgrade lightning-srifty"):
        load_calibration(path)
    _write(path, doc | {"schema_version": 2})
    with pytest.raises(CalibrationError, match=r"cal\.json.*schema_version.*re-run srifty"):
        load_calibration(path)
    _write(path, doc | {"physics": doc["physics"] | {"tail_fraction": 2.0}})
    with pytest.raises(CalibrationError, match=r"cal\.json.*physics\.tail_fraction"):
        load_calibration(path)
    _write(path, doc | {"physics": doc["physics"] | {"tcp_efficiency": 5.0}})
    with pytest.raises(CalibrationError, match=r"physics\.tcp_efficiency.*efficiency"):
        load_calibration(path)
    physics = dict(doc["physics"])
    del physics["tcp_flow_gbps"]
    _write(path, doc | {"physics": physics})
    with pytest.raises(CalibrationError, match=r"cal\.json.*physics\.tcp_flow_gbps.*missing"):
        load_calibration(path)
    _write(path, doc | {"sources": [{"name": "x"}]})
    with pytest.raises(CalibrationError, match=r"sources\[?0?\]?.*fingerprint"):
        load_calibration(path)
    if doc["correction"] is not None:
        corr = doc["correction"] | {"feature_names": ["x"]}
        _write(path, doc | {"correction": corr})
        with pytest.raises(CalibrationError, match="feature_names"):
            load_calibration(path)
    path.write_text("{not json")
    with pytest.raises(CalibrationError, match=r"cal\.json"):
        load_calibration(path)
