"""A managed-job recovery that moves on: ``job_recovery: SRIFTY_NEXT_OFFER``.

What SkyPilot 0.14.1 does after a preemption, read in ``sky/jobs/recovery_strategy.py``:

* ``EAGER_NEXT_REGION`` (the default) terminates the cluster and means to relaunch with
  the preempted region blocked, but only "if the requested resources does not specify
  a region or zone", and it tests ``self._launched_resources``, which always carries
  the region it launched in (``RetryingVmProvisioner`` sets ``launched_resources =
  to_provision.copy(region=...)`` in ``sky/backends/cloud_vm_ray_backend.py``). The
  block is never set, whatever the task asks for, and ``task.blocked_resources`` would
  not reach the API server anyway: ``sdk.launch`` sends the task as YAML
  (``dag_utils.dump_dag_to_yaml_str``), which has no such field. Recovery therefore
  relaunches the task's resources as they are: ``ordered`` ones from #1, ``any_of``
  ones by the optimizer's cheapest choice, i.e. the offer just preempted, and moves
  on only when that launch fails for capacity.
* ``FAILOVER`` relaunches in the preempted region first (``task.set_resources`` with
  the launched resources, zone cleared), on purpose.

The only part of a task that survives the trip to the server is its resources, so a
strategy that moves on has to reorder them. SkyPilot supports registering strategies
(``registry.JOBS_RECOVERY_STRATEGY_REGISTRY``) from API-server plugins that are also
loaded on the jobs controller (``sky/server/plugins.py``: ``PluginContext.CONTROLLER``,
``~/.sky/remote_plugins.yaml``; the client passes an unknown strategy name through and
the server validates it, ``Resources._try_validate_managed_job_attributes``).
:class:`NextOfferStrategyExecutor` is such a strategy: after a preemption it terminates
the cluster as ``EAGER_NEXT_REGION`` does, then relaunches with the ordered resources
in the planner's order but the preempted offer moved last; only if none of them
launches does it retry the list as given, forever, as ``EAGER_NEXT_REGION`` does.
:class:`SriftyRecoveryPlugin` registers it; run
``python -m lightning_srifty.launch.sky_recovery DIR`` to write the (dependency-free)
controller wheel and the two plugin files the API server needs.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sky.jobs import recovery_strategy
from sky.server import plugins
from sky.utils import registry

NEXT_OFFER = "SRIFTY_NEXT_OFFER"
"""The strategy's name in ``job_recovery``."""
PLUGIN_CLASS = "lightning_srifty.launch.sky_recovery.SriftyRecoveryPlugin"
PLUGIN_NAME = "lightning-srifty-recovery"
"""What the plugin calls itself in the API server's ``GET /api/plugins`` answer
(``sky/server/server.py: list_plugins`` lists each loaded plugin's ``name`` and
``version``, not its class): how the launcher tells that the server has it."""
PLUGIN_DIST = "lightning_srifty_sky_recovery"
"""The controller wheel's distribution name (this module and its two parents only)."""


def same_offer(candidate: Any, launched: Any) -> bool:
    """Whether ``candidate`` (a requested ``Resources``) is what ``launched`` ran on:
    same instance type, market and region, and the zone when the candidate pins one."""
    if candidate.instance_type != launched.instance_type:
        return False
    if bool(candidate.use_spot) != bool(launched.use_spot):
        return False
    if candidate.region is not None and candidate.region != launched.region:
        return False
    return candidate.zone is None or candidate.zone == launched.zone


def demote(resources: Sequence[Any], launched: Any) -> list[Any]:
    """``resources`` in their order with the ones matching ``launched`` moved last.

    The planner's ranking stays as it was for every other offer; the one just
    preempted is tried only when none of the others launches.
    """
    items = list(resources)
    return [r for r in items if not same_offer(r, launched)] + [
        r for r in items if same_offer(r, launched)
    ]


class NextOfferStrategyExecutor(recovery_strategy.EagerFailoverStrategyExecutor):
    """``EAGER_NEXT_REGION`` that relaunches on the other ordered offers first.

    Keeps everything else of SkyPilot's strategy: the cluster is terminated first,
    ``_launch`` does the launching (scheduling, retries, the persisted priority), and
    when the reordered list cannot launch, the list as given is retried forever with
    SkyPilot's own gap.
    """

    async def recover(self) -> float:
        await asyncio.to_thread(self._cleanup_cluster)
        launched = self._launched_resources
        if launched is not None:
            task = self.dag.tasks[0]
            original = task.resources
            if isinstance(original, list):
                reordered = demote(original, launched)
                if reordered != list(original):
                    task.set_resources(reordered)
                    try:
                        submitted = await self._launch(raise_on_failure=False, recovery=True)
                    finally:
                        task.set_resources(original)
                    if submitted is not None:
                        return submitted
        while True:
            submitted = await self._launch(
                max_retry=self._MAX_RETRY_CNT, raise_on_failure=False, recovery=True
            )
            if submitted is not None:
                return submitted
            await asyncio.sleep(self.RETRY_INIT_GAP_SECONDS)


