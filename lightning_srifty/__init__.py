"""lightning-srifty: swift and thrifty cloud training for PyTorch Lightning."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["ResumableLoader", "SriftyCallback", "__version__"]

if TYPE_CHECKING:
    from lightning_srifty.capture.callback import SriftyCallback
    from lightning_srifty.capture.resumable import ResumableLoader


def __getattr__(name: str) -> Any:
    """Imports on first use, so ``import lightning_srifty`` stays torch-free."""
    if name == "SriftyCallback":
        from lightning_srifty.capture.callback import SriftyCallback

        return SriftyCallback
    if name == "ResumableLoader":
        from lightning_srifty.capture.resumable import ResumableLoader

        return ResumableLoader
    raise AttributeError(f"module 'lightning_srifty' has no attribute {name!r}")
