"""``srifty simulate``: replay a job on real spot traces under one policy."""

from __future__ import annotations

import argparse
import json
import math

from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.spot import (
    CHECKPOINT_MODES,
    DEFAULT_CHANGEOVER_HOURS,
    POLICY_NAMES,
    CheckpointModel,
    SimulationResult,
    SpotJob,
    make_policy,
    simulate,
)

EVENTS_SHOWN = 40


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds the ``simulate`` sub-command."""
    p = sub.add_parser(
        "simulate",
        help="replay a job on spot availability traces under a policy",
        description="All trace files together form the zones of one timeline (aligned by "
        "tick, resampled to the coarsest gap). Spot prices come from the bundled catalog "
        "(median spot price of each zone's region) unless --spot-price-ratio is given.",
    )
    p.add_argument("--trace", required=True, nargs="+", metavar="FILE", help="zone trace JSON")
    p.add_argument("--job-hours", required=True, type=float, help="compute the job needs")
    p.add_argument("--deadline-hours", required=True, type=float, help="from submission")
    p.add_argument("--policy", choices=POLICY_NAMES, default="srifty")
    p.add_argument("--changeover-hours", type=float, default=DEFAULT_CHANGEOVER_HOURS,
                   help="restart delay on a new instance (default %(default)s)")  # fmt: skip
    p.add_argument("--start-hour", type=float, default=0.0, help="submission time in the trace")
    p.add_argument("--instance-type", default="p3.2xlarge", help="catalog type for prices")
    p.add_argument("--spot-price-ratio", type=float, default=None,
                   help="spot price as a fraction of on-demand (not the catalog)")  # fmt: skip
    p.add_argument("--home-zone", default=None,
                   help="zone single-zone policies use (default: the first trace)")  # fmt: skip
    p.add_argument("--checkpoint", choices=CHECKPOINT_MODES, default="notice",
                   help="notice: saved at the preemption notice (default); periodic: "
                   "Young/Daly interval, work since the last save is lost")  # fmt: skip
    p.add_argument("--checkpoint-cost-hours", type=float, default=None,
                   help="time one save takes (periodic mode)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def _check_flags(args: argparse.Namespace) -> None:
    for flag, value in (
        ("--job-hours", args.job_hours),
        ("--deadline-hours", args.deadline_hours),
        ("--changeover-hours", args.changeover_hours),
        ("--start-hour", args.start_hour),
    ):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{flag} must be a finite number >= 0, got {value}")
    if args.job_hours <= 0:
        raise ConfigError(f"--job-hours must be > 0, got {args.job_hours}")
    if args.deadline_hours < args.job_hours:
        raise ConfigError(
            f"--deadline-hours ({args.deadline_hours}) must be at least --job-hours "
            f"({args.job_hours})"
        )
    ratio = args.spot_price_ratio
    if ratio is not None and not (math.isfinite(ratio) and 0 < ratio <= 1):
        raise ConfigError(f"--spot-price-ratio must be in (0, 1], got {ratio}")
    if args.checkpoint == "periodic":
        cost = args.checkpoint_cost_hours
        if cost is None or not (math.isfinite(cost) and cost > 0):
            raise ConfigError("--checkpoint periodic needs --checkpoint-cost-hours > 0")


def run(args: argparse.Namespace) -> int:
    from lightning_srifty.io.spot_traces import catalog_prices, load_traces, zone_region

    _check_flags(args)
    timeline = load_traces(args.trace)
    start_tick = int(round(args.start_hour / timeline.gap_hours))
    if start_tick >= timeline.ticks:
        raise ConfigError(
            f"--start-hour {args.start_hour} is past the end of the traces ({timeline.hours:.1f} h)"
        )
    home = 0
    if args.home_zone is not None:
        if args.home_zone not in timeline.zones:
            raise ConfigError(
                f"--home-zone {args.home_zone!r} is not one of the traces' zones: "
                f"{', '.join(timeline.zones)}"
            )
        home = timeline.zones.index(args.home_zone)
    spot, ondemand = catalog_prices(args.instance_type, [zone_region(z) for z in timeline.zones])
    if args.spot_price_ratio is not None:
        spot = tuple(args.spot_price_ratio * ondemand for _ in timeline.zones)
    nodes = timeline.capacity
    checkpoint = (
        CheckpointModel("periodic", args.checkpoint_cost_hours)
        if args.checkpoint == "periodic"
        else CheckpointModel()
    )
    job = SpotJob(
        job_hours=args.job_hours,
        deadline_hours=args.deadline_hours,
        spot_prices=tuple(p * nodes for p in spot),
        ondemand_price=ondemand * nodes,
        changeover_hours=args.changeover_hours,
        checkpoint=checkpoint,
    )
    result = simulate(make_policy(args.policy, home), timeline, job, start_tick=start_tick)
    if args.json:
        doc: dict[str, object] = {
            "schema_version": 1,
            "nodes": nodes,
            "gap_hours": timeline.gap_hours,
        }
        doc.update(result.to_dict())
        print(json.dumps(doc, indent=1))
        return 0
    _print_table(result, nodes)
    return 0


def _print_table(result: SimulationResult, nodes: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    summary = Table(title=f"srifty simulate --policy {result.policy} ({nodes} node(s))")
    summary.add_column("")
    summary.add_column("value", justify="right")
    finish = "never" if result.finish_hours is None else f"{result.finish_hours:.2f} h"
    rows = (
        ("zones", ", ".join(result.zones)),
        ("cost", f"${result.cost:.2f}"),
        ("on-demand-only cost", f"${result.ondemand_cost:.2f}"),
        ("cost ratio", f"{result.cost_ratio:.3f}"),
        ("finish", finish),
        ("deadline", f"{result.deadline_hours:.2f} h"),
        ("deadline met", "yes" if result.deadline_met else "NO"),
        ("spot / on-demand hours", f"{result.spot_hours:.2f} / {result.ondemand_hours:.2f}"),
        ("preemptions", str(result.preemptions)),
        ("migrations", str(result.migrations)),
    )
    for name, value in rows:
        summary.add_row(name, value)
    console.print(summary)
    if not result.events:
        return
    from lightning_srifty.cli.output import print_rows

    print_rows(
        console,
        "placement changes",
        ("tick", "hour", "from", "to", "lost h", "why"),
        [
            (
                str(e.tick),
                f"{e.time_hours:.2f}",
                e.source,
                e.target,
                f"{e.lost_hours:.2f}",
                e.reason,
            )  # fmt: skip
            for e in result.events[:EVENTS_SHOWN]
        ],
        right=("tick", "hour", "lost h"),
    )
    if len(result.events) > EVENTS_SHOWN:
        console.print(f"… {len(result.events) - EVENTS_SHOWN} more (use --json for all)")
