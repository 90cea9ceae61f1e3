"""The only fakes in the test suite: stand-ins for parts that cannot run here.

Everything else in tests is real (Lightning Trainer, torch.distributed on gloo,
sky.Task/sky.Resources, boto3 against moto's standalone server).
"""

from __future__ import annotations

import functools
import http.client
import json
import math
import os
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from lightning_srifty.core.launch_protocol import (
    PREEMPTED_EXIT_CODE,
    PREEMPTED_MARKER,
    PROGRESS_LINE_PREFIX,
    ProgressEvent,
)

# ---------------------------------------------------------------------------------------
# SkyPilot API server (owned by launch/sky_client.py, sky_backend.py and sky_jobs.py)
#
# Every sky.* SDK call goes to a SkyPilot API server that provisions cloud VMs, which
# cannot run here. FakeSkyApi stands in for exactly that surface: the client SDK calls
# the backends make (sky.client.sdk and sky.jobs.client.sdk) and the request/result
# round trip. The tasks it receives are the real sky.Task objects the backends built;
# its answers are SkyPilot's own types (ClusterStatus, JobStatus, ManagedJobStatus,
# StatusResponse, ManagedJobRecord, its exceptions). Time is virtual (VirtualClock):
# the code under test sleeps on it, so a scenario of hours runs in milliseconds.
#
# The state machine follows SkyPilot 0.14's source:
# - Cluster status (sky/backends/backend_utils.py: _update_cluster_status): all nodes
#   terminated -> the record is removed ("cluster gone"); all nodes stopped -> STOPPED;
#   some nodes terminated or not all stopped (a partial spot reclaim) -> INIT
#   ("abnormal", init_kind 'unhealthy'); provisioning in progress -> INIT.
# - job_status/tail_logs/cancel on a cluster that is not UP
#   (sky/backends/backend_utils.py: check_cluster_available): absent -> ClusterDoesNotExist,
#   INIT/STOPPED -> ClusterNotUpError.
# - Job status (sky/skylet/job_lib.py: JobStatus, update_job_status): INIT -> PENDING ->
#   SETTING_UP (setup runs inside the job) -> RUNNING -> SUCCEEDED on exit 0, FAILED on a
#   non-zero exit (our exit 75 after an emergency checkpoint included: the client API
#   has no exit codes, ClusterJobRecord in sky/schemas/api/responses.py drops them),
#   FAILED_SETUP when setup fails. cancel (job_lib.cancel_jobs) sends SIGTERM to the
#   job's process group and sets CANCELLED at once.
# - Launch failures (sky/backends/cloud_vm_ray_backend.py: RetryingVmProvisioner):
#   ResourcesUnavailableError after trying the zones, failed attempts cleaned up.
# - An unreachable server (sky/server/common.py: check_server_healthy_or_start) raises
#   ApiServerConnectionError before any request is sent; a stream cut mid-way raises
#   requests' ChunkedEncodingError (sky/server/rest.py lists these as transient).
# - A server restart (ApiRestart) drops the requests in flight: they are marked
#   CANCELLED with RequestInterruptedError as their error and never resumed
#   (sky/server/uvicorn.py: interrupt_request_for_retry; sky/server/server.py: api_get),
#   so sdk.get re-raises RequestInterruptedError (sky/client/sdk.py: get), or
#   RequestCancelled where an older server stored no error. What the request did before
#   it died stays done. A log stream ends with RequestInterruptedError('Streaming
#   interrupted. Please retry.') (sky/utils/rich_utils.py: decode_rich_status, the RETRY
#   control), which the SDK does not retry for preload_content=False.
# - Launching a cluster name again (sky/execution.py: launch) provisions what an
#   interrupted launch left INIT and reuses an UP cluster, submitting the task as one
#   more job (recorded in duplicate_jobs: a run must never do that). The cluster's job
#   queue (sky/client/sdk.py: queue) lists the job under the task's name.
# - Autostop with down (sky/execution.py: launch, Resources.override_autostop_config;
#   sky/skylet/events.py: AutostopEvent): a cluster takes itself down its idle minutes
#   after its last job ended. A launch request that waits on the server has written no
#   record yet: status lists nothing and down raises ClusterDoesNotExist
#   (sky/core.py: down), though the cluster comes; api_cancel kills the request
#   (sky/server/requests/requests.py: kill_requests). A record can read UP after the
#   nodes are gone unless the refresh is FORCE, while job_status raises CommandError
#   (sky/backends/backend_utils.py: refresh_cluster_record; cloud_vm_ray_backend.py:
#   get_job_status).
# - The jobs controller stops itself once no managed job runs; cancel and queue_v2
#   then raise ClusterNotUpError with status STOPPED (backend_utils.py:
#   is_controller_accessible), and queue_v2(refresh=True) starts it again.
#   queue_v2 returns only the requested fields (sky/jobs/server/core.py: queue_v2_api).
# - Managed jobs (sky/jobs/controller.py: JobController, sky/jobs/recovery_strategy.py,
#   sky/jobs/state.py: ManagedJobStatus): PENDING -> STARTING -> RUNNING; a cluster that
#   is not UP -> RECOVERING -> relaunch on the ordered resources -> RUNNING with
#   recovery_count + 1; a FAILED job on an UP cluster is a user failure unless its exit
#   code is in recover_on_exit_codes (then recovered) or max_restarts_on_errors allows a
#   restart; FAILED_SETUP; no resources on the first launch -> FAILED_NO_RESOURCE; the
#   controller cleans the job's cluster up at the end and on cancel. The exit code of a
#   job that saved its emergency checkpoint is what the task's own run script gives
#   (node_exit_code runs it; sky/backends/task_codegen.py: add_epilogue stores it with
#   job_lib.set_exit_codes), never a number assumed here.
# - Where a recovery relaunches (sky/jobs/recovery_strategy.py): EAGER_NEXT_REGION and
#   FAILOVER launch the ordered resources as given, from #1 (the preempted offer first,
#   see tests/launch/test_sky_recovery.py); SRIFTY_NEXT_OFFER, our plugin strategy, runs
#   launch/sky_recovery.py's own `demote` on them first (the offer the job was
#   preempted on moved last) and only then the list as given. The relaunched cluster
#   runs on the resources SkyPilot launched: the candidate with its region and a zone
#   (RetryingVmProvisioner: to_provision.copy(region=...)); queue_v2 shows them as
#   `cluster_resources` (sky/utils/resources_utils.py: format_resource, with the node
#   count) and `infra` (sky/utils/infra_utils.py: InfraInfo.formatted_str), as
#   sky/jobs/utils.py: _populate_job_record_from_handle does.
# - Plugins (sky/server/plugins.py, sky/server/server.py: list_plugins): the server
#   loads the classes its plugins.yaml names (FakeSkyApi.plugins) and GET /api/plugins
#   lists each one's name; a job_recovery strategy that no loaded plugin registered is
#   refused at submission with ValueError (sky/resources.py:
#   _try_validate_managed_job_attributes, on the API server).
# ---------------------------------------------------------------------------------------

SAVE_S = 5.0
"""Seconds the fake job takes to write an emergency checkpoint."""
TORCHRUN_EXIT_ON_WORKER_FAILURE = 1
"""What torchrun exits with when a worker exits non-zero (75 included): it raises
ChildFailedError (torch/distributed/elastic/multiprocessing/errors). Measured through
SkyPilot's own job program in tests/launch/test_sky_node.py."""


