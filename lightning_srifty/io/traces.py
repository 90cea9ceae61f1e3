"""Pollux-format trace folders: validated measurement rows and coarse profiles.

A trace folder holds ``hardware.json`` (one cluster description), ``models.json``
(parameters and gradient dtype per training model) and one sub-folder per model with
``placements.csv`` (``placement, local_bsz, step_time, sync_time``) and optionally
``scalability.csv`` (``num_nodes, num_replicas, local_bsz, step_time, sync_time``).

What the numbers mean (checked against the AdaptDL source and the data): AdaptDL
profiles every *synchronised* optimizer step; ``step_time`` is its wall time and
``sync_time`` the time spent waiting on the gradient all-reduce after backward. On one
GPU ``sync_time`` is a constant ~1 ms hook cost, and across all models
``step_time ≈ compute + sync_time`` holds for multi-GPU rows, so
``step_time - sync_time`` of a single-GPU row is the compute a one-GPU profile would
measure. Gradient-accumulation steps are profiled separately by AdaptDL and are not
in these files.

The single-GPU rows (placement ``1``) of a model are what a one-GPU profile gives,
less one thing AdaptDL does only with one replica: its gradient-noise statistics
(``GradientNoiseScale._final_callback``, petuum/adaptdl ``adaptdl/torch/
gradient_noise_scale.py``) need two gradient samples per step, so with one replica
they keep the previous step's gradients and compare them with the current ones (the
"difference estimation": a clone, an average and two more preconditioned norms, for
every parameter tensor), where several replicas read the samples off the all-reduce.
:func:`coarse_profile` turns the rows into a :class:`Profile` of the job without that
work and records it (``extra.single_process``), so a one-process prediction adds it
back and a multi-process one does not.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from lightning_srifty.core.calibration import hardware_fingerprint
from lightning_srifty.core.catalog import GpuSpec, Offer
from lightning_srifty.core.cluster import Cluster, ClusterGroup
from lightning_srifty.core.errors import TraceError
from lightning_srifty.core.links import NodeLinks, fabric_links, intra_rate
from lightning_srifty.core.perfmodel import single_process_s
from lightning_srifty.core.profile import (
    BatchPoint,
    Environment,
    Memory,
    Profile,
    Spread,
    StepTimes,
)
from lightning_srifty.core.validate import Reader, check_version
from lightning_srifty.io.jsonfile import read_json

PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8}
_Z90 = 1.2816
"""Standard-normal 90th percentile (the profile's p90 from a relative spread)."""
TRACE_MODELS = "trace_models.json"
"""The parameter tensors of the traces' jobs (a table shipped in the package)."""
TRACE_MODELS_SCHEMA_VERSION = 1
SINGLE_REPLICA_OPS_PER_TENSOR = 11
"""Operations AdaptDL issues per parameter tensor with one replica only (master's
``_final_callback``): two more preconditioned norms of the previous and the averaged
gradients (``(g / pinv).pow(2).sum()`` and the Python sum: 4 each), the average
(``(g1 + g2) / 2``: 2) and the clone kept for the next step (1). The Pollux artifact's
older copy (branch osdi21-artifact, ``adascale.py``) divides by a preconditioner only
for Adam, so its SGD jobs issue 9: under 2 % of their one-GPU steps apart."""
SINGLE_REPLICA_BYTES_PER_PARAM = 76.0
"""Bytes those operations move per fp32 parameter: each norm reads the gradient and the
preconditioner and writes the quotient (12), squares it (8) and reads the square (4);
the average reads two gradients and writes one (12), then halves it (8); the clone
reads and writes one (8)."""


@dataclass(frozen=True)
class Hardware:
    """The cluster a trace was measured on (one entry of ``hardware.json``)."""

    instance_type: str
    gpu: str
    gpu_memory_gib: float
    gpus_per_node: int
    intra_node_link: str
    inter_node_gbps: float
    nodes: int
    region: str = ""
    fabric: str = ""
    """``inter_node_fabric``: the network in words (transport, placement group)."""
    intra_note: str = ""
    """``intra_node_note``: the GPU link in words (NVSwitch, PCIe)."""
    links: NodeLinks | None = None
    """Absolute link figures derived from the facts above and the GPU's spec row."""
    memory_bytes_s: float = math.inf
    """The GPU's memory bandwidth from its spec row (``inf``: no row)."""

    def describe(self) -> str:
        return (
            f"{self.nodes}x {self.instance_type} ({self.gpus_per_node}x {self.gpu}, "
            f"{self.intra_node_link}, {self.inter_node_gbps:g} Gbps)"
        )

    def facts(self) -> dict[str, Any]:
        """The fields that identify the hardware (for :func:`hardware_fingerprint`)."""
        return {
            "gpu": self.gpu,
            "gpu_memory_gib": self.gpu_memory_gib,
            "gpus_per_node": self.gpus_per_node,
            "intra_node_link": self.intra_node_link,
            "inter_node_gbps": self.inter_node_gbps,
        }

    @property
    def fingerprint(self) -> str:
        return hardware_fingerprint(self.facts())

    def node_links(self, spec: GpuSpec | None) -> NodeLinks:
        """Links in absolute terms: the GPU link's rate from the GPU's spec row (NVLink
        per GPU, or its PCIe generation) and the network from ``inter_node_fabric``."""
        link = self.intra_node_link.strip().lower()
        if self.gpus_per_node <= 1:
            kind = "none"
        elif "nvlink" in link or "nvswitch" in link:
            kind = "NVSwitch" if "nvswitch" in self.intra_note.lower() else "NVLink"
        else:
            kind = "PCIe"
        nvlink = spec.nvlink_gbytes_s if spec is not None else 0.0
        pcie = spec.pcie_gen if spec is not None else 0
        return fabric_links(
            kind,
            intra_rate(kind, nvlink, pcie),
            self.inter_node_gbps,
            self.gpus_per_node,
            self.fabric,
            self.nodes,
        )

    def offer(self) -> Offer:
        """An :class:`Offer` with the hardware facts (no prices: traces have none)."""
        return Offer(
            instance_type=self.instance_type,
            accelerator=self.gpu,
            accelerator_count=self.gpus_per_node,
            gpu_memory_gib=self.gpu_memory_gib,
            vcpus=0.0,
            memory_gib=0.0,
            region=self.region,
            zone="",
            ondemand_price=None,
            spot_price=None,
            intra_node_link=self.intra_node_link,
            network_gbps=self.inter_node_gbps,
            links=self.links,
        )


@dataclass(frozen=True)
class ModelInfo:
    """One training model of ``models.json``."""

    name: str
    params: int
    grad_dtype: str
    precision: str
    parameter_tensors: int | None = None
    """How many parameter tensors the model has (:data:`TRACE_MODELS`; ``None``: not
    known, and AdaptDL's single-replica work is then left in the one-GPU rows)."""

    @property
    def grad_bytes(self) -> int:
        return self.params * DTYPE_BYTES[self.grad_dtype]

    @property
    def single_replica_work(self) -> tuple[int, float]:
        """``(operations, bytes)`` of AdaptDL's one-replica statistics per step."""
        if self.parameter_tensors is None:
            return 0, 0.0
        return (
            SINGLE_REPLICA_OPS_PER_TENSOR * self.parameter_tensors,
            SINGLE_REPLICA_BYTES_PER_PARAM * self.params,
        )


@dataclass(frozen=True)
class Measurement:
    """One measured row: ``placement`` lists the GPUs used on each node."""

    model: str
    placement: tuple[int, ...]
    local_bsz: int
    step_time: float
    sync_time: float
    source: str
    row: int

    @property
    def replicas(self) -> int:
        return sum(self.placement)

    @property
    def nodes(self) -> int:
        return len(self.placement)


@dataclass(frozen=True)
class TraceSet:
    """A whole trace folder, validated."""

    root: str
    hardware: Hardware
    models: dict[str, ModelInfo]
    rows: dict[str, tuple[Measurement, ...]]

    def single_gpu_rows(self, model: str) -> tuple[Measurement, ...]:
        return tuple(m for m in self.rows[model] if m.placement == (1,))


def _read_hardware(root: Path) -> Hardware:
    path = root / "hardware.json"
    data = read_json(path, TraceError)
    if not isinstance(data, dict) or not data:
        raise TraceError("expected an object with one instance type entry", source=str(path))
    if len(data) != 1:
        raise TraceError(
            f"expected exactly one cluster entry, found {sorted(data)}", source=str(path)
        )
    instance_type, entry = next(iter(data.items()))
    if not isinstance(entry, dict):
        raise TraceError("expected an object", source=str(path), field=instance_type)
    fields = ("gpu", "gpu_memory_gib", "gpus_per_node", "intra_node_link", "inter_node_gbps")
    for key in (*fields, "nodes"):
        if key not in entry:
            raise TraceError("is missing", source=str(path), field=f"{instance_type}.{key}")
    try:
        return Hardware(
            instance_type=instance_type,
            gpu=str(entry["gpu"]),
            gpu_memory_gib=float(entry["gpu_memory_gib"]),
            gpus_per_node=int(entry["gpus_per_node"]),
            intra_node_link=str(entry["intra_node_link"]),
            inter_node_gbps=float(entry["inter_node_gbps"]),
            nodes=int(entry["nodes"]),
            region=str(entry.get("region", "")),
            fabric=str(entry.get("inter_node_fabric", "")),
            intra_note=str(entry.get("intra_node_note", "")),
        )
    except (TypeError, ValueError) as exc:
        raise TraceError(f"bad value ({exc})", source=str(path), field=instance_type) from None


def _read_models(root: Path) -> dict[str, ModelInfo]:
    path = root / "models.json"
    data = read_json(path, TraceError)
    if not isinstance(data, dict):
        raise TraceError("expected an object keyed by model name", source=str(path))
    out = {}
    for name, entry in data.items():
        if name.startswith("_"):
            continue
        if not isinstance(entry, dict):
            raise TraceError("expected an object", source=str(path), field=name)
        params = entry.get("params")
        if isinstance(params, bool) or not isinstance(params, int) or params <= 0:
            raise TraceError(
                f"must be a positive integer, got {params!r}", source=str(path),
                field=f"{name}.params",
            )  # fmt: skip
        dtype = entry.get("grad_dtype", "fp32")
        if dtype not in DTYPE_BYTES:
            raise TraceError(
                f"must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}",
                source=str(path), field=f"{name}.grad_dtype",
            )  # fmt: skip
        note = " ".join(str(entry.get(k, "")) for k in ("note", "network")).lower()
        precision = "16-mixed" if "mixed precision" in note else "32-true"
        known = trace_model_tensors().get(name)
        tensors = known[1] if known is not None and known[0] == params else None
        out[name] = ModelInfo(name, params, dtype, precision, tensors)
    return out


@functools.cache
def trace_model_tensors() -> dict[str, tuple[int, int]]:
    """``{job: (params, parameter tensors)}`` of the shipped :data:`TRACE_MODELS` table."""
    ref = resources.files("lightning_srifty") / "data" / TRACE_MODELS
    source = f"lightning_srifty/data/{TRACE_MODELS}"
    r = Reader(json.loads(ref.read_text(encoding="utf-8")), source=source, error=TraceError)
    check_version(r, TRACE_MODELS_SCHEMA_VERSION, kind="trace model table")
    models = r.child("models")
    assert models is not None
    out = {}
    for name in models.data:
        entry = models.child(name)
        assert entry is not None
        out[name] = (entry.int("params", minimum=1), entry.int("parameter_tensors", minimum=1))
    return out


def _number(text: str, *, path: str, row: int, column: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise TraceError(
            f"row {row}: column '{column}' is not a number: {text!r}", source=path
        ) from None
    if not math.isfinite(value):
        raise TraceError(f"row {row}: column '{column}' is {text!r}", source=path)
    return value


def read_measurements(path: str | os.PathLike[str], model: str) -> tuple[Measurement, ...]:
    """Reads ``placements.csv`` or ``scalability.csv``; rows are numbered from 1 after
    the header. A missing column or a NaN, zero or negative time raises
    :class:`TraceError` naming the file, the row and the column."""
    source = str(path)
    try:
        handle = open(path, newline="", encoding="utf-8")  # noqa: SIM115
    except FileNotFoundError:
        raise TraceError("file not found", source=source) from None
    with handle:
        reader = csv.DictReader(handle)
        header = tuple(reader.fieldnames or ())
        scalability = "num_nodes" in header
        expected = SCALABILITY_COLUMNS if scalability else PLACEMENT_COLUMNS
        for column in expected:
            if column not in header:
                raise TraceError(
                    f"missing column '{column}' (found {', '.join(header) or 'no header'}; "
                    f"expected {', '.join(expected)})",
                    source=source,
                )
        out = []
        for row_no, row in enumerate(reader, start=1):
            values = {c: row.get(c) or "" for c in expected}
            step = _number(values["step_time"], path=source, row=row_no, column="step_time")
            sync = _number(values["sync_time"], path=source, row=row_no, column="sync_time")
            if step <= 0:
                raise TraceError(f"row {row_no}: step_time must be > 0, got {step}", source=source)
            if sync < 0 or sync > step:
                raise TraceError(
                    f"row {row_no}: sync_time must be in [0, step_time], got {sync}",
                    source=source,
                )
            bsz = _number(values["local_bsz"], path=source, row=row_no, column="local_bsz")
            if bsz < 1 or bsz != int(bsz):
                raise TraceError(
                    f"row {row_no}: local_bsz must be a positive integer, got {bsz}",
                    source=source,
                )
            if scalability:
                n = _number(values["num_nodes"], path=source, row=row_no, column="num_nodes")
                r = _number(values["num_replicas"], path=source, row=row_no, column="num_replicas")
                if n < 1 or r < n or n != int(n) or r != int(r):
                    raise TraceError(
                        f"row {row_no}: need integers num_replicas >= num_nodes >= 1, got {r}, {n}",
                        source=source,
                    )
                placement = spread_replicas(int(r), int(n))
            else:
                text = values["placement"].strip()
                if not text.isdigit() or "0" in text:
                    raise TraceError(
                        f"row {row_no}: placement must be digits 1-9 (GPUs per node), got {text!r}",
                        source=source,
                    )
                placement = tuple(int(c) for c in text)
            out.append(Measurement(model, placement, int(bsz), step, sync, source, row_no))
    return tuple(out)


def spread_replicas(replicas: int, nodes: int) -> tuple[int, ...]:
    """Even spread of ``replicas`` over ``nodes`` (how AdaptDL's scalability runs placed
    them), largest first: 20 over 16 -> four nodes with 2 and twelve with 1."""
    base, extra = divmod(replicas, nodes)
    return tuple([base + 1] * extra + [base] * (nodes - extra))


def load_traces(
    root: str | os.PathLike[str],
    models: Sequence[str] | None = None,
    gpu_specs: dict[str, GpuSpec] | None = None,
) -> TraceSet:
    """Loads and validates a Pollux-format trace folder.

    ``scalability.csv`` rows that repeat a ``placements.csv`` row (same node and
    replica count, batch and times: the Sia traces key every placement row both ways)
    are dropped, so no measurement counts twice. ``gpu_specs`` (the bundled table when
    ``None``) gives the GPU link rates behind the hardware's links.
    """
    base = Path(root)
    if not base.is_dir():
        raise TraceError("trace folder not found", source=str(base))
    hardware = _read_hardware(base)
    if gpu_specs is None:
        from lightning_srifty.io.catalog_io import load_gpu_specs

        gpu_specs = load_gpu_specs()
    spec = gpu_specs.get(hardware.gpu)
    hardware = replace(
        hardware,
        links=hardware.node_links(spec),
        memory_bytes_s=spec.mem_bw_gbps * 1e9 if spec is not None else math.inf,
    )
    infos = _read_models(base)
    names = list(models) if models is not None else sorted(
        p.name for p in base.iterdir() if (p / "placements.csv").is_file()
    )  # fmt: skip
    if not names:
        raise TraceError("no <model>/placements.csv found", source=str(base))
    rows: dict[str, tuple[Measurement, ...]] = {}
    for name in names:
        if name not in infos:
            raise TraceError(
                f"model '{name}' has no entry (known: {', '.join(sorted(infos)) or 'none'})",
                source=str(base / "models.json"),
            )
        found = read_measurements(base / name / "placements.csv", name)
        extra = base / name / "scalability.csv"
        if extra.is_file():
            seen = {_row_key(m) for m in found}
            found = found + tuple(
                m for m in read_measurements(extra, name) if _row_key(m) not in seen
            )
        rows[name] = found
    return TraceSet(str(base), hardware, {n: infos[n] for n in names}, rows)


def _row_key(m: Measurement) -> tuple[int, int, int, float, float]:
    return (m.nodes, m.replicas, m.local_bsz, m.step_time, m.sync_time)


def coarse_profile(
    info: ModelInfo, single_gpu: Sequence[Measurement], hardware: Hardware
) -> Profile:
    """A coarse profile built only from a model's single-GPU rows.

    Compute per point is ``step_time - sync_time`` (the one-GPU hook cost is not
    compute), less AdaptDL's one-replica statistics where the model's parameter
    tensors are known (:attr:`ModelInfo.single_replica_work`, priced on this GPU by
    :func:`~lightning_srifty.core.perfmodel.single_process_s`): the job as it runs on
    several processes, with that work recorded in ``extra.single_process`` for the
    one-process predictions that include it. The profiled local batch is the median
    measured batch. Memory is
    parameters, gradients and (unknown, so zero) optimizer state: the traces ran, so
    they fit; the planner still checks this bound.

    The float32 math mode is recorded as TF32 on for matmuls and cuDNN alike: the traces
    were taken with PyTorch before 1.12, whose default let both use TF32 on Ampere (their
    A100 BERT runs 4.6 ms/sample, which the FP32 rate could not reach; the Sia
    artifact's job images are built on PyTorch 1.9.0 with CUDA 11.1:
    ``adaptdl/benchmark/models/*/Dockerfile`` in siasosp23/artifacts).
    """
    if not single_gpu:
        raise TraceError(
            f"model '{info.name}' has no single-GPU rows (placement 1) to profile from",
            source=hardware.instance_type,
        )
    by_batch: dict[int, list[Measurement]] = {}
    for m in single_gpu:
        by_batch.setdefault(m.local_bsz, []).append(m)
    ops, nbytes = info.single_replica_work
    alone = float(single_process_s(ops, nbytes, hardware.memory_bytes_s)) if ops else 0.0
    points = tuple(
        BatchPoint(
            local_batch_size=b,
            step_s=_less(sum(m.step_time for m in ms) / len(ms), alone),
            compute_s=_less(sum(m.step_time - m.sync_time for m in ms) / len(ms), alone),
        )
        for b, ms in sorted(by_batch.items())
    )
    middle = points[len(points) // 2]
    spread = step_roughness(points)
    weights = info.params * 4
    return Profile(
        kind="coarse",
        environment=Environment(
            device_name=f"NVIDIA {hardware.gpu}",
            accelerator=hardware.gpu,
            devices_per_node=1,
            world_size=1,
            num_nodes=1,
            precision=info.precision,
            local_batch_size=middle.local_batch_size,
            torch_version="",
            lightning_version="",
            instance_type=hardware.instance_type,
            region=hardware.region or None,
            float32_matmul_precision="high",
            cudnn_allow_tf32=True,
        ),
        steps=StepTimes(
            step=Spread(
                middle.step_s,
                middle.step_s,
                middle.step_s * (1.0 + _Z90 * spread),
                len(single_gpu),
            ),
            forward_s=0.0,
            backward_s=0.0,
            optimizer_s=0.0,
            data_wait_s=0.0,
            warmup_steps=0,
            measured_steps=len(single_gpu),
        ),
        grad_bytes=info.grad_bytes,
        flops_per_step=0.0,
        memory=Memory(
            param_bytes=weights,
            grad_bytes=info.grad_bytes,
            optimizer_state_bytes=0,
            activation_bytes=0,
            peak_bytes=0,
            peak_kind="unknown",
        ),
        batch_points=points,
        model_name=info.name,
        extra={"single_process": {"ops": ops, "bytes": nbytes}} if ops else {},
    )


SINGLE_REPLICA_MAX_SHARE = 0.5
"""Most of a measured step that AdaptDL's one-replica work is taken to be: beyond it
the parameter count or the GPU's rate is not what ran, and half the step is kept."""


def _less(measured_s: float, single_replica_s: float) -> float:
    """A one-GPU row's time without AdaptDL's one-replica work."""
    return measured_s - min(single_replica_s, SINGLE_REPLICA_MAX_SHARE * measured_s)


def step_roughness(points: Sequence[BatchPoint]) -> float:
    """Relative step-to-step spread of compute that the single-GPU rows reveal.

    Compute is smooth in the local batch unless each step's cost depends on its data
    (random input sizes in multi-scale training, variable-length sequences without
    padding to a fixed length). Each row averages only a few steps, so such jobs leave
    rows that scatter around any smooth curve; a synchronous step then waits for the
    slowest worker. Measured as the relative deviation of every interior point from the
    straight line through its two neighbours (exact for ``alpha + beta·b``), ``sqrt(1.5)``
    being the noise gain of that difference. Zero with fewer than three batch sizes.
    """
    pts = sorted((p.local_batch_size, p.compute_s or p.step_s) for p in points)
    if len(pts) < 3:
        return 0.0
    dev = []
    for (b0, c0), (b1, c1), (b2, c2) in zip(pts, pts[1:], pts[2:], strict=False):
        w = (b2 - b1) / (b2 - b0)
        line = w * c0 + (1 - w) * c2
        dev.append(math.log(max(c1, 1e-12) / max(line, 1e-12)))
    return math.sqrt(sum(d * d for d in dev) / len(dev) / 1.5)


def placement_cluster(placement: Sequence[int], hardware: Hardware) -> Cluster:
    """The cluster a placement describes: nodes grouped by how many GPUs they use."""
    counts: dict[int, int] = {}
    for gpus in placement:
        counts[gpus] = counts.get(gpus, 0) + 1
    offer = hardware.offer()
    return Cluster(
        tuple(ClusterGroup(offer, nodes, gpus) for gpus, nodes in sorted(counts.items()))
    )


def rows_as_dicts(rows: Sequence[Measurement]) -> list[dict[str, Any]]:
    """Measurements as JSON-ready dicts (kept in calibration files for refits)."""
    return [
        {
            "model": m.model,
            "placement": "".join(str(g) for g in m.placement),
            "local_bsz": m.local_bsz,
            "step_time": m.step_time,
            "sync_time": m.sync_time,
        }
        for m in rows
    ]
