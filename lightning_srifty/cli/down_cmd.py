"""``srifty down RUN_DIR``: takes down every cluster (and managed job) a run started.

The run's ``clusters.json`` lists them; what is already gone is skipped. Useful after
``--keep-clusters``, a crash, or an API server that stayed away during the teardown.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lightning_srifty.core.errors import ConfigError, LaunchError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "down",
        help="take down the clusters a srifty-launch run left up",
        description="Take down every SkyPilot cluster and managed job listed in a run's "
        "clusters.json (started by srifty-launch --backend sky or sky-jobs).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run's --run-dir")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, *, backend: Any = None) -> int:
    """Downs what the ledger lists; ``backend`` replaces the real SDK (tests)."""
    from lightning_srifty.io.cluster_ledger import LEDGER_NAME, ClusterLedger

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"RUN_DIR {run_dir} is not a directory")
    ledger = ClusterLedger(run_dir)
    pending = ledger.not_down()
    if not pending:
        known = "no clusters recorded" if not ledger.entries() else "every cluster is down"
        print(f"{run_dir / LEDGER_NAME}: {known}; nothing to do")
        return 0
    if backend is None:
        from lightning_srifty.launch.sky_client import ApiPatience
        from lightning_srifty.launch.sky_jobs import SkyJobsBackend

        backend = SkyJobsBackend(
            run_dir=run_dir, run_id=ledger.run_id or None, api=ApiPatience(patience_s=120.0)
        )
    names = ", ".join(f"{e.name} ({e.kind})" for e in pending)
    print(f"taking down {names}")
    before = len(getattr(backend, "notes", []))
    try:
        taken = backend.down_recorded()
    except LaunchError as exc:
        raise LaunchError(f"srifty down {run_dir}: {exc}") from None
    for note in getattr(backend, "notes", [])[before:]:
        print(note)
    print(f"down: {', '.join(taken)}")
    return 0
