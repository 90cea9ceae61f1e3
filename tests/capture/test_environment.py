"""Accelerator names, SkyPilot's cluster info, the EC2 metadata service and the float32
math mode."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import lightning.pytorch as pl
import pytest
import torch

from lightning_srifty import SriftyCallback
from lightning_srifty.capture.environment import (
    Float32Math,
    Placement,
    accelerator_from_device_name,
    detect_placement,
    float32_math,
    query_imds,
    region_from_skypilot,
)
from lightning_srifty.capture.imds import is_ec2
from lightning_srifty.io.profile_io import load_profile
from tests.fakes import FakeImds, serve_fake_imds, silent_endpoint

GIB = 2**30


@pytest.mark.parametrize(
    ("device_name", "memory", "expected"),
    [
        ("Tesla T4", 15 * GIB, "T4"),
        ("NVIDIA A10G", 22 * GIB, "A10G"),
        ("Tesla V100-SXM2-16GB", 16 * GIB, "V100"),
        ("NVIDIA A100-SXM4-40GB", 40 * GIB, "A100"),
        ("NVIDIA A100-SXM4-80GB", 80 * GIB, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", 0, "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", 80 * GIB, "H100"),
        ("NVIDIA L4", 22 * GIB, "L4"),
        ("NVIDIA L40S", 45 * GIB, "L40S"),
        ("NVIDIA GeForce RTX 4090", 24 * GIB, "GeForce RTX 4090"),
    ],
)
def test_accelerator_names_follow_the_catalog(device_name: str, memory: int, expected: str) -> None:
    assert accelerator_from_device_name(device_name, memory) == expected


def test_region_from_skypilot_cluster_info() -> None:
    info = {"cluster_name": "c", "cloud": "AWS", "region": "eu-west-1", "zone": "eu-west-1a"}
    assert region_from_skypilot({"SKYPILOT_CLUSTER_INFO": json.dumps(info)}) == "eu-west-1"
    assert region_from_skypilot({"SKYPILOT_CLUSTER_INFO": "{not json"}) is None
    assert region_from_skypilot({"SKYPILOT_CLUSTER_INFO": "[1, 2]"}) is None
    assert region_from_skypilot({}) is None


@contextmanager
def serve_fake_imds_proxy() -> Iterator[tuple[str, list[str]]]:
    """An HTTP proxy on 127.0.0.1 that records what reaches it and answers 502."""
    seen: list[str] = []

    class Proxy(BaseHTTPRequestHandler):
        def _any(self) -> None:
            seen.append(f"{self.command} {self.path}")
            self.send_response(502)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_PUT = _any  # noqa: N815

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def imds_server() -> Iterator[str]:
    with serve_fake_imds() as endpoint:
        yield endpoint


def test_imds_v2_token_then_metadata(imds_server: str) -> None:
    placement = query_imds(imds_server, timeout_s=2.0)
    assert placement == Placement(instance_type="p3.8xlarge", region="us-west-2")
    assert FakeImds.requests[0] == "PUT /latest/api/token"


def _dmi(tmp_path: Path, **files: str) -> Path:
    """A stand-in for /sys/devices/virtual/dmi/id with the given files."""
    folder = tmp_path / "dmi"
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text + "\n")
    return folder


def test_skypilot_region_wins_and_imds_gives_instance_type(
    imds_server: str, tmp_path: Path
) -> None:
    env = {"SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "AWS", "region": "us-east-2"})}
    ec2 = _dmi(tmp_path, sys_vendor="Amazon EC2", board_vendor="Amazon EC2")
    placement = detect_placement(
        env, endpoint=imds_server, timeout_s=2.0, dmi_dir=ec2, hypervisor_uuid=tmp_path / "no"
    )
    assert placement == Placement(instance_type="p3.8xlarge", region="us-east-2")


@pytest.mark.parametrize(
    ("files", "uuid", "expected"),
    [
        ({"board_vendor": "Amazon EC2"}, None, True),  # Nitro instances
        ({"sys_vendor": "Amazon EC2", "board_vendor": ""}, None, True),
        ({"sys_vendor": "Xen"}, "ec2e1916-9099-7caf-fd21-012345abcdef", True),  # older Xen
        ({"sys_vendor": "QEMU", "board_vendor": "Red Hat"}, None, False),
        ({"sys_vendor": "Amazon EC2 compatible"}, None, False),
        ({}, "4c4c4544-0042-3510-8052-b3c04f4d3732", False),
        ({}, None, False),  # containers and laptops without DMI files
    ],
)
def test_ec2_is_detected_from_the_dmi_vendor(
    files: dict[str, str], uuid: str | None, expected: bool, tmp_path: Path
) -> None:
    hypervisor = tmp_path / "hypervisor-uuid"
    if uuid is not None:
        hypervisor.write_text(uuid + "\n")
    assert is_ec2(_dmi(tmp_path, **files), hypervisor) is expected


def test_off_ec2_the_profiling_run_sends_nothing(imds_server: str, tmp_path: Path) -> None:
    laptop = _dmi(tmp_path, sys_vendor="LENOVO", board_vendor="LENOVO")
    for env in ({}, {"SRIFTY_IMDS": "auto"}):
        placement = detect_placement(
            env, endpoint=imds_server, dmi_dir=laptop, hypervisor_uuid=tmp_path / "no"
        )
        assert placement == Placement()
    assert FakeImds.requests == []
    forced = detect_placement(
        {"SRIFTY_IMDS": "on"}, endpoint=imds_server, dmi_dir=laptop, timeout_s=2.0
    )
    assert forced.instance_type == "p3.8xlarge"


def test_metadata_requests_bypass_any_proxy(
    imds_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serve_fake_imds_proxy() as (proxy_url, seen):
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        monkeypatch.setenv("http_proxy", proxy_url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        placement = query_imds(imds_server, timeout_s=2.0)
    assert placement.instance_type == "p3.8xlarge"
    assert seen == []  # the proxy never saw a metadata request
    assert "PUT /latest/api/token" in FakeImds.requests


def test_imds_off_sends_nothing(imds_server: str) -> None:
    placement = detect_placement({"SRIFTY_IMDS": "off"}, endpoint=imds_server, timeout_s=2.0)
    assert placement == Placement()
    assert FakeImds.requests == []


def test_absent_metadata_service_returns_none_quickly() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    started = time.perf_counter()
    placement = query_imds(f"http://127.0.0.1:{closed_port}", timeout_s=0.2)
    assert placement == Placement()
    assert time.perf_counter() - started < 1.0


def test_silent_metadata_service_times_out() -> None:
    with silent_endpoint() as endpoint:  # accepts the connection but never answers
        started = time.perf_counter()
        placement = query_imds(endpoint, timeout_s=0.2)
    assert placement == Placement()
    assert time.perf_counter() - started < 2.0  # two tries of 0.2 s, not a hang


@pytest.fixture
def restore_float32_math() -> Iterator[None]:
    """Puts PyTorch's legacy float32 settings back (tests set them process-wide)."""
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn


