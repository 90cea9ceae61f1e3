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
import dataclasses
import sys
import time
from collections.abc import Iterable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from lightning_srifty.cli.main import _Parser, run_guarded
from lightning_srifty.cli.plan_cmd import add_planning_arguments, print_table, request_from_args
from lightning_srifty.core.cluster import Plan
from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.monitor import (
    Expectation,
    Snapshot,
    mean_step_time,
    measured_step_time,
    steady_step_time,
)
from lightning_srifty.core.planner import PlanRequest, PlanResult, parse_pinned
from lightning_srifty.core.spot import POLICY_NAMES
from lightning_srifty.core.units import (
    format_hours,
    format_money,
    format_seconds,
    parse_duration,
)
from lightning_srifty.launch.controller import Migration
from lightning_srifty.launch.launcher import BACKENDS, LaunchOptions, LaunchOutcome, run_launch
from lightning_srifty.launch.profiling import ProfileRun
from lightning_srifty.launch.runs import read_run_record

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
    p.add_argument(
        "--run-dir", help="new folder for this run (default: srifty_runs/<script>-<time>)"
    )
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue RUN_DIR's run from its newest checkpoint")  # fmt: skip
    p.add_argument("--profile", metavar="P.json", help="reuse this profile instead of profiling")
    p.add_argument("--policy", default="srifty",
                   help=f"after a preemption: one of {', '.join(POLICY_NAMES)}")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="plan and write tasks; launch nothing")
    p.add_argument("--yes", action="store_true", help="launch the plan without asking")
    p.add_argument("--preempt-every", help="local backend: revoke each attempt after this long")
    p.add_argument("--preempt-trace", help="local backend: replay a spot trace JSON file")
    p.add_argument("--time-scale", type=float, default=3600.0,
                   help="trace seconds per wall second when replaying (default 3600)")  # fmt: skip
    p.add_argument(
        "--grace",
        default="30s",
        help="local backend: SIGTERM-to-SIGKILL grace on revocation (default 30s, as "
        "SkyPilot's own kill of a job's processes)",
    )
    p.add_argument(
        "--stall-timeout",
        default="15m",
        help="relaunch a job from its newest checkpoint when it has written no progress "
        "line (step, validation heartbeat, checkpoint) for this long while it runs, e.g. "
        "30m; longer than your slowest checkpoint save or epoch-end work (default 15m; "
        "'off': never)",
    )
    p.add_argument("--local-procs", type=int, default=2, help="local backend: max processes")
    p.add_argument("--local-nodes", type=int, default=2, help="local backend: max nodes")
    p.add_argument(
        "--keep-clusters",
        action="store_true",
        help="sky backends: keep clusters up on Ctrl-C (srifty down RUN_DIR)",
    )
    p.add_argument("--setup", help="sky backends: extra node setup commands (shell)")
    p.add_argument(
        "--job-recovery",
        default="auto",
        help="sky-jobs: job_recovery strategy. auto (default): SRIFTY_NEXT_OFFER (the "
        "preempted offer is retried last) when the API server has loaded its plugin "
        "(python -m lightning_srifty.launch.sky_recovery DIR), else EAGER_NEXT_REGION "
        "(SkyPilot's default: the ordered resources again from #1, the preempted offer "
        "first); or name one: EAGER_NEXT_REGION, FAILOVER, SRIFTY_NEXT_OFFER",
    )
    p.add_argument(
        "--probe",
        default="auto",
        help="measure the plans that could be best before committing: auto (when their "
        "intervals overlap and it pays), on, off (default auto)",
    )
    p.add_argument(
        "--max-attempts",
        type=int,
        default=None,
        help="give up after this many attempts (default: no cap; a run also stops after 20 "
        "attempts in a row without a new step)",
    )
    p.add_argument(
        "--no-refine",
        action="store_true",
        help="do not re-plan on the running job's measured steps (live refinement)",
    )
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
        name = unknown_before[0].split("=")[0]
        near = closest_option(name, known)
        hint = f"; did you mean {near}?" if near else ""
        raise ConfigError(
            f"unknown srifty-launch option {name!r} before the script{hint} "
            "(script arguments go after the script)"
        )
    ours = [a.split("=")[0] for a in before + after if a.startswith("--")]
    if "--epochs" in ours and "--target-steps" in ours:
        raise ConfigError(
            "--epochs and --target-steps exclude each other; if --epochs is your script's own "
            "flag, pass it after `--`: srifty-launch SCRIPT.py --target-steps N -- --epochs E"
        )
    for token in after:
        name = token.split("=")[0]
        if name.startswith("--") and name not in known:
            near = closest_option(name, known)
            if near is not None:
                raise ConfigError(
                    f"unknown option {name!r}: did you mean {near}, or is it your script's? "
                    f"Pass script options after `--` (srifty-launch SCRIPT.py ... -- {name} ...)"
                )
    namespace, passthrough = parser.parse_known_args(before + after)
    return namespace, script, (*passthrough, *verbatim)


