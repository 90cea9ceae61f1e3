"""Cost and deadlines of the spot policies replayed on the real Can't Be Late traces.

For every trace set in ``<data>/spot-traces``: the job runs at several submission times
and deadline slacks under each policy, once with all zones of the set (srifty may
migrate between them; single-zone policies stay in the first zone) and once in each zone
alone (the single-zone baselines). Prints, per set and slack, the mean cost as a
fraction of on-demand-only, the share of deadlines met and the mean migrations.

Run: ``.venv/bin/python benchmarks/bench_spot_policies.py [--data DIR] [--catalog-prices]``
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lightning_srifty.core.spot import (
    POLICY_NAMES,
    SimulationResult,
    SpotJob,
    SpotTimeline,
    make_policy,
    simulate,
)
from lightning_srifty.io.spot_traces import catalog_prices, load_traces, zone_region

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SLACKS = (1.1, 1.5, 2.0)
STARTS = 6


@dataclass(frozen=True)
class SetPlan:
    job_hours: float
    """Compute the job needs on this set: long sets carry long jobs."""


def plan_for(timeline: SpotTimeline) -> SetPlan:
    """48 h jobs where the trace is long enough (45 days), else a fifth of the trace."""
    return SetPlan(job_hours=48.0 if timeline.hours >= 30 * 24 else round(timeline.hours / 10))


def run_set(
    name: str, timeline: SpotTimeline, spot: tuple[float, ...], ondemand: float
) -> list[tuple[str, float, str, list[SimulationResult]]]:
    plan = plan_for(timeline)
    rows = []
    for slack in SLACKS:
        deadline = plan.job_hours * slack
        last_start = timeline.hours - 2.0 * plan.job_hours * max(SLACKS)
        starts = np.linspace(0, max(last_start, 0.0), STARTS)
        ticks = sorted({int(h / timeline.gap_hours) for h in starts})
        all_zones = SpotJob(plan.job_hours, deadline, spot, ondemand)
        for policy in POLICY_NAMES:
            results = [
                simulate(make_policy(policy), timeline, all_zones, start_tick=t) for t in ticks
            ]
            rows.append((name, slack, f"{policy} (all zones)", results))
        for policy in POLICY_NAMES[:3]:
            results = []
            for z in range(len(timeline.zones)):
                one = SpotJob(plan.job_hours, deadline, (spot[z],), ondemand)
                sub = timeline.select([z])
                results += [simulate(make_policy(policy), sub, one, start_tick=t) for t in ticks]
            rows.append((name, slack, f"{policy} (each zone alone)", results))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument(
        "--catalog-prices",
        action="store_true",
        help="region spot prices from the bundled catalog instead of spot = 1/3 on-demand",
    )
    args = parser.parse_args(argv)
    root = args.data / "spot-traces"
    if not root.is_dir():
        print(f"no spot traces under {root}", file=sys.stderr)
        return 1
    began = time.perf_counter()
    runs = 0
    prices = "catalog (region median spot)" if args.catalog_prices else "spot = 1/3 on-demand"
    print(f"changeover 0.2 h, checkpoint at preemption notice, prices: {prices}")
    header = f"{'set':<52} {'slack':>5} {'policy':<34} {'cost/OD':>8} {'met':>6} {'migr':>6}"
    print(header)
    print("-" * len(header))
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        timeline = load_traces(sorted(folder.glob("*.json")))
        spot, ondemand = catalog_prices("p3.2xlarge", [zone_region(z) for z in timeline.zones])
        if not args.catalog_prices:
            spot = tuple(ondemand / 3 for _ in spot)
        nodes = timeline.capacity
        spot = tuple(p * nodes for p in spot)
        label = f"{folder.name} ({len(timeline.zones)}z, {plan_for(timeline).job_hours:.0f}h job)"
        for name, slack, policy, results in run_set(label, timeline, spot, ondemand * nodes):
            runs += len(results)
            ratio = np.mean([r.cost_ratio for r in results])
            met = 100 * np.mean([r.deadline_met for r in results])
            migrations = np.mean([r.migrations for r in results])
            print(
                f"{name:<52} {slack:>5.1f} {policy:<34} {ratio:>8.3f} {met:>5.0f}% "
                f"{migrations:>6.1f}"
            )
        print()
    print(f"{runs} simulated jobs in {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
