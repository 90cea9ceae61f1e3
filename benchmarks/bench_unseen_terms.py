"""Which fitted term carries a set's unseen-hardware error? One held-out set, attributed.

Run: ``.venv/bin/python benchmarks/bench_unseen_terms.py [--held pollux-traces]
[--data-root DIR] [--tcp-latency-high SECONDS]``

The quick loop for issue 17's unseen-hardware figures: the held-out set's multi-GPU rows
are predicted from its single-GPU rows and a physics fit on the *other* shared sets
(:func:`~lightning_srifty.fit.calibration.fit_physics`, what ``srifty validate
--protocol unseen-hardware`` refits, without the learned correction and the interval
widening, which do not move the median), in about 20 s. Prints, measured in this run:

1. per job, the median absolute and signed error (negative: too fast), and the signed
   error by node count (one node, two, three or more), then the pooled median / p90;
2. the attribution: each hardware constant, then each job's own overlap terms and its
   co-location term, replaced one at a time by the value of the shipped default
   calibration (whose fit *includes* the held-out set), with the job's and the pooled
   median after the swap. A swap that removes most of a job's error names the term
   that carries it; a term fitted on other hardware that differs from the held-out
   set's own value is a leak;
3. with ``--tcp-latency-high``, the same refit with the per-hop TCP latency's upper
   bound moved (it sits at its bound of 300 us in both the unseen and the full fit):
   where the other sets' rows would put it, and the pooled figure then.

Figures are for reading, not asserted: accuracy is guarded in
``tests/fit/test_real_accuracy.py``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from lightning_srifty.core.calibration import Calibration, JobTerms
from lightning_srifty.core.catalog import GpuSpec
from lightning_srifty.fit.calibration import PRIORS, Prior, fit_physics, trace_groups
from lightning_srifty.fit.validation import predict_rows
from lightning_srifty.io.calibration_io import load_default_calibration
from lightning_srifty.io.catalog_io import load_gpu_specs
from lightning_srifty.io.traces import TraceSet, load_traces

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data"
SETS = ("pollux-traces", "sia-traces/dgx-ext", "sia-traces/quad")
SWAP_MIN_LOG = 0.05
"""Constants closer than this (natural log) to the reference are not swapped."""


def errors(
    target: TraceSet, calibration: Calibration, specs: dict[str, GpuSpec]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per job: ``predicted/measured - 1`` of its multi-GPU rows, and their node counts."""
    out = {}
    for job, rows in target.rows.items():
        multi = [r for r in rows if r.replicas > 1]
        if multi:
            result = predict_rows(target, job, multi, calibration, specs)
            out[job] = (result.signed, np.asarray([r.nodes for r in multi]))
    return out


