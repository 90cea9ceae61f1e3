"""Placement choice: packed or spread at the same GPU count, measured and predicted.

Issue 17 item 7. On every shared trace set with more than one node (``pollux-traces``:
16 x 4 T4 over TCP; ``sia-traces/dgx-ext``: 2 x 8 A100 over InfiniBand; ``quad`` has
one node, so no placement to choose), the same job at the same per-process batch and
GPU count was often measured in several placements (4 GPUs as ``4``, ``22``, ``112``,
``1111``). Two replays, judged on the measured steps:

1. **Placement**: for every job, batch and GPU count with at least two measured
   placements, the predictor picks the placement with the lowest predicted step.
   Twice: over the *planner's shapes* (N nodes of G GPUs each: 4 GPUs as ``4``, ``22``
   or ``1111``, what ``srifty plan`` can choose between on one instance type or on its
   1-, 2- and 4-GPU siblings) and over *every measured placement* (``112``, ``13`` too).
   Printed per set: picks within 5 % of the measured best, mean and p90 regret (the
   pick's measured step over the best one's, minus 1), and the spread/packed step
   ratio predicted and measured (median and range), where *packed* is the placement
   on the fewest nodes (ties: the least even) and *spread* the one on the most nodes
   (ties: the most even).
2. **Shape** (GPU count and placement together, over the planner's shapes): for every
   job and batch, every measured N x G shape at that batch (one GPU included) is a
   candidate. The script's batch is kept, so a fixed number of samples takes
   ``step / GPUs`` per sample and costs ``GPUs x time``, i.e. ``step`` per sample. The
   deadline is the median of the candidates' measured times; the pick is the cheapest
   predicted to meet it (the fastest predicted when none is). Printed: picks within
   5 % of the cheapest that meets it as measured (a pick that misses it as measured
   is not), mean / p90 regret over the picks that meet it, misses, and among the
   picks more than 5 % off, those with the right GPU count in the wrong placement
   (wrong split) and those with the wrong GPU count.

Predictors: srifty under three calibrations, and baselines.

* ``unseen hw``: calibrated on the *other* shared sets only (leave one hardware out,
  as ``bench_model_accuracy``), the job's single-GPU rows on this hardware as its
  profile;
* ``probed``: the same, refitted on the rows a probe measures on this hardware (at most
  2 nodes of at most 2 GPUs, :func:`refit_on_probes`);
* ``same hw``: the shipped default calibration (fitted on these very rows; in-sample);
* ``linear``: every shape as fast as one GPU at the same batch (ties go to the fewest
  GPUs, then the fewest nodes);
* ``packed`` / ``spread``: always the packed / spread placement (placement replay);
* ``noise``: the noise floor, a predictor that knows every cell's measured mean but
  sees it through a second measurement, ``mean x exp(sqrt(2) sigma z)`` (the mean of
  50 draws is printed). ``sigma``, one measurement's relative noise, comes from the
  repeats in the traces: Pollux lists the same cluster in several orders (``1122`` and
  ``1212`` are two nodes of one GPU and two of two), measured separately, and the Sia
  ncf scalability rows repeat its placement rows with other times. A job without
  repeats on a set takes its repeats on the other sets (printed);
* ``oracle``: the mean measurement (regret 0 by construction; checks the judging).

Run: ``.venv/bin/python benchmarks/bench_placement_choice.py [--data-root DIR] [--quick]``
(``--quick``: calibrations without the learned correction).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lightning_srifty.core.calibration import Calibration
from lightning_srifty.core.catalog import GpuSpec
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.fit.calibration import calibrate_traces, fit_group, refit_on_probes
from lightning_srifty.fit.validation import probe_revealed
from lightning_srifty.io.calibration_io import load_default_calibration
from lightning_srifty.io.catalog_io import load_gpu_specs
from lightning_srifty.io.traces import Measurement, TraceSet, load_traces

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data"
ALL_SETS = ("pollux-traces", "sia-traces/dgx-ext", "sia-traces/quad")
WITHIN = 0.05

Shape = tuple[int, ...]
"""A placement as a multiset: GPUs per node, largest first."""
Cell = tuple[int, Shape]
"""(local batch, placement)."""


@dataclass(frozen=True)
class Job:
    """One job's measured cells on one hardware."""

    name: str
    steps: dict[Cell, list[float]]
    """Measured steps of each cell, in file order (repeats: the same multiset listed in
    another order, or the same cluster in both files)."""
    first: dict[Cell, Measurement]

    def mean(self, cell: Cell) -> float:
        return float(np.mean(self.steps[cell]))


def shape_of(row: Measurement) -> Shape:
    return tuple(sorted(row.placement, reverse=True))


