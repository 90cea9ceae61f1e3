"""Shared fixtures of the fit tests: one synthetic trace folder for the module's tests."""

from __future__ import annotations

import pytest

from lightning_srifty.io.traces import TraceSet, load_traces
from tests.io.test_traces import write_synthetic_traces


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> TraceSet:
    """Four synthetic models on a Pollux-like cluster, 2 % noise (algebra, not accuracy)."""
    return load_traces(write_synthetic_traces(tmp_path_factory.mktemp("traces"), noise=0.02))
