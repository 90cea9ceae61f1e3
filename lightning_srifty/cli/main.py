"""``srifty``: parse, call, print. No logic lives here.

Each sub-command sits in its own module exposing ``register(subparsers)``; the module
sets ``func`` on its parser. Every :class:`SriftyError` becomes one line on stderr and
its exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from lightning_srifty import __version__
from lightning_srifty.cli import (
    calibrate_cmd,
    down_cmd,
    plan_cmd,
    predict_cmd,
    profile_cmd,
    simulate_cmd,
    validate_cmd,
)
from lightning_srifty.core.errors import SriftyError

COMMANDS = (
    profile_cmd,
    predict_cmd,
    calibrate_cmd,
    validate_cmd,
    plan_cmd,
    simulate_cmd,
    down_cmd,
)


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with a one-line error naming the flag."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="srifty",
        description="Swift and thrifty cloud training for PyTorch Lightning: inspect profiles, "
        "predict step times, calibrate and validate the model, plan VM mixes, replay spot traces.",
    )
    parser.add_argument("--version", action="version", version=f"lightning-srifty {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for module in COMMANDS:
        module.register(sub)
    return parser


def run_guarded(func: Callable[[], int | None]) -> int:
    """Runs ``func``; turns our errors into one line on stderr and an exit code."""
    try:
        return int(func() or 0)
    except SriftyError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt as err:
        # Ctrl-C, or SIGTERM/SIGHUP in srifty-launch (launch/signals.py: Terminated).
        print(str(err) or "interrupted", file=sys.stderr)
        return int(getattr(err, "exit_code", 130))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_guarded(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
