"""An offline, credential-free SkyPilot runtime for dry runs and tests.

SkyPilot's optimizer talks to clouds only through its catalog (prices, zones) and the
list of enabled clouds. Both live on disk: the catalog under
``$SKY_RUNTIME_DIR/.sky/catalogs/v8/`` (a file placed there by hand is never
re-downloaded, because without a ``.meta/*.md5`` SkyPilot treats it as user-modified)
and the enabled clouds in the ``state.db`` next to it. So SkyPilot's *own* optimizer can
price our plans with no network and no credentials if we give it a private runtime
folder seeded with the bundled catalog snapshot and mark AWS enabled there.

Why not ``sky check`` against a local S3/STS stand-in: SkyPilot 0.14's AWS check shells
out to the ``aws`` CLI and then fetches the account's zone-ID mapping from EC2, which
renames the catalog's zone IDs to whatever the stand-in invents. Marking AWS enabled in
the private ``state.db`` (``global_user_state.set_enabled_clouds``, the same call
``sky check`` ends with) is narrower and keeps the catalog exactly as published.

Isolation rules: the runtime's environment points ``HOME`` and ``SKY_RUNTIME_DIR`` into
the private folder (SkyPilot writes ``~/.sky/user_hash`` and locks under ``HOME`` even
when ``SKY_RUNTIME_DIR`` is set), drops every ``AWS_*`` variable, disables EC2 metadata
look-ups, and routes HTTP(S) through a dead proxy on 127.0.0.1 so that any accidental
download fails loudly instead of leaving the machine.

SkyPilot fixes its catalog path when ``sky`` is first imported, so a process can use one
runtime only. :func:`run_offline_optimizer` therefore runs the optimizer in a child
process (``python -m lightning_srifty.launch.sky_runtime``); :func:`activate_in_process`
exists for entry points (tests, an offline CLI mode) that must build ``sky.Task``
objects before anything else imports ``sky``.

Only this module and the other ``launch/sky_*`` modules import ``sky``, lazily.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from lightning_srifty.core.errors import LaunchError, SchemaError
from lightning_srifty.core.validate import Reader

CATALOG_SCHEMA_VERSION = "v8"
"""SkyPilot 0.14's catalog layout; the bundled CSVs are in this format."""

OPTIMIZER_RESULT_SCHEMA_VERSION = 1

BUNDLED_CATALOG_FILES = {
    "aws/vms.csv": "aws_vms.csv",
    "common/accelerators.csv": "aws_accelerators.csv",
}
"""Catalog path under ``catalogs/v8/`` -> bundled file in ``lightning_srifty/data``."""

_DEAD_PROXY = "http://127.0.0.1:9"
"""Discard port: nothing listens, so any non-local HTTP request fails at once."""

_DROPPED_ENV_PREFIXES = ("AWS_", "SKYPILOT_", "SKY_")


