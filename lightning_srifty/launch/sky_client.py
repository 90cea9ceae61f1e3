"""The SkyPilot SDK seen from the launcher: calls, retries, status mapping, the ledger.

:class:`SkyClient` holds what every SkyPilot backend shares (cluster names, the ledger
of what the run started, shipping, API retries, teardown); :func:`map_status` reads
cluster and job states the way SkyPilot 0.14 produces them. The attempt loops live in
:mod:`lightning_srifty.launch.sky_backend` (one cluster per plan group) and
:mod:`lightning_srifty.launch.sky_jobs` (managed jobs).
"""

from __future__ import annotations

import logging
import secrets
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lightning_srifty.core.errors import (
    ApiUnavailableError,
    CapacityError,
    CredentialsError,
    LaunchError,
    SriftyError,
)
from lightning_srifty.io.cluster_ledger import ClusterLedger
from lightning_srifty.launch.backend import JobState
from lightning_srifty.launch.sky_tasks import CLOUD, DEFAULT_MASTER_PORT

if TYPE_CHECKING:
    from lightning_srifty.launch.controller import LogProgress


log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# Launch, status, stop through the SkyPilot SDK
# ---------------------------------------------------------------------------------------


class SkySdk(Protocol):
    """The SkyPilot SDK calls the backend makes (``sky.client.sdk`` satisfies it).

    Every call goes to a SkyPilot API server; tests substitute this narrow surface.
    """

    def enabled_clouds(self) -> Any: ...

    def launch(self, task: Any, **kwargs: Any) -> Any: ...

    def status(self, cluster_names: list[str], **kwargs: Any) -> Any: ...

    def job_status(self, cluster_name: str, job_ids: list[int] | None = None) -> Any: ...

    def queue(self, cluster_name: str, skip_finished: bool = False, **kwargs: Any) -> Any: ...

    def cancel(self, cluster_name: str, **kwargs: Any) -> Any: ...

    def down(self, cluster_name: str) -> Any: ...

    def tail_logs(
        self, cluster_name: str, job_id: int | None, follow: bool, tail: int = 0, **kwargs: Any
    ) -> Any: ...

    def get(self, request_id: Any) -> Any: ...

    def stream_and_get(self, request_id: Any) -> Any: ...

    def api_cancel(self, request_ids: Any = None, **kwargs: Any) -> Any: ...


class SkyJobsSdk(Protocol):
    """The managed-jobs calls (``sky.jobs.client.sdk`` satisfies it)."""

    def launch(self, task: Any, name: str | None = None, **kwargs: Any) -> Any: ...

    def queue_v2(self, refresh: bool, **kwargs: Any) -> Any: ...

    def tail_logs(
        self, name: str | None = None, job_id: int | None = None, **kwargs: Any
    ) -> Any: ...

    def cancel(self, name: str | None = None, job_ids: Any = None, **kwargs: Any) -> Any: ...


def real_sdk() -> SkySdk:
    """SkyPilot's client SDK module (imported on first use)."""
    from sky.client import sdk

    return sdk  # type: ignore[return-value]


def real_jobs_sdk() -> SkyJobsSdk:
    """SkyPilot's managed-jobs client SDK module (imported on first use)."""
    from sky.jobs.client import sdk

    return sdk  # type: ignore[return-value]


@dataclass(frozen=True)
class SkyCluster:
    """One launched SkyPilot cluster (one plan group) and its job."""

    name: str
    job_id: int | None
    head_ip: str | None


@dataclass(frozen=True)
class SkyJob:
    """Handle of a SkyPilot launch: the clusters of every plan group."""

    clusters: tuple[SkyCluster, ...]
    use_spot: bool


@dataclass(frozen=True)
class ApiPatience:
    """How long the launcher waits out an unreachable API server, and how it backs off.

    SkyPilot's own client retries a 503 for up to ten minutes
    (``sky/server/rest.py: _retry_on_server_unavailable``) but gives up at once when the
    server cannot be reached (``ApiServerConnectionError``); a run that lasts hours must
    outlive a server restart, so every call after the first is retried here.
    """

    patience_s: float = 1800.0
    first_wait_s: float = 2.0
    longest_wait_s: float = 60.0
    reissues: int = 5
    """How often in a row a request that a server restart dropped is sent again.

    A restarting server marks its in-flight requests interrupted and does not resume
    them (``sky/server/uvicorn.py: interrupt_request_for_retry``); ``sdk.get`` then
    raises ``RequestInterruptedError`` (``RequestCancelled`` from older servers), and
    SkyPilot expects the client to send the request again (``sky/exceptions.py``)."""