def jobs_of(traces: TraceSet) -> list[Job]:
    out = []
    for name, rows in traces.rows.items():
        steps: dict[Cell, list[float]] = {}
        first: dict[Cell, Measurement] = {}
        for r in rows:
            cell = (r.local_bsz, shape_of(r))
            steps.setdefault(cell, []).append(r.step_time)
            first.setdefault(cell, r)
        out.append(Job(name, steps, first))
    return out


def packed(shapes: Sequence[Shape]) -> Shape:
    """Fewest nodes; ties: the least even (the largest node first)."""
    return min(shapes, key=lambda s: (len(s), tuple(-g for g in s)))


def spread(shapes: Sequence[Shape]) -> Shape:
    """Most nodes; ties: the most even."""
    return min(shapes, key=lambda s: (-len(s), s))


Predictor = Callable[[Job, list[Cell]], dict[Cell, float]]


def model_predictor(
    traces: TraceSet, calibration: Calibration, specs: dict[str, GpuSpec]
) -> Predictor:
    model = PerformanceModel(specs, calibration)

    def predict(job: Job, cells: list[Cell]) -> dict[Cell, float]:
        group = fit_group(traces, job.name, [job.first[c] for c in cells])
        out = model.predict_batch(group.profile, group.candidates, local_batch=group.local_batch)
        return dict(zip(cells, (float(s) for s in out.step_s), strict=True))

    return predict


def linear(job: Job, cells: list[Cell]) -> dict[Cell, float]:
    # one GPU's step at the batch; a hair of tie-break toward fewer GPUs, then nodes
    return {c: job.mean((c[0], (1,))) * (1.0 + 1e-9 * sum(c[1]) + 1e-12 * len(c[1])) for c in cells}


def oracle(job: Job, cells: list[Cell]) -> dict[Cell, float]:
    return {c: job.mean(c) for c in cells}


def repeat_sigma(job: Job) -> float | None:
    """Relative noise of one measurement (log units), from the cells measured twice:
    ``1.4826 MAD(log(first/second)) / sqrt(2)``; ``None`` without repeats."""
    d = [math.log(v[0] / v[1]) for v in job.steps.values() if len(v) >= 2]
    if len(d) < 5:
        return None
    return float(1.4826 * np.median(np.abs(np.asarray(d) - np.median(d))) / math.sqrt(2.0))


def noise_predictors(job_sigma: dict[str, float], draws: int, seed: int = 0) -> list[Predictor]:
    """Each draw: every cell "predicted" by another measurement of itself, i.e. the mean
    measurement times ``exp(sqrt(2) sigma z)`` (two measurements differ by twice the
    variance of one)."""
    out: list[Predictor] = []
    for k in range(draws):
        rng = np.random.default_rng(seed + k)

        def predict(
            job: Job, cells: list[Cell], rng: np.random.Generator = rng
        ) -> dict[Cell, float]:
            z = rng.standard_normal(len(cells)) * math.sqrt(2.0) * job_sigma[job.name]
            return {c: job.mean(c) * math.exp(float(e)) for c, e in zip(cells, z, strict=True)}

        out.append(predict)
    return out


# ----------------------------------------------------------------- placement replay
@dataclass
class PlacementScore:
    regrets: list[float]
    predicted_ratio: list[float]
    measured_ratio: list[float]

    def add(self, other: PlacementScore) -> None:
        self.regrets += other.regrets
        self.predicted_ratio += other.predicted_ratio
        self.measured_ratio += other.measured_ratio


def homogeneous(shape: Shape) -> bool:
    """A shape the planner can make on one instance type: N nodes of G GPUs each."""
    return len(set(shape)) == 1


def placement_groups(job: Job, planner_only: bool) -> list[list[Cell]]:
    """Cells of one batch and GPU count in >= 2 placements (homogeneous ones if asked)."""
    by: dict[tuple[int, int], list[Cell]] = {}
    for cell in job.steps:
        if sum(cell[1]) < 2 or (planner_only and not homogeneous(cell[1])):
            continue
        by.setdefault((cell[0], sum(cell[1])), []).append(cell)
    return [cells for _, cells in sorted(by.items()) if len(cells) >= 2]


