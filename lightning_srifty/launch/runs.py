"""Run folders of ``srifty-launch``: one per launch, continued only on request, never cleaned.

Each launch gets a fresh folder (``srifty_runs/<script>-<time>`` unless ``--run-dir``
names one) holding its profile, checkpoints, progress and logs. A folder that already
holds a run is never reused silently: running into it again would restore the finished
run's checkpoint and either train without end or crash, and the earlier profile would
be lost. ``--resume RUN_DIR`` continues such a run from its newest checkpoint without
profiling again; it finds the original command in ``run.json``.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lightning_srifty.core.errors import ConfigError, SchemaError
from lightning_srifty.core.validate import Reader, check_version
from lightning_srifty.io.jsonfile import read_json, write_json_atomic

RUNS_ROOT = Path("srifty_runs")
RUN_RECORD = "run.json"
RUN_SCHEMA_VERSION = 1
RUN_MARKERS = (RUN_RECORD, "profile.json", "checkpoints", "profile-progress.jsonl")
"""What a folder holding a run has (any one is enough)."""


@dataclass(frozen=True)
class RunRecord:
    """How a run was launched, so ``--resume`` can continue it as it was."""

    argv: tuple[str, ...]
    """The launcher's command line, script path made absolute, without ``--run-dir``."""
    created_at: str

    def to_dict(self) -> dict[str, object]:
        return {
            "schema_version": RUN_SCHEMA_VERSION,
            "kind": "srifty-run",
            "argv": list(self.argv),
            "created_at": self.created_at,
        }


def default_run_dir(script: str, now: dt.datetime | None = None) -> Path:
    """``srifty_runs/<script name>-<local time>`` (not created)."""
    stamp = (now or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(script).stem) or "run"
    return RUNS_ROOT / f"{stem}-{stamp}"


def run_contents(folder: Path) -> list[str]:
    """The run markers ``folder`` holds (empty: no run there)."""
    return [name for name in RUN_MARKERS if (folder / name).exists()]


def claim_run_dir(requested: Path | None, script: str) -> Path:
    """Creates the folder of a new run and returns it.

    Args:
        requested: ``--run-dir``, or ``None`` for a fresh default folder.
        script: The training script (names the default folder).

    Raises:
        ConfigError: ``requested`` already holds a run (the message names ``--resume``).
    """
    if requested is not None:
        found = run_contents(requested)
        if found:
            raise ConfigError(
                f"--run-dir {requested} already holds a run ({', '.join(found)}); continue it "
                f"with --resume {requested}, or leave out --run-dir for a new folder"
            )
        requested.mkdir(parents=True, exist_ok=True)
        return requested
    base = default_run_dir(script)
    for n in range(1, 1000):
        candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            candidate.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            continue
        return candidate
    raise ConfigError(f"no free run folder next to {base}; pass --run-dir")


def write_run_record(folder: Path, argv: Sequence[str]) -> Path:
    """Writes ``run.json`` (the command to continue with ``--resume``)."""
    record = RunRecord(tuple(argv), dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    path = folder / RUN_RECORD
    write_json_atomic(path, record.to_dict())
    return path


def read_run_record(folder: Path) -> RunRecord:
    """The record of the run in ``folder``; a one-line :class:`ConfigError` if none."""
    path = folder / RUN_RECORD
    if not path.is_file():
        what = "does not exist" if not folder.is_dir() else f"has no {RUN_RECORD}"
        raise ConfigError(
            f"--resume {folder}: the folder {what}; give the folder of an earlier "
            "srifty-launch run (srifty_runs/<script>-<time>)"
        )
    r = Reader(read_json(path, SchemaError), source=str(path))
    check_version(r, RUN_SCHEMA_VERSION, kind="run record")
    argv = r.raw("argv", None)
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise r.fail("argv", "expected a list of strings")
    return RunRecord(tuple(argv), r.str("created_at", ""))


STARTUPS_FILE = "startups.json"
STARTUPS_SCHEMA_VERSION = 1


def record_startup(folder: Path, backend: str, seconds: float) -> None:
    """Adds one attempt's measured start-up (launch call to first step) to the run's
    ``startups.json``, so a ``--resume`` prices its moves at them as the run did."""
    kept = read_startups(folder)
    entries = [{"backend": b, "seconds": s} for b, s in kept] + [
        {"backend": backend, "seconds": seconds}
    ]
    write_json_atomic(
        folder / STARTUPS_FILE,
        {"schema_version": STARTUPS_SCHEMA_VERSION, "kind": "srifty-startups", "startups": entries},
    )


def read_startups(folder: Path, backend: str | None = None) -> tuple[tuple[str, float], ...]:
    """``(backend, seconds)`` of every start-up the run measured (only ``backend``'s when
    given: a start-up on this machine says nothing about a cloud launch); ``()`` when
    none was recorded."""
    path = folder / STARTUPS_FILE
    if not path.is_file():
        return ()
    r = Reader(read_json(path, SchemaError), source=str(path))
    check_version(r, STARTUPS_SCHEMA_VERSION, kind="start-up record")
    out = []
    for entry in r.children("startups"):
        name = entry.str("backend")
        seconds = entry.float("seconds", minimum=0.0)
        if backend is None or name == backend:
            out.append((name, seconds))
    return tuple(out)


def next_attempt(folder: Path) -> int:
    """The first attempt number not used in ``folder`` (attempts of a resumed run follow
    the earlier ones; nothing is overwritten)."""
    used = [0]
    for path in folder.glob("progress-*.jsonl"):
        number = path.stem.removeprefix("progress-")
        if number.isdigit():
            used.append(int(number))
    for path in folder.glob("attempt-*"):
        number = path.name.removeprefix("attempt-")
        if number.isdigit():
            used.append(int(number))
    return max(used) + 1
