"""``srifty plan``: the best VM mix for a profiled job under a deadline or a budget."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import textwrap
from collections.abc import Sequence
from typing import Any

from lightning_srifty.core.catalog import GpuSpec, Offer
from lightning_srifty.core.cluster import Plan
from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.planner import (
    DEFAULT_RESTART_DELAY_H,
    OBJECTIVES,
    PlanRequest,
    PlanResult,
    parse_pinned,
    plan,
    plan_pinned,
    result_to_dict,
)
from lightning_srifty.core.script_trainer import ScriptTrainer
from lightning_srifty.core.units import (
    format_hours,
    format_money,
    format_seconds,
    parse_duration,
    parse_money,
)

CATALOG_SOURCES = ("bundled", "skypilot", "auto")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds the ``plan`` sub-command."""
    p = sub.add_parser(
        "plan",
        help="rank VM mixes for a profiled job under a deadline or budget",
        description="Evaluates every instance type x nodes x region x spot/on-demand (and "
        "two-type mixes in a region) with the performance model and spot risk, and ranks "
        "the plans that meet the deadline/budget.",
    )
    p.add_argument("--profile", required=True, help="profile JSON written by SriftyCallback")
    add_planning_arguments(p)
    p.add_argument("--top", type=int, default=10, help="plans to show (default 10)")
    p.add_argument("--json", action="store_true", help="print versioned JSON")
    p.add_argument("--plot", metavar="PNG", help="write the time-cost Pareto front here")
    p.set_defaults(func=run)


def add_planning_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that describe what to plan for; shared by ``srifty plan`` and ``srifty-launch``."""
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--target-steps",
        type=int,
        help="steps to train, counted as the profile ran them (batches of the training loop "
        "on the profiled processes); the same samples on any cluster",
    )
    target.add_argument("--epochs", type=float, help="epochs to train (needs a dataset size)")
    p.add_argument("--dataset-size", type=int, help="samples per epoch (with --epochs)")
    p.add_argument("--deadline", help="finish within, e.g. 10h, 90m, 2d")
    p.add_argument("--budget", help="spend at most, e.g. 500 or $500")
    p.add_argument("--objective", default="cost", help=f"one of {', '.join(OBJECTIVES)}")
    p.add_argument("--spot", action=argparse.BooleanOptionalAction, default=True,
                   help="consider spot instances (default: yes)")  # fmt: skip
    p.add_argument("--regions", nargs="+", default=[], metavar="REGION")
    p.add_argument("--max-nodes", type=int, default=64)
    p.add_argument("--max-gpus", type=int, default=None)
    p.add_argument("--families", nargs="+", default=[], metavar="FAMILY",
                   help="only these instance families, e.g. g5 p4d")  # fmt: skip
    p.add_argument("--exclude-families", nargs="+", default=[], metavar="FAMILY")
    p.add_argument("--no-mixes", action="store_true", help="homogeneous clusters only")
    p.add_argument("--restart-delay", default=None,
                   help="provisioning + restart time after a preemption (default 5m)")  # fmt: skip
    p.add_argument("--checkpoint-cost", default=None,
                   help="time to write one checkpoint (default: from state size)")  # fmt: skip
    p.add_argument("--confidence", type=float, default=0.9,
                   help="least probability a spot plan meets the deadline (0.9)")  # fmt: skip
    p.add_argument("--catalog", default="auto", help=f"one of {', '.join(CATALOG_SOURCES)}")
    p.add_argument(
        "--calibration",
        help="calibration JSON from `srifty calibrate` (default: the shipped one)",
    )
    p.add_argument("--cluster", metavar="TYPE:N[,TYPE:N]",
                   help="pin the cluster shape: no search, priced per zone")  # fmt: skip


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    """Flags to a validated :class:`PlanRequest` (raises ConfigError naming the flag)."""
    if args.catalog not in CATALOG_SOURCES:
        raise ConfigError(
            f"--catalog {args.catalog!r} is not valid: use one of {', '.join(CATALOG_SOURCES)}"
        )
    deadline = parse_duration(args.deadline, flag="--deadline") if args.deadline else None
    restart = (
        parse_duration(args.restart_delay, flag="--restart-delay", default_unit="m") / 3600
        if args.restart_delay
        else DEFAULT_RESTART_DELAY_H
    )
    checkpoint = (
        parse_duration(args.checkpoint_cost, flag="--checkpoint-cost", default_unit="s")
        if args.checkpoint_cost
        else None
    )
    return PlanRequest(
        target_steps=args.target_steps,
        epochs=args.epochs,
        dataset_size=args.dataset_size,
        deadline_h=deadline / 3600 if deadline is not None else None,
        budget_usd=parse_money(args.budget, flag="--budget") if args.budget else None,
        objective=args.objective,
        allow_spot=args.spot,
        regions=tuple(args.regions),
        max_nodes=args.max_nodes,
        max_gpus=args.max_gpus,
        families=tuple(args.families),
        exclude_families=tuple(args.exclude_families),
        mixes=not args.no_mixes,
        restart_delay_h=restart,
        checkpoint_cost_s=checkpoint,
        min_deadline_probability=args.confidence,
        top_k=args.top,
    )


def load_offers(source: str, profiled_on: str) -> tuple[tuple[Offer, ...], dict[str, GpuSpec]]:
    """Offers the job can train on and the GPU spec table (read in io, not here)."""
    from lightning_srifty.io.catalog_io import load_gpu_specs, planning_offers

    return planning_offers(source, profiled_on), load_gpu_specs()


def plan_from_args(
    args: argparse.Namespace,
    offers: Sequence[Offer] | None = None,
    gpu_specs: dict[str, GpuSpec] | None = None,
) -> tuple[PlanResult, PlanRequest]:
    """Everything ``srifty plan`` computes; ``offers``/``gpu_specs`` replace the catalog."""
    from lightning_srifty.core.perfmodel import PerformanceModel
    from lightning_srifty.io.calibration_io import calibration_or_default
    from lightning_srifty.io.profile_io import load_profile

    request = request_from_args(args)
    if args.plot:
        from lightning_srifty.io.plot import _pyplot

        _pyplot()  # fail before the work when matplotlib is missing
    profile = load_profile(args.profile)
    script = ScriptTrainer.of(profile)
    request = script.constrain(request)
    calibration = calibration_or_default(args.calibration)
    if offers is None:
        offers, specs = load_offers(args.catalog, profile.environment.accelerator)
    else:
        specs = dict(gpu_specs or {})
    model = PerformanceModel(specs, calibration)
    if getattr(args, "cluster", None):
        pinned = parse_pinned(args.cluster)
        result = plan_pinned(profile, offers, model, request, pinned)
    else:
        result = plan(profile, offers, model, request)
    notes = tuple(script.notes())
    return dataclasses.replace(result, notes=(*notes, *result.notes)), request


def _gain(base: float, best: float, unit: str) -> str:
    """What plan #1 gains over a baseline, in words: ``saves $2.10 (38%)``, ``costs
    $0.40 more (12%)``, ``same``. A difference that rounds to nothing is ``same``; the
    share of the baseline's figure is shown only when it is at least 1 %."""
    diff = base - best
    text = format_money(abs(diff)) if unit == "$" else format_hours(abs(diff))
    if not math.isfinite(diff) or text in ("$0.00", "0 s", "$0"):
        return "same" if math.isfinite(diff) else "—"
    share = abs(diff) / base if base > 0 and math.isfinite(base) else 0.0
    pct = f" ({share:.0%})" if share >= 0.01 else ""
    if diff > 0:
        return f"saves {text}{pct}"
    return f"{text} more{pct}" if unit == "$" else f"{text} longer{pct}"


