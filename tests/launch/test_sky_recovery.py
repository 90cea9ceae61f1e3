"""Where a managed job relaunches after a preemption, decided by SkyPilot's own code.

Each test builds the executor with ``StrategyExecutor.make`` from the task we submit
and runs SkyPilot's own ``recover()`` (``sky/jobs/recovery_strategy.py``). Only what
needs a cloud is replaced: ``_cleanup_cluster`` (terminating the cluster) and
``_launch`` (``sdk.launch`` on the API server), which records what it would send: the
task serialized by ``dag_utils.dump_dag_to_yaml_str``, as ``sdk.launch`` does, and
read back by ``dag_utils.load_chain_dag_from_yaml_str``. ``_launched_resources`` is set
as ``FailoverStrategyExecutor._launch`` sets it, from the handle's
``launched_resources``, which ``RetryingVmProvisioner`` builds as
``to_provision.copy(region=...)`` plus the zone (``cloud_vm_ray_backend.py``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from lightning_srifty.core.cluster import ClusterGroup, Plan
from lightning_srifty.launch.sky_jobs import MANAGED_RECOVERY, managed_task
from tests.launch.e2e import skypilot_executor
from tests.launch.test_sky_backend import make_plan, offer


@pytest.fixture(autouse=True)
def offline_sky(sky_offline: Any) -> Any:
    return sky_offline


def plans() -> list[Plan]:
    """Three same-shape spot offers in three regions, best first."""
    return [
        make_plan([ClusterGroup(offer("g4dn.12xlarge", "use1-az1"), 1, 4)], use_spot=True),
        make_plan([ClusterGroup(offer("g5.12xlarge", "use1-az1"), 1, 4)], use_spot=True),
        make_plan([ClusterGroup(offer("g4dn.12xlarge", "usw2-az1"), 1, 4)], use_spot=True),
    ]


def key(resources: Any) -> tuple[str, str | None]:
    return (resources.instance_type, resources.region)


class Recovery:
    """SkyPilot's executor for our task, with the cloud calls recorded."""

    def __init__(self, task: Any, launch_results: list[float | None]):
        self.executor = skypilot_executor(task, "srifty-1")
        self.results = list(launch_results)
        self.sent: list[dict[str, Any]] = []
        self.cleanups = 0
        self.executor._launch = self._launch  # noqa: SLF001 - sdk.launch needs a server
        self.executor._cleanup_cluster = self._cleanup  # noqa: SLF001 - terminate needs a cloud

    def _cleanup(self) -> None:
        self.cleanups += 1

    async def _launch(
        self, max_retry: int | None = 3, raise_on_failure: bool = True, recovery: bool = False
    ) -> float | None:
        from sky.utils import dag_utils

        task = self.executor.dag.tasks[0]
        wire = dag_utils.dump_dag_to_yaml_str(self.executor.dag)  # what sdk.launch sends
        received = dag_utils.load_chain_dag_from_yaml_str(wire).tasks[0]
        self.sent.append(
            {
                "order": [key(r) for r in task.resources],
                "ordered": isinstance(task.resources, list),
                "blocked": task.blocked_resources,
                "server_order": [key(r) for r in received.resources],
                "server_blocked": received.blocked_resources,
                "max_retry": max_retry,
                "recovery": recovery,
            }
        )
        return self.results.pop(0)

    def preempted_on(self, candidate: Any, zone: str) -> None:
        """The cluster ran on ``candidate`` in ``zone`` (the handle's launched resources)."""
        launched = candidate.copy(region=candidate.region or "us-east-1")
        self.executor._launched_resources = launched.copy(zone=zone)  # noqa: SLF001

    def recover(self) -> None:
        asyncio.run(self.executor.recover())


def our_task(recovery: str = MANAGED_RECOVERY) -> Any:
    return managed_task(plans(), script="train.py", name="srifty", recovery=recovery)


# ---------------------------------------------------------------------------------------
# What SkyPilot 0.14.1 does with our task and with a region-free one
# ---------------------------------------------------------------------------------------