def pooled(errs: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
    every = np.abs(np.concatenate([s for s, _ in errs.values()]))
    return float(np.median(every)), float(np.quantile(every, 0.9))


def fit_without(
    sets: dict[str, TraceSet],
    held: str,
    specs: dict[str, GpuSpec],
    priors: dict[str, Prior] | None = None,
) -> Calibration:
    """Physics fitted on every set but ``held`` (hardware constants and job terms)."""
    groups = [g for name, t in sets.items() if name != held for g in trace_groups(t)]
    physics, jobs = fit_physics(groups, specs, priors=priors)
    return Calibration(physics=physics, jobs=jobs)


def print_errors(errs: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    print(f"{'job':<12}{'median':>8}{'signed':>8}{'1 node':>8}{'2 nodes':>8}{'3+':>8}")
    for job, (signed, nodes) in errs.items():
        cells = []
        for mask in (nodes == 1, nodes == 2, nodes >= 3):
            cells.append(f"{100 * np.median(signed[mask]):+8.1f}" if mask.any() else f"{'-':>8}")
        print(
            f"{job:<12}{100 * np.median(np.abs(signed)):8.1f}{100 * np.median(signed):+8.1f}"
            + "".join(cells)
        )
    median, p90 = pooled(errs)
    print(f"pooled median / p90: {100 * median:.1f} / {100 * p90:.1f} %")


def job_swaps(
    unseen: Calibration, reference: Calibration, instance_type: str, jobs: Sequence[str]
) -> list[tuple[str, Calibration]]:
    """Each job's overlap terms, then its co-location term on the held-out hardware,
    taken from ``reference`` (one swap each)."""
    out = []
    for job in jobs:
        ref = reference.job(job, instance_type)
        mine = [j for j in unseen.jobs if j.name == job]
        if ref is None or not mine:
            continue
        overlap = tuple(
            replace(j, tail_fraction=ref.tail_fraction, overlap_window=ref.overlap_window)
            if j.name == job
            else j
            for j in unseen.jobs
        )
        out.append(
            (
                f"{job} overlap {mine[0].tail_fraction:.3f}/{mine[0].overlap_window:.3f} -> "
                f"{ref.tail_fraction:.3f}/{ref.overlap_window:.3f}",
                replace(unseen, jobs=overlap),
            )
        )
        here = unseen.job(job, instance_type)
        assert here is not None
        own = JobTerms(
            name=job,
            tail_fraction=mine[0].tail_fraction,
            overlap_window=mine[0].overlap_window,
            colocation_slowdown=ref.colocation_slowdown,
            instance_type=instance_type,
        )
        out.append(
            (
                f"{job} co-location {here.colocation_slowdown:.2g} -> "
                f"{ref.colocation_slowdown:.2g}",
                replace(unseen, jobs=(*unseen.jobs, own)),
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--held", default=SETS[0], choices=SETS)
    parser.add_argument("--tcp-latency-high", type=float, default=None)
    args = parser.parse_args()
    specs = dict(load_gpu_specs())
    sets = {name: load_traces(args.data_root / name) for name in SETS}
    target = sets[args.held]
    began = time.perf_counter()
    unseen = fit_without(sets, args.held, specs)
    print(
        f"== unseen hardware: {args.held} ({target.hardware.describe()}), physics fitted on "
        f"the other sets [{time.perf_counter() - began:.0f} s] =="
    )
    base = errors(target, unseen, specs)
    print_errors(base)

    reference = load_default_calibration()
    names = [s.name for s in reference.sources]
    print(f"\n== one term at a time from the shipped default (fitted on {', '.join(names)}) ==")
    swaps: list[tuple[str, Calibration]] = []
    mine, theirs = unseen.physics.to_dict(), reference.physics.to_dict()
    for name, value in mine.items():
        other = theirs[name]
        if abs(np.log(max(value, 1e-12) / max(other, 1e-12))) > SWAP_MIN_LOG:
            physics = replace(unseen.physics, **{name: other})  # type: ignore[arg-type]
            swaps.append((f"{name} {value:.3g} -> {other:.3g}", replace(unseen, physics=physics)))
    instance_type = target.hardware.instance_type
    swaps.extend(job_swaps(unseen, reference, instance_type, list(target.rows)))
    jobs = list(base)
    print(f"{'swap':<52}{'pooled':>8}" + "".join(f"{j[:9]:>10}" for j in jobs))
    print(
        f"{'(none)':<52}{100 * pooled(base)[0]:8.1f}"
        + "".join(f"{100 * np.median(np.abs(base[j][0])):10.1f}" for j in jobs)
    )
    for label, calibration in swaps:
        errs = errors(target, calibration, specs)
        print(
            f"{label[:52]:<52}{100 * pooled(errs)[0]:8.1f}"
            + "".join(f"{100 * np.median(np.abs(errs[j][0])):10.1f}" for j in jobs)
        )

    if args.tcp_latency_high is not None:
        old = PRIORS["tcp_latency_s"]
        priors = {**PRIORS, "tcp_latency_s": replace(old, high=args.tcp_latency_high)}
        loose = fit_without(sets, args.held, specs, priors)
        print(
            f"\n== tcp_latency_s bound {old.high * 1e6:.0f} -> {args.tcp_latency_high * 1e6:.0f} "
            f"us: fitted {unseen.physics.tcp_latency_s * 1e6:.0f} -> "
            f"{loose.physics.tcp_latency_s * 1e6:.0f} us (shipped default "
            f"{reference.physics.tcp_latency_s * 1e6:.0f} us) =="
        )
        print_errors(errors(target, loose, specs))


if __name__ == "__main__":
    main()
