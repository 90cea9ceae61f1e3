"""Pure catalog queries over hand-built offers (no files)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_srifty.core.catalog import (
    HALF_RATE_ACCUMULATE,
    HALF_RATE_UTILISATION,
    Catalog,
    GpuSpec,
    Offer,
    achieved_tflops,
    layer_time_ratio,
    peak_tflops,
    predicted_speed_ratio,
    sustained_tflops,
    with_power_limits,
)
from lightning_srifty.core.errors import CatalogError


def _offer(
    instance_type: str = "g4dn.12xlarge",
    region: str = "us-east-1",
    zone: str = "use1-az1",
    ondemand: float | None = 3.9,
    spot: float | None = 1.2,
    accelerator: str = "T4",
    band: int | None = 2,
    fraction: float = 1.0,
) -> Offer:
    return Offer(
        instance_type=instance_type,
        accelerator=accelerator,
        accelerator_count=4,
        gpu_memory_gib=16.0,
        vcpus=48.0,
        memory_gib=192.0,
        region=region,
        zone=zone,
        ondemand_price=ondemand,
        spot_price=spot,
        intra_node_link="PCIe",
        network_gbps=50.0,
        interruption_band=band,
        accelerator_fraction=fraction,
    )


@pytest.fixture
def catalog() -> Catalog:
    return Catalog(
        [
            _offer(zone="use1-az2", ondemand=3.9, spot=1.5),
            _offer(zone="use1-az1", ondemand=3.9, spot=1.1),
            _offer(region="us-west-2", zone="usw2-az1", ondemand=3.5, spot=None, band=None),
            _offer("g4dn.2xlarge", zone="use1-az1", ondemand=0.75, spot=0.3),
            _offer("p5e.48xlarge", zone="use1-az3", ondemand=None, spot=30.0, accelerator="H200"),
            _offer("inf2.xlarge", zone="use1-az1", accelerator="Inferentia2"),
            _offer("g6f.large", zone="use1-az1", accelerator="L4", fraction=0.125),
        ],
        source="test",
        trainable_accelerators={"T4", "H200", "L4"},
    )


def test_unknown_type_lists_close_matches(catalog: Catalog) -> None:
    with pytest.raises(CatalogError) as info:
        catalog.offer("g4dn.12xlarg")
    message = str(info.value)
    assert "unknown instance type 'g4dn.12xlarg'" in message
    assert "did you mean g4dn.12xlarge, g4dn.2xlarge" in message


def test_offer_prefers_cheapest_on_demand_then_zone_name(catalog: Catalog) -> None:
    assert catalog.offer("g4dn.12xlarge").region == "us-west-2"
    in_east = catalog.offer("g4dn.12xlarge", region="us-east-1")
    assert in_east.zone == "use1-az1"
    assert catalog.offer("g4dn.12xlarge", zone="use1-az2").spot_price == 1.5


def test_offer_in_region_without_it_says_where_it_is(catalog: Catalog) -> None:
    with pytest.raises(CatalogError, match="not offered in region 'eu-west-1'.*us-east-1"):
        catalog.offer("g4dn.2xlarge", region="eu-west-1")


def test_types_and_regions_are_sorted_and_distinct(catalog: Catalog) -> None:
    assert catalog.types() == (
        "g4dn.12xlarge",
        "g4dn.2xlarge",
        "g6f.large",
        "inf2.xlarge",
        "p5e.48xlarge",
    )
    assert catalog.regions() == ("us-east-1", "us-west-2")


def test_cheapest_zone_per_type_region_skips_missing_prices(catalog: Catalog) -> None:
    spot = catalog.cheapest_zones(use_spot=True)
    assert spot[("g4dn.12xlarge", "us-east-1")].zone == "use1-az1"
    assert ("g4dn.12xlarge", "us-west-2") not in spot  # no spot market there
    ondemand = catalog.cheapest_zones(use_spot=False)
    assert ("p5e.48xlarge", "us-east-1") not in ondemand  # no on-demand price
    assert ondemand[("g4dn.12xlarge", "us-west-2")].ondemand_price == 3.5


def test_gpu_offers_exclude_non_cuda_and_fractional(catalog: Catalog) -> None:
    kept = {o.instance_type for o in catalog.gpu_offers()}
    assert kept == {"g4dn.12xlarge", "g4dn.2xlarge", "p5e.48xlarge"}


def test_filter_by_regions_and_families(catalog: Catalog) -> None:
    west = catalog.filter(regions=["us-west-2"])
    assert {o.region for o in west.offers} == {"us-west-2"}
    no_g4dn = catalog.filter(exclude_families=["g4dn"])
    assert "g4dn" not in {o.family for o in no_g4dn.offers}
    only = catalog.filter(families=["g4dn"], exclude_regions=["us-west-2"])
    assert len(only) == 3
    assert catalog.filter(instance_types=["inf2.xlarge"]).types() == ("inf2.xlarge",)


def test_filter_rejects_unknown_names(catalog: Catalog) -> None:
    with pytest.raises(CatalogError, match="unknown region 'us-east-9'; did you mean"):
        catalog.filter(regions=["us-east-9"])
    with pytest.raises(CatalogError, match="unknown instance family 'g5'"):
        catalog.filter(families=["g5"])
    with pytest.raises(CatalogError, match="unknown instance type"):
        catalog.filter(instance_types=["g4dn.13xlarge"])


def test_arrays_match_offers_row_by_row(catalog: Catalog) -> None:
    columns = catalog.arrays
    for i, offer in enumerate(catalog.offers):
        assert catalog.type_names[columns.type_index[i]] == offer.instance_type
        assert catalog.region_names[columns.region_index[i]] == offer.region
        assert catalog.zone_names[columns.zone_index[i]] == offer.zone
        assert catalog.accelerator_names[columns.accelerator_index[i]] == offer.accelerator
        expected_band = -1 if offer.interruption_band is None else offer.interruption_band
        assert columns.interruption_band[i] == expected_band
        assert bool(columns.trainable[i]) == catalog.is_trainable(offer)
    assert math.isnan(columns.ondemand_price[4]) and columns.spot_price[4] == 30.0
    assert math.isnan(columns.spot_price[2])
    with pytest.raises(ValueError):
        columns.spot_price[0] = 0.0


def test_arrays_support_vectorised_cheapest_price(catalog: Catalog) -> None:
    columns = catalog.arrays
    t4 = columns.accelerator_index == catalog.accelerator_names.index("T4")
    assert np.nanmin(np.where(t4, columns.spot_price, np.nan)) == 0.3


_A = GpuSpec("A", fp32_tflops=10, tf32_tflops=20, fp16_tflops=80, mem_bw_gbps=400, memory_gib=16)
_B = GpuSpec("B", fp32_tflops=5, tf32_tflops=5, fp16_tflops=20, mem_bw_gbps=200, memory_gib=16)


def test_speed_ratio_ends_are_flops_and_bandwidth_ratios() -> None:
    assert predicted_speed_ratio(_A, _B, "fp16", compute_share=1.0) == pytest.approx(4.0)
    assert predicted_speed_ratio(_A, _B, "fp32", compute_share=1.0) == pytest.approx(4.0)
    assert predicted_speed_ratio(_A, _B, "fp16", compute_share=0.0) == pytest.approx(2.0)
    blend = predicted_speed_ratio(_A, _B, "fp16")
    assert blend == pytest.approx(math.sqrt(8.0))
    assert predicted_speed_ratio(_B, _A, "fp16") == pytest.approx(1.0 / blend)


def test_peak_tflops_rejects_unknown_precision() -> None:
    assert peak_tflops(_A, "fp32") == 20
    with pytest.raises(ValueError, match="valid: fp32, fp16"):
        peak_tflops(_A, "int8")


def _board(name: str, fp32: float, watts: float, bw: float = 300.0) -> GpuSpec:
    return GpuSpec(name, fp32, fp32, 8 * fp32, bw, 16, tdp_w=watts)


def test_a_board_under_its_familys_power_budget_holds_the_clock_the_budget_allows() -> None:
    # Turing: the RTX 2080 Ti's 250 W over 13.4 TFLOP/s is the family's budget; the
    # T4 at its 8.1 peak would need 151 W and has 70 W, so its clock is (70/151)^(1/3)
    specs = with_power_limits(
        {
            "RTX 2080 Ti": _board("RTX 2080 Ti", 13.4, 250),
            "T4": _board("T4", 8.1, 70, bw=320),
            "V100": _board("V100", 15.7, 300),  # alone in its family
            "Mystery": _board("Mystery", 8.0, 10),  # in no family
            "T4g": _board("T4g", 8.1, 0),  # power not published
        }
    )
    needed = 8.1 * 250 / 13.4
    assert specs["T4"].sustained_clock == pytest.approx((70 / needed) ** (1 / 3))
    assert specs["T4"].sustained_clock == pytest.approx(0.774, abs=1e-3)
    for name in ("RTX 2080 Ti", "V100", "Mystery", "T4g"):
        assert specs[name].sustained_clock == 1.0, name
    t4 = specs["T4"]
    assert sustained_tflops(t4, "fp16") == pytest.approx(8 * 8.1 * t4.sustained_clock)
    assert t4.mem_bw_gbps == 320  # the memory clock does not throttle
    # compute-bound layers take the held clock, memory-bound ones the bandwidth alone
    unlimited = GpuSpec("T4", 8.1, 8.1, 64.8, 320, 16)
    fast = specs["RTX 2080 Ti"]
    held = layer_time_ratio(1e12, 1.0, "Linear", t4, fast, "fp32")
    boost = layer_time_ratio(1e12, 1.0, "Linear", unlimited, fast, "fp32")
    assert held is not None and boost is not None
    assert held / boost == pytest.approx(t4.sustained_clock)
    memory_bound = layer_time_ratio(1.0, 1e12, "ReLU", t4, fast, "fp32")
    assert memory_bound == layer_time_ratio(1.0, 1e12, "ReLU", unlimited, fast, "fp32")
    assert memory_bound == pytest.approx(320 / 300)
    # a budget above the family's loses nothing
    roomy = with_power_limits({"T4": _board("T4", 8.1, 500), "RTX 2080 Ti": fast})
    assert roomy["T4"].sustained_clock == 1.0


def test_a_geforce_boards_halved_16_bit_peak_is_reached_further_than_its_fp32() -> None:
    """Two boards alike but for the GeForce halving of 16-bit products with FP32
    accumulation: the GeForce one's achieved 16-bit rate is its listed (halved) peak
    times HALF_RATE_UTILISATION over the other's, while float32 is untouched."""
    assert "RTX 3090" in HALF_RATE_ACCUMULATE  # an Ampere board, as is the RTX A6000
    geforce = GpuSpec("RTX 3090", 35.6, 35.6, 71.0, 936.0, 24.0)
    pro = GpuSpec("RTX A6000", 35.6, 35.6, 71.0, 936.0, 24.0)
    for precision in ("fp16", "16-mixed", "bf16-mixed"):
        ratio = achieved_tflops(geforce, precision) / achieved_tflops(pro, precision)
        assert ratio == pytest.approx(HALF_RATE_UTILISATION)
    assert HALF_RATE_UTILISATION > 1.0
    assert achieved_tflops(geforce, "fp32") == pytest.approx(achieved_tflops(pro, "fp32"))
