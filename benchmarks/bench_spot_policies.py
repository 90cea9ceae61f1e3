"""Cost and deadlines of the spot policies replayed on the real Can't Be Late traces.

For every trace set in ``<data>/spot-traces``: the job runs at several submission times
and deadline slacks under each policy, once with all zones of the set (srifty may
migrate between them; single-zone policies stay in the first zone) and once in each zone
alone (the single-zone baselines). Prints, per set and slack, the mean cost as a
fraction of on-demand-only, the share of deadlines met and the mean migrations, next to
the offline optimum (a lower bound that knows the whole trace, all zones). Ends with a
summary per policy and a plain verdict: does srifty meet every deadline and cost no
more than Uniform Progress on average?

Run: ``.venv/bin/python benchmarks/bench_spot_policies.py [--data DIR] [--catalog-prices]``
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lightning_srifty.core.spot import (
    POLICY_NAMES,
    SimulationResult,
    SpotJob,
    SpotTimeline,
    make_policy,
    offline_optimal_cost,
    simulate,
)
from lightning_srifty.io.spot_traces import catalog_prices, load_traces, zone_region

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SLACKS = (1.1, 1.5, 2.0)
STARTS = 6
ORACLE = "offline optimum (all zones)"
HEADLINE = ("availability-1node-p3.2xlarge-2023-02", 1.5, 0.40)
"""The issue's aim: all nine zones of the 2023-02 set, 48 h job, 72 h deadline."""


@dataclass(frozen=True)
class SetPlan:
    job_hours: float
    """Compute the job needs on this set: long sets carry long jobs."""


@dataclass(frozen=True)
class Row:
    """One policy at one slack on one set: the ratios of every run."""

    folder: str
    label: str
    slack: float
    policy: str
    ratios: tuple[float, ...]
    met: tuple[bool, ...]
    migrations: float

    @property
    def ratio(self) -> float:
        return float(np.mean(self.ratios))


def plan_for(timeline: SpotTimeline) -> SetPlan:
    """48 h jobs where the trace is long enough (45 days), else a fifth of the trace."""
    return SetPlan(job_hours=48.0 if timeline.hours >= 30 * 24 else round(timeline.hours / 10))


def _row(
    folder: str, label: str, slack: float, policy: str, results: list[SimulationResult]
) -> Row:
    return Row(
        folder,
        label,
        slack,
        policy,
        tuple(r.cost_ratio for r in results),
        tuple(r.deadline_met for r in results),
        float(np.mean([r.migrations for r in results])),
    )


def run_set(
    folder: str, timeline: SpotTimeline, spot: tuple[float, ...], ondemand: float
) -> list[Row]:
    plan = plan_for(timeline)
    label = f"{folder} ({len(timeline.zones)}z, {plan.job_hours:.0f}h job)"
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
            rows.append(_row(folder, label, slack, f"{policy} (all zones)", results))
        bound = [
            offline_optimal_cost(timeline, all_zones, start_tick=t)
            / (ondemand * (plan.job_hours + all_zones.changeover_hours))
            for t in ticks
        ]
        rows.append(Row(folder, label, slack, ORACLE, tuple(bound), (True,) * len(bound), 0.0))
        for policy in POLICY_NAMES[:3]:
            results = []
            for z in range(len(timeline.zones)):
                one = SpotJob(plan.job_hours, deadline, (spot[z],), ondemand)
                sub = timeline.select([z])
                results += [simulate(make_policy(policy), sub, one, start_tick=t) for t in ticks]
            rows.append(_row(folder, label, slack, f"{policy} (each zone alone)", results))
    return rows


