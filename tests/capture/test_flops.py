"""DeviceTolerantFlopCounter: counts what FlopCounterMode counts and keeps a step that
runs without the counter running with it."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lightning_srifty.capture.flops import DeviceTolerantFlopCounter


def test_a_device_mismatch_under_the_counter_is_retried_on_the_accelerator() -> None:
    # The CPU stands in for the host and "meta" for the accelerator: PyTorch raises the
    # same kind of device-mismatch error a CUDA kernel raises for host tensors.
    accel, host = torch.ones(4, 3, device="meta"), torch.ones(4, 3)
    with pytest.raises(RuntimeError, match="device"), FlopCounterMode(display=False):
        torch.mul(accel, host)
    with DeviceTolerantFlopCounter(display=False):
        out = torch.mul(accel, host)
    assert out.device.type == "meta"
    assert out.shape == (4, 3)


def test_other_errors_propagate_unchanged() -> None:
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        with DeviceTolerantFlopCounter(display=False):
            torch.mm(torch.ones(2, 3), torch.ones(2, 3))


def test_counts_match_the_plain_counter() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(16, 32)
    totals = []
    for counter in (FlopCounterMode(display=False), DeviceTolerantFlopCounter(display=False)):
        with counter:
            model(x).sum().backward()
        totals.append(counter.get_total_flops())
    # forward 2*16*(32*64 + 64*8); backward twice that, less the first layer's input grad
    forward = 2 * 16 * (32 * 64 + 64 * 8)
    assert totals[0] == totals[1] == forward + 2 * forward - 2 * 16 * 32 * 64
