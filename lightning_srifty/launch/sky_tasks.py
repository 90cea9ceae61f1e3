"""SkyPilot tasks from plans: resources, the node's run command, dry runs.

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

Heterogeneous plans: see :mod:`lightning_srifty.launch.sky_backend`.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import shlex
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_srifty.core.cluster import ClusterGroup, Plan
from lightning_srifty.core.errors import (
    ConfigError,
    PredictionError,
)
from lightning_srifty.core.launch_protocol import (
    ENV_CHECKPOINT_URI,
    ENV_GPU_CHECK,
    ENV_LIGHTNING_VERSION,
    ENV_STATE_DIR,
    ENV_TORCH_VERSION,
    PREEMPTED_EXIT_CODE,
    PREEMPTED_MARKER,
)
from lightning_srifty.launch.sky_runtime import (
    OfflineRuntime,
    OptimizerChoice,
    prepare_offline_runtime,
    run_offline_optimizer,
)

if TYPE_CHECKING:
    import sky


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


def group_resources(
    group: ClusterGroup, *, use_spot: bool, pin_zone: bool = True, efa: bool | None = None
) -> sky.Resources:
    """``sky.Resources`` pinning one group's instance type, market, region (and zone).

    Accelerators are implied by the instance type, so they are not repeated: SkyPilot
    fills them in from its catalog, which is how its prices line up with ours. A plan
    priced over EFA asks for it with ``network_tier="best"``: SkyPilot then attaches
    every EFA interface the type has (``sky/clouds/aws.py``,
    ``make_deploy_resources_variables``); without it the nodes talk TCP.

    Args:
        efa: The plan was priced over EFA (``Cluster.uses_efa``); by default, a group of
            several nodes of an EFA type.
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
    if efa is None:
        efa = group.nodes > 1 and offer.node_links.uses_efa
    return sky.Resources(
        infra=infra,
        instance_type=offer.instance_type,
        use_spot=use_spot,
        network_tier="best" if efa else None,
    )


