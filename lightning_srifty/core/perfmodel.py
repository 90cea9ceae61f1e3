"""Predicted step time of synchronous data-parallel training on any cluster.

The model is physics first, learning second:

1. **Compute** per GPU is ``alpha + beta·b`` in the local batch ``b``, taken from the
   profile's measured batch points (exact at measured points, linear between and
   beyond them). On another accelerator it is scaled by a roofline ratio: per layer
   ``max(flops/peak, bytes/mem_bw)`` when the profile has per-layer FLOPs and bytes, a
   whole-step blend of the peak and memory-bandwidth ratios otherwise.
2. **Communication** is NCCL's all-reduce of the gradient buckets
   (:mod:`lightning_srifty.core.comm`): a flat ring through every GPU, paced by its
   slowest link (the NIC once nodes are crossed), or a tree across nodes. Link rates
   are absolute physical figures per instance type times one efficiency per transport
   (:mod:`lightning_srifty.core.links`); a burst-rated NIC runs at its peak only while
   the step's average traffic stays within its baseline.
3. **Overlap**: with per-layer data, an event simulation of buckets becoming ready in
   reverse layer order on one stream; with totals only, the fluid version of the same
   queue, ``max(tail·T, T - window·B)`` past the end of backward
   (:func:`~lightning_srifty.core.comm.exposed_allreduce_s`).
4. **Heterogeneous groups** split a fixed global batch in proportion to speed, capped by
   memory; the slowest group plus the all-reduce paces the step.
5. **Calibration** (optional) supplies fitted hardware constants, the job's own overlap
   and co-location terms when its multi-GPU rows were calibrated on, and a boosted-tree
   multiplicative correction with a quantile interval.

With one batch point we cannot separate fixed from per-sample cost, so ``alpha`` is the
optimizer step time the profile measured (it does not grow with the batch) and zero for
a coarse profile: proportional scaling, which over-predicts large-batch steps a little
rather than under-predicting them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from lightning_srifty.core.calibration import (
    Calibration,
    Correction,
    HardwareTerms,
    PhysicsConstants,
)
from lightning_srifty.core.candidates import CandidateArrays, StepTimeArrays
from lightning_srifty.core.catalog import (
    TENSOR_CORE_MODULES,
    GpuSpec,
    achieved_tflops,
    device_time_ratio,
    layer_allows_tf32,
    layer_roofline_s,
    layer_time_ratio,
)
from lightning_srifty.core.cluster import Cluster
from lightning_srifty.core.comm import (
    DEFAULT_BUCKET_BYTES,
    bucket_count,
    buckets_from_layers,
    exposed_allreduce_s,
    hierarchical_allreduce_s,
    ring_allreduce_s,
    simulate_overlap,
)
from lightning_srifty.core.errors import PredictionError
from lightning_srifty.core.links import (
    TRANSPORTS,
    LinkColumns,
    inter_node_bytes_s,
    intra_node_bytes_s,
)
from lightning_srifty.core.lognormal import Z90
from lightning_srifty.core.profile import LayerTiming, Profile
from lightning_srifty.core.script_trainer import gradient_syncs_per_batch
from lightning_srifty.core.trees import cell_codes
from lightning_srifty.core.validation import validation_cost

GIB = 1024**3
MEMORY_HEADROOM = 0.92
"""Share of device memory usable by tensors (CUDA context and allocator slack)."""
ROOFLINE_EFFICIENCY = 0.4
"""Share of a layer's roofline rate (:func:`layer_roofline_s`) that training reaches:
what a CPU profile's FLOPs and bytes predict a GPU from, and where a GPU profile's layer
time stops being work that scales with the batch and the GPU (:meth:`PerformanceModel.
layer_work`). A prior, not fitted: on the H100 runs (``benchmarks/gpu/h100-2026-11-27``)
the measured per-sample slope over each job's roofline reads 0.22-0.65 (median 0.38)."""
LOGGED_VALUE_BYTES = 4.0
"""A value a script logs with ``sync_dist=True``: one float32 scalar (a loss, an accuracy)."""
KERNEL_LAUNCH_S = 5e-6
"""Least time a GPU step spends per kernel it launches: PyTorch's eager launches cost
5-20 us each on the CPU side (HolisticTraceAnalysis docs, "CUDA kernel launch stats"),
so a step of many tiny layers cannot run faster than its launches however fast the GPU."""
EAGER_OP_S = 10e-6
"""CPU cost of one eager PyTorch operation issued from Python (its binding, the
dispatcher, the kernel launch): 5-20 us (HolisticTraceAnalysis docs, "CUDA kernel
launch stats", the range of :data:`KERNEL_LAUNCH_S`), taken at its log-middle. Prices
work a job issues as many small operations, such as one per parameter tensor
(:func:`single_process_s`)."""
CROSS_GPU_SPREAD = 0.27
"""Log-normal spread (sigma) of device time carried to another GPU type by the compute
ratio. From the ratio's leave-pair-out error on Lambda's public benchmark
(``benchmarks/bench_gpu_scaling.py``: 20.3 % median absolute error over the fp32 pairs,
16.9 % fp16, with the boards' power limits; sigma = ln(1.203)/0.6745), not from the
traces the choice is judged on. Kept since the GeForce boards' own 16-bit factor
(:data:`~lightning_srifty.core.catalog.HALF_RATE_UTILISATION`) cut those errors to
16.8 and 11.8 %: the traces' one-GPU transfers still miss by more than either."""
HOST_TRANSFER_SPREAD = math.log(2.0) / 1.2816
"""Log-normal spread of host time (the fixed per-step part a faster GPU does not
shorten) on another GPU type's host: a prior of a factor of two either way at the 10 and
90 % ends. Another GPU type is another instance family on AWS, so another host CPU,
core count per GPU and often software stack, none of which the hardware facts we have
for a target (``hardware.json``, the catalog) describe well enough to scale by; the
traces' own fixed costs are never used to set it."""
BACKWARD_SHARE = 2.0 / 3.0
"""Backward is about twice the forward FLOPs; used when a profile has no phase split."""

_LOG_FLOOR = 1e-9


@dataclass(frozen=True)
class Prediction:
    """The model's answer for one cluster."""

    step_s: float
    low_s: float
    high_s: float
    compute_s: float
    """Slowest group's forward + backward + optimizer time."""
    comm_s: float
    """Communication left exposed after overlap (plus the per-step sync overhead)."""
    allreduce_s: float
    """Total all-reduce time on the communication stream, hidden or not."""
    local_batch: tuple[int, ...]
    """Samples per GPU per step, one per cluster group."""
    global_batch: int
    fits: bool
    memory_gib: tuple[float, ...]
    """Estimated memory needed per GPU in each group at its local batch."""
    breakdown: tuple[tuple[str, float], ...]
    """Short labelled terms (seconds) behind ``step_s``."""
    intra_bytes_s: float = float("inf")
    """Effective per-GPU rate of the slowest GPU link in use (``inf``: none in use)."""
    inter_bytes_s: float = float("inf")
    """Effective network rate per node of the slowest node (``inf``: one node)."""
    validation_s: float = 0.0
    """Validation seconds per training batch (the script's passes), not in ``step_s``."""
    loader_bound: bool = False
    """The training loader's workers, not the GPU, set a group's compute (see
    :class:`~lightning_srifty.core.profile.DataLoading`)."""


