"""Reading Lambda's public GPU training benchmark (lambdal/deeplearning-benchmark).

Each ``pytorch-train-throughput-{fp16,fp32}.csv`` has one row per (GPU, GPU count) and
one column per model (samples/s). Only used to check cross-GPU scaling factors of the
spec table against measurements; see ``benchmarks/bench_gpu_scaling.py``.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from pathlib import Path

from lightning_srifty.core.errors import TraceError

THROUGHPUT_FILE = "pytorch-train-throughput-{precision}.csv"
LAMBDA_ID_COLUMNS = ("name_gpu", "num_gpu")
_NOT_MODELS = frozenset({"name_gpu", "num_gpu", "watt", "price"})
"""Columns that describe the system; every other column is a model (``ssd`` is the
SSD detector, not a disk)."""

LAMBDA_GPU_TO_SPEC = {
    "Quadro RTX 8000": "Quadro RTX 8000",
    "LambdaCloud V100 16GB": "V100",
    "RTX 3090": "RTX 3090",
    "LambdaCloud A10": "A10",
    "LambdaCloud A100 40GB PCIe": "A100-PCIE",
    "A100 80GB PCIe": "A100-80GB-PCIE",
    "A100 80GB SXM4": "A100-80GB",
    "RTX 6000 Ada": "RTX 6000 Ada",
    "RTX A6000": "RTX A6000",
    "RTX 4090": "RTX 4090",
    "H100 80GB PCIe Gen5": "H100-PCIE",
    "H100 80GB SXM5": "H100",
}
"""Lambda's row name (one system per GPU model) to the spec table's name.

The A100 40GB PCIe has the 40GB SXM row's peak figures at 250 W instead of 400 W
(``A100-PCIE``: its power limit lowers the clock it holds); vendor
variants of the same GPU (Dell, SMC, ...) are left out so each GPU counts once.
"""


@dataclass(frozen=True)
class LambdaRow:
    """Measured training throughput of one system (samples/s per model)."""

    gpu: str
    num_gpu: int
    precision: str
    throughput: dict[str, float]
    """Model name to samples/s; models without a measurement are absent."""


def load_lambda_benchmark(path: str | os.PathLike[str]) -> list[LambdaRow]:
    """All rows of the fp32 and fp16 throughput tables in the folder ``path``.

    Raises:
        TraceError: a file is missing, lacks ``name_gpu``/``num_gpu``, or has a cell
            that is not a number (named with its line and column).
    """
    folder = Path(path)
    rows: list[LambdaRow] = []
    for precision in ("fp32", "fp16"):
        file = folder / THROUGHPUT_FILE.format(precision=precision)
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TraceError(f"cannot read ({exc})", source=str(file)) from None
        reader = csv.DictReader(text.splitlines())
        columns = list(reader.fieldnames or ())
        missing = [c for c in LAMBDA_ID_COLUMNS if c not in columns]
        if missing:
            raise TraceError(f"missing column(s) {', '.join(missing)}", source=str(file))
        models = [c for c in columns if c not in _NOT_MODELS]
        for record in reader:
            line = reader.line_num
            throughput = {}
            for model in models:
                value = _cell(record.get(model) or "", file, line, model)
                if value is not None and value > 0:
                    throughput[model] = value
            count = _cell(record.get("num_gpu") or "", file, line, "num_gpu")
            if count is None or count < 1:
                raise TraceError(f"line {line}: column 'num_gpu' must be >= 1", source=str(file))
            rows.append(LambdaRow(record["name_gpu"].strip(), int(count), precision, throughput))
    return rows


def _cell(cell: str, file: Path, line: int, column: str) -> float | None:
    if not cell.strip():
        return None
    try:
        value = float(cell)
    except ValueError:
        raise TraceError(
            f"line {line}: column '{column}' is {cell!r}, not a number", source=str(file)
        ) from None
    if not math.isfinite(value):
        raise TraceError(f"line {line}: column '{column}' is not finite", source=str(file))
    return value


def single_gpu_throughput(rows: list[LambdaRow], precision: str) -> dict[str, dict[str, float]]:
    """Spec-table GPU name to {model: samples/s} for the 1-GPU systems we map."""
    table: dict[str, dict[str, float]] = {}
    for row in rows:
        spec_name = LAMBDA_GPU_TO_SPEC.get(row.gpu)
        if row.num_gpu == 1 and row.precision == precision and spec_name is not None:
            table[spec_name] = dict(row.throughput)
    return table