# SkyPilot job statuses (sky.skylet.job_lib.JobStatus values) that are not failures.
_RUNNING_JOB_STATES = {
    "INIT": JobState.PENDING,
    "PENDING": JobState.PENDING,
    "SETTING_UP": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
}
_FAILED_JOB_STATES = ("FAILED", "FAILED_SETUP", "FAILED_DRIVER", "CANCELLED")

# Worst first: the job is only as far along as its least healthy cluster.
_SEVERITY = (
    JobState.PREEMPTED,
    JobState.FAILED,
    JobState.PENDING,
    JobState.RUNNING,
    JobState.SUCCEEDED,
)

NOTICE_WINDOW_S = 150.0
"""EC2 gives a spot node two minutes between its notice and the reclaim; a job that
exits during that time with the cluster still UP may be a preempted one."""
AUTOSTOP_IDLE_MINUTES = 10
"""Every cluster is launched to take itself down after this many idle minutes
(``sky.launch(idle_minutes_to_autostop=..., down=True)``): whatever happens to the
launcher, a cluster whose job ended stops billing. Longer than every window the
backend watches an ended job through (:data:`NOTICE_WINDOW_S`, :data:`INIT_TIMEOUT_S`)."""
DOWN_RECHECKS = 3
"""Extra status readings that must not list a cluster whose launch may still be
running before its teardown counts as done."""
DOWN_RECHECK_S = 20.0
"""Seconds between those readings."""
INIT_TIMEOUT_S = 300.0
"""How long a launched cluster may stay INIT (some nodes lost) before it counts as
preempted: SkyPilot itself never repairs it (``sky start`` would)."""


def status_text(raw: Any) -> str | None:
    """A SkyPilot status enum's value as text (records carry enums or strings);
    ``None`` stays ``None``."""
    return None if raw is None else str(getattr(raw, "value", raw))


def map_status(cluster_status: Any, job_status: Any, *, use_spot: bool) -> JobState:
    """A first reading of SkyPilot's ``ClusterStatus`` and ``JobStatus`` (or ``None``).

    Follows ``sky/backends/backend_utils.py: _update_cluster_status``: a cluster whose
    nodes were all terminated disappears from the status list, one whose nodes were all
    stopped is ``STOPPED``, and one that lost *some* nodes (a partial spot reclaim) or
    whose runtime is unhealthy is ``INIT``. A cluster gone or stopped behind our back
    was taken away (unmanaged clusters are not recovered by SkyPilot): PREEMPTED, for
    spot and on-demand alike (the controller names the two differently). ``INIT`` and
    a ``FAILED`` job on an ``UP`` cluster are ambiguous on their own; this returns
    RUNNING and FAILED for them, and :class:`SkyBackend` looks further (the job's log,
    the notice window, the INIT timeout) before deciding. ``use_spot`` is kept for
    callers; the mapping no longer depends on it.
    """
    del use_spot
    cluster = status_text(cluster_status)
    job = status_text(job_status)
    if cluster is None or cluster == "STOPPED":
        return JobState.SUCCEEDED if job == "SUCCEEDED" else JobState.PREEMPTED
    if cluster == "INIT":
        return JobState.RUNNING
    if cluster not in ("UP", "AUTOSTOPPING"):
        raise LaunchError(f"unknown SkyPilot cluster status {cluster!r}")
    if job is None:
        return JobState.PENDING
    if job in _RUNNING_JOB_STATES:
        return _RUNNING_JOB_STATES[job]
    if job in _FAILED_JOB_STATES:
        return JobState.FAILED
    raise LaunchError(f"unknown SkyPilot job status {job!r}")


def combine_states(states: Sequence[JobState]) -> JobState:
    """One state for a job spread over several clusters: the least healthy wins."""
    if not states:
        raise LaunchError("no cluster states to combine")
    return min(states, key=_SEVERITY.index)


