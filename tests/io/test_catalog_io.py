"""Loading the catalog (bundled snapshot, SkyPilot's local copy, a path) and spec tables."""

from __future__ import annotations

import ast
import csv
import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from lightning_srifty.core.catalog import predicted_speed_ratio
from lightning_srifty.core.errors import CatalogError, TraceError
from lightning_srifty.io.catalog_io import (
    BUNDLED_SOURCE,
    load_catalog,
    load_gpu_specs,
    load_network_specs,
    load_spot_bands,
)
from lightning_srifty.io.lambda_bench import load_lambda_benchmark, single_gpu_throughput

BUNDLED_VMS = Path(str(resources.files("lightning_srifty") / "data" / "aws_vms.csv"))


def _vms_rows() -> list[dict[str, str]]:
    with BUNDLED_VMS.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _write_csv(path: Path, rows: list[dict[str, str]], columns: list[str]) -> Path:
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture
def sky_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ``SKY_RUNTIME_DIR`` that SkyPilot's catalog functions resolve to.

    SkyPilot resolves its catalog folder once, at import, from ``SKY_RUNTIME_DIR``; the
    module constant is re-resolved with SkyPilot's own helper under the new variable.
    """
    common = pytest.importorskip("sky.catalog.common")
    from sky.skylet import constants, runtime_utils

    monkeypatch.setenv("SKY_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = runtime_utils.get_runtime_dir_path(
        os.path.join(".sky/catalogs", constants.CATALOG_SCHEMA_VERSION)
    )
    monkeypatch.setattr(common, "_ABSOLUTE_VERSIONED_CATALOG_DIR", folder)
    return tmp_path


def test_bundled_snapshot_loads_offline(sky_runtime: Path) -> None:
    catalog = load_catalog("auto")
    assert catalog.source == BUNDLED_SOURCE
    assert len(catalog.types()) == 73
    assert len(catalog.regions()) == 23
    assert len(catalog) == len(_vms_rows())
    assert not any(sky_runtime.iterdir()), "loading must not create SkyPilot files"


def test_skypilot_catalog_file_is_read_when_present(sky_runtime: Path) -> None:
    target = sky_runtime / ".sky" / "catalogs" / "v8" / "aws" / "vms.csv"
    target.parent.mkdir(parents=True)
    rows = _vms_rows()
    edited = next(i for i, r in enumerate(rows) if r["InstanceType"] == "p3.2xlarge")
    rows[edited]["Price"] = "123.45"
    _write_csv(target, rows, list(rows[0]))

    catalog = load_catalog("skypilot")
    assert str(target) in catalog.source
    offer = catalog.offer("p3.2xlarge", zone=rows[edited]["AvailabilityZone"])
    assert offer.ondemand_price == 123.45
    assert len(catalog) == len(rows)
    assert load_catalog("auto").source == catalog.source


def test_skypilot_catalog_with_renamed_column_names_column_and_file(sky_runtime: Path) -> None:
    target = sky_runtime / ".sky" / "catalogs" / "v8" / "aws" / "vms.csv"
    target.parent.mkdir(parents=True)
    rows = _vms_rows()[:20]
    for row in rows:
        row["Zone"] = row.pop("AvailabilityZone")
    _write_csv(target, rows, list(rows[0]))
    with pytest.raises(CatalogError) as info:
        load_catalog("auto")
    assert "'AvailabilityZone'" in str(info.value) and str(target) in str(info.value)


def test_catalog_path_matches_skypilot_without_importing_it(tmp_path: Path) -> None:
    """Same path as SkyPilot's own lookup; planning never imports ``sky`` for it."""
    script = (
        "import json, sys\n"
        "from lightning_srifty.io.catalog_io import load_catalog, skypilot_catalog_path\n"
        "ours = str(skypilot_catalog_path())\n"
        "load_catalog('auto')\n"
        "imported = 'sky' in sys.modules\n"
        "from sky.catalog import common\n"
        "print(json.dumps([ours, common.get_catalog_path('aws/vms.csv'), imported]))\n"
    )
    env = {**os.environ, "SKY_RUNTIME_DIR": str(tmp_path / "runtime")}
    done = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    ours, theirs, imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert ours == theirs == str(tmp_path / "runtime" / ".sky/catalogs/v8/aws/vms.csv")
    assert imported is False


