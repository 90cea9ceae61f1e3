"""Choosing the GPU type from a T4 profile: how often is the pick the cheapest that
meets the deadline? (Issue 17's decision target, replayed on measured traces.)

The same six jobs are measured on one GPU of three kinds here (``pollux-traces``: T4,
``sia-traces/dgx-ext``: A100, ``sia-traces/quad``: Quadro RTX 6000). A user profiles
on a T4 and may rent one GPU of any kind. For every job and every per-process batch
measured on all three (the script's batch is kept, as the launcher keeps it), the
performance model predicts each kind's step, with its 10-90 % interval, from the T4's
one-GPU rows alone (the coarse profile ``srifty validate`` uses), and chooses as
``srifty plan`` does (``core/planner.py``): the step is log-normal (median and
interval), a kind meets the deadline when its expected step does and
``P(step <= deadline) >= 0.9`` (the default ``--confidence``; on-demand, so the closed
form of ``uncertain_deadline_probability``), and the pick is the kind with the lowest
expected cost per step (at the mean step, ``step·exp(sigma²/2)``) among those; the
fastest expected when none is. The pick is then judged on the measured steps:

* **within 5 %**: the pick meets the deadline as measured and costs at most 5 % more
  than the cheapest kind that measurably meets it;
* **wrong type**: the pick is not that cheapest kind;
* **regret**: the pick's measured cost over the best one's, minus 1.

Deadlines: none (cheapest per step), and the median of the three measured steps (at
least one kind is too slow). Prices, per GPU-hour:

* ``aws``: AWS on-demand in us-east-1 from the bundled catalog, per GPU (g4dn.xlarge
  for T4; p4d.24xlarge / 8 for A100). The Quadro RTX 6000 has no AWS offer: it is
  priced at the T4's per-GPU price times its FP32 peak over the T4's (a Turing part
  priced by its size; it lands near the g5.xlarge A10G's $1.006);
* ``throughput``: each kind's price proportional to its measured throughput (geometric
  mean over the six jobs' one-GPU rows), so no kind wins by price alone: only the
  per-job prediction decides (the hardest case).

Predictors: ``model`` (from the T4 profile, the planner's rule above: the product's
decision), ``model 0.5`` (the same at ``--confidence 0.5``: expected cost, the deadline
met by the expected step), ``model median`` (the rule before the planner counted the
interval: cost and deadline at the median step, i.e. ``P >= 0.5`` ranked at the
median), ``probed`` (the same model with each kind's own one-GPU measurement at one
batch, the middle one all measured, as a probe gives it; other batches still
predicted; the planner's rule), ``model+probe`` (the model, comparing the alternatives
with their 10-90 % intervals as ``core.probing`` does: where another kind's optimistic
cost beats the pick's pessimistic cost, the pick and those contenders are probed at the
scenario's own batch, the shape the plan would run, the model is refitted on the
probes' measurements (each probed kind's step and the scatter of its rows at that
batch) by ``fit.calibration.refit_on_probe_runs``, the function ``srifty-launch``
replans with, and the choice is made again by the planner's rule on the refitted
predictions and intervals (a probed shape is as sure as its probe); the share of
scenarios that probed is printed),
``probe exact`` (the same probes, a probed kind's step taken as its measurement with no
interval: what a perfect refit would give), and ``oracle`` (the measurements; scores
100 % by construction, printed as the check of the judging code). The T4 is the
profiled hardware: it is never probed.

Before the choices, the share of measured steps on the A100 and the Quadro RTX 6000
inside the model's 10-90 % interval (predicted from the T4) is printed: the intervals
decide when to probe and how much a plan's expected cost and deadline odds move, so
they should hold about 80 % of the rows.

The kept-aside V100 and RTX 2080 Ti sets are judged outside the project; this replay
uses only the three kinds in ``../shared/data``.

Run: ``.venv/bin/python benchmarks/bench_gpu_choice.py [--data-root DIR]``
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from lightning_srifty.core.cluster import Cluster, ClusterGroup
from lightning_srifty.core.lognormal import mean_factor, step_sigma
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.core.planner import uncertain_deadline_probability
from lightning_srifty.fit.calibration import ProbeRun, refit_on_probe_runs
from lightning_srifty.io.calibration_io import load_default_calibration
from lightning_srifty.io.catalog_io import load_catalog, load_gpu_specs
from lightning_srifty.io.traces import TraceSet, coarse_profile, load_traces

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data"
SOURCE = "pollux-traces"
KINDS = ("pollux-traces", "sia-traces/dgx-ext", "sia-traces/quad")
WITHIN = 0.05
CONFIDENCE = 0.9
"""``srifty plan``'s default ``--confidence``."""

