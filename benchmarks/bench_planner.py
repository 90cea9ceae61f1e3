"""How long the planner takes over the whole bundled AWS catalog (goal: <= 1 s, 2 cores).

Profile: the Pollux cifar10 trace's single-GPU rows on g4dn (a coarse profile built by
``io/traces.py``), or a synthetic coarse profile when the shared data is absent.
Catalog: ``io/catalog_io.load_catalog()`` when that module exists, else the bundled
``lightning_srifty/data/aws_vms.csv`` read here with nominal link facts.

Run: ``.venv/bin/python benchmarks/bench_planner.py [--runs 5]``.
"""

from __future__ import annotations

import argparse
import ast
import csv
import importlib
import os
import statistics
import time
from pathlib import Path

from lightning_srifty.core.catalog import GpuSpec, Offer
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.core.planner import PlanRequest, plan
from lightning_srifty.core.profile import Profile

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SRIFTY_SHARED_DATA", ROOT.parent / "shared" / "data"))

# Published peak figures (NVIDIA data sheets), only used when io/catalog_io is absent.
FALLBACK_SPECS = {
    "T4": GpuSpec("T4", 8.1, 8.1, 65.0, 320.0, 16.0),
    "V100": GpuSpec("V100", 15.7, 15.7, 125.0, 900.0, 16.0),
    "V100-32GB": GpuSpec("V100-32GB", 15.7, 15.7, 125.0, 900.0, 32.0),
    "A10G": GpuSpec("A10G", 31.2, 62.5, 125.0, 600.0, 24.0),
    "L4": GpuSpec("L4", 30.3, 60.0, 121.0, 300.0, 24.0),
    "L40S": GpuSpec("L40S", 91.6, 183.0, 362.0, 864.0, 48.0),
    "A100": GpuSpec("A100", 19.5, 156.0, 312.0, 1555.0, 40.0),
    "A100-80GB": GpuSpec("A100-80GB", 19.5, 156.0, 312.0, 2039.0, 80.0),
    "H100": GpuSpec("H100", 67.0, 494.0, 989.0, 3350.0, 80.0),
    "H200": GpuSpec("H200", 67.0, 494.0, 989.0, 4800.0, 141.0),
    "B200": GpuSpec("B200", 80.0, 1100.0, 2250.0, 8000.0, 180.0),
}


def _csv_offers(path: Path) -> list[Offer]:
    offers = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            count = int(float(row["AcceleratorCount"]))
            info = ast.literal_eval(row["GpuInfo"]) if row["GpuInfo"] else {}
            gpus = info.get("Gpus") or [{}]
            mem = gpus[0].get("MemoryInfo", {}).get("SizeInMiB", 0) / 1024
            offers.append(
                Offer(
                    instance_type=row["InstanceType"],
                    accelerator=row["AcceleratorName"],
                    accelerator_count=count,
                    gpu_memory_gib=float(mem),
                    vcpus=float(row["vCPUs"] or 0),
                    memory_gib=float(row["MemoryGiB"] or 0),
                    region=row["Region"],
                    zone=row["AvailabilityZone"],
                    ondemand_price=float(row["Price"]) if row["Price"] else None,
                    spot_price=float(row["SpotPrice"]) if row["SpotPrice"] else None,
                    intra_node_link="NVLink" if count >= 8 else ("PCIe" if count > 1 else "none"),
                    network_gbps=100.0 if count >= 8 else 25.0,
                )
            )
    return offers


def load_inputs() -> tuple[list[Offer], dict[str, GpuSpec], str]:
    try:
        catalog_io = importlib.import_module("lightning_srifty.io.catalog_io")
    except ModuleNotFoundError:
        offers = _csv_offers(ROOT / "lightning_srifty" / "data" / "aws_vms.csv")
        return offers, FALLBACK_SPECS, "bundled aws_vms.csv (benchmark reader)"
    catalog = catalog_io.load_catalog("bundled")
    offers = list(catalog.offers)
    return offers, dict(catalog_io.load_gpu_specs()), f"io.catalog_io ({catalog.source})"


def load_profile() -> tuple[Profile, str]:
    from lightning_srifty.io.traces import coarse_profile, load_traces

    traces = load_traces(SHARED / "pollux-traces", models=["cifar10"])
    info = traces.models["cifar10"]
    profile = coarse_profile(info, traces.single_gpu_rows("cifar10"), traces.hardware)
    return profile, "pollux-traces cifar10 (coarse, T4)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    offers, specs, source = load_inputs()
    profile, profile_source = load_profile()
    model = PerformanceModel(specs)
    request = PlanRequest(target_steps=20_000, deadline_h=10.0, objective="cost")
    times = []
    result = None
    for _ in range(args.runs):
        start = time.perf_counter()
        result = plan(profile, offers, model, request)
        times.append(time.perf_counter() - start)
    assert result is not None
    space = result.space
    print(f"catalog: {source}, {len(offers)} offers")
    print(f"profile: {profile_source}")
    print(
        f"units (type x region x market, cheapest zone): {space.units} "
        f"over {space.instance_types} instance types"
    )
    print(
        f"candidates: {space.total:,} ({space.homogeneous:,} homogeneous, "
        f"{space.mixes:,} two-type mixes); model rows: {space.model_rows:,}"
    )
    print(
        f"plan() time: median {statistics.median(times):.3f} s, "
        f"min {min(times):.3f} s over {args.runs} runs"
    )
    best = result.best
    print(
        f"best: {best.cluster.describe()} {'spot' if best.use_spot else 'on-demand'} "
        f"{best.time_to_target_h:.2f} h ${best.cost_usd:.2f}"
    )


if __name__ == "__main__":
    main()
