"""``srifty-launch``: profile a training script, plan the best VM mix, relaunch, resume.

Usage::

    srifty-launch train.py --target-steps 5000 --deadline 12h [options] [script args] [-- args]

The script is the first argument ending in ``.py``. Launcher options may come before
or after it; arguments the launcher does not know are passed to the script, and
everything after ``--`` reaches the script verbatim (use it when the script has a flag
of the same name as one of ours, such as ``--epochs``). No shell is involved.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from lightning_srifty.cli.main import _Parser, run_guarded
from lightning_srifty.cli.plan_cmd import add_planning_arguments, print_table, request_from_args
from lightning_srifty.core.cluster import Plan
from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.monitor import Expectation, Snapshot, measured_step_time
from lightning_srifty.core.planner import PlanRequest, PlanResult
from lightning_srifty.core.spot import POLICY_NAMES
from lightning_srifty.core.units import format_hours, format_money, parse_duration
from lightning_srifty.launch.controller import Migration
from lightning_srifty.launch.launcher import BACKENDS, LaunchOptions, LaunchOutcome, run_launch
from lightning_srifty.launch.profiling import ProfileRun

USAGE = (
    "srifty-launch SCRIPT.py (--target-steps N | --epochs E) [options] "
    "[script args] [-- verbatim script args]"
)


def build_parser() -> argparse.ArgumentParser:
    """The launcher's own options (the script and its arguments are split off first)."""
    p = _Parser(
        prog="srifty-launch",
        usage=USAGE,
        description="Profile a Lightning script, plan the best VM mix, relaunch and resume.",
        allow_abbrev=False,
    )
    add_planning_arguments(p)
    p.add_argument("--backend", default="local", help=f"one of {', '.join(BACKENDS)}")
    p.add_argument("--checkpoint-uri", help="s3://bucket/prefix or a directory")
    p.add_argument("--keep-checkpoints", type=int, default=3, help="checkpoints to retain")
    p.add_argument("--run-dir", default="srifty_runs/latest", help="logs, profile, progress")
    p.add_argument("--policy", default="srifty",
                   help=f"after a preemption: one of {', '.join(POLICY_NAMES)}")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="plan and write tasks; launch nothing")
    p.add_argument("--yes", action="store_true", help="launch the plan without asking")
    p.add_argument("--preempt-every", help="local backend: revoke each attempt after this long")
    p.add_argument("--preempt-trace", help="local backend: replay a spot trace JSON file")
    p.add_argument("--time-scale", type=float, default=3600.0,
                   help="trace seconds per wall second when replaying (default 3600)")  # fmt: skip
    p.add_argument("--grace", default="20s", help="SIGTERM-to-SIGKILL grace on revocation")
    p.add_argument("--local-procs", type=int, default=2, help="local backend: max processes")
    p.add_argument("--local-nodes", type=int, default=2, help="local backend: max nodes")
    p.add_argument(
        "--keep-clusters",
        action="store_true",
        help="sky backends: keep clusters up on Ctrl-C (srifty down RUN_DIR)",
    )
    p.add_argument("--setup", help="sky backends: extra node setup commands (shell)")
    return p


def split_argv(
    argv: Sequence[str], parser: argparse.ArgumentParser
) -> tuple[argparse.Namespace, str, tuple[str, ...]]:
    """(launcher options, script, script arguments) from the command line.

    Raises:
        ConfigError: No script, or an unknown option before the script.
    """
    args = list(argv)
    index = next(
        (i for i, a in enumerate(args) if a.endswith(".py") and not a.startswith("-")), None
    )
    if index is None or "--" in args[:index]:
        raise ConfigError(f"no training script given (a .py file); usage: {USAGE}")
    before, script, after = args[:index], args[index], args[index + 1 :]
    verbatim: list[str] = []
    if "--" in after:
        cut = after.index("--")
        after, verbatim = after[:cut], after[cut + 1 :]
    known = parser._option_string_actions  # noqa: SLF001 - argparse has no public lookup
    unknown_before = [a for a in before if a.startswith("-") and a.split("=")[0] not in known]
    if unknown_before:
        raise ConfigError(
            f"unknown srifty-launch option {unknown_before[0]!r} before the script; "
            "script arguments go after the script"
        )
    namespace, passthrough = parser.parse_known_args(before + after)
    return namespace, script, (*passthrough, *verbatim)