@dataclass(frozen=True)
class _Links:
    """The links one candidate's all-reduce crosses (arrays over candidates)."""

    world: np.ndarray
    nodes: np.ndarray
    gpus_per_node: np.ndarray
    intra_bytes_s: np.ndarray
    """Effective per-GPU rate of the slowest intra-node link in use."""
    inter_bytes_s: np.ndarray
    """Effective per-node network rate of the slowest node."""
    intra_latency_s: np.ndarray
    """Per-hop latency of the slowest GPU link in use."""
    inter_latency_s: np.ndarray
    """Per-hop latency of the slowest network transport in use."""
    two_way: np.ndarray
    """Slowdown of the network hops from two-way TCP traffic (two nodes only)."""
    physics: PhysicsConstants

    def allreduce_s(self, nbytes: float, messages: int) -> np.ndarray:
        """NCCL's all-reduce time: a flat ring, or the node-level tree hierarchy.

        NCCL's ring runs through every GPU, so a ring that crosses nodes is paced by its
        slowest link (the NIC) and every node's NIC carries the full ring volume
        ``2(p-1)/p · S`` for all ``p`` GPUs, not just ``2(N-1)/N · S`` for ``N`` nodes.
        Each message pays the latency of every hop it travels, as in NCCL's own tuning
        model (``2(N-1)`` hops across nodes and ``2(p-N)`` inside them), plus the fixed
        cost of launching one collective. NCCL's tree (``inter_algorithm="tree"``) is a
        chain inside each node and a tree across nodes.
        """
        phys = self.physics
        multi_node = self.nodes > 1
        launch = messages * phys.collective_launch_s
        if phys.inter_algorithm == "tree":
            intra, inter = hierarchical_allreduce_s(
                nbytes, self.gpus_per_node, self.nodes, self.intra_bytes_s,
                self.intra_latency_s, self.inter_bytes_s / self.two_way, self.inter_latency_s,
                messages=messages, inter_algorithm="tree",
            )  # fmt: skip
            total = intra + inter + launch
        else:
            network = self.inter_bytes_s / self.two_way
            slowest = np.where(
                multi_node, np.minimum(self.intra_bytes_s, network), self.intra_bytes_s
            )
            bandwidth = ring_allreduce_s(nbytes, self.world, slowest, 0.0)
            # a message travels the whole ring: 2(N-1) of its 2(p-1) hops cross nodes
            inter_hops = 2.0 * np.maximum(self.nodes - 1, 0)
            intra_hops = 2.0 * np.maximum(self.world - 1, 0) - inter_hops
            latency = inter_hops * self.inter_latency_s + intra_hops * self.intra_latency_s
            total = bandwidth + messages * latency + launch
        return np.where(self.world > 1, total, 0.0)


@dataclass(frozen=True)
class _Curve:
    """Compute time on the profiled accelerator: measured points and their line."""

    alpha_s: float
    beta_s: float
    batches: np.ndarray
    times: np.ndarray

    def at(self, batch: np.ndarray) -> np.ndarray:
        b = np.asarray(batch, dtype=np.float64)
        if len(self.batches) < 2:
            return np.asarray(self.alpha_s + self.beta_s * b)
        lo_b, hi_b = self.batches[0], self.batches[-1]
        inside = np.interp(b, self.batches, self.times)
        above = self.times[-1] + self.beta_s * (b - hi_b)
        below = self.times[0] + self.beta_s * (b - lo_b)
        out = np.where(b > hi_b, above, np.where(b < lo_b, below, inside))
        return np.maximum(out, 0.05 * self.times[0])


_MAX_Z_EXACT = 1024
"""Worker counts up to which :func:`expected_max_z` integrates exactly."""


@functools.cache
def _max_z_table() -> np.ndarray:
    """``E[max of p standard normals]`` for ``p = 0..1024`` by numeric integration."""
    x = np.linspace(-9.0, 9.0, 3601)
    log_cdf = np.log(np.maximum([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x], 1e-300))
    mid = 0.5 * (x[1:] + x[:-1])
    out = np.zeros(_MAX_Z_EXACT + 1)
    for p in range(2, _MAX_Z_EXACT + 1):
        out[p] = float(np.sum(mid * np.diff(np.exp(p * log_cdf))))
    return out


def expected_max_z(workers: np.ndarray | int) -> np.ndarray:
    """Expected maximum of ``workers`` independent standard normals (0 for one worker).

    A synchronous step waits for the slowest worker, so a spread ``sigma`` of step time
    costs ``sigma·expected_max_z(p)``: 0.56 for 2 workers, 1.03 for 4, 1.77 for 16,
    2.34 for 64. (The textbook bound ``sqrt(2 ln p)`` is twice too high at ``p = 2``.)
    Beyond 1,024 workers the Gumbel asymptote ``b + 0.5772/a`` takes over
    (``a = sqrt(2 ln p)``, ``b = a - (ln ln p + ln 4 pi)/(2a)``).
    """
    p = np.maximum(np.asarray(workers, dtype=np.int64), 1)
    table = _max_z_table()
    exact = table[np.minimum(p, _MAX_Z_EXACT)]
    if not np.any(p > _MAX_Z_EXACT):
        return np.asarray(exact, dtype=np.float64)
    big = np.maximum(p, _MAX_Z_EXACT).astype(np.float64)
    a = np.sqrt(2.0 * np.log(big))
    b = a - (np.log(np.log(big)) + np.log(4.0 * np.pi)) / (2.0 * a)
    return np.asarray(np.where(p > _MAX_Z_EXACT, b + 0.5772 / a, exact), dtype=np.float64)


def step_time_cv(profile: Profile) -> float:
    """Coefficient of variation of the profiled step time, from its p50 and p90.

    Steps whose cost depends on the data (variable-length sequences, multi-scale
    images) vary from step to step; a synchronous step waits for the slowest of ``p``
    workers, so this spread, on top of the hardware's own, sets the straggler cost.
    Assumes a normal spread: ``sigma = (p90 - p50)/1.2816``.
    """
    spread = profile.steps.step
    if spread.count < 2 or spread.mean_s <= 0:
        return 0.0
    return max(spread.p90_s - spread.p50_s, 0.0) / 1.2816 / spread.mean_s


@functools.lru_cache(maxsize=256)
def fit_compute_curve(profile: Profile) -> _Curve:
    """``alpha + beta·b`` by least squares over the profile's batch points.

    Cached per profile (profiles are immutable): a calibration scores the same few
    profiles thousands of times.
    """
    points = sorted(profile.step_points(), key=lambda p: p.local_batch_size)
    merged: dict[int, list[float]] = {}
    for p in points:
        value = p.compute_s if p.compute_s is not None else p.step_s
        merged.setdefault(p.local_batch_size, []).append(value)
    batches = np.asarray(sorted(merged), dtype=np.float64)
    times = np.asarray([float(np.mean(merged[int(b)])) for b in batches])
    if len(batches) >= 2:
        slope, intercept = np.polyfit(batches, times, 1)
        beta = float(max(slope, 1e-12))
        alpha = float(max(intercept, 0.0))
    else:
        alpha = min(profile.steps.optimizer_s, 0.5 * float(times[0]))
        beta = max(float(times[0]) - alpha, 1e-12) / float(batches[0])
    return _Curve(alpha, beta, batches, times)