class _Transient(Exception):
    """An API call that may succeed if tried again (internal to the backend)."""

    def __init__(self, message: str, *, sent: bool, interrupted: bool = False):
        super().__init__(message)
        self.sent = sent
        """The request may have reached the server (a retry could act twice)."""
        self.interrupted = interrupted
        """The server took the request and dropped it when it restarted: it will not
        be resumed, and only sending it again gets an answer."""


class SkyClient:
    """What the SkyPilot backends share: the SDK, the task, the run's clusters, retries.

    Every run owns its clusters: names carry a run id (``srifty-<attempt>-<run id>``),
    each one is written to ``<run-dir>/clusters.json`` before it is asked for and marked
    down once SkyPilot confirmed, and teardown is retried like every other call. The
    task installs this exact package (a wheel built here, see
    :mod:`lightning_srifty.launch.shipping`) and ``requirements.txt``; the workdir
    upload leaves out ``srifty_runs/``, ``.venv`` and ``.git`` through ``.skyignore``.

    Args:
        sdk: The SDK surface (the real one by default).
        workdir: The script's folder, synced to the nodes.
        checkpoint_uri: Where the job checkpoints (``s3://...``).
        run_dir: The run's folder (ledger, wheel); none: no ledger (tests, dry runs).
        user_setup: Extra setup commands (``--setup``), run after the installs.
        setup: Replaces the whole setup (tests); by default it is built from the wheel.
        ship_package: Build and mount the wheel (off only for tests of other parts).
        keep_clusters: On Ctrl-C, SIGTERM or SIGHUP during a launch, leave what was
            started up (any other failure takes it down).
        api: How long an unreachable API server is waited out.
        idle_minutes_to_autostop: Every cluster takes itself down after this many idle
            minutes (:data:`AUTOSTOP_IDLE_MINUTES`).
        notice_window_s: See :data:`NOTICE_WINDOW_S`.
        init_timeout_s: See :data:`INIT_TIMEOUT_S`.
        down_rechecks, down_recheck_s: See :data:`DOWN_RECHECKS`.
        clock, sleep: Time for retries and windows (tests pass a virtual clock).
        log_sleep: How the log follower waits between reconnections (a thread).
        run_id: Names this run's clusters (random by default).
        dry_run: Prepare the task without touching the workdir (``.skyignore`` is only
            reported).
    """

    name = "skypilot"

    def __init__(
        self,
        *,
        sdk: SkySdk | None = None,
        workdir: str | None = None,
        checkpoint_uri: str | None = None,
        master_port: int = DEFAULT_MASTER_PORT,
        pin_zone: bool = False,
        idle_minutes_to_autostop: int = AUTOSTOP_IDLE_MINUTES,
        allow_env: Collection[str] = (),
        run_dir: str | Path | None = None,
        user_setup: str | None = None,
        setup: str | None = None,
        ship_package: bool = True,
        keep_clusters: bool = False,
        api: ApiPatience | None = None,
        notice_window_s: float = NOTICE_WINDOW_S,
        init_timeout_s: float = INIT_TIMEOUT_S,
        down_rechecks: int = DOWN_RECHECKS,
        down_recheck_s: float = DOWN_RECHECK_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        log_sleep: Callable[[float], None] = time.sleep,
        run_id: str | None = None,
        dry_run: bool = False,
    ):
        self._sdk = sdk
        self.dry_run = dry_run
        self.workdir = workdir
        self.checkpoint_uri = checkpoint_uri
        self.master_port = master_port
        self.pin_zone = pin_zone
        self.idle_minutes_to_autostop = idle_minutes_to_autostop
        self.allow_env = tuple(allow_env)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.user_setup = user_setup
        self._setup_override = setup
        self.ship_package = ship_package
        self.keep_clusters = keep_clusters
        self.api = api or ApiPatience()
        self.notice_window_s = notice_window_s
        self.init_timeout_s = init_timeout_s
        self.down_rechecks = down_rechecks
        self.down_recheck_s = down_recheck_s
        self._clock = clock
        self._sleep = sleep
        self._log_sleep = log_sleep
        self.run_id = run_id or secrets.token_hex(3)
        self.ledger = ClusterLedger(self.run_dir, self.run_id) if self.run_dir else None
        self.notes: list[str] = []
        """What preparing the task changed or decided (for the UI)."""
        self.api_retries = 0
        """API calls retried because the server was unreachable."""
        self.api_reissues = 0
        """Requests sent again because a server restart dropped them."""
        self.gave_up: str | None = None
        """Why the last API call gave up (:class:`ApiUnavailableError`): ``unreachable``
        or ``restarts``; ``None`` after a call that got its answer."""
        self._prepared: dict[str, Any] | None = None
        self._launches = 0
        self._progress: dict[str, LogProgress] = {}
        self._init_since: dict[str, float] = {}
        self._failed_since: dict[str, float] = {}
        self._silent_since: dict[str, float] = {}
        self._draining: dict[str, float] = {}
        self._last_job: dict[str, str | None] = {}
        self._why: dict[str, str] = {}
        self._requests: dict[str, Any] = {}
        """Cluster name -> its latest launch request (cancelled before a teardown)."""
        self.started: set[str] = set()
        """Names of the clusters and managed jobs this process launched."""

    @property
    def sdk(self) -> SkySdk:
        if self._sdk is None:
            self._sdk = real_sdk()
        return self._sdk

    # ------------------------------------------------------------------ the task
    def task_options(self) -> dict[str, Any]:
        """Options for :func:`build_tasks` shared by every launch (prepared once)."""
        if self._prepared is None:
            self._prepared = self._prepare()
        return dict(self._prepared)

    def _prepare(self) -> dict[str, Any]:
        from lightning_srifty.launch import shipping

        options: dict[str, Any] = {
            "workdir": self.workdir,
            "master_port": self.master_port,
            "pin_zone": self.pin_zone,
            "allow_env": self.allow_env,
        }
        if self.checkpoint_uri:
            options["checkpoint_uri"] = self.checkpoint_uri
        requirements = None
        if self.workdir:
            extra: tuple[str, ...] = ()
            if self.run_dir is not None:
                run_dir = self.run_dir.resolve()
                workdir = Path(self.workdir).resolve()
                if run_dir.is_relative_to(workdir) and run_dir != workdir:
                    extra = (f"/{run_dir.relative_to(workdir).as_posix()}/",)
            path, added = shipping.ensure_skyignore(self.workdir, extra, write=not self.dry_run)
            if added:
                verb = "a real launch adds" if self.dry_run else "added"
                self.notes.append(f"{path}: {verb} {', '.join(added)} (not uploaded)")
            requirements = shipping.requirements_file(self.workdir)
            if requirements is not None:
                self.notes.append(f"nodes install {requirements.name} from {self.workdir}")
        if self._setup_override is not None:
            options["setup"] = self._setup_override
        elif self.ship_package:
            out = (self.run_dir or Path(tempfile.mkdtemp(prefix="srifty-wheel-"))) / "sky"
            wheel = shipping.build_wheel(out / "wheel")
            options["file_mounts"] = {wheel.remote_path: str(wheel.path)}
            options["setup"] = shipping.setup_script(
                wheel, requirements=requirements is not None, extra=self.user_setup
            )
            self.notes.append(f"nodes install this lightning-srifty as {wheel.path.name}")
        elif self.user_setup:
            options["setup"] = self.user_setup
        return options

    def check_credentials(self, *, retry: bool = False) -> None:
        """Raises CredentialsError unless the API server has AWS enabled.

        The first check fails fast (no retry): an API server that is not there at the
        start is a set-up problem, not an outage.
        """
        enabled = self._call(
            lambda: self.sdk.get(self.sdk.enabled_clouds()), "list clouds", retry=retry
        )
        names = {str(cloud).lower() for cloud in enabled or []}
        if CLOUD not in names:
            found = ", ".join(sorted(names)) or "none"
            raise CredentialsError(
                f"AWS is not enabled in SkyPilot (enabled: {found}); set up AWS "
                "credentials on the API server and run `sky check aws`"
            )

    def down_recorded(self, *, ours: bool = False) -> list[str]:
        """Takes down every cluster the ledger lists as not down (``srifty down``).

        ``ours``: only what this process launched (:meth:`down_started`)."""
        if self.ledger is None:
            return []
        names = [
            e.name
            for e in self.ledger.not_down()
            if e.kind == "cluster" and (not ours or e.name in self.started)
        ]
        self._down_names(names)
        return names

    def down_started(self) -> list[str]:
        """Takes down what this launcher started and is not down yet: what an
        interrupted or failed ``srifty-launch`` owes. A resumed run's earlier clusters
        are not its to stop (``--resume`` refuses to run beside a live one)."""
        return self.down_recorded(ours=True)

    def live_recorded(self) -> list[str]:
        """What the ledger lists as not down and SkyPilot still reports, as
        ``name (STATUS)`` (``--resume`` refuses to start a second writer beside it).

        The status is refreshed from the cloud (``StatusRefreshMode.FORCE``): a cluster
        whose VMs are gone must not block a resume.
        """
        if self.ledger is None:
            return []
        from sky.utils import common as sky_common

        names = [e.name for e in self.ledger.not_down() if e.kind == "cluster"]
        if not names:
            return []
        records = self._call(
            lambda: self.sdk.get(
                self.sdk.status(names, refresh=sky_common.StatusRefreshMode.FORCE)
            ),
            f"status of {', '.join(names)}",
        )
        live = []
        for record in records or []:
            status = status_text(record["status"])
            if record["name"] in names and status in ("INIT", "UP"):
                live.append(f"{record['name']} ({status})")
        return live

    def _down_names(self, names: Sequence[str]) -> None:
        """Tears down each cluster (retried) until SkyPilot's status confirms it gone;
        only then is its ledger entry marked down.

        Raises:
            LaunchError: a teardown kept failing; the message names ``srifty down``.
        """
        failed = []
        for cluster_name in reversed(list(names)):
            try:
                self._down_confirmed(cluster_name)
            except LaunchError as exc:
                failed.append(f"{cluster_name} ({exc})")
                continue
            if self.ledger is not None:
                self.ledger.mark(cluster_name, "down")
        if failed:
            where = f" {self.run_dir}" if self.run_dir is not None else " RUN_DIR"
            raise LaunchError(
                f"could not take down {', '.join(failed)}; they may still be billing: "
                f"run `srifty down{where}` once the SkyPilot API server is back"
            )

    def _down_confirmed(self, cluster_name: str) -> None:
        """Downs ``cluster_name`` and checks SkyPilot's status until it is not listed.

        ``sky.down`` answers ``ClusterDoesNotExist`` for a cluster whose launch has not
        yet written its record (``sky/core.py: down``); that launch could still bring
        it up. So a launch that may still run is cancelled first
        (``sky.api_cancel``), and when that cannot be confirmed the status is read
        :attr:`down_rechecks` more times, :attr:`down_recheck_s` apart, downing the
        cluster again whenever it shows up.
        """
        from sky import exceptions

        entry = self.ledger.entry(cluster_name) if self.ledger is not None else None
        request = self._requests.pop(cluster_name, None)
        if request is None and entry is not None and entry.state == "launching":
            request = entry.request_id
        unsure = entry is not None and entry.state == "launching"
        if request is not None:
            unsure = not self._cancel_request(request, cluster_name)
        needed = 1 + (self.down_rechecks if unsure else 0)
        absent = 0
        downs = 0
        while absent < needed:
            if self._listed(cluster_name):
                absent = 0
                downs += 1
                if downs > 3:
                    raise LaunchError(f"SkyPilot still lists {cluster_name} after 3 teardowns")
                try:
                    self._call(
                        lambda: self.sdk.get(self.sdk.down(cluster_name)),
                        f"down {cluster_name}",
                    )
                except exceptions.ClusterDoesNotExist:
                    pass
                continue
            absent += 1
            if absent < needed:
                self._sleep(self.down_recheck_s)

    def _listed(self, cluster_name: str) -> bool:
        """Whether SkyPilot's cluster table still has ``cluster_name`` (any status)."""
        from sky.utils import common as sky_common

        records = self._call(
            lambda: self.sdk.get(
                self.sdk.status([cluster_name], refresh=sky_common.StatusRefreshMode.NONE)
            ),
            f"status of {cluster_name}",
        )
        return any(r["name"] == cluster_name for r in records or [])

    def _cancel_request(self, request: Any, cluster_name: str) -> bool:
        """Cancels a launch request that may still run; True once the server said so
        (a request that already ended is left as it is)."""
        try:
            self._call(
                lambda: self.sdk.get(self.sdk.api_cancel(request)),
                f"cancel the launch request of {cluster_name}",
            )
        except LaunchError as exc:
            log.info("could not cancel the launch request of %s: %s", cluster_name, exc)
            return False
        return True

    def _call(
        self,
        request: Callable[[], Any],
        what: str,
        *,
        retry: bool = True,
        resend: bool = True,
        reissue: bool = True,
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> Any:
        """One SDK round trip, turning SkyPilot's errors into ours, retrying outages.

        Args:
            request: The call (sending the request and getting its result).
            what: Names it in messages.
            retry: Wait out an unreachable API server (for :attr:`api`'s patience).
            resend: The call may be repeated even if it may have reached the server
                (reads and idempotent calls); a launch may not (:class:`LostRequest`).
            reissue: A request the server dropped on a restart is sent again at once
                (up to :attr:`ApiPatience.reissues` times in a row); otherwise
                :class:`InterruptedRequest` tells the caller, who knows whether
                sending it again is safe.
            passthrough: SkyPilot exceptions the caller handles itself.

        Raises:
            ApiUnavailableError: the server stayed away or kept dropping the request;
                :attr:`gave_up` says why (what the run started is left running).
        """
        wait = self.api.first_wait_s
        started = self._clock()
        dropped = 0
        while True:
            try:
                result = self._call_once(request, what, passthrough)
            except _Transient as exc:
                if exc.interrupted:
                    if not reissue:
                        raise InterruptedRequest(str(exc)) from None
                    dropped += 1
                    self.api_reissues += 1
                    if dropped > self.api.reissues:
                        self.gave_up = "restarts"
                        raise ApiUnavailableError(
                            f"{what}: the SkyPilot API server dropped the request {dropped} "
                            f"times in a row (restarts; {exc}); {self._left_running()}"
                        ) from None
                    log.warning("%s: %s; sending it again", what, exc)
                    continue
                if exc.sent and not resend:
                    raise LostRequest(str(exc)) from None
                waited = self._clock() - started
                if not retry:
                    raise LaunchError(f"{what}: SkyPilot API server unavailable ({exc})") from None
                left = self.api.patience_s - waited
                if left <= 0:
                    self.gave_up = "unreachable"
                    raise ApiUnavailableError(
                        f"{what}: the SkyPilot API server was unreachable for "
                        f"{waited / 60:.0f} min, as long as srifty-launch waits "
                        f"({self.api.patience_s / 60:.0f} min; {exc}); {self._left_running()}"
                    ) from None
                pause = min(wait, left)
                self.api_retries += 1
                log.warning("%s: API server unreachable (%s); retrying in %.0f s", what, exc, pause)
                self._sleep(pause)
                wait = min(wait * 2, self.api.longest_wait_s)
            else:
                self.gave_up = None
                return result

    @property
    def api_gone(self) -> bool:
        """The last API call gave up: a healthy job is not stopped for that."""
        return self.gave_up is not None

    @property
    def api_unreachable(self) -> bool:
        """The last API call gave up on an unreachable server: no teardown could
        reach it either (autostop takes the clusters down)."""
        return self.gave_up == "unreachable"

    def _left_running(self) -> str:
        """What happens to the run's clusters when the launcher gives up on the API."""
        where = str(self.run_dir) if self.run_dir is not None else "RUN_DIR"
        return (
            "what the run started was left running (a failed API call is no reason to "
            "stop a healthy job); SkyPilot takes each cluster down "
            f"{self.idle_minutes_to_autostop} min after its job ends; "
            f"`srifty down {where}` stops it all now"
        )

    @staticmethod
    def _call_once(
        request: Callable[[], Any],
        what: str,
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> Any:
        """Runs one SDK round trip, turning SkyPilot's errors into ours."""
        import requests
        import urllib3
        from sky import exceptions

        try:
            return request()
        except passthrough:
            raise
        except (
            exceptions.CloudUserIdentityError,
            exceptions.InvalidCloudCredentials,
            exceptions.NoCloudAccessError,
        ) as exc:
            raise CredentialsError(
                f"{what}: AWS credentials rejected by SkyPilot ({exc})"
            ) from None
        except exceptions.ResourcesUnavailableError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "no capacity"
            raise CapacityError(f"{what}: resources unavailable ({first})") from None
        except (exceptions.ClusterDoesNotExist, exceptions.ClusterNotUpError):
            raise
        except (exceptions.RequestInterruptedError, exceptions.RequestCancelled) as exc:
            # The server restarted with the request in flight (or an older server
            # marked it cancelled on its way down): it is gone and will not resume.
            raise _Transient(
                f"interrupted by an API server restart ({_first_line(exc)})",
                sent=True,
                interrupted=True,
            ) from None
        except (
            exceptions.ApiServerConnectionError,
            exceptions.ServerTemporarilyUnavailableError,
        ) as exc:
            # Raised before the request is sent (health check) or answered with 503
            # before it was taken: never acted on.
            raise _Transient(_first_line(exc), sent=False) from None
        except (
            requests.exceptions.RequestException,
            ConnectionError,
            urllib3.exceptions.HTTPError,
        ) as exc:
            raise _Transient(_first_line(exc), sent=True) from None
        except RuntimeError as exc:
            # Other client-side failures (no API server configured, version mismatch).
            raise LaunchError(
                f"{what}: SkyPilot API server unavailable ({_first_line(exc)})"
            ) from None
        except (SriftyError, AssertionError):
            raise
        except Exception as exc:
            # Whatever else the SDK raises is SkyPilot's answer (CommandError after
            # provisioning, ProvisionPrechecksError, ClusterSetUpError, a ValueError the
            # server sent back, ...): one line, and the caller tears down what it started.
            raise LaunchError(f"{what}: {type(exc).__name__}: {_first_line(exc)}") from None


class LostRequest(Exception):
    """A request that may have reached the server failed in transit (internal)."""


class InterruptedRequest(LostRequest):
    """The server took the request and dropped it on a restart (internal): nothing of
    it runs any more, but part of it may have happened."""


def _first_line(exc: BaseException) -> str:
    error_msg = getattr(exc, "error_msg", None)  # CommandError: its own words first
    if error_msg:
        failure = getattr(exc, "failure", "")
        return f"{str(error_msg).strip().splitlines()[0]}" + (f" ({failure})" if failure else "")
    text = str(exc).strip()
    if not text:
        reasons = getattr(exc, "reasons", None)  # ProvisionPrechecksError
        if reasons:
            return "; ".join(_first_line(r) for r in reasons)
    return text.splitlines()[0] if text else type(exc).__name__


def reconnectable(open_stream: Callable[[], Iterable[str | None]]) -> Callable[[], Any]:
    """A log stream whose restart interruptions read as a broken connection.

    A server restart ends a log stream with ``RequestInterruptedError`` (the stream's
    ``RETRY`` control, ``sky/utils/rich_utils.py: decode_rich_status``), which the SDK
    does not retry when the content is not preloaded; this turns it (and
    ``RequestCancelled``) into :class:`LaunchError`, which the log follower answers by
    opening the log again.
    """

    def stream() -> Iterator[str | None]:
        from sky import exceptions

        try:
            yield from open_stream()
        except (exceptions.RequestInterruptedError, exceptions.RequestCancelled) as exc:
            raise LaunchError(f"log stream interrupted ({_first_line(exc)})") from None

    return stream


def head_private_ip(handle: Any) -> str | None:
    """The head node's private IP from a SkyPilot resource handle, if it has one."""
    if handle is None:
        return None
    internal = getattr(handle, "cached_internal_ips", None)
    if internal:
        return str(internal[0])
    head = getattr(handle, "head_ip", None)
    return str(head) if head else None


def as_sky_job(handle: object) -> SkyJob:
    if not isinstance(handle, SkyJob):
        raise LaunchError(f"not a SkyPilot job handle: {handle!r}")
    return handle
