"""Catalog records and pure queries over an in-memory offer table.

An :class:`Offer` is one instance type in one zone with its prices and the hardware
facts the performance model needs. Loading (SkyPilot's catalog or the bundled snapshot)
lives in :mod:`lightning_srifty.io.catalog_io`; this module never touches files.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from lightning_srifty.core.errors import CatalogError
from lightning_srifty.core.links import (
    DEFAULT_EFA_MODE,
    NodeLinks,
    default_links,
    intra_rate,
    skypilot_vm_links,
)

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
    pcie_gen: int = 0
    """PCIe generation of the board's host link (0 = not published)."""
    nvlink_gbytes_s: float = 0.0
    """One-direction NVLink rate per GPU of the NVLink (SXM) form factor; 0 if none."""
    tdp_w: float = 0.0
    """Board power in W (0 = not published)."""
    sustained_clock: float = 1.0
    """Share of its boost clock the board's power limit lets it hold under a training
    load (:func:`with_power_limits`; 1 = not power-limited)."""


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
    accelerator_fraction: float = 1.0
    """Share of one accelerator below 1 for fractional-GPU types (g6f: 1/8 of an L4)."""
    links: NodeLinks | None = None
    """Physical links in absolute terms (``None``: conservative defaults derived from
    ``intra_node_link`` and ``network_gbps``, see :attr:`node_links`)."""

    @property
    def node_links(self) -> NodeLinks:
        """The links the performance model uses for this offer."""
        if self.links is not None:
            return self.links
        return default_links(self.intra_node_link, self.network_gbps)

    @property
    def family(self) -> str:
        """Instance family, the part before the dot (``g4dn`` of ``g4dn.12xlarge``)."""
        return self.instance_type.split(".", 1)[0]

    def price(self, use_spot: bool) -> float | None:
        """$/h at spot or on-demand pricing; ``None`` where that market is absent."""
        return self.spot_price if use_spot else self.ondemand_price


# Monthly interruption frequency per Spot Advisor band, as the band's midpoint
# (">20%" taken as 25%); used to turn a band into a preemption rate per hour.
BAND_MONTHLY_INTERRUPTION = (0.025, 0.075, 0.125, 0.175, 0.25)
HOURS_PER_MONTH = 730.0


def band_hourly_rate(band: int | None, default_band: int = 2) -> float:
    """Expected interruptions per instance-hour implied by a Spot Advisor band."""
    b = default_band if band is None else min(max(int(band), 0), 4)
    return BAND_MONTHLY_INTERRUPTION[b] / HOURS_PER_MONTH


@dataclass(frozen=True)
class NetworkSpec:
    """Published network facts of one instance type (source named per row)."""

    instance_type: str
    gbps: float
    """Baseline network bandwidth in Gbit/s (what a long all-reduce can count on)."""
    burst: bool
    """``True`` where AWS documents the type as "up to" its peak (network I/O credits)."""
    intra_node_link: str
    """``"NVLink"``, ``"PCIe"`` or ``"none"``."""
    source: str = ""
    peak_gbps: float = 0.0
    """The "up to" rate of a burst type (0 = same as ``gbps``)."""
    network_cards: int = 1
    efa_interfaces: int = 0
    """Maximum EFA interfaces (0 = no EFA)."""
    gpu_interconnect: str = ""
    """``"NVSwitch"``, ``"NVLink"``, ``"PCIe"`` or ``"none"`` (empty = derive from
    ``intra_node_link``)."""
    nvlink_gbytes_s: float = 0.0
    """One-direction NVLink rate per GPU (0 where there is none)."""
    pcie_gen: int = 0
    """PCIe generation of the accelerators' host link (0 = not published)."""

    def node_links(
        self, accelerators: int, gpu: GpuSpec | None = None, efa: str = DEFAULT_EFA_MODE
    ) -> NodeLinks:
        """The links a SkyPilot VM of this type gives NCCL (see
        :func:`~lightning_srifty.core.links.skypilot_vm_links`; ``efa`` one of
        :data:`~lightning_srifty.core.links.EFA_MODES`)."""
        kind = self.gpu_interconnect or (
            self.intra_node_link if self.intra_node_link in ("NVLink", "PCIe") else "none"
        )
        if accelerators <= 1:
            kind = "none"
        nvlink = self.nvlink_gbytes_s or (gpu.nvlink_gbytes_s if gpu is not None else 0.0)
        pcie = self.pcie_gen or (gpu.pcie_gen if gpu is not None else 0)
        return skypilot_vm_links(
            kind,
            intra_rate(kind, nvlink, pcie),
            self.gbps,
            self.peak_gbps or self.gbps,
            efa_interfaces=self.efa_interfaces,
            network_cards=self.network_cards,
            accelerators=accelerators,
            efa=efa,
        )


