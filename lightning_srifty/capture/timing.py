"""Pure accumulators behind :class:`SriftyCallback`: durations in, profile out.

No torch and no Lightning here, so the arithmetic (means, rank merging, bucket order)
is testable in isolation and the callback stays a thin adapter that only turns hooks
into durations. A :class:`RankMeasurement` is plain data, so ranks can exchange it
with ``all_gather_object`` and rank zero can build one :class:`Profile`.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_srifty.core.profile import (
    BlockTiming,
    Bucket,
    Communication,
    DataLoading,
    Environment,
    GradParam,
    LayerTiming,
    Memory,
    Profile,
    RankSummary,
    Spread,
    StepTimes,
)


@dataclass(frozen=True)
class StepRecord:
    """Phase durations of one measured step, in seconds."""

    step_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    data_wait_s: float
    allreduce_s: float = 0.0
    exposed_comm_s: float = 0.0


@dataclass(frozen=True)
class BucketEvent:
    """One bucket's all-reduce in one step (offsets from the start of backward)."""

    index: int
    bytes: int
    num_params: int
    ready_offset_s: float
    allreduce_s: float


@dataclass(frozen=True)
class LayerInfo:
    """Static facts about a leaf module, known without running it."""

    name: str
    block: str
    module_type: str
    param_count: int
    param_bytes: int


@dataclass
class LayerAccumulator:
    """Per-layer forward/backward sums over the measured steps."""

    forward_s: dict[str, float] = field(default_factory=dict)
    backward_s: dict[str, float] = field(default_factory=dict)
    steps: int = 0

    def add_step(self, forward_s: dict[str, float], backward_s: dict[str, float]) -> None:
        for name, value in forward_s.items():
            self.forward_s[name] = self.forward_s.get(name, 0.0) + value
        for name, value in backward_s.items():
            self.backward_s[name] = self.backward_s.get(name, 0.0) + value
        self.steps += 1

    def means(self) -> dict[str, tuple[float, float]]:
        """Mean (forward_s, backward_s) per step for every layer seen."""
        n = max(self.steps, 1)
        names = set(self.forward_s) | set(self.backward_s)
        return {
            name: (self.forward_s.get(name, 0.0) / n, self.backward_s.get(name, 0.0) / n)
            for name in names
        }


@dataclass
class BucketAccumulator:
    """Per-bucket ready offset, all-reduce time and ready order over steps.

    Ready order is recomputed per step from the offsets and the most common order wins,
    because DDP rebuilds buckets after the first iteration and one noisy step should
    not reorder the summary.
    """

    events: dict[int, list[BucketEvent]] = field(default_factory=dict)
    orders: dict[int, list[int]] = field(default_factory=dict)

    def add_step(self, step_events: Sequence[BucketEvent]) -> None:
        ranked = sorted(step_events, key=lambda e: (e.ready_offset_s, e.index))
        for order, event in enumerate(ranked):
            self.events.setdefault(event.index, []).append(event)
            self.orders.setdefault(event.index, []).append(order)

    def buckets(self) -> tuple[Bucket, ...]:
        out = []
        for index, events in self.events.items():
            orders = self.orders[index]
            out.append(
                (
                    max(set(orders), key=lambda o: (orders.count(o), -o)),
                    Bucket(
                        index=index,
                        bytes=events[-1].bytes,
                        num_params=events[-1].num_params,
                        ready_order=0,
                        ready_offset_s=_mean([e.ready_offset_s for e in events]),
                        allreduce_s=_mean([e.allreduce_s for e in events]),
                    ),
                )
            )
        out.sort(key=lambda pair: (pair[0], pair[1].ready_offset_s))
        return tuple(
            Bucket(b.index, b.bytes, b.num_params, order, b.ready_offset_s, b.allreduce_s)
            for order, (_, b) in enumerate(out)
        )


