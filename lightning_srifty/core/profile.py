"""The profile: what one training job measured about itself, as frozen records.

A profile is written by :class:`~lightning_srifty.capture.callback.SriftyCallback` (a
*detailed* profile: per-layer times, buckets, communication) or assembled from totals
only (a *coarse* profile: step time at one or more local batch sizes plus gradient
bytes, e.g. the single-GPU rows of a Pollux trace). Every later stage accepts both.

The on-disk form is versioned JSON. ``Profile.from_dict`` validates every field and
raises :class:`ProfileError` naming the file and the field, so a truncated or
hand-edited file never reaches the model as nonsense.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from lightning_srifty.core.errors import ProfileError
from lightning_srifty.core.validate import Reader, check_version

PROFILE_SCHEMA_VERSION = 1
PROFILE_KINDS = ("detailed", "coarse")
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true", "tf32")
FLOAT32_MATMUL_PRECISIONS = ("highest", "high", "medium")
"""Values of ``torch.get_float32_matmul_precision()``: ``"highest"`` multiplies float32
matrices at the full FP32 rate, ``"high"`` lets cuBLAS use TF32 tensor cores and
``"medium"`` allows bfloat16 internally where a backend has it (CUDA matmuls run it as
TF32, so the model prices it at the TF32 rate)."""
_TF32_DEFAULT_OFF_FROM = (1, 12)
"""PyTorch release whose default turned TF32 matmuls off (1.12: ``allow_tf32 = False``,
``float32_matmul_precision = "highest"``); earlier releases used TF32 on Ampere."""


@dataclass(frozen=True)
class Environment:
    """Where the profile was taken; decides whether compute times transfer as-is."""

    device_name: str
    """Human-readable device, e.g. ``"NVIDIA T4"`` or ``"cpu (x86_64)"``."""
    accelerator: str
    """Catalog accelerator name (``"T4"``, ``"A100-80GB"``) or ``"cpu"``."""
    devices_per_node: int
    world_size: int
    num_nodes: int
    precision: str
    local_batch_size: int
    torch_version: str
    lightning_version: str
    instance_type: str | None = None
    region: str | None = None
    accumulate_grad_batches: int = 1
    """Micro-batches of ``local_batch_size`` per optimizer step; a step is one of those."""
    float32_matmul_precision: str | None = None
    """``torch.get_float32_matmul_precision()`` during the run (one of
    :data:`FLOAT32_MATMUL_PRECISIONS`); ``None`` where the profile did not record it.
    Decides whether a ``32-true`` job's matrix products run at the TF32 or the FP32 rate
    on Ampere and later, a factor of 7 on an H100. The launched job runs the same script,
    so the setting holds on every target, whatever GPU (or CPU) profiled it."""
    cudnn_allow_tf32: bool | None = None
    """``torch.backends.cudnn.allow_tf32`` during the run (cuDNN's convolutions and
    RNNs); ``None`` where the profile did not record it."""

    @property
    def step_batch_size(self) -> int:
        """Samples one device processes per optimizer step (micro-batch × accumulation)."""
        return self.local_batch_size * self.accumulate_grad_batches

    @property
    def matmul_tf32(self) -> bool:
        """Whether float32 matrix products (cuBLAS: Linear, attention) may use TF32.

        A profile that did not record the setting gets the default of the PyTorch that
        took it: off from 1.12 on, on before (and where no version was recorded, as in
        the traces' coarse profiles, whose era ran TF32).
        """
        if self.float32_matmul_precision is not None:
            return self.float32_matmul_precision != "highest"
        release = _release(self.torch_version)
        return release is None or release < _TF32_DEFAULT_OFF_FROM

    @property
    def cudnn_tf32(self) -> bool:
        """Whether cuDNN's float32 convolutions and RNNs may use TF32 (PyTorch's default,
        in every release since TF32 existed, is on)."""
        return True if self.cudnn_allow_tf32 is None else self.cudnn_allow_tf32

    @staticmethod
    def from_reader(r: Reader) -> Environment:
        return Environment(
            device_name=r.str("device_name"),
            accelerator=r.str("accelerator"),
            devices_per_node=r.int("devices_per_node", minimum=1),
            world_size=r.int("world_size", minimum=1),
            num_nodes=r.int("num_nodes", minimum=1),
            precision=r.str("precision"),
            local_batch_size=r.int("local_batch_size", minimum=1),
            torch_version=r.str("torch_version"),
            lightning_version=r.str("lightning_version"),
            instance_type=r.str("instance_type", None),
            region=r.str("region", None),
            accumulate_grad_batches=r.int("accumulate_grad_batches", 1, minimum=1),
            float32_matmul_precision=(
                None
                if r.raw("float32_matmul_precision", None) is None
                else r.choice("float32_matmul_precision", FLOAT32_MATMUL_PRECISIONS)
            ),
            cudnn_allow_tf32=(
                None if r.raw("cudnn_allow_tf32", None) is None else r.bool("cudnn_allow_tf32")
            ),
        )


_MAJOR_MINOR = re.compile(r"(\d+)\.(\d+)")


def _release(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string such as ``"2.13.0+cpu"``; ``None`` if it
    does not start with two numbers."""
    match = _MAJOR_MINOR.match(version)
    return (int(match[1]), int(match[2])) if match else None