def options_from_args(
    args: argparse.Namespace, script: str, script_args: Sequence[str]
) -> LaunchOptions:
    """Validates flags into :class:`LaunchOptions`; bad values raise ConfigError."""
    args.top = 5
    request = request_from_args(args)
    if args.preempt_every and args.preempt_trace:
        raise ConfigError("give at most one of --preempt-every and --preempt-trace")
    for flag, value in (
        ("--local-procs", args.local_procs),
        ("--local-nodes", args.local_nodes),
        ("--keep-checkpoints", args.keep_checkpoints),
    ):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    preemptions: Any = None
    if args.preempt_every:
        from lightning_srifty.launch.injection import EveryInterval

        preemptions = EveryInterval(
            parse_duration(args.preempt_every, flag="--preempt-every", default_unit="s")
        )
    elif args.preempt_trace:
        from lightning_srifty.io.spot_traces import load_trace
        from lightning_srifty.launch.injection import TraceReplay

        preemptions = TraceReplay.from_timeline(load_trace(args.preempt_trace), args.time_scale)
    return LaunchOptions(
        script=script,
        script_args=tuple(script_args),
        request=request,
        backend=args.backend,
        checkpoint_uri=args.checkpoint_uri,
        keep_checkpoints=args.keep_checkpoints,
        run_dir=Path(args.run_dir),
        dry_run=args.dry_run,
        assume_yes=args.yes,
        catalog=args.catalog,
        calibration=Path(args.calibration) if args.calibration else None,
        preemptions=preemptions,
        grace_s=parse_duration(args.grace, flag="--grace", default_unit="s"),
        local_max_nodes=args.local_nodes,
        local_max_procs=args.local_procs,
        policy=args.policy,
        keep_clusters=args.keep_clusters,
        setup=args.setup,
    )