def test_eager_next_region_relaunches_our_ordered_list_from_the_preempted_offer() -> None:
    task = our_task()
    first = list(task.resources)[0]
    recovery = Recovery(task, [1000.0])
    recovery.preempted_on(first, "us-east-1a")
    recovery.recover()
    assert recovery.cleanups == 1
    [sent] = recovery.sent
    assert sent["blocked"] is None and sent["server_blocked"] is None
    assert sent["server_order"][0] == key(first)  # the preempted offer, first again
    assert sent["server_order"] == [
        ("g4dn.12xlarge", "us-east-1"),
        ("g5.12xlarge", "us-east-1"),
        ("g4dn.12xlarge", "us-west-2"),
    ]


def test_eager_next_region_blocks_nothing_even_when_the_task_names_no_region() -> None:
    """The guard reads the launched resources, which always have a region."""
    import sky

    task = sky.Task(name="free", run="true")
    task.set_resources(
        [
            sky.Resources(
                infra="aws",
                instance_type="g4dn.12xlarge",
                use_spot=True,
                job_recovery={"strategy": "EAGER_NEXT_REGION"},
            )
        ]
    )
    recovery = Recovery(task, [1000.0])
    recovery.preempted_on(list(task.resources)[0], "us-east-1a")
    recovery.recover()
    [sent] = recovery.sent
    assert sent["blocked"] is None
    assert sent["server_order"] == [("g4dn.12xlarge", None)]  # the optimizer picks again


def test_blocked_resources_do_not_survive_the_trip_to_the_api_server() -> None:
    import sky
    from sky.utils import dag_utils

    task = our_task()
    first = list(task.resources)[0]
    task.blocked_resources = {first.copy(region="us-east-1")}
    with sky.Dag() as dag:
        dag.add(task)
    received = dag_utils.load_chain_dag_from_yaml_str(dag_utils.dump_dag_to_yaml_str(dag))
    assert received.tasks[0].blocked_resources is None


# ---------------------------------------------------------------------------------------
# SRIFTY_NEXT_OFFER
# ---------------------------------------------------------------------------------------


def test_next_offer_relaunches_the_other_offers_first_and_the_preempted_one_last() -> None:
    from lightning_srifty.launch.sky_recovery import NEXT_OFFER, NextOfferStrategyExecutor

    task = our_task(NEXT_OFFER)
    first, second, third = list(task.resources)
    recovery = Recovery(task, [1000.0, 2000.0])
    assert isinstance(recovery.executor, NextOfferStrategyExecutor)

    recovery.preempted_on(first, "us-east-1a")
    recovery.recover()
    assert recovery.cleanups == 1
    sent = recovery.sent[-1]
    assert sent["ordered"] is True
    assert sent["server_order"] == [key(second), key(third), key(first)]
    # The task keeps the planner's order for the next preemption.
    assert [key(r) for r in recovery.executor.dag.tasks[0].resources] == [
        key(first),
        key(second),
        key(third),
    ]

    recovery.preempted_on(second, "us-east-1b")  # the relaunch ran on #2
    recovery.recover()
    assert recovery.sent[-1]["server_order"] == [key(first), key(third), key(second)]


