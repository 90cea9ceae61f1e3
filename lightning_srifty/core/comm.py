"""Gradient synchronisation cost: ring all-reduce, hierarchy, and overlap with backward.

Everything here is vectorised over candidate clusters (numpy arrays of any shape that
broadcast together) because the planner prices hundreds of thousands of clusters at
once. The physics is the textbook one:

* ring all-reduce of ``S`` bytes over ``p`` workers costs
  ``2(p-1)·alpha + 2(p-1)/p · S/beta`` (reduce-scatter then all-gather);
* when GPUs share a node the all-reduce is hierarchical: a ring inside the node over
  its link (NVLink or PCIe), then a ring across nodes over the NICs, where all GPUs of
  a node share one NIC so the node moves ``2(N-1)/N · S`` through it;
* DDP all-reduces gradients in buckets as they become ready in reverse layer order, on
  one communication stream, overlapping backward (:func:`simulate_overlap`); with only
  totals, a fluid version of the same queue stands in (:func:`exposed_allreduce_s`).
  The Pollux shortcut ``(T_comp^g + T_net^g)^(1/g)`` (:func:`pollux_overlap`) is kept
  as a baseline.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024
"""PyTorch DDP's default ``bucket_cap_mb`` (25 MiB)."""


def ring_allreduce_s(
    nbytes: np.ndarray | float,
    participants: np.ndarray | int,
    bandwidth_bytes_s: np.ndarray | float,
    latency_s: np.ndarray | float,
    *,
    messages: np.ndarray | float = 1.0,
) -> np.ndarray:
    """Seconds for a ring all-reduce of ``nbytes`` in total, split into ``messages``.

    Each message pays the ``2(p-1)`` latency hops; the bandwidth term depends only on
    the total bytes. One participant costs nothing.
    """
    p = np.asarray(participants, dtype=np.float64)
    steps = 2.0 * np.maximum(p - 1.0, 0.0)
    share = np.where(p > 1, steps / np.maximum(p, 1.0), 0.0)
    bw = np.asarray(bandwidth_bytes_s, dtype=np.float64)
    safe_bw = np.where(bw > 0, bw, np.inf)
    return np.asarray(
        steps * np.asarray(latency_s) * np.asarray(messages)
        + share * np.asarray(nbytes, dtype=np.float64) / safe_bw,
        dtype=np.float64,
    )


def tree_allreduce_s(
    nbytes: np.ndarray | float,
    participants: np.ndarray | int,
    bandwidth_bytes_s: np.ndarray | float,
    latency_s: np.ndarray | float,
    *,
    messages: np.ndarray | float = 1.0,
) -> np.ndarray:
    """Seconds for a pipelined double binary tree all-reduce across ``participants``.

    NCCL's inter-node ``Tree``: the buffer is split between two trees, and every node is
    an inner node of one and a leaf of the other. An inner node with two children
    receives ``S/2`` from each and sends ``S/2`` up, then the reverse on the way down;
    as a leaf it moves ``S/2`` each way: ``2·S`` through the busiest node's link on
    many nodes. On two nodes each tree is a pair and every node moves ``S``: the
    busiest link carries ``2(p-1)/p · S`` in both limits, like the ring. What differs
    is latency: ``2·ceil(log2 p)`` hops per message instead of ``2(p-1)``.
    """
    p = np.asarray(participants, dtype=np.float64)
    bw = np.asarray(bandwidth_bytes_s, dtype=np.float64)
    safe_bw = np.where(bw > 0, bw, np.inf)
    depth = np.ceil(np.log2(np.maximum(p, 1.0)))
    cost = (
        2.0 * depth * np.asarray(latency_s) * np.asarray(messages)
        + 2.0 * (p - 1.0) / np.maximum(p, 1.0) * np.asarray(nbytes, dtype=np.float64) / safe_bw
    )
    return np.asarray(np.where(p > 1, cost, 0.0), dtype=np.float64)


def hierarchical_allreduce_s(
    nbytes: np.ndarray | float,
    gpus_per_node: np.ndarray | int,
    nodes: np.ndarray | int,
    intra_bytes_s: np.ndarray | float,
    intra_latency_s: np.ndarray | float,
    inter_bytes_s: np.ndarray | float,
    inter_latency_s: np.ndarray | float,
    *,
    messages: np.ndarray | float = 1.0,
    inter_algorithm: str = "ring",
) -> tuple[np.ndarray, np.ndarray]:
    """(intra-node seconds, inter-node seconds) of a two-level all-reduce.

    Inside a node: reduce-scatter and all-gather over ``gpus_per_node`` GPUs (the same
    volume as a ring all-reduce). Across nodes with a ring: every GPU all-reduces its
    ``1/g`` shard, and since the ``g`` GPUs share the NIC, the node moves
    ``2(N-1)/N · S`` through it; with a tree (``inter_algorithm="tree"``), ``2·S``.
    """
    intra = ring_allreduce_s(
        nbytes, gpus_per_node, intra_bytes_s, intra_latency_s, messages=messages
    )
    across = tree_allreduce_s if inter_algorithm == "tree" else ring_allreduce_s
    inter = across(nbytes, nodes, inter_bytes_s, inter_latency_s, messages=messages)
    return intra, inter