Interval = Callable[[str, str, int], tuple[float, float, float]]
"""(kind, job, batch) -> predicted one-GPU step, its 10 % and 90 % ends (seconds)."""
Rule = Callable[[dict[str, tuple[float, float, float]], dict[str, float], float], str]
"""(prediction per kind, prices, deadline) -> the kind chosen."""


def planner_rule(confidence: float = CONFIDENCE, at_mean: bool = True) -> Rule:
    """How ``srifty plan`` chooses among one-GPU on-demand kinds: expected cost (the
    log-normal mean step) among the kinds whose expected step meets the deadline with
    ``P(step <= deadline) >= confidence``; the fastest expected when none does.
    ``at_mean=False`` with ``confidence=0.5`` is the rule before the planner counted
    the interval (median cost, median step within the deadline)."""

    def choose(guess: dict[str, tuple[float, float, float]], prices: dict[str, float],
               deadline: float) -> str:  # fmt: skip
        kinds = list(guess)
        step = np.array([guess[k][0] for k in kinds])
        low, high = (np.array([guess[k][i] for k in kinds]) for i in (1, 2))
        sigma = step_sigma(step, low, high)
        value = step * mean_factor(sigma) if at_mean else step
        if math.isfinite(deadline):
            odds = uncertain_deadline_probability(
                deadline, step, np.zeros(step.size), np.full(step.size, np.inf), 0.0, sigma
            )
        else:
            odds = np.ones(step.size)
        ok = [i for i in range(len(kinds)) if odds[i] >= confidence and value[i] <= deadline]
        if not ok:
            return kinds[int(np.argmin(value))]
        return kinds[min(ok, key=lambda i: value[i] * prices[kinds[i]])]

    return choose


def one_gpu_steps(traces: TraceSet, job: str) -> dict[int, float]:
    """Mean measured one-GPU step per local batch."""
    by: dict[int, list[float]] = {}
    for row in traces.single_gpu_rows(job):
        by.setdefault(row.local_bsz, []).append(row.step_time)
    return {b: float(np.mean(v)) for b, v in by.items()}


def one_gpu_spread(traces: TraceSet, job: str, batch: int) -> tuple[float, float]:
    """The least and greatest measured one-GPU step at ``batch`` (each trace row is
    itself a mean over many steps: the rows' scatter is what a probe's reports show)."""
    steps = [row.step_time for row in traces.single_gpu_rows(job) if row.local_bsz == batch]
    return min(steps), max(steps)


def aws_prices(sets: dict[str, TraceSet]) -> dict[str, float]:
    """Per-GPU on-demand price per hour in us-east-1 (see the module docstring)."""
    offers = [
        o for o in load_catalog("bundled").offers if o.region == "us-east-1" and o.ondemand_price
    ]
    per_gpu: dict[str, float] = {}
    for o in offers:
        price = float(o.ondemand_price) / o.accelerator_count  # type: ignore[arg-type]
        per_gpu[o.accelerator] = min(per_gpu.get(o.accelerator, math.inf), price)
    specs = load_gpu_specs()
    out = {}
    for kind, traces in sets.items():
        gpu = traces.hardware.gpu
        if gpu in per_gpu:
            out[kind] = per_gpu[gpu]
        else:
            out[kind] = per_gpu["T4"] * specs[gpu].fp32_tflops / specs["T4"].fp32_tflops
    return out


def throughput_prices(sets: dict[str, TraceSet], jobs: list[str]) -> dict[str, float]:
    """Prices proportional to measured throughput (geometric mean over the jobs)."""
    out = {}
    for kind, traces in sets.items():
        logs = [math.log(b / s) for job in jobs for b, s in one_gpu_steps(traces, job).items()]
        out[kind] = math.exp(float(np.mean(logs)))
    return out


def replay(
    sets: dict[str, TraceSet],
    jobs: list[str],
    prices: dict[str, float],
    predict: Interval,
    rule: Rule,
) -> dict[str, list[float]]:
    """Per deadline rule: each scenario's regret (``inf`` when the pick misses the
    deadline as measured), the kind chosen by ``rule`` on ``predict``'s intervals."""
    kinds = list(sets)
    out: dict[str, list[float]] = {d: [] for d in DEADLINES}
    for job, batch, true in scenarios(sets, jobs):
        guess = {k: predict(k, job, batch) for k in kinds}
        for deadline_rule in out:
            deadline = _deadline(deadline_rule, true)
            pick = rule(guess, prices, deadline)
            out[deadline_rule].append(regret_of(pick, true, prices, deadline))
    return out


def scenarios(
    sets: dict[str, TraceSet], jobs: list[str]
) -> Iterator[tuple[str, int, dict[str, float]]]:
    """(job, per-process batch, measured one-GPU step per kind) for every batch each
    kind measured the job at."""
    for job in jobs:
        measured = {k: one_gpu_steps(traces, job) for k, traces in sets.items()}
        for batch in sorted(set.intersection(*(set(m) for m in measured.values()))):
            yield job, batch, {k: steps[batch] for k, steps in measured.items()}


