"""``srifty-launch``: not implemented yet."""

from __future__ import annotations

import sys


def main() -> int:
    print("srifty-launch: not implemented yet", file=sys.stderr)
    return 3