def bucket_count(grad_bytes: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
    """DDP buckets for ``grad_bytes`` of gradients (at least one when there is any)."""
    if grad_bytes <= 0:
        return 0
    return max(1, -(-grad_bytes // max(bucket_bytes, 1)))


def pollux_overlap(
    compute_s: np.ndarray | float, network_s: np.ndarray | float, gamma: float
) -> np.ndarray:
    """Pollux's overlap shortcut ``(T_comp^g + T_net^g)^(1/g)``, g in [1, 10].

    ``g = 1`` is no overlap (sum); large ``g`` tends to perfect overlap (max). Computed
    in a scaled form so large ``g`` cannot overflow.
    """
    c = np.asarray(compute_s, dtype=np.float64)
    n = np.asarray(network_s, dtype=np.float64)
    top = np.maximum(np.maximum(c, n), 1e-300)
    ratio_c = c / top
    ratio_n = n / top
    return np.asarray(top * (ratio_c**gamma + ratio_n**gamma) ** (1.0 / gamma))


def exposed_allreduce_s(
    allreduce_s: np.ndarray | float,
    backward_s: np.ndarray | float,
    tail_fraction: np.ndarray | float,
    overlap_window: np.ndarray | float,
) -> np.ndarray:
    """Seconds the all-reduce runs past the end of backward, from totals only.

    A fluid model of DDP's bucket queue: a share ``tail_fraction`` of the gradient bytes
    becomes ready only when backward ends, the rest at an even rate over the last
    ``overlap_window`` share of backward, and one stream all-reduces bytes in ready
    order taking ``allreduce_s`` for all of them. The stream is never idle once it can
    no longer keep up, so it finishes at the later of "start of the window plus all the
    work" and "end of backward plus the tail":
    ``max(tail·T, T - window·B)`` past the end of backward. ``tail = 1`` is no overlap
    (the textbook sum), ``tail -> 0, window = 1`` perfect overlap up to ``T = B``.
    """
    t = np.asarray(allreduce_s, dtype=np.float64)
    b = np.asarray(backward_s, dtype=np.float64)
    return np.asarray(
        np.maximum(np.asarray(tail_fraction) * t, t - np.asarray(overlap_window) * b),
        dtype=np.float64,
    )


def buckets_from_layers(
    param_bytes_forward_order: Sequence[int],
    backward_s_forward_order: Sequence[float],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> tuple[np.ndarray, np.ndarray]:
    """Groups layers into DDP-style buckets in reverse layer order.

    Returns ``(bucket_bytes, ready_fraction)``: bytes per bucket in ready order and the
    fraction of backward elapsed when each bucket's last gradient is produced. Layers
    without parameters still take backward time but add nothing to buckets.
    """
    sizes = list(reversed([int(b) for b in param_bytes_forward_order]))
    times = list(reversed([float(t) for t in backward_s_forward_order]))
    total_time = sum(times)
    out_bytes: list[int] = []
    out_ready: list[float] = []
    elapsed = 0.0
    current = 0
    for size, t in zip(sizes, times, strict=True):
        elapsed += t
        if size <= 0:
            continue
        current += size
        if current >= bucket_bytes:
            out_bytes.append(current)
            out_ready.append(elapsed)
            current = 0
    if current > 0:
        out_bytes.append(current)
        out_ready.append(elapsed)
    fraction = np.asarray(out_ready, dtype=np.float64) / total_time if total_time > 0 else None
    if fraction is None:
        fraction = np.ones(len(out_bytes), dtype=np.float64)
    return np.asarray(out_bytes, dtype=np.float64), np.clip(fraction, 0.0, 1.0)


def simulate_overlap(
    backward_s: np.ndarray,
    ready_fraction: np.ndarray,
    bucket_comm_s: Sequence[np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Event simulation of buckets all-reduced on one stream while backward runs.

    Args:
        backward_s: backward duration per candidate, shape (n,).
        ready_fraction: for each bucket in ready order, the share of backward elapsed
            when it becomes ready, shape (k,).
        bucket_comm_s: all-reduce seconds of each bucket, one (n,) array per bucket.

    Returns:
        ``(end_s, exposed_s)``: when the last all-reduce ends relative to the start of
        backward, and how much of it sticks out past the end of backward.
    """
    bwd = np.asarray(backward_s, dtype=np.float64)
    stream_free = np.zeros_like(bwd)
    for frac, cost in zip(ready_fraction, bucket_comm_s, strict=True):
        ready = bwd * float(frac)
        stream_free = np.maximum(stream_free, ready) + cost
    end = np.maximum(stream_free, bwd)
    return end, end - bwd