@dataclass(frozen=True)
class Spread:
    """Mean and percentiles of a per-step duration in seconds."""

    mean_s: float
    p50_s: float
    p90_s: float
    count: int

    @staticmethod
    def from_reader(r: Reader) -> Spread:
        return Spread(
            mean_s=r.float("mean_s", minimum=0.0),
            p50_s=r.float("p50_s", minimum=0.0),
            p90_s=r.float("p90_s", minimum=0.0),
            count=r.int("count", minimum=0),
        )

    @staticmethod
    def of(samples: list[float] | tuple[float, ...]) -> Spread:
        """Summarises samples (pure Python so core stays numpy-light)."""
        if not samples:
            return Spread(0.0, 0.0, 0.0, 0)
        ordered = sorted(samples)

        def pct(q: float) -> float:
            pos = q * (len(ordered) - 1)
            lo = int(pos)
            hi = min(lo + 1, len(ordered) - 1)
            return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

        return Spread(sum(ordered) / len(ordered), pct(0.5), pct(0.9), len(ordered))


@dataclass(frozen=True)
class StepTimes:
    """Per-step phase means (seconds) and the spread of whole-step time."""

    step: Spread
    forward_s: float
    backward_s: float
    optimizer_s: float
    data_wait_s: float
    warmup_steps: int
    measured_steps: int

    @staticmethod
    def from_reader(r: Reader) -> StepTimes:
        step = r.child("step")
        assert step is not None
        return StepTimes(
            step=Spread.from_reader(step),
            forward_s=r.float("forward_s", minimum=0.0),
            backward_s=r.float("backward_s", minimum=0.0),
            optimizer_s=r.float("optimizer_s", minimum=0.0),
            data_wait_s=r.float("data_wait_s", minimum=0.0),
            warmup_steps=r.int("warmup_steps", minimum=0),
            measured_steps=r.int("measured_steps", minimum=0),
        )


@dataclass(frozen=True)
class LayerTiming:
    """One module's own share of a step, in forward execution order (backward runs in
    reverse). Times are self times (nested records excluded); every parameter of the
    model is counted in exactly one layer."""

    name: str
    """Module path in the LightningModule (the LightningModule's class name for itself)."""
    block: str
    """Branch of the model it sits in, below single-child wrappers such as ``model``."""
    module_type: str
    forward_s: float
    backward_s: float
    param_count: int
    param_bytes: int
    flops: float
    """Forward + backward FLOPs per step at the profiled local batch (0 if unknown)."""
    activation_bytes: int
    """Bytes of this layer's outputs per step (kept for backward) at the local batch."""

    @staticmethod
    def from_reader(r: Reader) -> LayerTiming:
        return LayerTiming(
            name=r.str("name"),
            block=r.str("block"),
            module_type=r.str("module_type"),
            forward_s=r.float("forward_s", minimum=0.0),
            backward_s=r.float("backward_s", minimum=0.0),
            param_count=r.int("param_count", minimum=0),
            param_bytes=r.int("param_bytes", minimum=0),
            flops=r.float("flops", 0.0, minimum=0.0),
            activation_bytes=r.int("activation_bytes", 0, minimum=0),
        )


