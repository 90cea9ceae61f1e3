"""How much of a real model the per-layer records capture (goals: >= 95 % of the
parameters, >= 70 % of the forward time, FLOPs on every matmul or conv layer).

Runs ``SriftyCallback`` on Lightning's own demo models, as shipped: the demo
Transformer (``LightningTransformer``; random tokens instead of its WikiText2 download)
and the ``boring_classes`` CNN ``Net`` called as ``self.net(x)`` from a user's
``training_step``, with and without gradient accumulation. Prints, per model, the share
of parameters in the records, the share of the measured forward (and backward) phase
the records' self times add up to, the layers with FLOPs among those that run a matmul
or a convolution, and the blocks.

Run: ``.venv/bin/python benchmarks/bench_capture_coverage.py [--steps 20]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.demos import LightningTransformer
from lightning.pytorch.demos.boring_classes import Net
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import SriftyCallback
from lightning_srifty.core.profile import Profile

MATMUL_TYPES = ("Linear", "Conv2d", "MultiheadAttention", "NonDynamicallyQuantizableLinear")


class Transformer(LightningTransformer):
    def prepare_data(self) -> None:
        """No download."""

    def train_dataloader(self) -> DataLoader:
        tokens = torch.randint(0, 1000, (1024, 35), generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(tokens, torch.roll(tokens, -1, 1)), batch_size=16)


class Cnn(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.nll_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1024, 1, 28, 28, generator=g)
        return DataLoader(
            TensorDataset(x, torch.randint(0, 10, (1024,), generator=g)), batch_size=32
        )


def profile_of(model: pl.LightningModule, steps: int, accumulate: int) -> Profile:
    callback = SriftyCallback(warmup_steps=3, profile_steps=steps, verbose=False)
    with tempfile.TemporaryDirectory() as root:
        pl.Trainer(
            max_steps=steps + 4,
            accelerator="cpu",
            devices=1,
            default_root_dir=root,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accumulate_grad_batches=accumulate,
            callbacks=[callback],
        ).fit(model)
    assert callback.profile is not None
    return callback.profile


def report(name: str, profile: Profile, model: torch.nn.Module) -> bool:
    params = sum(p.numel() for p in model.parameters())
    in_records = sum(x.param_count for x in profile.layers)
    forward = sum(x.forward_s for x in profile.layers) / profile.steps.forward_s
    backward = sum(x.backward_s for x in profile.layers) / profile.steps.backward_s
    matmul = [x for x in profile.layers if x.module_type in MATMUL_TYPES]
    with_flops = [x for x in matmul if x.flops > 0]
    flop_share = sum(x.flops for x in profile.layers) / max(profile.flops_per_step, 1.0)
    print(f"{name}:")
    print(f"  parameters in records   {100 * in_records / params:6.1f} %  ({in_records:,} of "
          f"{params:,}; goal >= 95 %)")  # fmt: skip
    print(f"  forward time covered    {100 * forward:6.1f} %  (goal >= 70 %)")
    print(f"  backward time covered   {100 * backward:6.1f} %")
    print(f"  matmul/conv layers with FLOPs  {len(with_flops)} of {len(matmul)}; layer FLOPs "
          f"add up to {100 * flop_share:.1f} % of the counter's total")  # fmt: skip
    print(f"  records {len(profile.layers)}, blocks: {', '.join(b.name for b in profile.blocks)}")
    print(f"  step {profile.steps.step.mean_s * 1e3:.1f} ms, accumulation "
          f"{profile.environment.accumulate_grad_batches}")  # fmt: skip
    return in_records >= 0.95 * params and forward >= 0.7 and len(with_flops) == len(matmul)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    pl.seed_everything(0)
    ok = True
    cases: list[tuple[str, Any, int]] = [
        ("demo Transformer (vocab 1000, batch 16)", lambda: Transformer(vocab_size=1000), 1),
        ("demo CNN Net via self.net(x) (batch 32)", Cnn, 1),
        ("demo CNN Net, accumulate_grad_batches=2", Cnn, 2),
    ]
    for name, make, accumulate in cases:
        model = make()
        ok &= report(name, profile_of(model, args.steps, accumulate), model)
    print(f"verdict: {'all goals met' if ok else 'a goal is MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