def test_skypilot_source_without_local_catalog_never_downloads(sky_runtime: Path) -> None:
    with pytest.raises(CatalogError, match="never downloaded"):
        load_catalog("skypilot")
    assert not (sky_runtime / ".sky").exists()


@pytest.mark.parametrize(
    ("drop", "rename"), [("SpotPrice", None), ("Price", "PriceUSD"), ("GpuInfo", "GPUInfo")]
)
def test_missing_or_renamed_column_names_column_and_file(
    tmp_path: Path, drop: str, rename: str | None
) -> None:
    rows = _vms_rows()[:5]
    columns = [c for c in rows[0] if c != drop] + ([rename] if rename else [])
    if rename:
        for row in rows:
            row[rename] = row[drop]
    path = _write_csv(tmp_path / "vms.csv", rows, columns)
    with pytest.raises(CatalogError) as info:
        load_catalog(path)
    assert f"'{drop}'" in str(info.value) and str(path) in str(info.value)


def test_bad_price_cell_names_line_and_column(tmp_path: Path) -> None:
    rows = _vms_rows()[:10]
    rows[6]["Price"] = "1,2"
    path = _write_csv(tmp_path / "vms.csv", rows, list(rows[0]))
    with pytest.raises(CatalogError, match=r"line 8: column 'Price' is '1,2', not a number"):
        load_catalog(path)


def test_unknown_source_name_says_what_is_valid(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="valid sources: auto, skypilot, bundled"):
        load_catalog(tmp_path / "nope.csv")


def test_known_quirks_of_the_real_catalog_load() -> None:
    catalog = load_catalog("bundled")
    p5e = catalog.offers_of("p5e.48xlarge")
    assert all(o.ondemand_price is None for o in p5e)
    assert any(o.spot_price is None for o in catalog.offers)
    not_trainable = {o.accelerator for o in catalog.offers if not catalog.is_trainable(o)}
    for name in ("Inferentia", "Trainium", "Gaudi HL-205", "Qualcomm AI100", "T4g"):
        assert name in not_trainable
    assert {o.accelerator for o in catalog.gpu_offers()} >= {"T4", "V100", "A100", "H100"}
    g6f = catalog.offer("g6f.large")
    assert g6f.accelerator_fraction == 0.125 and not catalog.is_trainable(g6f)
    assert catalog.offer("p4d.24xlarge").intra_node_link == "NVLink"
    assert catalog.offer("g4dn.12xlarge").intra_node_link == "PCIe"
    assert catalog.offer("p3.2xlarge").intra_node_link == "none"


def test_gpu_memory_from_gpu_info_and_spec_fallback(tmp_path: Path) -> None:
    rows = [r for r in _vms_rows() if r["InstanceType"] in ("p4de.24xlarge", "g4dn.xlarge")]
    catalog = load_catalog(_write_csv(tmp_path / "a.csv", rows, list(rows[0])))
    info = ast.literal_eval(rows[0]["GpuInfo"])
    expected = info["Gpus"][0]["MemoryInfo"]["SizeInMiB"] / 1024
    assert catalog.offer(rows[0]["InstanceType"]).gpu_memory_gib == expected
    for row in rows:
        row["GpuInfo"] = ""
    blank = load_catalog(_write_csv(tmp_path / "b.csv", rows, list(rows[0])))
    specs = load_gpu_specs()
    assert blank.offer("g4dn.xlarge").gpu_memory_gib == specs["T4"].memory_gib
    assert blank.offer("p4de.24xlarge").gpu_memory_gib == specs["A100-80GB"].memory_gib


