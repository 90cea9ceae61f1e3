"""The node's GPU check, run here on a CPU build of torch (what a bad node looks like)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from lightning_srifty.capture.gpu_check import gpu_problem, main
from lightning_srifty.core.launch_protocol import NO_GPU_EXIT_CODE

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="needs a machine where torch sees no GPU"
)


def test_no_gpus_expected_is_fine() -> None:
    assert gpu_problem(0) is None


def test_a_node_with_gpus_and_a_torch_that_sees_none_fails_in_one_line() -> None:
    problem = gpu_problem(2)
    assert problem is not None and "\n" not in problem
    if torch.version.cuda is None:
        assert f"torch {torch.__version__} is a CPU-only build" in problem
    else:
        assert "sees none" in problem
    assert problem.endswith("nothing was trained") or "nothing was trained (" in problem


def test_the_module_exits_with_the_no_gpu_code_and_says_why_on_stderr() -> None:
    proc = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-m", "lightning_srifty.capture.gpu_check", "--expect", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == NO_GPU_EXIT_CODE
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("srifty: this node has 4 GPU(s)")
    assert main(["--expect", "0"]) == 0
