"""``python -m lightning_srifty.capture.entry SCRIPT [ARGS]``: the profiling run's start.

Runs the user's script as ``python SCRIPT ARGS`` would (``__main__``, ``sys.argv``, the
script's folder first on ``sys.path``), after :func:`~lightning_srifty.capture.
script_facts.install` has wrapped ``Trainer`` so that the profile records what the script
fixes in its own ``Trainer(...)`` and a script without the callback stops at ``fit``.
Processes that Lightning starts itself (``devices=2`` on one machine) re-run the script
directly, without this module, and need none of it.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m lightning_srifty.capture.entry SCRIPT [ARGS]", file=sys.stderr)
        return 2
    script = args[0]
    from lightning_srifty.capture.script_facts import install

    install()
    sys.argv = [script, *args[1:]]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
