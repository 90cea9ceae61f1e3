"""A small GAN as Lightning users write one: manual optimisation, two optimizers stepped
in every ``training_step``, with the one srifty line.

For the tests only, ``TRACE_BATCHES=<file>`` makes every rank append
``rank world batch`` for each training batch it runs, and ``STEP_SLEEP_S=<s>`` makes every
batch take at least that long (a run long enough to be revoked on any machine).

    python gan.py [--max-steps N] [--num-workers W]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import SriftyCallback


class Gan(L.LightningModule):
    def __init__(self, latent: int = 16, width: int = 64) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.latent = latent
        self.generator = nn.Sequential(nn.Linear(latent, width), nn.ReLU(), nn.Linear(width, 32))
        self.discriminator = nn.Sequential(nn.Linear(32, width), nn.LeakyReLU(0.2),
                                           nn.Linear(width, 1))  # fmt: skip

    def training_step(self, batch: Any, batch_idx: int) -> None:
        (real,) = batch
        trace = os.environ.get("TRACE_BATCHES")
        if trace:
            with open(trace, "a") as fh:
                fh.write(f"{self.global_rank} {self.trainer.world_size} {len(real)}\n")
        time.sleep(float(os.environ.get("STEP_SLEEP_S", "0")))
        opt_g, opt_d = self.optimizers()
        noise = torch.randn(len(real), self.latent, device=real.device)
        ones = torch.ones(len(real), 1, device=real.device)
        # generator: fool the discriminator
        fake = self.generator(noise)
        g_loss = nn.functional.binary_cross_entropy_with_logits(self.discriminator(fake), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        # discriminator: tell real from fake
        real_loss = nn.functional.binary_cross_entropy_with_logits(self.discriminator(real), ones)
        fake_loss = nn.functional.binary_cross_entropy_with_logits(
            self.discriminator(fake.detach()), torch.zeros_like(ones)
        )
        opt_d.zero_grad()
        self.manual_backward((real_loss + fake_loss) / 2)
        opt_d.step()
        self.log_dict({"g_loss": g_loss, "d_loss": (real_loss + fake_loss) / 2})

    def configure_optimizers(self) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
        return (
            torch.optim.Adam(self.generator.parameters(), lr=2e-4),
            torch.optim.Adam(self.discriminator.parameters(), lr=2e-4),
        )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--num-workers", type=int, default=0)
    args = p.parse_args()
    L.seed_everything(0)
    data = torch.randn(8192, 32, generator=torch.Generator().manual_seed(0)) * 0.5 + 1.0
    loader = DataLoader(TensorDataset(data), batch_size=32, shuffle=True,
                        num_workers=args.num_workers)  # fmt: skip
    trainer = L.Trainer(max_steps=args.max_steps, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[SriftyCallback()])  # fmt: skip
    trainer.fit(Gan(), loader)
    return 0


if __name__ == "__main__":
    sys.exit(main())
