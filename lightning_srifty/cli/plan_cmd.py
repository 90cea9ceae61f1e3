"""``srifty plan``: not implemented yet."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds the ``plan`` sub-command (placeholder until its issue lands)."""
    p = sub.add_parser("plan", help="(coming soon)")
    p.set_defaults(func=lambda args: print("srifty plan: not implemented yet") or 3)
