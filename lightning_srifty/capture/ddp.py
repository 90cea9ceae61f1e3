"""DDP communication hook that times each gradient bucket's all-reduce.

PyTorch cannot unregister a communication hook (``register_comm_hook`` may be called
once per ``DistributedDataParallel``), so after the profiling window the hook becomes a
pass-through: it calls the stock ``allreduce_hook`` with no timing, which is exactly
what DDP does without a hook (all-reduce the bucket, divide by world size).
"""

# No ``from __future__ import annotations`` here: DDP's ``_check_comm_hook`` compares the
# hook's real annotations with ``dist.GradBucket``, and strings would fail that check.
import atexit
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

log = logging.getLogger(__name__)


@dataclass
class RawBucketEvent:
    """Clock marks for one bucket in one step; resolved later by the callback."""

    index: int
    bytes: int
    num_params: int
    ready_mark: Any
    done_mark: Any = None


@dataclass
class BucketRecorder:
    """State of the communication hook; ``active`` is on only inside the window.

    Attributes:
        mark: Returns a clock mark (``perf_counter`` value on CPU, a recorded CUDA
            event on GPU); the callback resolves marks into seconds at step end, so
            the hook never synchronises.
        process_group: Group to all-reduce over (``None``: the default group).
    """

    mark: Callable[[], Any]
    process_group: Optional[dist.ProcessGroup] = None  # noqa: UP045
    active: bool = False
    events: list[RawBucketEvent] = field(default_factory=list)

    def take(self) -> list[RawBucketEvent]:
        """Returns this step's events and starts a new step."""
        events, self.events = self.events, []
        return events


def timed_allreduce_hook(
    recorder: BucketRecorder, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """``allreduce_hook`` semantics, plus a mark when the bucket is ready and done."""
    group = recorder.process_group or dist.group.WORLD
    assert group is not None, "torch.distributed is not initialised"
    if not recorder.active:
        return default_hooks.allreduce_hook(group, bucket)
    buffer = bucket.buffer()
    event = RawBucketEvent(
        index=bucket.index(),
        bytes=buffer.numel() * buffer.element_size(),
        num_params=len(bucket.parameters()),
        ready_mark=recorder.mark(),
    )
    recorder.events.append(event)
    world = dist.get_world_size(group)
    buffer.div_(world)
    work = dist.all_reduce(buffer, group=group, async_op=True)
    assert work is not None

    def finished(fut: torch.futures.Future[Any]) -> torch.Tensor:
        event.done_mark = recorder.mark()
        value: torch.Tensor = fut.value()[0]
        return value

    return work.get_future().then(finished)


def attach(ddp_model: Any, recorder: BucketRecorder) -> bool:
    """Registers the hook on a ``DistributedDataParallel``; False if it cannot.

    A model that already has a communication hook (the user's own, or Lightning's
    ``ddp_comm_hook``) keeps it; we then profile without bucket timings rather than
    change what the user's training does.
    """
    if not isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel):
        return False
    try:
        ddp_model.register_comm_hook(recorder, timed_allreduce_hook)
    except RuntimeError:
        return False
    return True


def release_gloo_group_at_exit() -> None:
    """Destroys the gloo process groups when the interpreter exits, while it is still alive.

    Lightning never destroys the process group, and most scripts do not either. Gloo's
    worker threads may then still hold finished work (and Python completion callbacks,
    such as this module's timing hook) when the interpreter is torn down; destroying
    them there aborts the process with "terminate called without an active exception"
    (seen on a finished two-process run). PyTorch's own ``destroy_process_group`` names
    the cause and the cure: wait for pending hooks and shut the backends down before the
    interpreter exits (pytorch/pytorch#65513 did the same for its own gloo tests).

    Called only after a fit that ended normally: after a failure another rank may be
    stuck in a collective, and shutting down could then wait on it. NCCL groups are left
    alone: their destructor warns but does not abort, and its shutdown can be collective.
    Registered once per process (a second fit replaces the first registration); a
    script that destroys the group itself is left as is.
    """
    atexit.unregister(_destroy_gloo_group)
    atexit.register(_destroy_gloo_group)


def _destroy_gloo_group() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() != dist.Backend.GLOO:
        return
    try:
        dist.destroy_process_group()
    except Exception as exc:  # exiting anyway: say why, never mask the exit code
        log.warning("could not destroy the gloo process group at exit: %s", exc)
