"""A probe's collective-bandwidth measurement: timed all-reduces among its processes.

A probe's step time mixes compute, co-location and communication; the link rate the
plan depends on is measured on its own here, as ``nccl-tests``' ``all_reduce_perf``
does: every process all-reduces buffers of a few sizes through the job's own process
group (NCCL on GPUs, gloo on CPUs) and rank zero reports how long each took. Small
buffers show the per-message latency, large ones the bandwidth. It runs once, at the
start of a probe, and takes well under a second on any link a plan would use.

Each size keeps its fastest repeat, not the median: on a shared or loaded host every
interruption (a time slice lost to another process, a page fault) only adds time, so
the fastest all-reduce is the one closest to the link's own cost. With the median of
three, a 2-core machine under load timed 64 KiB slower than 4 MiB now and then, and the
line through the timings came out with a negative slope (no rate at all).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

COLLECTIVE_SIZES = (1 << 16, 1 << 20, 1 << 22, 1 << 24)
"""Bytes per all-reduce (64 KiB to 16 MiB): latency-bound to bandwidth-bound. 16 MiB
takes about 13 ms on a 10 Gbps ring of two, long enough that a few milliseconds of
scheduling noise cannot hide the time per byte."""
COLLECTIVE_REPEATS = 5
"""Timed all-reduces per size, after one untimed warm-up; the fastest is kept."""


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
        out.append((int(buffer.numel() * 4), float(min(times))))
    return tuple(out)