@pytest.mark.usefixtures("restore_float32_math")
def test_float32_math_reads_the_legacy_settings() -> None:
    assert float32_math() == Float32Math("highest", True)  # PyTorch's defaults
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = False
    assert float32_math() == Float32Math("high", False)
    torch.set_float32_matmul_precision("medium")
    assert float32_math().matmul_precision == "medium"


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ('torch.backends.cuda.matmul.fp32_precision = "tf32"', ("high", True)),
        ('torch.backends.fp32_precision = "tf32"', ("high", True)),
        ('torch.backends.cudnn.conv.fp32_precision = "ieee"', ("highest", False)),
    ],
)
def test_float32_math_reads_pytorchs_new_api_where_the_legacy_getters_refuse(
    setting: str, expected: tuple[str, bool]
) -> None:
    """PyTorch 2.9+ raises from ``get_float32_matmul_precision`` once a script set the
    new ``fp32_precision`` attributes; capture reads those instead. A fresh interpreter,
    because that state cannot be undone in this one."""
    code = (
        f"import torch\n{setting}\n"
        "from lightning_srifty.capture.environment import float32_math\n"
        "m = float32_math()\nprint(m.matmul_precision, m.cudnn_allow_tf32)\n"
    )
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    matmul, cudnn = out.stdout.split()
    assert (matmul, cudnn == "True") == expected


@pytest.mark.usefixtures("restore_float32_math")
@pytest.mark.parametrize("matmul", ["highest", "high"])
def test_a_trainer_profile_records_the_float32_math_mode(
    digits: ModuleType, tmp_path: Path, matmul: str
) -> None:
    """A real Trainer on CPU: the profile records the setting the script ran with,
    though a CPU ignores it, because the GPU the plan rents will not."""
    torch.set_float32_matmul_precision(matmul)
    callback = SriftyCallback(warmup_steps=1, profile_steps=3, verbose=False)
    pl.Trainer(
        max_steps=6,
        accelerator="cpu",
        devices=1,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        callbacks=[callback],
    ).fit(digits.DigitsModule(hidden=32), datamodule=digits.DigitsDataModule(batch_size=32))
    env = load_profile(tmp_path / "srifty" / "profile.json").environment
    assert env.float32_matmul_precision == matmul
    assert env.cudnn_allow_tf32 is True
    assert env.matmul_tf32 is (matmul != "highest")
