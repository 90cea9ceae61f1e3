"""The one small interface every backend implements: launch, status, stop.

The controller in :mod:`lightning_srifty.launch.controller` drives backends only
through this interface, so the local process backend and SkyPilot are interchangeable.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.cluster import Plan

# Exit code a job uses after saving an emergency checkpoint on a preemption notice,
# so the controller can tell "preempted, state saved" from "crashed".
PREEMPTED_EXIT_CODE = proto.PREEMPTED_EXIT_CODE


class JobState(enum.Enum):
    """Coarse job state every backend maps its own states onto."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"

    @property
    def is_terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.PREEMPTED)


@dataclass(frozen=True)
class LaunchSpec:
    """What to run, independent of where it runs."""

    script: str
    script_args: tuple[str, ...]
    plan: Plan
    envs: Mapping[str, str] = field(default_factory=dict)
    name: str = "srifty"


class Backend(Protocol):
    """Launches a :class:`LaunchSpec`, reports its state, and tears it down."""

    name: str

    def launch(self, spec: LaunchSpec) -> object:
        """Starts the job and returns an opaque handle."""
        ...

    def status(self, handle: object) -> JobState:
        """Current state of the job behind ``handle``."""
        ...

    def stop(self, handle: object) -> None:
        """Stops the job and releases its resources; safe to call twice."""
        ...
