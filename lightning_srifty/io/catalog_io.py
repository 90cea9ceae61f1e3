"""Loading the instance catalog and the published spec tables into core records.

Sources, in the order ``load_catalog("auto")`` tries them:

1. SkyPilot's own AWS catalog (``sky.catalog.common``, imported lazily), but only when
   the CSV already exists locally: SkyPilot downloads a missing catalog on first read,
   and this tool must work offline and never reach the network behind the user's back.
2. The snapshot bundled with the package (``lightning_srifty/data/aws_vms.csv``).

Every offer is joined with the bundled spec tables: network bandwidth and intra-node
link per instance type (``network_specs.csv``), GPU peak figures (``gpu_specs.csv``,
also the fallback for GPU memory when the catalog's ``GpuInfo`` is empty) and the Spot
Advisor interruption band per (region, type) (``spot_bands.json``).
"""

from __future__ import annotations

import ast
import csv
import importlib
import importlib.util
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from lightning_srifty.core.catalog import (
    INTRA_NODE_LINKS,
    Catalog,
    GpuSpec,
    NetworkSpec,
    Offer,
    with_power_limits,
)
from lightning_srifty.core.errors import CatalogError
from lightning_srifty.core.links import DEFAULT_EFA_MODE, EFA_MODES, INTERCONNECTS
from lightning_srifty.io.jsonfile import read_json

VMS_COLUMNS = (
    "InstanceType",
    "AcceleratorName",
    "AcceleratorCount",
    "vCPUs",
    "MemoryGiB",
    "GpuInfo",
    "Price",
    "SpotPrice",
    "Region",
    "AvailabilityZone",
)
"""Columns of SkyPilot's AWS ``vms.csv`` (format v8) this loader needs (``Arch`` is not)."""

GPU_SPEC_COLUMNS = (
    "name",
    "fp32_tflops",
    "tf32_tflops",
    "fp16_tflops",
    "mem_bw_gbps",
    "memory_gib",
    "trainable",
    "source",
)
NETWORK_SPEC_COLUMNS = ("instance_type", "gbps", "burst", "intra_node_link", "source")
SPOT_BANDS_SCHEMA_VERSION = 1
SKYPILOT_AWS_CATALOG = "aws/vms.csv"
BUNDLED_SOURCE = "bundled snapshot (lightning_srifty/data/aws_vms.csv)"
CATALOG_SOURCES = ("auto", "skypilot", "bundled")

_MIB_PER_GIB = 1024.0


@dataclass(frozen=True)
class SpotBands:
    """Spot Advisor interruption band per (region, instance type)."""

    bands: Mapping[tuple[str, str], int]
    source: str

    def band(self, region: str, instance_type: str) -> int | None:
        return self.bands.get((region, instance_type))


# --- public entry points --------------------------------------------------------------


def load_catalog(
    source: str | os.PathLike[str] = "auto",
    *,
    gpu_specs_path: str | os.PathLike[str] | None = None,
    network_specs_path: str | os.PathLike[str] | None = None,
    spot_bands_path: str | os.PathLike[str] | None = None,
    efa: str = DEFAULT_EFA_MODE,
) -> Catalog:
    """The AWS offers joined with the spec tables, as a :class:`Catalog`.

    Args:
        source: ``"auto"`` (SkyPilot's local catalog when it exists, else the bundled
            snapshot), ``"skypilot"`` (SkyPilot's local catalog or an error),
            ``"bundled"``, or the path of a SkyPilot-format ``vms.csv``.
        gpu_specs_path, network_specs_path, spot_bands_path: replacements for the
            bundled spec tables (the bundled ones when ``None``).
        efa: how EFA-capable types are launched (:data:`~lightning_srifty.core.links.EFA_MODES`):
            every EFA interface (the default: as AWS ships the type; SkyPilot attaches
            them all with ``network_tier: best`` and ``aws.use_internal_ips``), one
            interface, or none (TCP over ENA).

    Raises:
        CatalogError: the source is unknown or unusable, or a table is malformed (the
            message names the file, the column and, for a bad cell, the line).
    """
    gpu_specs, trainable = _load_gpu_table(gpu_specs_path)
    networks = load_network_specs(network_specs_path)
    bands = load_spot_bands(spot_bands_path)
    columns, rows, label = _read_vms(source)
    if efa not in EFA_MODES:
        raise CatalogError(f"efa mode {efa!r} is not one of {', '.join(EFA_MODES)}")
    offers = parse_vms_rows(rows, columns, label, networks, gpu_specs, bands, efa=efa)
    return Catalog(offers, label, trainable)


