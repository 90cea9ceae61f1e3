"""Spot availability traces (skypilot-org/spot-traces format) and their prices.

A trace file is ``{"metadata": {"gap_seconds": N}, "data": [v0, v1, ...]}``: one value per
tick of ``N`` seconds in one availability zone; the zone is the file name up to the
first ``_`` (``us-east-1a_v100_1.json`` → ``us-east-1a``).

What a value means (checked against the data, see ``tests/io/test_spot_traces.py``):

* **Single-node traces: 1 = preempted/unavailable, 0 = available** — the reading of the
  *Can't Be Late* simulator that consumed them (``spot_available = not trace[tick]``).
  On the 9-zone 2023-02 set it gives 10-83 % availability per zone and 91 % in at least
  one zone, the figures DESIGN.md quotes from the paper; the opposite reading ("number of
  available instances", the repository README) gives 17-90 % per zone and 99 % in any
  zone, which matches neither.
* **Multi-node traces** (``preemption-<n>node-…``, values 0..n): the number of the ``n``
  nodes that are up. There the README's reading is the only one that fits (values above
  1 occur, and the full gang ``n`` is the most common value in good zones).

The node count comes from the folder name (``-<n>node-``); a file outside such a folder
is single-node unless a value above 1 shows it is a count.
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from lightning_srifty.core.errors import CatalogError, TraceError
from lightning_srifty.core.spot import SpotTimeline, combine_timelines
from lightning_srifty.io.jsonfile import read_json

_NODES_IN_NAME = re.compile(r"(?:^|[-_])(\d+)node(?:[-_]|$)")


def trace_zone(path: str | os.PathLike[str]) -> str:
    """Zone name of a trace file: its name up to the first underscore."""
    return Path(path).stem.split("_", 1)[0]


def trace_nodes(path: str | os.PathLike[str]) -> int | None:
    """Node count stated by the folder name (``…-4node-…``), or ``None``."""
    match = _NODES_IN_NAME.search(Path(path).resolve().parent.name)
    return int(match.group(1)) if match else None


def load_trace(path: str | os.PathLike[str], nodes: int | None = None) -> SpotTimeline:
    """Reads one zone's trace into a one-zone :class:`SpotTimeline` of nodes up per tick.

    Args:
        path: the JSON file.
        nodes: gang size of the trace; ``None`` reads it from the folder name, else 1.

    Raises:
        TraceError: naming the file and the field or index that is wrong.
    """
    source = str(path)
    doc: Any = read_json(path, TraceError)
    if not isinstance(doc, dict):
        raise TraceError(f"expected an object, got {type(doc).__name__}", source=source)
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        raise TraceError("is missing or not an object", source=source, field="metadata")
    gap = meta.get("gap_seconds")
    if isinstance(gap, bool) or not isinstance(gap, int | float):
        raise TraceError(
            f"must be a number of seconds, got {gap!r}", source=source, field="metadata.gap_seconds"
        )
    if not (math.isfinite(gap) and gap > 0):
        raise TraceError(
            f"must be > 0 seconds, got {gap}", source=source, field="metadata.gap_seconds"
        )
    data = doc.get("data")
    if not isinstance(data, list):
        raise TraceError("is missing or not a list", source=source, field="data")
    if not data:
        raise TraceError("is empty", source=source, field="data")
    for index, value in enumerate(data):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TraceError(
                f"must be a number, got {value!r}", source=source, field=f"data[{index}]"
            )
        if not (math.isfinite(value) and value >= 0 and float(value).is_integer()):
            raise TraceError(
                f"must be a whole number >= 0, got {value!r}", source=source, field=f"data[{index}]"
            )
    values = np.asarray(data, dtype=np.int64)
    count = nodes if nodes is not None else trace_nodes(path)
    if count is None:
        count = max(int(values.max()), 1)
    if count < 1:
        raise TraceError(f"node count must be >= 1, got {count}", source=source)
    top = int(values.max())
    if top > count:
        index = int(np.argmax(values > count))
        raise TraceError(
            f"value {top} exceeds the trace's {count} node(s)",
            source=source,
            field=f"data[{index}]",
        )
    # Single node: 1 means preempted. Multi-node: the value is the nodes up.
    up = (1 - values) if count == 1 else values
    return SpotTimeline(
        zones=(trace_zone(path),),
        gap_hours=float(gap) / 3600.0,
        nodes_up=up.reshape(1, -1),
        capacity=count,
    )


def load_traces(paths: Sequence[str | os.PathLike[str]]) -> SpotTimeline:
    """Reads several zones' traces onto one timeline (aligned by tick, coarsest gap)."""
    if not paths:
        raise TraceError("no trace files given", source="--trace")
    parts = [load_trace(p) for p in paths]
    zones = [p.zones[0] for p in parts]
    if len(set(zones)) != len(zones):
        raise TraceError(f"the same zone appears twice: {zones}", source="--trace")
    return combine_timelines(parts)


def zone_region(zone: str) -> str:
    """AWS region of a zone name: ``us-east-1a`` → ``us-east-1``."""
    return zone.rstrip("abcdefghijklmnopqrstuvwxyz")


def catalog_prices(
    instance_type: str, regions: Sequence[str], catalog_csv: str | os.PathLike[str] | None = None
) -> tuple[tuple[float, ...], float]:
    """Spot price per region and the cheapest on-demand price among those regions.

    The catalog lists zones by zone *ID* (``use1-az1``) while traces are named by zone
    *name* (``us-east-1a``); the mapping differs per AWS account, so each zone gets the
    median spot price of its region.

    Args:
        instance_type: e.g. ``p3.2xlarge``.
        regions: one region per zone, in timeline order.
        catalog_csv: a SkyPilot ``vms.csv``; the bundled snapshot when ``None``.

    Raises:
        CatalogError: the type, or spot for it in one of the regions, is not listed.
    """
    if catalog_csv is None:
        ref = resources.files("lightning_srifty") / "data" / "aws_vms.csv"
        text = ref.read_text(encoding="utf-8")
        source = "bundled aws_vms.csv"
    else:
        source = str(catalog_csv)
        try:
            text = Path(catalog_csv).read_text(encoding="utf-8")
        except OSError as exc:
            raise CatalogError(f"cannot read ({exc})", source=source) from None
    spot: dict[str, list[float]] = {}
    ondemand: dict[str, list[float]] = {}
    for row in csv.DictReader(text.splitlines()):
        if row.get("InstanceType") != instance_type:
            continue
        if row.get("Price"):
            ondemand.setdefault(row.get("Region", ""), []).append(float(row["Price"]))
        if row.get("SpotPrice"):
            spot.setdefault(row.get("Region", ""), []).append(float(row["SpotPrice"]))
    if not ondemand and not spot:
        raise CatalogError(f"unknown instance type {instance_type!r}", source=source)
    missing = sorted({r for r in regions if r not in spot})
    if missing:
        raise CatalogError(
            f"no spot price for {instance_type} in region(s) {', '.join(missing)}", source=source
        )
    ondemand_here = [p for r in regions for p in ondemand.get(r, [])]
    if not ondemand_here:
        raise CatalogError(
            f"no on-demand price for {instance_type} in region(s) "
            f"{', '.join(sorted(set(regions)))}",
            source=source,
        )
    return tuple(float(np.median(spot[r])) for r in regions), min(ondemand_here)
