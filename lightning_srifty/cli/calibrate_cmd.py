"""``srifty calibrate``: fit hardware constants and the learned correction to measurements."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from lightning_srifty.core.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds the ``calibrate`` sub-command."""
    p = sub.add_parser(
        "calibrate",
        help="fit the performance model to measured multi-GPU step times",
        description="Fits the hardware constants (one efficiency and latency per transport, "
        "fixed per-step costs, overlap), each calibrated job's own overlap and co-location "
        "terms, and a learned correction (kept only if it helps jobs it was not fitted on); "
        "writes a versioned JSON and prints how it differs from the shipped default.",
    )
    p.add_argument("--traces", action="append", default=[], metavar="DIR",
                   help="Pollux-format trace folder (repeatable)")  # fmt: skip
    p.add_argument("--profiles", nargs="+", default=[], metavar="P.json",
                   help="profiles of your own multi-GPU runs")  # fmt: skip
    p.add_argument("--out", required=True, help="where to write the calibration JSON")
    p.add_argument("--no-learned", action="store_true",
                   help="fit the physics constants only (no boosted-tree correction)")  # fmt: skip
    p.add_argument(
        "--data-root",
        metavar="DIR",
        help="record trace folders by their path below DIR (provenance names)",
    )
    p.set_defaults(func=run)


def source_name(folder: str, data_root: str | None) -> str:
    """A trace folder's provenance name: its path below ``data_root`` if it is under it."""
    path = Path(folder).resolve()
    if data_root:
        try:
            return path.relative_to(Path(data_root).resolve()).as_posix()
        except ValueError:
            pass
    return os.path.normpath(folder)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from lightning_srifty.fit.calibration import (
        calibrate,
        hardware_conformal_widening,
        profile_fit_groups,
        trace_groups,
        trace_source,
    )
    from lightning_srifty.io.calibration_io import load_default_calibration, save_calibration
    from lightning_srifty.io.traces import load_traces

    if not args.traces and not args.profiles:
        raise ConfigError("give at least one --traces DIR or --profiles P.json")
    groups = []
    hardware = []
    sources = []
    named = []
    for folder in args.traces:
        traces = load_traces(folder)
        named.append((source_name(folder, args.data_root), traces))
        hardware.append(traces.hardware.describe())
        groups.extend(trace_groups(traces))
        sources.append(trace_source(traces, source_name(folder, args.data_root)))
    if args.profiles:
        extra, described = profile_fit_groups(args.profiles)
        groups.extend(extra)
        hardware.extend(described)
    calibration = calibrate(
        groups,
        hardware="; ".join(dict.fromkeys(hardware)),
        learned=not args.no_learned,
        sources=sources,
    )
    if len({t.hardware.fingerprint for _, t in named}) > 1:
        # how far off hardware nobody calibrated is: each kind left out in turn
        spread, widening = hardware_conformal_widening(named)
        calibration = replace(calibration, hardware_spread=spread, unseen_widening=widening)
    path = save_calibration(calibration, args.out)
    m = calibration.metrics
    trees = "kept" if calibration.correction is not None else "not kept (did not transfer)"
    print(
        f"calibrated on {calibration.rows} rows of {len(calibration.fitted_on)} models "
        f"({calibration.hardware}); physics median error "
        f"{100 * m['physics_median_ape']:.1f}% (p90 {100 * m['physics_p90_ape']:.1f}%) with "
        f"each job's own terms, {100 * m['unseen_job_median_ape']:.1f}% "
        f"(p90 {100 * m['unseen_job_p90_ape']:.1f}%) scored as unseen jobs; learned "
        f"correction {trees}; on hardware it never saw a whole kind may sit "
        f"{100 * math.expm1(calibration.hardware_spread):.0f}% off (one sigma) and the "
        f"interval widens by {100 * math.expm1(calibration.unseen_widening):.0f}% more; "
        f"wrote {path}"
    )
    print(differences(load_default_calibration().physics.to_json(), calibration.physics.to_json()))
    return 0


def differences(default: dict[str, object], fitted: dict[str, object]) -> str:
    """One line per constant: the shipped default, the new value and their ratio."""
    lines = ["constant                 default      this fit     ratio"]
    for name, new in fitted.items():
        old = default.get(name)
        if isinstance(new, float) and isinstance(old, float):
            ratio = f"{new / old:8.2f}x" if old else "       -"
            lines.append(f"{name:22s} {old:11.4g}  {new:11.4g}  {ratio}")
        else:
            lines.append(f"{name:22s} {old!s:>11}  {new!s:>11}")
    return "\n".join(lines)
