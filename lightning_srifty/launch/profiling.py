"""Step 1 of ``srifty-launch``: run the user's script in profile mode on this machine.

The script runs as the user wrote it (its own output and traceback go straight to the
terminal), started through :mod:`lightning_srifty.capture.entry` so the profile records
what its ``Trainer(...)`` fixes and a script without the callback stops at ``fit``; the
launcher only sets environment variables that put :class:`SriftyCallback` into profile
mode. The callback profiles its window, saves a
checkpoint into the store, writes the profile and ends training cleanly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.errors import LaunchError
from lightning_srifty.core.profile import Profile
from lightning_srifty.io.profile_io import load_profile

PROFILE_ENTRY = "lightning_srifty.capture.entry"
"""Runs the script as ``python SCRIPT`` would, recording what its ``Trainer(...)`` fixes
and stopping at ``fit`` when the callback is missing."""


@dataclass(frozen=True)
class ProfileRun:
    """What the profiling run left behind."""

    profile: Profile
    profile_path: Path
    exit_code: int
    ended_at_step: int | None = None
    """Set where the script's own Trainer ended training inside the profiling window
    (``EarlyStopping``, ``max_epochs``): the job is done at that step."""
    ended_why: str = ""
    """The script's rule that ended it, in words."""
    startup_s: float | None = None
    """Seconds from its start to its first progress line: how long this job's start-up
    (imports, ``prepare_data``, the loaders' first batches) takes here."""


POLL_S = 0.5


def _wait_watching(
    process: subprocess.Popen[bytes],
    progress: Path,
    script: str,
    timeout_s: float | None,
    stall_timeout_s: float | None,
) -> tuple[int, float | None]:
    """Waits for the profiling run's exit code and the seconds to its first progress
    line; raises when it runs past ``timeout_s`` or its progress file stops growing for
    ``stall_timeout_s`` after its first line. A start-up silent that long is told once
    (it runs here, in the user's sight: not stopped)."""
    started = heard_at = time.monotonic()
    size = 0
    first_line_s: float | None = None
    told = False
    while True:
        try:
            return process.wait(timeout=POLL_S), first_line_s
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if timeout_s is not None and now - started > timeout_s:
            raise LaunchError(f"{script} did not finish profiling within {timeout_s:.0f} s")
        grown = progress.stat().st_size if progress.exists() else 0
        if grown and first_line_s is None:
            first_line_s = now - started
        if not grown and not told and stall_timeout_s is not None:
            if now - started > stall_timeout_s:
                told = True
                print(
                    f"srifty: {script} has run {now - started:.0f} s and not reached its first "
                    "training step (its imports, prepare_data, setup or its loaders' first "
                    "batches); still waiting. Ctrl-C stops it and shows where it was",
                    file=sys.stderr,
                )
        if grown != size:
            size, heard_at = grown, now
        elif size and stall_timeout_s is not None and now - heard_at > stall_timeout_s:
            raise LaunchError(
                f"{script} hung while profiled: no progress line for {now - heard_at:.0f} s "
                "(--stall-timeout); it was stopped and nothing was launched. Run it again; "
                "if a checkpoint save or epoch-end work of its own takes longer, raise "
                "--stall-timeout"
            )


def profile_env(
    *, run_dir: Path, checkpoint_uri: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment of the profiling run (inherits ours, plus the launcher protocol)."""
    env = dict(os.environ)
    env.update(extra or {})
    env[proto.ENV_MODE] = proto.MODE_PROFILE
    env[proto.ENV_PROFILE_PATH] = str(run_dir / "profile.json")
    env[proto.ENV_CHECKPOINT_URI] = checkpoint_uri
    env[proto.ENV_STATE_DIR] = str(run_dir / "profile-state")
    env[proto.ENV_PROGRESS_PATH] = str(run_dir / "profile-progress.jsonl")
    # One process (the profile is a single device's), Lightning's logs in the run folder.
    env.update(proto.trainer_env(nodes=1, devices_per_node=1, root_dir=str(run_dir / "lightning")))
    return env


def run_profile(
    script: str,
    script_args: Sequence[str],
    *,
    run_dir: Path,
    checkpoint_uri: str,
    extra_env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    timeout_s: float | None = None,
    stall_timeout_s: float | None = None,
) -> ProfileRun:
    """Runs ``script`` once in profile mode and returns its profile.

    Args:
        stall_timeout_s: The run hangs once it has written a progress line and then
            none for this long (``--stall-timeout``); it is killed and the launch stops.
            ``None``: never watched.

    Raises:
        LaunchError: the script is missing, crashed, hung, has no ``SriftyCallback``,
            or ended before the profiling window completed. The message says which.
    """
    path = Path(script)
    if not path.is_file():
        raise LaunchError(f"script not found: {script}")
    env = profile_env(run_dir=run_dir, checkpoint_uri=checkpoint_uri, extra=extra_env)
    state_dir = Path(env[proto.ENV_STATE_DIR])
    state_dir.mkdir(parents=True, exist_ok=True)
    profile_path = Path(env[proto.ENV_PROFILE_PATH])
    process = subprocess.Popen(  # noqa: S603 - argv list; args reach the script verbatim
        [python, "-m", PROFILE_ENTRY, str(path), *script_args],
        env=env,
        stdin=subprocess.DEVNULL,
    )
    try:
        code, startup_s = _wait_watching(
            process, Path(env[proto.ENV_PROGRESS_PATH]), script, timeout_s, stall_timeout_s
        )
    finally:
        if process.poll() is None:
            process.kill()  # its DataLoader workers end with it
            process.wait()
    attached = (state_dir / proto.ATTACHED_MARKER).exists()
    if (state_dir / proto.NO_CALLBACK_MARKER).exists():
        raise LaunchError(f"{script}: {proto.NO_CALLBACK_MESSAGE}")
    no_gpu = state_dir / proto.NO_GPU_FOR_PROFILE_MARKER
    if no_gpu.exists():
        raise LaunchError(f"{script}: {no_gpu.read_text().strip()}")
    if code != 0:
        where = "during profiling" if attached else "before SriftyCallback was set up"
        raise LaunchError(
            f"{script} crashed {where} (exit code {code}); its own traceback is above"
        )
    if not attached:
        raise LaunchError(f"{script}: {proto.NO_CALLBACK_MESSAGE}")
    if not profile_path.exists():
        short = state_dir / proto.SHORT_PROFILE_MARKER
        why = short.read_text().strip() if short.exists() else ""
        raise LaunchError(
            f"{script}: {why or 'training ended before the profiling window completed'}; "
            "srifty never lifts the script's own limits: let it train longer (raise them, "
            "or more data) or lower SriftyCallback(warmup_steps=..., profile_steps=...)"
        )
    ended = state_dir / proto.TRAINING_ENDED_MARKER
    step, _, why = ended.read_text().partition("\n") if ended.exists() else ("", "", "")
    ended_at = int(step) if step.strip().isdigit() else None
    return ProfileRun(
        load_profile(profile_path), profile_path, code, ended_at, why.strip(), startup_s
    )