def replay_placement(
    jobs: list[Job], predict: Predictor | str, planner_only: bool
) -> PlacementScore:
    score = PlacementScore([], [], [])
    for job in jobs:
        groups = placement_groups(job, planner_only)
        if not groups:
            continue
        every = [c for g in groups for c in g]
        if predict == "packed":
            guess = {c: float(len(c[1])) - 1e-3 * max(c[1]) for c in every}
        elif predict == "spread":
            guess = {c: -float(len(c[1])) + 1e-3 * max(c[1]) for c in every}
        else:
            assert callable(predict)
            guess = predict(job, every)
        for cells in groups:
            pick = min(cells, key=lambda c: guess[c])
            best = min(job.mean(c) for c in cells)
            score.regrets.append(job.mean(pick) / best - 1.0)
            shapes = [c[1] for c in cells]
            p, s = (cells[shapes.index(packed(shapes))], cells[shapes.index(spread(shapes))])
            score.measured_ratio.append(job.mean(s) / job.mean(p))
            rule = predict in ("packed", "spread")  # a rule, not a prediction of steps
            score.predicted_ratio.append(math.nan if rule else guess[s] / guess[p])
    return score


# --------------------------------------------------------------------- shape replay
@dataclass
class ShapeScore:
    regrets: list[float]
    wrong_split: int = 0
    wrong_count: int = 0

    def add(self, other: ShapeScore) -> None:
        self.regrets += other.regrets
        self.wrong_split += other.wrong_split
        self.wrong_count += other.wrong_count


def replay_shape(jobs: list[Job], predict: Predictor) -> ShapeScore:
    """Planner shapes only (N nodes x G GPUs), one scenario per job and batch."""
    score = ShapeScore([])
    for job in jobs:
        cells_of: dict[int, list[Cell]] = {}
        for cell in job.steps:
            if homogeneous(cell[1]):
                cells_of.setdefault(cell[0], []).append(cell)
        cells_of = {b: cs for b, cs in cells_of.items() if len({sum(c[1]) for c in cs}) >= 2}
        every = [c for cs in cells_of.values() for c in cs]
        if not every:
            continue
        guess = predict(job, every)
        for cells in cells_of.values():
            gpus = {c: sum(c[1]) for c in cells}
            deadline = float(np.median([job.mean(c) / gpus[c] for c in cells]))
            ok = [c for c in cells if guess[c] / gpus[c] <= deadline]
            pick = (
                min(ok, key=lambda c: guess[c])
                if ok
                else min(cells, key=lambda c: guess[c] / gpus[c])
            )
            feasible = [c for c in cells if job.mean(c) / gpus[c] <= deadline]
            best = min(feasible, key=lambda c: job.mean(c))
            if job.mean(pick) / gpus[pick] > deadline:
                score.regrets.append(math.inf)
                continue
            regret = job.mean(pick) / job.mean(best) - 1.0
            score.regrets.append(regret)
            if regret > WITHIN:
                if gpus[pick] == gpus[best]:
                    score.wrong_split += 1
                else:
                    score.wrong_count += 1
    return score


# -------------------------------------------------------------------------- output
def _ratio_cells(values: list[float]) -> str:
    v = np.asarray([x for x in values if math.isfinite(x)])
    if not v.size:
        return f"{'-':>22}"
    return f"{np.median(v):6.2f} [{v.min():.2f}-{v.max():.2f}]".rjust(22)


def _groups(label: str, size: int) -> int:
    return size // NOISE_DRAWS if label == "noise" else size


def print_placement(title: str, scores: dict[str, PlacementScore]) -> None:
    print(f"\n=== {title} ===")
    print(f"{'predictor':<11}{'groups':>7}{'within 5 %':>11}{'mean':>7}{'p90':>7}"
          f"{'predicted spread/packed':>24}{'measured':>22}")  # fmt: skip
    for label, s in scores.items():
        r = np.asarray(s.regrets)
        if not r.size:
            print(f"{label:<11}{0:>7}")
            continue
        print(
            f"{label:<11}{_groups(label, r.size):>7}{100 * np.mean(r <= WITHIN):>10.0f}%"
            f"{100 * np.mean(r):>6.1f}%{100 * np.quantile(r, 0.9):>6.1f}%"
            f"{_ratio_cells(s.predicted_ratio):>24}{_ratio_cells(s.measured_ratio)}"
        )


def print_shape(title: str, scores: dict[str, ShapeScore]) -> None:
    print(f"\n=== {title} ===")
    print(f"{'predictor':<11}{'picks':>7}{'within 5 %':>11}{'mean':>7}{'p90':>7}{'missed':>8}"
          f"{'wrong split':>13}{'wrong count':>13}")  # fmt: skip
    for label, s in scores.items():
        r = np.asarray(s.regrets)
        if not r.size:
            print(f"{label:<11}{0:>7}")
            continue
        finite = r[np.isfinite(r)]
        n = NOISE_DRAWS if label == "noise" else 1
        print(
            f"{label:<11}{_groups(label, r.size):>7}{100 * np.mean(r <= WITHIN):>10.0f}%"
            f"{100 * np.mean(finite):>6.1f}%{100 * np.quantile(finite, 0.9):>6.1f}%"
            f"{np.sum(~np.isfinite(r)) / n:>8.1f}{s.wrong_split / n:>13.1f}"
            f"{s.wrong_count / n:>13.1f}"
        )


