"""FLOP counting that never breaks a training step the script runs fine without it.

:class:`~torch.utils.flop_counter.FlopCounterMode` is a Python dispatch mode, and an
active mode changes how some composite operators dispatch. ``F.ctc_loss`` with length
tensors on the CPU (valid, and what deepspeech.pytorch passes) is the case measured
here: on a CUDA device it trains, but under the counter PyTorch takes the operator's
subclass-safe path (``ctc_loss`` in ``aten/src/ATen/native/LossCTC.cpp`` branches on
``areAnyTensorSubclassLike``, which an active mode makes true) and hands the CPU
lengths to the CUDA kernel, which raises "Expected all tensors to be on the same
device" (seen on an H100, PyTorch 2.11, DeepSpeech2 under ``SriftyCallback``).

:class:`DeviceTolerantFlopCounter` retries such an operator once with its CPU tensor
arguments moved to the device of its other tensors: the values are the same, which is
what the fast path does itself when no mode is active (it reads the lengths on the
host). Any other failure is re-raised unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import flop_counter
from torch.utils._pytree import tree_flatten, tree_map

_MISMATCH = ("same device", "not on the expected device")
"""Phrases of PyTorch's device-mismatch errors (CUDA kernels' and the meta checks')."""

_INNER_MODE: Any = getattr(flop_counter, "_FlopCounterMode", None)
"""The dispatch mode behind ``FlopCounterMode`` (PyTorch 2.2 and later)."""


def _accelerator_of(args: Any, kwargs: Any) -> torch.device | None:
    """The first non-CPU device among the tensors of a call, if any."""
    leaves, _ = tree_flatten((args, kwargs))
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.device.type != "cpu":
            return leaf.device
    return None


def _onto(device: torch.device, args: Any, kwargs: Any) -> tuple[Any, Any]:
    def move(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.device.type == "cpu":
            return leaf.to(device)
        return leaf

    moved: tuple[Any, Any] = tree_map(move, (args, kwargs))
    return moved


if _INNER_MODE is not None:

    class _TolerantMode(_INNER_MODE):  # type: ignore[misc,valid-type]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            try:
                return super().__torch_dispatch__(func, types, args, kwargs)
            except RuntimeError as exc:
                device = _accelerator_of(args, kwargs)
                if device is None or not any(m in str(exc) for m in _MISMATCH):
                    raise
                moved_args, moved_kwargs = _onto(device, args, kwargs or {})
                return super().__torch_dispatch__(func, types, moved_args, moved_kwargs)


class DeviceTolerantFlopCounter(flop_counter.FlopCounterMode):
    """``FlopCounterMode`` whose dispatch retries a device mismatch the mode caused."""

    def __enter__(self) -> DeviceTolerantFlopCounter:
        super().__enter__()
        plain = getattr(self, "mode", None)
        if _INNER_MODE is not None and isinstance(plain, _INNER_MODE):
            plain.__exit__(None, None, None)
            tolerant = _TolerantMode(self)
            tolerant.__enter__()
            self.mode = tolerant
        return self