@dataclass(frozen=True)
class RankMeasurement:
    """Everything one rank measured in its window; plain data for gathering."""

    rank: int
    steps: tuple[StepRecord, ...]
    layers: dict[str, tuple[float, float]]
    """Mean (forward_s, backward_s) per step, keyed by layer name."""
    buckets: tuple[Bucket, ...]
    peak_memory_bytes: int

    def summary(self) -> RankSummary:
        return RankSummary(
            rank=self.rank,
            step_mean_s=_mean([s.step_s for s in self.steps]),
            forward_s=_mean([s.forward_s for s in self.steps]),
            backward_s=_mean([s.backward_s for s in self.steps]),
            allreduce_s=_mean([s.allreduce_s for s in self.steps]),
            exposed_comm_s=_mean([s.exposed_comm_s for s in self.steps]),
            peak_memory_bytes=self.peak_memory_bytes,
        )


@dataclass(frozen=True)
class ModelFacts:
    """What the profile needs besides timings: sizes, FLOPs, memory, environment."""

    model_name: str
    environment: Environment
    layers: tuple[LayerInfo, ...]
    """Leaf modules in forward execution order."""
    gradients: tuple[GradParam, ...]
    param_bytes: int
    """All parameters of the model, trainable or not."""
    layer_flops: dict[str, float]
    layer_activation_bytes: dict[str, int]
    flops_per_step: float
    optimizer_state_bytes: int
    peak_kind: str
    warmup_steps: int
    comm_backend: str | None
    """``None`` when not distributed (no :class:`Communication` record)."""
    created_at: str = ""
    dataset_size: int | None = None
    """Samples one epoch consumes across all ranks (for ``--epochs`` targets), if known."""
    validation: dict[str, Any] | None = None
    """Validation passes between training batches (``callback._validation_facts``)."""
    trainer_limits: dict[str, Any] | None = None
    """The script's own ``max_steps``/``max_epochs``, batches per epoch and measured
    optimizer steps per batch (see ``callback._trainer_limits``)."""
    script: dict[str, Any] | None = None
    """What the script fixes in ``Trainer(...)`` and how it builds it (LightningCLI or
    not), when the launcher's profiling run recorded it."""
    host_share: dict[str, float] | None = None
    """A CPU profile's share of a core while computing (``cpu_share``) and its intra-op
    threads (``intra_op_threads``); ``None`` on GPUs."""
    hooks: dict[str, float] | None = None
    """The hooked window against the hook-free warm-up steps (:func:`hook_overhead_scale`)."""
    data_loading: DataLoading | None = None
    """The training loader's workers' CPU per batch over the window (with workers)."""
    compiled: dict[str, Any] | None = None
    """What in the step is ``torch.compile``'d and how many window steps compiled (left
    out); ``None`` when nothing is."""
    synced_logs: tuple[str, ...] = ()
    """Values the training loop logs every step with ``sync_dist=True`` (one all-reduce
    a step apiece under DDP)."""
    activation_bytes: int | None = None
    """Activations of a step where no layer records hold them (a compiled model);
    ``None``: the sum of ``layer_activation_bytes``."""


def ancestors(name: str) -> list[str]:
    """Dotted module paths above ``name``, nearest first, ending with the root ``""``."""
    out = []
    while name:
        name = name.rpartition(".")[0]
        out.append(name)
    return out


def exclusive_nested(inclusive: Mapping[str, float]) -> dict[str, float]:
    """Per module, its inclusive value minus that of its nearest measured descendants.

    Nesting follows the dotted module paths: a module's nearest measured descendants are
    the measured modules whose nearest measured ancestor it is. Used for backward
    spans and FLOP counts, which nest like the module tree. Clamped at zero.
    """
    children: dict[str, float] = {}
    for name, value in inclusive.items():
        if not name:
            continue
        parent = next((a for a in ancestors(name) if a in inclusive), None)
        if parent is not None:
            children[parent] = children.get(parent, 0.0) + value
    return {name: max(value - children.get(name, 0.0), 0.0) for name, value in inclusive.items()}


