"""``srifty validate``: held-out accuracy of the performance model on trace folders."""

from __future__ import annotations

import argparse
import json

import numpy as np

from lightning_srifty.io.calibration_io import PROTOCOLS


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds the ``validate`` sub-command."""
    p = sub.add_parser(
        "validate",
        help="held-out prediction error on Pollux-format traces",
        description="lomo: calibrate on the other models, predict this model's multi-GPU "
        "rows from its single-GPU rows. scale-out: also calibrate on its single-node rows, "
        "predict its multi-node rows. A predicted row never enters the fit.",
    )
    p.add_argument("--traces", required=True, metavar="DIR", help="Pollux-format trace folder")
    p.add_argument("--protocol", required=True, choices=PROTOCOLS)
    p.add_argument("--models", nargs="+", help="only hold out these models")
    p.add_argument("--no-learned", action="store_true", help="physics model only")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def summarise(results: list, protocol: str) -> dict:  # type: ignore[type-arg]
    """Median and p90 absolute percentage error per model and overall."""
    per_model = {
        r.model: {
            "rows": len(r.rows),
            "median_ape": float(np.median(r.ape)),
            "p90_ape": float(np.quantile(r.ape, 0.9)),
        }
        for r in results
        if len(r.rows)
    }
    every = np.concatenate([r.ape for r in results if len(r.rows)])
    return {
        "protocol": protocol,
        "models": per_model,
        "overall": {
            "rows": int(every.size),
            "median_ape": float(np.median(every)),
            "p90_ape": float(np.quantile(every, 0.9)),
        },
    }


def run(args: argparse.Namespace) -> int:
    from lightning_srifty.io.calibration_io import cross_validate
    from lightning_srifty.io.traces import load_traces

    traces = load_traces(args.traces)
    results = cross_validate(traces, args.protocol, learned=not args.no_learned, models=args.models)
    summary = summarise(results, args.protocol)
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"srifty validate --protocol {args.protocol} ({traces.hardware.describe()})"
    )
    for column in ("model", "rows", "median error", "p90 error"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for name, m in summary["models"].items():
        table.add_row(name, str(m["rows"]), f"{100 * m['median_ape']:.1f}%",
                      f"{100 * m['p90_ape']:.1f}%")  # fmt: skip
    o = summary["overall"]
    table.add_row("overall", str(o["rows"]), f"{100 * o['median_ape']:.1f}%",
                  f"{100 * o['p90_ape']:.1f}%")  # fmt: skip
    Console().print(table)
    return 0
