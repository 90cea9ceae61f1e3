"""A probe's collective-bandwidth measurement: timed all-reduces among its processes.

A probe's step time mixes compute, co-location and communication; the link rate the
plan depends on is measured on its own here, as ``nccl-tests``' ``all_reduce_perf``
does: every process all-reduces buffers of a few sizes through the job's own process
group (NCCL on GPUs, gloo on CPUs) and rank zero reports how long each took. Small
buffers show the per-message latency, large ones the bandwidth. It runs once, at the
start of a probe, and takes well under a second on any link a plan would use.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

COLLECTIVE_SIZES = (1 << 16, 1 << 20, 1 << 22)
"""Bytes per all-reduce (64 KiB, 1 MiB, 4 MiB): latency-bound to bandwidth-bound."""
COLLECTIVE_REPEATS = 3
"""Timed all-reduces per size, after one untimed warm-up; the median is kept."""


def measure_allreduce(
    device: Any,
    sizes: Sequence[int] = COLLECTIVE_SIZES,
    repeats: int = COLLECTIVE_REPEATS,
) -> tuple[tuple[int, float], ...]:
    """``(bytes, seconds)`` per size of an all-reduce among every process of the default
    group; empty outside a process group of two or more. Every rank must call it."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return ()
    cuda = torch.device(device).type == "cuda"

    def wait() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    out = []
    for nbytes in sizes:
        buffer = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32, device=device)
        dist.all_reduce(buffer)  # warm-up: connections and buffers set up
        wait()
        times = []
        for _ in range(max(repeats, 1)):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            wait()
            times.append(time.perf_counter() - start)
        out.append((int(buffer.numel() * 4), float(statistics.median(times))))
    return tuple(out)