@dataclass(frozen=True)
class CallSpan:
    """One module call in one step: who called it and how long it took, inclusive."""

    name: str
    parent: int
    """Index of the enclosing call in the same list, or -1 for an outermost call."""
    seconds: float


def exclusive_calls(calls: Sequence[CallSpan]) -> dict[str, float]:
    """Self time per module: each call's duration minus its direct sub-calls', summed.

    Forward calls nest by the dynamic call stack (a module may be called from anywhere,
    not only from its parent), so the stack recorded by the hooks decides, not the paths.
    """
    inner = [0.0] * len(calls)
    for call in calls:
        if call.parent >= 0:
            inner[call.parent] += call.seconds
    out: dict[str, float] = {}
    for call, sub in zip(calls, inner, strict=True):
        out[call.name] = out.get(call.name, 0.0) + max(call.seconds - sub, 0.0)
    return out


def fold_into_records(values: Mapping[str, float], records: Collection[str]) -> dict[str, float]:
    """Moves each module's value to its nearest record (itself or an ancestor).

    Values of modules with no record above them (the root's own time when the root is
    no record) are dropped: they belong to no layer.
    """
    out: dict[str, float] = {}
    for name, value in values.items():
        owner = (
            name if name in records else next((a for a in ancestors(name) if a in records), None)
        )
        if owner is not None:
            out[owner] = out.get(owner, 0.0) + value
    return out


def assign_parameters(
    owners: Sequence[tuple[str, int, int]], records: Collection[str]
) -> tuple[dict[str, tuple[int, int]], tuple[str, ...]]:
    """Gives every parameter to exactly one record.

    Args:
        owners: ``(owning module, numel, bytes)`` per distinct parameter.
        records: Modules that are records already (they ran, or own parameters).

    Returns:
        ``(count, bytes)`` per record, and the modules that had to become records of
        their own (they own parameters but neither they nor an ancestor is a record).
        A parameter goes to its own module when that is a record, else to the nearest
        record above it: ``MultiheadAttention`` uses its ``out_proj`` weights without
        calling ``out_proj``, so they are the attention record's.
    """
    known = set(records)
    added: list[str] = []
    totals: dict[str, tuple[int, int]] = {}
    for module, numel, size in owners:
        owner = (
            module if module in known else next((a for a in ancestors(module) if a in known), None)
        )
        if owner is None:
            owner = module
            known.add(module)
            added.append(module)
        count, total = totals.get(owner, (0, 0))
        totals[owner] = (count + numel, total + size)
    return totals, tuple(added)


def block_names(records: Sequence[str]) -> dict[str, str]:
    """The block of each record, following the model's structure through wrappers.

    Starting at the root, descend while exactly one child holds every record below
    (a wrapper such as ``self.model`` or ``self.net``); the children of the first node
    that branches are the blocks. A record at or above that node is its own block.
    """
    base = ""
    while True:
        prefix = f"{base}." if base else ""
        heads = {
            r[len(prefix) :].split(".", 1)[0] for r in records if r != base and r.startswith(prefix)
        }
        if len(heads) != 1:
            break
        base = prefix + heads.pop()
    prefix = f"{base}." if base else ""
    out = {}
    for r in records:
        if r and r.startswith(prefix) and r != base:
            out[r] = prefix + r[len(prefix) :].split(".", 1)[0]
        else:
            out[r] = r
    return out