@dataclass(frozen=True)
class CatalogArrays:
    """Column view of a catalog, one entry per offer, for vectorised evaluation.

    Categorical columns are integer codes into the matching name tuple so that a planner
    can mask and group millions of (offer, nodes) candidates without touching Python
    objects. Missing prices are ``nan``; a missing interruption band is ``-1``.
    """

    type_index: np.ndarray
    """int32, index into :attr:`Catalog.type_names`."""
    accelerator_index: np.ndarray
    """int32, index into :attr:`Catalog.accelerator_names`."""
    accelerator_count: np.ndarray
    """float64: fractional GPUs (g6f) exist."""
    gpu_memory_gib: np.ndarray
    vcpus: np.ndarray
    memory_gib: np.ndarray
    ondemand_price: np.ndarray
    spot_price: np.ndarray
    region_index: np.ndarray
    """int32, index into :attr:`Catalog.region_names`."""
    zone_index: np.ndarray
    """int32, index into :attr:`Catalog.zone_names`."""
    link_index: np.ndarray
    """int8, index into :data:`INTRA_NODE_LINKS`."""
    network_gbps: np.ndarray
    interruption_band: np.ndarray
    """int8, Spot Advisor band or -1 where unknown."""
    trainable: np.ndarray
    """bool: the accelerator is a CUDA GPU with a spec row that can train here."""


def _codes(values: Sequence[str]) -> tuple[tuple[str, ...], np.ndarray]:
    """Sorted distinct names and each value's index into them."""
    names = tuple(sorted(set(values)))
    lookup = {name: i for i, name in enumerate(names)}
    return names, np.fromiter((lookup[v] for v in values), dtype=np.int32, count=len(values))


def _price_column(prices: Iterable[float | None]) -> np.ndarray:
    return np.array([np.nan if p is None else p for p in prices], dtype=np.float64)


