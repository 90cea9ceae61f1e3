"""What replaying persistent workers' draws costs a loader (the reports each worker
sends with its batches: ``capture/resumable_sampler.py: _ReportingCollate``).

Under the launcher each persistent worker takes its generators (torch, numpy,
``random``) after every batch and sends them as bytes beside it; the training process
takes them off. This times the same ``DataLoader(persistent_workers=True)`` plain and
rebuilt by the launcher (``make_resumable``), iterated for whole epochs in interleaved
repeats, with samples that cost nothing (the worst case: the report is all there is)
and with samples that cost ``--cpu-per-sample-ms`` of CPU (a decode). It prints the
mean time per batch of each, their ratio, and the report's own cost in a worker.

Measured here (2 cores, 2 workers, batch 8, median of 3): a report takes 55 us in a
worker; samples that cost nothing 0.575 ms a batch plain, 0.612 ms under the launcher
(1.06); 0.25 ms of CPU a sample 1.895 ms both (1.00). Sent as the checkpoint's tensors
instead, the report took 185 us to take and send and 120 us to receive, per batch.

    .venv/bin/python benchmarks/bench_worker_replay.py [--cpu-per-sample-ms 0.25]
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from lightning_srifty.capture.resumable_sampler import _raw_rng_state, make_resumable

BATCH = 8
BATCHES = 250
EPOCHS = 3


class Costing(Dataset[torch.Tensor]):
    """Samples that cost their worker ``cpu_s`` of CPU time, with a random draw."""

    def __init__(self, cpu_s: float) -> None:
        self.cpu_s = cpu_s

    def __len__(self) -> int:
        return BATCH * BATCHES

    def __getitem__(self, index: int) -> torch.Tensor:
        end = time.thread_time() + self.cpu_s
        while time.thread_time() < end:
            pass
        return torch.full((4,), float(index)) + torch.rand(4)


def _loader(cpu_s: float, launched: bool) -> Any:
    epoch = [0]
    plain = DataLoader(Costing(cpu_s), batch_size=BATCH, shuffle=True, num_workers=2,
                       persistent_workers=True, multiprocessing_context="forkserver")  # fmt: skip
    loader = make_resumable(plain, lambda: epoch[0]) if launched else plain
    return loader, epoch


def _seconds_per_batch(cpu_s: float, launched: bool) -> float:
    loader, epoch = _loader(cpu_s, launched)
    next(iter(loader))  # workers started and warm; not timed
    start = time.perf_counter()
    batches = 0
    for e in range(1, EPOCHS + 1):
        epoch[0] = e
        for _ in loader:
            batches += 1
    return (time.perf_counter() - start) / batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-per-sample-ms", type=float, default=0.25)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    report_us = timeit.timeit(_raw_rng_state, number=2000) / 2000 * 1e6
    print(f"a worker's report (its generators as bytes): {report_us:.0f} us per batch")
    for cpu_ms in (0.0, args.cpu_per_sample_ms):
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.repeats):
            for launched in (False, True):
                times[launched].append(_seconds_per_batch(cpu_ms / 1e3, launched))
        plain, launched_s = statistics.median(times[False]), statistics.median(times[True])
        print(
            f"{cpu_ms:.2f} ms of CPU a sample, batch {BATCH}, 2 persistent workers: "
            f"plain {plain * 1e3:.3f} ms a batch, launcher's {launched_s * 1e3:.3f} ms, "
            f"ratio {launched_s / plain:.2f} (median of {args.repeats})"
        )


if __name__ == "__main__":
    main()
