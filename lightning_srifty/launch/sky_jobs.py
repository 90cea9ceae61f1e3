"""SkyPilot managed jobs (``--backend sky-jobs``): recovery that outlives this machine.

With ``--backend sky`` this machine's controller watches the clusters and migrates the
job itself, so the laptop must stay on. A managed job hands that to SkyPilot's jobs
controller (a small VM it runs for you): the job is one task whose ``ordered``
resources are the planner's best plans of one shape, and on a preemption SkyPilot
relaunches it (``job_recovery``: on the next offer with our plugin's
``SRIFTY_NEXT_OFFER``, else from #1, the preempted offer first; see
:func:`choose_recovery`) while the job resumes from the checkpoint store.
``srifty-launch`` submits it and follows ``sky.jobs.queue_v2`` and the job's log for the
live view and the summary; with ``--keep-clusters`` it may be closed or killed at any
time (otherwise Ctrl-C, SIGTERM and SIGHUP cancel the job).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lightning_srifty.core.cluster import Plan
from lightning_srifty.core.errors import ApiUnavailableError, ConfigError, LaunchError
from lightning_srifty.launch.backend import JobState, LaunchSpec
from lightning_srifty.launch.sky_client import (
    InterruptedRequest,
    LostRequest,
    SkyClient,
    SkyJobsSdk,
    real_jobs_sdk,
    reconnectable,
    status_text,
)
from lightning_srifty.launch.sky_tasks import (
    ENV_GROUP_INDEX,
    ENV_TOTAL_NODES,
    build_task,
    group_resources,
)

if TYPE_CHECKING:
    import sky

    from lightning_srifty.launch.controller import LogProgress

log = logging.getLogger(__name__)

MANAGED_RECOVERY = "EAGER_NEXT_REGION"
"""SkyPilot's default strategy. In 0.14.1 it relaunches the ordered resources from #1,
the offer just preempted included (see :mod:`lightning_srifty.launch.sky_recovery`)."""
NEXT_OFFER = "SRIFTY_NEXT_OFFER"
"""Our strategy (a SkyPilot plugin): the preempted offer is retried last."""
AUTO_RECOVERY = "auto"
"""``--job-recovery auto`` (the default): :data:`NEXT_OFFER` when the API server has
loaded our plugin, else :data:`MANAGED_RECOVERY` (see :func:`choose_recovery`)."""
STRATEGIES = (MANAGED_RECOVERY, "FAILOVER", NEXT_OFFER)
"""The ``job_recovery`` strategies a task may name."""
JOB_RECOVERIES = (AUTO_RECOVERY, *STRATEGIES)
"""``--job-recovery`` choices."""
INSTALL_HINT = "python -m lightning_srifty.launch.sky_recovery DIR"
"""Writes the plugin's controller wheel and the API server's two plugin files."""
ORDERED_CANDIDATES = 5
"""How many of the planner's same-shape plans become ``ordered`` resources."""

# sky.jobs.state.ManagedJobStatus values -> our coarse states.
_MANAGED_STATES = {
    "PENDING": JobState.PENDING,
    "SUBMITTED": JobState.PENDING,
    "STARTING": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "RECOVERING": JobState.PENDING,  # waiting for nodes again: no progress is due
    "WINDING_DOWN": JobState.RUNNING,
    "CANCELLING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "CANCELLED": JobState.FAILED,
    "FAILED": JobState.FAILED,
    "FAILED_SETUP": JobState.FAILED,
    "FAILED_PRECHECKS": JobState.FAILED,
    "FAILED_NO_RESOURCE": JobState.FAILED,
    "FAILED_CONTROLLER": JobState.FAILED,
}


def server_plugins(timeout_s: float = 10.0) -> list[dict[str, Any]] | None:
    """The plugins the API server loaded, as it lists them; ``None`` if it cannot say.

    SkyPilot 0.14.1 serves ``GET /api/plugins`` (``sky/server/server.py:
    list_plugins``: ``name``, ``version`` and ``commit`` of each loaded plugin). It is
    asked through SkyPilot's own client helper (``sky/server/common.py:
    make_authenticated_request``: the configured endpoint, service-account token or
    cookies) and once, without SkyPilot's retries: an unreachable server, an older one
    (404), a 503 or an answer that is not the expected JSON all mean "cannot say",
    never a crash.
    """
    import requests
    from sky import exceptions
    from sky.server import common as server_common

    try:
        response = server_common.make_authenticated_request(
            "GET", "/api/plugins", retry=False, timeout=timeout_s
        )
        if response.status_code != 200:
            return None
        listed = response.json().get("plugins")
    except (
        requests.RequestException,
        exceptions.ServerTemporarilyUnavailableError,
        ValueError,  # not JSON
        AttributeError,  # JSON, but not an object
    ):
        return None
    if not isinstance(listed, list):
        return None
    return [dict(p) for p in listed if isinstance(p, dict)]


