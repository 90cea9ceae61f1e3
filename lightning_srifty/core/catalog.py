"""Catalog records and pure queries over an in-memory offer table.

An :class:`Offer` is one instance type in one zone with its prices and the hardware
facts the performance model needs. Loading (SkyPilot's catalog or the bundled snapshot)
lives in :mod:`lightning_srifty.io.catalog_io`; this module never touches files.
"""

from __future__ import annotations

from dataclasses import dataclass

INTRA_NODE_LINKS = ("NVLink", "PCIe", "none")


@dataclass(frozen=True)
class GpuSpec:
    """Published peak figures for one accelerator model (source named per row)."""

    name: str
    """Catalog accelerator name, e.g. ``"T4"``, ``"A100-80GB"``."""
    fp32_tflops: float
    tf32_tflops: float
    fp16_tflops: float
    mem_bw_gbps: float
    """Memory bandwidth in GB/s."""
    memory_gib: float
    source: str = ""


@dataclass(frozen=True)
class Offer:
    """One instance type in one zone: what renting it gives and costs."""

    instance_type: str
    accelerator: str
    """Catalog accelerator name, or ``""`` for CPU-only types."""
    accelerator_count: int
    gpu_memory_gib: float
    """Memory of one accelerator."""
    vcpus: float
    memory_gib: float
    region: str
    zone: str
    ondemand_price: float | None
    """$/h; ``None`` where the catalog has no on-demand price (e.g. p5e)."""
    spot_price: float | None
    """$/h; ``None`` where no spot market exists for this type in this zone."""
    intra_node_link: str
    """``"NVLink"``, ``"PCIe"`` or ``"none"`` (single accelerator)."""
    network_gbps: float
    """Published network bandwidth of the instance type."""
    interruption_band: int | None = None
    """AWS Spot Advisor band 0..4 (<5%, 5-10%, 10-15%, 15-20%, >20% per month)."""

    @property
    def family(self) -> str:
        return self.instance_type.split(".", 1)[0]

    def price(self, use_spot: bool) -> float | None:
        return self.spot_price if use_spot else self.ondemand_price


# Monthly interruption frequency per Spot Advisor band, as the band's midpoint
# (">20%" taken as 25%); used to turn a band into a preemption rate per hour.
BAND_MONTHLY_INTERRUPTION = (0.025, 0.075, 0.125, 0.175, 0.25)
HOURS_PER_MONTH = 730.0


def band_hourly_rate(band: int | None, default_band: int = 2) -> float:
    """Expected interruptions per instance-hour implied by a Spot Advisor band."""
    b = default_band if band is None else min(max(int(band), 0), 4)
    return BAND_MONTHLY_INTERRUPTION[b] / HOURS_PER_MONTH
