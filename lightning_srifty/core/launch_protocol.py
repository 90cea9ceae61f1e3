"""The contract between ``srifty-launch`` and the callback inside the user's script.

The launcher never imports the user's code; it talks to :class:`SriftyCallback`
through environment variables (launcher → job) and a JSON-lines progress file
(job → launcher). Both sides import the names from here so they cannot drift apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from lightning_srifty.core.errors import ConfigError, SchemaError
from lightning_srifty.core.validate import Reader

ENV_MODE = "SRIFTY_MODE"
"""``profile``: profile, checkpoint, stop cleanly. ``train``: resume and run to target.
``probe``: resume, run a few steps to measure them, and stop without writing anything."""
MODE_PROFILE = "profile"
MODE_TRAIN = "train"
MODE_PROBE = "probe"
MODES = (MODE_PROFILE, MODE_TRAIN, MODE_PROBE)
RUNNING_MODES = (MODE_TRAIN, MODE_PROBE)
"""Modes that resume the newest checkpoint and run to a target."""

ENV_PROFILE_PATH = "SRIFTY_PROFILE_PATH"
ENV_CHECKPOINT_URI = "SRIFTY_CHECKPOINT_URI"
ENV_TARGET_STEPS = "SRIFTY_TARGET_STEPS"
"""Stop once this many steps (batches of the training loop, from the run's first) ran."""
ENV_TARGET_EPOCHS = "SRIFTY_TARGET_EPOCHS"
"""Train this many epochs (``--epochs``): counted by the job, right on any world size."""
ENV_JOB_STEPS = "SRIFTY_JOB_STEPS"
"""The whole job's length in steps, told to the profiling run (which trains only its
window): the callback lets a window of tiny steps grow by at most half of it."""
ENV_JOB_EPOCHS = "SRIFTY_JOB_EPOCHS"
"""The same for a job measured in epochs (``--epochs``)."""
ENV_WORLD_SIZE = "SRIFTY_WORLD_SIZE"
"""Processes the launcher started; the callback stops when the Trainer sees another number."""
ENV_PROGRESS_PATH = "SRIFTY_PROGRESS_PATH"
ENV_PROGRESS_STDOUT = "SRIFTY_PROGRESS_STDOUT"
"""``1``: rank zero also prints progress lines to stdout (cloud runs: read from the log)."""
PROGRESS_LINE_PREFIX = "SRIFTY_PROGRESS "
"""What starts a progress line in a job's log; the JSON event follows."""
ENV_CHECKPOINT_INTERVAL_S = "SRIFTY_CHECKPOINT_INTERVAL_S"
ENV_CHECKPOINT_EVERY_STEPS = "SRIFTY_CHECKPOINT_EVERY_STEPS"
"""Also checkpoint every N steps (whichever of time and steps comes first)."""
ENV_KEEP_CHECKPOINTS = "SRIFTY_KEEP_CHECKPOINTS"
"""How many checkpoints the store retains (default 3)."""
ENV_STATE_DIR = "SRIFTY_STATE_DIR"
"""Per-attempt folder; the callback drops markers (attached, preempted) here."""
ENV_S3_ENDPOINT_URL = "SRIFTY_S3_ENDPOINT_URL"
ENV_IMDS = "SRIFTY_IMDS"
"""EC2 metadata look-ups: ``auto`` (default: only where the DMI vendor says EC2),
``on`` (always, e.g. a test's local service) or ``off`` (never)."""

ATTACHED_MARKER = "callback-attached"
"""Written at setup, so the launcher can tell "no callback" from "crashed early"."""
PREEMPTED_MARKER = "preempted"
"""Written after an emergency checkpoint on a preemption notice."""
FAILURE_MARKER = "failure"
"""Written by the callback with a one-line reason before it stops a misconfigured run."""
SHORT_PROFILE_MARKER = "profile-too-short"
"""Written by the profiling run when training ended before the window was measured,
with a one-line reason naming the limit that stopped it."""
TRAINING_ENDED_MARKER = "training-ended"
"""Written by the profiling run when the script's own Trainer ended training inside the
window (``EarlyStopping``, ``max_epochs``, ...), with a one-line reason: the run is done."""
NO_CALLBACK_MARKER = "no-callback"
"""Written by the profiling run when ``Trainer.fit`` starts without the callback."""
NO_CALLBACK_EXIT_CODE = 3
NO_CALLBACK_MESSAGE = (
    "the script's Trainer has no SriftyCallback: add `from lightning_srifty import "
    "SriftyCallback` and `Trainer(callbacks=[SriftyCallback()])`; nothing was trained"
)
"""The profiling run's exit status when the script's Trainer has no callback."""
NO_GPU_FOR_PROFILE_MARKER = "no-gpu-for-profile"
"""Written by the profiling run when the script's ``Trainer(accelerator="gpu")`` finds
no GPU to profile on, with the one-line reason and what to do."""
PREEMPTED_EXIT_CODE = 75
"""The job's exit status after an emergency checkpoint (``EX_TEMPFAIL``: try again)."""

STACK_DUMP_SIGNAL = "SIGUSR2"
"""The signal on which a launched job writes every thread's stack to its log
(``faulthandler``, from C, so a process stuck in native code answers too). The local
backend sends it to a process still alive when a revocation's grace after SIGTERM ends,
just before SIGKILL: the log then says where it hung."""
ENV_STALL_DUMP_S = "SRIFTY_STALL_DUMP_S"
"""Seconds without a progress line after which a running job writes every thread's stack
to its log itself (the launcher sets it under its stall limit, so the stacks are there
before the job is stopped as hung, whatever the backend)."""
STALL_DUMP_SHARE = 0.9
"""The share of the launcher's stall limit after which a silent job dumps its stacks."""

NO_GPU_EXIT_CODE = 4
"""A node SkyPilot gave GPUs on which torch sees fewer than the job needs: the run
stops before training (never trains on CPU instead)."""
ENV_TORCH_VERSION = "SRIFTY_TORCH_VERSION"
"""The torch version the profile ran with (public part: ``2.13.0`` of ``2.13.0+cu126``);
cloud nodes install exactly this one, from the CUDA build their GPU and image support."""
ENV_LIGHTNING_VERSION = "SRIFTY_LIGHTNING_VERSION"
"""The Lightning version the profile ran with; cloud nodes install exactly this one."""
ENV_GPU_CHECK = "SRIFTY_GPU_CHECK"
"""``0`` skips the node's GPU check (a test harness that pretends to have GPUs)."""

TRAINER_ENV_PREFIX = "PL_TRAINER_"
"""Lightning reads ``PL_TRAINER_<ARG>`` as the default of each ``Trainer`` argument
(``lightning/pytorch/utilities/argparse.py``: ``_defaults_from_env_vars``), so the
launcher can shape an unchanged ``Trainer(...)``; arguments the script passes win."""


def trainer_env(
    *,
    nodes: int,
    devices_per_node: int,
    root_dir: str | None,
    strategy: str = "ddp",
    accelerator: str | None = None,
) -> dict[str, str]:
    """``PL_TRAINER_*`` defaults that make a plain ``Trainer`` run the planned job.

    ``devices``, ``num_nodes`` and (for more than one process) ``strategy`` (``"ddp"``, or
    a DDP flavour the job needs) give a DDP job of ``nodes * devices_per_node`` processes
    under torchrun; ``default_root_dir``
    keeps Lightning's logs and checkpoints in the run folder, not the working directory.
    ``accelerator`` (``"gpu"`` on GPU nodes) keeps Lightning's ``auto`` from falling back
    to the CPU without a word when torch cannot use the GPUs: it fails instead.
    """
    if nodes < 1 or devices_per_node < 1:
        raise ValueError(f"nodes and devices must be >= 1, got {nodes} x {devices_per_node}")
    env = {
        f"{TRAINER_ENV_PREFIX}DEVICES": str(devices_per_node),
        f"{TRAINER_ENV_PREFIX}NUM_NODES": str(nodes),
        ENV_WORLD_SIZE: str(nodes * devices_per_node),
    }
    if root_dir is not None:
        env[f"{TRAINER_ENV_PREFIX}DEFAULT_ROOT_DIR"] = root_dir
    if nodes * devices_per_node > 1:
        env[f"{TRAINER_ENV_PREFIX}STRATEGY"] = strategy
    if accelerator is not None:
        env[f"{TRAINER_ENV_PREFIX}ACCELERATOR"] = accelerator
    return env


def public_version(version: str) -> str:
    """``2.13.0`` of ``2.13.0+cu126``: the local label names the build, not the release,
    and the node picks its own build."""
    return version.split("+", 1)[0].strip()


def stack_env(torch_version: str, lightning_version: str) -> dict[str, str]:
    """The profiled torch and Lightning versions for the nodes to install.

    Raises:
        ConfigError: a version is empty or not a release a node can install from an
            index (a source build such as ``2.13.0a0+git1234`` is refused by pip there).
    """
    env = {}
    for name, raw in (
        (ENV_TORCH_VERSION, torch_version),
        (ENV_LIGHTNING_VERSION, lightning_version),
    ):
        version = public_version(raw)
        local = raw.partition("+")[2]
        if not _RELEASE.fullmatch(version) or local.startswith("git"):
            raise ConfigError(
                f"the profile's {name.removeprefix('SRIFTY_').lower()} {raw!r} is not a "
                "release a node can install; profile with a released torch and Lightning"
            )
        env[name] = version
    return env


_RELEASE = re.compile(r"[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?")


def lightning_cli_args(env: Mapping[str, str], *, keep: Collection[str] = ()) -> list[str]:
    """The ``PL_TRAINER_*`` settings of ``env`` as LightningCLI arguments.

    LightningCLI passes every ``Trainer`` argument explicitly, so the environment
    defaults never reach it; ``--trainer.devices=2`` (after the script's own arguments,
    so they win over its config files) does. Arguments in ``keep`` are the script's
    own (its config sets them) and are left alone.
    """
    out = []
    for key, value in env.items():
        if not key.startswith(TRAINER_ENV_PREFIX):
            continue
        name = key[len(TRAINER_ENV_PREFIX) :].lower()
        if name not in keep:
            out.append(f"--trainer.{name}={value}")
    return out


PROGRESS_EVENTS = (
    "start",
    "resumed",
    "step",
    "checkpoint",
    "profile-done",
    "done",
    "preempted",
    "collective",
    "validating",
)
"""``collective``: a probe's all-reduce timings (:attr:`ProgressEvent.allreduce`).
``validating``: a validation pass is running (a heartbeat while it lasts, so the
launcher's stall watchdog does not take a long pass for a hang)."""


@dataclass(frozen=True)
class ProgressEvent:
    """One line of the progress file, written by rank zero of the job."""

    event: str
    time: float
    """Unix time of the event."""
    step: int
    """Steps reached: batches of the training loop on every process, counted from the
    run's first batch (not Lightning's ``global_step``, which counts optimizer steps)."""
    step_s: float = 0.0
    """Mean step time over the steps since the previous ``step`` event."""
    checkpoint: str = ""
    """Checkpoint id for ``checkpoint``/``resumed``/``preempted`` events."""
    world_size: int = 1
    allreduce: tuple[tuple[int, float], ...] = ()
    """``collective`` events: ``(bytes, seconds)`` of an all-reduce among every process,
    per buffer size (a probe's collective-bandwidth measurement)."""
    reason: str = ""
    """``done`` events before the launcher's target: the script's own rule that ended
    training (``"its Trainer(max_time=...) was reached ..."``), in words."""

    def to_line(self) -> str:
        data = asdict(self)
        if not self.allreduce:
            del data["allreduce"]
        if not self.reason:
            del data["reason"]
        return json.dumps(data, separators=(",", ":"))

    @staticmethod
    def from_line(line: str, *, source: str | None = None) -> ProgressEvent:
        try:
            data: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"bad progress line ({exc.msg})", source=source) from None
        r = Reader(data, source=source)
        return ProgressEvent(
            event=r.choice("event", PROGRESS_EVENTS),
            time=r.float("time"),
            step=r.int("step", minimum=0),
            step_s=r.float("step_s", 0.0, minimum=0.0),
            checkpoint=r.str("checkpoint", ""),
            world_size=r.int("world_size", 1, minimum=1),
            allreduce=_timings(r),
            reason=r.str("reason", ""),
        )


def _timings(r: Reader) -> tuple[tuple[int, float], ...]:
    """A progress line's ``allreduce`` pairs, checked."""
    raw = r.raw("allreduce", [])
    ok = isinstance(raw, list) and all(
        isinstance(x, list)
        and len(x) == 2
        and isinstance(x[0], int)
        and x[0] > 0
        and isinstance(x[1], int | float)
        and x[1] > 0
        for x in raw
    )
    if not ok:
        raise r.fail("allreduce", f"expected a list of [bytes, seconds] pairs, got {raw!r}")
    return tuple((int(b), float(s)) for b, s in raw)


def progress_from_log_line(line: str, *, source: str | None = None) -> ProgressEvent | None:
    """The event in one line of a job's log, or ``None`` for any other line.

    Log streams may prefix lines (SkyPilot adds ``(head, rank=0, ...)``), so the marker
    is searched anywhere in the line.
    """
    at = line.find(PROGRESS_LINE_PREFIX)
    if at < 0:
        return None
    return ProgressEvent.from_line(line[at + len(PROGRESS_LINE_PREFIX) :].strip(), source=source)
