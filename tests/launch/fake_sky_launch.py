"""``srifty-launch`` in a process of its own, on the fake SkyPilot API server.

Used by tests/launch/test_launcher_faults.py to send real signals to a real launcher:
``python fake_sky_launch.py STATE_JSON <srifty-launch arguments>`` runs the CLI's own
``main`` with ``--backend sky`` served by :class:`tests.fakes.FakeSkyApi` (virtual time
running 600 times faster than real time), and on the way out writes what the fake
cloud saw to STATE_JSON: the clusters launched, taken down and still up.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from lightning_srifty.cli import launch_cmd
from lightning_srifty.launch import launcher
from tests.fakes import ClusterScript, FakeSkyApi, VirtualClock

# Slow training: the job is still running when the test sends its signal.
FAKE = FakeSkyApi(
    clock=VirtualClock(speed=600.0), scripts=[ClusterScript(provision_s=60, steps_per_s=0.01)]
)


def _backend(options: launcher.LaunchOptions, checkpoint_uri: str) -> Any:
    from lightning_srifty.launch.sky_backend import SkyBackend

    return SkyBackend(
        sdk=FAKE,
        setup="true",
        ship_package=False,
        run_dir=options.run_dir,
        checkpoint_uri=checkpoint_uri,
        keep_clusters=options.keep_clusters,
        clock=FAKE.clock.monotonic,
        sleep=FAKE.clock.sleep,
        log_sleep=FAKE.clock.sleep,
    )


def main() -> int:
    state, argv = Path(sys.argv[1]), sys.argv[2:]
    launcher._make_backend = _backend  # type: ignore[assignment]  # noqa: SLF001
    try:
        return launch_cmd.main(argv)
    finally:
        state.write_text(
            json.dumps(
                {
                    "launched": [name for name, _, _ in FAKE.launched],
                    "downs": FAKE.downs,
                    "left_up": FAKE.left_up(),
                }
            )
        )


if __name__ == "__main__":
    sys.exit(main())