NOISE_DRAWS = 50
"""Draws of the simulated noise floor (its figures are the mean over them)."""


def job_sigmas(sets: dict[str, TraceSet]) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Per set and job, one measurement's relative noise: from the job's repeats on that
    set, else its repeats on another set (noise is mostly the job's: its step-to-step
    variation over a short measurement), else the median of the set's jobs."""
    own = {n: {j.name: repeat_sigma(j) for j in jobs_of(t)} for n, t in sets.items()}
    out: dict[str, dict[str, float]] = {}
    notes: dict[str, str] = {}
    for name, jobs in own.items():
        out[name] = {}
        for job, sigma in jobs.items():
            elsewhere = [v[job] for n, v in own.items() if n != name and v.get(job)]
            if sigma is not None:
                out[name][job] = sigma
            elif elsewhere:
                out[name][job] = float(np.median(elsewhere))  # type: ignore[arg-type]
                notes.setdefault(name, "")
                notes[name] += f" {job}*"
            else:
                known = [v for v in jobs.values() if v is not None]
                out[name][job] = float(np.median(known)) if known else 0.0
    return out, notes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data-root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    missing = [k for k in ALL_SETS if not (args.data_root / k).is_dir()]
    if missing:
        print(f"skipped: {', '.join(missing)} not under {args.data_root}")
        return 0
    specs = dict(load_gpu_specs())
    sets = {k: load_traces(args.data_root / k) for k in ALL_SETS}
    sigmas, borrowed = job_sigmas(sets)
    for name in sets:
        cells = ", ".join(f"{j} {100 * v:.1f}" for j, v in sigmas[name].items())
        note = f" (* from the other sets' repeats:{borrowed[name]})" if name in borrowed else ""
        print(f"{name}: one measurement's noise, % (from repeats){note}: {cells}")
    default = load_default_calibration()
    pooled: dict[str, dict[str, Any]] = {}
    for name, traces in sets.items():
        if traces.hardware.nodes < 2:
            print(f"\n{name}: one node, no placement to choose (its rows still calibrate)")
            continue
        start = time.perf_counter()
        others = [(n, t) for n, t in sets.items() if n != name]
        unseen = calibrate_traces(others, gpu_specs=specs, learned=not args.quick)
        revealed = [
            fit_group(traces, m, [r for r in rows if r.replicas > 1 and probe_revealed(r)])
            for m, rows in traces.rows.items()
        ]
        probed = refit_on_probes(unseen, revealed, specs)
        took = time.perf_counter() - start
        models: dict[str, Predictor] = {
            "unseen hw": model_predictor(traces, unseen, specs),
            "probed": model_predictor(traces, probed, specs),
            "same hw": model_predictor(traces, default, specs),
        }
        noisy = noise_predictors(sigmas[name], NOISE_DRAWS)
        jobs = jobs_of(traces)
        hw = f"{name} ({traces.hardware.describe()}) [calibrations {took:.0f} s]"
        for planner_only in (True, False):
            place: dict[str, PlacementScore] = {
                k: replay_placement(jobs, p, planner_only) for k, p in models.items()
            }
            for rule in ("packed", "spread"):
                place[rule] = replay_placement(jobs, rule, planner_only)
            place["noise"] = PlacementScore([], [], [])
            for p in noisy:
                place["noise"].add(replay_placement(jobs, p, planner_only))
            place["oracle"] = replay_placement(jobs, oracle, planner_only)
            what = "planner shapes (N x G)" if planner_only else "every measured placement"
            print_placement(f"placement at the same GPU count, {what}: {hw}", place)
            key = f"placement, {what}"
            for k, v in place.items():
                pooled.setdefault(key, {}).setdefault(k, PlacementScore([], [], [])).add(v)
        shape: dict[str, ShapeScore] = {k: replay_shape(jobs, p) for k, p in models.items()}
        shape["linear"] = replay_shape(jobs, linear)
        shape["noise"] = ShapeScore([])
        for p in noisy:
            shape["noise"].add(replay_shape(jobs, p))
        shape["oracle"] = replay_shape(jobs, oracle)
        print_shape(f"shape (GPU count and placement), deadline at the median: {hw}", shape)
        for k, t in shape.items():
            pooled.setdefault("shape", {}).setdefault(k, ShapeScore([])).add(t)
    for key, scores in pooled.items():
        if key == "shape":
            print_shape("shape, pooled over the sets", scores)
        else:
            print_placement(f"{key}, pooled over the sets", scores)
    print("\ntarget (issue 17): within-hardware plan picks no worse than today")
    return 0


if __name__ == "__main__":
    sys.exit(main())
