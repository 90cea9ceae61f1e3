"""``srifty calibrate``: fit hardware constants and the learned correction to measurements."""

from __future__ import annotations

import argparse

from lightning_srifty.core.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds the ``calibrate`` sub-command."""
    p = sub.add_parser(
        "calibrate",
        help="fit the performance model to measured multi-GPU step times",
        description="Fits per-hardware constants (bandwidths, latencies, overlap), each "
        "calibrated job's own overlap and co-location terms, and a learned correction "
        "(kept only if it helps jobs it was not fitted on); writes a versioned JSON.",
    )
    p.add_argument("--traces", action="append", default=[], metavar="DIR",
                   help="Pollux-format trace folder (repeatable)")  # fmt: skip
    p.add_argument("--profiles", nargs="+", default=[], metavar="P.json",
                   help="profiles of your own multi-GPU runs")  # fmt: skip
    p.add_argument("--out", required=True, help="where to write the calibration JSON")
    p.add_argument("--no-learned", action="store_true",
                   help="fit the physics constants only (no boosted-tree correction)")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lightning_srifty.io.calibration_io import (
        calibrate,
        fit_group,
        profile_fit_groups,
        save_calibration,
    )
    from lightning_srifty.io.traces import load_traces

    if not args.traces and not args.profiles:
        raise ConfigError("give at least one --traces DIR or --profiles P.json")
    groups = []
    hardware = []
    for folder in args.traces:
        traces = load_traces(folder)
        hardware.append(traces.hardware.describe())
        for model, rows in traces.rows.items():
            groups.append(fit_group(traces, model, [r for r in rows if r.replicas > 1]))
    if args.profiles:
        extra, described = profile_fit_groups(args.profiles)
        groups.extend(extra)
        hardware.extend(described)
    calibration = calibrate(
        groups, hardware="; ".join(dict.fromkeys(hardware)), learned=not args.no_learned
    )
    path = save_calibration(calibration, args.out)
    m = calibration.metrics
    trees = "kept" if calibration.correction is not None else "not kept (did not transfer)"
    print(
        f"calibrated on {calibration.rows} rows of {len(calibration.fitted_on)} models "
        f"({calibration.hardware}); physics median error "
        f"{100 * m['physics_median_ape']:.1f}% (p90 {100 * m['physics_p90_ape']:.1f}%) with "
        f"each job's own terms, {100 * m['unseen_job_median_ape']:.1f}% "
        f"(p90 {100 * m['unseen_job_p90_ape']:.1f}%) scored as unseen jobs; learned "
        f"correction {trees}; wrote {path}"
    )
    return 0
