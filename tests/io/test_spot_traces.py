"""Loading spot traces: the value reading checked on the real data, and bad files."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from statistics import median

import numpy as np
import pytest

from lightning_srifty.core.errors import CatalogError, TraceError
from lightning_srifty.io.spot_traces import (
    catalog_prices,
    load_trace,
    load_traces,
    trace_zone,
    zone_region,
)

SET_2023_02 = "availability-1node-p3.2xlarge-2023-02"


def write_trace(path: Path, data: object, gap: object = 60) -> Path:
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return path


def test_single_node_reading_reproduces_published_availability(shared_data: Path) -> None:
    files = sorted((shared_data / "spot-traces" / SET_2023_02).glob("*.json"))
    assert len(files) == 9
    tl = load_traces(files)
    avail = tl.available()
    per_zone = avail.mean(axis=1)
    any_zone = avail.any(axis=0).mean()
    # DESIGN.md (from the Can't Be Late paper): one zone 10-83 %, any zone 91 %.
    assert 0.09 <= per_zone.min() <= 0.11 and 0.82 <= per_zone.max() <= 0.84
    assert any_zone == pytest.approx(0.91, abs=0.01)
    # The other reading (value = instances available) does not fit those figures.
    raw = np.array([json.loads(f.read_text())["data"][: tl.ticks] for f in files])
    assert (raw == 1).any(axis=0).mean() > 0.98
    assert tl.gap_hours == pytest.approx(195 / 3600)
    assert tl.zones[0] == "us-east-1a"


def test_multi_node_traces_count_nodes_up(shared_data: Path) -> None:
    folder = shared_data / "spot-traces" / "preemption-4node-p3.2xlarge-2023-08"
    one = load_trace(folder / "us-west-2c_v100_1.json")
    raw = np.array(json.loads((folder / "us-west-2c_v100_1.json").read_text())["data"])
    assert one.capacity == 4
    assert np.array_equal(one.nodes_up[0], raw)
    # The whole gang is up exactly where all four nodes are.
    assert one.available().sum() == int((raw == 4).sum())
    both = load_traces(sorted(folder.glob("*.json")))
    assert both.capacity == 4 and both.ticks == min(
        len(json.loads(f.read_text())["data"]) for f in folder.glob("*.json")
    )


def test_zone_names_from_files() -> None:
    assert trace_zone("/x/us-east-1a_v100_1.json") == "us-east-1a"
    assert zone_region("us-west-2c") == "us-west-2"


def test_zones_with_different_gaps_are_resampled_to_the_coarsest(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "za_x.json", [0, 0, 1, 0, 0, 0], gap=60)
    b = write_trace(tmp_path / "zb_x.json", [0, 1, 0], gap=120)
    tl = load_traces([a, b])
    assert tl.gap_hours == pytest.approx(120 / 3600)
    assert tl.available().tolist() == [[True, False, True], [True, False, True]]


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"metadata": {"gap_seconds": 60}}, "data"),
        ({"metadata": {"gap_seconds": 60}, "data": [0, "x", 1]}, "data[1]"),
        ({"metadata": {"gap_seconds": 60}, "data": [0, 1, 0.5]}, "data[2]"),
        ({"metadata": {"gap_seconds": 60}, "data": [0, -1]}, "data[1]"),
        ({"metadata": {"gap_seconds": -5}, "data": [0, 1]}, "metadata.gap_seconds"),
        ({"metadata": {"gap_seconds": "5"}, "data": [0, 1]}, "metadata.gap_seconds"),
        ({"data": [0, 1]}, "metadata"),
        ({"metadata": {"gap_seconds": 60}, "data": []}, "data"),
    ],
)
def test_bad_trace_names_file_and_field(tmp_path: Path, doc: dict, field: str) -> None:  # type: ignore[type-arg]
    path = tmp_path / "us-east-1a_v100_1.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(path) in str(err.value)
    assert f"'{field}'" in str(err.value)


def test_truncated_or_missing_trace_names_file(tmp_path: Path) -> None:
    path = tmp_path / "us-east-1a_v100_1.json"
    path.write_text('{"metadata": {"gap_seconds": 60}, "data": [0, 1,')
    with pytest.raises(TraceError, match="truncated") as err:
        load_trace(path)
    assert str(path) in str(err.value)
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "nope.json")


def test_value_above_node_count_is_rejected(tmp_path: Path) -> None:
    folder = tmp_path / "preemption-2node-test"
    folder.mkdir()
    path = write_trace(folder / "z_x.json", [2, 1, 3, 0])
    with pytest.raises(TraceError, match=r"exceeds the trace's 2 node") as err:
        load_trace(path)
    assert "data[2]" in str(err.value)


def test_same_zone_twice_is_rejected(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "za_1.json", [0, 1])
    (tmp_path / "other").mkdir()
    b = write_trace(tmp_path / "other" / "za_2.json", [0, 1])
    with pytest.raises(TraceError, match="same zone"):
        load_traces([a, b])


def test_catalog_prices_are_region_medians_of_the_bundled_csv() -> None:
    import lightning_srifty

    csv_path = Path(lightning_srifty.__file__).parent / "data" / "aws_vms.csv"
    rows = [r for r in csv.DictReader(csv_path.open()) if r["InstanceType"] == "p3.2xlarge"]
    east = [float(r["SpotPrice"]) for r in rows if r["Region"] == "us-east-1" and r["SpotPrice"]]
    spot, ondemand = catalog_prices("p3.2xlarge", ["us-east-1", "us-east-1"])
    assert spot == (median(east), median(east))
    assert ondemand == min(float(r["Price"]) for r in rows if r["Region"] == "us-east-1")
    assert spot[0] < ondemand


def test_catalog_prices_unknown_type_or_region() -> None:
    with pytest.raises(CatalogError, match="unknown instance type"):
        catalog_prices("p99.huge", ["us-east-1"])
    with pytest.raises(CatalogError, match="mars-1"):
        catalog_prices("p3.2xlarge", ["mars-1"])
