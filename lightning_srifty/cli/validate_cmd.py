"""``srifty validate``: held-out accuracy of the performance model on trace folders."""

from __future__ import annotations

import argparse
import json

from lightning_srifty.fit import PROTOCOLS


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds the ``validate`` sub-command."""
    p = sub.add_parser(
        "validate",
        help="held-out prediction error on Pollux-format traces",
        description="lomo: calibrate on the other models, predict this model's multi-GPU "
        "rows from its single-GPU rows. scale-out: also calibrate on its single-node rows, "
        "predict its multi-node rows. unseen-hardware: predict every multi-GPU row from the "
        "single-GPU rows and the default calibration refitted without any row of this "
        "folder's hardware (as is when the default never saw it). probed: as unseen-hardware, "
        "then refitted on the rows a probe measures (at most 2 nodes of at most 2 GPUs), "
        "predicting every other multi-GPU row. A predicted row never enters the fit.",
    )
    p.add_argument("--traces", required=True, metavar="DIR", help="Pollux-format trace folder")
    p.add_argument("--protocol", required=True, choices=PROTOCOLS)
    p.add_argument("--models", nargs="+", help="only hold out these models")
    p.add_argument("--no-learned", action="store_true", help="physics model only")
    p.add_argument(
        "--calibration",
        metavar="CAL.json",
        help="unseen-hardware, probed: start from this calibration instead of the default",
    )
    p.add_argument("--data-root", metavar="DIR",
                   help="unseen-hardware, probed: where the calibration's other trace sets are "
                   "(default $SRIFTY_SHARED_DATA or ../shared/data)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lightning_srifty.fit.validation import cross_validate, summarise
    from lightning_srifty.io.calibration_io import calibration_or_default
    from lightning_srifty.io.traces import load_traces

    traces = load_traces(args.traces)
    base = None
    if args.protocol in ("unseen-hardware", "probed"):
        base = calibration_or_default(args.calibration)
    results = cross_validate(
        traces,
        args.protocol,
        learned=not args.no_learned,
        models=args.models,
        base=base,
        data_root=args.data_root,
    )
    summary = summarise(results, args.protocol)
    summary["hardware"] = traces.hardware.describe()
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"srifty validate --protocol {args.protocol} ({traces.hardware.describe()})"
    )
    for column in ("model", "rows", "median error", "p90 error", "bias", "in interval"):
        table.add_column(column, justify="left" if column == "model" else "right")
    rows = [*summary["models"].items(), ("overall", summary["overall"])]
    for name, m in rows:
        table.add_row(
            name,
            str(m["rows"]),
            f"{100 * m['median_ape']:.1f}%",
            f"{100 * m['p90_ape']:.1f}%",
            f"{100 * m['median_signed']:+.1f}%",
            f"{100 * m['interval_coverage']:.0f}%",
        )
    Console().print(table)
    return 0
