"""Accelerator names, SkyPilot's cluster info and the EC2 metadata service."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from lightning_srifty.capture.environment import (
    Placement,
    accelerator_from_device_name,
    detect_placement,
    query_imds,
    region_from_skypilot,
)
from tests.fakes import FakeImds, serve_fake_imds

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


@pytest.fixture
def imds_server() -> Iterator[str]:
    with serve_fake_imds() as endpoint:
        yield endpoint


def test_imds_v2_token_then_metadata(imds_server: str) -> None:
    placement = query_imds(imds_server, timeout_s=2.0)
    assert placement == Placement(instance_type="p3.8xlarge", region="us-west-2")
    assert FakeImds.requests[0] == "PUT /latest/api/token"


def test_skypilot_region_wins_and_imds_gives_instance_type(imds_server: str) -> None:
    env = {"SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "AWS", "region": "us-east-2"})}
    placement = detect_placement(env, endpoint=imds_server, timeout_s=2.0)
    assert placement == Placement(instance_type="p3.8xlarge", region="us-east-2")


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
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # accepts the connection but never answers
        started = time.perf_counter()
        placement = query_imds(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.2)
    assert placement == Placement()
    assert time.perf_counter() - started < 1.0
