"""Pollux-format trace folders: the real data, and every kind of bad input.

Also home of :func:`write_synthetic_traces`, a small trace folder whose step times
follow planted hardware constants (an independent re-statement of the textbook
formulas), so calibration tests can check the constants come back, and of
:func:`scaled`, which perturbs some rows of a trace set.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from lightning_srifty.core.errors import TraceError
from lightning_srifty.core.profile import BatchPoint
from lightning_srifty.io.traces import (
    Measurement,
    TraceSet,
    coarse_profile,
    load_traces,
    placement_cluster,
    read_measurements,
    spread_replicas,
    step_roughness,
)

PLANTED = {
    "inter_gbytes_s": 0.75,
    "intra_gbytes_s": 4.0,
    "tail_fraction": 0.3,
    "overlap_window": 0.7,
    "overhead_s": 0.004,
}
SYNTHETIC_MODELS = {
    "alpha": (20_000_000, 0.02, 0.004),
    "beta": (60_000_000, 0.05, 0.010),
    "gamma": (5_000_000, 0.004, 0.0004),
    "delta": (30_000_000, 0.03, 0.002),
}
SYNTHETIC_PLACEMENTS = ("1", "2", "4", "11", "22", "44", "111", "1111", "2222", "4444", "12", "24")
SYNTHETIC_BATCHES = (4, 8, 16, 32)
SINGLE_GPU_HOOK_S = 0.001
"""One GPU still pays the synchronisation hook, recorded as its sync time (as AdaptDL)."""


def planted_step(
    params: int, alpha: float, beta: float, placement: str, b: int, tail: float | None = None
) -> float:
    """Step time from the planted constants: compute, then the part of NCCL's flat ring
    all-reduce that backward (2/3 of compute) cannot hide."""
    compute = alpha + beta * b
    gpus = [int(c) for c in placement]
    p, n = sum(gpus), len(gpus)
    if p == 1:
        return compute + SINGLE_GPU_HOOK_S
    size = params * 4.0
    intra_bw, inter_bw = PLANTED["intra_gbytes_s"] * 1e9, PLANTED["inter_gbytes_s"] * 1e9
    link = intra_bw if n == 1 else min(intra_bw, inter_bw)
    comm = 2 * (p - 1) / p * size / link
    backward = 2 / 3 * compute
    tail = PLANTED["tail_fraction"] if tail is None else tail
    exposed = max(tail * comm, comm - PLANTED["overlap_window"] * backward)
    return compute + exposed + PLANTED["overhead_s"]


def write_synthetic_traces(
    root: Path,
    noise: float = 0.0,
    seed: int = 0,
    tails: dict[str, float] | None = None,
    hardware_changes: dict[str, object] | None = None,
) -> Path:
    """Writes a Pollux-format folder (4 models) following :func:`planted_step`;
    ``tails`` gives some models their own tail fraction. The cluster is described as
    the Pollux one (TCP in an AWS cluster placement group, one socket per NCCL
    connection from a pod), so both planted rates are reachable: 2 flows x 10 Gbps x
    efficiency across nodes, 2 flows x one socket's rate x efficiency inside them."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    hardware = {
        "g4dn.12xlarge": {
            "gpu": "T4",
            "gpu_memory_gib": 16,
            "gpus_per_node": 4,
            "intra_node_link": "PCIe",
            "inter_node_gbps": 50,
            "nodes": 4,
            "inter_node_fabric": "ENA Ethernet, NCCL over TCP sockets, no EFA, one cluster "
            "placement group",
        }
    }
    hardware["g4dn.12xlarge"].update(hardware_changes or {})
    (root / "hardware.json").write_text(json.dumps(hardware))
    models = {
        name: {"params": spec[0], "grad_dtype": "fp32"} for name, spec in SYNTHETIC_MODELS.items()
    }
    (root / "models.json").write_text(json.dumps(models))
    for name, (params, alpha, beta) in SYNTHETIC_MODELS.items():
        (root / name).mkdir(exist_ok=True)
        with open(root / name / "placements.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["placement", "local_bsz", "step_time", "sync_time"])
            for placement in SYNTHETIC_PLACEMENTS:
                for b in SYNTHETIC_BATCHES:
                    tail = (tails or {}).get(name)
                    step = planted_step(params, alpha, beta, placement, b, tail)
                    step *= math.exp(noise * rng.standard_normal())
                    sync = max(step - (alpha + beta * b), 0.0)
                    w.writerow([placement, b, step, min(sync, step)])
    return root


def scaled(
    traces: TraceSet, model: str, keep: Callable[[Measurement], bool], factor: float
) -> TraceSet:
    """``traces`` with the step and sync times of ``model``'s rows that ``keep`` picks
    multiplied by ``factor`` (to show which rows a fit or a prediction depends on)."""
    rows = dict(traces.rows)
    rows[model] = tuple(
        dataclasses.replace(r, step_time=r.step_time * factor, sync_time=r.sync_time * factor)
        if keep(r)
        else r
        for r in traces.rows[model]
    )
    return dataclasses.replace(traces, rows=rows)


# ---------------------------------------------------------------- real data


def test_real_traces_load_with_every_row(shared_data: Path) -> None:
    folder = shared_data / "pollux-traces"
    traces = load_traces(folder)
    assert set(traces.rows) == {"bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"}
    for model, rows in traces.rows.items():
        lines = sum(
            sum(1 for _ in open(folder / model / f)) - 1
            for f in ("placements.csv", "scalability.csv")
        )
        assert len(rows) == lines
    assert traces.hardware.gpu == "T4" and traces.hardware.inter_node_gbps == 50


def test_scalability_rows_spread_replicas_evenly(shared_data: Path) -> None:
    traces = load_traces(shared_data / "pollux-traces", models=["cifar10"])
    spread = [r for r in traces.rows["cifar10"] if r.nodes == 16 and r.replicas == 20]
    assert spread and spread[0].placement == (2,) * 4 + (1,) * 12
    assert spread_replicas(64, 16) == (4,) * 16


def test_coarse_profile_uses_only_single_gpu_rows(shared_data: Path) -> None:
    traces = load_traces(shared_data / "pollux-traces", models=["bert"])
    single = traces.single_gpu_rows("bert")
    profile = coarse_profile(traces.models["bert"], single, traces.hardware)
    assert profile.grad_bytes == 108_893_186 * 4
    assert [p.local_batch_size for p in profile.batch_points] == [4, 6, 8, 11, 12]
    first = next(r for r in single if r.local_bsz == 4)
    # less AdaptDL's one-replica statistics on the T4 (320 GB/s): 199 tensors x 11
    # operations at 10 us, 108.9M parameters x 76 bytes; the memory is the slower
    alone = max(199 * 11 * 10e-6, 76 * 108_893_186 / 320e9)
    assert profile.single_process_work == (199 * 11, 76.0 * 108_893_186)
    assert profile.batch_points[0].compute_s == pytest.approx(
        first.step_time - first.sync_time - alone
    )


def test_a_one_gpu_row_is_predicted_back_with_adaptdls_one_replica_work(
    shared_data: Path,
) -> None:
    """The profile leaves AdaptDL's one-replica statistics out of the job's compute and
    the model adds them back to one process only: the one-GPU rows the profile came
    from are predicted as measured, and two GPUs get none of it. A job the table does
    not know (its parameters differ) keeps its rows as measured."""
    from lightning_srifty.core.cluster import Cluster, ClusterGroup
    from lightning_srifty.core.perfmodel import PerformanceModel
    from lightning_srifty.io.catalog_io import load_gpu_specs

    traces = load_traces(shared_data / "sia-traces" / "dgx-ext", models=["cifar10"])
    info = traces.models["cifar10"]
    assert info.parameter_tensors == 62
    single = traces.single_gpu_rows("cifar10")
    profile = coarse_profile(info, single, traces.hardware)
    model = PerformanceModel(load_gpu_specs())
    offer = traces.hardware.offer()
    one = Cluster((ClusterGroup(offer, 1, 1),))
    for point in profile.batch_points:
        rows = [r for r in single if r.local_bsz == point.local_batch_size]
        measured = sum(r.step_time - r.sync_time for r in rows) / len(rows)
        predicted = model.predict(profile, one, local_batch=point.local_batch_size)
        assert predicted.compute_s == pytest.approx(measured, rel=1e-9)
    alone = 62 * 11 * 10e-6  # the host's part: the A100's memory moves 76 B/param in 0.5 ms
    two = Cluster((ClusterGroup(offer, 1, 2),))
    without = dataclasses.replace(profile, extra={})
    assert model.predict(profile, two, local_batch=257).step_s == pytest.approx(
        model.predict(without, two, local_batch=257).step_s
    )
    assert model.predict(profile, one, local_batch=257).step_s == pytest.approx(
        model.predict(without, one, local_batch=257).step_s + alone
    )
    unknown = dataclasses.replace(info, params=info.params + 1, parameter_tensors=None)
    kept = coarse_profile(unknown, single, traces.hardware)
    assert kept.single_process_work == (0, 0.0)
    assert kept.batch_points[0].compute_s == pytest.approx(
        profile.batch_points[0].compute_s + alone
    )


def test_a_trace_profile_ran_tf32_as_its_pytorch_did(shared_data: Path) -> None:
    """The traces' PyTorch (< 1.12) let matmuls and cuDNN use TF32 on Ampere: the
    dgx-ext A100 runs BERT at about 4.6 ms a sample, out of reach at the FP32 rate."""
    traces = load_traces(shared_data / "sia-traces" / "dgx-ext", models=["bert"])
    profile = coarse_profile(traces.models["bert"], traces.single_gpu_rows("bert"), traces.hardware)
    env = profile.environment
    assert traces.hardware.gpu.startswith("A100")
    assert (env.float32_matmul_precision, env.cudnn_allow_tf32) == ("high", True)
    assert env.matmul_tf32 and env.cudnn_tf32


def test_roughness_is_zero_on_a_line_and_grows_with_scatter() -> None:
    def points(times: list[float]) -> list[BatchPoint]:
        return [BatchPoint(b, t, t) for b, t in zip((4, 8, 16, 32, 64), times, strict=False)]

    line = [0.02 + 0.01 * b for b in (4, 8, 16, 32, 64)]
    assert step_roughness(points(line)) == pytest.approx(0.0, abs=1e-12)
    assert step_roughness(points(line[:2])) == 0.0
    jitter = [t * f for t, f in zip(line, (1.0, 1.1, 0.9, 1.1, 1.0), strict=True)]
    louder = [t * f for t, f in zip(line, (1.0, 1.3, 0.7, 1.3, 1.0), strict=True)]
    assert 0.0 < step_roughness(points(jitter)) < step_roughness(points(louder))


def test_coarse_profile_carries_the_rows_roughness_as_step_spread(shared_data: Path) -> None:
    traces = load_traces(shared_data / "pollux-traces", models=["yolov3", "imagenet"])
    for model in traces.rows:
        profile = coarse_profile(
            traces.models[model], traces.single_gpu_rows(model), traces.hardware
        )
        spread = profile.steps.step
        relative = (spread.p90_s / spread.p50_s - 1) / 1.2816
        assert relative == pytest.approx(step_roughness(profile.batch_points))
    # multi-scale training (random input size per step) leaves rough rows; ResNet-50
    # at a fixed 224 px does not
    rough = {
        m: step_roughness(
            coarse_profile(
                traces.models[m], traces.single_gpu_rows(m), traces.hardware
            ).batch_points
        )
        for m in traces.rows
    }
    assert rough["yolov3"] > 0.1 > 0.05 > rough["imagenet"]


def test_step_time_is_compute_plus_sync_in_the_data(shared_data: Path) -> None:
    """The reading documented in io/traces.py: multi-GPU step ~ one-GPU compute + sync."""
    traces = load_traces(shared_data / "pollux-traces")
    errors = []
    for model, rows in traces.rows.items():
        single = {r.local_bsz: r.step_time - r.sync_time for r in traces.single_gpu_rows(model)}
        for r in rows:
            if r.replicas > 1 and r.local_bsz in single:
                errors.append(abs(single[r.local_bsz] + r.sync_time - r.step_time) / r.step_time)
    assert len(errors) > 5000
    assert float(np.median(errors)) < 0.10


def test_placement_cluster_groups_nodes_by_gpu_count(shared_data: Path) -> None:
    traces = load_traces(shared_data / "pollux-traces", models=["ncf"])
    cluster = placement_cluster((4, 4, 1), traces.hardware)
    assert [(g.nodes, g.gpus_per_node) for g in cluster.groups] == [(1, 1), (2, 4)]
    assert cluster.world_size == 9


# ---------------------------------------------------------------- bad input


def _csv(path: Path, header: str, *rows: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_missing_column_names_the_column_and_the_file(tmp_path: Path) -> None:
    path = _csv(
        tmp_path / "m" / "placements.csv", "placement,local_bsz,step_s,sync_time", "1,4,0.1,0.001"
    )
    with pytest.raises(TraceError, match=r"placements\.csv.*missing column 'step_time'"):
        read_measurements(path, "m")


@pytest.mark.parametrize("bad", ["nan", "-0.1", "0", "abc"])
def test_bad_times_are_rejected_with_their_row_number(tmp_path: Path, bad: str) -> None:
    path = _csv(
        tmp_path / "m" / "placements.csv",
        "placement,local_bsz,step_time,sync_time",
        "1,4,0.1,0.001",
        f"11,4,{bad},0.001",
    )
    with pytest.raises(TraceError, match="row 2"):
        read_measurements(path, "m")


def test_bad_placement_is_rejected(tmp_path: Path) -> None:
    path = _csv(
        tmp_path / "m" / "placements.csv",
        "placement,local_bsz,step_time,sync_time",
        "1x,4,0.1,0.001",
    )
    with pytest.raises(TraceError, match="row 1: placement"):
        read_measurements(path, "m")


def test_model_missing_from_models_json_is_named(tmp_path: Path) -> None:
    root = write_synthetic_traces(tmp_path / "t")
    (root / "models.json").write_text(json.dumps({"alpha": {"params": 10}}))
    with pytest.raises(TraceError, match="model 'beta' has no entry"):
        load_traces(root)


def test_missing_hardware_field_is_named(tmp_path: Path) -> None:
    root = write_synthetic_traces(tmp_path / "t")
    (root / "hardware.json").write_text(json.dumps({"g4dn.12xlarge": {"gpu": "T4"}}))
    with pytest.raises(TraceError, match=r"hardware\.json.*g4dn\.12xlarge\.gpu_memory_gib"):
        load_traces(root)


def test_missing_hardware_file_is_named(tmp_path: Path) -> None:
    root = write_synthetic_traces(tmp_path / "t")
    (root / "hardware.json").unlink()
    with pytest.raises(TraceError, match=r"hardware\.json.*file not found"):
        load_traces(root)