def planning_offers(
    source: str, profiled_on: str, *, efa: str = DEFAULT_EFA_MODE
) -> tuple[Offer, ...]:
    """Offers a job profiled on ``profiled_on`` can train on.

    Trainable CUDA GPUs from the catalog, plus the accelerator the profile was taken on
    even if it is not one (a profile from Trainium plans on Trainium). ``efa`` as in
    :func:`load_catalog`: how the launcher will really attach EFA.
    """
    catalog = load_catalog(source, efa=efa)
    return catalog.gpu_offers() + tuple(
        o for o in catalog.offers if o.accelerator == profiled_on and not catalog.is_trainable(o)
    )


def load_gpu_specs(path: str | os.PathLike[str] | None = None) -> dict[str, GpuSpec]:
    """Published peak figures per accelerator name (bundled table when ``path`` is None)."""
    return _load_gpu_table(path)[0]


def load_network_specs(path: str | os.PathLike[str] | None = None) -> dict[str, NetworkSpec]:
    """Network bandwidth and intra-node link per instance type."""
    label, rows = _read_table(path, "network_specs.csv", NETWORK_SPEC_COLUMNS)
    specs: dict[str, NetworkSpec] = {}
    for line, row in rows:
        name = _text(row, "instance_type", line, label)
        link = row["intra_node_link"].strip()
        if link not in INTRA_NODE_LINKS:
            raise CatalogError(
                f"line {line}: column 'intra_node_link' is {link!r}; "
                f"valid: {', '.join(INTRA_NODE_LINKS)}",
                source=label,
            )
        interconnect = (row.get("gpu_interconnect") or "").strip()
        if interconnect and interconnect not in INTERCONNECTS:
            raise CatalogError(
                f"line {line}: column 'gpu_interconnect' is {interconnect!r}; "
                f"valid: {', '.join(INTERCONNECTS)}",
                source=label,
            )
        spec = NetworkSpec(
            instance_type=name,
            gbps=_positive(row, "gbps", line, label),
            burst=_flag(row, "burst", line, label),
            intra_node_link=link,
            source=_text(row, "source", line, label),
            peak_gbps=_optional_number(row, "peak_gbps", line, label),
            network_cards=int(_optional_number(row, "network_cards", line, label) or 1),
            efa_interfaces=int(_optional_number(row, "efa_interfaces", line, label)),
            gpu_interconnect=interconnect,
            nvlink_gbytes_s=_optional_number(row, "nvlink_gbytes_s", line, label),
            pcie_gen=int(_optional_number(row, "pcie_gen", line, label)),
        )
        _add_unique(specs, name, spec, line, label)
    return specs


def load_spot_bands(path: str | os.PathLike[str] | None = None) -> SpotBands:
    """Interruption bands from ``spot_bands.json`` (bundled one when ``path`` is None)."""
    if path is None:
        ref = resources.files("lightning_srifty") / "data" / "spot_bands.json"
        with resources.as_file(ref) as bundled:
            document = read_json(bundled, CatalogError)
        label = "bundled spot_bands.json"
    else:
        label = str(path)
        document = read_json(path, CatalogError)
    if not isinstance(document, dict):
        raise CatalogError("expected a JSON object", source=label)
    version = document.get("schema_version")
    if version != SPOT_BANDS_SCHEMA_VERSION:
        raise CatalogError(
            f"schema_version {version!r} is not supported (expected {SPOT_BANDS_SCHEMA_VERSION})",
            source=label,
            field="schema_version",
        )
    source = document.get("source")
    if not isinstance(source, str) or not source.strip():
        raise CatalogError("missing or empty", source=label, field="source")
    by_region = document.get("bands")
    if not isinstance(by_region, dict):
        raise CatalogError("expected {region: {instance_type: band}}", source=label, field="bands")
    bands: dict[tuple[str, str], int] = {}
    for region, types in by_region.items():
        if not isinstance(types, dict):
            raise CatalogError("expected {instance_type: band}", source=label, field=region)
        for instance_type, band in types.items():
            if not isinstance(band, int) or isinstance(band, bool) or not 0 <= band <= 4:
                raise CatalogError(
                    f"band {band!r} is not an integer 0..4",
                    source=label,
                    field=f"bands.{region}.{instance_type}",
                )
            bands[(region, instance_type)] = band
    return SpotBands(bands, source)


