"""Accuracy on real measurements: ``srifty validate`` on the shared trace sets.

Each threshold sits a little above the figure measured when it was set (quoted beside
it, from ``benchmarks/bench_model_accuracy.py``), so an accuracy regression fails
here instead of going unnoticed. They are *not* the targets of the issue: where a
target is missed the README says so and why.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from lightning_srifty.cli.main import main
from lightning_srifty.core.cluster import Cluster, ClusterGroup
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.fit.validation import (
    per_sample_transfer,
    single_gpu_transfer,
    two_node_network_rates,
)
from lightning_srifty.io.calibration_io import load_default_calibration
from lightning_srifty.io.catalog_io import load_catalog, load_gpu_specs
from lightning_srifty.io.traces import coarse_profile, load_traces

pytestmark = pytest.mark.slow


def _validate(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    assert main(["validate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["overall"]  # type: ignore[no-any-return]


# measured: pollux 8.5 / 25.5, dgx-ext 5.9 / 29.4, quad 8.6 / 20.8 (median / p90 %) with
# co-location per doubling of a node's GPUs (per GPU: 8.5 / 25.3, 6.1 / 27.1, 8.5 / 21.0),
# with AdaptDL's one-replica statistics out of multi-GPU predictions (before: 9.6 / 26.0,
# 10.9 / 28.1, 7.4 / 18.3; before a job's co-location on a host it was not measured on
# became the hardware's: 9.5 / 25.9, 11.0 / 26.8, 8.1 / 18.3; before the calibration
# reproduced: 7.2 / 22.6, 10.7 / 28.4, 9.1 / 19.8, the pollux figure from a fit of
# dgx-ext and quad that stopped at a 57 % higher cost). quad's guard is issue 17's hold.
UNSEEN = {
    "pollux-traces": (0.09, 0.27),
    "sia-traces/dgx-ext": (0.07, 0.30),
    "sia-traces/quad": (0.091, 0.22),
}


@pytest.mark.parametrize("name", sorted(UNSEEN))
def test_unseen_hardware_on_every_shared_set(
    shared_data: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    overall = _validate(
        capsys,
        "--traces", str(shared_data / name),
        "--protocol", "unseen-hardware",
        "--data-root", str(shared_data),
    )  # fmt: skip
    median, p90 = UNSEEN[name]
    assert overall["median_ape"] <= median
    assert overall["p90_ape"] <= p90
    # the 10-90 % interval must hold on hardware the fit never saw (measured 94, 77, 99 %)
    assert overall["interval_coverage"] >= 0.7


def test_leave_one_model_out_on_pollux(
    shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # measured 8.4 / 22.6 (8.5 / 22.6 with co-location per GPU; 8.8 / 23.4 before AdaptDL's
    # one-replica statistics were taken out; 8.3 / 22.5 before the calibration reproduced;
    # before physical links 9.0 / 23.0)
    overall = _validate(
        capsys, "--traces", str(shared_data / "pollux-traces"), "--protocol", "lomo"
    )
    assert overall["median_ape"] <= 0.095 and overall["p90_ape"] <= 0.25
    assert overall["interval_coverage"] >= 0.7


def test_scale_out_on_pollux(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # measured 7.6 / 21.7 (7.7 / 21.9 per GPU; 7.4 / 21.0 before AdaptDL's one-replica
    # statistics were out)
    overall = _validate(
        capsys, "--traces", str(shared_data / "pollux-traces"), "--protocol", "scale-out"
    )
    assert overall["median_ape"] <= 0.085 and overall["p90_ape"] <= 0.23


def test_single_gpu_steps_move_across_gpus(shared_data: Path) -> None:
    """T4 rows predict the A100 and the Quadro RTX 6000 at the same local batch."""
    model = PerformanceModel(load_gpu_specs(), load_default_calibration())
    source = load_traces(shared_data / "pollux-traces")
    # measured: 27.9 % to the A100, 30.9 % to the RTX 6000 (median over rows); before the
    # T4's power limit, 27.0 % and 28.4 %: its fixed per-step time, kept as the host's,
    # is what misses (the per-sample test below checks the compute ratio alone)
    for name, limit in (("sia-traces/dgx-ext", 0.31), ("sia-traces/quad", 0.32)):
        per_job = single_gpu_transfer(model, source, load_traces(shared_data / name))
        assert set(per_job) == set(source.rows)
        assert float(np.median(np.concatenate(list(per_job.values())))) <= limit, name


def test_the_t4s_per_sample_cost_moves_to_the_quadro_by_its_power_limit(
    shared_data: Path,
) -> None:
    """The T4 and the Quadro RTX 6000 are one generation (the utilisation cancels): the
    per-sample cost of each of the six jobs, moved between them both ways, against the
    measured slopes. Measured: median 13.0 %, worst 43 % (ncf, whose per-sample cost is
    a few microseconds); at the datasheets' boost clocks 27.8 % and 62 %, every job the
    T4 predicted too fast: its 70 W holds about 0.77 of its boost clock."""
    specs = load_gpu_specs()
    boost = {n: dataclasses.replace(spec, sustained_clock=1.0) for n, spec in specs.items()}
    sets = [load_traces(shared_data / name) for name in ("pollux-traces", "sia-traces/quad")]
    medians = {}
    for label, table in (("held", specs), ("boost", boost)):
        model = PerformanceModel(table, load_default_calibration())
        errors = []
        for src, dst in itertools.permutations(sets, 2):
            per_job = per_sample_transfer(model, src, dst)
            assert set(per_job) == set(src.rows)
            errors += [abs(math.log1p(e)) for e in per_job.values()]
        medians[label] = math.expm1(float(np.median(errors)))
    assert medians["held"] <= 0.15
    assert medians["boost"] > 0.2


def test_single_gpu_intervals_across_gpus_hold_the_measured_steps(shared_data: Path) -> None:
    """The 10-90 % interval of a T4 profile carried to the A100 and the Quadro RTX 6000
    holds most of their measured one-GPU steps (at the T4's batch range).

    Neither set is used to set the transfer's spread (Lambda's benchmark and a prior
    are). Measured: 89 % (A100) and 98 % (Quadro RTX 6000); before the transfer was
    counted in the interval, 19 % and 43 %: the planner saw a T4 profile's ranking of
    GPU types as sure, so it never probed them.
    """
    model = PerformanceModel(load_gpu_specs(), load_default_calibration())
    source = load_traces(shared_data / "pollux-traces")
    for name in ("sia-traces/dgx-ext", "sia-traces/quad"):
        target = load_traces(shared_data / name)
        cluster = Cluster((ClusterGroup(target.hardware.offer(), 1, 1),))
        inside = []
        for job in sorted(set(source.rows) & set(target.rows)):
            rows = source.single_gpu_rows(job)
            profile = coarse_profile(source.models[job], rows, source.hardware)
            lo, hi = min(r.local_bsz for r in rows), max(r.local_bsz for r in rows)
            measured: dict[int, list[float]] = {}
            for r in target.single_gpu_rows(job):
                if lo <= r.local_bsz <= hi:
                    measured.setdefault(r.local_bsz, []).append(r.step_time)
            for batch, steps in measured.items():
                p = model.predict(profile, cluster, local_batch=batch)
                inside.append(p.low_s <= float(np.mean(steps)) <= p.high_s)
        assert len(inside) > 40, name
        assert float(np.mean(inside)) >= 0.7, name


def test_no_instance_type_predicts_a_network_below_its_floor() -> None:
    """Two nodes all-reducing 256 MB run at >= 30 % of min(NIC, 5 Gbps, one flow's cap).

    The T4 cluster's slow TCP (pods, a tunnel, one socket per connection) must not be
    copied onto every NIC: the floor is what a single TCP flow reaches anywhere.
    """
    model = PerformanceModel(load_gpu_specs(), load_default_calibration())
    rates = two_node_network_rates(model, load_catalog("bundled").gpu_offers())
    assert len(rates) > 30
    for r in rates:
        # the gradient over the time, however it moves: the stricter of the two rates
        assert r.algorithm_gbps >= r.floor_gbps, r


def test_efa_types_all_reduce_at_a_share_of_their_efa_bandwidth() -> None:
    """Two full nodes of every EFA type all-reduce 256 MiB at >= 30 % of their EFA rate
    in bus bandwidth (nccl-tests' figure for comparing with a link's peak), >= 10 % in
    size over time.

    The EFA rate is interfaces x one card's share of the published bandwidth, read from
    the bundled table; a p5 priced over TCP (one 100 Gbps card, 32 flows) reaches about
    2 % of its 3,200 Gbps and fails.
    """
    import csv
    from importlib import resources

    path = resources.files("lightning_srifty") / "data" / "network_specs.csv"
    table = {r["instance_type"]: r for r in csv.DictReader(path.read_text().splitlines())}
    model = PerformanceModel(load_gpu_specs(), load_default_calibration())
    offers = [
        o
        for o in load_catalog("bundled").gpu_offers()
        if int(table[o.instance_type]["efa_interfaces"]) > 0 and o.accelerator_count > 1
    ]
    rates = two_node_network_rates(model, offers)
    assert {"p4d.24xlarge", "p5.48xlarge"} <= {r.instance_type for r in rates}
    for r in rates:
        row = table[r.instance_type]
        efa = int(row["efa_interfaces"]) * float(row["gbps"]) / int(row["network_cards"])
        assert r.algorithm_gbps >= 0.1 * efa, r
        assert r.bus_gbps >= 0.3 * efa, r
        assert r.per_node_gbps >= 0.5 * efa, r


def test_probes_of_unseen_hardware_sharpen_its_predictions(
    shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pollux predicted with the calibration refitted without its hardware, then with
    the rows a probe measures (<= 2 nodes x <= 2 GPUs) revealed: the probe must help.

    measured (median / p90 %): unseen-hardware 8.5 / 25.5, probed 6.9 / 17.6 (with
    co-location growing per GPU on a node: 8.5 / 25.3 and 8.2 / 19.1; before AdaptDL's
    one-replica statistics came out of the one-GPU rows: 9.6 / 26.0 and 6.8 / 19.7).
    """
    folder = shared_data / "pollux-traces"
    common = ("--traces", str(folder), "--data-root", str(shared_data), "--no-learned")
    assert main(["validate", *common, "--protocol", "probed", "--json"]) == 0
    probed = json.loads(capsys.readouterr().out)
    unseen = _validate(capsys, *common, "--protocol", "unseen-hardware")
    assert probed["protocol"] == "probed" and set(probed) == {
        "protocol", "models", "overall", "hardware"
    }  # fmt: skip
    traces = load_traces(folder)
    hidden = sum(
        1
        for rows in traces.rows.values()
        for r in rows
        if r.replicas > 1 and (r.nodes > 2 or max(r.placement) > 2)
    )
    assert probed["overall"]["rows"] == hidden < unseen["rows"]
    assert probed["overall"]["median_ape"] < unseen["median_ape"]
    assert probed["overall"]["median_ape"] <= 0.075 and probed["overall"]["p90_ape"] <= 0.19


def test_a_probe_on_two_gpus_a_node_extrapolates_to_eight(
    shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The DGX's rows of 3 to 8 GPUs a node predicted from a probe of at most 2.

    Its co-location slowdown is measured on 2 GPUs a node and carried to 8: per extra
    GPU it made yolov3 80 % too slow and the set 7.7 / 42.3 % off (median / p90); per
    doubling, measured 5.5 / 20.8 %.
    """
    folder = shared_data / "sia-traces/dgx-ext"
    common = ("--traces", str(folder), "--data-root", str(shared_data), "--no-learned")
    overall = _validate(capsys, *common, "--protocol", "probed")
    assert overall["median_ape"] <= 0.065 and overall["p90_ape"] <= 0.25