@functools.lru_cache(maxsize=64)
def node_exit_code(run: str | None, *, saved_emergency_checkpoint: bool) -> int:
    """The exit code SkyPilot records for one node of a job whose workers failed.

    Runs the task's own ``run`` script with ``bash -i``, as ``log_lib``'s
    ``run_bash_command_with_log`` does on a node, with a stand-in ``torchrun`` that does
    what the real one does when its workers exit 75 after an emergency checkpoint (they
    leave the ``preempted`` marker in ``SRIFTY_STATE_DIR``; torchrun exits 1). SkyPilot
    stores the script's status as the job's exit code (``sky/backends/task_codegen.py``:
    ``add_epilogue`` -> ``job_lib.set_exit_codes``); test_sky_node.py checks the same
    through SkyPilot's generated job program with real torchrun and Lightning.
    """
    with tempfile.TemporaryDirectory(prefix="srifty-node-") as scratch:
        root = Path(scratch)
        bin_dir = root / "bin"
        bin_dir.mkdir()
        torchrun = bin_dir / "torchrun"
        marker = f'touch "$SRIFTY_STATE_DIR/{PREEMPTED_MARKER}"\n'
        torchrun.write_text(
            "#!/bin/sh\n"
            + (marker if saved_emergency_checkpoint else "")
            + f"exit {TORCHRUN_EXIT_ON_WORKER_FAILURE}\n"
        )
        torchrun.chmod(0o755)
        env = {
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(root),
            "SKYPILOT_NODE_IPS": "10.0.0.1",
            "SKYPILOT_NODE_RANK": "0",
            "SKYPILOT_NUM_NODES": "1",
            "SKYPILOT_NUM_GPUS_PER_NODE": "0",
            "SKYPILOT_TASK_ID": "sky-managed-fake_cluster_1-0",
            "SRIFTY_MASTER_ADDR": "10.0.0.1",
        }
        script = root / "run.sh"
        script.write_text(run or "true")
        proc = subprocess.run(  # noqa: S603 - fixed argv
            ["bash", "-i", str(script)],
            env=env,
            cwd=root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
        return int(proc.returncode)


LOG_EVERY_S = 30.0
"""Virtual seconds between the fake job's progress lines."""
REAL_WAIT_S = 0.05
"""Real seconds a blocked log stream waits before looking at the virtual clock again."""


class VirtualClock:
    """Time for the fake cloud.

    Virtual by default: the code under test sleeps on it (the main thread moves it
    forward) and background threads (log followers) wait for it to move. With
    ``speed``, it runs on its own, ``speed`` virtual seconds per real second, for code
    that keeps real time itself (the launcher's whole journey).
    """

    def __init__(self, wall_start: float = 1_900_000_000.0, *, speed: float | None = None):
        self.speed = speed
        self._now = 0.0
        self._t0 = time.monotonic()
        self._wall0 = wall_start
        self._cond = threading.Condition()
        self._readers: dict[int, float] = {}
        """Open log streams -> the virtual time up to which their reader has everything."""
        self.hold: Callable[[], bool] = lambda: False
        """While true, :meth:`sleep` first gives other threads (briefly) the floor."""

    @property
    def now(self) -> float:
        if self.speed is None:
            return self._now
        return self._now + (time.monotonic() - self._t0) * self.speed

    @now.setter
    def now(self, value: float) -> None:
        if self.speed is None:
            self._now = value
        else:
            self._now = value - (time.monotonic() - self._t0) * self.speed

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self._wall0 + self.now

    @property
    def wall0(self) -> float:
        """Wall time at virtual zero (progress events carry wall time)."""
        return self._wall0

    def sleep(self, seconds: float) -> None:
        """Moves time forward, once every open log stream has been read up to now (so a
        reader in another thread sees the log as a real one would, not late)."""
        if self.speed is not None:
            time.sleep(max(float(seconds), 0.0) / self.speed)
            return
        with self._cond:
            self._cond.wait_for(
                lambda: all(at >= self.now for at in self._readers.values()) and not self.hold(),
                timeout=1.0,
            )
            self._now += max(float(seconds), 0.0)
            self._cond.notify_all()

    def poke(self) -> None:
        """Wakes :meth:`sleep` to look at :attr:`hold` again."""
        with self._cond:
            self._cond.notify_all()

    def reading(self, key: int, at: float | None) -> None:
        """A log stream's reader has everything up to ``at`` (``None``: stream closed)."""
        with self._cond:
            if at is None:
                self._readers.pop(key, None)
            else:
                self._readers[key] = at
            self._cond.notify_all()

    def wait(self, seconds: float) -> None:
        """Blocks a background thread until virtual ``seconds`` have passed (or a short
        real time, so a stopped scenario never hangs it)."""
        if self.speed is not None:
            time.sleep(min(seconds / self.speed, 2.0))
            return
        target = self.now + seconds
        with self._cond:
            self._cond.wait_for(lambda: self.now >= target, timeout=2.0)

    def wait_past(self, moment: float) -> None:
        if self.speed is not None:
            time.sleep(REAL_WAIT_S)
            return
        with self._cond:
            self._cond.wait_for(lambda: self.now > moment, timeout=REAL_WAIT_S)


@dataclass
class ClusterScript:
    """What happens to one cluster the fake provisions: the knobs of a scenario."""

    no_capacity: bool = False
    """The launch fails with ResourcesUnavailableError."""
    error: BaseException | None = None
    """The launch fails with this SkyPilot exception instead (credentials, prechecks)."""
    interrupted: bool = False
    """Ctrl-C arrives while the client streams the provisioning (KeyboardInterrupt)."""
    error_after_provision: BaseException | None = None
    """The cluster comes UP, then the launch fails with this (a CommandError from
    submitting the job, say): the cluster stays up without a job."""
    stale_s: float = 0.0
    """After the nodes are taken back, status without FORCE still reads UP this long
    (a refresh that cannot take the cluster's status lock returns the cached record,
    sky/backends/backend_utils.py: refresh_cluster_record) while job_status cannot
    reach the head and raises CommandError (sky/backends/cloud_vm_ray_backend.py:
    get_job_status)."""
    listed_after_s: float = 0.0
    """The launch request waits this long on the server before it writes the
    cluster's record: until then status lists nothing and down raises
    ClusterDoesNotExist (sky/core.py: down), though the cluster is on its way."""
    provision_s: float = 90.0
    setup_s: float = 60.0
    setup_fails: bool = False
    steps_per_s: float = 2.0
    crash_after_s: float | None = None
    """The user's code fails (exit 1) this long after training started."""
    hang_after_s: float | None = None
    """The user's code hangs (a deadlock) this long after training started: its
    processes live on and print nothing more, the job stays RUNNING."""
    hangs_at_start: bool = False
    """The user's code hangs before its first progress line (a DataLoader worker stuck
    in its fork while the loaders start): RUNNING, and nothing printed, ever."""
    preempt_after_s: float | None = None
    """AWS reclaims the nodes: its notice comes this long after training started."""
    notice: bool = True
    """The two-minute notice reaches the job (it saves, prints ``preempted``, exits 75)."""
    notice_s: float = 120.0
    reclaim: str = "terminate"
    """``terminate`` (the record disappears), ``stop`` (STOPPED) or ``partial`` (INIT)."""
    checkpoint_every_s: float = 300.0
    save_s: float = SAVE_S
    """How long the job saves after a notice or a cancel before it exits; it prints no
    step line meanwhile (it stops training to save)."""


@dataclass
class ApiRestart:
    """The API server restarts while the next ``op`` request is in flight.

    ``op`` names the SDK call (``launch``, ``status``, ``job_status``, ``queue``,
    ``cancel``, ``down``, ``enabled_clouds``, ``jobs.launch``, ``jobs.queue_v2``,
    ``jobs.cancel``). ``effect`` says how far the request got before the server died:
    ``none`` (nothing happened), ``partial`` (a launch had begun provisioning: the
    cluster is left INIT without a job) or ``done`` (it acted; only the answer is
    lost). ``legacy``: the server stored no error, so ``get`` raises RequestCancelled.
    """

    op: str
    effect: str = "none"
    legacy: bool = False
    after: float = 0.0
    """Virtual time from which it applies."""
    skip: int = 0
    """It applies from the ``skip + 1``-th request of its kind on."""

    def error(self, request_id: str) -> BaseException:
        from sky import exceptions

        if self.legacy:  # sky/client/sdk.py: get, a CANCELLED request without error
            return exceptions.RequestCancelled(
                f"Current {self.op!r} request ({request_id}) is cancelled by another process."
            )
        return exceptions.RequestInterruptedError(  # sky/server/server.py: api_get
            f"Request {request_id!r} was interrupted by an API server restart and will "
            "not be resumed. Please re-submit the original request."
        )


@dataclass
class ApiFault:
    """The next ``op`` request (see :class:`ApiRestart`) ends in ``action``, which
    raises what SkyPilot would (CommandError, ProvisionPrechecksError, ...) or delivers
    a signal to this process. ``effect`` as for :class:`ApiRestart`."""

    op: str
    action: Callable[[], None]
    effect: str = "none"
    after: float = 0.0
    skip: int = 0


def fire(fault: ApiRestart | ApiFault, request_id: str) -> None:
    """Ends a request the way ``fault`` says."""
    if isinstance(fault, ApiRestart):
        raise fault.error(request_id)
    fault.action()
    raise AssertionError(f"the fault on {fault.op} raised nothing")


class FakeSkyHandle:
    """The two attributes of SkyPilot's CloudVmRayResourceHandle the backend reads."""

    def __init__(self, internal_ips: list[str], external_ips: list[str]):
        self.cached_internal_ips = internal_ips
        self.head_ip = external_ips[0]


class FakeCluster:
    """One cluster and its job 1, evaluated lazily at any virtual time."""

    def __init__(
        self, name: str, task: Any, script: ClusterScript, now: float, start_step: int, index: int
    ):
        self.name = name
        self.task = task
        self.script = script
        self.nodes = int(task.num_nodes)
        self.index = index
        self.launched_at = now
        self.up_at = now + script.provision_s
        self.run_at = self.up_at + script.setup_s
        self.start_step = start_step
        envs = task.envs or {}
        self.target = int(envs.get("SRIFTY_TARGET_STEPS", "1000"))
        self.downed_at: float | None = None
        self.cancelled_at: float | None = None
        self.provision_cancelled = False
        self.listed_at = now + script.listed_after_s
        self.never = False
        """Its launch request was cancelled before it wrote the record: it never comes."""
        self.no_job = script.error_after_provision is not None
        """The launch failed after provisioning: the cluster has no job."""
        self.autodown_s: float | None = None
        """Idle seconds after which the cluster takes itself down (autostop with down),
        as the launch asked: ``None`` when it did not."""
        self.relaunchable = False
        """A launch of it was dropped by a restart: launching the name again is right."""
        self.stalled = False
        """Its launch request died mid-provisioning (an API restart): INIT, no job,
        until the cluster is launched again."""
        self.preempted_exit_code = (
            node_exit_code(task.run, saved_emergency_checkpoint=True)
            if script.preempt_after_s is not None
            else PREEMPTED_EXIT_CODE
        )
        """What SkyPilot records when the job exits on its notice (run here, once)."""

    # -- the timeline ------------------------------------------------------------------
    @property
    def notice_at(self) -> float | None:
        s = self.script
        if s.preempt_after_s is None or s.setup_fails:
            return None
        return self.run_at + s.preempt_after_s

    @property
    def reclaim_at(self) -> float | None:
        if self.notice_at is None:
            return None
        return self.notice_at + (self.script.notice_s if self.script.notice else 0.0)

    @property
    def hang_at(self) -> float:
        """When the job stops making progress for good (never: infinity)."""
        s = self.script
        if s.hangs_at_start:
            return self.run_at
        return math.inf if s.hang_after_s is None else self.run_at + s.hang_after_s

    def _job_end(self) -> tuple[float, str, int]:
        """(time, JobStatus value, exit code) the job ends with if nothing kills it."""
        s = self.script
        if s.setup_fails:
            return self.run_at, "FAILED_SETUP", 1
        finish = self.run_at + math.ceil(max(self.target - self.start_step, 0) / s.steps_per_s)
        ends = [(finish if finish <= self.hang_at else math.inf, "SUCCEEDED", 0)]
        if s.crash_after_s is not None:
            ends.append((self.run_at + s.crash_after_s, "FAILED", 1))
        if self.notice_at is not None and s.notice:
            ends.append((self.notice_at + s.save_s, "FAILED", self.preempted_exit_code))
        if self.cancelled_at is not None:
            ends.append((self.cancelled_at + s.save_s, "CANCELLED", PREEMPTED_EXIT_CODE))
        return min(ends, key=lambda e: e[0])

    def _ends_with_save(self) -> bool:
        """The job ends by saving an emergency checkpoint (a notice or a cancel)."""
        told = self._saving_from()
        return told < math.inf and self._job_end()[0] == told + self.script.save_s

    def _saving_from(self) -> float:
        """When the job stopped training to save (a notice or a cancel; never: inf)."""
        told = [self.cancelled_at]
        if self.notice_at is not None and self.script.notice:
            told.append(self.notice_at)
        return min((t for t in told if t is not None), default=math.inf)

    def death_at(self) -> float:
        """When the job's processes stop, whatever the reason."""
        times = [self._job_end()[0]]
        if self.downed_at is not None:
            times.append(self.downed_at)
        if self.reclaim_at is not None:
            times.append(self.reclaim_at)
        return min(times)

    def step_at(self, t: float) -> int:
        # a job told to stop reaches a step it can resume exactly, then only saves
        t = min(t, self.death_at(), self.hang_at, self._saving_from() + SAVE_S)
        if t <= self.run_at or self.script.setup_fails:
            return self.start_step
        gained = int((t - self.run_at) * self.script.steps_per_s)
        return min(self.start_step + gained, self.target)

    def stale(self, t: float) -> bool:
        """The record still reads UP though the nodes are gone (see ClusterScript)."""
        at = self.reclaim_at
        if at is None or not self.script.stale_s or not at <= t < at + self.script.stale_s:
            return False
        return self.downed_at is None or t < self.downed_at

    def listed_status(self, t: float, refresh: Any = None) -> str | None:
        """What ``sky.status`` shows with this refresh mode (FORCE asks the cloud)."""
        if str(getattr(refresh, "value", refresh)) != "FORCE" and self.stale(t):
            return "UP"
        return self.cluster_status(t)

    def coming(self, t: float) -> bool:
        """Not listed yet, but its launch request will write the record."""
        return not self.never and self.downed_at is None and t < self.listed_at

    def autodown_at(self) -> float | None:
        """When the cluster takes itself down: its skylet (sky/skylet/events.py:
        AutostopEvent) counts idle minutes from the end of the last job
        (job_lib.is_cluster_idle) on a cluster that is UP; a cluster whose provisioning
        was cut off never got the setting."""
        if self.autodown_s is None or self.stalled or self.provision_cancelled:
            return None
        last_job = self.up_at if self.no_job else self._job_end()[0]
        at = max(last_job, self.up_at) + self.autodown_s
        if self.reclaim_at is not None and self.reclaim_at <= at:
            return None  # AWS took the nodes first
        return at

    def cluster_status(self, t: float) -> str | None:
        """ClusterStatus value at ``t``; ``None`` once the record is gone."""
        if self.downed_at is not None and t >= self.downed_at:
            return None
        if self.never or t < self.listed_at:
            return None
        autodown = self.autodown_at()
        if autodown is not None and t >= autodown:
            return None
        if t < self.up_at or self.provision_cancelled or self.stalled:
            return "INIT"
        if self.reclaim_at is not None and t >= self.reclaim_at:
            return {"terminate": None, "stop": "STOPPED", "partial": "INIT"}[self.script.reclaim]
        return "UP"

    def job_status(self, t: float) -> str | None:
        if t < self.up_at or self.stalled or self.no_job:
            return None
        if self.cancelled_at is not None and t >= self.cancelled_at:
            return "CANCELLED"
        end, status, _ = self._job_end()
        if t >= end:
            return status
        if t < self.up_at + 5.0:
            return "PENDING"
        if t < self.run_at:
            return "SETTING_UP"
        return "RUNNING"

    def exit_code(self, t: float) -> int | None:
        end, _, code = self._job_end()
        return code if t >= end else None

    def events(self, t: float, wall0: float) -> list[tuple[float, ProgressEvent]]:
        """The progress events the job printed up to ``t`` (and before it died)."""
        limit = min(t, self.death_at())
        if limit < self.run_at or self.script.setup_fails or self.stalled or self.no_job:
            return []
        if self.script.hangs_at_start:
            return []
        out: list[tuple[float, ProgressEvent]] = []
        start = ProgressEvent(
            "resumed" if self.start_step else "start",
            wall0 + self.run_at,
            self.start_step,
            checkpoint=f"ckpt-{self.start_step}" if self.start_step else "",
        )
        out.append((self.run_at, start))
        step_s = 1.0 / self.script.steps_per_s
        moment = self.run_at + LOG_EVERY_S
        end, status, _ = self._job_end()
        while moment <= min(limit, end, self.hang_at, self._saving_from()):
            out.append(
                (moment, ProgressEvent("step", wall0 + moment, self.step_at(moment), step_s))
            )
            moment += LOG_EVERY_S
        for when, step in self._saves():
            if when <= limit:
                out.append((when, ProgressEvent("checkpoint", wall0 + when, step,
                                                checkpoint=f"ckpt-{step}")))  # fmt: skip
        if end <= limit:
            final = self.step_at(end)
            if status == "SUCCEEDED":
                out.append((end, ProgressEvent("done", wall0 + end, final, step_s)))
            elif self._ends_with_save():
                out.append((end, ProgressEvent("preempted", wall0 + end, final,
                                                checkpoint=f"ckpt-{final}")))  # fmt: skip
        return sorted(out, key=lambda item: item[0])

    def _saves(self) -> list[tuple[float, int]]:
        """(time, step) of every checkpoint the job completes (before it dies)."""
        death = self.death_at()
        end, status, _ = self._job_end()
        saves = []
        moment = self.run_at + self.script.checkpoint_every_s
        while moment < min(end, death, self.hang_at):
            saves.append((moment, self.step_at(moment)))
            moment += self.script.checkpoint_every_s
        if end <= death and (status == "SUCCEEDED" or self._ends_with_save()):
            saves.append((end, self.step_at(end)))
        return saves

    def stored_step(self, t: float) -> int:
        """The newest checkpoint this job had stored by ``t``."""
        return max([self.start_step, *(step for when, step in self._saves() if when <= t)])


@dataclass
class FakeManagedJob:
    """A managed job and the jobs controller driving it (see the section header)."""

    job_id: int
    name: str
    task: Any
    submitted_at: float
    strategy: str
    recover_codes: tuple[int, ...]
    max_restarts: int
    status: str = "PENDING"
    recovery_count: int = 0
    restarts: int = 0
    failure_reason: str | None = None
    cluster: FakeCluster | None = None
    clusters: list[FakeCluster] = field(default_factory=list)
    launched: list[Any] = field(default_factory=list)
    """The resources SkyPilot launched each of ``clusters`` on (with region and zone)."""
    relaunches: int = 0
    """Relaunch tries in the current recovery."""
    next_at: float = 0.0
    cancel_at: float | None = None


class FakeSkyApi:
    """A SkyPilot API server whose cloud is scripted (:class:`ClusterScript` per cluster).

    Args:
        enabled: Clouds the server reports as enabled (as ``sky check`` would).
        scripts: What happens to each cluster provisioned, in launch order (clusters
            beyond the list behave well).
        clock: Shared virtual time (a new one by default).
        plugins: The plugin classes the server's plugins.yaml names (loaded at start).
    """

    def __init__(
        self,
        enabled: tuple[str, ...] = ("AWS",),
        *,
        scripts: list[ClusterScript] | None = None,
        clock: VirtualClock | None = None,
        plugins: tuple[str, ...] = (),
    ):
        self.enabled = enabled
        self.plugins = plugins
        self.scripts = list(scripts or [])
        self.clock = clock or VirtualClock()
        self.launched: list[tuple[str, Any, dict[str, object]]] = []
        """(cluster name, the sky.Task given, the other keyword arguments)."""
        self.clusters: dict[str, FakeCluster] = {}
        self.downs: list[str] = []
        """Every cluster taken down (by ``down`` or by the jobs controller)."""
        self.cancels: list[str] = []
        self.outages: list[tuple[float, float]] = []
        """Virtual [start, end) spans during which the API server cannot be reached."""
        self.log_drops = 0
        """This many log streams break (ChunkedEncodingError) after ``drop_after`` lines."""
        self.drop_after = 2
        self.log_dead_first = 0
        """``tail_logs`` always fails for the first N clusters (their log never comes)."""
        self.log_interrupts = 0
        """This many log streams end with a restart's RequestInterruptedError after
        ``drop_after`` lines."""
        self.restarts: list[ApiRestart | ApiFault] = []
        """Scripted restarts and faults, each ending the next request it names."""
        self.dropped: list[str] = []
        """Requests a restart dropped (``op``)."""
        self.duplicate_jobs: list[str] = []
        """Clusters that were given a second job by launching them again."""
        self._reconnecting = 0
        self.clock.hold = self._hold
        self.initial_step = 0
        """The checkpoint store's newest step before the first launch (the profile's)."""
        self.calls: list[str] = []
        self.managed: dict[int, FakeManagedJob] = {}
        self.jobs = FakeJobsApi(self)
        self._results: dict[str, Callable[[], Any]] = {}
        self._next_request = 0
        self._requests_of: dict[str, int] = {}
        """How many requests of each kind were made."""
        self._launch_requests: dict[str, str] = {}
        """Launch request id -> its cluster's name."""

    # -- plumbing ----------------------------------------------------------------------
    def _check_api(self, what: str) -> None:
        import sky

        self.calls.append(what)
        now = self.clock.now
        if any(a <= now < b for a, b in self.outages):
            raise sky.exceptions.ApiServerConnectionError("http://127.0.0.1:46580")

    def _request(self, what: str, thunk: Callable[[], Any]) -> str:
        self._check_api(what)
        self._next_request += 1
        request_id = f"req-{self._next_request}"
        restart = self._restart_for(what)
        if restart is not None:
            thunk = self._dropping(restart, request_id, thunk)
        self._results[request_id] = thunk
        return request_id

    def _restart_for(self, op: str) -> ApiRestart | ApiFault | None:
        """The scripted restart or fault that ends this request, if any (used up)."""
        self._requests_of[op] = seen = self._requests_of.get(op, 0) + 1
        for i, restart in enumerate(self.restarts):
            if restart.op == op and self.clock.now >= restart.after and seen > restart.skip:
                del self.restarts[i]
                if isinstance(restart, ApiRestart):
                    self.dropped.append(op)
                return restart
        return None

    @staticmethod
    def _dropping(
        restart: ApiRestart | ApiFault, request_id: str, thunk: Callable[[], Any]
    ) -> Callable[[], Any]:
        def result() -> Any:
            if restart.effect == "done":
                try:
                    thunk()  # it acted before the server went down; the answer is lost
                except Exception:  # noqa: BLE001, S110 - whatever it answered is lost too
                    pass
            fire(restart, request_id)

        return result

    def get(self, request_id: str) -> Any:
        self._check_api("get")
        thunk = self._results[request_id]
        value = thunk()
        del self._results[request_id]
        return value

    def stream_and_get(self, request_id: str) -> Any:
        return self.get(request_id)

    def api_cancel(self, request_ids: Any = None, **kwargs: Any) -> str:
        """Cancels requests (sky/client/sdk.py: api_cancel): a launch request's
        process is killed (sky/server/requests/requests.py: kill_requests), so a
        cluster it had not written yet never comes, and one it was provisioning stays
        INIT (its nodes may exist: it still has to be downed)."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids or [])
        self._check_api("api_cancel")
        now = self.clock.now
        for rid in ids:
            self._results.pop(rid, None)
            cluster = self.clusters.get(self._launch_requests.get(rid, ""))
            if cluster is None:
                continue
            if cluster.coming(now):
                cluster.never = True
            elif cluster.cluster_status(now) == "INIT" and now < cluster.up_at:
                cluster.provision_cancelled = True
        return self._request("api_cancel", lambda: ids)

    def _hold(self) -> bool:
        """A log stream broke mid-way and its reader has not come back yet (while the
        server is up and some cluster runs): real readers reconnect in real time."""
        now = self.clock.now
        if self._reconnecting <= 0 or any(a <= now < b for a, b in self.outages):
            return False
        return any(c.cluster_status(now) == "UP" for c in self.clusters.values())

    def stored_step(self) -> int:
        now = self.clock.now
        return max([self.initial_step, *(c.stored_step(now) for c in self.clusters.values())])

    def left_up(self) -> list[str]:
        """Clusters that still exist (UP, INIT or STOPPED): what may still bill."""
        now = self.clock.now
        return sorted(
            n
            for n, c in self.clusters.items()
            if c.cluster_status(now) is not None or c.coming(now)
        )

    def _cluster(self, name: str, operation: str, *, must_be_up: bool = True) -> FakeCluster:
        import sky

        cluster = self.clusters.get(name)
        status = None if cluster is None else cluster.cluster_status(self.clock.now)
        if cluster is None or status is None:
            raise sky.exceptions.ClusterDoesNotExist(f"Cluster {name!r} does not exist.")
        if must_be_up and status != "UP":
            raise sky.exceptions.ClusterNotUpError(
                f"{operation.capitalize()}: skipped for cluster {name!r} (status: {status})."
            )
        return cluster

    def provision(self, task: Any, name: str) -> FakeCluster | None:
        """Creates the next scripted cluster (``None``: no capacity for it)."""
        script = self.scripts.pop(0) if self.scripts else ClusterScript()
        if script.no_capacity:
            return None
        cluster = FakeCluster(
            name, task, script, self.clock.now, self.stored_step(), len(self.clusters) + 1
        )
        self.clusters[name] = cluster
        return cluster

    # -- the server's own routes ------------------------------------------------------
    def api_plugins(self) -> list[dict[str, Any]] | None:
        """What launch/sky_jobs.py: server_plugins reads from GET /api/plugins: each
        loaded plugin's name and version (sky/server/server.py: list_plugins, from the
        plugin objects SkyPilot built); ``None`` while the server cannot be reached."""
        import importlib

        self.calls.append("api_plugins")
        if any(a <= self.clock.now < b for a, b in self.outages):
            return None
        listed = []
        for class_path in self.plugins:
            module, name = class_path.rsplit(".", 1)
            plugin = getattr(importlib.import_module(module), name)()
            listed.append({"js_extension_path": None, "requires_early_init": False,
                           "name": plugin.name, "version": plugin.version})  # fmt: skip
        return listed

    def strategy_registered(self, strategy: str) -> bool:
        """Whether a strategy is known on this server: SkyPilot's own ones, or one a
        loaded plugin registers (ours: launch/sky_recovery.py, by its import)."""
        from lightning_srifty.launch.sky_recovery import NEXT_OFFER, PLUGIN_CLASS

        if strategy.upper() == NEXT_OFFER:
            return PLUGIN_CLASS in self.plugins
        from sky.utils import registry

        return strategy.lower() in registry.JOBS_RECOVERY_STRATEGY_REGISTRY

    # -- sky.client.sdk --------------------------------------------------------------
    def enabled_clouds(self) -> str:
        return self._request("enabled_clouds", lambda: list(self.enabled))

    def launch(self, task: Any, **kwargs: Any) -> str:
        import sky
        from sky.utils import common_utils

        assert isinstance(task, sky.Task), f"launch got {type(task).__name__}, not sky.Task"
        name = str(kwargs["cluster_name"])
        common_utils.check_cluster_name_is_valid(name)  # SkyPilot's own rule
        self._check_api(f"launch {name}")
        restart = self._restart_for("launch")
        self.launched.append((name, task, dict(kwargs)))
        existing = self.clusters.get(name)
        if existing is not None and existing.cluster_status(self.clock.now) is not None:
            # Launching a name again (sky/execution.py: launch): only after a launch of
            # ours was dropped; two runs sharing a name would be a bug.
            assert existing.relaunchable, f"cluster name {name} reused: runs would share it"
            cluster: FakeCluster | None = existing
            if existing.stalled:  # provisioning picks up where it was cut off
                existing.stalled = False
                existing.up_at = self.clock.now + existing.script.provision_s / 2
                existing.run_at = existing.up_at + existing.script.setup_s
            elif existing.job_status(self.clock.now) is not None:
                self.duplicate_jobs.append(name)  # an UP cluster runs the task again
            script = existing.script
        else:
            assert name not in self.clusters, f"cluster name {name} reused: runs would share it"
            script = self.scripts[0] if self.scripts else ClusterScript()
            if script.error is not None:
                self.scripts.pop(0)
                cluster = None
            elif restart is not None and restart.effect == "none":
                cluster = None  # the server died before provisioning anything
            else:
                cluster = self.provision(task, name)
        if cluster is not None:
            cluster.autodown_s = self._autodown_s(task, kwargs)

        def result() -> Any:
            if script.error is not None and cluster is None:
                raise script.error
            if restart is not None:
                self.clock.sleep(10.0)
                if cluster is not None:
                    cluster.relaunchable = True
                    if restart.effect == "partial":
                        cluster.stalled = True  # the provisioner died with the server
                    elif self.clock.now < cluster.up_at:
                        self.clock.sleep(cluster.up_at - self.clock.now)  # job submitted
                fire(restart, request_id)
            if cluster is None:
                self.clock.sleep(30.0)  # the failover through the zones takes a while
                raise sky.exceptions.ResourcesUnavailableError(
                    f"Failed to provision all possible launchable resources for {name}: "
                    "InsufficientInstanceCapacity in every zone"
                )
            if script.interrupted:
                self.clock.sleep(10.0)
                raise KeyboardInterrupt  # the user pressed Ctrl-C during provisioning
            if self.clock.now < cluster.up_at:
                self.clock.sleep(cluster.up_at - self.clock.now)  # streaming provision logs
            if script.error_after_provision is not None and cluster is not existing:
                raise script.error_after_provision
            n = cluster.index
            internal = [f"10.0.{n}.{node + 1}" for node in range(cluster.nodes)]
            external = [f"203.0.113.{(10 * n + node) % 250}" for node in range(cluster.nodes)]
            return (2 if name in self.duplicate_jobs else 1), FakeSkyHandle(internal, external)

        self._next_request += 1
        request_id = f"req-{self._next_request}"
        self._results[request_id] = result
        self._launch_requests[request_id] = name
        return request_id

    @staticmethod
    def _autodown_s(task: Any, kwargs: dict[str, Any]) -> float | None:
        """What SkyPilot makes of the launch's autostop arguments: its own
        ``Resources.override_autostop_config`` (sky/execution.py: launch), where
        ``down`` without minutes means 0, which it raises to 1 minute."""
        resources = next(iter(task.resources)).copy()
        resources.override_autostop_config(
            down=bool(kwargs.get("down", False)),
            idle_minutes=kwargs.get("idle_minutes_to_autostop"),
        )
        config = resources.autostop_config
        if config is None or not config.enabled or not config.down:
            return None
        return max(int(config.idle_minutes), 1) * 60.0

    def status(self, cluster_names: list[str], **kwargs: Any) -> str:
        from sky.schemas.api import responses
        from sky.utils import status_lib

        def result() -> Any:
            records = []
            refresh = kwargs.get("refresh")
            for name in cluster_names:
                cluster = self.clusters.get(name)
                status = None if cluster is None else cluster.listed_status(self.clock.now, refresh)
                if cluster is None or status is None:
                    continue
                n = cluster.index
                records.append(
                    responses.StatusResponse(
                        name=name,
                        handle=FakeSkyHandle(
                            [f"10.0.{n}.{node + 1}" for node in range(cluster.nodes)],
                            [f"203.0.113.{(10 * n + node) % 250}" for node in range(cluster.nodes)],
                        ),
                        launched_at=int(self.clock.time()),
                        status=status_lib.ClusterStatus(status),
                        autostop=-1
                        if cluster.autodown_s is None
                        else int(cluster.autodown_s // 60),
                        to_down=cluster.autodown_s is not None,
                        cluster_hash=f"hash-{name}",
                        cluster_ever_up=True,
                        user_hash="fake-user",
                        user_name="srifty-tests",
                        workspace="default",
                        is_managed=False,
                        nodes=cluster.nodes,
                        init_kind="unhealthy" if status == "INIT" else None,
                    )
                )
            return records

        return self._request("status", result)

    def job_status(self, cluster_name: str, job_ids: list[int] | None = None) -> str:
        from sky.skylet import job_lib

        def result() -> Any:
            from sky import exceptions

            stale = self.clusters.get(cluster_name)
            if stale is not None and stale.stale(self.clock.now):
                n = stale.index
                raise exceptions.CommandError(
                    255,
                    "python3 -u -c 'from sky.skylet import job_lib; job_lib.get_statuses_payload'",
                    "Failed to get job status.",
                    f"ssh: connect to host 203.0.113.{10 * n % 250} port 22: Connection timed out",
                )
            cluster = self._cluster(cluster_name, "getting job status")
            raw = cluster.job_status(self.clock.now)
            status = None if raw is None else job_lib.JobStatus(raw)
            return {job_id: status for job_id in job_ids or [1]}

        return self._request("job_status", result)

    def queue(self, cluster_name: str, skip_finished: bool = False, **kwargs: Any) -> str:
        """The cluster's job queue: job 1 under the task's name once it was submitted."""
        from sky.schemas.api import responses
        from sky.skylet import job_lib

        def result() -> Any:
            cluster = self._cluster(cluster_name, "getting the job queue")
            raw = cluster.job_status(self.clock.now)
            if raw is None:
                return []
            status = job_lib.JobStatus(raw)
            if skip_finished and status.is_terminal():
                return []
            return [
                responses.ClusterJobRecord(
                    job_id=job_id,
                    job_name=str(cluster.task.name),
                    username="srifty-tests",
                    user_hash="fake-user",
                    submitted_at=self.clock.time(),
                    resources=f"{cluster.nodes}x AWS",
                    status=status,
                    log_path=f"~/sky_logs/sky-{job_id}",
                )
                for job_id in ([1, 2] if cluster_name in self.duplicate_jobs else [1])
            ]

        return self._request("queue", result)

    def cancel(self, cluster_name: str, **kwargs: Any) -> str:
        def result() -> None:
            cluster = self._cluster(cluster_name, "cancelling jobs")
            if cluster.job_status(self.clock.now) in ("PENDING", "SETTING_UP", "RUNNING"):
                cluster.cancelled_at = self.clock.now
                self.cancels.append(cluster_name)

        return self._request("cancel", result)

    def down(self, cluster_name: str, **kwargs: Any) -> str:
        def result() -> None:
            stale = self.clusters.get(cluster_name)
            if stale is not None and stale.stale(self.clock.now):
                stale.downed_at = self.clock.now  # its record goes; its nodes were gone
                self.downs.append(cluster_name)
                return
            cluster = self._cluster(cluster_name, "tearing down", must_be_up=False)
            cluster.downed_at = self.clock.now
            self.downs.append(cluster_name)

        return self._request("down", result)

    def tail_logs(
        self, cluster_name: str, job_id: int | None, follow: bool, tail: int = 0, **kwargs: Any
    ) -> Iterator[str | None]:
        """The job's log as chunks then ``None``, like ``preload_content=False``."""
        import requests

        assert kwargs.get("preload_content") is False
        self._check_api("tail_logs")
        cluster = self._cluster(cluster_name, "tailing logs")
        if cluster.index <= self.log_dead_first:
            raise requests.exceptions.ConnectionError("log endpoint unreachable")
        self._came_back()
        wall0 = self.clock.wall0
        return self._stream(
            lambda t: cluster.events(t, wall0),
            lambda t: cluster.job_status(t) not in (None, "PENDING", "SETTING_UP", "RUNNING"),
            lambda t: cluster.cluster_status(t) != "UP",
        )

    def _stream(
        self,
        events: Callable[[float], list[tuple[float, ProgressEvent]]],
        ended: Callable[[float], bool],
        lost: Callable[[float], bool],
    ) -> Iterator[str | None]:
        import requests

        drop = self.log_drops > 0
        if drop:
            self.log_drops -= 1
        restart = not drop and self.log_interrupts > 0
        if restart:
            self.log_interrupts -= 1
            drop = True

        def chunks() -> Iterator[str | None]:
            key = id(object())
            sent = 0
            try:
                while True:
                    now = self.clock.now
                    if any(a <= now < b for a, b in self.outages):
                        raise requests.exceptions.ConnectionError("API server went away")
                    fresh = events(now)[sent:]
                    for _, event in fresh:
                        if drop and sent >= self.drop_after:
                            self._broke()
                            if restart:
                                from sky import exceptions

                                raise exceptions.RequestInterruptedError(
                                    "Streaming interrupted. Please retry."
                                )
                            raise requests.exceptions.ChunkedEncodingError(
                                "Connection broken: IncompleteRead(0 bytes read)"
                            )
                        sent += 1
                        yield f"(head, rank=0, pid=4242) {PROGRESS_LINE_PREFIX}{event.to_line()}\n"
                    if ended(now) and len(events(now)) == sent:
                        yield None
                        return
                    if lost(now) and not ended(now):
                        raise requests.exceptions.ChunkedEncodingError("the cluster went away")
                    self.clock.reading(key, now)  # the reader took everything up to now
                    self.clock.wait_past(now)
            finally:
                self.clock.reading(key, None)

        return chunks()

    def _broke(self) -> None:
        self._reconnecting += 1

    def _came_back(self) -> None:
        self._reconnecting = max(self._reconnecting - 1, 0)
        self.clock.poke()


