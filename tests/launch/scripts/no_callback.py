"""A Lightning script that forgot the callback: it would train for a long time."""

from __future__ import annotations

import sys

import lightning as L
from lightning.pytorch.demos.boring_classes import BoringModel


def main() -> int:
    L.Trainer(max_epochs=10_000, enable_progress_bar=False).fit(BoringModel())
    return 0


if __name__ == "__main__":
    sys.exit(main())