DEADLINES = ("none", "median", "median+5%")
"""No deadline; the median measured step across the kinds (one kind sits exactly on it);
5 % above that (the kind on the median meets it with a margin a probe can show)."""


def _deadline(rule: str, true: dict[str, float]) -> float:
    """The deadline ``rule`` (:data:`DEADLINES`) sets for one scenario."""
    if rule == "none":
        return math.inf
    median = float(np.median(list(true.values())))
    return median * 1.05 if rule == "median+5%" else median


def regret_of(
    pick: str, true: dict[str, float], prices: dict[str, float], deadline: float
) -> float:
    """How much dearer ``pick`` is than the cheapest kind meeting ``deadline`` as measured
    (``inf`` when the pick misses it)."""
    feasible = [k for k in true if true[k] <= deadline]
    best = min(feasible, key=lambda k: true[k] * prices[k])
    if true[pick] > deadline:
        return math.inf
    return true[pick] * prices[pick] / (true[best] * prices[best]) - 1.0


Refit = Callable[[str, int, dict[str, float]], Interval]
"""(job, batch, measured one-GPU step per probed kind) -> the predictor after the probes."""


def replay_probing(
    sets: dict[str, TraceSet],
    jobs: list[str],
    prices: dict[str, float],
    predict: Interval,
    source: str,
    rule: Rule,
    refit: Refit | None = None,
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """:func:`replay` for the model that probes where intervals overlap.

    The pick is made by ``rule`` on the predicted intervals; every other kind whose
    optimistic cost (its interval's low end) beats the pick's pessimistic cost (high
    end), and whose optimistic step meets the deadline, is a contender. When there is
    one, the pick and the contenders (``source`` aside: it is the profiled hardware)
    are measured at the scenario's batch and the choice is made again: on the
    predictions of ``refit`` given the probes' measurements (what ``srifty-launch``
    replans with), or, without ``refit``, with each probed kind's step taken as its
    measurement exactly (no interval). Returns the regrets per deadline rule and the
    number of kinds probed per scenario.
    """
    kinds = list(sets)
    out: dict[str, list[float]] = {d: [] for d in DEADLINES}
    probes: dict[str, list[int]] = {d: [] for d in DEADLINES}
    for job, batch, true in scenarios(sets, jobs):
        guess = {k: predict(k, job, batch) for k in kinds}
        for deadline_rule in out:
            deadline = _deadline(deadline_rule, true)
            pick = rule(guess, prices, deadline)
            worst = guess[pick][2] * prices[pick]
            contenders = [
                k
                for k in kinds
                if k != pick and guess[k][1] * prices[k] < worst and guess[k][1] <= deadline
            ]
            probed = {k for k in (pick, *contenders) if k != source} if contenders else set()
            if probed:
                if refit is None:
                    seen = {k: (true[k],) * 3 if k in probed else guess[k] for k in kinds}
                else:
                    after = refit(job, batch, {k: true[k] for k in sorted(probed)})
                    seen = {k: after(k, job, batch) for k in kinds}
                pick = rule(seen, prices, deadline)
            probes[deadline_rule].append(len(probed))
            out[deadline_rule].append(regret_of(pick, true, prices, deadline))
    return out, probes


def coverage(
    sets: dict[str, TraceSet], jobs: list[str], predict: Interval, source: str
) -> dict[str, float]:
    """Per target kind, the share of its measured one-GPU steps (at batches the source
    measured too) inside the predicted 10-90 % interval."""
    out = {}
    for kind in sets:
        if kind == source:
            continue
        inside = []
        for job in jobs:
            there = one_gpu_steps(sets[kind], job)
            for batch in sorted(set(there) & set(one_gpu_steps(sets[source], job))):
                _, low, high = predict(kind, job, batch)
                inside.append(low <= there[batch] <= high)
        out[kind] = float(np.mean(inside)) if inside else math.nan
    return out


def _row(name: str, rule: str, label: str, r: np.ndarray, extra: str = "") -> str:
    finite = r[np.isfinite(r)]
    return (
        f"{name:<11}{rule:<11}{label:<12}{r.size:>6}"
        f"{100 * np.mean(r <= WITHIN):>11.0f}%"
        f"{100 * np.mean(r > 1e-12):>11.0f}%"
        f"{int(np.sum(~np.isfinite(r))):>8}"
        f"{100 * (np.mean(finite) if finite.size else 0.0):>12.1f}%{extra}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data-root", type=Path, default=DEFAULT_ROOT)
    args = parser.parse_args()
    missing = [k for k in KINDS if not (args.data_root / k).is_dir()]
    if missing:
        print(f"skipped: {', '.join(missing)} not under {args.data_root}")
        return 0
    sets = {k: load_traces(args.data_root / k) for k in KINDS}
    jobs = sorted(set.intersection(*(set(t.rows) for t in sets.values())))
    model = PerformanceModel(load_gpu_specs(), load_default_calibration())
    clusters = {k: Cluster((ClusterGroup(t.hardware.offer(), 1, 1),)) for k, t in sets.items()}
    source = sets[SOURCE]
    t4_profiles = {
        j: coarse_profile(source.models[j], source.single_gpu_rows(j), source.hardware)
        for j in jobs
    }

    def with_interval(kind: str, job: str, batch: int) -> tuple[float, float, float]:
        p = model.predict(t4_profiles[job], clusters[kind], local_batch=batch)
        return p.step_s, p.low_s, p.high_s

    probed_profiles = {}
    for kind, traces in sets.items():
        for job in jobs:
            common = sorted(set.intersection(*(set(one_gpu_steps(t, job)) for t in sets.values())))
            middle = common[len(common) // 2]
            rows = [r for r in traces.single_gpu_rows(job) if r.local_bsz == middle]
            probed_profiles[kind, job] = coarse_profile(traces.models[job], rows, traces.hardware)

    def probed(kind: str, job: str, batch: int) -> tuple[float, float, float]:
        p = model.predict(probed_profiles[kind, job], clusters[kind], local_batch=batch)
        return p.step_s, p.low_s, p.high_s

    def oracle(kind: str, job: str, batch: int) -> tuple[float, float, float]:
        measured = one_gpu_steps(sets[kind], job)[batch]
        return measured, measured, measured

    def refitted(job: str, batch: int, measured: dict[str, float]) -> Interval:
        """The model after probes, refitted as ``srifty-launch`` does
        (``refit_on_probe_runs``), the probes having run at the plan's batch."""
        profile = t4_profiles[job]
        profile = dataclasses.replace(
            profile,
            model_name=job,
            environment=dataclasses.replace(profile.environment, local_batch_size=batch),
        )
        runs = [
            ProbeRun(
                clusters[k],
                sets[k].hardware.instance_type,
                step,
                spread_s=one_gpu_spread(sets[k], job, batch),
            )
            for k, step in measured.items()
        ]
        after = PerformanceModel(
            model.gpu_specs, refit_on_probe_runs(model.calibration, profile, runs, model.gpu_specs)
        )

        def predict(kind: str, job_: str, batch_: int) -> tuple[float, float, float]:
            p = after.predict(profile, clusters[kind], local_batch=batch_)
            return p.step_s, p.low_s, p.high_s

        return predict

    held = coverage(sets, jobs, with_interval, SOURCE)
    cells = ", ".join(f"{sets[k].hardware.gpu} {100 * v:.0f} %" for k, v in held.items())
    print(f"measured one-GPU steps inside the 10-90 % interval predicted from the T4: {cells}")
    schemes = {"aws": aws_prices(sets), "throughput": throughput_prices(sets, jobs)}
    for name, prices in schemes.items():
        cells = ", ".join(f"{sets[k].hardware.gpu} {p:.3f}" for k, p in prices.items())
        print(f"prices '{name}' per GPU-hour (relative for throughput): {cells}")
    print(f"\n{'prices':<11}{'deadline':<11}{'predictor':<12}{'picks':>6}"
          f"{'within 5 %':>12}{'wrong type':>12}{'missed':>8}{'mean regret':>13}")  # fmt: skip
    planner = planner_rule()
    predictors: list[tuple[str, Interval, Rule]] = [
        ("model", with_interval, planner),
        ("model 0.5", with_interval, planner_rule(0.5)),
        ("model median", with_interval, planner_rule(0.5, at_mean=False)),
        ("probed", probed, planner),
        ("oracle", oracle, planner),
    ]
    for name, prices in schemes.items():
        for label, predict, rule in predictors:
            for deadline_rule, regrets in replay(sets, jobs, prices, predict, rule).items():
                print(_row(name, deadline_rule, label, np.asarray(regrets)))
        for label, refit in (("model+probe", refitted), ("probe exact", None)):
            results, probes = replay_probing(
                sets, jobs, prices, with_interval, SOURCE, planner, refit
            )
            for deadline_rule, regrets in results.items():
                n = np.asarray(probes[deadline_rule])
                extra = (
                    f"   probed {100 * np.mean(n > 0):.0f} % of picks, {np.mean(n):.2f} kinds each"
                )
                print(_row(name, deadline_rule, label, np.asarray(regrets), extra))
    print("\ntarget (issue 17, judged on five kinds): >= 80 % within 5 %, wrong type <= 15 %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