class Catalog:
    """An immutable table of offers with queries the planner and CLI need.

    Args:
        offers: one :class:`Offer` per (instance type, zone); order is kept.
        source: where the offers came from, for display (e.g. ``"bundled snapshot"``).
        trainable_accelerators: accelerator names that are CUDA GPUs this tool can train
            on (those with a trainable GPU spec row); offers of any other accelerator stay
            in the catalog but are excluded by :meth:`gpu_offers`.
    """

    def __init__(
        self,
        offers: Sequence[Offer],
        source: str,
        trainable_accelerators: Iterable[str] = (),
    ) -> None:
        self.offers: tuple[Offer, ...] = tuple(offers)
        self.source = source
        self.trainable_accelerators: frozenset[str] = frozenset(trainable_accelerators)
        self._by_type: dict[str, list[Offer]] = {}
        for offer in self.offers:
            self._by_type.setdefault(offer.instance_type, []).append(offer)
        self._arrays: CatalogArrays | None = None

    def __len__(self) -> int:
        return len(self.offers)

    def __repr__(self) -> str:
        return (
            f"Catalog({len(self.offers)} offers, {len(self._by_type)} types, "
            f"source={self.source!r})"
        )

    # --- lookups ---------------------------------------------------------------------

    def types(self) -> tuple[str, ...]:
        """Instance type names, sorted."""
        return tuple(sorted(self._by_type))

    def regions(self) -> tuple[str, ...]:
        """Region names, sorted."""
        return tuple(sorted({o.region for o in self.offers}))

    def is_trainable(self, offer: Offer) -> bool:
        """Whether the offer has whole CUDA GPUs with a trainable spec row.

        Inferentia, Trainium, Gaudi, AI100, Radeon and arm64 T4g hosts have no trainable
        row; fractional GPUs (g6f, gr6f) are excluded because the peak figures of a
        whole GPU would overstate them.
        """
        return offer.accelerator in self.trainable_accelerators and (
            offer.accelerator_fraction >= 1.0
        )

    def gpu_offers(self) -> tuple[Offer, ...]:
        """Offers the planner may use: CUDA GPUs with a spec row (no Inferentia, ...)."""
        return tuple(o for o in self.offers if self.is_trainable(o))

    def offers_of(self, instance_type: str) -> tuple[Offer, ...]:
        """Every zone's offer of one type; unknown types raise with close matches."""
        self._require_type(instance_type)
        return tuple(self._by_type[instance_type])

    def offer(
        self, instance_type: str, region: str | None = None, zone: str | None = None
    ) -> Offer:
        """One offer of a type, optionally pinned to a region and/or zone.

        With several matches, the zone with the lowest on-demand price wins (then the
        zone name), so the answer is stable whichever order the catalog file had.

        Raises:
            CatalogError: the type is unknown (the message lists close matches), or it
                is not offered in the region/zone asked for (the message lists where it is).
        """
        matches = [
            o
            for o in self.offers_of(instance_type)
            if (region is None or o.region == region) and (zone is None or o.zone == zone)
        ]
        if not matches:
            where = sorted({o.region for o in self._by_type[instance_type]})
            asked = ", ".join(
                f"{k} '{v}'" for k, v in (("region", region), ("zone", zone)) if v is not None
            )
            raise CatalogError(
                f"instance type '{instance_type}' is not offered in {asked}; "
                f"it is offered in {', '.join(where)}"
            )
        return min(matches, key=_ondemand_then_zone)

    def _require_type(self, instance_type: str) -> None:
        if instance_type in self._by_type:
            return
        close = difflib.get_close_matches(instance_type, list(self._by_type), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise CatalogError(
            f"unknown instance type '{instance_type}'{hint} "
            f"({len(self._by_type)} types in the catalog from {self.source})"
        )

    # --- filters ---------------------------------------------------------------------

    def filter(
        self,
        *,
        regions: Iterable[str] | None = None,
        exclude_regions: Iterable[str] = (),
        families: Iterable[str] | None = None,
        exclude_families: Iterable[str] = (),
        instance_types: Iterable[str] | None = None,
    ) -> Catalog:
        """A new catalog keeping only the allowed regions/families/types.

        ``None`` allows everything; the ``exclude_*`` lists win over the allow lists.
        Names given that the catalog does not know raise :class:`CatalogError`, so a
        typo in a flag does not silently empty the plan.
        """
        allowed_regions = self._checked(regions, self.regions(), "region")
        denied_regions = self._checked(exclude_regions, self.regions(), "region")
        known_families = tuple(sorted({o.family for o in self.offers}))
        allowed_families = self._checked(families, known_families, "instance family")
        denied_families = self._checked(exclude_families, known_families, "instance family")
        allowed_types: frozenset[str] | None = None
        if instance_types is not None:
            allowed_types = frozenset(instance_types)
            for name in allowed_types:
                self._require_type(name)
        kept = [
            o
            for o in self.offers
            if (allowed_regions is None or o.region in allowed_regions)
            and o.region not in (denied_regions or ())
            and (allowed_families is None or o.family in allowed_families)
            and o.family not in (denied_families or ())
            and (allowed_types is None or o.instance_type in allowed_types)
        ]
        return Catalog(kept, self.source, self.trainable_accelerators)

    @staticmethod
    def _checked(
        names: Iterable[str] | None, known: Sequence[str], what: str
    ) -> frozenset[str] | None:
        if names is None:
            return None
        chosen = frozenset(names)
        for name in sorted(chosen):
            if name not in known:
                close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
                hint = (
                    f"did you mean {', '.join(close)}?" if close else "valid: " + ", ".join(known)
                )
                raise CatalogError(f"unknown {what} '{name}'; {hint}")
        return chosen

    def cheapest_zones(self, use_spot: bool) -> dict[tuple[str, str], Offer]:
        """The cheapest zone of each (instance type, region) at the given pricing.

        Zones without a price at that pricing (no spot market, p5e on demand) are
        skipped; ties go to the lexically first zone so the result is deterministic.
        """
        best: dict[tuple[str, str], Offer] = {}
        for offer in self.offers:
            price = offer.price(use_spot)
            if price is None:
                continue
            key = (offer.instance_type, offer.region)
            held = best.get(key)
            if held is None or (price, offer.zone) < (_price_or_inf(held, use_spot), held.zone):
                best[key] = offer
        return best

    # --- columns ---------------------------------------------------------------------

    @property
    def type_names(self) -> tuple[str, ...]:
        return self.types()

    @property
    def region_names(self) -> tuple[str, ...]:
        return self.regions()

    @property
    def zone_names(self) -> tuple[str, ...]:
        return tuple(sorted({o.zone for o in self.offers}))

    @property
    def accelerator_names(self) -> tuple[str, ...]:
        return tuple(sorted({o.accelerator for o in self.offers}))

    @property
    def arrays(self) -> CatalogArrays:
        """Column arrays (built once, on first use; read-only)."""
        if self._arrays is None:
            self._arrays = self._build_arrays()
        return self._arrays

    def _build_arrays(self) -> CatalogArrays:
        offers = self.offers
        _, type_index = _codes([o.instance_type for o in offers])
        _, accelerator_index = _codes([o.accelerator for o in offers])
        _, region_index = _codes([o.region for o in offers])
        _, zone_index = _codes([o.zone for o in offers])
        link_lookup = {name: i for i, name in enumerate(INTRA_NODE_LINKS)}
        columns = CatalogArrays(
            type_index=type_index,
            accelerator_index=accelerator_index,
            accelerator_count=np.array([o.accelerator_count for o in offers], dtype=np.float64),
            gpu_memory_gib=np.array([o.gpu_memory_gib for o in offers], dtype=np.float64),
            vcpus=np.array([o.vcpus for o in offers], dtype=np.float64),
            memory_gib=np.array([o.memory_gib for o in offers], dtype=np.float64),
            ondemand_price=_price_column(o.ondemand_price for o in offers),
            spot_price=_price_column(o.spot_price for o in offers),
            region_index=region_index,
            zone_index=zone_index,
            link_index=np.array([link_lookup[o.intra_node_link] for o in offers], dtype=np.int8),
            network_gbps=np.array([o.network_gbps for o in offers], dtype=np.float64),
            interruption_band=np.array(
                [-1 if o.interruption_band is None else o.interruption_band for o in offers],
                dtype=np.int8,
            ),
            trainable=np.array([self.is_trainable(o) for o in offers], dtype=bool),
        )
        for column in vars(columns).values():
            column.setflags(write=False)
        return columns


def _price_or_inf(offer: Offer, use_spot: bool) -> float:
    price = offer.price(use_spot)
    return float("inf") if price is None else price


def _ondemand_then_zone(offer: Offer) -> tuple[float, str]:
    return (_price_or_inf(offer, use_spot=False), offer.zone)


PRECISIONS = ("fp32", "fp16")
COMPUTE_SHARE = 0.5
"""Weight of the peak-FLOP ratio in the whole-step roofline blend (the rest is memory
bandwidth). A modelling assumption checked, not fitted: on Lambda's benchmark it orders
128 of 132 fp32 GPU pairs correctly (``benchmarks/bench_gpu_scaling.py``)."""
TENSOR_CORE_MODULES = frozenset(
    {
        "Linear", "LazyLinear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d",
        "ConvTranspose2d", "ConvTranspose3d", "LazyConv1d", "LazyConv2d", "LazyConv3d",
        "MultiheadAttention", "LSTM", "GRU", "RNN", "Transformer", "TransformerEncoderLayer",
        "TransformerDecoderLayer", "NonDynamicallyQuantizableLinear",
    }
)  # fmt: skip
"""Module types whose FLOPs are matrix products (tensor cores: TF32 or FP16 rate); the
FLOPs of any other module run at the CUDA-core FP32 rate."""
CUDNN_MODULES = frozenset(
    {
        "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
        "LazyConv1d", "LazyConv2d", "LazyConv3d", "LSTM", "GRU", "RNN",
    }
)  # fmt: skip
"""The matrix-product modules cuDNN runs in float32 (convolutions and RNNs), whose TF32
use ``torch.backends.cudnn.allow_tf32`` governs (PyTorch checks that flag for both:
``torch.backends.cudnn.conv`` and ``.rnn``); every other one in
:data:`TENSOR_CORE_MODULES` is a cuBLAS product governed by
``torch.get_float32_matmul_precision()``."""


GPU_GENERATIONS: dict[str, str] = {
    "T4": "turing", "T4g": "turing", "RTX 2080 Ti": "turing", "Quadro RTX 8000": "turing",
    "Quadro RTX 6000": "turing",
    "V100": "volta", "V100-32GB": "volta",
    "A10": "ampere", "A10G": "ampere", "A100": "ampere", "A100-PCIE": "ampere",
    "A100-80GB": "ampere", "A100-80GB-PCIE": "ampere", "RTX 3090": "ampere",
    "RTX A6000": "ampere", "A40": "ampere",
    "L4": "ada", "L40S": "ada", "RTX 4090": "ada", "RTX 6000 Ada": "ada",
    "H100": "hopper", "H100-PCIE": "hopper", "H200": "hopper",
    "B200": "blackwell",
}  # fmt: skip
"""NVIDIA architecture of every GPU in ``gpu_specs.csv`` (NVIDIA's datasheets name it:
Turing TU10x, Volta GV100, Ampere GA10x, Ada AD10x, Hopper GH100, Blackwell GB100)."""
TENSOR_UTILISATION: dict[str, float] = {
    "ada": 1.17,
    "ampere": 1.16,
    "hopper": 0.64,
    "turing": 1.15,
    "volta": 0.99,
}
"""Achieved matrix-product utilisation per generation, relative to the others (a
generation not listed: 1). The output of
:func:`lightning_srifty.fit.gpu_utilisation.fit_tensor_utilisation` on Lambda's
benchmark (``tests/fit/test_gpu_utilisation.py`` checks that it reproduces): Hopper
reaches about half the share of its peak that Ampere does. Fitted on the peaks at the
sustained clock (:func:`with_power_limits`), so a power-limited board's shortfall is not
charged to its generation."""
HALF_RATE_ACCUMULATE = frozenset({"RTX 2080 Ti", "RTX 3090", "RTX 4090"})
"""GeForce boards, whose 16-bit tensor-core rate with FP32 accumulation (what PyTorch's
mixed precision runs: cuBLAS and cuDNN accumulate in FP32) is half their rate with FP16
accumulation, and half that of the professional board on the same die (NVIDIA's Turing,
Ampere GA102 and Ada whitepapers); ``gpu_specs.csv`` lists the halved figure."""
HALF_RATE_UTILISATION = 1.64
"""Achieved 16-bit matrix-product utilisation of a :data:`HALF_RATE_ACCUMULATE` board
relative to its generation's: training's products do not run at the tensor peak, so
halving it costs less than half. Fitted with the generations' factors by
:func:`lightning_srifty.fit.gpu_utilisation.fit_tensor_utilisation` on Lambda's
benchmark: the RTX 3090 trains ResNet-50 in fp16 as fast as the RTX A6000 (905 and 916
images/s) with half its tensor peak. Fitted without both boards of a pair, it cuts the
median error of the fp16 speed ratios over Lambda's 66 pairs from 16.9 to 11.8 %, and
over the 21 pairs with a GeForce board from 42.7 to 16.2 %
(``tests/fit/test_gpu_utilisation.py``)."""


POWER_FAMILIES: dict[str, str] = {
    "T4": "turing", "T4g": "turing", "RTX 2080 Ti": "turing", "Quadro RTX 8000": "turing",
    "Quadro RTX 6000": "turing",
    "V100": "volta", "V100-32GB": "volta",
    "A100": "ga100", "A100-PCIE": "ga100", "A100-80GB": "ga100", "A100-80GB-PCIE": "ga100",
    "A10": "ga10x", "A10G": "ga10x", "RTX 3090": "ga10x", "RTX A6000": "ga10x", "A40": "ga10x",
    "L4": "ada", "L40S": "ada", "RTX 4090": "ada", "RTX 6000 Ada": "ada",
    "H100": "hopper", "H100-PCIE": "hopper", "H200": "hopper",
    "B200": "blackwell",
}  # fmt: skip
"""GPUs whose chips spend the same energy per operation at the same clock: one
architecture on one foundry process (NVIDIA's whitepapers: Turing TU102/TU104 and Volta
GV100 on TSMC 12FFN, GA100 on TSMC 7N, GA102/GA104... on Samsung 8N, Ada AD10x and
Hopper GH100 on TSMC 4N). Ampere is two families: its two processes differ."""
POWER_LAW_EXPONENT = 3.0
"""Dynamic power grows as ``f·V²`` and the supply voltage rises about linearly with the
clock over a GPU's boost range, so power goes as the clock cubed."""


def with_power_limits(specs: Mapping[str, GpuSpec]) -> dict[str, GpuSpec]:
    """The spec table with every GPU's :attr:`GpuSpec.sustained_clock` set.

    A datasheet's peak is at the boost clock, which a board holds only while its power
    fits the board's limit. Within a :data:`POWER_FAMILIES` family the chips' energy
    per operation at a clock is the same, so the member with the most board watts per
    FP32 TFLOP/s is taken to hold its boost clock (its board was sized for it), and
    another member at boost would draw its peak times that many watts per TFLOP/s.
    Where that exceeds its own limit it runs at the clock that fits:
    ``(limit / needed) ** (1/3)`` (:data:`POWER_LAW_EXPONENT`). The T4 (70 W) lands
    at 0.77 of its boost against the RTX 2080 Ti's budget, which is what the traces'
    per-sample costs show against the Quadro RTX 6000 (``benchmarks/bench_gpu_scaling.py``);
    Lambda's benchmark has the A10 (150 W) at 0.63 of the RTX A6000's speed, the
    datasheets at 0.79, the model with the limits at 0.73.
    Memory bandwidth keeps its datasheet figure (the memory clock does not throttle).
    A GPU outside the families, or with no published power, keeps 1.
    """
    watts_per_tflops: dict[str, float] = {}
    for spec in specs.values():
        family = POWER_FAMILIES.get(spec.name)
        if family is not None and spec.tdp_w > 0:
            ratio = spec.tdp_w / spec.fp32_tflops
            watts_per_tflops[family] = max(watts_per_tflops.get(family, 0.0), ratio)
    out = {}
    for name, spec in specs.items():
        family = POWER_FAMILIES.get(spec.name)
        share = 1.0
        if family is not None and spec.tdp_w > 0:
            needed = spec.fp32_tflops * watts_per_tflops[family]
            share = min(1.0, spec.tdp_w / needed) ** (1.0 / POWER_LAW_EXPONENT)
        out[name] = replace(spec, sustained_clock=share)
    return out


def sustained_tflops(spec: GpuSpec, precision: str, tf32_share: float = 1.0) -> float:
    """The peak a framework sees (:func:`peak_tflops`) at the clock the board's power
    limit lets it hold (:attr:`GpuSpec.sustained_clock`)."""
    return peak_tflops(spec, precision, tf32_share) * spec.sustained_clock


def achieved_tflops(spec: GpuSpec, precision: str, tf32_share: float = 1.0) -> float:
    """The matrix-product rate training reaches, relatively: the peak at the sustained
    clock (:func:`sustained_tflops`) times its generation's :data:`TENSOR_UTILISATION`.

    The generation's factor applies at either float32 rate: it was fitted with Volta's
    and Turing's fp32 rows at their CUDA-core rate, and no public benchmark separates
    CUDA-core from tensor-core reach on one GPU. A GeForce board's halved 16-bit rate
    reaches more of itself (:data:`HALF_RATE_UTILISATION`).
    """
    return sustained_tflops(spec, precision, tf32_share) * tensor_utilisation(spec.name, precision)


def tensor_utilisation(
    gpu: str,
    precision: str,
    generations: Mapping[str, float] = TENSOR_UTILISATION,
    half_rate: float = HALF_RATE_UTILISATION,
) -> float:
    """The achieved-utilisation factor of ``gpu`` at ``precision``: its generation's
    (``generations``, 1 where not listed), times ``half_rate`` for a
    :data:`HALF_RATE_ACCUMULATE` board in 16-bit. The defaults are the shipped factors;
    a refit (a leave-pair-out check) passes its own."""
    factor = generations.get(GPU_GENERATIONS.get(gpu, ""), 1.0)
    if gpu in HALF_RATE_ACCUMULATE and precision_kind(precision) == "fp16":
        factor *= half_rate
    return factor


def precision_kind(precision: str) -> str:
    """``"fp16"`` for 16-bit training (``16-mixed``, ``bf16-mixed``, ``16-true``...),
    ``"fp32"`` otherwise (``32-true``, ``tf32``, ``64-true``)."""
    return "fp16" if "16" in precision else "fp32"


def peak_tflops(spec: GpuSpec, precision: str, tf32_share: float = 1.0) -> float:
    """Peak matmul rate a framework sees at a precision.

    ``"fp16"`` is the dense FP16 tensor-core rate. ``"fp32"`` depends on what the job
    allows: its matrix products run at the TF32 tensor-core rate where TF32 is allowed
    (cuDNN's default for convolutions; cuBLAS matmuls only with
    ``torch.set_float32_matmul_precision("high")`` since PyTorch 1.12) and at the plain
    FP32 rate where not, 7x slower on an H100. ``tf32_share`` is the share of the
    matrix-product FLOPs allowed TF32 (1: all, 0: none); a mix takes the harmonic blend
    (time adds per FLOP). On Volta/Turing both columns hold the FP32 rate, so the share
    changes nothing there. Lightning's precision strings are accepted too.
    """
    if precision not in PRECISIONS:
        if "-" in precision or precision == "tf32":
            precision = precision_kind(precision)
        else:
            raise ValueError(f"precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    if not 0.0 <= tf32_share <= 1.0:
        raise ValueError(f"tf32_share {tf32_share} is outside 0..1")
    if precision != "fp32":
        return spec.fp16_tflops
    if tf32_share >= 1.0:
        return spec.tf32_tflops
    if tf32_share <= 0.0:
        return spec.fp32_tflops
    return 1.0 / (tf32_share / spec.tf32_tflops + (1.0 - tf32_share) / spec.fp32_tflops)


def device_time_ratio(
    source: GpuSpec,
    target: GpuSpec,
    precision: str,
    compute_share: float = COMPUTE_SHARE,
    tf32_share: float = 1.0,
) -> float:
    """Device time on ``target`` over device time on ``source`` from published peaks.

    The one compute ratio of the model: a training step is partly compute-bound and
    partly memory-bound, so the ratio is the geometric blend of the achieved-FLOP/s
    ratio (:func:`achieved_tflops`: the peak times its generation's utilisation) and
    the memory-bandwidth ratio, weighted by ``compute_share`` (1 = purely
    compute-bound). Host time (data loading, launches) is not in it: callers keep it as
    measured. ``tf32_share`` (see :func:`peak_tflops`) is the job's: the launched job
    runs the same script on both GPUs.
    """
    if not 0.0 <= compute_share <= 1.0:
        raise ValueError(f"compute_share {compute_share} is outside 0..1")
    flops_ratio = achieved_tflops(source, precision, tf32_share) / achieved_tflops(
        target, precision, tf32_share
    )
    bandwidth_ratio = source.mem_bw_gbps / target.mem_bw_gbps
    return float(flops_ratio**compute_share * bandwidth_ratio ** (1.0 - compute_share))


def predicted_speed_ratio(
    fast: GpuSpec, slow: GpuSpec, precision: str, compute_share: float = COMPUTE_SHARE
) -> float:
    """Throughput of ``fast`` over ``slow`` predicted from published peaks alone
    (the inverse of :func:`device_time_ratio` from ``slow`` to ``fast``)."""
    return 1.0 / device_time_ratio(slow, fast, precision, compute_share)


def layer_roofline_s(
    flops: float,
    moved_bytes: float,
    module_type: str,
    spec: GpuSpec,
    precision: str,
    tf32: bool = True,
) -> float:
    """Least time one layer can take on ``spec``: ``max(flops / rate, bytes / bandwidth)``.

    Matrix products (:data:`TENSOR_CORE_MODULES`) run at the achieved tensor-core rate
    (:func:`achieved_tflops`); other modules' FLOPs at the CUDA-core FP32 rate at the
    held clock. ``tf32``: whether the job lets this layer's float32 products use TF32
    (:func:`layer_allows_tf32`).
    """
    if module_type in TENSOR_CORE_MODULES:
        rate = achieved_tflops(spec, precision, 1.0 if tf32 else 0.0) * 1e12
    else:
        rate = sustained_tflops(spec, "fp32", 0.0) * 1e12
    return max(flops / rate, moved_bytes / (spec.mem_bw_gbps * 1e9))


def layer_time_ratio(
    flops: float,
    moved_bytes: float,
    module_type: str,
    source: GpuSpec,
    target: GpuSpec,
    precision: str,
    tf32: bool = True,
) -> float | None:
    """Time of one layer on ``target`` over ``source`` by the roofline regime it sits in.

    A layer takes :func:`layer_roofline_s`: a matmul-bound layer scales by the ratio of
    achieved tensor-core rates (peak times the generation's :data:`TENSOR_UTILISATION`),
    a memory-bound one (normalisation, activations, embeddings) by the bandwidth ratio;
    the FLOPs of modules that are not matrix products run at the CUDA-core FP32 rate.
    ``None`` when the layer has neither FLOPs nor bytes.
    """
    if flops <= 0 and moved_bytes <= 0:
        return None
    before = layer_roofline_s(flops, moved_bytes, module_type, source, precision, tf32)
    after = layer_roofline_s(flops, moved_bytes, module_type, target, precision, tf32)
    return after / before


def layer_allows_tf32(module_type: str, matmul_tf32: bool, cudnn_tf32: bool) -> bool:
    """Whether a float32 layer of ``module_type`` may run on TF32 tensor cores: cuDNN's
    modules (:data:`CUDNN_MODULES`) by ``cudnn.allow_tf32``, every other one by the
    float32 matmul precision."""
    return cudnn_tf32 if module_type in CUDNN_MODULES else matmul_tf32