_SKY_DEFAULT: Any = object()
"""An argument left out: SkyPilot's own default applies."""


class FakeJobsApi:
    """``sky.jobs.client.sdk`` of :class:`FakeSkyApi`: managed jobs and their controller."""

    def __init__(self, api: FakeSkyApi):
        self.api = api
        self.controller_stopped = False
        """SkyPilot's jobs controller autostopped (see :meth:`stop_controller`)."""
        self._advancing = threading.RLock()
        """One controller: the log follower's thread and the caller's both advance jobs,
        and two of them starting the same job at once would launch it twice."""

    def stop_controller(self) -> None:
        """The jobs controller stops itself, which it does only once no managed job
        runs (its autostop); queue_v2 with refresh starts it again."""
        for job in self.api.managed.values():
            self._advance(job)
            assert job.status in _MANAGED_TERMINAL, "a controller with live jobs never stops"
        self.controller_stopped = True

    def _check_controller(self, stopped_message: str) -> None:
        """cancel and queue_v2 need the controller up (sky/backends/backend_utils.py:
        is_controller_accessible raises ClusterNotUpError with the caller's message and
        the controller's status; sky/jobs/server/core.py passes these messages)."""
        from sky import exceptions
        from sky.utils import status_lib

        if self.controller_stopped:
            raise exceptions.ClusterNotUpError(
                stopped_message, cluster_status=status_lib.ClusterStatus.STOPPED
            )

    def launch(self, task: Any, name: str | None = None, **kwargs: Any) -> str:
        import sky
        from sky.utils import registry

        assert isinstance(task, sky.Task)
        self.api._check_api("jobs.launch")  # noqa: SLF001
        restart = self.api._restart_for("jobs.launch")  # noqa: SLF001
        if restart is not None and restart.effect == "none":
            self.api.launched.append((name or task.name or "managed", task, dict(kwargs)))
            self.api._next_request += 1  # noqa: SLF001
            request_id = f"req-{self.api._next_request}"  # noqa: SLF001

            def dropped() -> Any:
                fire(restart, request_id)

            self.api._results[request_id] = dropped  # noqa: SLF001
            return request_id
        resources = list(task.resources)
        assert isinstance(task.resources, list), "ordered resources must be a list"
        # sky/jobs/recovery_strategy.py: StrategyExecutor.make
        recovery = resources[0].job_recovery
        for r in resources:
            if r.job_recovery != recovery:
                raise ValueError("The job recovery strategy should be the same for all resources.")
        recovery = dict(recovery or {})
        strategy = recovery.pop("strategy", registry.JOBS_RECOVERY_STRATEGY_REGISTRY.default)
        if not self.api.strategy_registered(str(strategy)):
            # sky/resources.py: _try_validate_managed_job_attributes on the server: the
            # registry's from_str raises ValueError for a name nothing registered.
            def refused() -> Any:
                known = [k for k in registry.JOBS_RECOVERY_STRATEGY_REGISTRY
                         if self.api.strategy_registered(k)]  # fmt: skip
                raise ValueError(
                    f"Jobs recovery strategy {str(strategy)!r} is not a valid jobs recovery "
                    f"strategy among {known}."
                )

            return self.api._request("jobs.launch", refused)  # noqa: SLF001
        codes = recovery.pop("recover_on_exit_codes", None) or []
        codes = [codes] if isinstance(codes, int) else [int(c) for c in codes]
        job_id = len(self.api.managed) + 1
        job = FakeManagedJob(
            job_id=job_id,
            name=name or task.name or "managed",
            task=task,
            submitted_at=self.api.clock.now,
            strategy=str(strategy),
            recover_codes=tuple(codes),
            max_restarts=int(recovery.pop("max_restarts_on_errors", 0)),
            next_at=self.api.clock.now + 20.0,
        )
        self.api.managed[job_id] = job
        self.api.launched.append((job.name, task, dict(kwargs)))
        if restart is not None:  # submitted; the answer died with the server
            self.api.restarts.insert(0, restart)
            if isinstance(restart, ApiRestart):
                self.api.dropped.pop()
        return self.api._request("jobs.launch", lambda: ([job_id], None))  # noqa: SLF001

    def queue_v2(
        self,
        refresh: bool,
        job_ids: list[int] | None = None,
        name_match: str | None = None,
        fields: Any = _SKY_DEFAULT,
        **kwargs: Any,
    ) -> str:
        """The managed-job queue. ``name_match`` is SQL ``LIKE %name%``
        (sky/jobs/state.py); with ``fields`` only those columns (and ``job_id``,
        ``task_id``, ``status``) come back (sky/jobs/server/core.py: queue_v2_api), and
        by default SkyPilot asks for DEFAULT_MANAGED_JOB_FIELDS (sky/jobs/constants.py),
        which leave out ``failure_reason``."""
        from sky.jobs import constants, state
        from sky.schemas.api import responses

        wanted = constants.DEFAULT_MANAGED_JOB_FIELDS if fields is _SKY_DEFAULT else fields

        def result() -> Any:
            if refresh:
                self.controller_stopped = False  # a refresh starts the controller again
            self._check_controller("No in-progress managed jobs.")
            records = []
            for job in self.api.managed.values():
                if job_ids and job.job_id not in job_ids:
                    continue
                if name_match is not None and name_match not in job.name:
                    continue
                with self._advancing:  # one consistent record, as SkyPilot's DB read
                    self._advance(job)
                    row = {
                        "job_id": job.job_id,
                        "task_id": 0,
                        "job_name": job.name,
                        "status": state.ManagedJobStatus(job.status),
                        "recovery_count": job.recovery_count,
                        "failure_reason": job.failure_reason,
                        **self._where(job),
                    }
                if wanted:
                    keep = set(wanted) | {"job_id", "task_id", "status"}
                    row = {k: v for k, v in row.items() if k in keep}
                records.append(responses.ManagedJobRecord(**row))
            return records, len(records), {}, len(self.api.managed)

        return self.api._request("jobs.queue_v2", result)  # noqa: SLF001

    @staticmethod
    def _where(job: FakeManagedJob) -> dict[str, Any]:
        """``cluster_resources`` and ``infra`` of the job's cluster, from its launched
        resources with SkyPilot's own formatters (sky/jobs/utils.py:
        _populate_job_record_from_handle); "-" without one."""
        cluster = job.cluster
        if cluster is None or not job.launched:
            return {"cluster_resources": "-", "infra": "-"}
        from sky.utils import infra_utils, resources_utils

        launched = job.launched[-1]
        simple, _ = resources_utils.format_resource(launched, simplified_only=True)
        infra = infra_utils.InfraInfo(str(launched.cloud), launched.region, launched.zone)
        return {
            "cluster_resources": f"{cluster.nodes}x{simple}",
            "infra": infra.formatted_str(),
        }

    def cancel(self, name: str | None = None, job_ids: Any = None, **kwargs: Any) -> str:
        def result() -> None:
            self._check_controller("All managed jobs should have finished.")
            ids = list(job_ids or [])
            ids += [j.job_id for j in self.api.managed.values() if name and j.name == name]
            for job_id in ids:
                job = self.api.managed[job_id]
                self._advance(job)
                if job.status not in _MANAGED_TERMINAL:
                    job.status = "CANCELLING"
                    job.cancel_at = self.api.clock.now
                    self.api.cancels.append(job.name)

        return self.api._request("jobs.cancel", result)  # noqa: SLF001

    def tail_logs(self, name: str | None = None, job_id: int | None = None, **kwargs: Any) -> Any:
        assert kwargs.get("preload_content") is False
        self.api._check_api("jobs.tail_logs")  # noqa: SLF001
        job = self.api.managed[int(job_id or 0)]
        self.api._came_back()  # noqa: SLF001 - a reader that reconnects
        wall0 = self.api.clock.wall0

        def events(t: float) -> list[tuple[float, ProgressEvent]]:
            self._advance(job)
            return sorted((e for c in job.clusters for e in c.events(t, wall0)),
                          key=lambda item: item[0])  # fmt: skip

        return self.api._stream(  # noqa: SLF001
            events, lambda t: job.status in _MANAGED_TERMINAL, lambda t: False
        )

    # -- the jobs controller -----------------------------------------------------------
    def _advance(self, job: FakeManagedJob) -> None:
        """Runs the controller's decisions up to now, each at its own virtual time."""
        with self._advancing:
            self._advance_locked(job)

    def _advance_locked(self, job: FakeManagedJob) -> None:
        now = self.api.clock.now
        while job.status not in _MANAGED_TERMINAL:
            if job.status == "CANCELLING":
                self._finish(job, "CANCELLED", None, job.cancel_at or now)
                return
            if job.status in ("PENDING", "STARTING", "RECOVERING") and job.cluster is None:
                if job.next_at > now:
                    return
                self._start(job, job.next_at)
                continue
            cluster = job.cluster
            assert cluster is not None
            if job.status in ("STARTING", "RECOVERING"):
                if cluster.up_at > now:
                    return
                if job.status == "RECOVERING":
                    job.recovery_count += 1
                job.status = "RUNNING"
                continue
            # RUNNING: the earliest of the cluster leaving UP and the job ending.
            end = cluster._job_end()[0]  # noqa: SLF001
            lost = cluster.reclaim_at if cluster.reclaim_at is not None else math.inf
            moment = min(end, lost)
            if moment > now:
                return
            if lost <= end:
                self._recover(job, lost)  # cluster preempted: not UP any more
                continue
            status, code = cluster.job_status(end), cluster.exit_code(end)
            if status == "SUCCEEDED":
                self._finish(job, "SUCCEEDED", None, end)
            elif code in job.recover_codes:
                self._recover(job, end)
            elif job.restarts < job.max_restarts:
                job.restarts += 1
                self._recover(job, end)
            elif status == "FAILED_SETUP":
                self._finish(job, "FAILED_SETUP", "Job setup failed (user program failure).", end)
            else:
                self._finish(
                    job, "FAILED", f"Job exited with exit code {code} (user program failure).", end
                )

    @staticmethod
    def _launch_order(job: FakeManagedJob) -> list[Any]:
        """The ordered resources in the order this launch tries them (see the section
        header): as given, except a SRIFTY_NEXT_OFFER recovery's first relaunch, which
        is our strategy's own reordering."""
        from lightning_srifty.launch.sky_recovery import NEXT_OFFER, demote

        resources = list(job.task.resources)
        recovering = job.status == "RECOVERING" and job.launched
        if recovering and job.strategy.upper() == NEXT_OFFER and job.relaunches == 0:
            return demote(resources, job.launched[-1])
        return resources

    def _start(self, job: FakeManagedJob, moment: float) -> None:
        """Launches on the first ordered resource with capacity (or fails/retries)."""
        first_launch = job.status == "PENDING"
        order = self._launch_order(job)
        job.status = "STARTING" if first_launch else "RECOVERING"
        saved = self.api.clock.now
        self.api.clock.now = moment  # the controller acted then
        try:
            for index, resources in enumerate(order):
                name = f"{job.name}-{job.job_id}"
                if name in self.api.clusters:
                    name = f"{name}-r{len(job.clusters)}-{index}"
                cluster = self.api.provision(job.task, name)
                if cluster is not None:
                    region = resources.region or "us-east-1"
                    job.cluster = cluster
                    job.clusters.append(cluster)
                    job.launched.append(resources.copy(region=region, zone=f"{region}a"))
                    return
        finally:
            self.api.clock.now = saved
        job.relaunches += 1
        if first_launch:
            self._finish(
                job, "FAILED_NO_RESOURCE", "Failed to provision all possible resources.", moment
            )
        else:
            job.next_at = moment + 60.0  # keep trying while RECOVERING

    def _recover(self, job: FakeManagedJob, moment: float) -> None:
        cluster = job.cluster
        if cluster is not None and cluster.downed_at is None:
            cluster.downed_at = moment  # the controller cleans the failed cluster up
            self.api.downs.append(cluster.name)
        job.cluster = None
        job.status = "RECOVERING"
        job.relaunches = 0
        job.next_at = moment

    def _finish(self, job: FakeManagedJob, status: str, reason: str | None, moment: float) -> None:
        cluster = job.cluster
        if cluster is not None and cluster.downed_at is None:
            cluster.downed_at = moment
            self.api.downs.append(cluster.name)
        job.cluster = None
        job.status = status
        job.failure_reason = reason