def choose_recovery(plugins: Sequence[dict[str, Any]] | None) -> tuple[str, str]:
    """``--job-recovery auto``: the strategy, and the one line to show when it is not ours.

    ``plugins`` is what :func:`server_plugins` returned. With our plugin loaded
    (:data:`~lightning_srifty.launch.sky_recovery.PLUGIN_NAME`) the job recovers
    with :data:`NEXT_OFFER` and nothing needs saying; otherwise with SkyPilot's
    default, and the line says what SkyPilot will then do and how to get ours.
    """
    from lightning_srifty.launch.sky_recovery import PLUGIN_NAME

    if plugins is not None and any(p.get("name") == PLUGIN_NAME for p in plugins):
        return NEXT_OFFER, ""
    why = (
        "the API server did not say which plugins it loaded (unreachable, or too old to list them)"
        if plugins is None
        else f"the API server has not loaded the {PLUGIN_NAME} plugin"
    )
    return MANAGED_RECOVERY, (
        f"--job-recovery auto: {why}, so SkyPilot recovers with {MANAGED_RECOVERY}: after a "
        "preemption it relaunches the ordered resources from #1, the offer just preempted "
        f"first; to move on to the next offer instead ({NEXT_OFFER}), run `{INSTALL_HINT}`, "
        "put the files it writes in the API server's ~/.sky/ and restart it"
    )


def same_shape(plans: Sequence[Plan], limit: int = ORDERED_CANDIDATES) -> list[Plan]:
    """The first plan and the next ones of the same shape, best first.

    Same shape means one instance group with the same node count and processes per
    node, so any of them runs the same job (world size, batch split). Duplicates that
    launch identically once the zone is left to SkyPilot (type, region, market) are
    dropped.
    """
    if not plans:
        raise ConfigError("no plan to launch")
    first = plans[0]
    if len(first.cluster.groups) != 1:
        raise ConfigError(
            f"managed jobs run one instance type; plan {first.cluster.describe()} mixes "
            "several (plan without mixes for --backend sky-jobs)"
        )
    shape = (first.cluster.groups[0].nodes, first.cluster.groups[0].gpus_per_node)
    chosen: list[Plan] = []
    seen: set[tuple[str, str, bool]] = set()
    for plan in plans:
        if len(plan.cluster.groups) != 1:
            continue
        group = plan.cluster.groups[0]
        key = (group.offer.instance_type, group.offer.region, plan.use_spot)
        if (group.nodes, group.gpus_per_node) != shape or key in seen:
            continue
        seen.add(key)
        chosen.append(plan)
        if len(chosen) >= limit:
            break
    return chosen


