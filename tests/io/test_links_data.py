"""Internal consistency of the bundled link tables (``network_specs.csv``, ``gpu_specs.csv``).

The performance model turns each instance type into absolute link figures from these two
tables, so a row that contradicts itself (an NVLink figure on a PCIe box, more EFAs than
network cards, a burst peak below the baseline) would silently skew every prediction. The
checks read the files with the csv module only (the loader is tested elsewhere) and compare
the tables with each other and with ``aws_vms.csv``; they copy no figure from the tables.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from importlib import resources

import pytest

GPU_INTERCONNECTS = ("NVSwitch", "NVLink", "PCIe", "none")
NVLINK_KINDS = ("NVSwitch", "NVLink")


def _bundled_rows(name: str) -> list[dict[str, str]]:
    text = (resources.files("lightning_srifty") / "data" / name).read_text(encoding="utf-8")
    return list(csv.DictReader(io.StringIO(text)))


def _accelerator_per_type() -> dict[str, tuple[str, float]]:
    """AcceleratorName and AcceleratorCount per instance type (one catalog row per zone)."""
    seen: dict[str, tuple[str, float]] = {}
    for row in _bundled_rows("aws_vms.csv"):
        value = (row["AcceleratorName"], float(row["AcceleratorCount"]))
        previous = seen.setdefault(row["InstanceType"], value)
        assert previous == value, f"{row['InstanceType']}: accelerator differs across zones"
    return seen


def _as_int(row: dict[str, str], column: str) -> int:
    text = row[column].strip()
    assert text.isdigit(), f"{row.get('instance_type') or row.get('name')}: {column}={text!r}"
    return int(text)


def _as_float(row: dict[str, str], column: str) -> float:
    return float(row[column])


@pytest.fixture(scope="module")
def network() -> list[dict[str, str]]:
    return _bundled_rows("network_specs.csv")


@pytest.fixture(scope="module")
def gpus() -> dict[str, dict[str, str]]:
    rows = _bundled_rows("gpu_specs.csv")
    counts = Counter(r["name"] for r in rows)
    assert not [n for n, c in counts.items() if c > 1], f"duplicate GPU rows: {counts}"
    return {r["name"]: r for r in rows}


def test_every_catalog_type_has_exactly_one_row(network: list[dict[str, str]]) -> None:
    counts = Counter(r["instance_type"] for r in network)
    catalog = set(_accelerator_per_type())
    assert {t for t, c in counts.items() if c != 1} == set()
    assert set(counts) == catalog, (
        f"missing: {sorted(catalog - set(counts))}, extra: {sorted(set(counts) - catalog)}"
    )


def test_new_network_columns_parse(network: list[dict[str, str]]) -> None:
    for row in network:
        name = row["instance_type"]
        assert _as_float(row, "peak_gbps") > 0, name
        assert _as_int(row, "network_cards") >= 1, name
        assert _as_int(row, "efa_interfaces") >= 0, name
        assert row["gpu_interconnect"] in GPU_INTERCONNECTS, (name, row["gpu_interconnect"])
        assert _as_float(row, "nvlink_gbytes_s") >= 0, name
        assert row["pcie_gen"] == "" or _as_int(row, "pcie_gen") >= 1, name
        assert row["burst"] in ("true", "false"), name
        assert row["links_source"].strip(), f"{name}: empty links_source"


def test_peak_is_never_below_the_baseline(network: list[dict[str, str]]) -> None:
    low = [r["instance_type"] for r in network if float(r["peak_gbps"]) < float(r["gbps"])]
    assert low == []


def test_efa_interfaces_fit_on_the_network_cards(network: list[dict[str, str]]) -> None:
    # AWS EC2 User Guide, "Network cards": "You can assign up to one EFA per network card".
    over = [
        r["instance_type"]
        for r in network
        if _as_int(r, "efa_interfaces") > _as_int(r, "network_cards")
    ]
    assert over == []


def test_interconnect_agrees_with_link_and_accelerator_count(
    network: list[dict[str, str]],
) -> None:
    accelerators = _accelerator_per_type()
    for row in network:
        name, kind = row["instance_type"], row["gpu_interconnect"]
        count = accelerators[name][1]
        nvlink = _as_float(row, "nvlink_gbytes_s")
        if kind in NVLINK_KINDS:
            assert nvlink > 0, f"{name}: {kind} without an NVLink figure"
            assert row["intra_node_link"] == "NVLink", name
        else:
            assert nvlink == 0, f"{name}: NVLink figure on a {kind} row"
            assert row["intra_node_link"] == kind, (name, row["intra_node_link"], kind)
        if kind == "none":
            assert count <= 1, f"{name}: {count} accelerators marked 'none'"
        else:
            assert count > 1, f"{name}: {count} accelerator marked {kind}"


def test_network_link_figures_match_the_gpu_table(
    network: list[dict[str, str]], gpus: dict[str, dict[str, str]]
) -> None:
    accelerators = _accelerator_per_type()
    for row in network:
        name = row["instance_type"]
        gpu = gpus.get(accelerators[name][0])
        if gpu is None:
            assert row["gpu_interconnect"] not in NVLINK_KINDS, name
            continue
        if row["pcie_gen"]:
            assert row["pcie_gen"] == gpu["pcie_gen"], name
        if row["gpu_interconnect"] in NVLINK_KINDS:
            assert float(row["nvlink_gbytes_s"]) == float(gpu["nvlink_gbytes_s"]), name


def test_new_gpu_columns_parse(gpus: dict[str, dict[str, str]]) -> None:
    for name, row in gpus.items():
        assert _as_int(row, "pcie_gen") >= 1, name
        assert _as_float(row, "nvlink_gbytes_s") >= 0, name
        assert _as_int(row, "tdp_w") > 0, name
        assert row["trainable"] in ("true", "false"), name
        assert row["source"].strip(), f"{name}: empty source"