def test_gpu_info_that_is_not_a_literal_is_rejected(tmp_path: Path) -> None:
    rows = _vms_rows()[:3]
    rows[1]["GpuInfo"] = "__import__('os').getcwd()"
    path = _write_csv(tmp_path / "vms.csv", rows, list(rows[0]))
    with pytest.raises(CatalogError, match="line 3: column 'GpuInfo'"):
        load_catalog(path)


def test_every_type_has_a_network_spec_and_every_cuda_gpu_a_gpu_spec() -> None:
    networks = load_network_specs()
    specs = load_gpu_specs()
    rows = _vms_rows()
    assert {r["InstanceType"] for r in rows} <= set(networks)
    nvidia = {
        r["AcceleratorName"]
        for r in rows
        if r["GpuInfo"] and ast.literal_eval(r["GpuInfo"])["Gpus"][0]["Manufacturer"] == "NVIDIA"
    }
    assert len(nvidia) >= 12 and nvidia <= set(specs)
    assert all(s.source.strip() for s in networks.values())
    assert all(s.source.strip() for s in specs.values())
    catalog = load_catalog("bundled")
    assert all(o.network_gbps > 0 for o in catalog.offers)


def test_spec_table_errors_name_file_column_and_line(tmp_path: Path) -> None:
    bundled = Path(str(resources.files("lightning_srifty") / "data" / "gpu_specs.csv"))
    lines = bundled.read_text(encoding="utf-8").splitlines()
    bad = tmp_path / "gpu.csv"
    bad.write_text("\n".join([lines[0], lines[1].rsplit(",", 1)[0] + ",  "]) + "\n")
    with pytest.raises(CatalogError, match=r"gpu.csv: line 2: column 'source' is empty"):
        load_gpu_specs(bad)
    bad.write_text(lines[0].replace("mem_bw_gbps", "bandwidth") + "\n")
    with pytest.raises(CatalogError, match="missing column.*'mem_bw_gbps'"):
        load_gpu_specs(bad)
    network = tmp_path / "net.csv"
    network.write_text("instance_type,gbps,burst,intra_node_link,source\nx.large,10,no,PCIe,s\n")
    with pytest.raises(CatalogError, match="line 2: column 'burst' is 'no'; valid: true, false"):
        load_network_specs(network)


def test_spot_bands_come_from_the_spot_advisor_snapshot(shared_data: Path) -> None:
    raw = json.loads(
        (shared_data / "aws-spot-advisor" / "gpu-interruption-bands-2025-06.json").read_text()
    )
    bands = load_spot_bands()
    assert bands.source == raw["source"]
    catalog = load_catalog("bundled")
    checked = 0
    for offer in catalog.offers:
        expected = raw["spot_advisor"].get(offer.region, {}).get(offer.instance_type)
        assert offer.interruption_band == (None if expected is None else expected["r"])
        checked += expected is not None
    assert checked > 1000


def test_spot_bands_reject_future_schema(tmp_path: Path) -> None:
    path = tmp_path / "bands.json"
    path.write_text(json.dumps({"schema_version": 2, "source": "x", "bands": {}}))
    with pytest.raises(CatalogError, match="schema_version"):
        load_spot_bands(path)


def test_spec_ratios_rank_gpus_like_lambda_measurements(shared_data: Path) -> None:
    """Sanity check of the spec table: the roofline blend orders most GPU pairs right."""
    specs = load_gpu_specs()
    rows = load_lambda_benchmark(shared_data / "lambda-benchmark")
    for precision in ("fp32", "fp16"):
        measured = single_gpu_throughput(rows, precision)
        assert len(measured) >= 10
        names = sorted(measured)
        right = total = 0
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                models = set(measured[a]) & set(measured[b])
                wins = sum(measured[a][m] > measured[b][m] for m in models)
                if not models or 2 * wins == len(models):
                    continue
                predicted_a_faster = predicted_speed_ratio(specs[a], specs[b], precision) > 1.0
                right += predicted_a_faster == (2 * wins > len(models))
                total += 1
        assert total >= 40
        assert right / total >= 0.8, f"{precision}: {right}/{total} pairs ranked right"