def tf32_share(profile: Profile) -> float:
    """Share of a float32 job's matrix-product work allowed to run on TF32 tensor cores.

    The job's own settings (:attr:`Environment.matmul_tf32` for cuBLAS products,
    :attr:`Environment.cudnn_tf32` for cuDNN's convolutions and RNNs) hold on every
    target: the plan is the run, the launched job runs the same script. The whole-step
    ratio blends the two rates by the FLOP share of the layers each setting covers
    (their profiled time where FLOPs were not counted). A profile with no matrix-product
    layers to weigh (a coarse one) takes the matmul setting where the two agree and an
    even blend where they do not.
    """
    env = profile.environment
    if env.matmul_tf32 == env.cudnn_tf32:
        return 1.0 if env.matmul_tf32 else 0.0
    products = [x for x in profile.layers if x.module_type in TENSOR_CORE_MODULES]
    weights = [x.flops for x in products]
    if sum(weights) <= 0:
        weights = [x.forward_s + x.backward_s for x in products]
    total = sum(weights)
    if total <= 0:
        return 0.5
    allowed = sum(
        w
        for x, w in zip(products, weights, strict=True)
        if layer_allows_tf32(x.module_type, env.matmul_tf32, env.cudnn_tf32)
    )
    return allowed / total


class PerformanceModel:
    """Predicts step time for one profile on any cluster (vectorised over candidates).

    Args:
        gpu_specs: published peak figures per accelerator name, for cross-GPU scaling.
        calibration: fitted hardware constants and correction; ``None`` uses nominal
            bandwidths and default constants.
    """

    def __init__(self, gpu_specs: Mapping[str, GpuSpec], calibration: Calibration | None = None):
        self.gpu_specs = dict(gpu_specs)
        self.calibration = calibration or Calibration(physics=PhysicsConstants())
        self.physics = self.calibration.physics

    # ----------------------------------------------------------------- compute
    def compute_ratio(self, profile: Profile, accelerator: str) -> float | None:
        """Time on ``accelerator`` over time on the profiled device; ``None`` if unknown."""
        source = profile.environment.accelerator
        if accelerator == source:
            return 1.0
        target = self.gpu_specs.get(accelerator)
        if target is None:
            return None
        env = profile.environment
        precision = env.precision
        share = tf32_share(profile)
        src = self.gpu_specs.get(source)
        if src is None:
            peak_t = achieved_tflops(target, precision, share) * 1e12
            return self._absolute_roofline_ratio(profile, peak_t, target.mem_bw_gbps * 1e9)
        whole = device_time_ratio(src, target, precision, tf32_share=share)
        layers = self.layer_work(profile)
        src_time = sum(work for _, work in layers)
        if not layers or src_time <= 0 or not any(x.flops > 0 for x, _ in layers):
            return whole
        new_time = 0.0
        for x, work in layers:
            scale = layer_time_ratio(
                x.flops,
                3 * x.activation_bytes,
                x.module_type,
                src,
                target,
                precision,
                tf32=layer_allows_tf32(x.module_type, env.matmul_tf32, env.cudnn_tf32),
            )
            new_time += work * (whole if scale is None else scale)
        return new_time / src_time

    def layer_work(self, profile: Profile) -> list[tuple[LayerTiming, float]]:
        """Each timed layer with the part of its time that is work: what scales with the
        batch and moves to another GPU by the layer's roofline ratio.

        A layer cannot take less than its roofline (:func:`layer_roofline_s`, outputs
        written in forward and read twice in backward) and reaches about
        :data:`ROOFLINE_EFFICIENCY` of it when busy. Time beyond that is latency:
        kernel launches and kernels too small to fill the GPU, neither shortened by a
        faster GPU nor lengthened by a larger batch. On a fast GPU it is most of a
        small model's step: the H100's cifar10 layers took 10.7 ms at batch 129 against
        1.8 ms of roofline, and its step grew by 0.04 ms a sample, not 0.09; counted as
        work, that latency was multiplied by the H100-to-T4 ratio (~25x) and the T4
        predicted 3.4x too slow a sample. A profile from a device without a datasheet
        is all work.

        A layer whose FLOPs and bytes the capture could not count (a container's own
        ops, such as a residual add or Python glue; an in-place activation, whose
        output is its input's tensor) has no roofline of its own. Its time is split as
        the counted layers of the same profile split theirs: what they say about how
        busy this GPU was on this job. Counted all as work (before), BERT's 9 ms of
        ``BertLayer``-style glue at batch 8 grew with the batch and its batch-47 step on
        the same H100 read +81 %; counted all as latency, ResNet-50's in-place ReLUs and
        residual adds stopped growing and its batch-231 step read -16 %. Shared, they
        read +60 % and -8 % (``benchmarks/bench_gpu_measured.py``). With no counted
        layer at all, every layer is work.
        """
        env = profile.environment
        src = self.gpu_specs.get(env.accelerator)
        timed = [(x, x.forward_s + x.backward_s) for x in profile.layers]
        timed = [(x, measured) for x, measured in timed if measured > 0]
        if src is None:
            return timed
        works: list[float | None] = []
        counted_time = counted_work = 0.0
        for x, measured in timed:
            if x.flops <= 0 and x.activation_bytes <= 0:
                works.append(None)
                continue
            tf32 = layer_allows_tf32(x.module_type, env.matmul_tf32, env.cudnn_tf32)
            roofline = layer_roofline_s(
                x.flops, 3 * x.activation_bytes, x.module_type, src, env.precision, tf32
            )
            work = min(measured, roofline / ROOFLINE_EFFICIENCY)
            works.append(work)
            counted_time += measured
            counted_work += work
        busy = counted_work / counted_time if counted_time > 0 else 1.0
        return [
            (x, measured * busy if work is None else work)
            for (x, measured), work in zip(timed, works, strict=True)
        ]

    def layer_latency_s(self, profile: Profile) -> float:
        """Per-step layer time that is not work (:meth:`layer_work`): 0 for a profile
        without timed layers or from a device without a datasheet."""
        if not profile.is_detailed:
            return 0.0
        measured = sum(x.forward_s + x.backward_s for x in profile.layers)
        return max(measured - sum(work for _, work in self.layer_work(profile)), 0.0)

    def _absolute_roofline_ratio(self, profile: Profile, peak: float, bw: float) -> float | None:
        """CPU (or unlisted) source: predict from FLOPs and bytes alone (a compiled
        model's profile has no layers: its step's activations)."""
        flops = profile.flops_per_step or sum(x.flops for x in profile.layers)
        activations = (
            sum(x.activation_bytes for x in profile.layers)
            if profile.layers
            else profile.memory.activation_bytes
        )
        moved = 3 * activations
        measured = profile.steps.forward_s + profile.steps.backward_s
        if measured <= 0:
            measured = profile.steps.step.mean_s
        if flops <= 0 or measured <= 0:
            return None
        predicted = max(flops / peak, moved / bw) / ROOFLINE_EFFICIENCY
        return predicted / measured

    @staticmethod
    def host_share(profile: Profile) -> float:
        """Share of the profiled compute time spent on the host, not the accelerator.

        A detailed profile splits each step into forward, backward and optimizer (device
        work) and the rest: waiting for the data loader and framework overhead, which
        run on the CPU and do not get faster on a faster accelerator. Only the device
        share takes the roofline ratio; the host share is kept as measured. Coarse
        profiles have no split (0).
        """
        s = profile.steps
        device = s.forward_s + s.backward_s + s.optimizer_s
        if profile.kind != "detailed" or device <= 0:
            return 0.0
        exposed = profile.communication.exposed_s if profile.communication is not None else 0.0
        compute = s.step.mean_s - exposed
        if compute <= 0:
            return 0.0
        return float(min(max((compute - device) / compute, 0.0), 1.0))

    @staticmethod
    def fixed_host_s(profile: Profile, curve: _Curve) -> float:
        """Per-step time of a coarse profile that does not depend on the batch.

        Measured step times at several batch sizes split into a fixed part and a
        per-sample part. On the shared traces the fixed part is host work that a faster
        GPU does not shorten (Python, kernel launches, a small model's optimizer): a
        BERT step costs about 120 ms at any batch on an A100 and a Quadro RTX 6000
        alike, while the per-sample part scales with the GPU. So a coarse profile keeps
        its intercept as measured and scales only the rest. A single batch point cannot
        separate them (0).
        """
        if profile.kind == "detailed" or len(curve.batches) < 2:
            return 0.0
        return float(max(curve.alpha_s, 0.0))

    @staticmethod
    def launch_floor_s(profile: Profile) -> float:
        """Least device time per step from kernel launches alone (0 without layers).

        Each profiled layer launches at least one kernel forward and one backward (two
        with parameters: input and weight gradients); the optimizer's launches are not
        counted, so this stays a floor.
        """
        launches = sum(1 + (2 if x.param_count > 0 else 1) for x in profile.layers)
        return launches * KERNEL_LAUNCH_S

    def _phase_shares(self, profile: Profile) -> tuple[float, float]:
        """(forward share, backward share) of compute; the rest is the optimizer."""
        s = profile.steps
        total = s.forward_s + s.backward_s + s.optimizer_s
        if total > 0 and s.backward_s > 0:
            return s.forward_s / total, s.backward_s / total
        return 1 - BACKWARD_SHARE, BACKWARD_SHARE

    # ------------------------------------------------------------------ memory
    @staticmethod
    def memory_model(profile: Profile) -> tuple[float, float]:
        """(static bytes, activation bytes per sample) on one GPU."""
        m = profile.memory
        static = float(m.param_bytes + m.grad_bytes + m.optimizer_state_bytes)
        # Per sample of an optimizer step: with accumulation only a micro-batch's
        # activations are alive at once.
        b0 = max(profile.environment.step_batch_size, 1)
        activations = float(m.activation_bytes)
        if m.peak_kind == "cuda_max_allocated" and m.peak_bytes > static:
            activations = max(activations, m.peak_bytes - static)
        return static, activations / b0

    # ------------------------------------------------------------- evaluation
    def _evaluate(
        self,
        profile: Profile,
        cand: CandidateArrays,
        local_batch: int | np.ndarray | None,
        global_batch: int | None,
    ) -> dict[str, np.ndarray]:
        """Every candidate on its hardware's constants: those a probe refitted for the
        one instance type it is made of, the calibration's for every other one."""
        terms = self.calibration.hardware_terms
        if not terms or cand.instance_type is None:
            return self._evaluate_on(profile, cand, local_batch, global_batch, self.physics, "")
        kinds = cand.single_type()
        probed = [h for h in terms if np.any(kinds == h.instance_type)]
        if not probed:
            return self._evaluate_on(profile, cand, local_batch, global_batch, self.physics, "")
        parts: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []
        rest = np.ones(cand.size, dtype=bool)
        for h in probed:
            rows = kinds == h.instance_type
            rest &= ~rows
            parts.append((rows, self._part(profile, cand, rows, local_batch, global_batch, h)))
        if rest.any():
            parts.append((rest, self._part(profile, cand, rest, local_batch, global_batch, None)))
        merged: dict[str, np.ndarray] = {}
        for rows, out in parts:
            for key, value in out.items():
                if key not in merged:
                    merged[key] = np.empty((cand.size, *value.shape[1:]), dtype=value.dtype)
                merged[key][rows] = value
        return merged

    def _part(
        self,
        profile: Profile,
        cand: CandidateArrays,
        rows: np.ndarray,
        local_batch: int | np.ndarray | None,
        global_batch: int | None,
        hardware: HardwareTerms | None,
    ) -> dict[str, np.ndarray]:
        """:meth:`_evaluate_on` for the candidates at ``rows`` (a boolean mask)."""
        if isinstance(local_batch, np.ndarray) and local_batch.ndim:
            local_batch = local_batch.reshape(-1)[rows]
        physics = self.physics if hardware is None else hardware.physics
        kind = "" if hardware is None else hardware.instance_type
        return self._evaluate_on(profile, cand.take(rows), local_batch, global_batch, physics, kind)

    def _evaluate_on(
        self,
        profile: Profile,
        cand: CandidateArrays,
        local_batch: int | np.ndarray | None,
        global_batch: int | None,
        physics: PhysicsConstants,
        instance_type: str,
    ) -> dict[str, np.ndarray]:
        """The model on one set of hardware constants; ``instance_type`` names the
        hardware they were probed on (its co-location term for the job, if measured)."""
        cal = self.calibration
        job = next(
            (
                j
                for j in cal.jobs
                if instance_type
                and j.name == profile.model_name
                and j.instance_type == instance_type
            ),
            None,
        ) or cal.job(profile.model_name, profile.environment.instance_type)
        phys = physics.for_job(job)
        nodes = np.asarray(cand.nodes, dtype=np.int64)
        gpn = np.asarray(cand.gpus_per_node, dtype=np.int64)
        present = nodes > 0
        workers = np.where(present, nodes * gpn, 0)
        n, width = nodes.shape
        curve = fit_compute_curve(profile)

        ratio = np.full((n, width), np.nan)
        transferred = np.zeros((n, width), dtype=bool)
        accelerators = _distinct(np.asarray(cand.accelerator), present)
        for name, mask in accelerators:
            r = self.compute_ratio(profile, name)
            ratio[mask] = np.nan if r is None else r
            if name != profile.environment.accelerator:
                transferred |= mask
        known = ~np.isnan(ratio) | ~present
        # measured over predicted compute, host and device alike: a run measured both
        measured_scale = np.ones((n, width))
        if job is not None and (job.accelerator or job.measured_scales):
            measured = dict(job.measured_scales)
            for name, mask in accelerators:
                measured_scale[mask] = job.compute_scale_on(name, profile.environment.accelerator)
                if name in measured:
                    # a run of the job measured this GPU: its compute is no transfer
                    transferred &= ~mask
        # every group's compute multiplier: what runs measured, and GPUs sharing a node
        colocation_factor = 1.0 + phys.colocation_slowdown * colocation_load(gpn)
        slowdown = np.where(present, measured_scale * colocation_factor, 1.0)
        host = self.host_share(profile)
        fixed = self.fixed_host_s(profile, curve)
        latency = self.layer_latency_s(profile)
        if latency > 0 and len(curve.batches) < 2:
            curve, host = _with_fixed_latency(curve, host, latency)
            fixed = latency
        elif latency > 0:  # points at several batches: their intercept holds the latency
            fixed = min(latency, curve.alpha_s)
        device_ratio = np.nan_to_num(ratio, nan=1.0)
        # the share of variable time that scales with the GPU; fixed host time does not
        speed_scale = np.where(present & known, (1.0 - host) * device_ratio + host, 1.0)

        static, per_sample = self.memory_model(profile)
        usable = np.asarray(cand.gpu_memory_gib, dtype=np.float64) * GIB * MEMORY_HEADROOM
        if per_sample > 0:
            cap = np.floor((usable - static) / per_sample)
        else:
            cap = np.where(usable >= static, np.inf, 0.0)
        cap = np.where(present, cap, np.inf)

        default_b = profile.environment.step_batch_size
        if local_batch is not None:
            per_row = np.asarray(local_batch, dtype=np.float64).reshape(-1, 1)
            b = np.where(present, per_row, 0.0)
        elif global_batch is not None:
            alpha = slowdown * (fixed + (curve.alpha_s - fixed) * speed_scale)
            beta = slowdown * curve.beta_s * speed_scale
            b = self._split_global(global_batch, alpha, beta, workers, present, cap)
        else:
            b = np.where(present, float(default_b), 0.0)
        b_int = np.where(present, np.maximum(np.rint(b), 1.0), 0.0)
        fits = _row_all(~present | ((b_int <= cap) & known))

        world = _row_sum(workers)
        total_nodes = _row_sum(nodes)
        gmax = _row_max(np.where(present, gpn, 0))
        cv = float(np.hypot(phys.straggler_cv, step_time_cv(profile)))
        straggle = 1.0 + cv * expected_max_z(world)
        at_b = curve.at(np.maximum(b_int, 1.0))
        host_fixed = np.minimum(fixed, at_b)
        # Host time and layer latency are kept; with them, device work cannot beat its
        # kernel launches.
        device_part = np.maximum(
            (at_b - host_fixed) * (1.0 - host) * device_ratio,
            np.maximum(self.launch_floor_s(profile) - host_fixed, 0.0),
        )
        device_part = np.where(present & known, device_part, (at_b - host_fixed) * (1.0 - host))
        group_compute = np.where(
            present, slowdown * (host_fixed + (at_b - host_fixed) * host + device_part), 0.0
        )
        ops, nbytes = profile.single_process_work
        if ops or nbytes:  # only trace profiles have such work: no mask on the hot path
            group_compute = group_compute + self._single_process_s(
                ops, nbytes, accelerators, (world == 1)[:, None] & present
            )
        # a validation pass runs at the compute's pace, not the training loader's
        pass_pace = _row_max(group_compute)
        # a step cannot outpace the loader's workers making its batches
        floor = self._loader_floor_s(profile, cand, b_int, group_compute)
        loader_bound = _row_max(present & (floor > 0) & (floor >= group_compute))
        group_compute = np.maximum(group_compute, floor)
        mean_compute = _row_max(group_compute)
        compute = mean_compute * straggle
        transfer_sigma = self._transfer_sigma(
            group_compute, slowdown * device_part, transferred & present & known
        )

        cols = cand.link_columns()
        intra_each = intra_node_bytes_s(
            cols, phys.intra_efficiencies(), phys.inter_efficiencies(), phys.tcp_flow_gbps
        )
        intra_bw = _row_min(np.where(present & (gpn > 1), intra_each, np.inf))
        # NCCL runs one network for every rank: a cluster mixing EFA and TCP nodes talks
        # over sockets throughout
        efa = present & (cols.transport == TRANSPORTS.index("efa"))
        mixed = _row_max(efa) & ~_row_all(~present | efa)
        sockets_only = mixed[:, None] & efa
        inter_each = inter_node_bytes_s(
            cols, gpn, phys.inter_efficiencies(), phys.tcp_flow_gbps, sockets_only
        )
        inter_bw = _row_min(np.where(present, inter_each, np.inf))
        transport = np.where(sockets_only, 0, cols.transport)
        hop = np.asarray(phys.inter_latencies())[transport]
        inter_latency = _row_max(np.where(present, hop, 0.0))
        intra_hop = np.where(
            cols.isolated, hop, np.asarray(phys.intra_latencies())[cols.interconnect]
        )
        intra_latency = _row_max(np.where(present & (gpn > 1), intra_hop, 0.0))
        # two-way traffic queues behind a per-flow cap only: where a tunnel makes each
        # host pair one capped flow (an uncapped NIC queues data and ACKs alike on 2 nodes
        # or 16)
        capped_tunnel = (transport == 0) & cols.encapsulated & np.isfinite(cols.flow_cap_bytes_s)
        tunnelled = _row_max(np.where(present, capped_tunnel, False))
        two_way = np.where(
            (total_nodes == 2) & tunnelled.astype(bool), phys.tcp_two_way_slowdown, 1.0
        )
        links = _Links(
            world, total_nodes, gmax, intra_bw, inter_bw, intra_latency, inter_latency,
            two_way, phys,
        )  # fmt: skip
        grad_bytes = float(profile.grad_bytes)

        fwd_share, bwd_share = self._phase_shares(profile)
        detailed = profile.is_detailed and bool(profile.layers)
        # a manual step's backward passes each end in a whole-gradient all-reduce, each
        # overlapping its own pass (the profile's backward time is all of them)
        syncs = gradient_syncs_per_batch(profile)
        if detailed and grad_bytes > 0:
            bucket_bytes, ready = self._bucket_layout(profile)
            costs = [links.allreduce_s(float(size), 1) for size in bucket_bytes]
            allreduce = syncs * (np.sum(costs, axis=0) if costs else np.zeros(n))
            _, exposed = simulate_overlap(compute * bwd_share / syncs, ready, costs)
            synced = compute + syncs * exposed
        else:
            one = links.allreduce_s(grad_bytes, bucket_count(int(grad_bytes)))
            allreduce = syncs * one
            synced = compute + syncs * exposed_allreduce_s(
                one, compute * bwd_share / syncs, phys.tail_fraction, phys.overlap_window
            )
        overhead = np.where(world > 1, phys.step_overhead_s, 0.0)
        # values the script logs each step with sync_dist=True: one blocking all-reduce
        # of a scalar apiece, all latency, which nothing overlaps
        logged = profile.synced_logs_per_step
        if logged:
            overhead = overhead + np.where(
                world > 1, logged * links.allreduce_s(LOGGED_VALUE_BYTES, 1), 0.0
            )
        step = synced + overhead
        # burst types: the NIC may run at its peak only while the average stays at baseline
        ring_bytes = 2.0 * np.maximum(world - 1, 0) / np.maximum(world, 1) * grad_bytes
        sustain = _row_max(np.where(present, ring_bytes[:, None] / cols.nic_bytes_s, 0.0))
        step = np.where(total_nodes > 1, np.maximum(step, sustain), step)
        physics_step = step
        all_known = _row_all(known)
        step = np.where(all_known, step, np.inf)

        # row scatter and the whole-job offset add in quadrature; the offset is how far
        # a job's scaling may sit off the fit, so one process, which scales nothing (its
        # step is the profile's measured curve), does not take it
        shift = np.where(world > 1, Z90 * self.calibration.model_spread, 0.0)
        low_log = -np.hypot(min(self.calibration.residual_low, 0.0), shift)
        high_log = np.hypot(max(self.calibration.residual_high, 0.0), shift)
        correction = self.calibration.correction
        widen = self._unseen(accelerators, cols, present)
        if correction is not None:
            multi = (world > 1) & np.isfinite(step)
            if multi.any():
                feats = correction_features(
                    world[multi], total_nodes[multi], gmax[multi], allreduce[multi],
                    compute[multi], (step - compute)[multi],
                )  # fmt: skip
                mid, lo, hi = _evaluate_correction(correction, feats)
                scale = np.ones(n)
                scale[multi] = np.exp(mid)
                low_log[multi] = -np.hypot(np.minimum(lo - mid, 0.0), shift[multi])
                high_log[multi] = np.hypot(np.maximum(hi - mid, 0.0), shift[multi])
                step = step * scale
        if widen is not None:
            # a whole new kind of hardware may sit off the model (in quadrature), and
            # leaving hardware out showed how much further rows still fall (added)
            unseen = widen & (world > 1)
            spread = Z90 * self.calibration.hardware_spread
            extra = self.calibration.unseen_widening
            low_log = np.where(unseen, -np.hypot(low_log, spread) - extra, low_log)
            high_log = np.where(unseen, np.hypot(high_log, spread) + extra, high_log)
        # compute carried to another GPU type: its share of the step is only as sure as
        # the transfer (in quadrature with the rest)
        carried = (
            Z90 * transfer_sigma * np.minimum(compute / np.maximum(physics_step, _LOG_FLOOR), 1.0)
        )
        low_log = np.where(carried > 0, -np.hypot(low_log, carried), low_log)
        high_log = np.where(carried > 0, np.hypot(high_log, carried), high_log)
        rerun = self._reruns_profile(profile, cand, world, b_int, ratio * measured_scale, present)
        own_spread = Z90 * step_time_cv(profile)
        if own_spread > 0 and rerun.any():
            # what the profile measured is as sure as its own measurements, not as the
            # multi-GPU fit's residuals
            low_log = np.where(rerun, -own_spread, low_log)
            high_log = np.where(rerun, own_spread, high_log)
        low = step * np.exp(low_log)
        high = step * np.exp(high_log)
        hit, probe_step, p10, p90 = self._probed_shapes(profile, cand, b_int, present)
        hit &= np.isfinite(step)
        if hit.any():
            # a shape a probe ran is as sure as the probe's measurement (around both the
            # measurement and the refitted prediction, where the refit did not meet it)
            low = np.where(hit, np.minimum(step, probe_step) * p10 / probe_step, low)
            high = np.where(hit, np.maximum(step, probe_step) * p90 / probe_step, high)
        memory = np.where(present, static + per_sample * b_int, 0.0) / GIB
        validation = np.zeros(n)
        cost = validation_cost(profile)
        if cost is not None:
            # a pass runs the job forward on these GPUs: its compute's pace, not the links'
            profiled = _row_max(np.where(present, at_b, 0.0))
            pace = pass_pace / np.maximum(profiled, _LOG_FLOOR)
            validation = cost.seconds_per_batch(pace, world)
        return {
            "validation": validation,
            "step": step,
            "low": low,
            "high": high,
            "fits": fits & all_known,
            "known": known,
            "local_batch": b_int.astype(np.int64),
            "global_batch": _row_sum(b_int * workers).astype(np.int64),
            "compute": compute,
            "mean_compute": mean_compute,
            "loader_bound": loader_bound,
            "allreduce": allreduce,
            "exposed": physics_step - compute,
            "memory_gib": memory,
            "cap": cap,
            "intra_bw": intra_bw,
            "inter_bw": np.where(total_nodes > 1, inter_bw, np.inf),
        }

    @staticmethod
    def _reruns_profile(
        profile: Profile,
        cand: CandidateArrays,
        world: np.ndarray,
        b_int: np.ndarray,
        ratio: np.ndarray,
        present: np.ndarray,
    ) -> np.ndarray:
        """Candidates that run again what a one-process profile measured.

        One process on the profiled instance type (so the same accelerator and host), at
        a batch inside the profiled range, predicted by the profile's own curve (compute
        ratio 1): its step is the measurement, interpolated, with no communication to
        model. The instance type must be known on both sides: a profile from an unnamed
        machine has its host, not a cloud VM's.
        """
        env = profile.environment
        none = np.zeros(cand.size, dtype=bool)
        if env.world_size != 1 or not env.instance_type or cand.instance_type is None:
            return none
        batches = [p.local_batch_size for p in profile.step_points()]
        same = (
            present
            & (np.asarray(cand.accelerator) == env.accelerator)
            & (np.asarray(cand.instance_type) == env.instance_type)
            & np.isclose(np.nan_to_num(ratio, nan=0.0), 1.0)
            & (b_int >= min(batches))
            & (b_int <= max(batches))
        )
        return (world == 1) & _row_all(~present | same)

    def _probed_shapes(
        self, profile: Profile, cand: CandidateArrays, b_int: np.ndarray, present: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per candidate: whether a probe of this job ran exactly its shape (one instance
        type, its nodes and processes per node, its per-process batch), and that probe's
        measured step with its 10th and 90th percentiles
        (:attr:`~lightning_srifty.core.calibration.Calibration.probed`)."""
        n = cand.size
        hit = np.zeros(n, dtype=bool)
        measured, p10, p90 = np.ones(n), np.ones(n), np.ones(n)
        name = profile.model_name or "job"
        probes = [p for p in self.calibration.probed if p.model == name]
        if not probes or cand.instance_type is None:
            return hit, measured, p10, p90
        one_group = _row_sum(present.astype(np.int64)) == 1
        kinds = cand.single_type()
        nodes = _row_max(np.where(present, cand.nodes, 0))
        per_node = _row_max(np.where(present, cand.gpus_per_node, 0))
        batch = _row_max(np.where(present, b_int, 0))
        for p in probes:
            same = (
                one_group
                & (kinds == p.instance_type)
                & (nodes == p.nodes)
                & (per_node == p.gpus_per_node)
                & (batch == p.local_batch)
            )
            hit |= same
            measured[same], p10[same], p90[same] = p.step_s, p.low_s, p.high_s
        return hit, measured, p10, p90

    def _single_process_s(
        self,
        ops: int,
        nbytes: float,
        accelerators: list[tuple[str, np.ndarray]],
        alone: np.ndarray,
    ) -> np.ndarray:
        """Per group, the seconds of the ``ops`` operations moving ``nbytes`` that the
        job does only as one process (:attr:`Profile.single_process_work`), on the
        group's GPU (:func:`single_process_s`), where it runs alone; 0 elsewhere."""
        out = np.zeros(alone.shape)
        if not alone.any():
            return out
        for name, mask in accelerators:
            spec = self.gpu_specs.get(name)
            rate = spec.mem_bw_gbps * 1e9 if spec is not None else math.inf
            out[mask & alone] = float(single_process_s(ops, nbytes, rate))
        return out

    @staticmethod
    def _loader_floor_s(
        profile: Profile, cand: CandidateArrays, b_int: np.ndarray, compute_s: np.ndarray
    ) -> np.ndarray:
        """Per group, the least step the training loader's workers allow (0 without a
        measured loader: :class:`~lightning_srifty.core.profile.DataLoading`).

        Each sample costs the workers the CPU time it cost when profiled; each process
        gets the node's vCPUs over its GPUs (:func:`loader_floor_s`, which also counts
        the training thread's part of ``compute_s`` against them,
        :func:`training_thread_s`). Where the node's vCPUs are
        not known every worker is taken to have a core and the training thread its own.
        A loader in the training process itself is host time, already kept in the step.
        """
        loading = profile.data_loading
        if loading is None or loading.cpu_s_per_batch <= 0 or not profile.is_detailed:
            return np.zeros(b_int.shape)
        gpn = np.maximum(np.asarray(cand.gpus_per_node, dtype=np.float64), 1.0)
        cores = np.full(b_int.shape, np.nan)
        if cand.vcpus is not None:
            node = np.asarray(cand.vcpus, dtype=np.float64)
            cores = np.where(node > 0, np.maximum(node / gpn, 1.0), np.nan)
        per_sample = loading.cpu_s_per_sample(profile.environment.local_batch_size)
        trainer_s = training_thread_s(profile, compute_s)
        floor = loader_floor_s(per_sample * b_int, loading.workers, cores, trainer_s)
        return np.where(np.asarray(cand.nodes) > 0, floor, 0.0)

    @staticmethod
    def _transfer_sigma(
        group_compute: np.ndarray, device_s: np.ndarray, transferred: np.ndarray
    ) -> np.ndarray:
        """Per candidate, the log spread of the slowest transferred group's compute.

        A group on the profiled GPU type runs what the profile measured. On another
        type its device time comes through the compute ratio (:data:`CROSS_GPU_SPREAD`)
        and its host time is kept from a host it never ran on
        (:data:`HOST_TRANSFER_SPREAD`); the two are independent, so their spreads add
        in quadrature, each weighted by its share of the group's compute: a host-bound
        step is as unsure as its host, a GPU-bound one as its compute ratio.
        """
        total = np.maximum(group_compute, _LOG_FLOOR)
        device = np.minimum(np.maximum(device_s, 0.0), total)
        host = total - device
        sigma = np.hypot(device * CROSS_GPU_SPREAD, host * HOST_TRANSFER_SPREAD) / total
        return _row_max(np.where(transferred, sigma, 0.0))

    def _unseen(
        self,
        accelerators: list[tuple[str, np.ndarray]],
        cols: LinkColumns,
        present: np.ndarray,
    ) -> np.ndarray | None:
        """Rows with a group on hardware the calibration never measured (an accelerator
        and transport pair outside :attr:`Calibration.seen_hardware`); ``None`` when
        the calibration has no widening for them."""
        cal = self.calibration
        if cal.unseen_widening <= 0.0 and cal.hardware_spread <= 0.0:
            return None
        if not cal.seen_hardware:
            return None
        unseen = np.zeros(present.shape, dtype=bool)
        transports = np.asarray(cols.transport)
        for name, mask in accelerators:
            never = np.asarray([not cal.is_seen(name, t) for t in TRANSPORTS])
            if never.any():
                unseen |= mask & never[transports]
        return _row_max(unseen)

    def _bucket_layout(self, profile: Profile) -> tuple[np.ndarray, np.ndarray]:
        """Bucket sizes in ready order and their ready time as a share of backward."""
        if profile.buckets:
            ordered = sorted(profile.buckets, key=lambda x: x.ready_order)
            last = max(x.ready_offset_s for x in ordered) or 1.0
            sizes = np.asarray([x.bytes for x in ordered], dtype=np.float64)
            backward = profile.steps.backward_s or last
            ready = np.clip([x.ready_offset_s / max(backward, last) for x in ordered], 0, 1)
            return sizes, np.asarray(ready, dtype=np.float64)
        return buckets_from_layers(
            [x.param_bytes for x in profile.layers],
            [x.backward_s for x in profile.layers],
            DEFAULT_BUCKET_BYTES,
        )

    @staticmethod
    def _split_global(
        global_batch: int,
        alpha: np.ndarray,
        beta: np.ndarray,
        workers: np.ndarray,
        present: np.ndarray,
        cap: np.ndarray,
    ) -> np.ndarray:
        """Local batch per group so every group finishes together, within memory.

        Solves ``alpha_j + beta_j·b_j = T`` for all groups with ``sum w_j b_j = B``; a
        group that would exceed its memory is pinned at its cap and the rest re-solved.
        """
        beta = np.maximum(beta, 1e-15)
        pinned = np.zeros_like(present)
        b = np.zeros(present.shape, dtype=np.float64)
        for _ in range(present.shape[1] + 1):
            free = present & ~pinned
            fixed = _row_sum(np.where(pinned, workers * np.where(pinned, cap, 0.0), 0.0))
            weight = _row_sum(np.where(free, workers / beta, 0.0))
            offset = _row_sum(np.where(free, workers * alpha / beta, 0.0))
            with np.errstate(divide="ignore", invalid="ignore"):
                target = (global_batch - fixed + offset) / weight
            b = np.where(free, (target[:, None] - alpha) / beta, np.where(pinned, cap, 0.0))
            b = np.where(present, np.maximum(b, 1.0), 0.0)
            over = free & (b > cap)
            if not over.any():
                break
            pinned = pinned | over
        return np.nan_to_num(b, nan=1.0, posinf=1.0)

    # ---------------------------------------------------------------- public
    def predict_batch(
        self,
        profile: Profile,
        candidates: CandidateArrays,
        *,
        local_batch: int | np.ndarray | None = None,
        global_batch: int | None = None,
    ) -> StepTimeArrays:
        """Step times for every candidate at once (no Python loop per candidate).

        ``local_batch`` may also be an (n,) array: one local batch per candidate, which
        calibration uses to score measured rows taken at different batch sizes.
        """
        _check_batches(local_batch, global_batch)
        out = self._evaluate(profile, candidates, local_batch, global_batch)
        return StepTimeArrays(
            step_s=out["step"],
            low_s=out["low"],
            high_s=out["high"],
            fits=out["fits"],
            local_batch=out["local_batch"],
            global_batch=out["global_batch"],
            validation_s=out["validation"],
        )

    def predict(
        self,
        profile: Profile,
        cluster: Cluster,
        *,
        local_batch: int | None = None,
        global_batch: int | None = None,
    ) -> Prediction:
        """One cluster, with a breakdown; raises :class:`PredictionError` if impossible."""
        _check_batches(local_batch, global_batch)
        cand = CandidateArrays.from_clusters([cluster])
        out = self._evaluate(profile, cand, local_batch, global_batch)
        for j, group in enumerate(cluster.groups):
            name = group.offer.accelerator
            if not out["known"][0, j]:
                known = ", ".join(sorted(self.gpu_specs)) or "none loaded"
                raise PredictionError(
                    f"cannot scale the profile from {profile.environment.accelerator} to "
                    f"{name or 'a CPU-only instance'} ({group.offer.instance_type}): no GPU "
                    f"spec for it (known: {known})"
                )
            b = int(out["local_batch"][0, j])
            if b > out["cap"][0, j]:
                raise PredictionError(
                    f"the model needs {out['memory_gib'][0, j]:.1f} GiB per GPU at local batch "
                    f"{b}, {name} on {group.offer.instance_type} has "
                    f"{group.offer.gpu_memory_gib:g} GiB"
                )
        step = float(out["step"][0])
        compute = float(out["compute"][0])
        exposed = float(out["exposed"][0])
        return Prediction(
            step_s=step,
            low_s=float(out["low"][0]),
            high_s=float(out["high"][0]),
            compute_s=compute,
            comm_s=exposed,
            allreduce_s=float(out["allreduce"][0]),
            local_batch=tuple(int(x) for x in out["local_batch"][0, : len(cluster.groups)]),
            global_batch=int(out["global_batch"][0]),
            fits=bool(out["fits"][0]),
            memory_gib=tuple(float(x) for x in out["memory_gib"][0, : len(cluster.groups)]),
            breakdown=(
                ("compute", compute),
                ("allreduce (total)", float(out["allreduce"][0])),
                ("exposed comm + overhead", exposed),
                ("correction x", step / max(compute + exposed, _LOG_FLOOR)),
            ),
            intra_bytes_s=float(out["intra_bw"][0]),
            inter_bytes_s=float(out["inter_bw"][0]),
            validation_s=float(out["validation"][0]),
            loader_bound=bool(out["loader_bound"][0]),
        )


def colocation_load(gpus_per_node: np.ndarray | int) -> np.ndarray:
    """How many shared levels of the node's host fabric each GPU's traffic contends on.

    GPUs sharing a node slow each other's compute through the host paths they share
    (PCIe switches, root ports, a socket's memory). Those form a tree: pairs of GPUs
    under a switch, switches under a root port, root ports on a socket. With ``k`` GPUs
    a GPU shares ``log2(k)`` levels with neighbours, so the load is 1 with one
    neighbour, as a linear load was, and grows by one per doubling, not per GPU: a
    slowdown a probe measured on two GPUs a node extrapolates to eight as 3x, not 7x.
    Probes of all three public hardware sets over-predicted their 3- to 8-GPU nodes
    under the linear load (probed median 8.2 / 7.7 / 7.5 %, yolov3 on the DGX 80 % off;
    with this load 6.9 / 5.5 / 6.8 %; unseen-hardware medians within 0.2 points, the
    DGX's p90 27 -> 29 %).
    """
    k = np.maximum(np.asarray(gpus_per_node, dtype=np.float64), 1.0)
    return np.asarray(np.log2(k))


def single_process_s(ops: float, nbytes: float, memory_bytes_s: np.ndarray | float) -> np.ndarray:
    """Seconds a step spends on work the job does only when it runs as one process
    (:attr:`~lightning_srifty.core.profile.Profile.single_process_work`): ``ops`` small
    operations issued from Python (:data:`EAGER_OP_S` each on the host) that move
    ``nbytes`` through the GPU's memory (at ``memory_bytes_s``, its datasheet rate). The
    host issues them while the GPU runs them, so the slower of the two sets the time;
    an unknown rate (``inf``) leaves the host's part."""
    rate = np.maximum(np.asarray(memory_bytes_s, dtype=np.float64), _LOG_FLOOR)
    return np.asarray(np.maximum(ops * EAGER_OP_S, nbytes / rate), dtype=np.float64)


def training_thread_s(profile: Profile, compute_s: np.ndarray | float) -> np.ndarray:
    """The training thread's own seconds of a step whose compute is ``compute_s``: the
    profile's wait for data is in the compute (kept host time) but is not its CPU."""
    return np.maximum(np.asarray(compute_s, dtype=np.float64) - profile.steps.data_wait_s, 0.0)


def loader_floor_s(
    batch_cpu_s: np.ndarray | float,
    workers: int,
    cores: np.ndarray | float,
    trainer_cpu_s: np.ndarray | float,
) -> np.ndarray:
    """The least step a training process's loader workers allow, in seconds.

    The workers spend ``batch_cpu_s`` of CPU on each batch, at most ``min(workers,
    cores)`` of them at once. The training thread shares the same ``cores`` (the vCPUs
    each process gets: a node's over its GPUs) and holds one for ``trainer_cpu_s`` a
    step: on a CPU that is the compute itself (one thread of it: intra-op threads beyond
    the first are not counted), and a thread waiting for CUDA spins on
    its core by default (``cudaDeviceScheduleAuto`` spins while the process has fewer
    CUDA contexts than the machine has cores). So a step is at least
    ``(batch_cpu + trainer_cpu) / cores`` as well: 4 workers on 4 vCPUs do not make a
    batch in a quarter of its CPU time while training also runs there. With a core to
    spare for the training thread the second bound never exceeds the first or the
    compute. ``cores`` NaN (unknown): every worker has a core and training its own.
    """
    batch = np.asarray(batch_cpu_s, dtype=np.float64)
    per_process = np.asarray(cores, dtype=np.float64)
    known = np.isfinite(per_process) & (per_process > 0)
    usable = np.where(known, per_process, float(workers))
    alone = batch / np.maximum(np.minimum(float(workers), usable), 1.0)
    trainer = np.maximum(np.asarray(trainer_cpu_s, dtype=np.float64), 0.0)
    shared = np.where(known, (batch + trainer) / np.maximum(usable, 1.0), 0.0)
    return np.asarray(np.maximum(alone, shared), dtype=np.float64)


def _with_fixed_latency(curve: _Curve, host: float, latency_s: float) -> tuple[_Curve, float]:
    """A one-batch curve whose ``latency_s`` of layer time is fixed per step, and the host
    share of what remains (:meth:`PerformanceModel.layer_work`).

    The point stays where it was measured; the line through it takes the latency into
    its intercept, so only the work grows with the batch. The host share was of the
    whole step and is taken of the rest, so the host's seconds are unchanged.
    """
    measured = float(curve.times[0])
    batch = float(curve.batches[0])
    alpha = min(curve.alpha_s + latency_s, measured)
    beta = max(measured - alpha, 1e-12) / batch
    rest = measured - min(latency_s, measured)
    share = min(host * measured / rest, 1.0) if rest > 0 else 1.0
    return _Curve(alpha, beta, curve.batches, curve.times), share


def correction_features(
    world: np.ndarray,
    nodes: np.ndarray,
    gpus_per_node: np.ndarray,
    allreduce_s: np.ndarray,
    compute_s: np.ndarray,
    exposed_s: np.ndarray,
) -> np.ndarray:
    """Feature matrix in :data:`~lightning_srifty.core.calibration.FEATURE_NAMES` order."""
    compute = np.maximum(np.asarray(compute_s, dtype=np.float64), _LOG_FLOOR)
    comm = np.maximum(np.asarray(allreduce_s, dtype=np.float64), _LOG_FLOOR)
    exposed = np.maximum(np.asarray(exposed_s, dtype=np.float64), 0.0)
    return np.column_stack(
        [
            np.log(np.maximum(world, 1)),
            np.log(np.maximum(nodes, 1)),
            np.asarray(gpus_per_node, dtype=np.float64),
            np.log(comm / compute),
            exposed / (exposed + compute),
        ]
    )


def _evaluate_correction(
    correction: Correction, features: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Evaluates the three ensembles once per distinct feature row."""
    x = np.asarray(features, dtype=np.float64)
    ensembles = (correction.median, correction.low, correction.high)
    points = [
        np.unique(np.concatenate([e.thresholds(j) for e in ensembles])) for j in range(x.shape[1])
    ]
    codes = cell_codes(x, points)
    _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    distinct = x[first]
    mid = correction.median.predict(distinct)[inverse]
    lo = correction.low.predict(distinct)[inverse]
    hi = correction.high.predict(distinct)[inverse]
    return mid, lo, hi


def _distinct(names: np.ndarray, present: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """(name, mask) for each distinct accelerator among present groups.

    One vectorised string comparison per distinct name (a handful), instead of sorting
    millions of Python strings; object arrays are converted to fixed-width once.
    """
    fixed = names if names.dtype.kind == "U" else names.astype(str)
    unresolved = present.copy()
    out: list[tuple[str, np.ndarray]] = []
    while True:
        flat = int(np.argmax(unresolved))
        if not unresolved.flat[flat]:
            return out
        name = str(fixed.flat[flat])
        mask = (fixed == name) & present
        out.append((name, mask))
        unresolved &= ~mask


def _columns(a: np.ndarray) -> list[np.ndarray]:
    return [a[:, j] for j in range(a.shape[1])]


def _row_sum(a: np.ndarray) -> np.ndarray:
    """Row sums over the (few) group columns; faster than ``sum(axis=1)`` on tall arrays."""
    cols = _columns(a)
    out = cols[0].copy()
    for c in cols[1:]:
        out += c
    return out


def _row_max(a: np.ndarray) -> np.ndarray:
    cols = _columns(a)
    out = cols[0].copy()
    for c in cols[1:]:
        np.maximum(out, c, out=out)
    return out


def _row_min(a: np.ndarray) -> np.ndarray:
    cols = _columns(a)
    out = cols[0].copy()
    for c in cols[1:]:
        np.minimum(out, c, out=out)
    return out


def _row_all(a: np.ndarray) -> np.ndarray:
    cols = _columns(a)
    out = cols[0].copy()
    for c in cols[1:]:
        out &= c
    return out


def _check_batches(local_batch: int | np.ndarray | None, global_batch: int | None) -> None:
    if local_batch is not None and global_batch is not None:
        raise PredictionError("give local_batch or global_batch, not both")
    if local_batch is not None and np.any(np.asarray(local_batch) < 1):
        raise PredictionError(f"local_batch must be positive, got {local_batch}")
    if global_batch is not None and global_batch < 1:
        raise PredictionError(f"global_batch must be a positive integer, got {global_batch}")
