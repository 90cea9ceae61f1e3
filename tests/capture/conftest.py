"""Fixtures for capture tests: the example model, and no EC2 metadata look-ups."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_digits_example() -> ModuleType:
    """Imports examples/digits.py (examples/ is not a package)."""
    if "digits" in sys.modules:
        return sys.modules["digits"]
    spec = importlib.util.spec_from_file_location("digits", EXAMPLES / "digits.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["digits"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def no_imds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never contact 169.254.169.254 from the test suite."""
    monkeypatch.setenv("SRIFTY_IMDS", "off")
    monkeypatch.delenv("SRIFTY_PROFILE_PATH", raising=False)
    monkeypatch.delenv("SKYPILOT_CLUSTER_INFO", raising=False)


@pytest.fixture(scope="session")
def digits() -> ModuleType:
    return load_digits_example()
