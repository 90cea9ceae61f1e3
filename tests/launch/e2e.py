"""What end-to-end tests of ``srifty-launch`` read back: the job's own progress lines and
the run folder the command made."""

from __future__ import annotations

from pathlib import Path

from lightning_srifty.core.launch_protocol import ProgressEvent


def events(run: Path, name: str) -> list[ProgressEvent]:
    """The progress events rank zero wrote to ``run/name``."""
    lines = (run / name).read_text().splitlines()
    return [ProgressEvent.from_line(line) for line in lines if line.strip()]


def only_run(root: Path) -> Path:
    """The one run folder the command made under ``root/srifty_runs``."""
    runs = sorted((root / "srifty_runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]
