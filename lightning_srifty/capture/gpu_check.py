"""The node's check before training: torch must see the GPUs SkyPilot gave the node.

Run by the task's ``run`` script (``python -m lightning_srifty.capture.gpu_check
--expect N``) on nodes where ``SKYPILOT_NUM_GPUS_PER_NODE`` is above zero, before
``torchrun``. A CPU-only torch build, or a CUDA build newer than the image's driver
(a CUDA 13 wheel on SkyPilot's CUDA 12 image for V100s), leaves
``torch.cuda.device_count()`` at 0; Lightning's ``accelerator="auto"`` would then train
on the CPU without a word, hours slower than planned and billed as GPUs. The check
prints one line saying what torch sees and why, and exits with
:data:`~lightning_srifty.core.launch_protocol.NO_GPU_EXIT_CODE`; nothing is trained.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence

from lightning_srifty.core.launch_protocol import NO_GPU_EXIT_CODE


def gpu_problem(expected: int) -> str | None:
    """One line on why torch cannot run ``expected`` GPU processes here, or ``None``."""
    if expected <= 0:
        return None
    import torch

    version = torch.__version__
    cuda = torch.version.cuda
    if cuda is None:
        return (
            f"srifty: this node has {expected} GPU(s) but torch {version} is a CPU-only "
            "build; nothing was trained (the task's setup installs the CUDA build)"
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        count = torch.cuda.device_count()
        available = torch.cuda.is_available()
    if not available or count == 0:
        why = next((str(w.message).strip().splitlines()[0] for w in caught), "")
        detail = f": {why}" if why else " (no driver, or a driver too old for it)"
        return (
            f"srifty: this node has {expected} GPU(s) but torch {version} (CUDA {cuda}) "
            f"sees none{detail}; nothing was trained"
        )
    if count < expected:
        return (
            f"srifty: the job runs {expected} processes on GPUs but torch {version} sees "
            f"{count} GPU(s) on this node; nothing was trained"
        )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_srifty.capture.gpu_check")
    parser.add_argument("--expect", type=int, required=True, help="GPU processes on this node")
    args = parser.parse_args(argv)
    problem = gpu_problem(args.expect)
    if problem is None:
        return 0
    print(problem, file=sys.stderr, flush=True)
    return NO_GPU_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
