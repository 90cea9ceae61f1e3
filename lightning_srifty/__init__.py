"""lightning-srifty: swift and thrifty cloud training for PyTorch Lightning."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["SriftyCallback", "__version__"]

if TYPE_CHECKING:
    from lightning_srifty.capture.callback import SriftyCallback


def __getattr__(name: str) -> Any:
    """Imports the callback on first use, so ``import lightning_srifty`` stays torch-free."""
    if name == "SriftyCallback":
        from lightning_srifty.capture.callback import SriftyCallback

        return SriftyCallback
    raise AttributeError(f"module 'lightning_srifty' has no attribute {name!r}")
