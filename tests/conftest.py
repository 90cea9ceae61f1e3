"""Shared fixtures: where the real data lives, and a quiet SkyPilot."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SRIFTY_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))

os.environ.setdefault("SKYPILOT_DISABLE_LOCAL_API_SERVER", "1")
os.environ.setdefault("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")
os.environ.setdefault("SRIFTY_IMDS", "off")  # never contact 169.254.169.254 from tests


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The published measurements in ../shared/data; skips the test when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA} (set SRIFTY_SHARED_DATA)")
    return SHARED_DATA