def _title(request: PlanRequest) -> str:
    title = f"srifty plan: objective {request.objective}"
    if request.deadline_h is not None:
        title += f", deadline {format_hours(request.deadline_h)}"
    if request.budget_usd is not None:
        title += f", budget {format_money(request.budget_usd)}"
    return title


EXPECTATION_NOTE = (
    "step: median and interval; time and cost: expected, at the interval's mean step, "
    "preemptions included"
)
"""What the figures of a plan are (the planner ranks by expected cost, not the median's)."""


def _expectation_note(request: PlanRequest) -> str:
    if request.deadline_h is None:
        return EXPECTATION_NOTE
    return EXPECTATION_NOTE + "; P(deadline) counts both"


def plan_lines(result: PlanResult, request: PlanRequest, width: int = 80) -> list[str]:
    """The plans and baselines as plain lines for logs, CI and pipes.

    A table squeezed into 80 columns cuts every cell ("clust…", "$5.6…"); here each plan
    takes two lines that fit, what it is and what it costs, and nothing is cut.
    """
    lines = [_title(request), *textwrap.wrap(f"({_expectation_note(request)})", width=width)]
    for rank, p in enumerate(result.plans, 1):
        where = ", ".join(sorted({f"{g.offer.region} {g.offer.zone}" for g in p.cluster.groups}))
        market = "spot" if p.use_spot else "on-demand"
        spread = max(p.step_high_s - p.step_s, p.step_s - p.step_low_s)
        gpus = p.cluster.world_size
        odds = (
            f", P(deadline) {p.deadline_probability:.0%}" if request.deadline_h is not None else ""
        )
        lines.append(
            f"{rank:>2}. {p.cluster.describe()} {market}, {where}, "
            f"{gpus} GPU{'s' if gpus != 1 else ''}{odds}"
        )
        lines.append(
            f"    step {format_seconds(p.step_s)} ±{format_seconds(spread)} on batch "
            f"{_batch(p)}, {format_hours(p.time_to_target_h)}, {format_money(p.cost_usd)} "
            f"({format_money(p.hourly_usd)}/h)"
        )
        if p.validation_s > 0:
            lines.append(
                f"    validation {format_seconds(p.validation_s)} a step (in time and cost)"
            )
        if p.stops_at_step is not None:
            lines.append(f"    {_stop(p)}")
    best = result.best
    if result.baselines:
        lines.append("baselines (what plan #1 saves against each):")
    for b in result.baselines:
        lines.append(f"  - {b.label}: {b.cluster.describe()} in {b.cluster.groups[0].offer.region}")
        money = _gain(b.cost_usd, best.cost_usd, "$")
        hours = _gain(b.time_to_target_h, best.time_to_target_h, "h")
        lines.append(
            f"    {format_hours(b.time_to_target_h)}, {format_money(b.cost_usd)}; "
            f"plan #1: money {money}, time {hours}"
        )
    lines.extend(textwrap.wrap(_searched(result), width=width))
    return lines


