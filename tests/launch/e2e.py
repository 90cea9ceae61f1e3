"""What end-to-end tests of ``srifty-launch`` read back: the job's own progress lines and
the run folder the command made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_srifty.core.launch_protocol import ProgressEvent


def events(run: Path, name: str) -> list[ProgressEvent]:
    """The progress events rank zero wrote to ``run/name``."""
    lines = (run / name).read_text().splitlines()
    return [ProgressEvent.from_line(line) for line in lines if line.strip()]


def handover_step(run: Path) -> int:
    """The step at which the run's profiling ended and its checkpoint was handed on (its
    warm-up and window; a window of tiny steps grows with the job's length)."""
    events_ = events(run, "profile-progress.jsonl")
    return next(e.step for e in events_ if e.event == "profile-done")


def only_run(root: Path) -> Path:
    """The one run folder the command made under ``root/srifty_runs``."""
    runs = sorted((root / "srifty_runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def preemption_lines(run: Path) -> list[str]:
    """The run's ``migrations.jsonl`` lines: none (and no file) where nothing moved it."""
    path = run / "migrations.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def attempt_logs(root: Path, lines: int = 40) -> str:
    """The last lines of every attempt's node logs under ``root/srifty_runs``: what a
    failed end-to-end run's assertion message shows (CI keeps no run folders)."""
    out = []
    found = (root / "srifty_runs").glob("*/attempt-*/node-*.log")
    for log in sorted(found, key=lambda p: (int(p.parent.name.split("-")[1]), p.name)):
        text = log.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"--- {log.parent.name}/{log.name} ---\n" + "\n".join(text))
    return "\n".join(out[-4:])


def attempt_accounts(run: Path) -> str:
    """Per attempt: the progress events it wrote (first and last three) and every
    ``srifty:`` line of its logs, for an assertion message about what each attempt did."""
    out = []
    for path in sorted(run.glob("progress-*.jsonl"), key=lambda p: int(p.stem.split("-")[1])):
        attempt = path.stem.split("-")[1]
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        shown = lines if len(lines) <= 6 else [*lines[:3], "...", *lines[-3:]]
        said = [
            line
            for log in sorted((run / f"attempt-{attempt}").glob("node-*.log"))
            for line in log.read_text(errors="replace").splitlines()
            if "srifty:" in line or "Signal" in line or "Killed" in line
        ]
        out.append(f"--- attempt {attempt} ---\n" + "\n".join([*shown, *said]))
    return "\n".join(out)


def skypilot_executor(task: Any, cluster_name: str) -> Any:
    """SkyPilot's own managed-job recovery executor for ``task``
    (``sky/jobs/recovery_strategy.py: StrategyExecutor.make``, as its controller builds it)."""
    import asyncio

    from sky import backends
    from sky.jobs import recovery_strategy

    async def make() -> Any:
        return recovery_strategy.StrategyExecutor.make(
            cluster_name,
            backends.CloudVmRayBackend(),
            task,
            job_id=1,
            task_id=0,
            pool=None,
            starting=set(),
            starting_lock=asyncio.Lock(),
            starting_signal=asyncio.Condition(),
        )

    return asyncio.run(make())
