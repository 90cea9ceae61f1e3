"""A ``32-true`` job's matrix products on Ampere and later: TF32 only where it allows it.

Expected ratios come from the bundled GPU table's datasheet figures (an H100 SXM's
dense TF32 and FP32 peaks), never from the model: a compute-bound matrix product takes
``flops / rate``, so its time with TF32 off over on is the ratio of the two peaks.
"""

from __future__ import annotations

import dataclasses

import pytest

from lightning_srifty.core.calibration import Calibration, PhysicsConstants
from lightning_srifty.core.catalog import GpuSpec, Offer, peak_tflops
from lightning_srifty.core.cluster import Cluster, ClusterGroup
from lightning_srifty.core.perfmodel import ROOFLINE_EFFICIENCY, PerformanceModel, tf32_share
from lightning_srifty.core.profile import (
    Environment,
    LayerTiming,
    Memory,
    Profile,
    Spread,
    StepTimes,
)
from lightning_srifty.io.catalog_io import load_gpu_specs

SPECS: dict[str, GpuSpec] = load_gpu_specs()
H100 = SPECS["H100"]
H100_TF32_OVER_FP32 = H100.tf32_tflops / H100.fp32_tflops
"""494.5 / 67 on NVIDIA's H100 SXM datasheet (dense): a factor of about 7.4."""


def _offer(acc: str) -> Offer:
    return Offer(
        f"one-{acc}", acc, 1, 80.0, 16, 128, "us-east-1", "use1-az1", 10.0, 3.0, "none", 100.0
    )


def _mode(profile: Profile, matmul: str | None, cudnn: bool | None) -> Profile:
    env = dataclasses.replace(
        profile.environment, float32_matmul_precision=matmul, cudnn_allow_tf32=cudnn
    )
    return dataclasses.replace(profile, environment=env)


def _detailed(acc: str, layers: tuple[LayerTiming, ...], torch_version: str = "2.13.0") -> Profile:
    """One GPU's detailed profile whose step is all layer time (no host, no optimizer)."""
    fwd = sum(x.forward_s for x in layers)
    bwd = sum(x.backward_s for x in layers)
    step = fwd + bwd
    return Profile(
        kind="detailed",
        environment=Environment(
            f"NVIDIA {acc}", acc, 1, 1, 1, "32-true", 32, torch_version, "2.6.6"
        ),
        steps=StepTimes(Spread(step, step, step, 10), fwd, bwd, 0.0, 0.0, 2, 10),
        grad_bytes=4_000_000,
        flops_per_step=sum(x.flops for x in layers),
        memory=Memory(4_000_000, 4_000_000, 8_000_000, 10_000_000, 0, "unknown"),
        layers=layers,
    )


def _layer(name: str, kind: str, seconds: float, flops: float, act: int = 1) -> LayerTiming:
    return LayerTiming(name, "body", kind, seconds / 3, 2 * seconds / 3, 1000, 4000, flops, act)


LINEAR_T4 = _detailed(
    "T4",
    # compute-bound products (1 TFLOP each, a few bytes) and one small norm layer, each
    # within reach of its roofline (all work, no latency)
    tuple(_layer(f"fc{i}", "Linear", 0.15, 1e12) for i in range(4))
    + (_layer("norm", "LayerNorm", 1e-5, 1e6, 1_000_000),),
)


def _h100_step(profile: Profile) -> float:
    model = PerformanceModel(SPECS, Calibration(physics=PhysicsConstants()))
    cluster = Cluster((ClusterGroup(_offer("H100"), 1, 1),))
    return model.predict(profile, cluster).step_s


def test_a_linear_job_with_tf32_off_runs_about_7x_slower_on_an_h100() -> None:
    on = _h100_step(_mode(LINEAR_T4, "high", True))
    off = _h100_step(_mode(LINEAR_T4, "highest", True))
    assert off / on == pytest.approx(H100_TF32_OVER_FP32, rel=0.03)
    assert 7.0 < off / on < 7.8


def test_the_setting_changes_nothing_on_gpus_without_tf32() -> None:
    """A T4 and a V100 have no TF32: their table rows give the FP32 rate in both
    columns, so the same job takes the same time either way (and on the T4 it is the
    profile itself)."""
    model = PerformanceModel(SPECS)
    for acc in ("T4", "V100"):
        on = model.compute_ratio(_mode(LINEAR_T4, "high", True), acc)
        off = model.compute_ratio(_mode(LINEAR_T4, "highest", True), acc)
        assert on == pytest.approx(off)


def test_a_profile_from_a_cpu_carries_its_setting_to_the_gpu() -> None:
    """The plan is the run: a CPU profile of a script left at "highest" predicts an H100
    at the FP32 rate (CPU source: FLOPs over the target's rate)."""
    cpu = dataclasses.replace(
        LINEAR_T4,
        environment=dataclasses.replace(
            LINEAR_T4.environment, device_name="cpu (x86_64)", accelerator="cpu"
        ),
    )
    model = PerformanceModel(SPECS)
    on = model.compute_ratio(_mode(cpu, "high", True), "H100")
    off = model.compute_ratio(_mode(cpu, "highest", True), "H100")
    assert on is not None and off is not None
    assert off / on == pytest.approx(H100_TF32_OVER_FP32, rel=1e-6)


