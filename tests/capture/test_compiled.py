"""A ``torch.compile``'d model under SriftyCallback: detected, timed whole, never
recompiled by the profiler (a real Trainer and real Dynamo, CPU).

Dynamo's ``eager`` backend keeps these tests fast: it traces, guards and recompiles as
the default backend does (where the hooks did their harm) and skips only the C++ code
generation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.compile import from_compiled
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import SriftyCallback
from lightning_srifty.capture.compiled import compiled_frames, describe_compiled
from lightning_srifty.io.profile_io import load_profile


class Mlp(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _data(sizes: list[int]) -> DataLoader:
    """Batches of the given sizes, in order (a batch sampler of consecutive indices)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(sum(sizes), 16, generator=g)
    y = x[:, :4].argmax(1)
    batches, start = [], 0
    for size in sizes:
        batches.append(list(range(start, start + size)))
        start += size
    return DataLoader(TensorDataset(x, y), batch_sampler=batches)


def _fit(root: Path, callbacks: list[pl.Callback], sizes: list[int], backend: Any = "eager") -> int:
    """Fits a freshly compiled model over ``sizes``; the frames Dynamo compiled."""
    torch._dynamo.reset()
    pl.seed_everything(0)
    model = torch.compile(Mlp(), backend=backend, dynamic=False)
    trainer = pl.Trainer(
        max_steps=len(sizes), accelerator="cpu", devices=1, default_root_dir=root,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        logger=False, callbacks=callbacks,
    )  # fmt: skip
    before = compiled_frames()
    trainer.fit(model, _data(sizes))
    return compiled_frames() - before


def test_each_way_a_lightning_script_compiles_is_named() -> None:
    plain = Mlp()
    assert describe_compiled(plain) == ""
    # Trainer.fit(torch.compile(model)): Lightning unwraps it and keeps a compiler context
    fitted = from_compiled(torch.compile(Mlp(), backend="eager"))
    assert describe_compiled(fitted) == "Mlp is compiled (torch.compile passed to Trainer.fit)"
    wrapped = Mlp()
    wrapped.net = torch.compile(wrapped.net, backend="eager")  # type: ignore[assignment]
    assert describe_compiled(wrapped) == "module 'net' is compiled (torch.compile)"
    in_place = Mlp()
    in_place.net.compile(backend="eager")
    assert describe_compiled(in_place) == "module 'net' is compiled (.compile())"


def test_a_compiled_model_is_timed_whole_and_the_profiler_compiles_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, the per-layer hooks were traced into the graph: each hook's closure
    failed a guard, the model recompiled up to Dynamo's limit, and the profile timed
    seconds of compilation (a 1.1 ms step profiled at 29.7 ms)."""
    sizes = [32] * 40
    plain = _fit(tmp_path / "plain", [], sizes)
    callback = SriftyCallback(warmup_steps=3, profile_steps=12, min_measure_s=0.0)
    profiled = _fit(tmp_path / "profiled", [callback], sizes)
    assert plain >= 1, "the model did not compile: the test proves nothing"
    assert profiled == plain, f"the callback made Dynamo compile {profiled} frames, not {plain}"
    assert callback.written_path is not None
    profile = load_profile(callback.written_path)
    assert profile.layers == ()
    assert profile.extra["compiled"] == {
        "what": "Mlp is compiled (torch.compile passed to Trainer.fit)",
        "steps_left_out": 0,
    }
    assert profile.steps.measured_steps == 12
    assert profile.steps.step.mean_s > 0
    assert profile.grad_bytes == sum(p.numel() * 4 for p in Mlp().parameters())
    # counted in the FLOP count's eager step: each layer's output once, 32 samples
    assert profile.memory.activation_bytes == 32 * (64 + 64 + 4) * 4
    assert "Mlp is compiled (torch.compile passed to Trainer.fit), so layers are not timed" in (
        capsys.readouterr().out
    )


def test_a_window_step_that_compiles_is_left_out(tmp_path: Path) -> None:
    """A new batch shape inside the window recompiles the model (``dynamic=False``):
    that step's time is compilation, a one-off, so it is not one of the profile's."""
    window_start = 3  # warm-up steps 0-1 and the FLOP count's step 2
    sizes = [32] * 14
    sizes[window_start + 4] = 24
    callback = SriftyCallback(warmup_steps=3, profile_steps=8, min_measure_s=0.0, verbose=False)
    _fit(tmp_path, [callback], sizes)
    assert callback.written_path is not None
    profile = load_profile(callback.written_path)
    assert profile.extra["compiled"]["steps_left_out"] == 1
    assert profile.steps.measured_steps == 7


def test_the_model_still_runs_compiled_after_the_flop_count(tmp_path: Path) -> None:
    """A compiled frame called once under ``FlopCounterMode`` was never run compiled
    again: the script trained on eagerly for good. Only the counted step runs eagerly."""

    def counting(calls: list[int]) -> Any:
        def backend(gm: torch.fx.GraphModule, inputs: Any) -> Any:
            def run(*args: Any) -> Any:
                calls.append(1)
                return gm.forward(*args)

            return run

        return backend

    steps = 20
    plain: list[int] = []
    _fit(tmp_path / "plain", [], [32] * steps, counting(plain))
    assert len(plain) == steps, "not one compiled graph a step: the count below means nothing"
    profiled: list[int] = []
    callback = SriftyCallback(warmup_steps=3, profile_steps=8, min_measure_s=0.0, verbose=False)
    _fit(tmp_path / "profiled", [callback], [32] * steps, counting(profiled))
    assert callback.profile is not None and callback.profile.flops_per_step > 0
    assert len(profiled) == steps - 1  # all but the FLOP count's step