_MANAGED_TERMINAL = (
    "SUCCEEDED",
    "CANCELLED",
    "FAILED",
    "FAILED_SETUP",
    "FAILED_PRECHECKS",
    "FAILED_NO_RESOURCE",
    "FAILED_CONTROLLER",
)


# ---------------------------------------------------------------------------------------
# EC2 instance metadata service (owned by capture/imds.py, used by capture/environment.py
# and capture/preemption.py)
#
# 169.254.169.254 exists only on EC2. FakeImds answers the IMDSv2 calls we make, the
# way AWS documents them ("Use IMDSv2", "Instance metadata categories"): a PUT to
# /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds (1..21600) returns a token
# valid for that many seconds; a GET without a valid token is 401; the spot
# instance-action path is 404 until AWS schedules an interruption. It can also hang:
# the first `hang_next` requests are accepted and never answered (a service or network
# that does not respond), which is what a client must survive. `drop_token_replies`
# is the hop limit seen from a Docker container: with the instance's
# HttpPutResponseHopLimit at 1 the token reply expires one hop short of the container
# (AWS, "Configure the instance metadata options": "In a container environment, we
# recommend setting the hop limit to 2"), so every token PUT goes unanswered.
# ---------------------------------------------------------------------------------------


class FakeImds(BaseHTTPRequestHandler):
    """IMDSv2 on 127.0.0.1: expiring tokens, instance type, region and the spot notice."""

    requests: list[str] = []
    answered: list[int] = []
    spot_notice: dict[str, str] | None = None
    """Set to e.g. ``{"action": "terminate", "time": "..."}`` to issue a notice."""
    hang_next = 0
    drop_token_replies = False
    tokens: dict[str, float] = {}
    """Token -> expiry (``time.monotonic()``)."""
    release = threading.Event()

    def do_PUT(self) -> None:  # noqa: N802
        self.requests.append(f"PUT {self.path}")
        if self._hang():
            return
        if self.drop_token_replies:
            self.answered.append(0)
            type(self).release.wait(60)
            self.close_connection = True
            return
        raw = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        ok = self.path == "/latest/api/token" and raw.isdigit() and 1 <= int(raw) <= 21600
        if not ok:
            self._reply("", 400)
            return
        token = f"t0k3n-{len(self.tokens)}"
        self.tokens[token] = time.monotonic() + int(raw)
        self._reply(token, 200)

    def do_GET(self) -> None:  # noqa: N802
        self.requests.append(f"GET {self.path}")
        if self._hang():
            return
        expiry = self.tokens.get(self.headers.get("X-aws-ec2-metadata-token", ""))
        if expiry is None or time.monotonic() >= expiry:
            self._reply("", 401)
            return
        answers = {
            "/latest/meta-data/instance-type": "p3.8xlarge",
            "/latest/meta-data/placement/region": "us-west-2",
        }
        if self.spot_notice is not None:
            answers["/latest/meta-data/spot/instance-action"] = json.dumps(self.spot_notice)
        self._reply(answers.get(self.path, ""), 200 if self.path in answers else 404)

    def _hang(self) -> bool:
        """Accepts the request and never answers it (until the server stops)."""
        cls = type(self)
        if cls.hang_next <= 0:
            return False
        cls.hang_next -= 1
        self.answered.append(0)
        cls.release.wait(60)
        self.close_connection = True
        return True

    def _reply(self, body: str, status: int) -> None:
        self.answered.append(status)
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@contextmanager
def serve_fake_imds() -> Iterator[str]:
    """Runs :class:`FakeImds` on a free port; yields its endpoint URL."""
    FakeImds.requests = []
    FakeImds.answered = []
    FakeImds.spot_notice = None
    FakeImds.hang_next = 0
    FakeImds.drop_token_replies = False
    FakeImds.tokens = {}
    FakeImds.release = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeImds)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        FakeImds.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        FakeImds.spot_notice = None


