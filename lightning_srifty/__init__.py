"""lightning-srifty: swift and thrifty cloud training for PyTorch Lightning."""

__version__ = "0.1.0"