def skypilot_catalog_path() -> Path | None:
    """Where SkyPilot keeps its AWS catalog, or ``None`` without SkyPilot.

    Computed the way ``sky.catalog.common.get_catalog_path`` does it
    (``$SKY_RUNTIME_DIR`` or ``~``, then ``.sky/catalogs/<schema>/aws/vms.csv``, see
    ``sky/skylet/runtime_utils.py``: ``get_runtime_dir_path``), without importing
    ``sky``: that import alone takes seconds, most of ``srifty plan``'s start-up. The
    schema version is read from the installed ``sky/skylet/constants.py``; only if that
    cannot be read is SkyPilot imported to ask. A pure path lookup: nothing is read or
    downloaded.
    """
    spec = importlib.util.find_spec("sky")
    if spec is None or not spec.submodule_search_locations:
        return None
    schema = _sky_catalog_schema(Path(next(iter(spec.submodule_search_locations))))
    if schema is None:
        common = _sky_catalog_common()
        return None if common is None else Path(common.get_catalog_path(SKYPILOT_AWS_CATALOG))
    runtime = os.path.expanduser(os.environ.get("SKY_RUNTIME_DIR", "~"))
    return Path(runtime) / ".sky" / "catalogs" / schema / SKYPILOT_AWS_CATALOG


def _sky_catalog_schema(package: Path) -> str | None:
    """``CATALOG_SCHEMA_VERSION`` from SkyPilot's constants file, read as text."""
    try:
        text = (package / "skylet" / "constants.py").read_text(encoding="utf-8")
    except OSError:
        return None
    found = re.search(r"^CATALOG_SCHEMA_VERSION\s*=\s*['\"]([A-Za-z0-9_.-]+)['\"]", text, re.M)
    return found.group(1) if found else None


# --- the offer table ------------------------------------------------------------------


def parse_vms_rows(
    rows: Iterable[tuple[int, Mapping[str, str]]],
    columns: Sequence[str],
    label: str,
    networks: Mapping[str, NetworkSpec],
    gpu_specs: Mapping[str, GpuSpec],
    bands: SpotBands,
    *,
    efa: str = DEFAULT_EFA_MODE,
) -> list[Offer]:
    """Offers from SkyPilot ``vms.csv`` rows given as ``(line number, cells)``.

    Raises:
        CatalogError: a required column is missing (named with the file), or a cell
            does not parse (named with its line and column).
    """
    missing = [c for c in VMS_COLUMNS if c not in columns]
    if missing:
        raise CatalogError(
            f"missing column(s) {', '.join(repr(c) for c in missing)}; "
            f"expected the SkyPilot AWS catalog columns {', '.join(VMS_COLUMNS)}",
            source=label,
        )
    memory_by_info: dict[str, float | None] = {}
    offers = []
    for line, row in rows:
        instance_type = _text(row, "InstanceType", line, label)
        accelerator = row["AcceleratorName"].strip()
        count = _positive(row, "AcceleratorCount", line, label)
        info = row["GpuInfo"].strip()
        if info not in memory_by_info:
            memory_by_info[info] = _gpu_memory_gib(info, line, label)
        memory = memory_by_info[info]
        if memory is None:
            spec = gpu_specs.get(accelerator)
            memory = spec.memory_gib if spec is not None else 0.0
        region = _text(row, "Region", line, label)
        network = networks.get(instance_type)
        offers.append(
            Offer(
                instance_type=instance_type,
                accelerator=accelerator,
                accelerator_count=max(int(count), 1),
                accelerator_fraction=min(count, 1.0),
                gpu_memory_gib=memory,
                vcpus=_number(row, "vCPUs", line, label) or 0.0,
                memory_gib=_number(row, "MemoryGiB", line, label) or 0.0,
                region=region,
                zone=_text(row, "AvailabilityZone", line, label),
                ondemand_price=_number(row, "Price", line, label),
                spot_price=_number(row, "SpotPrice", line, label),
                intra_node_link=_link(network, count),
                network_gbps=network.gbps if network is not None else math.nan,
                interruption_band=bands.band(region, instance_type),
                links=(
                    network.node_links(int(count), gpu_specs.get(accelerator), efa)
                    if network is not None
                    else None
                ),
            )
        )
    return offers