def launched_efa_mode() -> str:
    """How SkyPilot will attach EFA under this user's SkyPilot config (``EFA_MODES``).

    With ``network_tier: best`` SkyPilot attaches every EFA interface of the type only
    when ``aws.use_internal_ips`` is set, and one interface otherwise
    (``sky/clouds/aws.py``, ``make_deploy_resources_variables``); the plan must price
    what will be launched. Region-level overrides of that key are not read.
    """
    from sky import skypilot_config

    internal = skypilot_config.get_effective_region_config(
        cloud=CLOUD, keys=("use_internal_ips",), default_value=False
    )
    return "all" if internal else "one"


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
            group_resources(
                plan.cluster.groups[0],
                use_spot=plan.use_spot,
                pin_zone=pin_zone,
                efa=plan.cluster.uses_efa,
            )
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

    On a node SkyPilot gave GPUs (``SKYPILOT_NUM_GPUS_PER_NODE`` above 0) the script
    first makes Lightning use them (``PL_TRAINER_ACCELERATOR=gpu`` unless set) and
    checks that torch sees them (:mod:`lightning_srifty.capture.gpu_check`, with the
    Python beside ``torchrun``); if not, it stops in one line with
    :data:`~lightning_srifty.core.launch_protocol.NO_GPU_EXIT_CODE` before training.

    The script's status is what SkyPilot records as the job's exit code (its job
    program collects each node's return code from ``log_lib.run_bash_command_with_log``
    and stores them with ``job_lib.set_exit_codes`` in ``task_codegen``'s
    ``add_epilogue``), and the jobs controller matches that against
    ``recover_on_exit_codes``. ``torchrun`` itself exits 1 when a worker exits 75
    after its emergency checkpoint, so the script does not ``exec`` it: it runs it in
    the background, forwards SIGTERM to it (``bash -i``, which SkyPilot uses, would
    otherwise ignore SIGTERM), waits for it, and then ends with
    :data:`~lightning_srifty.core.launch_protocol.PREEMPTED_EXIT_CODE` when a worker
    left the ``preempted`` marker in ``SRIFTY_STATE_DIR`` (set per task:
    ``~/.srifty/state-$SKYPILOT_TASK_ID``), else with ``torchrun``'s own code. It
    ends by setting ``$?`` rather than ``exit``, so the rclone flush SkyPilot appends
    (``TaskCodeGen.build_task_bash_script``) still runs and passes the code on.

    Checks exit explicitly: under ``bash -i`` an unset ``${VAR:?}`` or a ``set -u``
    error prints and carries on (interactive shells do not exit on them), and
    ``set -e`` would end the script at torchrun's failure before its code is mapped.

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
    state = f"${{{ENV_STATE_DIR}}}"
    lines = ["set -uo pipefail"]
    if external_master:
        lines += [
            f'if [ -z "${{{ENV_MASTER_ADDR}:-}}" ]; then',
            f'  echo "srifty: {ENV_MASTER_ADDR} is not set; the rendezvous master address'
            ' is set at launch" >&2',
            "  exit 2",
            "fi",
            f'MASTER_ADDR="${{{ENV_MASTER_ADDR}}}"',
        ]
    else:
        lines.append('MASTER_ADDR="$(echo "$SKYPILOT_NODE_IPS" | head -n1)"')
    lines += [
        f"NODE_RANK=$(( SKYPILOT_NODE_RANK + ${{{ENV_NODE_RANK_OFFSET}:-0}} ))",
        f'export {ENV_STATE_DIR}="${{{ENV_STATE_DIR}:-$HOME/.srifty/state-'
        '${SKYPILOT_TASK_ID:-job}}"',
        f'mkdir -p "{state}" || exit 1',
        f'rm -f "{state}/{PREEMPTED_MARKER}"',
    ]
    lines += gpu_check_lines(launcher)
    argv = " ".join(shlex.quote(word) for word in [script, *script_args])
    lines += [
        f"{shlex.quote(launcher)}"
        f' --nnodes="${{{ENV_TOTAL_NODES}:-$SKYPILOT_NUM_NODES}}"'
        ' --node-rank="$NODE_RANK"'
        f' --nproc-per-node="${{{ENV_NPROC_PER_NODE}:-$SKYPILOT_NUM_GPUS_PER_NODE}}"'
        ' --master-addr="$MASTER_ADDR"'
        f" --master-port={master_port}"
        f" {argv} &",
        "SRIFTY_CHILD=$!",
        "trap 'kill -TERM \"$SRIFTY_CHILD\" 2>/dev/null' TERM",
        # A trapped signal interrupts `wait`; wait again until torchrun has ended.
        'wait "$SRIFTY_CHILD"; SRIFTY_CODE=$?',
        'while kill -0 "$SRIFTY_CHILD" 2>/dev/null; do wait "$SRIFTY_CHILD"; SRIFTY_CODE=$?; done',
        "trap - TERM",
        f'if [ -e "{state}/{PREEMPTED_MARKER}" ]; then',
        f'  echo "srifty: emergency checkpoint saved; exiting {PREEMPTED_EXIT_CODE} (torchrun'
        ' exited $SRIFTY_CODE)" >&2',
        f"  SRIFTY_CODE={PREEMPTED_EXIT_CODE}",
        "fi",
        '( exit "$SRIFTY_CODE" )',
    ]
    return "\n".join(lines)


def gpu_check_lines(launcher: str = "torchrun") -> list[str]:
    """The run script's GPU check (see :func:`run_command`)."""
    nproc = f"${{{ENV_NPROC_PER_NODE}:-$SKYPILOT_NUM_GPUS_PER_NODE}}"
    return [
        f'if [ "${{SKYPILOT_NUM_GPUS_PER_NODE:-0}}" -gt 0 ] 2>/dev/null'
        f' && [ "${{{ENV_GPU_CHECK}:-1}}" != 0 ]; then',
        '  export PL_TRAINER_ACCELERATOR="${PL_TRAINER_ACCELERATOR:-gpu}"',
        f'  SRIFTY_PY="$(dirname "$(command -v {shlex.quote(launcher)})")/python"',
        '  [ -x "$SRIFTY_PY" ] || SRIFTY_PY=python3',
        f'  "$SRIFTY_PY" -m lightning_srifty.capture.gpu_check --expect "{nproc}" || exit $?',
        "fi",
    ]


