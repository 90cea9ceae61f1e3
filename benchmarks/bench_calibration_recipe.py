"""Is the shipped calibration its recipe's output? Refits it and compares, constant by constant.

Run: ``.venv/bin/python benchmarks/bench_calibration_recipe.py [--data-root DIR]``

Prints, measured in this run: the shipped file's physics constants beside a refit on the
trace sets its ``sources`` name (what ``make default-calibration`` runs, physics only),
and beside a refit started far from the priors (every fitted constant moved), with the
ratio of each, the time each fit took and its median error on the fitted rows. The
recipe's ratios within 5 % is the target; the far start shows how far another local
optimum lies (a worse fit, which is why the recipe's start is fixed).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from lightning_srifty.fit.calibration import analytic_predictions, fit_physics, trace_groups
from lightning_srifty.io.calibration_io import load_default_calibration
from lightning_srifty.io.catalog_io import load_gpu_specs
from lightning_srifty.io.traces import load_traces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    args = parser.parse_args()
    shipped = load_default_calibration()
    specs = load_gpu_specs()
    groups = [
        g for s in shipped.sources for g in trace_groups(load_traces(args.data_root / s.name))
    ]
    far = replace(
        shipped.physics,
        tcp_efficiency=0.9, tcp_flow_gbps=3.0, tail_fraction=0.6, overlap_window=0.3,
        tcp_latency_s=2e-5, step_overhead_s=1e-4, colocation_slowdown=0.05, straggler_cv=0.05,
    )  # fmt: skip
    fits = {}
    errors = {}
    for label, start in (("recipe", None), ("far start", far)):
        began = time.perf_counter()
        physics, jobs = fit_physics(groups, specs, start)
        fits[label] = (physics, time.perf_counter() - began)
        predicted = analytic_predictions(groups, physics, specs, jobs)
        ape = np.concatenate(
            [np.abs(p / g.measured_s - 1) for g, p in zip(groups, predicted, strict=True)]
        )
        errors[label] = float(np.median(ape))
    names = ", ".join(s.name for s in shipped.sources)
    print(f"== shipped calibration against refits on {names} ({len(groups)} groups) ==")
    head = ("constant", "shipped", "recipe", "ratio", "far start", "ratio")
    print(f"{head[0]:22s} {head[1]:>11s} {head[2]:>11s} {head[3]:>7s} {head[4]:>11s} {head[5]:>7s}")
    old = shipped.physics.to_dict()
    worst = 0.0
    for name, value in old.items():
        a = fits["recipe"][0].to_dict()[name]
        b = fits["far start"][0].to_dict()[name]
        worst = max(worst, abs(a / value - 1))
        print(f"{name:22s} {value:11.4g} {a:11.4g} {a / value:7.3f} {b:11.4g} {b / value:7.3f}")
    algorithms = [shipped.physics.inter_algorithm] + [f[0].inter_algorithm for f in fits.values()]
    a0, a1, a2 = algorithms
    print(f"{'inter_algorithm':22s} {a0:>11s} {a1:>11s} {'':7s} {a2:>11s}")
    print(
        f"recipe's largest deviation {100 * worst:.2f} % (target 5 %); fit time: recipe "
        f"{fits['recipe'][1]:.0f} s, far start {fits['far start'][1]:.0f} s; median error on "
        f"the fitted rows: recipe {100 * errors['recipe']:.2f} %, far start "
        f"{100 * errors['far start']:.2f} %"
    )


if __name__ == "__main__":
    main()