def _link(network: NetworkSpec | None, count: float) -> str:
    if network is not None:
        return network.intra_node_link
    return "PCIe" if count > 1 else "none"


def _gpu_memory_gib(info: str, line: int, label: str) -> float | None:
    """Memory of one GPU from the catalog's ``GpuInfo`` Python-literal dict.

    ``None`` where the cell is empty or lists no memory, so the caller falls back to
    the spec table. Parsed with ``ast.literal_eval``: the cell is data, never code.
    """
    if not info:
        return None
    try:
        parsed = ast.literal_eval(info)
    except (ValueError, SyntaxError):
        raise CatalogError(
            f"line {line}: column 'GpuInfo' is not a Python-literal dict: {info[:60]!r}",
            source=label,
        ) from None
    gpus = parsed.get("Gpus") if isinstance(parsed, dict) else None
    if not isinstance(gpus, list) or not gpus or not isinstance(gpus[0], dict):
        return None
    memory = gpus[0].get("MemoryInfo")
    size = memory.get("SizeInMiB") if isinstance(memory, dict) else None
    if not isinstance(size, (int, float)) or size <= 0:
        return None
    return float(size) / _MIB_PER_GIB


def _read_vms(
    source: str | os.PathLike[str],
) -> tuple[list[str], list[tuple[int, dict[str, str]]], str]:
    """Columns, numbered rows and a display label for the chosen catalog source."""
    if isinstance(source, str) and source in CATALOG_SOURCES:
        if source != "bundled":
            path = skypilot_catalog_path()
            if path is not None and path.is_file():
                return _read_vms_through_skypilot(path)
            if source == "skypilot":
                where = "SkyPilot is not installed" if path is None else f"no file at {path}"
                raise CatalogError(
                    f"SkyPilot has no local AWS catalog ({where}); it is never downloaded "
                    "from here: use the bundled snapshot (source 'bundled') or give a "
                    "vms.csv path"
                )
        ref = resources.files("lightning_srifty") / "data" / "aws_vms.csv"
        return (*_parse_csv_text(ref.read_text(encoding="utf-8"), BUNDLED_SOURCE), BUNDLED_SOURCE)
    path = Path(source)
    label = str(path)
    if not path.is_file():
        raise CatalogError(
            f"no such catalog file; valid sources: {', '.join(CATALOG_SOURCES)} or the path "
            "of a SkyPilot-format vms.csv",
            source=label,
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"cannot read ({exc})", source=label) from None
    return (*_parse_csv_text(text, label), label)


def _read_vms_through_skypilot(
    path: Path,
) -> tuple[list[str], list[tuple[int, dict[str, str]]], str]:
    """Reads SkyPilot's local catalog file (it exists: nothing is downloaded).

    The file is the CSV that SkyPilot's own ``read_catalog`` loads with pandas when it
    exists and no refresh interval is asked for; it is read here as text, so planning
    never pays for importing ``sky``.
    """
    label = f"SkyPilot catalog {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"cannot read it ({exc})", source=label) from None
    columns, rows = _parse_csv_text(text, label)
    return columns, rows, label


def _sky_catalog_common() -> Any:
    try:
        return importlib.import_module("sky.catalog.common")
    except ImportError:
        return None


# --- the spec tables ------------------------------------------------------------------