@dataclass(frozen=True)
class BlockTiming:
    """Layers rolled up per top-level block, for the summary table."""

    name: str
    forward_s: float
    backward_s: float
    param_bytes: int
    flops: float

    @staticmethod
    def from_reader(r: Reader) -> BlockTiming:
        return BlockTiming(
            name=r.str("name"),
            forward_s=r.float("forward_s", minimum=0.0),
            backward_s=r.float("backward_s", minimum=0.0),
            param_bytes=r.int("param_bytes", minimum=0),
            flops=r.float("flops", 0.0, minimum=0.0),
        )


@dataclass(frozen=True)
class GradParam:
    """One trainable parameter's gradient: what the all-reduce must move."""

    name: str
    numel: int
    dtype: str
    bytes: int

    @staticmethod
    def from_reader(r: Reader) -> GradParam:
        return GradParam(
            name=r.str("name"),
            numel=r.int("numel", minimum=0),
            dtype=r.str("dtype"),
            bytes=r.int("bytes", minimum=0),
        )


@dataclass(frozen=True)
class Bucket:
    """One DDP gradient bucket, with when it became ready and how long it took."""

    index: int
    """DDP's bucket index (bucket 0 holds the last layers, so it is usually ready first)."""
    bytes: int
    num_params: int
    ready_order: int
    """0 for the first bucket to become ready during backward, and so on."""
    ready_offset_s: float
    """Mean time from the start of backward until this bucket was ready."""
    allreduce_s: float
    """Mean wall time of this bucket's all-reduce, from the communication hook."""

    @staticmethod
    def from_reader(r: Reader) -> Bucket:
        return Bucket(
            index=r.int("index", minimum=0),
            bytes=r.int("bytes", minimum=0),
            num_params=r.int("num_params", minimum=0),
            ready_order=r.int("ready_order", minimum=0),
            ready_offset_s=r.float("ready_offset_s", minimum=0.0),
            allreduce_s=r.float("allreduce_s", minimum=0.0),
        )


@dataclass(frozen=True)
class Communication:
    """Per-step gradient synchronisation, as measured under DDP."""

    backend: str
    allreduce_s: float
    """Sum of bucket all-reduce times per step (on the communication stream)."""
    exposed_s: float
    """Part of the step the trainer waited on communication after backward finished."""

    @staticmethod
    def from_reader(r: Reader) -> Communication:
        return Communication(
            backend=r.str("backend"),
            allreduce_s=r.float("allreduce_s", minimum=0.0),
            exposed_s=r.float("exposed_s", minimum=0.0),
        )


@dataclass(frozen=True)
class DataLoading:
    """What the training loader's worker processes spent making batches while profiled.

    With ``num_workers > 0`` batches are made in other processes while the GPU trains,
    so a step waits for data only once the workers together make batches slower than
    the step uses them: a profile on a slow GPU shows no wait, and the same loader can
    set the pace on a GPU five times faster. The measured step cannot tell; the
    workers' CPU time can (a loader in the training process is already in the step's
    host time).
    """

    workers: int
    """The loader's worker processes (``DataLoader(num_workers=...)``)."""
    cpu_s_per_batch: float
    """CPU seconds (user and system, all workers together) per batch they made."""
    batches: int
    """Batches the measurement covers."""

    def cpu_s_per_sample(self, batch_size: int) -> float:
        """The workers' CPU per sample, for batches of ``batch_size`` as profiled."""
        return self.cpu_s_per_batch / max(batch_size, 1)

    @staticmethod
    def from_reader(r: Reader) -> DataLoading:
        return DataLoading(
            workers=r.int("workers", minimum=1),
            cpu_s_per_batch=r.float("cpu_s_per_batch", minimum=0.0),
            batches=r.int("batches", minimum=1),
        )


@dataclass(frozen=True)
class Memory:
    """Memory the planner must fit on each device, in bytes."""

    param_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    activation_bytes: int
    """Activations kept for backward at the profiled local batch."""
    peak_bytes: int
    peak_kind: str
    """``"cuda_max_allocated"`` or ``"cpu_rss"`` (RSS includes the whole process)."""

    @staticmethod
    def from_reader(r: Reader) -> Memory:
        return Memory(
            param_bytes=r.int("param_bytes", minimum=0),
            grad_bytes=r.int("grad_bytes", minimum=0),
            optimizer_state_bytes=r.int("optimizer_state_bytes", minimum=0),
            activation_bytes=r.int("activation_bytes", minimum=0),
            peak_bytes=r.int("peak_bytes", minimum=0),
            peak_kind=r.choice("peak_kind", ("cuda_max_allocated", "cpu_rss", "unknown")),
        )


