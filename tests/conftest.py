"""Shared fixtures: where the real data lives, and a quiet SkyPilot."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lightning_srifty.launch import sky_runtime

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SRIFTY_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))

os.environ.setdefault("SKYPILOT_DISABLE_LOCAL_API_SERVER", "1")
os.environ.setdefault("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")
os.environ.setdefault("SRIFTY_IMDS", "off")  # never contact 169.254.169.254 from tests

# SkyPilot fixes its catalog folder when `sky` is first imported, by whichever test that
# is; point every import in this session at one private offline runtime before any test
# runs, so test order never decides which catalog SkyPilot reads.
_SKY_OFFLINE = sky_runtime.prepare_offline_runtime(tempfile.mkdtemp(prefix="srifty-sky-"))
for _key in [k for k in os.environ if k.upper().startswith("AWS_")]:
    del os.environ[_key]
os.environ["SKY_RUNTIME_DIR"] = str(_SKY_OFFLINE.runtime_dir)
os.environ["HOME"] = str(_SKY_OFFLINE.home_dir)
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The published measurements in ../shared/data; skips the test when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA} (set SRIFTY_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def sky_offline() -> Iterator[sky_runtime.OfflineRuntime]:
    """SkyPilot in this process, offline: bundled catalog, AWS marked enabled, no creds."""
    sky_runtime.activate_in_process(_SKY_OFFLINE)
    yield _SKY_OFFLINE