def closest_option(name: str, known: Iterable[str]) -> str | None:
    """The launcher option ``name`` is a slip of (one or two edits away), if any.

    Close enough to be a typo of ours but far from the flags scripts usually have:
    ``--deadlin`` and ``--target-step`` match, ``--max-steps`` and ``--max-epochs`` do not.
    """
    bare = name.lstrip("-")
    allowed = 1 if len(bare) <= 5 else 2
    best: tuple[int, str] | None = None
    for option in known:
        if not option.startswith("--") or option in ("--help",):
            continue
        distance = _edits(bare, option[2:], allowed)
        if distance <= allowed and (best is None or distance < best[0]):
            best = (distance, option)
    return best[1] if best else None


def _edits(a: str, b: str, limit: int) -> int:
    """Levenshtein distance, stopping early once it exceeds ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
        if min(row) > limit:
            return limit + 1
    return row[-1]


def options_from_args(
    args: argparse.Namespace,
    script: str,
    script_args: Sequence[str],
    argv: Sequence[str] = (),
) -> LaunchOptions:
    """Validates flags into :class:`LaunchOptions`; bad values raise ConfigError.

    ``argv`` is the command line; ``run.json`` keeps it for ``--resume``.
    """
    args.top = 5
    request = request_from_args(args)
    pinned = parse_pinned(args.cluster) if args.cluster else ()
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
        run_dir=Path(args.run_dir) if args.run_dir else None,
        profile_path=Path(args.profile) if args.profile else None,
        pinned=pinned,
        argv=record_argv(argv, script) if argv else (),
        dry_run=args.dry_run,
        assume_yes=args.yes,
        catalog=args.catalog,
        calibration=Path(args.calibration) if args.calibration else None,
        preemptions=preemptions,
        grace_s=parse_duration(args.grace, flag="--grace", default_unit="s"),
        stall_timeout_s=(
            None
            if args.stall_timeout.strip().lower() == "off"
            else parse_duration(args.stall_timeout, flag="--stall-timeout", default_unit="s")
        ),
        local_max_nodes=args.local_nodes,
        local_max_procs=args.local_procs,
        policy=args.policy,
        keep_clusters=args.keep_clusters,
        setup=args.setup,
        job_recovery=args.job_recovery,
        refine=not args.no_refine,
        max_attempts=args.max_attempts,
        probe=args.probe,
    )


def record_argv(argv: Sequence[str], script: str) -> tuple[str, ...]:
    """The command line as ``run.json`` keeps it: the script's path made absolute (a
    resume may start elsewhere), and the options that concern this launch only dropped
    (``--dry-run`` too: resuming a dry run's folder is the real launch)."""
    out: list[str] = []
    skip = False
    cut = argv.index("--") if "--" in argv else len(argv)
    for i, word in enumerate(argv):
        if skip:
            skip = False
            continue
        if i < cut and word in ("--run-dir", "--resume", "--profile"):
            skip = True
            continue
        if i < cut and word.split("=")[0] in ("--run-dir", "--resume", "--profile", "--dry-run"):
            continue
        out.append(str(Path(word).resolve()) if word == script else word)
    return tuple(out)


def resume_argv(raw: Sequence[str]) -> tuple[Path, list[str]] | None:
    """``(run folder, command line to continue it)`` for ``--resume DIR [options]``.

    The stored command comes first and the options given now after it (before its
    ``--``), so ``--resume DIR --yes --deadline 5h`` changes just those.
    """
    cut = list(raw).index("--") if "--" in raw else len(raw)
    words = list(raw[:cut])
    folder: str | None = None
    for i, word in enumerate(words):
        if word == "--resume" and i + 1 < len(words):
            folder = words[i + 1]
            del words[i : i + 2]
            break
        if word.startswith("--resume="):
            folder = word.split("=", 1)[1]
            del words[i]
            break
    if folder is None:
        if "--resume" in words:
            raise ConfigError("--resume needs the run folder: --resume srifty_runs/<run>")
        return None
    if raw[cut:]:
        raise ConfigError("--resume continues the run with its own script arguments; drop `--`")
    if any(w.endswith(".py") and not w.startswith("-") for w in words):
        raise ConfigError(
            "--resume takes the script and its arguments from the run; give only launcher "
            "options beside it"
        )
    if any(w.split("=")[0] == "--run-dir" for w in words):
        raise ConfigError("--resume names the run folder; leave out --run-dir")
    stored = list(read_run_record(Path(folder)).argv)
    at = stored.index("--") if "--" in stored else len(stored)
    return Path(folder), stored[:at] + words + stored[at:]


class RichUI:
    """Prints the journey with rich; a live table while training runs."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console()
        self._live: Live | None = None
        self._last_line = 0.0

    def info(self, message: str) -> None:
        self._stop_live()
        # Off a terminal a message stays one line (rich would break it at 80 columns).
        wrap = not self.console.is_terminal
        self.console.print(f"[bold cyan]srifty[/] {escape(message)}", soft_wrap=wrap)

    def show_profile(self, run: ProfileRun) -> None:
        prof = run.profile
        st = prof.steps
        compiled = isinstance(prof.extra.get("compiled"), dict)
        self.info(
            f"profile written to {run.profile_path}: step {st.step.mean_s * 1e3:.1f} ms "
            f"(p90 {st.step.p90_s * 1e3:.1f} ms) on {prof.environment.device_name}, "
            f"{prof.grad_bytes / 1e6:.2f} MB of gradients, local batch "
            f"{prof.environment.local_batch_size}"
            + ("; compiled (torch.compile): timed whole, no layers" if compiled else "")
        )

    def show_plan(self, result: PlanResult, request: PlanRequest) -> None:
        self._stop_live()
        print_table(result, request, self.console)

    def confirm(self, plan: Plan) -> bool:
        if not sys.stdin.isatty():
            return False
        answer = self.console.input(f"Launch {plan.cluster.describe()}? [y/N] ")
        return answer.strip().lower() in ("y", "yes")

    def ask(self, question: str) -> bool:
        if not sys.stdin.isatty():
            return False
        answer = self.console.input(f"{question} [y/N] ")
        return answer.strip().lower() in ("y", "yes")

    def show_dry_run(self, report: Any) -> None:
        if report is None:
            self.info("dry run: nothing launched (the local backend has no task files)")
            return
        folder = Path(report.report_path).parent
        self.info(f"dry run: task YAML and SkyPilot's verdict in {folder}; nothing launched")
        rows = []
        for entry in report.entries:
            choice = entry.sky_choice
            market = "spot" if choice.use_spot else "on-demand"
            ours = entry.our_hourly_usd
            rows.append(
                (
                    Path(entry.yaml_path).name,
                    f"{choice.num_nodes}x {choice.instance_type} {market} "
                    f"{choice.zone or choice.region}",
                    f"${entry.sky_hourly_usd:,.4f}",
                    f"${ours:,.4f}" if ours is not None else "-",
                )
            )
        if not self.console.is_terminal:
            self._plain("SkyPilot's optimizer (offline) on our task YAML:")
            for name, chose, theirs, ours_usd in rows:
                self._plain(f"  {name}: SkyPilot chose {chose} at {theirs}/h; srifty {ours_usd}/h")
        else:
            table = Table(title="SkyPilot's optimizer (offline) on our task YAML")
            for col in ("task YAML", "SkyPilot chose", "SkyPilot $/h", "srifty $/h"):
                table.add_column(col)
            for row in rows:
                table.add_row(*row)
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
        rows = summary_rows(outcome)
        if not self.console.is_terminal:
            self._plain("srifty-launch summary")
            for what, value in rows:
                self._plain(f"  {what.strip()}: {value}")
            return
        table = Table(title="srifty-launch summary")
        table.add_column("what")
        table.add_column("value")
        for row in rows:
            table.add_row(*row)
        self.console.print(table)

    def _plain(self, line: str) -> None:
        """One line as is: no markup, no wrapping, no cut cells (logs, CI, pipes)."""
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _stop_live(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def summary_rows(outcome: LaunchOutcome) -> list[tuple[str, str]]:
    """What the run did, as (what, value) rows: a table on a terminal, lines elsewhere."""
    run = outcome.run
    assert run is not None and outcome.plan_result is not None
    final = run.final
    rows = [("plan chosen", outcome.plan_result.best.cluster.describe())]
    if outcome.local_topology is not None:
        topo = outcome.local_topology
        rows.append(("ran locally as", f"{topo.nodes} node(s) x {topo.procs_per_node} process(es)"))
    timed = [a for a in run.attempts if measured_step_time(a.events) is not None]
    expected = (timed[-1] if timed else final).expectation
    last = measured_step_time(timed[-1].events) if timed else None
    mean = mean_step_time([e for a in run.attempts for e in a.events])
    rows.append(
        (
            "step time (predicted)",
            f"{expected.step_s * 1e3:.1f} ms [{expected.low_s * 1e3:.1f}, "
            f"{expected.high_s * 1e3:.1f}]",
        )
    )
    steady = steady_step_time(timed[-1].events) if timed else None
    measured = "-"
    if mean is not None and last is not None:
        measured = f"{mean * 1e3:.1f} ms mean over the run; {last * 1e3:.1f} ms last window"
    elif last is not None:
        measured = f"{last * 1e3:.1f} ms last window"
    if steady is not None:  # what the prediction is for: no start-up, no first steps
        measured += f"; {steady * 1e3:.1f} ms steady (median after warm-up)"
    rows.append(("step time (measured)", measured))
    if expected.validation_s > 0:  # the steps above leave the passes out; the plan does not
        rows.append(
            (
                "validation (predicted)",
                f"{format_seconds(expected.validation_s)} a step, in the plan's time and cost",
            )
        )
    rows.append(("steps done", f"{run.steps_done} / {run.target_steps}"))
    ended = [e.reason for a in run.attempts for e in a.events if e.event == "done" and e.reason]
    if ended and run.steps_done < run.target_steps:
        rows.append(("ended by the script", ended[-1]))
    resumed = [a.resumed_from for a in run.attempts if a.resumed_from]
    rows.append(("resumed from", ", ".join(resumed) or "-"))
    rows.append(("preemptions survived", str(len(run.migrations) + run.recoveries)))
    for attempt in run.attempts:
        if attempt.placements:
            rows.append(("  managed job ran on", attempt.placements[0]))
        for n, (before, after) in enumerate(pairwise(attempt.placements), start=1):
            rows.append(("  SkyPilot recovery", f"#{n}: {before} -> {after}"))
    for move in run.migrations:
        rows.append(
            (
                "  migration",
                f"{move.from_plan} -> {move.to_plan}; resumed at step {move.resumed_step} "
                f"({_reached(move)}), {move.lost_s:.1f} s lost",
            )
        )
    rows.append(("wall time", format_hours(run.elapsed_s / 3600.0)))
    rows.append(("cost at plan prices", format_money(run.cost_usd)))
    return rows


def _reached(move: Migration) -> str:
    """What the job itself said about the step it reached when it was interrupted."""
    if move.saved_at_preemption:
        return f"the job saved step {move.step_at_preemption} when interrupted"
    redo = max(move.step_at_preemption - move.resumed_step, 0)
    return (
        f"no emergency checkpoint; its last report was step {move.step_at_preemption}, "
        f"{redo} step{'s' if redo != 1 else ''} run again"
    )


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
        resumed = resume_argv(raw)
        if resumed is not None:
            folder, line = resumed
            args, script, script_args = split_argv(line, parser)
            options = options_from_args(args, script, script_args)
            run_launch(dataclasses.replace(options, run_dir=folder, resume=True), ui)
            return 0
        args, script, script_args = split_argv(raw, parser)
        run_launch(options_from_args(args, script, script_args, raw), ui)
        return 0

    return run_guarded(run)


if __name__ == "__main__":
    sys.exit(main())