def build_profile(measurements: Sequence[RankMeasurement], facts: ModelFacts) -> Profile:
    """Merges every rank's window into one detailed profile.

    Layer and phase times are averaged over ranks (they run the same model on equal
    shards); the step spread pools every rank's samples so a straggler widens p90.
    Buckets come from rank zero, whose layout all ranks share by construction of DDP.
    """
    if not measurements:
        raise ValueError("build_profile needs at least one rank's measurement")
    ordered = sorted(measurements, key=lambda m: m.rank)
    all_steps = [s for m in ordered for s in m.steps]
    layer_means = {
        info.name: (
            _mean([m.layers.get(info.name, (0.0, 0.0))[0] for m in ordered]),
            _mean([m.layers.get(info.name, (0.0, 0.0))[1] for m in ordered]),
        )
        for info in facts.layers
    }
    layers = tuple(
        LayerTiming(
            name=info.name,
            block=info.block,
            module_type=info.module_type,
            forward_s=layer_means[info.name][0],
            backward_s=layer_means[info.name][1],
            param_count=info.param_count,
            param_bytes=info.param_bytes,
            flops=facts.layer_flops.get(info.name, 0.0),
            activation_bytes=facts.layer_activation_bytes.get(info.name, 0),
        )
        for info in facts.layers
    )
    grad_bytes = sum(g.bytes for g in facts.gradients)
    summaries = tuple(m.summary() for m in ordered)
    communication = (
        Communication(
            backend=facts.comm_backend,
            allreduce_s=_mean([s.allreduce_s for s in all_steps]),
            exposed_s=_mean([s.exposed_comm_s for s in all_steps]),
        )
        if facts.comm_backend is not None
        else None
    )
    return Profile(
        kind="detailed",
        environment=facts.environment,
        steps=StepTimes(
            step=Spread.of([s.step_s for s in all_steps]),
            forward_s=_mean([s.forward_s for s in all_steps]),
            backward_s=_mean([s.backward_s for s in all_steps]),
            optimizer_s=_mean([s.optimizer_s for s in all_steps]),
            data_wait_s=_mean([s.data_wait_s for s in all_steps]),
            warmup_steps=facts.warmup_steps,
            measured_steps=len(ordered[0].steps),
        ),
        grad_bytes=grad_bytes,
        flops_per_step=facts.flops_per_step,
        memory=Memory(
            param_bytes=facts.param_bytes,
            grad_bytes=grad_bytes,
            optimizer_state_bytes=facts.optimizer_state_bytes,
            activation_bytes=(
                facts.activation_bytes
                if facts.activation_bytes is not None
                else sum(facts.layer_activation_bytes.values())
            ),
            peak_bytes=max(m.peak_memory_bytes for m in ordered),
            peak_kind=facts.peak_kind,
        ),
        layers=layers,
        blocks=roll_up_blocks(layers),
        gradients=facts.gradients,
        buckets=ordered[0].buckets,
        communication=communication,
        ranks=summaries,
        data_loading=facts.data_loading,
        model_name=facts.model_name,
        created_at=facts.created_at,
        extra=_extra(facts),
    )


def roll_up_blocks(layers: Sequence[LayerTiming]) -> tuple[BlockTiming, ...]:
    """Sums layers per top-level block, keeping first-seen (forward) order."""
    sums: dict[str, list[float]] = {}
    for layer in layers:
        acc = sums.setdefault(layer.block, [0.0, 0.0, 0.0, 0.0])
        acc[0] += layer.forward_s
        acc[1] += layer.backward_s
        acc[2] += layer.param_bytes
        acc[3] += layer.flops
    return tuple(
        BlockTiming(name=name, forward_s=f, backward_s=b, param_bytes=int(p), flops=fl)
        for name, (f, b, p, fl) in sums.items()
    )


def _extra(facts: ModelFacts) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if facts.dataset_size:
        extra["dataset_size"] = facts.dataset_size
    if facts.validation is not None:
        extra["validation"] = dict(facts.validation)
    if facts.trainer_limits:
        extra["trainer"] = dict(facts.trainer_limits)
    if facts.script is not None:
        extra["script"] = dict(facts.script)
    if facts.host_share is not None:
        extra["host"] = dict(facts.host_share)
    if facts.hooks is not None:
        extra["hooks"] = dict(facts.hooks)
    if facts.compiled is not None:
        extra["compiled"] = dict(facts.compiled)
    if facts.synced_logs:
        extra["synced_logs"] = {
            "per_step": len(facts.synced_logs),
            "names": list(dict.fromkeys(facts.synced_logs)),
        }
    return extra