def test_convolutions_follow_cudnn_not_the_matmul_precision() -> None:
    """PyTorch's defaults ("highest" matmuls, cuDNN TF32 on) leave a convolutional job at
    the TF32 rate; turning cuDNN's flag off moves it to FP32."""
    conv = _detailed("T4", tuple(_layer(f"c{i}", "Conv2d", 0.15, 1e12) for i in range(4)))
    default = _h100_step(_mode(conv, "highest", True))
    all_on = _h100_step(_mode(conv, "high", True))
    cudnn_off = _h100_step(_mode(conv, "high", False))
    assert default == pytest.approx(all_on, rel=1e-9)
    assert cudnn_off / all_on == pytest.approx(H100_TF32_OVER_FP32, rel=0.03)


def test_an_old_profile_of_a_recent_pytorch_is_priced_at_its_default_fp32() -> None:
    """No recorded mode: the profiling release's default decides (off since 1.12)."""
    recent = _h100_step(_mode(LINEAR_T4, None, None))
    assert recent == pytest.approx(_h100_step(_mode(LINEAR_T4, "highest", True)))
    era = dataclasses.replace(
        LINEAR_T4, environment=dataclasses.replace(LINEAR_T4.environment, torch_version="1.10.2")
    )
    assert _h100_step(era) == pytest.approx(_h100_step(_mode(LINEAR_T4, "high", True)))


def test_the_whole_step_ratio_blends_the_rates_by_flop_share() -> None:
    """Default settings on a job with 3 TFLOP of Linear and 1 of Conv2d: a quarter of the
    products may use TF32. A profile without per-layer FLOPs weighs layer time."""
    mixed = _mode(
        _detailed(
            "T4",
            tuple(_layer(f"fc{i}", "Linear", 0.15, 1e12) for i in range(3))
            + (_layer("conv", "Conv2d", 0.15, 1e12),),
        ),
        "highest",
        True,
    )
    assert tf32_share(mixed) == pytest.approx(0.25)
    no_flops = dataclasses.replace(
        mixed, layers=tuple(dataclasses.replace(x, flops=0.0) for x in mixed.layers)
    )
    assert tf32_share(no_flops) == pytest.approx(0.25)
    # time per FLOP adds: 1/rate = 0.25/TF32 + 0.75/FP32
    blend = 1.0 / (0.25 / H100.tf32_tflops + 0.75 / H100.fp32_tflops)
    assert peak_tflops(H100, "32-true", 0.25) == pytest.approx(blend)
    assert peak_tflops(H100, "16-mixed", 0.0) == H100.fp16_tflops


def test_coarse_profiles_take_the_matmul_setting_or_an_even_blend() -> None:
    coarse = dataclasses.replace(LINEAR_T4, kind="coarse", layers=())
    assert tf32_share(_mode(coarse, "high", True)) == 1.0
    assert tf32_share(_mode(coarse, "highest", False)) == 0.0
    assert tf32_share(_mode(coarse, "highest", True)) == 0.5


def test_a_tf32_share_outside_0_to_1_is_refused() -> None:
    with pytest.raises(ValueError, match="tf32_share"):
        peak_tflops(H100, "fp32", 1.5)


def test_a_compiled_models_cpu_profile_moves_its_activations_on_the_gpu() -> None:
    """A compiled model is profiled with no layers (``capture/compiled.py``): its step's
    activations, written once and read twice, still bound it by the target's memory
    bandwidth. Before, it moved no bytes and a memory-bound step was priced by its FLOPs."""
    step = 0.05
    profile = Profile(
        kind="detailed",
        environment=Environment("cpu (x86_64)", "cpu", 1, 1, 1, "32-true", 32, "2.13.0", "2.6.6"),
        steps=StepTimes(Spread(step, step, step, 10), 0.02, 0.03, 0.0, 0.0, 2, 10),
        grad_bytes=4_000_000,
        flops_per_step=1e6,  # next to nothing: the bytes decide
        memory=Memory(4_000_000, 4_000_000, 8_000_000, 2_000_000_000, 0, "unknown"),
        extra={"compiled": {"what": "Net is compiled (torch.compile)", "steps_left_out": 0}},
    )
    ratio = PerformanceModel(SPECS).compute_ratio(profile, "H100")
    bandwidth_bound_s = 3 * 2_000_000_000 / (H100.mem_bw_gbps * 1e9) / ROOFLINE_EFFICIENCY
    assert ratio is not None
    assert ratio * step == pytest.approx(bandwidth_bound_s, rel=1e-9)