def summarise(rows: list[Row], *, show_aim: bool = True) -> None:
    """Per policy: mean cost/on-demand per set and overall, deadlines met, savings.

    ``show_aim`` compares with the issue's aim, which was set at spot = 1/3 on-demand.
    """
    folders = list(dict.fromkeys(r.folder for r in rows))
    policies = list(dict.fromkeys(r.policy for r in rows))
    by: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        by[(r.policy, r.folder)].append(r)
    short = [
        f.split("-p3")[0].replace("availability", "avail").replace("preemption", "pre")
        for f in folders
    ]
    print(
        "Summary: mean cost / on-demand over slacks "
        + ", ".join(map(str, SLACKS))
        + f" and {STARTS} starts"
    )
    print("(overall = mean over sets and slacks; each zone alone = mean over the zones first)")
    head = f"{'policy':<34}" + "".join(f"{s:>20}" for s in short)
    head += f"{'overall':>9}{'met':>8}{'saving':>8}"
    print(head)
    print("-" * len(head))
    overall: dict[str, float] = {}
    met: dict[str, float] = {}
    for policy in policies:
        per_set = [np.mean([r.ratio for r in by[(policy, f)]]) for f in folders]
        cells = [r for f in folders for r in by[(policy, f)]]
        overall[policy] = float(np.mean([r.ratio for r in cells]))
        saving = max(1 - overall[policy], 0.0)  # on-demand itself: 0 %, not -0 %
        met[policy] = float(np.mean([m for r in cells for m in r.met]))
        shown_met = "bound" if policy == ORACLE else f"{100 * met[policy]:.0f}%"
        print(
            f"{policy:<34}"
            + "".join(f"{v:>20.3f}" for v in per_set)
            + f"{overall[policy]:>9.3f}{shown_met:>8}{saving:>8.1%}"
        )
    print()
    for scope in ("all zones", "each zone alone"):
        srifty, up = f"srifty ({scope})", f"uniform-progress ({scope})"
        ok = met[srifty] == 1.0 and overall[srifty] <= overall[up] + 1e-12
        print(
            f"srifty ({scope}) meets 100% of deadlines and costs no more than Uniform "
            f"Progress on average: {'yes' if ok else 'no'} "
            f"({overall[srifty]:.3f} vs {overall[up]:.3f}, deadlines met {100 * met[srifty]:.0f}%)"
        )
    folder, slack, aim = HEADLINE
    head_rows = [r for r in rows if show_aim and r.folder == folder and r.slack == slack]
    if head_rows:
        got = {r.policy: r.ratio for r in head_rows}
        value = got["srifty (all zones)"]
        print(
            f"{folder}, slack {slack}, all zones: srifty {value:.3f} x on-demand "
            f"(aim <= {aim:.2f}: {'met' if value <= aim else 'not met'}; "
            f"offline optimum {got[ORACLE]:.3f}, Uniform Progress in one zone "
            f"{got['uniform-progress (each zone alone)']:.3f} on average over the zones)"
        )
    beaten = [
        (r.label, r.slack, r.policy, r.ratio, s.ratio)
        for r in rows
        for s in rows
        if r.folder == s.folder
        and r.slack == s.slack
        and r.policy.endswith("(all zones)")
        and r.policy != ORACLE
        and s.policy == "srifty (all zones)"
        and r.ratio < s.ratio - 1e-12
    ]
    for label, slack, policy, theirs, ours in beaten:
        print(f"  beats srifty: {policy} on {label} at slack {slack}: {theirs:.3f} < {ours:.3f}")


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
    rows: list[Row] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        timeline = load_traces(sorted(folder.glob("*.json")))
        spot, ondemand = catalog_prices("p3.2xlarge", [zone_region(z) for z in timeline.zones])
        if not args.catalog_prices:
            spot = tuple(ondemand / 3 for _ in spot)
        nodes = timeline.capacity
        spot = tuple(p * nodes for p in spot)
        for row in run_set(folder.name, timeline, spot, ondemand * nodes):
            rows.append(row)
            met = "bound" if row.policy == ORACLE else f"{100 * np.mean(row.met):.0f}%"
            if row.policy != ORACLE:
                runs += len(row.ratios)
            print(
                f"{row.label:<52} {row.slack:>5.1f} {row.policy:<34} {row.ratio:>8.3f} "
                f"{met:>6} {row.migrations:>6.1f}"
            )
        print()
    print(f"{runs} simulated jobs in {time.perf_counter() - began:.1f} s\n")
    summarise(rows, show_aim=not args.catalog_prices)
    return 0


if __name__ == "__main__":
    sys.exit(main())
