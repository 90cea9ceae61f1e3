"""SkyPilot adapter: plans become ``sky.Task``/``sky.Resources``; launch goes through the SDK.

What this module does:

- :func:`plan_to_resources` turns ranked plans into ``sky.Resources`` candidates, and
  :func:`make_time_estimator` lets SkyPilot's own optimizer rank them with *our*
  predicted time (it calls ``Task.estimate_runtime(resources)`` and multiplies by
  ``Resources.get_cost``), so both rankings can be compared.
- :func:`build_task` / :func:`build_tasks` write a real task: pinned instance type,
  spot, region (and zone), node count, ``SRIFTY_*`` settings and a ``torchrun`` run
  command whose script arguments are ``shlex``-quoted, so the script receives exactly
  the argv it was given.
- :func:`dry_run` writes the task YAMLs, reloads them with ``sky.Task.from_yaml`` and
  asks SkyPilot's optimizer, offline (:mod:`lightning_srifty.launch.sky_runtime`), to
  choose and price them; our price and SkyPilot's sit side by side in the report.
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

import fnmatch
import logging
import math
import secrets
import shlex
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lightning_srifty.core.cluster import ClusterGroup, Plan
from lightning_srifty.core.errors import (
    ApiUnavailableError,
    CapacityError,
    ConfigError,
    CredentialsError,
    LaunchError,
    PredictionError,
)
from lightning_srifty.core.launch_protocol import ENV_CHECKPOINT_URI
from lightning_srifty.io.cluster_ledger import ClusterLedger
from lightning_srifty.launch.backend import JobState, LaunchSpec
from lightning_srifty.launch.sky_runtime import (
    OfflineRuntime,
    OptimizerChoice,
    prepare_offline_runtime,
    run_offline_optimizer,
)

if TYPE_CHECKING:
    import sky

    from lightning_srifty.launch.controller import LogProgress

log = logging.getLogger(__name__)

CLOUD = "aws"

ENV_MASTER_ADDR = "SRIFTY_MASTER_ADDR"
"""Private IP of the rendezvous master; set at launch for every group but the first."""
ENV_NODE_RANK_OFFSET = "SRIFTY_NODE_RANK_OFFSET"
"""Nodes of all earlier groups; added to ``$SKYPILOT_NODE_RANK``."""
ENV_TOTAL_NODES = "SRIFTY_TOTAL_NODES"
"""``--nnodes`` of the whole (possibly heterogeneous) job."""
ENV_NPROC_PER_NODE = "SRIFTY_NPROC_PER_NODE"
"""Processes per node when a plan uses fewer accelerators than the instance has."""
ENV_GROUP_INDEX = "SRIFTY_GROUP_INDEX"
ENV_EXPECTED_HOURLY_USD = "SRIFTY_EXPECTED_HOURLY_USD"
"""Our catalog price for this task's nodes, so a dry run can compare with SkyPilot's."""

DEFAULT_MASTER_PORT = 29500
PRICE_TOLERANCE = 0.01
"""Relative price difference above which a dry run warns."""

SECRET_ENV_PATTERNS = ("AWS_SECRET*", "*TOKEN*", "*PASSWORD*", "*KEY*")
"""Env names that look like credentials; never written into a task (fnmatch, any case)."""

DRY_RUN_SCHEMA_VERSION = 1


# ---------------------------------------------------------------------------------------
# Resources and the time estimator
# ---------------------------------------------------------------------------------------


def group_resources(group: ClusterGroup, *, use_spot: bool, pin_zone: bool = True) -> sky.Resources:
    """``sky.Resources`` pinning one group's instance type, market, region (and zone).

    Accelerators are implied by the instance type, so they are not repeated: SkyPilot
    fills them in from its catalog, which is how its prices line up with ours.
    """
    import sky

    offer = group.offer
    if offer.price(use_spot) is None:
        market = "spot" if use_spot else "on-demand"
        raise ConfigError(
            f"{offer.instance_type} in {offer.zone} has no {market} price in the catalog; "
            "choose the other market or another zone"
        )
    infra = f"{CLOUD}/{offer.region}"
    if pin_zone and offer.zone:
        infra += f"/{offer.zone}"
    return sky.Resources(infra=infra, instance_type=offer.instance_type, use_spot=use_spot)


def plan_to_resources(plans: Sequence[Plan], *, pin_zone: bool = True) -> list[sky.Resources]:
    """One ``sky.Resources`` candidate per plan, in the given (best-first) order.

    Raises:
        ConfigError: a plan is heterogeneous; those need one task per group
            (:func:`build_tasks`), not one candidate.
    """
    resources = []
    for index, plan in enumerate(plans):
        if len(plan.cluster.groups) != 1:
            raise ConfigError(
                f"plan {index} ({plan.cluster.describe()}) has several instance groups; "
                "a SkyPilot candidate is one instance type - use build_tasks for it"
            )
        resources.append(
            group_resources(plan.cluster.groups[0], use_spot=plan.use_spot, pin_zone=pin_zone)
        )
    return resources


StepSecondsFn = Callable[[str, int], float]
"""``(instance_type, num_nodes) -> predicted seconds per step``."""


def make_time_estimator(
    step_seconds_fn: StepSecondsFn, steps: int, *, num_nodes: int = 1
) -> Callable[[sky.Resources], float]:
    """A ``Task.set_time_estimator`` callback: our predicted step time x steps.

    SkyPilot's optimizer passes only the candidate ``Resources``; the node count is the
    task's, so it is bound here.

    Raises:
        ConfigError: ``steps`` or ``num_nodes`` is not positive.
        PredictionError: (when called) the prediction is not a positive finite number.
    """
    if steps < 1 or num_nodes < 1:
        raise ConfigError(f"steps and num_nodes must be >= 1, got {steps} and {num_nodes}")

    def estimate(resources: sky.Resources) -> float:
        instance_type = resources.instance_type
        if instance_type is None:
            raise PredictionError(f"cannot predict step time for {resources}: no instance type")
        step_s = float(step_seconds_fn(instance_type, num_nodes))
        if not math.isfinite(step_s) or step_s <= 0:
            raise PredictionError(
                f"predicted step time for {num_nodes}x {instance_type} is {step_s!r}; "
                "expected a positive number of seconds"
            )
        return step_s * steps

    return estimate


# ---------------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------------


def is_secret_env_name(name: str) -> bool:
    """Whether ``name`` looks like it carries a credential (see SECRET_ENV_PATTERNS)."""
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in SECRET_ENV_PATTERNS)


def checked_envs(envs: Mapping[str, str], allow: Collection[str] = ()) -> dict[str, str]:
    """Copy of ``envs``, refusing names that look like credentials.

    Task envs end up in YAML files, SkyPilot's request log and every node's environment;
    credentials belong in the cloud's instance role, not there.

    Raises:
        ConfigError: a name matches SECRET_ENV_PATTERNS and is not in ``allow``; the
            message names the variables, never their values.
    """
    refused = sorted(name for name in envs if is_secret_env_name(name) and name not in allow)
    if refused:
        raise ConfigError(
            f"refusing to put credential-like environment variables into a SkyPilot task: "
            f"{', '.join(refused)} (names matching {', '.join(SECRET_ENV_PATTERNS)}); "
            "use an instance role, or allow a name explicitly if it is not a secret"
        )
    bad = sorted(name for name, value in envs.items() if not isinstance(value, str))
    if bad:
        raise ConfigError(f"environment values must be strings: {', '.join(bad)}")
    return dict(envs)


def run_command(
    script: str,
    script_args: Sequence[str],
    *,
    master_port: int = DEFAULT_MASTER_PORT,
    external_master: bool = False,
    launcher: str = "torchrun",
) -> str:
    """The task's ``run`` shell script: one ``torchrun`` agent per node.

    Every user-supplied word is ``shlex``-quoted, so hostile or odd arguments
    (``; rm -rf /``, ``$(whoami)``, spaces, quotes) reach the script verbatim.

    Args:
        script: The training script, relative to the workdir.
        script_args: Its arguments, passed through untouched.
        master_port: Rendezvous TCP port on the master.
        external_master: The master is another cluster's head (``SRIFTY_MASTER_ADDR``
            must be set); otherwise this cluster's first node is the master.
        launcher: The ``torchrun`` executable.
    """
    if not 1 <= master_port <= 65535:
        raise ConfigError(f"master port must be in 1..65535, got {master_port}")
    if external_master:
        master = f'"${{{ENV_MASTER_ADDR}:?the rendezvous master address is set at launch}}"'
    else:
        master = '"$(echo "$SKYPILOT_NODE_IPS" | head -n1)"'
    argv = " ".join(shlex.quote(word) for word in [script, *script_args])
    return "\n".join(
        [
            "set -euo pipefail",
            f"MASTER_ADDR={master}",
            f"NODE_RANK=$(( SKYPILOT_NODE_RANK + ${{{ENV_NODE_RANK_OFFSET}:-0}} ))",
            f"exec {shlex.quote(launcher)}"
            f' --nnodes="${{{ENV_TOTAL_NODES}:-$SKYPILOT_NUM_NODES}}"'
            ' --node-rank="$NODE_RANK"'
            f' --nproc-per-node="${{{ENV_NPROC_PER_NODE}:-$SKYPILOT_NUM_GPUS_PER_NODE}}"'
            ' --master-addr="$MASTER_ADDR"'
            f" --master-port={master_port}"
            f" {argv}",
        ]
    )


def build_task(
    plan_group: ClusterGroup,
    *,
    use_spot: bool,
    script: str,
    script_args: Sequence[str] = (),
    checkpoint_uri: str | None = None,
    envs: Mapping[str, str] | None = None,
    setup: str | None = None,
    workdir: str | None = None,
    file_mounts: Mapping[str, str] | None = None,
    num_nodes: int | None = None,
    name: str = "srifty",
    master_port: int = DEFAULT_MASTER_PORT,
    allow_env: Collection[str] = (),
    pin_zone: bool = True,
    launcher: str = "torchrun",
    rendezvous: Mapping[str, str] | None = None,
) -> sky.Task:
    """A ``sky.Task`` running ``script`` under ``torchrun`` on one plan group.

    Nothing is read from the process environment: only ``envs``, the checkpoint URI
    and the ``SRIFTY_*`` rendezvous settings go into the task.

    Args:
        plan_group: The instance type, zone and node count to run on.
        use_spot: Spot or on-demand market.
        script: The training script (relative to ``workdir`` on the nodes).
        script_args: Its arguments, passed through verbatim.
        checkpoint_uri: Where the job resumes from / checkpoints to.
        envs: Extra environment; credential-like names are refused.
        setup: Shell run once per node before the job (installs the package: see
            :func:`lightning_srifty.launch.shipping.setup_script`).
        workdir: Local folder SkyPilot syncs to the nodes.
        file_mounts: Remote path -> local path copied to every node (the wheel).
        num_nodes: Overrides ``plan_group.nodes``.
        name: Task (and cluster) name.
        master_port: Rendezvous port.
        allow_env: Names exempt from the credential check (not secrets after all).
        pin_zone: Pin the catalog zone (offline dry runs) or only the region (launch).
        launcher: The ``torchrun`` executable on the nodes.
        rendezvous: ``SRIFTY_*`` rendezvous settings from :func:`build_tasks`; a group
            index other than 0 makes the run command require ``SRIFTY_MASTER_ADDR``.

    Raises:
        ConfigError: bad node count, missing price, or a credential-like env name.
    """
    import sky

    nodes = plan_group.nodes if num_nodes is None else num_nodes
    if nodes < 1:
        raise ConfigError(f"num_nodes must be >= 1, got {nodes}")
    if not script:
        raise ConfigError("script must be a non-empty path")
    task_envs = checked_envs(envs or {}, allow_env)
    if checkpoint_uri:
        task_envs[ENV_CHECKPOINT_URI] = checkpoint_uri
    task_envs.update(rendezvous or {})
    offer = plan_group.offer
    if plan_group.gpus_per_node != offer.accelerator_count or offer.accelerator_count == 0:
        task_envs[ENV_NPROC_PER_NODE] = str(max(plan_group.gpus_per_node, 1))
    price = offer.price(use_spot)
    if price is not None:
        task_envs[ENV_EXPECTED_HOURLY_USD] = f"{price * nodes:.6f}"
    task = sky.Task(
        name=name,
        setup=setup,
        run=run_command(
            script,
            script_args,
            master_port=master_port,
            external_master=(rendezvous or {}).get(ENV_GROUP_INDEX, "0") != "0",
            launcher=launcher,
        ),
        envs=task_envs,
        workdir=workdir,
        num_nodes=nodes,
    )
    if file_mounts:
        task.set_file_mounts(dict(file_mounts))
    task.set_resources(group_resources(plan_group, use_spot=use_spot, pin_zone=pin_zone))
    return task


def build_tasks(
    plan: Plan,
    *,
    script: str,
    script_args: Sequence[str] = (),
    name: str = "srifty",
    master_addr: str | None = None,
    **task_options: Any,
) -> list[sky.Task]:
    """One task per plan group, sharing one rendezvous (see the module docstring).

    Args:
        plan: The plan; a homogeneous one gives a single task.
        script: The training script.
        script_args: Its arguments.
        name: Base name; groups are named ``<name>-g<i>``.
        master_addr: The first group's head IP, once known; tasks for later groups
            built without it refuse to start (the run command checks it).
        **task_options: Passed to :func:`build_task` (envs, setup, workdir, ...).

    Raises:
        ConfigError: the groups are in different regions.
    """
    groups = plan.cluster.groups
    if not groups:
        raise ConfigError("plan has no cluster groups")
    regions = sorted({g.offer.region for g in groups})
    if len(regions) > 1:
        raise ConfigError(
            f"plan spans regions {', '.join(regions)}; one rendezvous needs private-IP "
            "reachability, so all groups must be in one region"
        )
    total_nodes = sum(g.nodes for g in groups)
    tasks = []
    offset = 0
    for index, group in enumerate(groups):
        rendezvous = {
            ENV_GROUP_INDEX: str(index),
            ENV_TOTAL_NODES: str(total_nodes),
            ENV_NODE_RANK_OFFSET: str(offset),
        }
        if index > 0 and master_addr:
            rendezvous[ENV_MASTER_ADDR] = master_addr
        task_name = name if len(groups) == 1 else f"{name}-g{index}"
        tasks.append(
            build_task(
                group,
                use_spot=plan.use_spot,
                script=script,
                script_args=script_args,
                name=task_name,
                rendezvous=rendezvous,
                **task_options,
            )
        )
        offset += group.nodes
    return tasks


# ---------------------------------------------------------------------------------------
# Dry run through SkyPilot's own optimizer
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DryRunEntry:
    """One task: where its YAML is, what SkyPilot chose, and both prices."""

    task_name: str
    yaml_path: str
    sky_choice: OptimizerChoice
    our_hourly_usd: float | None
    """From the task's ``SRIFTY_EXPECTED_HOURLY_USD``; ``None`` when it has none."""

    @property
    def sky_hourly_usd(self) -> float:
        return self.sky_choice.hourly_usd

    @property
    def relative_difference(self) -> float | None:
        if self.our_hourly_usd is None or self.our_hourly_usd <= 0:
            return None
        return abs(self.sky_hourly_usd - self.our_hourly_usd) / self.our_hourly_usd

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_name": self.task_name,
            "yaml_path": self.yaml_path,
            "sky_choice": self.sky_choice.to_dict(),
            "sky_hourly_usd": self.sky_hourly_usd,
            "our_hourly_usd": self.our_hourly_usd,
            "relative_difference": self.relative_difference,
        }