MAX_EXTENSION_FACTOR = 10
"""A measured phase grows to at most this many times its configured step count."""


def steps_to_cover(spans: Sequence[float], min_seconds: float, room: int | float) -> int:
    """How many more steps a measured phase takes when it spans less than ``min_seconds``.

    A step count alone makes a window of tiny steps tiny in time: 20 steps of 2 ms are
    40 ms of measurement, and one burst of other work on the machine moves their mean
    by a quarter (the local demo's profile read 2.0-3.6 ms where its run took 1.8 ms).
    So a phase whose steps so far (``spans``) cover less than ``min_seconds`` runs
    :data:`MAX_EXTENSION_FACTOR` times as many steps, never past ``room`` (what the run
    can spare). All or nothing rather than just enough: under the launcher the profiling
    run hands its checkpoint to the plan's processes at the step it ends, so that step
    stays the same from launch to launch unless a phase sits right at the threshold,
    and a relaunch trains the same curve.
    """
    if min_seconds <= 0 or not spans or sum(s for s in spans if s > 0) >= min_seconds:
        return 0
    wanted = (MAX_EXTENSION_FACTOR - 1) * len(spans)
    return int(max(0, min(wanted, room)))


def hook_overhead_scale(hooked_spans: Sequence[float], clean_spans: Sequence[float]) -> float:
    """How much of the hooked window's compute time the run really takes (at most 1).

    Per-layer hooks cost host time on every module call. On a CPU that time is a few
    per cent; on a GPU the host issues the kernels, so a model of many short layers
    becomes host-bound under the hooks (a ResNet-18 step on an H100 took 25 ms hooked
    against 9 ms plain). The window therefore keeps its per-layer and per-phase shares
    but takes its length from warm-up steps timed with no hook: the ratio of the
    median spans (batch start to batch end, data waits out). Hooks only add time, so
    the ratio never exceeds 1; without spans on either side it is 1.
    """
    hooked = [s for s in hooked_spans if s > 0]
    clean = [s for s in clean_spans if s > 0]
    if not hooked or not clean:
        return 1.0
    return min(statistics.median(clean) / statistics.median(hooked), 1.0)


def without_hook_overhead(measurement: RankMeasurement, scale: float) -> RankMeasurement:
    """``measurement`` with its compute shortened by ``scale`` (:func:`hook_overhead_scale`).

    Forward, backward, optimizer, each layer and each bucket's ready time shrink by the
    scale; data waits, all-reduce durations and exposed communication are kept as
    measured (the hooks sit on the compute, not on the loader or the network).
    """
    if scale == 1.0:
        return measurement
    steps = tuple(
        StepRecord(
            step_s=s.data_wait_s
            + scale * (s.step_s - s.data_wait_s - s.exposed_comm_s)
            + s.exposed_comm_s,
            forward_s=scale * s.forward_s,
            backward_s=scale * s.backward_s,
            optimizer_s=scale * s.optimizer_s,
            data_wait_s=s.data_wait_s,
            allreduce_s=s.allreduce_s,
            exposed_comm_s=s.exposed_comm_s,
        )
        for s in measurement.steps
    )
    layers = {name: (scale * f, scale * b) for name, (f, b) in measurement.layers.items()}
    buckets = tuple(
        Bucket(
            b.index, b.bytes, b.num_params, b.ready_order, scale * b.ready_offset_s, b.allreduce_s
        )
        for b in measurement.buckets
    )
    return RankMeasurement(
        rank=measurement.rank,
        steps=steps,
        layers=layers,
        buckets=buckets,
        peak_memory_bytes=measurement.peak_memory_bytes,
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