class RichUI:
    """Prints the journey with rich; a live table while training runs."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console()
        self._live: Live | None = None
        self._last_line = 0.0

    def info(self, message: str) -> None:
        self._stop_live()
        self.console.print(f"[bold cyan]srifty[/] {message}")

    def show_profile(self, run: ProfileRun) -> None:
        prof = run.profile
        st = prof.steps
        self.info(
            f"profile written to {run.profile_path}: step {st.step.mean_s * 1e3:.1f} ms "
            f"(p90 {st.step.p90_s * 1e3:.1f} ms) on {prof.environment.device_name}, "
            f"{prof.grad_bytes / 1e6:.2f} MB of gradients, local batch "
            f"{prof.environment.local_batch_size}"
        )

    def show_plan(self, result: PlanResult, request: PlanRequest) -> None:
        self._stop_live()
        print_table(result, request)

    def confirm(self, plan: Plan) -> bool:
        if not sys.stdin.isatty():
            return False
        answer = self.console.input(f"Launch {plan.cluster.describe()}? [y/N] ")
        return answer.strip().lower() in ("y", "yes")

    def show_dry_run(self, report: Any) -> None:
        if report is None:
            self.info("dry run: nothing launched (the local backend has no task files)")
            return
        folder = Path(report.report_path).parent
        self.info(f"dry run: task YAML and SkyPilot's verdict in {folder}; nothing launched")
        table = Table(title="SkyPilot's optimizer (offline) on our task YAML")
        for col in ("task YAML", "SkyPilot chose", "SkyPilot $/h", "srifty $/h"):
            table.add_column(col)
        for entry in report.entries:
            choice = entry.sky_choice
            market = "spot" if choice.use_spot else "on-demand"
            ours = entry.our_hourly_usd
            table.add_row(
                Path(entry.yaml_path).name,
                f"{choice.num_nodes}x {choice.instance_type} {market} "
                f"{choice.zone or choice.region}",
                f"${entry.sky_hourly_usd:,.4f}",
                f"${ours:,.4f}" if ours is not None else "-",
            )
        self.console.print(table)
        for warning in report.warnings:
            self.console.print(f"[yellow]warning:[/] {warning}")

    def progress(self, plan: Plan, snap: Snapshot, expect: Expectation) -> None:
        table = _progress_table(plan, snap, expect)
        if self.console.is_terminal:
            if self._live is None:
                self._live = Live(table, console=self.console, refresh_per_second=4)
                self._live.start()
            else:
                self._live.update(table)
            return
        now = time.monotonic()
        if now - self._last_line >= 5.0:
            self._last_line = now
            measured = (
                f"{snap.measured_step_s * 1e3:.1f} ms" if snap.measured_step_s else "(warming up)"
            )
            self.console.print(
                f"step {snap.steps_done}/{expect.target_steps}  measured {measured}  "
                f"predicted {expect.step_s * 1e3:.1f} ms  cost ${snap.cost_so_far_usd:.4f}"
            )

    def migration(self, move: Migration) -> None:
        self._stop_live()
        self.console.print(
            f"[bold yellow]preempted[/] at step {move.step_at_preemption} "
            f"({move.reason}): {move.from_plan} -> {move.to_plan}"
        )

    def summary(self, outcome: LaunchOutcome) -> None:
        self._stop_live()
        run = outcome.run
        if run is None:
            return
        final = run.final
        table = Table(title="srifty-launch summary")
        table.add_column("what")
        table.add_column("value")
        table.add_row("plan chosen", outcome.plan_result.best.cluster.describe())
        if outcome.local_topology is not None:
            topo = outcome.local_topology
            table.add_row(
                "ran locally as", f"{topo.nodes} node(s) x {topo.procs_per_node} process(es)"
            )
        timed = [a for a in run.attempts if measured_step_time(a.events) is not None]
        expected = (timed[-1] if timed else final).expectation
        measured = measured_step_time(timed[-1].events) if timed else None
        table.add_row(
            "step time (predicted)",
            f"{expected.step_s * 1e3:.1f} ms [{expected.low_s * 1e3:.1f}, "
            f"{expected.high_s * 1e3:.1f}]",
        )
        table.add_row(
            "step time (measured)", f"{measured * 1e3:.1f} ms" if measured is not None else "-"
        )
        table.add_row("steps done", f"{run.steps_done} / {run.target_steps}")
        resumed = [a.resumed_from for a in run.attempts if a.resumed_from]
        table.add_row("resumed from", ", ".join(resumed) or "-")
        table.add_row("preemptions survived", str(len(run.migrations) + run.recoveries))
        for move in run.migrations:
            table.add_row(
                "  migration",
                f"{move.from_plan} -> {move.to_plan}; resumed at step {move.resumed_step} "
                f"(preempted at {move.step_at_preemption}), {move.lost_s:.1f} s lost",
            )
        table.add_row("wall time", format_hours(run.elapsed_s / 3600.0))
        table.add_row("cost at plan prices", format_money(run.cost_usd))
        self.console.print(table)

    def _stop_live(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def _progress_table(plan: Plan, snap: Snapshot, expect: Expectation) -> Table:
    table = Table(title=f"training on {plan.cluster.describe()}")
    for col in ("steps", "measured step", "predicted step", "cost so far", "ETA", "drift"):
        table.add_column(col)
    measured = f"{snap.measured_step_s * 1e3:.1f} ms" if snap.measured_step_s else "-"
    table.add_row(
        f"{snap.steps_done}/{expect.target_steps}",
        measured,
        f"{expect.step_s * 1e3:.1f} ms",
        f"${snap.cost_so_far_usd:,.4f}",
        format_hours(snap.eta_s / 3600.0) if snap.eta_s is not None else "-",
        snap.drift or "ok",
    )
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    if not raw or raw[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if raw else 2
    ui = RichUI()

    def run() -> int:
        args, script, script_args = split_argv(raw, parser)
        run_launch(options_from_args(args, script, script_args), ui)
        return 0

    return run_guarded(run)


if __name__ == "__main__":
    sys.exit(main())
