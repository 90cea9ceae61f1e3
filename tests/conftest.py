"""Shared fixtures: where the real data lives, and a quiet SkyPilot."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
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


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's standalone S3 server in its own process on 127.0.0.1 (real HTTP)."""
    port = _free_port()
    log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)
    proc = subprocess.Popen(  # noqa: S603 - fixed argv
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):  # noqa: S310
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"moto server did not start; see {log.name}")
            time.sleep(0.2)
    try:
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        Path(log.name).unlink(missing_ok=True)


S3_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing-key-id",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-do-not-log",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def s3_env(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Dummy credentials and the moto endpoint, in os.environ and returned for children."""
    env = {**S3_TEST_ENV, "SRIFTY_S3_ENDPOINT_URL": moto_endpoint}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture
def s3_uri(s3_env: dict[str, str], request: pytest.FixtureRequest) -> str:
    """A fresh, empty bucket on the moto server; returns ``s3://bucket/prefix``."""
    import boto3

    bucket = "srifty-" + uuid.uuid4().hex[:20]
    boto3.client("s3", endpoint_url=s3_env["SRIFTY_S3_ENDPOINT_URL"]).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/runs/{request.node.name[:40].replace('[', '-').strip(']')}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