@dataclass(frozen=True)
class OfflineRuntime:
    """A private SkyPilot runtime folder: catalog snapshot, state DB and a fake HOME."""

    root: Path

    @property
    def runtime_dir(self) -> Path:
        return self.root / "runtime"

    @property
    def home_dir(self) -> Path:
        return self.root / "home"

    @property
    def catalog_dir(self) -> Path:
        return self.runtime_dir / ".sky" / "catalogs" / CATALOG_SCHEMA_VERSION

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` without cloud credentials or SkyPilot settings, pointed at this runtime.

        Args:
            base: The environment to start from (usually ``os.environ``); not modified.
        """
        env = {
            key: value
            for key, value in base.items()
            if not key.upper().startswith(_DROPPED_ENV_PREFIXES)
            and key.upper() not in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
        }
        env.update(
            {
                "HOME": str(self.home_dir),
                "SKY_RUNTIME_DIR": str(self.runtime_dir),
                "SKYPILOT_DISABLE_LOCAL_API_SERVER": "1",
                "SKYPILOT_DISABLE_USAGE_COLLECTION": "1",
                "AWS_EC2_METADATA_DISABLED": "true",
                "HTTP_PROXY": _DEAD_PROXY,
                "HTTPS_PROXY": _DEAD_PROXY,
                "NO_PROXY": "127.0.0.1,localhost",
            }
        )
        return env


def prepare_offline_runtime(root: str | os.PathLike[str]) -> OfflineRuntime:
    """Creates (or refreshes) a runtime folder seeded with the bundled AWS catalog.

    Idempotent: calling it again on the same folder rewrites the catalog files and the
    SkyPilot config, so a folder can be shared by several dry runs.
    """
    runtime = OfflineRuntime(Path(root).resolve())
    data = resources.files("lightning_srifty") / "data"
    for target, bundled in BUNDLED_CATALOG_FILES.items():
        destination = runtime.catalog_dir / target
        destination.parent.mkdir(parents=True, exist_ok=True)
        with resources.as_file(data / bundled) as source:
            shutil.copyfile(source, destination)
    sky_config = runtime.home_dir / ".sky" / "config.yaml"
    sky_config.parent.mkdir(parents=True, exist_ok=True)
    # Only AWS is in play; declaring it keeps SkyPilot from probing other clouds.
    sky_config.write_text("allowed_clouds:\n  - aws\n", encoding="utf-8")
    return runtime


def skypilot_catalog_file(env: Mapping[str, str]) -> Path:
    """Where SkyPilot keeps its AWS catalog, computed without importing ``sky``."""
    base = env.get("SKY_RUNTIME_DIR") or env.get("HOME") or str(Path.home())
    return Path(base).expanduser() / ".sky" / "catalogs" / CATALOG_SCHEMA_VERSION / "aws/vms.csv"


def use_bundled_catalog_if_missing(root: str | os.PathLike[str]) -> OfflineRuntime | None:
    """Points this process's SkyPilot at the bundled catalog when it has none of its own.

    Building ``sky.Resources`` validates instance types against SkyPilot's catalog and
    downloads it when it is missing, which fails offline. When SkyPilot has no local AWS
    catalog and ``sky`` is not imported yet, this seeds a private runtime under ``root``
    with the bundled snapshot and sets only ``SKY_RUNTIME_DIR`` (credentials and
    ``HOME`` stay as they are, for the checkpoint store and the user's script). A user
    whose SkyPilot has a catalog keeps using it, untouched.

    Returns:
        The runtime now in use, or ``None`` when SkyPilot's own catalog is used.
    """
    if skypilot_catalog_file(os.environ).is_file() or "sky" in sys.modules:
        return None
    runtime = prepare_offline_runtime(root)
    os.environ["SKY_RUNTIME_DIR"] = str(runtime.runtime_dir)
    return runtime


def activate_in_process(runtime: OfflineRuntime) -> None:
    """Points this process's SkyPilot at ``runtime``; call before anything imports ``sky``.

    This sets process-wide environment variables on purpose: SkyPilot reads them at
    import time. Calling it again with the same runtime is a no-op.

    Raises:
        LaunchError: ``sky`` was already imported with a different catalog folder.
    """
    catalog_module = sys.modules.get("sky.catalog.common")
    if catalog_module is not None:
        active = Path(getattr(catalog_module, "_ABSOLUTE_VERSIONED_CATALOG_DIR", ""))
        if active.resolve() != runtime.catalog_dir.resolve():
            raise LaunchError(
                f"SkyPilot is already loaded with catalog folder {active}; the offline "
                f"runtime {runtime.root} must be activated before `sky` is imported"
            )
    for key in [k for k in os.environ if k.upper().startswith("AWS_")]:
        del os.environ[key]
    os.environ.update(
        {
            key: value
            for key, value in runtime.env({}).items()
            if key not in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
        }
    )
    enable_aws()


def enable_aws() -> None:
    """Marks AWS enabled for compute in the active runtime's state DB (what ``sky check``
    records after a successful credential check)."""
    from sky import global_user_state, skypilot_config
    from sky.clouds import cloud as sky_cloud

    workspace = skypilot_config.get_active_workspace()
    global_user_state.set_enabled_clouds(["AWS"], sky_cloud.CloudCapability.COMPUTE, workspace)
    global_user_state.set_allowed_clouds(["aws"], workspace)


@dataclass(frozen=True)
class OptimizerChoice:
    """What SkyPilot's optimizer picked for one task, priced by SkyPilot itself."""

    task_name: str
    instance_type: str
    region: str
    zone: str | None
    use_spot: bool
    num_nodes: int
    node_hourly_usd: float
    """``Resources.get_cost(3600)`` of the chosen resources, for one node."""

    @property
    def hourly_usd(self) -> float:
        return self.node_hourly_usd * self.num_nodes

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_name": self.task_name,
            "instance_type": self.instance_type,
            "region": self.region,
            "zone": self.zone,
            "use_spot": self.use_spot,
            "num_nodes": self.num_nodes,
            "node_hourly_usd": self.node_hourly_usd,
        }

    @staticmethod
    def from_dict(data: Any, *, source: str | None = None) -> OptimizerChoice:
        r = Reader(data, source=source)
        zone = r.str("zone", None)
        return OptimizerChoice(
            task_name=r.str("task_name", ""),
            instance_type=r.str("instance_type"),
            region=r.str("region"),
            zone=zone or None,
            use_spot=r.bool("use_spot"),
            num_nodes=r.int("num_nodes", minimum=1),
            node_hourly_usd=r.float("node_hourly_usd", minimum=0.0),
        )


def run_offline_optimizer(
    runtime: OfflineRuntime,
    task_yamls: Sequence[str | os.PathLike[str]],
    result_path: str | os.PathLike[str],
    *,
    minimize: str = "cost",
    timeout_s: float = 180.0,
) -> list[OptimizerChoice]:
    """Runs SkyPilot's optimizer on task YAML files in a child process using ``runtime``.

    Args:
        runtime: A folder made by :func:`prepare_offline_runtime`.
        task_yamls: SkyPilot task YAML files; each is optimized on its own.
        result_path: Where the child writes its JSON result.
        minimize: ``"cost"`` or ``"time"``.
        timeout_s: Upper bound for the child (SkyPilot's import alone takes seconds).

    Raises:
        LaunchError: SkyPilot rejected a task or the child failed; the message carries
            the last lines of its error output.
    """
    if minimize not in ("cost", "time"):
        raise LaunchError(f"minimize must be 'cost' or 'time', got {minimize!r}")
    command = [
        sys.executable,
        "-m",
        "lightning_srifty.launch.sky_runtime",
        "--runtime-root",
        str(runtime.root),
        "--out",
        str(result_path),
        "--minimize",
        minimize,
        *[str(path) for path in task_yamls],
    ]
    try:
        proc = subprocess.run(  # noqa: S603 - argv list, no shell
            command,
            env=runtime.env(os.environ),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise LaunchError(
            f"SkyPilot's offline optimizer took longer than {timeout_s:.0f} s"
        ) from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        raise LaunchError(f"SkyPilot's offline optimizer rejected the task(s):\n{tail}")
    return read_optimizer_result(result_path)


def read_optimizer_result(path: str | os.PathLike[str]) -> list[OptimizerChoice]:
    """Reads the child's JSON result; the schema version guards against stale files."""
    source = str(path)
    try:
        data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise SchemaError(f"cannot read optimizer result ({exc})", source=source) from None
    r = Reader(data, source=source)
    version = r.int("schema_version")
    if version != OPTIMIZER_RESULT_SCHEMA_VERSION:
        raise SchemaError(
            f"schema_version {version} is not supported (expected "
            f"{OPTIMIZER_RESULT_SCHEMA_VERSION})",
            source=source,
            field="schema_version",
        )
    return [OptimizerChoice.from_dict(item.data, source=source) for item in r.children("choices")]


def _optimize_files(task_yamls: Sequence[str], minimize: str) -> list[OptimizerChoice]:
    """Child side: load each YAML with ``sky.Task.from_yaml`` and let SkyPilot choose."""
    import sky

    target = sky.OptimizeTarget.COST if minimize == "cost" else sky.OptimizeTarget.TIME
    choices = []
    for path in task_yamls:
        task = sky.Task.from_yaml(path)
        with sky.Dag() as dag:
            dag.add(task)
        sky.Optimizer.optimize(dag, minimize=target, quiet=True)
        best = task.best_resources
        if best is None or best.instance_type is None or best.region is None:
            raise LaunchError(f"{path}: SkyPilot's optimizer chose no concrete resources")
        choices.append(
            OptimizerChoice(
                task_name=task.name or "",
                instance_type=best.instance_type,
                region=best.region,
                zone=best.zone,
                use_spot=bool(best.use_spot),
                num_nodes=int(task.num_nodes),
                node_hourly_usd=float(best.get_cost(3600)),
            )
        )
    return choices


def main(argv: Sequence[str] | None = None) -> int:
    """Child entry point; run only through :func:`run_offline_optimizer`."""
    parser = argparse.ArgumentParser(prog="python -m lightning_srifty.launch.sky_runtime")
    parser.add_argument("--runtime-root", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--minimize", choices=("cost", "time"), default="cost")
    parser.add_argument("task_yamls", nargs="+")
    args = parser.parse_args(argv)
    runtime = OfflineRuntime(Path(args.runtime_root))
    activate_in_process(runtime)
    choices = _optimize_files(args.task_yamls, args.minimize)
    document = {
        "schema_version": OPTIMIZER_RESULT_SCHEMA_VERSION,
        "minimize": args.minimize,
        "choices": [choice.to_dict() for choice in choices],
    }
    Path(args.out).write_text(json.dumps(document, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