def _load_gpu_table(
    path: str | os.PathLike[str] | None,
) -> tuple[dict[str, GpuSpec], frozenset[str]]:
    label, rows = _read_table(path, "gpu_specs.csv", GPU_SPEC_COLUMNS)
    specs: dict[str, GpuSpec] = {}
    trainable = set()
    for line, row in rows:
        name = _text(row, "name", line, label)
        spec = GpuSpec(
            name=name,
            fp32_tflops=_positive(row, "fp32_tflops", line, label),
            tf32_tflops=_positive(row, "tf32_tflops", line, label),
            fp16_tflops=_positive(row, "fp16_tflops", line, label),
            mem_bw_gbps=_positive(row, "mem_bw_gbps", line, label),
            memory_gib=_positive(row, "memory_gib", line, label),
            source=_text(row, "source", line, label),
            pcie_gen=int(_optional_number(row, "pcie_gen", line, label)),
            nvlink_gbytes_s=_optional_number(row, "nvlink_gbytes_s", line, label),
            tdp_w=_optional_number(row, "tdp_w", line, label),
        )
        _add_unique(specs, name, spec, line, label)
        if _flag(row, "trainable", line, label):
            trainable.add(name)
    return with_power_limits(specs), frozenset(trainable)


def _read_table(
    path: str | os.PathLike[str] | None, bundled_name: str, required: Sequence[str]
) -> tuple[str, list[tuple[int, dict[str, str]]]]:
    if path is None:
        label = f"bundled {bundled_name}"
        text = (resources.files("lightning_srifty") / "data" / bundled_name).read_text(
            encoding="utf-8"
        )
    else:
        label = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CatalogError(f"cannot read ({exc})", source=label) from None
    columns, rows = _parse_csv_text(text, label)
    missing = [c for c in required if c not in columns]
    if missing:
        raise CatalogError(
            f"missing column(s) {', '.join(repr(c) for c in missing)}; "
            f"expected {', '.join(required)}",
            source=label,
        )
    return label, rows


def _parse_csv_text(text: str, label: str) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    reader = csv.DictReader(text.splitlines())
    columns = [c.strip() for c in reader.fieldnames or ()]
    if not columns:
        raise CatalogError("empty file (no header line)", source=label)
    reader.fieldnames = columns
    rows = []
    for record in reader:
        if None in record:
            raise CatalogError(
                f"line {reader.line_num}: more cells than the {len(columns)} columns",
                source=label,
            )
        rows.append((reader.line_num, {k: (v or "") for k, v in record.items()}))
    return columns, rows


def _text(row: Mapping[str, str], column: str, line: int, label: str) -> str:
    value = row[column].strip()
    if not value:
        raise CatalogError(f"line {line}: column '{column}' is empty", source=label)
    return value


def _number(row: Mapping[str, str], column: str, line: int, label: str) -> float | None:
    """A numeric cell; ``None`` when empty (no spot market, no on-demand price)."""
    cell = row[column].strip()
    if not cell:
        return None
    try:
        value = float(cell)
    except ValueError:
        raise CatalogError(
            f"line {line}: column '{column}' is {cell!r}, not a number", source=label
        ) from None
    if not math.isfinite(value) or value < 0:
        raise CatalogError(
            f"line {line}: column '{column}' is {cell!r}; expected a finite number >= 0",
            source=label,
        )
    return value


def _positive(row: Mapping[str, str], column: str, line: int, label: str) -> float:
    value = _number(row, column, line, label)
    if value is None or value <= 0:
        raise CatalogError(
            f"line {line}: column '{column}' must be a number > 0 (got {row[column]!r})",
            source=label,
        )
    return value


def _optional_number(row: Mapping[str, str], column: str, line: int, label: str) -> float:
    """A non-negative number, 0 where the column is absent or the cell empty."""
    if not (row.get(column) or "").strip():
        return 0.0
    return _number(row, column, line, label) or 0.0


def _flag(row: Mapping[str, str], column: str, line: int, label: str) -> bool:
    cell = row[column].strip().lower()
    if cell not in ("true", "false"):
        raise CatalogError(
            f"line {line}: column '{column}' is {row[column]!r}; valid: true, false",
            source=label,
        )
    return cell == "true"


def _add_unique(table: dict[str, Any], name: str, value: Any, line: int, label: str) -> None:
    if name in table:
        raise CatalogError(f"line {line}: duplicate row for {name!r}", source=label)
    table[name] = value