def test_next_offer_falls_back_to_skypilots_retry_loop_when_nothing_else_launches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lightning_srifty.launch.sky_recovery import NEXT_OFFER

    task = our_task(NEXT_OFFER)
    first = list(task.resources)[0]
    recovery = Recovery(task, [None, None, 3000.0])
    waits: list[float] = []

    async def no_wait(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr("lightning_srifty.launch.sky_recovery.asyncio.sleep", no_wait)
    recovery.preempted_on(first, "us-east-1a")
    recovery.recover()
    demoted, *retries = recovery.sent
    assert demoted["server_order"][-1] == key(first)
    assert [s["server_order"][0] for s in retries] == [key(first), key(first)]
    assert all(s["max_retry"] == recovery.executor._MAX_RETRY_CNT for s in retries)  # noqa: SLF001
    assert waits == [recovery.executor.RETRY_INIT_GAP_SECONDS]


def test_a_launch_outside_the_list_keeps_the_order() -> None:
    from lightning_srifty.launch.sky_recovery import NEXT_OFFER, demote

    task = our_task(NEXT_OFFER)
    resources = list(task.resources)
    elsewhere = resources[0].copy(instance_type="g6.12xlarge")
    assert demote(resources, elsewhere.copy(region="us-east-1")) == resources


# ---------------------------------------------------------------------------------------
# The plugin: registration where SkyPilot loads plugins, and the controller wheel
# ---------------------------------------------------------------------------------------

PLUGIN_PROBE = """
import json, os, sys
from sky.server import plugins
from sky.utils import annotations, registry
plugins.load_plugins(plugins.ExtensionContext(plugins.PluginContext.CONTROLLER))
executor = registry.JOBS_RECOVERY_STRATEGY_REGISTRY.from_str("SRIFTY_NEXT_OFFER")
annotations.is_on_api_server = True  # the server validates the strategy name
import sky
sky.Resources(infra="aws", instance_type="g4dn.12xlarge",
              job_recovery={"strategy": "SRIFTY_NEXT_OFFER"}).validate()
heavy = sorted(m for m in ("torch", "lightning") if m in sys.modules)
print(json.dumps({"executor": executor.__name__, "heavy": heavy}))
"""


def test_skypilots_plugin_loader_registers_the_strategy(tmp_path: Path) -> None:
    from lightning_srifty.launch.sky_recovery import build_plugin_wheel, plugin_files

    wheel_dir = tmp_path / "wheels"
    build_plugin_wheel(wheel_dir)
    config = tmp_path / "plugins.yaml"
    config.write_text(plugin_files(wheel_dir)["plugins.yaml"])
    env = {
        **__import__("os").environ,
        "SKYPILOT_SERVER_PLUGINS_CONFIG": str(config),  # plugins._PLUGINS_CONFIG_ENV_VAR
    }
    proc = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", PLUGIN_PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"executor": "NextOfferStrategyExecutor", "heavy": []}


def test_unknown_strategy_is_refused_on_the_server_without_the_plugin() -> None:
    probe = (
        "from sky.utils import annotations\n"
        "annotations.is_on_api_server = True\n"
        "import sky\n"
        "try:\n"
        "    sky.Resources(infra='aws', instance_type='g4dn.12xlarge',\n"
        "                  job_recovery={'strategy': 'SRIFTY_NEXT_OFFER'}).validate()\n"
        "except ValueError as e:\n"
        "    print('refused')\n"
    )
    proc = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused" in proc.stdout


def test_the_controller_wheel_holds_only_the_strategy_and_no_dependencies(
    tmp_path: Path,
) -> None:
    from lightning_srifty.launch.sky_recovery import PLUGIN_DIST, build_plugin_wheel

    wheel = build_plugin_wheel(tmp_path)
    assert wheel.name.startswith(f"{PLUGIN_DIST}-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        meta_name = next(n for n in names if n.endswith("/METADATA"))
        metadata = archive.read(meta_name).decode()
    code = sorted(n for n in names if not n.split("/")[0].endswith(".dist-info"))
    assert code == [
        "lightning_srifty/__init__.py",
        "lightning_srifty/launch/__init__.py",
        "lightning_srifty/launch/sky_recovery.py",
    ]
    assert "Requires-Dist" not in metadata
    assert build_plugin_wheel(tmp_path / "again").name == wheel.name  # reproducible


def test_job_recovery_is_checked_when_the_options_are_read() -> None:
    from lightning_srifty.core.errors import ConfigError
    from lightning_srifty.core.planner import PlanRequest
    from lightning_srifty.launch.launcher import LaunchOptions

    def options(**kw: Any) -> LaunchOptions:
        return LaunchOptions(
            script="x.py", script_args=(), request=PlanRequest(target_steps=1), **kw
        )

    assert options(backend="sky-jobs", job_recovery="SRIFTY_NEXT_OFFER").job_recovery == (
        "SRIFTY_NEXT_OFFER"
    )
    with pytest.raises(ConfigError, match="--job-recovery 'NEXT' is not valid"):
        options(backend="sky-jobs", job_recovery="NEXT")
    with pytest.raises(ConfigError, match="only with --backend sky-jobs"):
        options(backend="sky", job_recovery="FAILOVER")