def managed_task(
    plans: Sequence[Plan],
    *,
    script: str,
    script_args: Sequence[str] = (),
    name: str = "srifty",
    recovery: str = MANAGED_RECOVERY,
    **task_options: Any,
) -> sky.Task:
    """One task whose ``ordered`` resources are ``plans`` (same shape), best first.

    ``job_recovery`` is the same on every candidate, as SkyPilot requires
    (``sky/jobs/recovery_strategy.py: StrategyExecutor.make``): the named strategy
    (:data:`JOB_RECOVERIES`; ``SRIFTY_NEXT_OFFER`` needs the plugin of
    :mod:`~lightning_srifty.launch.sky_recovery` on the API server), no
    restarts on user errors, and ``recover_on_exit_codes: [75]`` so a job that saved an
    emergency checkpoint on its notice and exited while the cluster was still UP is
    recovered, not failed (``sky/jobs/controller.py``: a FAILED job on an UP cluster
    is a user failure unless its exit code is listed).

    Raises:
        ConfigError: the plans differ in shape or are heterogeneous.
    """
    from lightning_srifty.core.launch_protocol import PREEMPTED_EXIT_CODE

    if not plans:
        raise ConfigError("no plan to launch")
    if recovery not in STRATEGIES:
        raise ConfigError(
            f"--job-recovery {recovery!r} is not valid here: use one of {', '.join(STRATEGIES)}"
        )
    if recovery == NEXT_OFFER:
        # Registers the strategy here too, so SkyPilot code in this process accepts it;
        # the API server and the jobs controller load it as a plugin.
        import lightning_srifty.launch.sky_recovery  # noqa: F401
    shapes = {
        (len(p.cluster.groups), p.cluster.groups[0].nodes, p.cluster.groups[0].gpus_per_node)
        for p in plans
    }
    if len(shapes) != 1 or next(iter(shapes))[0] != 1:
        raise ConfigError("ordered resources of a managed job must share one shape")
    first = plans[0]
    task = build_task(
        first.cluster.groups[0],
        use_spot=first.use_spot,
        script=script,
        script_args=script_args,
        name=name,
        rendezvous={ENV_GROUP_INDEX: "0", ENV_TOTAL_NODES: str(first.cluster.nodes)},
        **task_options,
    )
    job_recovery = {
        "strategy": recovery,
        "max_restarts_on_errors": 0,
        "recover_on_exit_codes": [PREEMPTED_EXIT_CODE],
    }
    pin_zone = bool(task_options.get("pin_zone", False))
    resources = [
        group_resources(
            p.cluster.groups[0], use_spot=p.use_spot, pin_zone=pin_zone, efa=p.cluster.uses_efa
        ).copy(job_recovery=dict(job_recovery))
        for p in plans
    ]
    task.set_resources(resources)  # a list: SkyPilot tries them in this order
    return task


@dataclass(frozen=True)
class ManagedJob:
    """Handle of a SkyPilot managed job."""

    name: str
    job_id: int
    use_spot: bool


