"""Probe records: versioned JSON that round-trips, and bad files named in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_srifty.core.errors import SchemaError
from lightning_srifty.core.probing import PROBE_RECORD_SCHEMA_VERSION, ProbeRecord
from lightning_srifty.io.probe_io import load_probe_record, save_probe_record

RECORD = ProbeRecord(
    index=2, plan="1x g4dn.12xlarge", instance_type="g4dn.12xlarge", nodes=1,
    procs_per_node=2, stand_in=False, predicted_step_s=0.2, predicted_low_s=0.15,
    predicted_high_s=0.3, measured_step_s=0.41, steps=40, elapsed_s=95.0, cost_usd=0.1,
    allreduce=((65536, 2e-4), (1 << 22, 4e-3)), measured_gbps=7.5, predicted_gbps=30.0,
    measured_low_s=0.39, measured_high_s=0.45,
)  # fmt: skip


def test_a_probe_record_round_trips_through_versioned_json(tmp_path: Path) -> None:
    path = save_probe_record(RECORD, tmp_path / "probe-2.json")
    assert load_probe_record(path) == RECORD
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == PROBE_RECORD_SCHEMA_VERSION and doc["kind"] == "srifty-probe"
    nothing = ProbeRecord(3, "2x solo", "solo", 2, 1, True, 0.1, 0.08, 0.12, None, 0, 30.0, 0.01)
    assert load_probe_record(save_probe_record(nothing, tmp_path / "p3.json")) == nothing


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"schema_version": 7}, r"probe-2\.json.*schema_version.*upgrade lightning-srifty"),
        ({"kind": "srifty-calibration"}, r"probe-2\.json.*kind"),
        ({"measured_step_s": -1.0}, r"probe-2\.json.*measured_step_s"),
        ({"allreduce": [[1, 2, 3]]}, r"probe-2\.json.*allreduce.*\[bytes, seconds\]"),
        ({"nodes": 0}, r"probe-2\.json.*nodes"),
        ({"measured_low_s": "fast"}, r"probe-2\.json.*measured_low_s"),
    ],
)
def test_a_bad_probe_record_is_one_line_naming_file_and_field(
    tmp_path: Path, change: dict[str, object], expected: str
) -> None:
    path = tmp_path / "probe-2.json"
    path.write_text(json.dumps(RECORD.to_dict() | change))
    with pytest.raises(SchemaError, match=expected) as caught:
        load_probe_record(path)
    assert "\n" not in str(caught.value)


def test_a_truncated_probe_record_is_named(tmp_path: Path) -> None:
    path = tmp_path / "probe-1.json"
    path.write_text(json.dumps(RECORD.to_dict())[:40])
    with pytest.raises(SchemaError, match=r"probe-1\.json.*not valid JSON") as caught:
        load_probe_record(path)
    assert "\n" not in str(caught.value)
