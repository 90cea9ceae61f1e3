"""SkyPilot adapter: plans become ``sky.Task``/``sky.Resources``; launch goes through the SDK.

What this module does:

Tasks are built in :mod:`lightning_srifty.launch.sky_tasks`; SDK calls, retries and
status mapping live in :mod:`lightning_srifty.launch.sky_client`.

- :class:`SkyBackend` launches, polls, cancels and tears down through the SkyPilot SDK
  (``sky.launch``/``sky.status``/``sky.job_status``/``sky.cancel``/``sky.down``/
  ``sky.tail_logs`` via an API server), reading states the way SkyPilot 0.14 produces
  them (notice window, partial INIT, no capacity), retrying API outages, and keeping a
  ledger of the run's clusters (:class:`SkyClient`). Managed jobs live in
  :mod:`lightning_srifty.launch.sky_jobs`.

Heterogeneous plans (several instance types) become one SkyPilot cluster per group,
joined into one ``torchrun`` rendezvous: the first group's head node is the master; the
other groups are launched after it with ``SRIFTY_MASTER_ADDR`` set to its private IP,
``SRIFTY_NODE_RANK_OFFSET`` shifting their node ranks, and ``SRIFTY_TOTAL_NODES`` as
``--nnodes``. Limits, none of which SkyPilot manages for us:

- Reachability: the clusters must reach each other over private IPs, i.e. the same
  VPC and region (enforced: groups in different regions are refused). SkyPilot's
  default security group only opens SSH between *its own* cluster's nodes, so the
  rendezvous port and the collective's ports must be opened between the clusters'
  security groups (for example one shared group configured in ``~/.sky/config.yaml``
  under ``aws.security_group_name``).
- Launch order: groups launch one after the other, the master group first; the master's
  ``torchrun`` waits for the others (rendezvous timeout applies), so a slow or failed
  provisioning of a later group stalls or fails the whole job. A failure while
  launching tears down the clusters already up.
- Topology: NCCL sees a flat set of peers; it does not know which nodes share a
  placement group or a cluster, so cross-cluster links are treated like intra-cluster
  ones. Groups in different zones pay inter-zone latency and transfer cost.
- Zones: the catalog lists AWS *zone IDs* (``use1-az1``), which each account maps to
  its own zone names; offline dry runs pin the zone ID, real launches pin the region
  only (``pin_zone=False``) and let SkyPilot pick the zone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from lightning_srifty.core.errors import (
    ApiUnavailableError,
    CapacityError,
    LaunchError,
)
from lightning_srifty.launch.backend import JobState, LaunchSpec
from lightning_srifty.launch.sky_client import (
    InterruptedRequest,
    LostRequest,
    SkyClient,
    SkyCluster,
    SkyJob,
    as_sky_job,
    combine_states,
    head_private_ip,
    map_status,
    reconnectable,
    status_text,
)
from lightning_srifty.launch.sky_tasks import build_tasks

if TYPE_CHECKING:
    import sky

    from lightning_srifty.launch.controller import LogProgress


log = logging.getLogger(__name__)


class SkyBackend(SkyClient):
    """Runs a plan on its own SkyPilot clusters (one per plan group) and watches them.

    See :class:`SkyClient` for what every SkyPilot backend shares (names, ledger,
    shipping, retries, teardown). This one reads cluster and job states the way
    SkyPilot's own code produces them and decides what ended an attempt.
    """

    def cluster_names(self, spec: LaunchSpec, groups: int) -> list[str]:
        """This launch's cluster names: unique to the run, one per plan group."""
        base = f"{spec.name}-{self.run_id}"
        return [base] if groups == 1 else [f"{base}-g{i}" for i in range(groups)]

    def launch(self, spec: LaunchSpec) -> SkyJob:
        """Launches one cluster per plan group, master group first.

        Raises:
            CredentialsError: AWS is not enabled or its credentials are rejected.
            CapacityError: no capacity for a group (whatever was started is taken down).
            LaunchError: the API server stayed unreachable or provisioning failed.
        """
        self.check_credentials(retry=self._launches > 0)
        self._launches += 1
        options = self.task_options()
        options["envs"] = spec.envs
        names = self.cluster_names(spec, len(spec.plan.cluster.groups))
        base = names[0] if len(names) == 1 else names[0][: -len("-g0")]
        started: list[str] = []
        launched: list[SkyCluster] = []

        def tasks_for(master_addr: str | None) -> list[sky.Task]:
            return build_tasks(
                spec.plan,
                script=spec.script,
                script_args=spec.script_args,
                name=base,
                master_addr=master_addr,
                **options,
            )

        try:
            tasks = tasks_for(None)
            started.append(tasks[0].name or base)
            launched.append(self._launch_task(tasks[0]))
            if len(tasks) > 1:
                master_addr = launched[0].head_ip
                if not master_addr:
                    raise LaunchError(
                        f"cluster {launched[0].name} reported no head IP; cannot join groups"
                    )
                for task in tasks_for(master_addr)[1:]:
                    started.append(task.name or base)
                    launched.append(self._launch_task(task))
        except BaseException as exc:
            self._after_failed_launch(started, exc)
            raise
        return SkyJob(tuple(launched), spec.plan.use_spot)

    def _after_failed_launch(self, started: list[str], exc: BaseException) -> None:
        """Whatever ended a launch early takes down what it started: any exception
        (SkyPilot's, ours, a bug), and Ctrl-C/SIGTERM/SIGHUP unless ``keep_clusters``.
        Only an unreachable API server leaves them to their autostop (no teardown
        could reach it). A teardown that fails too is added to the message."""
        if isinstance(exc, KeyboardInterrupt) and self.keep_clusters:
            return
        if self.api_unreachable or not started:
            return
        try:
            self._down_names(started)
        except LaunchError as down_failed:
            if isinstance(exc, LaunchError):
                exc.args = (f"{exc}; {down_failed}",)
            else:
                log.error("%s", down_failed)

    def status(self, handle: object) -> JobState:
        job = as_sky_job(handle)
        master = self._progress.get(job.clusters[0].name)
        return combine_states([self._cluster_state(c, master) for c in job.clusters])

    def follow_progress(self, handle: object) -> LogProgress:
        """Streams the master cluster's job log (rank zero prints its progress there)."""
        from sky import exceptions

        from lightning_srifty.launch.controller import LogProgress

        master = as_sky_job(handle).clusters[0]

        def stream() -> Any:
            try:
                return self.sdk.tail_logs(
                    master.name, master.job_id, follow=True, preload_content=False
                )
            except (exceptions.ClusterNotUpError, exceptions.ClusterDoesNotExist) as exc:
                raise LaunchError(f"cannot follow the log of {master.name}: {exc}") from None

        progress = LogProgress(
            reconnectable(stream),
            f"the job log of {master.name}",
            sleep=self._log_sleep,
            reconnect_s=5.0,
        )
        self._progress[master.name] = progress
        return progress

    def drain(self, handle: object, *, grace_s: float = 20.0) -> None:
        """Asks the job to stop: SkyPilot's cancel sends SIGTERM to the job's process
        group (``sky/skylet/job_lib.py: cancel_jobs``), which the callback answers with
        an emergency checkpoint; :meth:`status` waits up to ``grace_s`` for it."""
        from sky import exceptions

        for cluster in as_sky_job(handle).clusters:
            self._draining[cluster.name] = self._clock() + grace_s
            job_ids = [cluster.job_id] if cluster.job_id is not None else None
            try:
                self._call(
                    lambda c=cluster, ids=job_ids: self.sdk.get(  # type: ignore[misc]
                        self.sdk.cancel(c.name, job_ids=ids)
                    ),
                    f"cancel the job on {cluster.name}",
                )
            except (exceptions.ClusterNotUpError, exceptions.ClusterDoesNotExist):
                continue

    def failure_detail(self, handle: object) -> str:
        """Why the job failed, in one line (empty when it did not)."""
        return "; ".join(
            self._why[c.name] for c in as_sky_job(handle).clusters if c.name in self._why
        )

    def stop(self, handle: object) -> None:
        """Tears every cluster down (billing stops); clusters already gone are skipped."""
        job = as_sky_job(handle)
        progress = self._progress.pop(job.clusters[0].name, None)
        if progress is not None:
            progress.stop()
        if self.api_gone:
            # The attempt ended because the API server stayed away: the job may be
            # healthy, and SkyPilot's autostop takes its clusters down when it ends.
            log.warning("not taking down %s: %s", job.clusters[0].name, self._left_running())
            return
        self._down_names([c.name for c in job.clusters])

    def _launch_task(self, task: sky.Task) -> SkyCluster:
        """Submits one task to its own cluster and waits until its job is submitted.

        A launch that a server restart dropped is sent again: launching a named
        cluster again provisions what is missing and reuses what is up
        (``sky/execution.py: launch``). Only when the first one got as far as
        submitting its job is that job taken over instead, so the cluster never runs
        two (:meth:`_adopt`).
        """
        from sky import exceptions

        cluster_name = task.name or "srifty"
        self.started.add(cluster_name)
        if self.ledger is not None:
            self.ledger.mark(cluster_name, "launching")
        what = f"launch {cluster_name}"
        for _ in range(self.api.reissues + 1):
            try:
                request = self._call(
                    lambda: self.sdk.launch(
                        task,
                        cluster_name=cluster_name,
                        idle_minutes_to_autostop=self.idle_minutes_to_autostop,
                        down=True,
                    ),
                    what,
                    resend=False,
                )
            except InterruptedRequest:
                adopted = self._adopt(cluster_name)
                if adopted is not None:
                    return adopted
                continue
            except LostRequest as lost:
                # The request may or may not have reached the server: make sure nothing
                # of it is left, then let the controller try again.
                self._down_names([cluster_name])
                raise CapacityError(f"{what}: the request was lost ({lost}); torn down") from None
            self._requests[cluster_name] = request
            if self.ledger is not None:
                self.ledger.mark(cluster_name, "launching", request_id=str(request))
            try:
                job_id, handle = self._call(
                    lambda r=request: self.sdk.stream_and_get(r),  # type: ignore[misc]
                    what,
                    reissue=False,
                )
            except InterruptedRequest as exc:
                self._requests.pop(cluster_name, None)  # dropped: it runs no more
                log.warning("%s: %s; launching it again", what, exc)
                self.api_reissues += 1
                adopted = self._adopt(cluster_name)
                if adopted is not None:
                    return adopted
                continue
            except KeyboardInterrupt:
                try:
                    self.sdk.api_cancel(request)
                except (RuntimeError, OSError, exceptions.RequestCancelled) as exc:
                    log.info("could not cancel the launch request of %s: %s", cluster_name, exc)
                raise
            except LaunchError as exc:
                if not isinstance(exc, ApiUnavailableError):
                    self._requests.pop(cluster_name, None)  # it ended, with this answer
                raise
            self._requests.pop(cluster_name, None)
            if self.ledger is not None:
                self.ledger.mark(cluster_name, "up")
            return SkyCluster(cluster_name, job_id, head_private_ip(handle))
        self.gave_up = "restarts"
        raise ApiUnavailableError(
            f"{what}: the SkyPilot API server dropped the launch {self.api.reissues + 1} "
            "times in a row (restarts)"
        )

    def _adopt(self, cluster_name: str) -> SkyCluster | None:
        """The job an interrupted launch already submitted, if it got that far.

        ``sky.launch`` names the job after the task (our cluster name); a cluster that
        is UP with such a job in its queue (``sky/client/sdk.py: queue``) needs no
        second launch. Anything less (no record, INIT, no job) is launched again.
        """
        from sky import exceptions
        from sky.utils import common as sky_common

        records = self._call(
            lambda: self.sdk.get(
                self.sdk.status([cluster_name], refresh=sky_common.StatusRefreshMode.NONE)
            ),
            f"status of {cluster_name}",
        )
        record = next((r for r in records or [] if r["name"] == cluster_name), None)
        if record is None or status_text(record["status"]) != "UP":
            return None
        try:
            jobs = self._call(
                lambda: self.sdk.get(self.sdk.queue(cluster_name, skip_finished=False)),
                f"job queue of {cluster_name}",
            )
        except (exceptions.ClusterNotUpError, exceptions.ClusterDoesNotExist):
            return None
        ours = [int(j["job_id"]) for j in jobs or [] if j["job_name"] == cluster_name]
        if not ours:
            return None
        log.info("%s: the interrupted launch had submitted job %d; following it", cluster_name,
                 max(ours))  # fmt: skip
        if self.ledger is not None:
            self.ledger.mark(cluster_name, "up")
        return SkyCluster(cluster_name, max(ours), head_private_ip(record["handle"]))

    def _read_status(self, name: str, refresh: str = "AUTO") -> str | None:
        """The cluster's ``ClusterStatus`` value (``None``: not listed any more)."""
        from sky.utils import common as sky_common

        mode = sky_common.StatusRefreshMode(refresh)
        records = self._call(
            lambda: self.sdk.get(self.sdk.status([name], refresh=mode)),
            f"status of {name}",
        )
        record = next((r for r in records or [] if r["name"] == name), None)
        return None if record is None else status_text(record["status"])

    def _cluster_state(
        self, cluster: SkyCluster, progress: LogProgress | None, *, refresh: str = "AUTO"
    ) -> JobState:
        from sky import exceptions

        name = cluster.name
        status = self._read_status(name, refresh)
        now = self._clock()
        if status is None or status == "STOPPED":
            if self._last_job.get(name) == "SUCCEEDED":
                return JobState.SUCCEEDED
            self._why[name] = f"{name} was {'terminated' if status is None else 'stopped'}"
            return JobState.PREEMPTED
        if status == "INIT":
            return self._init_state(name, now, progress)
        job_status = None
        if cluster.job_id is not None:
            job_id = cluster.job_id
            try:
                statuses = self._call(
                    lambda: self.sdk.get(self.sdk.job_status(name, [job_id])),
                    f"job status on {name}",
                    passthrough=(exceptions.CommandFailureException,),
                )
                raw = (statuses or {}).get(job_id)
                job_status = status_text(raw)
            except exceptions.ClusterNotUpError:
                return self._init_state(name, now, progress)  # it went INIT meanwhile
            except exceptions.ClusterDoesNotExist:
                self._why[name] = f"{name} was terminated"
                return JobState.PREEMPTED
            except exceptions.CommandFailureException as exc:
                return self._head_silent(cluster, progress, now, exc, refresh)
        self._silent_since.pop(name, None)
        self._init_since.pop(name, None)
        self._last_job[name] = job_status
        state = map_status(status, job_status, use_spot=False)
        if state is not JobState.FAILED:
            return state
        return self._failed_state(cluster, str(job_status), now, progress)

    def _head_silent(
        self,
        cluster: SkyCluster,
        progress: LogProgress | None,
        now: float,
        exc: BaseException,
        refresh: str,
    ) -> JobState:
        """``job_status`` could not reach the head (``CommandError`` from
        ``sky/backends/cloud_vm_ray_backend.py: get_job_status``) on a cluster that read
        UP. The status may be stale: a refresh that cannot take the cluster's status
        lock returns the cached record (``sky/backends/backend_utils.py:
        refresh_cluster_record``). So the cloud is asked (``FORCE``): a cluster gone,
        stopped or INIT is handled as such; one still UP whose head stays silent for
        :attr:`notice_window_s` (or whose job reported its emergency checkpoint) lost
        the attempt, which then moves on instead of crashing.
        """
        name = cluster.name
        if refresh != "FORCE":
            return self._cluster_state(cluster, progress, refresh="FORCE")
        if progress is not None and progress.saw_preemption:
            self._why[name] = f"{name}: the job saved an emergency checkpoint and its head went"
            return JobState.PREEMPTED
        since = self._silent_since.setdefault(name, now)
        if now - since < self.notice_window_s:
            log.warning("%s reads UP but its head does not answer (%s)", name, exc)
            return JobState.RUNNING
        self._why[name] = (
            f"{name} reads UP but its head did not answer for {now - since:.0f} s "
            f"({type(exc).__name__})"
        )
        return JobState.PREEMPTED

    def _init_state(self, name: str, now: float, progress: LogProgress | None) -> JobState:
        """A launched cluster in INIT lost nodes (``_update_cluster_status`` marks a
        partly terminated cluster abnormal): preempted once the job said so, or after
        :attr:`init_timeout_s`; until then it may still be repaired."""
        if progress is not None and progress.saw_preemption:
            self._why[name] = f"{name} lost nodes after the job's emergency checkpoint"
            return JobState.PREEMPTED
        since = self._init_since.setdefault(name, now)
        if now - since >= self.init_timeout_s:
            self._why[name] = f"{name} stayed INIT (nodes lost) for {now - since:.0f} s"
            return JobState.PREEMPTED
        return JobState.RUNNING

    def _failed_state(
        self, cluster: SkyCluster, job_status: str, now: float, progress: LogProgress | None
    ) -> JobState:
        """A terminal failure status on an UP cluster: a preemption, or a real failure?

        A spot node's job gets its notice, saves and exits with code 75 while the
        cluster is still UP; SkyPilot marks the job FAILED (the client API does not show
        exit codes: ``ClusterJobRecord`` has none). The job's log tells: a ``preempted``
        event means preempted; a complete log without one means a genuine failure.
        Without the log (the stream dropped), the notice window decides: a cluster that
        disappears within it was reclaimed (the next status call sees that).
        """
        name = cluster.name
        logs = f"`sky logs {name} {cluster.job_id}`"
        if job_status == "CANCELLED" and name in self._draining:
            if (progress is not None and progress.saw_preemption) or now >= self._draining[name]:
                return JobState.PREEMPTED
            return JobState.RUNNING
        if job_status == "FAILED_SETUP":
            self._why[name] = f"setup failed on {name} (FAILED_SETUP; see {logs})"
            return JobState.FAILED
        if job_status == "CANCELLED":
            self._why[name] = f"the job on {name} was cancelled outside srifty-launch"
            return JobState.FAILED
        if progress is not None and progress.saw_preemption:
            self._why[name] = f"{name}: the job saved an emergency checkpoint and exited"
            return JobState.PREEMPTED
        if job_status == "FAILED_DRIVER":
            self._why[name] = f"the job driver on {name} died (FAILED_DRIVER; see {logs})"
            return JobState.FAILED
        if progress is not None and progress.complete:
            self._why[name] = f"the job on {name} failed (see {logs})"
            return JobState.FAILED
        first = self._failed_since.setdefault(name, now)
        if now - first < self.notice_window_s:
            return JobState.RUNNING  # watch the cluster through a possible notice window
        self._why[name] = f"the job on {name} failed (see {logs})"
        return JobState.FAILED
