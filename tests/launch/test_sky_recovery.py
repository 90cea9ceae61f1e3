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
    assert options(backend="sky-jobs").job_recovery == "auto"  # the default
    assert options(backend="sky").job_recovery == "auto"  # allowed: it means nothing there
    with pytest.raises(ConfigError, match="--job-recovery 'NEXT' is not valid"):
        options(backend="sky-jobs", job_recovery="NEXT")
    with pytest.raises(ConfigError, match="only with --backend sky-jobs"):
        options(backend="sky", job_recovery="FAILOVER")


# ---------------------------------------------------------------------------------------
# --job-recovery auto: what the API server says it loaded decides
# ---------------------------------------------------------------------------------------

SERVE_SKYPILOT_APP = """
import socket, sys
import uvicorn
from sky.server import server  # importing it loads plugins.yaml (PluginContext.UVICORN)

sock = socket.socket()
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
# lifespan off: no request daemons, no executors and no PyPI version check, none of
# which GET /api/plugins uses.
uvicorn.Server(uvicorn.Config(server.app, lifespan="off", log_level="warning")).run(
    sockets=[sock]
)
"""


@pytest.fixture
def skypilot_app(tmp_path: Path) -> Any:
    """Starts SkyPilot 0.14.1's own API server app in a child process on 127.0.0.1.

    Not ``sky api start``: its lifespan starts request daemons and a daily PyPI version
    check (``sky/server/version_check.py``), which would send packets off this machine.
    The app object is the real one (``sky.server.server.app``, every middleware and
    route), and its plugins are loaded the way the server loads them, by SkyPilot's own
    ``plugins.load_plugins`` when ``sky.server.server`` is imported, from the
    ``plugins.yaml`` that ``SKYPILOT_SERVER_PLUGINS_CONFIG`` names. The child runs in
    an offline runtime (its own HOME, a dead proxy for anything not local).
    """
    import os
    import time
    import urllib.request

    from lightning_srifty.launch.sky_runtime import prepare_offline_runtime

    started: list[subprocess.Popen[str]] = []

    def start(plugins_yaml: Path | None) -> str:
        runtime = prepare_offline_runtime(tmp_path / f"server-{len(started)}")
        env = runtime.env(os.environ)
        if plugins_yaml is not None:
            env["SKYPILOT_SERVER_PLUGINS_CONFIG"] = str(plugins_yaml)
        proc = subprocess.Popen(  # noqa: S603 - fixed argv
            [sys.executable, "-c", SERVE_SKYPILOT_APP],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        started.append(proc)
        assert proc.stdout is not None
        url = f"http://127.0.0.1:{int(proc.stdout.readline())}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/health", timeout=2):  # noqa: S310
                    return url
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("SkyPilot's app did not start") from None
                time.sleep(0.2)

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Points this process's SkyPilot client at a server URL, as a user's
    ``SKYPILOT_API_SERVER_ENDPOINT`` does (``sky/server/common.py: get_server_url``)."""
    from sky.server import common as server_common

    def use(url: str) -> None:
        monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", url)
        server_common.get_server_url.cache_clear()

    yield use
    monkeypatch.delenv("SKYPILOT_API_SERVER_ENDPOINT", raising=False)
    server_common.get_server_url.cache_clear()


def auto_backend() -> Any:
    """``--job-recovery auto`` with the real plugin query; the clouds are the fake's."""
    from lightning_srifty.launch.sky_jobs import SkyJobsBackend
    from tests.fakes import FakeSkyApi

    fake = FakeSkyApi()
    return SkyJobsBackend(sdk=fake, jobs_sdk=fake.jobs)


def test_skypilots_server_lists_our_plugin_and_auto_picks_next_offer(
    tmp_path: Path, skypilot_app: Any, endpoint: Any
) -> None:
    import lightning_srifty
    from lightning_srifty.launch.sky_jobs import server_plugins
    from lightning_srifty.launch.sky_recovery import build_plugin_wheel, plugin_files

    build_plugin_wheel(tmp_path / "wheels")
    config = tmp_path / "plugins.yaml"
    config.write_text(plugin_files(tmp_path / "wheels")["plugins.yaml"])
    endpoint(skypilot_app(config))

    listed = server_plugins()
    assert listed is not None
    assert [(p.get("name"), p.get("version")) for p in listed] == [
        ("lightning-srifty-recovery", lightning_srifty.__version__)
    ]
    backend = auto_backend()
    assert backend.resolve_recovery() == ""  # nothing to warn about
    assert backend.strategy == "SRIFTY_NEXT_OFFER"
    assert backend.notes == []


def test_without_the_plugin_skypilots_server_lists_none_and_auto_keeps_eager(
    skypilot_app: Any, endpoint: Any
) -> None:
    from lightning_srifty.launch.sky_jobs import server_plugins

    endpoint(skypilot_app(None))
    assert server_plugins() == []
    backend = auto_backend()
    line = backend.resolve_recovery()
    assert backend.strategy == "EAGER_NEXT_REGION"
    assert "\n" not in line and backend.notes == [line]
    assert "has not loaded the lightning-srifty-recovery plugin" in line
    assert "from #1, the offer just preempted first" in line
    assert "python -m lightning_srifty.launch.sky_recovery DIR" in line


def test_an_unreachable_or_older_server_falls_back_to_eager(tmp_path: Path, endpoint: Any) -> None:
    """Nothing listening (connection refused), and a server without the route (404,
    as a SkyPilot older than the plugin API answers): never a crash."""
    import functools
    import http.server
    import socket
    import threading

    from lightning_srifty.launch.sky_jobs import server_plugins

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        endpoint(f"http://127.0.0.1:{closed.getsockname()[1]}")
    assert server_plugins() is None
    backend = auto_backend()
    line = backend.resolve_recovery()
    assert backend.strategy == "EAGER_NEXT_REGION"
    assert "did not say which plugins it loaded" in line

    (tmp_path / "empty").mkdir()
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "empty")
    )
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as old:
        threading.Thread(target=old.serve_forever, daemon=True).start()
        endpoint(f"http://127.0.0.1:{old.server_address[1]}")
        try:
            assert server_plugins() is None
        finally:
            old.shutdown()


def test_an_explicit_strategy_wins_and_asks_nothing() -> None:
    from lightning_srifty.core.errors import ConfigError
    from lightning_srifty.launch.sky_jobs import SkyJobsBackend

    def must_not_ask() -> None:
        raise AssertionError("an explicit --job-recovery must not ask the server")

    backend = SkyJobsBackend(recovery="FAILOVER", plugins=must_not_ask)
    assert backend.resolve_recovery() == ""
    assert backend.strategy == "FAILOVER" and backend.planned_strategy == "FAILOVER"
    with pytest.raises(ConfigError, match="--job-recovery 'NEXT' is not valid"):
        SkyJobsBackend(recovery="NEXT")


def test_auto_reads_the_name_our_plugin_reports() -> None:
    """What ``list_plugins`` returns is built from the plugin object's ``name``."""
    from lightning_srifty.launch.sky_jobs import choose_recovery
    from lightning_srifty.launch.sky_recovery import SriftyRecoveryPlugin

    ours = {"name": SriftyRecoveryPlugin().name, "version": "0.1.0"}
    other = {"name": "someone-elses-plugin"}
    assert choose_recovery([other, ours]) == ("SRIFTY_NEXT_OFFER", "")
    assert choose_recovery([other])[0] == "EAGER_NEXT_REGION"
    assert choose_recovery([{"js_extension_path": None}])[0] == "EAGER_NEXT_REGION"