@dataclass(frozen=True)
class BatchPoint:
    """Mean step time measured at one local batch size (basis of ``alpha + beta*b``)."""

    local_batch_size: int
    step_s: float
    compute_s: float | None = None
    """Step time without synchronisation, when known."""

    @staticmethod
    def from_reader(r: Reader) -> BatchPoint:
        return BatchPoint(
            local_batch_size=r.int("local_batch_size", minimum=1),
            step_s=r.float("step_s", positive=True),
            compute_s=r.float("compute_s", None, minimum=0.0),
        )


@dataclass(frozen=True)
class RankSummary:
    """What one rank measured, so stragglers and imbalance stay visible."""

    rank: int
    step_mean_s: float
    forward_s: float
    backward_s: float
    allreduce_s: float
    exposed_comm_s: float
    peak_memory_bytes: int

    @staticmethod
    def from_reader(r: Reader) -> RankSummary:
        return RankSummary(
            rank=r.int("rank", minimum=0),
            step_mean_s=r.float("step_mean_s", minimum=0.0),
            forward_s=r.float("forward_s", minimum=0.0),
            backward_s=r.float("backward_s", minimum=0.0),
            allreduce_s=r.float("allreduce_s", minimum=0.0),
            exposed_comm_s=r.float("exposed_comm_s", minimum=0.0),
            peak_memory_bytes=r.int("peak_memory_bytes", minimum=0),
        )


@dataclass(frozen=True)
class StatEfficiency:
    """Gradient statistics for the noise scale (McCandlish et al. 2018)."""

    grad_sqr: float
    """Estimate of |G|^2, the squared norm of the true gradient."""
    grad_var: float
    """Estimate of tr(Sigma), the per-sample gradient variance summed over parameters."""
    batch_size: int
    """Global batch at which the statistics were measured."""

    @staticmethod
    def from_reader(r: Reader) -> StatEfficiency:
        return StatEfficiency(
            grad_sqr=r.float("grad_sqr", minimum=0.0),
            grad_var=r.float("grad_var", minimum=0.0),
            batch_size=r.int("batch_size", minimum=1),
        )

    @property
    def noise_scale(self) -> float:
        """B_simple = tr(Sigma)/|G|^2; infinite when the gradient vanished."""
        return self.grad_var / self.grad_sqr if self.grad_sqr > 0 else float("inf")