@dataclass(frozen=True)
class DryRunReport:
    """SkyPilot accepted the tasks; its prices next to ours, with warnings on mismatch."""

    entries: tuple[DryRunEntry, ...]
    warnings: tuple[str, ...] = field(default=())
    report_path: str = ""

    @property
    def ok(self) -> bool:
        return not self.warnings

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": DRY_RUN_SCHEMA_VERSION,
            "entries": [entry.to_dict() for entry in self.entries],
            "warnings": list(self.warnings),
        }


def task_to_yaml(task: sky.Task) -> str:
    """The task as SkyPilot YAML (``Task.to_yaml_config`` dumped with PyYAML)."""
    import yaml

    return str(yaml.safe_dump(task.to_yaml_config(), sort_keys=False))


def dry_run(
    tasks: Sequence[sky.Task],
    out_dir: str | Path,
    *,
    runtime: OfflineRuntime | None = None,
    tolerance: float = PRICE_TOLERANCE,
) -> DryRunReport:
    """Writes the tasks as YAML, reloads them, and lets SkyPilot's optimizer price them.

    Runs offline with no credentials (see :mod:`lightning_srifty.launch.sky_runtime`).
    Writes ``task-<i>.yaml`` files and ``dry-run.json`` into ``out_dir``.

    Args:
        tasks: Tasks from :func:`build_task`/:func:`build_tasks`.
        out_dir: Folder for the YAML files and the report.
        runtime: A prepared offline runtime to reuse; a temporary one otherwise.
        tolerance: Relative price difference above which an entry gets a warning.

    Raises:
        LaunchError: SkyPilot rejected a task (the message carries its reason).
    """
    import json

    import sky

    if not tasks:
        raise ConfigError("dry run needs at least one task")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, task in enumerate(tasks):
        path = out / f"task-{index}.yaml"
        path.write_text(task_to_yaml(task), encoding="utf-8")
        sky.Task.from_yaml(str(path))  # SkyPilot's own parser must accept what we wrote.
        paths.append(path)
    with tempfile.TemporaryDirectory(prefix="srifty-sky-") as scratch:
        active = runtime or prepare_offline_runtime(Path(scratch) / "runtime")
        choices = run_offline_optimizer(active, paths, Path(scratch) / "optimizer.json")
    entries = []
    warnings = []
    for task, path, choice in zip(tasks, paths, choices, strict=True):
        raw_price = (task.envs or {}).get(ENV_EXPECTED_HOURLY_USD)
        ours = float(raw_price) if raw_price else None
        entry = DryRunEntry(task.name or "", str(path), choice, ours)
        entries.append(entry)
        diff = entry.relative_difference
        if ours is None:
            warnings.append(f"{entry.task_name}: no expected price to compare with SkyPilot's")
        elif diff is not None and diff > tolerance:
            warnings.append(
                f"{entry.task_name}: SkyPilot prices {choice.num_nodes}x "
                f"{choice.instance_type} ({'spot' if choice.use_spot else 'on-demand'}, "
                f"{choice.zone or choice.region}) at ${entry.sky_hourly_usd:.4f}/h, "
                f"we planned ${ours:.4f}/h ({diff:.1%} apart)"
            )
    report_path = out / "dry-run.json"
    report = DryRunReport(tuple(entries), tuple(warnings), str(report_path))
    report_path.write_text(json.dumps(report.to_dict(), indent=2), encoding="utf-8")
    return report


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
INIT_TIMEOUT_S = 300.0
"""How long a launched cluster may stay INIT (some nodes lost) before it counts as
preempted: SkyPilot itself never repairs it (``sky start`` would)."""


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
    cluster = (
        None if cluster_status is None else str(getattr(cluster_status, "value", cluster_status))
    )
    job = None if job_status is None else str(getattr(job_status, "value", job_status))
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

    def __init__(self, message: str, *, sent: bool):
        super().__init__(message)
        self.sent = sent
        """The request may have reached the server (a retry could act twice)."""


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
        keep_clusters: On Ctrl-C during a launch, leave what was started up.
        api: How long an unreachable API server is waited out.
        notice_window_s: See :data:`NOTICE_WINDOW_S`.
        init_timeout_s: See :data:`INIT_TIMEOUT_S`.
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
        idle_minutes_to_autostop: int | None = None,
        allow_env: Collection[str] = (),
        run_dir: str | Path | None = None,
        user_setup: str | None = None,
        setup: str | None = None,
        ship_package: bool = True,
        keep_clusters: bool = False,
        api: ApiPatience | None = None,
        notice_window_s: float = NOTICE_WINDOW_S,
        init_timeout_s: float = INIT_TIMEOUT_S,
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
        self._clock = clock
        self._sleep = sleep
        self._log_sleep = log_sleep
        self.run_id = run_id or secrets.token_hex(3)
        self.ledger = ClusterLedger(self.run_dir, self.run_id) if self.run_dir else None
        self.notes: list[str] = []
        """What preparing the task changed or decided (for the UI)."""
        self.api_retries = 0
        """API calls retried because the server was unreachable."""
        self._prepared: dict[str, Any] | None = None
        self._launches = 0
        self._progress: dict[str, LogProgress] = {}
        self._init_since: dict[str, float] = {}
        self._failed_since: dict[str, float] = {}
        self._draining: dict[str, float] = {}
        self._last_job: dict[str, str | None] = {}
        self._why: dict[str, str] = {}

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

    def down_recorded(self) -> list[str]:
        """Takes down every cluster the ledger lists as not down (``srifty down``)."""
        if self.ledger is None:
            return []
        names = [e.name for e in self.ledger.not_down() if e.kind == "cluster"]
        self._down_names(names)
        return names

    def _down_names(self, names: Sequence[str]) -> None:
        """Tears down each cluster (retried); ClusterDoesNotExist means already gone.

        Raises:
            LaunchError: a teardown kept failing; the message names ``srifty down``.
        """
        from sky import exceptions

        failed = []
        for cluster_name in reversed(list(names)):
            try:
                self._call(
                    lambda n=cluster_name: self.sdk.get(self.sdk.down(n)),  # type: ignore[misc]
                    f"down {cluster_name}",
                )
            except exceptions.ClusterDoesNotExist:
                pass
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

    def _call(
        self, request: Callable[[], Any], what: str, *, retry: bool = True, resend: bool = True
    ) -> Any:
        """One SDK round trip, turning SkyPilot's errors into ours, retrying outages.

        Args:
            request: The call.
            what: Names it in messages.
            retry: Wait out an unreachable API server (for :attr:`api`'s patience).
            resend: The call may be repeated even if it may have reached the server
                (reads and idempotent calls); a launch may not (:class:`_LostRequest`).
        """
        wait = self.api.first_wait_s
        started = self._clock()
        while True:
            try:
                return self._call_once(request, what)
            except _Transient as exc:
                if exc.sent and not resend:
                    raise _LostRequest(str(exc)) from None
                waited = self._clock() - started
                if not retry:
                    raise LaunchError(f"{what}: SkyPilot API server unavailable ({exc})") from None
                left = self.api.patience_s - waited
                if left <= 0:
                    raise ApiUnavailableError(
                        f"{what}: the SkyPilot API server was unreachable for "
                        f"{waited / 60:.0f} min, as long as srifty-launch waits "
                        f"({self.api.patience_s / 60:.0f} min; {exc})"
                    ) from None
                pause = min(wait, left)
                self.api_retries += 1
                log.warning("%s: API server unreachable (%s); retrying in %.0f s", what, exc, pause)
                self._sleep(pause)
                wait = min(wait * 2, self.api.longest_wait_s)

    @staticmethod
    def _call_once(request: Callable[[], Any], what: str) -> Any:
        """Runs one SDK round trip, turning SkyPilot's errors into ours."""
        import requests
        import urllib3
        from sky import exceptions

        try:
            return request()
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
        except LaunchError:
            self._down_names(started)
            raise
        except KeyboardInterrupt:
            if not self.keep_clusters:
                self._down_names(started)
            raise
        return SkyJob(tuple(launched), spec.plan.use_spot)

    def status(self, handle: object) -> JobState:
        job = _as_sky_job(handle)
        master = self._progress.get(job.clusters[0].name)
        return combine_states([self._cluster_state(c, master) for c in job.clusters])

    def follow_progress(self, handle: object) -> LogProgress:
        """Streams the master cluster's job log (rank zero prints its progress there)."""
        from sky import exceptions

        from lightning_srifty.launch.controller import LogProgress

        master = _as_sky_job(handle).clusters[0]

        def stream() -> Any:
            try:
                return self.sdk.tail_logs(
                    master.name, master.job_id, follow=True, preload_content=False
                )
            except (exceptions.ClusterNotUpError, exceptions.ClusterDoesNotExist) as exc:
                raise LaunchError(f"cannot follow the log of {master.name}: {exc}") from None

        progress = LogProgress(
            stream, f"the job log of {master.name}", sleep=self._log_sleep, reconnect_s=5.0
        )
        self._progress[master.name] = progress
        return progress

    def drain(self, handle: object, *, grace_s: float = 20.0) -> None:
        """Asks the job to stop: SkyPilot's cancel sends SIGTERM to the job's process
        group (``sky/skylet/job_lib.py: cancel_jobs``), which the callback answers with
        an emergency checkpoint; :meth:`status` waits up to ``grace_s`` for it."""
        from sky import exceptions

        for cluster in _as_sky_job(handle).clusters:
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
            self._why[c.name] for c in _as_sky_job(handle).clusters if c.name in self._why
        )

    def stop(self, handle: object) -> None:
        """Tears every cluster down (billing stops); clusters already gone are skipped."""
        job = _as_sky_job(handle)
        progress = self._progress.pop(job.clusters[0].name, None)
        if progress is not None:
            progress.stop()
        self._down_names([c.name for c in job.clusters])

    def _launch_task(self, task: sky.Task) -> SkyCluster:
        """Submits one task to its own cluster and waits until its job is submitted."""
        from sky import exceptions

        cluster_name = task.name or "srifty"
        if self.ledger is not None:
            self.ledger.mark(cluster_name, "launching")
        what = f"launch {cluster_name}"
        try:
            request = self._call(
                lambda: self.sdk.launch(
                    task,
                    cluster_name=cluster_name,
                    idle_minutes_to_autostop=self.idle_minutes_to_autostop,
                    down=False,
                ),
                what,
                resend=False,
            )
        except _LostRequest as lost:
            # The request may or may not have reached the server: make sure nothing of
            # it is left, then let the controller try again.
            self._down_names([cluster_name])
            raise CapacityError(f"{what}: the request was lost ({lost}); torn down") from None
        try:
            job_id, handle = self._call(lambda: self.sdk.stream_and_get(request), what)
        except KeyboardInterrupt:
            try:
                self.sdk.api_cancel(request)
            except (RuntimeError, OSError, exceptions.RequestCancelled) as exc:
                log.info("could not cancel the launch request of %s: %s", cluster_name, exc)
            raise
        if self.ledger is not None:
            self.ledger.mark(cluster_name, "up")
        return SkyCluster(cluster_name, job_id, _head_private_ip(handle))

    def _cluster_state(self, cluster: SkyCluster, progress: LogProgress | None) -> JobState:
        from sky import exceptions
        from sky.utils import common as sky_common

        name = cluster.name
        records = self._call(
            lambda: self.sdk.get(
                self.sdk.status([name], refresh=sky_common.StatusRefreshMode.AUTO)
            ),
            f"status of {name}",
        )
        record = next((r for r in records or [] if r["name"] == name), None)
        status = (
            None if record is None else str(getattr(record["status"], "value", record["status"]))
        )
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
                )
                raw = (statuses or {}).get(job_id)
                job_status = None if raw is None else str(getattr(raw, "value", raw))
            except exceptions.ClusterNotUpError:
                return self._init_state(name, now, progress)  # it went INIT meanwhile
            except exceptions.ClusterDoesNotExist:
                self._why[name] = f"{name} was terminated"
                return JobState.PREEMPTED
        self._init_since.pop(name, None)
        self._last_job[name] = job_status
        state = map_status(status, job_status, use_spot=False)
        if state is not JobState.FAILED:
            return state
        return self._failed_state(cluster, str(job_status), now, progress)

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


class _LostRequest(Exception):
    """A request that may have reached the server failed in transit (internal)."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _head_private_ip(handle: Any) -> str | None:
    """The head node's private IP from a SkyPilot resource handle, if it has one."""
    if handle is None:
        return None
    internal = getattr(handle, "cached_internal_ips", None)
    if internal:
        return str(internal[0])
    head = getattr(handle, "head_ip", None)
    return str(head) if head else None


def _as_sky_job(handle: object) -> SkyJob:
    if not isinstance(handle, SkyJob):
        raise LaunchError(f"not a SkyPilot job handle: {handle!r}")
    return handle
