"""Where the job runs: accelerator name, instance type, region and float32 math mode.

Everything here is best-effort and must never block or fail training: the region comes
from SkyPilot's ``SKYPILOT_CLUSTER_INFO`` (JSON with ``cloud``, ``region``, ``zone``,
``cluster_name``) and the instance type from the EC2 instance metadata service (IMDSv2)
with a short timeout. The metadata service is asked only on an EC2 instance (DMI vendor,
see :mod:`lightning_srifty.capture.imds`), so a laptop or CI never sends a packet to
169.254.169.254; ``SRIFTY_IMDS=off`` forbids it everywhere, ``on`` forces it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lightning_srifty.capture.imds import (
    DMI_DIR,
    HYPERVISOR_UUID,
    IMDS_ENDPOINT,
    ImdsClient,
    imds_allowed,
    imds_endpoint,
)
from lightning_srifty.core.errors import MetadataUnavailableError
from lightning_srifty.core.profile import FLOAT32_MATMUL_PRECISIONS

IMDS_TIMEOUT_S = 0.2
SKYPILOT_CLUSTER_INFO = "SKYPILOT_CLUSTER_INFO"

# Most specific first: "A100" must not swallow "A100-80GB", "L4" must not swallow "L40S".
_ACCELERATOR_PATTERNS: tuple[tuple[str, str], ...] = (
    ("H200", "H200"),
    ("H100", "H100"),
    ("A100", "A100"),
    ("A10G", "A10G"),
    ("A10", "A10"),
    ("L40S", "L40S"),
    ("L4", "L4"),
    ("V100", "V100"),
    ("T4", "T4"),
    ("K80", "K80"),
)
_A100_80GB_MIN_BYTES = 60 * 2**30


@dataclass(frozen=True)
class Placement:
    """Instance type and region where known (``None`` when not)."""

    instance_type: str | None = None
    region: str | None = None


@dataclass(frozen=True)
class Float32Math:
    """What PyTorch lets a float32 job's matrix products use (TF32 or not)."""

    matmul_precision: str
    """``torch.get_float32_matmul_precision()``: ``"highest"``, ``"high"`` or ``"medium"``."""
    cudnn_allow_tf32: bool
    """``torch.backends.cudnn.allow_tf32`` (convolutions and RNNs)."""


_NEW_API_MATMUL = {"ieee": "highest", "tf32": "high", "bf16": "medium"}
"""PyTorch 2.9's ``fp32_precision`` values in the legacy names the profile records."""


def float32_math() -> Float32Math:
    """The float32 matmul and cuDNN TF32 settings in force now.

    Read at capture because they change a ``32-true`` job's step time 3-7x on Ampere and
    later while leaving a CPU or Turing run untouched, so only the profile can carry them
    to the planner. PyTorch 2.9 added ``torch.backends.*.fp32_precision`` beside the
    legacy calls and refuses the legacy getters (``RuntimeError``) once a script mixed
    the two; then the new attributes answer (``"none"`` inherits
    ``torch.backends.fp32_precision``). Anything unreadable falls back to PyTorch's
    defaults ("highest", cuDNN TF32 on): capture must never fail training.
    """
    import torch

    def new_api(*chain: object) -> str:
        """The first set ``fp32_precision`` from the most specific backend outwards."""
        for backend in (*chain, torch.backends):
            value = str(getattr(backend, "fp32_precision", "none"))
            if value != "none":
                return value
        return "none"

    try:
        matmul = str(torch.get_float32_matmul_precision())
    except RuntimeError:
        try:
            matmul = _NEW_API_MATMUL.get(new_api(torch.backends.cuda.matmul), "highest")
        except (AttributeError, RuntimeError):
            matmul = "highest"
    if matmul not in FLOAT32_MATMUL_PRECISIONS:
        matmul = "highest"
    try:
        cudnn = bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:
        try:
            conv = getattr(torch.backends.cudnn, "conv", None)
            cudnn = new_api(conv, torch.backends.cudnn) != "ieee"
        except (AttributeError, RuntimeError):
            cudnn = True
    return Float32Math(matmul_precision=matmul, cudnn_allow_tf32=cudnn)


def accelerator_from_device_name(device_name: str, total_memory_bytes: int = 0) -> str:
    """Maps ``torch.cuda.get_device_name`` output to the catalog's accelerator name.

    The catalog tells an A100 40 GB from an 80 GB one by name, while CUDA reports both
    as "NVIDIA A100-SXM4-..."; memory size decides. Unknown GPUs keep their own name so
    the profile stays honest rather than guessing a neighbour.
    """
    upper = device_name.upper()
    if upper == "CPU" or upper.startswith("CPU "):
        return "cpu"
    for needle, name in _ACCELERATOR_PATTERNS:
        if needle in upper:
            if name == "A100" and ("80GB" in upper or total_memory_bytes >= _A100_80GB_MIN_BYTES):
                return "A100-80GB"
            return name
    return device_name.removeprefix("NVIDIA ").strip() or "unknown"


def region_from_skypilot(env: Mapping[str, str]) -> str | None:
    """Region from ``SKYPILOT_CLUSTER_INFO``; ``None`` when absent or malformed."""
    raw = env.get(SKYPILOT_CLUSTER_INFO)
    if not raw:
        return None
    try:
        info = json.loads(raw)
    except json.JSONDecodeError:
        return None
    region = info.get("region") if isinstance(info, dict) else None
    return region if isinstance(region, str) and region else None


def query_imds(endpoint: str = IMDS_ENDPOINT, timeout_s: float = IMDS_TIMEOUT_S) -> Placement:
    """Instance type and region from EC2 IMDSv2 (token PUT, then two GETs), no proxy.

    Returns an empty :class:`Placement` when the service does not answer: being
    elsewhere than EC2 is normal and must cost at most a few timeouts.
    """
    client = ImdsClient(endpoint, timeout_s=timeout_s, attempts=2, backoff_s=0.05)
    try:
        return Placement(
            instance_type=(client.get("instance-type") or "").strip() or None,
            region=(client.get("placement/region") or "").strip() or None,
        )
    except MetadataUnavailableError:
        return Placement()


def detect_placement(
    env: Mapping[str, str],
    *,
    endpoint: str | None = None,
    timeout_s: float = IMDS_TIMEOUT_S,
    dmi_dir: Path = DMI_DIR,
    hypervisor_uuid: Path = HYPERVISOR_UUID,
) -> Placement:
    """Combines SkyPilot's region with the metadata service's instance type (on EC2).

    ``endpoint`` defaults to ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` from ``env``, else
    169.254.169.254.
    """
    sky_region = region_from_skypilot(env)
    allowed = imds_allowed(env, dmi_dir=dmi_dir, hypervisor_uuid=hypervisor_uuid)
    where = endpoint or imds_endpoint(env)
    imds = query_imds(where, timeout_s) if allowed else Placement()
    return Placement(instance_type=imds.instance_type, region=sky_region or imds.region)