@dataclass(frozen=True)
class Profile:
    """A complete profile. ``kind == "coarse"`` profiles leave the detail tuples empty."""

    kind: str
    environment: Environment
    steps: StepTimes
    grad_bytes: int
    """Bytes all-reduced per step (sum of ``gradients``' bytes when present)."""
    flops_per_step: float
    memory: Memory
    layers: tuple[LayerTiming, ...] = ()
    blocks: tuple[BlockTiming, ...] = ()
    gradients: tuple[GradParam, ...] = ()
    buckets: tuple[Bucket, ...] = ()
    communication: Communication | None = None
    batch_points: tuple[BatchPoint, ...] = ()
    ranks: tuple[RankSummary, ...] = ()
    stat_efficiency: StatEfficiency | None = None
    data_loading: DataLoading | None = None
    """The training loader's workers' cost, when it has workers (detailed profiles)."""
    model_name: str = ""
    created_at: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    schema_version: int = PROFILE_SCHEMA_VERSION

    @property
    def is_detailed(self) -> bool:
        return self.kind == "detailed"

    @property
    def synced_logs_per_step(self) -> int:
        """Values the script logs every step with ``sync_dist=True`` (``extra.synced_logs``).

        Lightning all-reduces each such value on every step it is logged
        (``_ResultMetric.update``: ``self.meta.sync(value.clone())`` for ``on_step``
        metrics), one blocking collective of one scalar apiece, which a one-process
        profile never pays.
        """
        synced = self.extra.get("synced_logs")
        return int(synced["per_step"]) if isinstance(synced, dict) else 0

    @property
    def single_process_work(self) -> tuple[int, float]:
        """``(operations, bytes)`` of work the job does each step only when it runs as
        one process (``extra.single_process``; ``(0, 0.0)``: none).

        A measurement of one process includes it and a multi-process run does not, so
        the model adds it back only where a plan runs one process
        (:func:`~lightning_srifty.core.perfmodel.single_process_s`). The trace sets'
        harness does such work: AdaptDL's gradient-noise statistics, with one replica,
        keep the previous step's gradients and take two more norms
        (:mod:`lightning_srifty.io.traces`).
        """
        alone = self.extra.get("single_process")
        if not isinstance(alone, dict):
            return 0, 0.0
        return int(alone["ops"]), float(alone["bytes"])

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict; ``from_dict(to_dict(p)) == p``."""
        out = asdict(self)
        for key in ("layers", "blocks", "gradients", "buckets", "batch_points", "ranks"):
            out[key] = list(out[key])
        return out

    @staticmethod
    def from_dict(data: Any, *, source: str | None = None) -> Profile:
        """Validates ``data``; raises :class:`ProfileError` naming ``source`` and field."""
        r = Reader(data, source=source, error=ProfileError)
        version = check_version(r, PROFILE_SCHEMA_VERSION, kind="profile")
        kind = r.choice("kind", PROFILE_KINDS)
        env = r.child("environment")
        steps = r.child("steps")
        mem = r.child("memory")
        assert env is not None and steps is not None and mem is not None
        comm = r.child("communication", None)
        stat = r.child("stat_efficiency", None)
        loading = r.child("data_loading", None)
        extra = r.raw("extra", {})
        if not isinstance(extra, dict):
            raise r.fail("extra", "expected an object")
        synced = Reader(extra, source=source, path="extra", error=ProfileError).child(
            "synced_logs", None
        )
        if synced is not None:
            synced.int("per_step", minimum=0)
        alone = Reader(extra, source=source, path="extra", error=ProfileError).child(
            "single_process", None
        )
        if alone is not None:
            alone.int("ops", minimum=0)
            alone.float("bytes", minimum=0.0)
        profile = Profile(
            kind=kind,
            environment=Environment.from_reader(env),
            steps=StepTimes.from_reader(steps),
            grad_bytes=r.int("grad_bytes", minimum=0),
            flops_per_step=r.float("flops_per_step", 0.0, minimum=0.0),
            memory=Memory.from_reader(mem),
            layers=tuple(LayerTiming.from_reader(x) for x in r.children("layers", [])),
            blocks=tuple(BlockTiming.from_reader(x) for x in r.children("blocks", [])),
            gradients=tuple(GradParam.from_reader(x) for x in r.children("gradients", [])),
            buckets=tuple(Bucket.from_reader(x) for x in r.children("buckets", [])),
            communication=Communication.from_reader(comm) if comm else None,
            batch_points=tuple(BatchPoint.from_reader(x) for x in r.children("batch_points", [])),
            ranks=tuple(RankSummary.from_reader(x) for x in r.children("ranks", [])),
            stat_efficiency=StatEfficiency.from_reader(stat) if stat else None,
            data_loading=DataLoading.from_reader(loading) if loading else None,
            model_name=r.str("model_name", ""),
            created_at=r.str("created_at", ""),
            extra=dict(extra),
            schema_version=version,
        )
        if kind == "detailed" and not profile.layers and "compiled" not in profile.extra:
            # a compiled model is timed whole (capture/compiled.py): no layer records
            raise r.fail(
                "layers", "a detailed profile needs at least one layer (or extra.compiled)"
            )
        if kind == "coarse" and not profile.batch_points and profile.steps.step.mean_s <= 0:
            raise r.fail(
                "batch_points", "a coarse profile needs batch_points or a positive step time"
            )
        return profile

    def step_points(self) -> tuple[BatchPoint, ...]:
        """Measured (local batch, step time) points; falls back to the profiled step."""
        if self.batch_points:
            return self.batch_points
        compute = self.steps.step.mean_s
        if self.communication is not None:
            compute = max(compute - self.communication.exposed_s, 0.0)
        return (
            BatchPoint(
                local_batch_size=self.environment.step_batch_size,
                step_s=self.steps.step.mean_s,
                compute_s=compute,
            ),
        )