@contextmanager
def silent_endpoint() -> Iterator[str]:
    """A socket on 127.0.0.1 that accepts connections and never answers; yields its URL."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # the kernel completes handshakes; nothing is ever read
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


# ---------------------------------------------------------------------------------------
# S3 faults (owned by io/checkpoint_store.py)
#
# The S3 API itself is real (moto's standalone server, started by tests/conftest.py).
# What cannot be produced on demand is a network that drops connections or an S3 that
# throttles. FaultyS3Proxy sits between boto3 and the moto server, forwards every
# request over real HTTP, and injects those faults on a schedule.
# ---------------------------------------------------------------------------------------

_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_INTERNAL = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)


class FaultyS3Proxy:
    """A forwarding proxy in front of an S3 endpoint that injects faults.

    Attributes (set them between calls):
        throttle_next: the next N requests get ``503 SlowDown``.
        reset_next: the next N requests have their connection closed without a reply.
        fail_puts_matching: every PUT whose path contains this text gets
            ``500 InternalError`` (``None``: none).
        fail_gets_matching: the same for GETs (a store whose reads keep failing).
        outage_until: ``time.monotonic()`` before which every request has its
            connection closed without a reply (an outage of the network or of S3).
        faults: how many faults were injected so far.
    """

    def __init__(self, upstream: str):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.throttle_next = 0
        self.reset_next = 0
        self.fail_puts_matching: str | None = None
        self.fail_gets_matching: str | None = None
        self.outage_until = 0.0
        self.faults = 0
        self.requests: list[str] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._fault_for(self.command, self.path)
                if fault == "reset":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if fault in ("throttle", "internal"):
                    payload = _SLOW_DOWN if fault == "throttle" else _INTERNAL
                    self.send_response(503 if fault == "throttle" else 500)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(
                    proxy.upstream.hostname, proxy.upstream.port, timeout=30
                )
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = proxy.upstream.netloc
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for key, value in resp.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward  # noqa: N815

            def log_message(self, format: str, *args: object) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _fault_for(self, method: str, path: str) -> str | None:
        with self._lock:
            self.requests.append(f"{method} {path}")
            if time.monotonic() < self.outage_until:
                self.faults += 1
                return "reset"
            if self.reset_next > 0:
                self.reset_next -= 1
                self.faults += 1
                return "reset"
            if self.throttle_next > 0:
                self.throttle_next -= 1
                self.faults += 1
                return "throttle"
            if method == "PUT" and self.fail_puts_matching and self.fail_puts_matching in path:
                self.faults += 1
                return "internal"
            if method == "GET" and self.fail_gets_matching and self.fail_gets_matching in path:
                self.faults += 1
                return "internal"
            return None

    def __enter__(self) -> FaultyS3Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


# ---------------------------------------------------------------------------------------
# The person at the terminal (owned by launch/launcher.py's LauncherUI)
#
# srifty-launch asks for confirmation and draws a live display; a test has nobody to
# answer and no screen. RecordingUI answers with a fixed choice and keeps what it was
# shown, so tests can assert on the journey.
# ---------------------------------------------------------------------------------------
class RecordingUI:
    """A LauncherUI that confirms (or refuses) and records every call."""

    def __init__(self, confirm: bool = True):
        self.answer = confirm
        self.messages: list[str] = []
        self.profiles: list[object] = []
        self.plans: list[object] = []
        self.dry_runs: list[object] = []
        self.updates: list[tuple[object, object, object]] = []
        self.migrations: list[object] = []
        self.summaries: list[object] = []

    def info(self, message: str) -> None:
        self.messages.append(message)

    def show_profile(self, run: object) -> None:
        self.profiles.append(run)

    def show_plan(self, result: object, request: object) -> None:
        self.plans.append(result)

    def confirm(self, plan: object) -> bool:
        return self.answer

    def ask(self, question: str) -> bool:
        self.messages.append(question)
        return self.answer

    def show_dry_run(self, report: object) -> None:
        self.dry_runs.append(report)

    def progress(self, plan: object, snap: object, expect: object) -> None:
        self.updates.append((plan, snap, expect))

    def migration(self, move: object) -> None:
        self.migrations.append(move)

    def summary(self, outcome: object) -> None:
        self.summaries.append(outcome)