class SkyJobsBackend(SkyClient):
    """Runs the whole job as one SkyPilot managed job (``sky.jobs.launch``).

    SkyPilot's jobs controller, not this machine, recovers it from preemptions: it
    relaunches on the ``ordered`` resources (the planner's best plans of the same
    shape; where it starts depends on the strategy, :func:`choose_recovery`) and the
    job resumes from the checkpoint store. ``srifty-launch``
    only follows it (``sky.jobs.queue_v2`` and the job's log) and prints the summary.
    Ctrl-C, SIGTERM and SIGHUP cancel the job unless ``keep_clusters``; a failed API
    call never does.

    Args:
        candidates: The planner's ranked plans; :func:`same_shape` picks from them.
        jobs_sdk: The managed-jobs SDK surface (the real one by default).
        recovery: ``--job-recovery``: a strategy name, or ``auto``
            (:func:`choose_recovery`, decided on the first launch or by
            :meth:`resolve_recovery`).
        plugins: Asks the API server which plugins it loaded (:func:`server_plugins`
            by default).
        **options: As :class:`~lightning_srifty.launch.sky_client.SkyClient`.
    """

    name = "skypilot-jobs"

    def __init__(
        self,
        *,
        candidates: Sequence[Plan] = (),
        jobs_sdk: SkyJobsSdk | None = None,
        recovery: str = AUTO_RECOVERY,
        plugins: Callable[[], Sequence[dict[str, Any]] | None] = server_plugins,
        **options: Any,
    ):
        super().__init__(**options)
        if recovery not in JOB_RECOVERIES:
            raise ConfigError(
                f"--job-recovery {recovery!r} is not valid: use one of {', '.join(JOB_RECOVERIES)}"
            )
        self.candidates = tuple(candidates)
        self.recovery = recovery
        """``--job-recovery`` as given."""
        self.strategy: str | None = None if recovery == AUTO_RECOVERY else recovery
        """The ``job_recovery`` strategy the task names (``None``: not decided yet)."""
        self._plugins = plugins
        self._jobs_sdk = jobs_sdk
        self._records: dict[int, Any] = {}
        self._placements: dict[int, dict[int, str]] = {}

    def resolve_recovery(self) -> str:
        """Decides ``--job-recovery auto`` (once) by asking the API server for its
        plugins; returns the line to show the user ("" when there is nothing to say).

        The server is checked first (:meth:`check_credentials`, which also starts a
        local API server as SkyPilot's SDK does), so a local server that is about to
        load the plugin is asked, not missed.
        """
        if self.strategy is not None:
            return ""
        self.check_credentials()
        self.strategy, line = choose_recovery(self._plugins())
        if line:
            self.notes.append(line)
        return line

    @property
    def planned_strategy(self) -> str:
        """The strategy a dry run writes into the task: the decided one, else what
        SkyPilot uses without our plugin (a dry run does not ask the API server)."""
        return self.strategy or MANAGED_RECOVERY

    @property
    def jobs_sdk(self) -> SkyJobsSdk:
        if self._jobs_sdk is None:
            self._jobs_sdk = real_jobs_sdk()
        return self._jobs_sdk

    def ordered_plans(self, first: Plan) -> list[Plan]:
        """``first`` and the candidates of its shape, best first."""
        rest = [p for p in self.candidates if p != first]
        return same_shape([first, *rest])

    def launch(self, spec: LaunchSpec) -> ManagedJob:
        if self.strategy is None:  # nobody asked before: say it here, once
            line = self.resolve_recovery()  # checks the server and its clouds first
            if line:
                log.warning("%s", line)
        else:
            self.check_credentials(retry=self._launches > 0)
        self._launches += 1
        options = self.task_options()
        options["envs"] = spec.envs
        name = f"{spec.name}-{self.run_id}"
        task = managed_task(
            self.ordered_plans(spec.plan),
            script=spec.script,
            script_args=spec.script_args,
            name=name,
            recovery=self.planned_strategy,
            **options,
        )
        self.started.add(name)
        if self.ledger is not None:
            self.ledger.mark(name, "launching", kind="managed-job")
        job_ids = self._submit(task, name)
        if not job_ids:
            raise LaunchError(f"SkyPilot returned no managed job id for {name}")
        job_id = int(job_ids[0])
        if self.ledger is not None:
            self.ledger.mark(name, "up", kind="managed-job", job_id=job_id)
        return ManagedJob(name, job_id, spec.plan.use_spot)

    def _submit(self, task: sky.Task, name: str) -> list[int]:
        """Submits the managed job; a submission a server restart dropped is sent again
        only when the queue has no job of this name (unique to the run and attempt),
        so the job never starts twice."""
        what = f"submit {name}"
        for _ in range(self.api.reissues + 1):
            try:
                request = self._call(
                    lambda: self.jobs_sdk.launch(task, name=name), what, resend=False
                )
            except InterruptedRequest:
                found = self._find_by_name(name)
                if found:
                    return found
                continue
            except LostRequest as lost:
                raise LaunchError(
                    f"submitting managed job {name} failed in transit ({lost}); check "
                    f"`sky jobs queue` for a job named {name} before launching again"
                ) from None
            try:
                job_ids, _ = self._call(
                    lambda r=request: self.sdk.stream_and_get(r),  # type: ignore[misc]
                    what,
                    reissue=False,
                )
            except InterruptedRequest as exc:
                log.warning("%s: %s; looking for it in the queue", what, exc)
                self.api_reissues += 1
                found = self._find_by_name(name)
                if found:
                    return found
                continue
            return [int(i) for i in job_ids or []]
        self.gave_up = "restarts"
        raise ApiUnavailableError(
            f"{what}: the SkyPilot API server dropped the submission "
            f"{self.api.reissues + 1} times in a row (restarts)"
        )

    def _find_by_name(self, name: str) -> list[int]:
        """Ids of this user's managed jobs named exactly ``name`` (newest last)."""
        result = self._call(
            lambda: self.sdk.get(
                self.jobs_sdk.queue_v2(
                    refresh=False, name_match=name, fields=["job_id", "job_name", "status"]
                )
            ),
            f"look for managed job {name}",
        )
        records = result[0] if isinstance(result, tuple) else result
        return sorted(int(r["job_id"]) for r in records or [] if r["job_name"] == name)

    def _record(self, job: ManagedJob) -> Any:
        """The job's queue record, with ``failure_reason``: SkyPilot's default fields
        (``sky/jobs/constants.py: DEFAULT_MANAGED_JOB_FIELDS``) leave it out."""
        from sky import exceptions
        from sky.jobs import constants

        fields = [*constants.DEFAULT_MANAGED_JOB_FIELDS, "failure_reason", *_PLACEMENT_FIELDS]

        def read(refresh: bool) -> Any:
            return self._call(
                lambda: self.sdk.get(
                    self.jobs_sdk.queue_v2(refresh=refresh, job_ids=[job.job_id], fields=fields)
                ),
                f"status of managed job {job.job_id}",
            )

        try:
            result = read(False)
        except exceptions.ClusterNotUpError:
            # The controller stopped (every managed job ended): only a refresh, which
            # starts it again, shows how this one ended.
            result = read(True)
        records = result[0] if isinstance(result, tuple) else result
        record = next((r for r in records or [] if int(r["job_id"]) == job.job_id), None)
        if record is None:
            raise LaunchError(f"managed job {job.job_id} ({job.name}) is not in the queue")
        self._records[job.job_id] = record
        where = _placement(record)
        if where:
            runs = self._placements.setdefault(job.job_id, {})
            runs[int(record.get("recovery_count") or 0)] = where
        return record

    def status(self, handle: object) -> JobState:
        job = _as_managed(handle)
        record = self._record(job)
        raw = record["status"]
        status = str(status_text(raw))
        if status not in _MANAGED_STATES:
            raise LaunchError(f"unknown managed job status {status!r}")
        state = _MANAGED_STATES[status]
        if state is JobState.FAILED:
            reason = record.get("failure_reason")
            detail = str(reason).strip().splitlines()[0] if reason else ""
            self._why[job.name] = f"managed job {job.job_id} ended {status}" + (
                f": {detail}" if detail else ""
            )
        if state.is_terminal and self.ledger is not None:
            self.ledger.mark(job.name, "down", kind="managed-job", job_id=job.job_id)
        return state

    def recoveries(self, handle: object) -> int:
        """How often SkyPilot recovered the job (preemptions it survived)."""
        record = self._records.get(_as_managed(handle).job_id)
        return int((record["recovery_count"] if record is not None else 0) or 0)

    def placements(self, handle: object) -> tuple[str, ...]:
        """Where SkyPilot ran the job, first launch then each recovery, as its queue
        showed it while the job was RUNNING (the launched resources and infra)."""
        runs = self._placements.get(_as_managed(handle).job_id, {})
        return tuple(runs[k] for k in sorted(runs))

    def follow_progress(self, handle: object) -> LogProgress:
        from lightning_srifty.launch.controller import LogProgress

        job = _as_managed(handle)

        def stream() -> Any:
            return self.jobs_sdk.tail_logs(job_id=job.job_id, follow=True, preload_content=False)

        progress = LogProgress(
            reconnectable(stream), f"the log of managed job {job.job_id}", sleep=self._log_sleep
        )
        self._progress[job.name] = progress
        return progress

    def failure_detail(self, handle: object) -> str:
        return self._why.get(_as_managed(handle).name, "")

    def stop(self, handle: object) -> None:
        """Cancels the job unless it already ended; its clusters go with it."""
        job = _as_managed(handle)
        progress = self._progress.pop(job.name, None)
        if progress is not None:
            progress.stop()
        record = self._records.get(job.job_id)
        raw = None if record is None else record["status"]
        status = status_text(raw)
        if status is not None and _MANAGED_STATES.get(status, JobState.PENDING).is_terminal:
            return
        if self.api_gone:
            # Following the job failed, not the job: SkyPilot's controller keeps it.
            log.warning("not cancelling managed job %d: %s", job.job_id, self._left_running())
            return
        self._cancel_confirmed(job.name, job.job_id)

    def live_recorded(self) -> list[str]:
        """As :meth:`SkyClient.live_recorded`, plus the run's managed jobs not yet ended."""
        live = super().live_recorded()
        if self.ledger is None:
            return live
        jobs = [e for e in self.ledger.not_down() if e.kind == "managed-job"]
        if not jobs:
            return live
        from sky import exceptions

        try:
            result = self._call(
                lambda: self.sdk.get(self.jobs_sdk.queue_v2(refresh=False)),
                "managed job queue",
            )
        except exceptions.ClusterNotUpError as exc:
            if status_text(getattr(exc, "cluster_status", None)) in (None, "STOPPED"):
                return live  # SkyPilot stops its jobs controller only once none runs
            raise LaunchError(
                f"managed job queue: SkyPilot's jobs controller is not reachable yet ({exc})"
            ) from None
        records = result[0] if isinstance(result, tuple) else result
        for entry in jobs:
            for record in records or []:
                same = (
                    int(record["job_id"]) == entry.job_id
                    if entry.job_id is not None
                    else record.get("job_name") == entry.name
                )
                raw = record["status"]
                status = str(status_text(raw))
                if same and not _MANAGED_STATES.get(status, JobState.PENDING).is_terminal:
                    live.append(f"managed job {entry.job_id or entry.name} ({status})")
        return live

    def down_recorded(self, *, ours: bool = False) -> list[str]:
        names = super().down_recorded(ours=ours)
        if self.ledger is None:
            return names
        for entry in self.ledger.not_down():
            if entry.kind != "managed-job" or (ours and entry.name not in self.started):
                continue
            self._cancel_confirmed(entry.name, entry.job_id)
            names.append(entry.name)
        return names

    def _cancel_confirmed(self, name: str, job_id: int | None) -> None:
        """Cancels the managed job and marks it down once the queue shows it ended.

        Without an id (submitted, but interrupted before the id came back) it is found
        by its name, unique to the run, and one that does not show up is looked for
        :attr:`down_rechecks` more times: its submission may still be on its way. A
        stopped jobs controller means every managed job has ended (SkyPilot stops it
        only then; ``cancel`` and ``queue_v2`` raise ``ClusterNotUpError``,
        ``sky/backends/backend_utils.py: is_controller_accessible``).

        Raises:
            LaunchError: the controller is not reachable (starting), or the job did
                not end.
        """
        from sky import exceptions

        needed = 1 + (self.down_rechecks if job_id is None else 0)
        quiet = 0
        cancels = 0
        try:
            for _ in range(needed + 2 * self.down_rechecks + 2):
                live = self._live_jobs(name, job_id)
                if not live:
                    quiet += 1
                    if quiet >= needed:
                        break
                    self._sleep(self.down_recheck_s)
                    continue
                quiet = 0
                if cancels and all(status == "CANCELLING" for status in live.values()):
                    self._sleep(self.down_recheck_s)  # the controller is on it
                    continue
                cancels += 1
                ids = sorted(live)
                self._call(
                    lambda i=ids: self.sdk.get(self.jobs_sdk.cancel(job_ids=i)),  # type: ignore[misc]
                    f"cancel managed job {name}",
                )
            else:
                raise LaunchError(
                    f"managed job {name} did not end after cancelling it {cancels} time(s)"
                )
        except exceptions.ClusterNotUpError as exc:
            status = status_text(getattr(exc, "cluster_status", None))
            if status not in (None, "STOPPED"):
                raise LaunchError(
                    f"cancel managed job {name}: SkyPilot's jobs controller is {status}, not "
                    "reachable yet; try again in a few minutes"
                ) from None
            self.notes.append(
                f"{name}: SkyPilot's jobs controller is stopped, which it does only once no "
                "managed job runs: the job has ended"
            )
        if self.ledger is not None:
            self.ledger.mark(name, "down", kind="managed-job", job_id=job_id)

    def _live_jobs(self, name: str, job_id: int | None) -> dict[int, str]:
        """The job's (or, without an id, the jobs named ``name``'s) status, for those
        not ended yet."""
        by: dict[str, Any] = {"job_ids": [job_id]} if job_id is not None else {"name_match": name}
        result = self._call(
            lambda: self.sdk.get(
                self.jobs_sdk.queue_v2(refresh=False, fields=["job_id", "job_name", "status"], **by)
            ),
            f"status of managed job {name}",
        )
        records = result[0] if isinstance(result, tuple) else result
        live = {}
        for r in records or []:
            if r["job_name"] != name or (job_id is not None and int(r["job_id"]) != job_id):
                continue
            status = status_text(r["status"])
            if status is None or not _MANAGED_STATES.get(status, JobState.PENDING).is_terminal:
                live[int(r["job_id"])] = str(status)
        return live


_PLACEMENT_FIELDS = ("cluster_resources", "infra")
"""Queue fields that say where the job runs: SkyPilot fills them from the cluster
handle's launched resources (``sky/jobs/utils.py: _populate_job_record_from_handle``)."""


def _placement(record: Any) -> str:
    """``1x[spot](gpus=T4:4, g4dn.12xlarge, ...) AWS/us-east-1a`` while RUNNING, else
    "" (between launches SkyPilot shows the requested resources, not where it runs)."""
    if status_text(record["status"]) != "RUNNING":
        return ""
    resources = record.get("cluster_resources")
    infra = record.get("infra")
    if not resources or resources == "-":
        return ""
    return f"{resources} {infra}" if infra and infra != "-" else str(resources)


def _as_managed(handle: object) -> ManagedJob:
    if not isinstance(handle, ManagedJob):
        raise LaunchError(f"not a managed job handle: {handle!r}")
    return handle