def _stop(p: Plan) -> str:
    """``the script's max_time=0:00:25 ends it after 412 of its 2,000 steps; time and
    cost to there``: a run the script's own limits end before the target."""
    return (
        f"the script's {p.stopped_by} ends it after {p.stops_at_step:,} of its "
        f"{p.steps_to_target:,} steps; time and cost to there"
    )


def _validation(p: Plan) -> str:
    """`` + 1.2 ms validation``: the script's validation passes per step, which the time
    and cost include and the step does not."""
    if p.validation_s <= 0:
        return ""
    return f" + {format_seconds(p.validation_s)} validation"


def _batch(p: Plan) -> str:
    """``32x8=256``: the per-process batch, the processes, the global batch of a step."""
    gpus = p.cluster.world_size
    if p.per_process_batch <= 0:
        return str(p.global_batch)
    return f"{p.per_process_batch}x{gpus}={p.global_batch}"


def _searched(result: PlanResult) -> str:
    space = result.space
    return (
        f"searched {space.total:,} candidates ({space.homogeneous:,} homogeneous, "
        f"{space.mixes:,} two-type mixes) over {space.instance_types} instance types; "
        + "; ".join(result.notes)
    )


def print_table(result: PlanResult, request: PlanRequest, console: Any = None) -> None:
    """A rich table on a terminal; plain lines (:func:`plan_lines`) anywhere else."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    if not console.is_terminal:
        for line in plan_lines(result, request):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    title = _title(request)
    table = Table(title=title)
    for name, justify in (
        ("#", "right"), ("cluster", "left"), ("market", "left"), ("region/zone", "left"),
        ("GPUs", "right"), ("batch/GPU x GPUs", "right"), ("median step ±", "right"),
        ("expected time to target", "right"),
        ("expected cost", "right"), ("$/h", "right"), ("P(deadline)", "right"),
    ):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for rank, p in enumerate(result.plans, 1):
        zones = ", ".join(sorted({f"{g.offer.region}/{g.offer.zone}" for g in p.cluster.groups}))
        spread = max(p.step_high_s - p.step_s, p.step_s - p.step_low_s)
        table.add_row(
            str(rank),
            p.cluster.describe(),
            "spot" if p.use_spot else "on-demand",
            zones,
            str(p.cluster.world_size),
            _batch(p),
            f"{format_seconds(p.step_s)} ± {format_seconds(spread)}{_validation(p)}",
            format_hours(p.time_to_target_h)
            + (f" ({_stop(p)})" if p.stops_at_step is not None else ""),
            format_money(p.cost_usd),
            format_money(p.hourly_usd),
            f"{p.deadline_probability:.0%}" if request.deadline_h is not None else "—",
        )
    console.print(table)
    console.print(_expectation_note(request))
    best = result.best
    base_table = Table(title="baselines (gain of plan #1 over each)")
    for name in ("baseline", "cluster", "expected time", "expected cost", "plan #1: money", "time"):
        base_table.add_column(name)
    for b in result.baselines:
        base_table.add_row(
            b.label,
            f"{b.cluster.describe()} ({b.cluster.groups[0].offer.region})",
            format_hours(b.time_to_target_h),
            format_money(b.cost_usd),
            _gain(b.cost_usd, best.cost_usd, "$"),
            _gain(b.time_to_target_h, best.time_to_target_h, "h"),
        )
    console.print(base_table)
    console.print(_searched(result))


def run(
    args: argparse.Namespace,
    offers: Sequence[Offer] | None = None,
    gpu_specs: dict[str, GpuSpec] | None = None,
) -> int:
    """Prints the ranked plans; ``offers``/``gpu_specs`` replace the catalog (tests)."""
    result, request = plan_from_args(args, offers, gpu_specs)
    if args.plot:
        from lightning_srifty.io.plot import plot_pareto

        plot_pareto(result, args.plot)
    if args.json:
        print(json.dumps(result_to_dict(result, request), indent=1))
    else:
        print_table(result, request)
        if args.plot:
            print(f"Pareto front written to {args.plot}")
    return 0