TORCH_INDEX = "https://download.pytorch.org/whl"
TORCH_CUDA_BUILD = "cu126"
"""The CUDA build of torch for SkyPilot's AWS GPU images (SkyPilot 0.14.1,
``sky/clouds/aws.py: _get_default_ami``): Turing and later GPUs get
``skypilot:custom-gpu-ubuntu-cuda13`` (NVIDIA 580 driver, CUDA 13), V100, M60, P100 and
P4 get ``skypilot:custom-gpu-ubuntu`` (NVIDIA 535 driver, CUDA 12;
``sky/clouds/utils/gpu_utils.py: LEGACY_DRIVER_GPUS``). A CUDA 12.6 build runs on both
drivers (CUDA 12 minor-version compatibility needs >= 525) and still carries Volta
kernels; the default PyPI wheel of a newer torch is built for CUDA 13, which the 535
driver cannot run."""
TORCH_CUDA_BUILD_BLACKWELL = "cu128"
"""GPUs of compute capability 10 and up (B200, RTX PRO 6000) need CUDA >= 12.8, which
the 580 driver of the default image runs."""


def node_stack_setup() -> str:
    """Setup lines that install the profiled torch and Lightning (``SRIFTY_TORCH_VERSION``,
    ``SRIFTY_LIGHTNING_VERSION`` in the task's envs) before anything else.

    The CUDA build is chosen on the node from its GPU's compute capability
    (``nvidia-smi``; see :data:`TORCH_CUDA_BUILD`), so one managed task can list
    candidates of several GPU generations. The versions are then written to a pip
    constraints file exported as ``PIP_CONSTRAINT``, so the package's wheel and the
    user's ``requirements.txt`` cannot swap them for others (pip fails instead).
    """
    index = f"{TORCH_INDEX}/{TORCH_CUDA_BUILD}"
    blackwell = f"{TORCH_INDEX}/{TORCH_CUDA_BUILD_BLACKWELL}"
    constraints = "$HOME/.srifty/constraints.txt"
    return "\n".join(
        [
            "# srifty: the torch and Lightning the profile ran with, in the CUDA build",
            "# this node's GPU and SkyPilot's image for it run.",
            f'if [ -n "${{{ENV_TORCH_VERSION}:-}}" ]; then',
            '  SRIFTY_CAP="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader'
            ' 2>/dev/null | head -n1 || true)"',
            '  case "$SRIFTY_CAP" in',
            f'    "") SRIFTY_TORCH_INDEX="{TORCH_INDEX}/cpu" ;;',
            f'    [1-9][0-9].*) SRIFTY_TORCH_INDEX="{blackwell}" ;;',
            f'    *) SRIFTY_TORCH_INDEX="{index}" ;;',
            "  esac",
            '  echo "srifty: installing torch==$SRIFTY_TORCH_VERSION from $SRIFTY_TORCH_INDEX'
            ' (GPU compute capability ${SRIFTY_CAP:-none})"',
            '  pip install --index-url "$SRIFTY_TORCH_INDEX"'
            f' "torch==${{{ENV_TORCH_VERSION}}}" || exit $?',
            '  mkdir -p "$HOME/.srifty"',
            f'  echo "torch==${{{ENV_TORCH_VERSION}}}" > "{constraints}"',
            "fi",
            f'if [ -n "${{{ENV_LIGHTNING_VERSION}:-}}" ]; then',
            '  mkdir -p "$HOME/.srifty"',
            f'  echo "lightning==${{{ENV_LIGHTNING_VERSION}}}" >> "{constraints}"',
            f'  pip install "lightning==${{{ENV_LIGHTNING_VERSION}}}" || exit $?',
            "fi",
            f'if [ -s "{constraints}" ]; then export PIP_CONSTRAINT="{constraints}"; fi',
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
    if ENV_TORCH_VERSION in task_envs or ENV_LIGHTNING_VERSION in task_envs:
        setup = node_stack_setup() + ("\n" + setup if setup else "")
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