def test_lambda_benchmark_missing_column_is_named(tmp_path: Path, shared_data: Path) -> None:
    for name in ("pytorch-train-throughput-fp32.csv", "pytorch-train-throughput-fp16.csv"):
        shutil.copy(shared_data / "lambda-benchmark" / name, tmp_path / name)
    target = tmp_path / "pytorch-train-throughput-fp16.csv"
    target.write_text(target.read_text().replace("name_gpu", "gpu", 1))
    with pytest.raises(TraceError, match="throughput-fp16.csv: missing column.*name_gpu"):
        load_lambda_benchmark(tmp_path)


def _network_row(instance_type: str) -> dict[str, str]:
    path = Path(str(resources.files("lightning_srifty") / "data" / "network_specs.csv"))
    with path.open(encoding="utf-8", newline="") as handle:
        return next(r for r in csv.DictReader(handle) if r["instance_type"] == instance_type)


def _two_full_nodes_rate_gbps(instance_type: str) -> tuple[float, bool]:
    from lightning_srifty.core.cluster import Cluster, ClusterGroup
    from lightning_srifty.core.perfmodel import PerformanceModel
    from lightning_srifty.fit.validation import two_node_network_rates
    from lightning_srifty.io.calibration_io import load_default_calibration

    offer = load_catalog("bundled").offer(instance_type)
    model = PerformanceModel(load_gpu_specs(), load_default_calibration())
    (rate,) = two_node_network_rates(model, [offer])
    cluster = Cluster((ClusterGroup(offer, 2, offer.accelerator_count),))
    return rate.per_node_gbps, cluster.uses_efa


@pytest.mark.parametrize("instance_type", ["p4d.24xlarge", "p5.48xlarge", "p5e.48xlarge"])
def test_efa_types_are_priced_at_their_efa_rate(instance_type: str) -> None:
    from lightning_srifty.fit.calibration import PRIORS
    from lightning_srifty.io.calibration_io import load_default_calibration

    row = _network_row(instance_type)
    interfaces, cards = int(row["efa_interfaces"]), int(row["network_cards"])
    assert interfaces > 0
    # no shipped calibration source ran on EFA: its efficiency is the published prior
    efficiency = PRIORS["efa_efficiency"].centre
    assert load_default_calibration().physics.efa_efficiency == pytest.approx(efficiency)
    expected = interfaces * float(row["gbps"]) / cards * efficiency
    per_node, uses_efa = _two_full_nodes_rate_gbps(instance_type)
    assert uses_efa
    assert per_node == pytest.approx(expected)


def test_a_type_without_efa_keeps_its_tcp_rate() -> None:
    from lightning_srifty.io.calibration_io import load_default_calibration

    row = _network_row("p3.16xlarge")
    assert int(row["efa_interfaces"]) == 0 and int(row["network_cards"]) == 1
    physics = load_default_calibration().physics
    # NCCL over ENA: 2 channels x 16 sockets, each flow capped at 5 Gbps by AWS, each
    # socket at the fitted single-stream rate, the NIC's own rate above all
    flows = 2 * 16
    expected = (
        min(float(row["gbps"]), flows * 5.0, flows * physics.tcp_flow_gbps) * physics.tcp_efficiency
    )
    per_node, uses_efa = _two_full_nodes_rate_gbps("p3.16xlarge")
    assert not uses_efa
    assert per_node == pytest.approx(expected)


def test_efa_off_prices_one_cards_sockets() -> None:
    row = _network_row("p4d.24xlarge")
    links = load_catalog("bundled", efa="off").offer("p4d.24xlarge").node_links
    assert not links.uses_efa
    assert links.socket_rate_gbps == pytest.approx(float(row["gbps"]) / int(row["network_cards"]))
    with pytest.raises(CatalogError, match="efa mode 'sometimes'"):
        load_catalog("bundled", efa="sometimes")