# SkyPilot's registry refuses a name twice (the module may be imported as __main__ too).
if NEXT_OFFER.lower() not in registry.JOBS_RECOVERY_STRATEGY_REGISTRY:
    registry.JOBS_RECOVERY_STRATEGY_REGISTRY.type_register(name=NEXT_OFFER)(
        NextOfferStrategyExecutor
    )


class SriftyRecoveryPlugin(plugins.BasePlugin):
    """Registers :class:`NextOfferStrategyExecutor` wherever SkyPilot loads plugins
    (importing this module is the registration; there is nothing else to install)."""

    @property
    def name(self) -> str:
        """Shown by ``GET /api/plugins``; ``--job-recovery auto`` looks for it there."""
        return PLUGIN_NAME

    @property
    def version(self) -> str:
        import lightning_srifty

        return lightning_srifty.__version__

    def install(self, extension_context: plugins.ExtensionContext) -> None:
        del extension_context


# ---------------------------------------------------------------------------------------
# The controller wheel and the plugin files
# ---------------------------------------------------------------------------------------

_PACKAGE_FILES = (
    "lightning_srifty/__init__.py",
    "lightning_srifty/launch/__init__.py",
    "lightning_srifty/launch/sky_recovery.py",
)


def build_plugin_wheel(out_dir: str | Path) -> Path:
    """A wheel holding only this module (and its two package ``__init__``), no
    dependencies: SkyPilot installs every wheel in ``controller_wheel_path`` on the
    jobs controller, which has SkyPilot and nothing of torch or Lightning."""
    import lightning_srifty

    root = Path(lightning_srifty.__file__).resolve().parent.parent
    files = [(name, (root / name).read_bytes()) for name in _PACKAGE_FILES]
    digest = hashlib.sha256(b"".join(hashlib.sha256(d).digest() for _, d in files)).hexdigest()
    version = f"{lightning_srifty.__version__}+b{digest[:12]}"
    info = f"{PLUGIN_DIST}-{version}.dist-info"
    metadata = (
        f"Metadata-Version: 2.1\nName: {PLUGIN_DIST}\nVersion: {version}\n"
        "Summary: lightning-srifty's SkyPilot managed-job recovery strategy (plugin)\n"
    )
    entries = [
        *files,
        (f"{info}/METADATA", metadata.encode()),
        (
            f"{info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: lightning-srifty\n"
            b"Root-Is-Purelib: true\nTag: py3-none-any\n",
        ),  # fmt: skip
    ]
    from lightning_srifty.launch.shipping import write_wheel  # not on the controller

    return write_wheel(out_dir, f"{PLUGIN_DIST}-{version}-py3-none-any.whl", info, entries)


def plugin_files(wheel_dir: str | Path) -> dict[str, str]:
    """``~/.sky/plugins.yaml`` and ``~/.sky/remote_plugins.yaml`` for the API server."""
    return {
        "plugins.yaml": (
            f"controller_wheel_path: {Path(wheel_dir).resolve()}\n"
            f"plugins:\n  - class: {PLUGIN_CLASS}\n"
        ),
        "remote_plugins.yaml": f"plugins:\n  - class: {PLUGIN_CLASS}\n",
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lightning_srifty.launch.sky_recovery DIR``: writes the wheel and the
    two plugin files into ``DIR`` and says where they go."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m lightning_srifty.launch.sky_recovery DIR", file=sys.stderr)
        return 2
    out = Path(args[0])
    wheel = build_plugin_wheel(out / "wheels")
    for name, text in plugin_files(out / "wheels").items():
        (out / name).write_text(text, encoding="utf-8")
    print(f"wrote {wheel}")
    print(
        f"copy {out / 'plugins.yaml'} and {out / 'remote_plugins.yaml'} into the API "
        "server's ~/.sky/ (merge with existing ones), install lightning-srifty where the "
        f"API server runs, restart it, and launch with --job-recovery {NEXT_OFFER}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
