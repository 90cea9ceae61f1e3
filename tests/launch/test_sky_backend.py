"""The SkyPilot adapter against real sky.Task/sky.Resources and SkyPilot's own optimizer.

SkyPilot runs offline here: the module fixture points it at a private runtime folder
seeded with the bundled catalog (no network, no credentials). Only the API server
(provisioning) is replaced, by tests/fakes.py's FakeSkySdk.
"""

from __future__ import annotations

import csv
import json
import os
import stat
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from lightning_srifty.core.catalog import Offer
from lightning_srifty.core.cluster import Cluster, ClusterGroup, Plan
from lightning_srifty.core.errors import (
    CapacityError,
    ConfigError,
    CredentialsError,
    LaunchError,
    PredictionError,
    SchemaError,
)
from lightning_srifty.core.launch_protocol import ENV_CHECKPOINT_URI
from lightning_srifty.io.cluster_ledger import ClusterLedger
from lightning_srifty.launch import sky_runtime
from lightning_srifty.launch.backend import JobState, LaunchSpec
from lightning_srifty.launch.sky_backend import SkyBackend
from lightning_srifty.launch.sky_client import combine_states, map_status
from lightning_srifty.launch.sky_tasks import (
    ENV_EXPECTED_HOURLY_USD,
    ENV_MASTER_ADDR,
    ENV_NODE_RANK_OFFSET,
    ENV_TOTAL_NODES,
    build_task,
    build_tasks,
    checked_envs,
    dry_run,
    make_time_estimator,
    plan_to_resources,
    task_to_yaml,
)
from tests.fakes import ApiFault, ClusterScript, FakeSkyApi

# Published figures for the physics-based step-time model used in the ranking test.
# FP32 peak TFLOP/s: NVIDIA T4, A10G (AWS G5 page), V100 SXM2, L4 datasheets.
FP32_TFLOPS = {"T4": 8.1, "A10G": 31.2, "V100": 15.7, "L4": 30.3}
# Network Gbps per instance type: AWS EC2 instance-type pages.
NETWORK_GBPS = {"g4dn.12xlarge": 50.0, "g5.12xlarge": 40.0, "p3.8xlarge": 10.0, "g6.12xlarge": 40.0}


def catalog_rows() -> list[dict[str, str]]:
    data = resources.files("lightning_srifty") / "data" / "aws_vms.csv"
    with resources.as_file(data) as path, open(path, newline="") as handle:
        return list(csv.DictReader(handle))


CATALOG = catalog_rows()


def catalog_row(instance_type: str, zone: str) -> dict[str, str]:
    matches = [
        r for r in CATALOG if r["InstanceType"] == instance_type and r["AvailabilityZone"] == zone
    ]
    assert len(matches) == 1, (instance_type, zone, len(matches))
    return matches[0]


def offer(instance_type: str, zone: str) -> Offer:
    """An Offer straight from the bundled catalog row (until io/catalog_io exists)."""
    row = catalog_row(instance_type, zone)
    count = int(float(row["AcceleratorCount"]))
    return Offer(
        instance_type=instance_type,
        accelerator=row["AcceleratorName"],
        accelerator_count=count,
        gpu_memory_gib=0.0,
        vcpus=float(row["vCPUs"]),
        memory_gib=float(row["MemoryGiB"]),
        region=row["Region"],
        zone=zone,
        ondemand_price=float(row["Price"]) if row["Price"] else None,
        spot_price=float(row["SpotPrice"]) if row["SpotPrice"] else None,
        intra_node_link="PCIe" if count > 1 else "none",
        network_gbps=NETWORK_GBPS.get(instance_type, 10.0),
    )


def step_seconds(instance_type: str, nodes: int) -> float:
    """Compute-bound step plus an inter-node ring all-reduce of ResNet-50's gradients."""
    row = next(r for r in CATALOG if r["InstanceType"] == instance_type)
    # 64 images x 3 x 4.1 GFLOP (fwd + bwd) per GPU at 40 % of peak.
    compute = 64 * 3 * 4.1e9 / (FP32_TFLOPS[row["AcceleratorName"]] * 1e12 * 0.4)
    gradient_bytes = 25.6e6 * 4
    bandwidth = NETWORK_GBPS[instance_type] * 1e9 / 8
    comm = 2 * (nodes - 1) / nodes * gradient_bytes / bandwidth if nodes > 1 else 0.0
    return compute + comm  # one ring between nodes; no overlap (conservative)


def make_plan(groups: list[ClusterGroup], use_spot: bool, steps: int = 20_000) -> Plan:
    cluster = Cluster(tuple(groups))
    hourly = cluster.hourly_price(use_spot)
    assert hourly is not None
    step_s = max(step_seconds(g.offer.instance_type, cluster.nodes) for g in groups)
    hours = step_s * steps / 3600
    return Plan(
        cluster=cluster,
        use_spot=use_spot,
        step_s=step_s,
        step_low_s=step_s,
        step_high_s=step_s,
        global_batch=64 * cluster.world_size,
        steps_to_target=steps,
        time_to_target_h=hours,
        cost_usd=hourly * hours,
        hourly_usd=hourly,
    )


def homogeneous(instance_type: str, zone: str, nodes: int, use_spot: bool) -> Plan:
    o = offer(instance_type, zone)
    return make_plan([ClusterGroup(o, nodes, o.accelerator_count)], use_spot)


@pytest.fixture
def sky_runtime_dir(sky_offline: sky_runtime.OfflineRuntime) -> sky_runtime.OfflineRuntime:
    """The session's offline SkyPilot runtime (see ``tests/conftest.py``)."""
    return sky_offline


@pytest.fixture
def sky(sky_runtime_dir: sky_runtime.OfflineRuntime) -> Any:
    import sky as sky_module

    return sky_module


# ---------------------------------------------------------------------------------------
# Resources and YAML
# ---------------------------------------------------------------------------------------


def test_resources_pin_type_market_region_and_zone(sky: Any) -> None:
    plans = [
        homogeneous("g5.12xlarge", "use1-az1", 2, use_spot=True),
        homogeneous("g4dn.12xlarge", "use1-az2", 2, use_spot=False),
    ]
    first, second = plan_to_resources(plans)
    assert isinstance(first, sky.Resources)
    assert str(first.cloud) == "AWS"
    assert (first.instance_type, first.use_spot, first.region, first.zone) == (
        "g5.12xlarge",
        True,
        "us-east-1",
        "use1-az1",
    )
    assert first.accelerators == {"A10G": 4}  # implied by the instance type
    assert (second.instance_type, second.use_spot, second.zone) == (
        "g4dn.12xlarge",
        False,
        "use1-az2",
    )
    region_only = plan_to_resources(plans[:1], pin_zone=False)[0]
    assert region_only.region == "us-east-1" and region_only.zone is None


def test_heterogeneous_plan_is_not_one_candidate(sky: Any) -> None:
    mixed = make_plan(
        [
            ClusterGroup(offer("g5.12xlarge", "use1-az1"), 1, 4),
            ClusterGroup(offer("g4dn.12xlarge", "use1-az1"), 1, 4),
        ],
        use_spot=False,
    )
    with pytest.raises(ConfigError, match="build_tasks"):
        plan_to_resources([mixed])


def test_missing_market_price_is_refused(sky: Any) -> None:
    o = offer("p3.8xlarge", "use1-az3")  # no spot market in this zone
    with pytest.raises(ConfigError, match="no spot price"):
        build_task(ClusterGroup(o, 1, 4), use_spot=True, script="train.py")


def test_task_yaml_round_trip_through_skypilot(sky: Any, tmp_path: Path) -> None:
    group = ClusterGroup(offer("g5.12xlarge", "use1-az1"), 2, 4)
    task = build_task(
        group,
        use_spot=True,
        script="train.py",
        script_args=["--epochs", "3"],
        checkpoint_uri="s3://bucket/run-1",
        envs={"SRIFTY_MODE": "train"},
        setup="pip install lightning-srifty",
        name="round-trip",
    )
    path = tmp_path / "task.yaml"
    path.write_text(task_to_yaml(task))
    loaded = sky.Task.from_yaml(str(path))
    assert loaded.name == "round-trip"
    assert loaded.num_nodes == 2
    assert loaded.setup == "pip install lightning-srifty"
    assert loaded.run == task.run
    assert loaded.envs[ENV_CHECKPOINT_URI] == "s3://bucket/run-1"
    assert loaded.envs["SRIFTY_MODE"] == "train"
    # Our catalog price for 2 spot nodes, kept for the dry run's comparison.
    spot = float(catalog_row("g5.12xlarge", "use1-az1")["SpotPrice"])
    assert float(loaded.envs[ENV_EXPECTED_HOURLY_USD]) == pytest.approx(2 * spot)
    (resources_loaded,) = loaded.resources
    assert (resources_loaded.instance_type, resources_loaded.use_spot) == ("g5.12xlarge", True)
    assert (resources_loaded.region, resources_loaded.zone) == ("us-east-1", "use1-az1")


def test_no_credentials_reach_the_task(sky: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzzzSECRET"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAZZZZZZZZZZZZZZZZ")
    monkeypatch.setenv("HF_TOKEN", "hf_zzzzzzzzzzzzzzzz")
    group = ClusterGroup(offer("g4dn.12xlarge", "use1-az1"), 1, 4)
    text = task_to_yaml(build_task(group, use_spot=False, script="train.py", envs={"A": "1"}))
    for leaked in (secret, "AKIAZZZZ", "hf_zzzz", "AWS_SECRET", "HF_TOKEN"):
        assert leaked not in text

    with pytest.raises(ConfigError) as refused:
        build_task(group, use_spot=False, script="train.py", envs={"AWS_SECRET_ACCESS_KEY": secret})
    assert "AWS_SECRET_ACCESS_KEY" in str(refused.value)
    assert secret not in str(refused.value)
    for name in ("GITHUB_TOKEN", "db_password", "WANDB_API_KEY"):
        with pytest.raises(ConfigError, match=name):
            checked_envs({name: "x"})
    # A harmless name that matches a pattern passes only when allowed explicitly.
    allowed = build_task(
        group,
        use_spot=False,
        script="train.py",
        envs={"TOKENIZERS_PARALLELISM": "false"},
        allow_env=["TOKENIZERS_PARALLELISM"],
    )
    assert allowed.envs["TOKENIZERS_PARALLELISM"] == "false"


# ---------------------------------------------------------------------------------------
# The run command, executed for real with bash
# ---------------------------------------------------------------------------------------

# Injections aim at a sentinel folder in the scratch cwd (never at /), so a quoting
# regression fails the test without harming the machine.
HOSTILE_ARGS = [
    "'; rm -rf ./victim",
    "; rm -rf ./victim",
    "$(rm -rf ./victim)",
    "$(touch PWNED)",
    "$(whoami)",
    "`id`",
    "two words",
    'say "hi"',
    "it's",
    "--lr=1e-3",
    "$HOME",
    "a\nb",
    "",
    "; touch PWNED",
    "*",
]


def fake_torchrun(bin_dir: Path) -> Path:
    """A ``torchrun`` that writes its argv as JSON, standing in for the real launcher."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    program = bin_dir / "torchrun"
    program.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "open(os.environ['ARGV_OUT'], 'w').write(json.dumps(sys.argv[1:]))\n"
    )
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return program


def execute_run(
    run: str | None, tmp_path: Path, node_env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    fake_torchrun(tmp_path / "bin")
    work = tmp_path / "work"
    (work / "victim").mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "ARGV_OUT": str(tmp_path / "argv.json"),
        "SRIFTY_GPU_CHECK": "0",  # the node pretends to have GPUs; test_sky_node checks them
        **node_env,
    }
    return subprocess.run(  # noqa: S603 - fixed argv
        ["bash", "-c", run or ""], env=env, cwd=work, capture_output=True, text=True, timeout=30
    )


def test_hostile_script_args_reach_the_script_verbatim(sky: Any, tmp_path: Path) -> None:
    group = ClusterGroup(offer("g4dn.12xlarge", "use1-az1"), 2, 4)
    task = build_task(group, use_spot=False, script="my train.py", script_args=HOSTILE_ARGS)
    yaml_path = tmp_path / "task.yaml"
    yaml_path.write_text(task_to_yaml(task))
    run = sky.Task.from_yaml(str(yaml_path)).run  # what a node would execute
    node_env = {
        "SKYPILOT_NODE_IPS": "10.1.0.5\n10.1.0.6",
        "SKYPILOT_NODE_RANK": "1",
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NUM_GPUS_PER_NODE": "4",
    }
    proc = execute_run(run, tmp_path, node_env)
    assert proc.returncode == 0, proc.stderr
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:5] == [
        "--nnodes=2",
        "--node-rank=1",
        "--nproc-per-node=4",
        "--master-addr=10.1.0.5",
        "--master-port=29500",
    ]
    assert argv[5:] == ["my train.py", *HOSTILE_ARGS]
    assert not (tmp_path / "work" / "PWNED").exists()
    assert (tmp_path / "work" / "victim").is_dir()


def test_partial_node_sets_process_count(sky: Any, tmp_path: Path) -> None:
    group = ClusterGroup(offer("g4dn.12xlarge", "use1-az1"), 1, 2)  # 2 of 4 GPUs
    task = build_task(group, use_spot=False, script="train.py")
    node_env = {
        "SKYPILOT_NODE_IPS": "10.1.0.5",
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NUM_NODES": "1",
        "SKYPILOT_NUM_GPUS_PER_NODE": "4",
        **task.envs,
    }
    proc = execute_run(task.run, tmp_path, node_env)
    assert proc.returncode == 0, proc.stderr
    assert "--nproc-per-node=2" in json.loads((tmp_path / "argv.json").read_text())


# ---------------------------------------------------------------------------------------
# Heterogeneous plans: one cluster per group, one rendezvous
# ---------------------------------------------------------------------------------------


def mixed_plan(use_spot: bool = False) -> Plan:
    return make_plan(
        [
            ClusterGroup(offer("g5.12xlarge", "use1-az1"), 2, 4),
            ClusterGroup(offer("g4dn.12xlarge", "use1-az2"), 1, 4),
        ],
        use_spot=use_spot,
    )


def test_heterogeneous_plan_gives_consistent_rendezvous(sky: Any, tmp_path: Path) -> None:
    tasks = build_tasks(mixed_plan(), script="train.py", script_args=["--x", "1"], name="job")
    assert [t.name for t in tasks] == ["job-g0", "job-g1"]
    assert [t.num_nodes for t in tasks] == [2, 1]
    assert [t.envs[ENV_TOTAL_NODES] for t in tasks] == ["3", "3"]
    assert [t.envs[ENV_NODE_RANK_OFFSET] for t in tasks] == ["0", "2"]
    assert all(ENV_MASTER_ADDR not in t.envs for t in tasks)

    # Without the master's address the second group refuses to start, loudly.
    node = {"SKYPILOT_NODE_IPS": "10.2.0.9", "SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1"}
    node["SKYPILOT_NUM_GPUS_PER_NODE"] = "4"
    refused = execute_run(tasks[1].run, tmp_path, {**node, **tasks[1].envs})
    assert refused.returncode != 0
    assert "rendezvous master address" in refused.stderr

    joined = build_tasks(
        mixed_plan(), script="train.py", script_args=["--x", "1"], master_addr="10.1.0.5"
    )
    assert joined[1].envs[ENV_MASTER_ADDR] == "10.1.0.5"
    assert ENV_MASTER_ADDR not in joined[0].envs
    proc = execute_run(joined[1].run, tmp_path, {**node, **joined[1].envs})
    assert proc.returncode == 0, proc.stderr
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv == [
        "--nnodes=3",
        "--node-rank=2",
        "--nproc-per-node=4",
        "--master-addr=10.1.0.5",
        "--master-port=29500",
        "train.py",
        "--x",
        "1",
    ]


def test_groups_in_different_regions_are_refused(sky: Any) -> None:
    far = make_plan(
        [
            ClusterGroup(offer("g5.12xlarge", "use1-az1"), 1, 4),
            ClusterGroup(offer("g5.12xlarge", "usw2-az1"), 1, 4),
        ],
        use_spot=False,
    )
    with pytest.raises(ConfigError, match="one region"):
        build_tasks(far, script="train.py")


# ---------------------------------------------------------------------------------------
# SkyPilot's optimizer with our estimator, and the offline dry run
# ---------------------------------------------------------------------------------------

RANKED_TYPES = ["g4dn.12xlarge", "g5.12xlarge", "p3.8xlarge", "g6.12xlarge"]


@pytest.mark.parametrize("target", ["COST", "TIME"])
def test_skypilot_optimizer_agrees_with_our_ranking(sky: Any, target: str) -> None:
    nodes = 2
    markets = (False, True) if target == "COST" else (False,)  # spot ties on time
    plans = [
        homogeneous(t, "use1-az1", nodes, use_spot=spot) for t in RANKED_TYPES for spot in markets
    ]
    key = (lambda p: p.cost_usd) if target == "COST" else (lambda p: p.time_to_target_h)
    ours = sorted(plans, key=key)
    assert key(ours[0]) < key(ours[1])  # a clear winner, not a tie

    task = sky.Task(run="true", num_nodes=nodes)
    task.set_resources(set(plan_to_resources(ours)))
    task.set_time_estimator(make_time_estimator(step_seconds, 20_000, num_nodes=nodes))
    with sky.Dag() as dag:
        dag.add(task)
    sky.Optimizer.optimize(dag, minimize=getattr(sky.OptimizeTarget, target), quiet=True)

    best = task.best_resources
    winner = ours[0].cluster.groups[0].offer
    assert (best.instance_type, best.use_spot, best.zone) == (
        winner.instance_type,
        ours[0].use_spot,
        winner.zone,
    )
    # SkyPilot's cost of its choice is ours: price x nodes x our predicted time.
    assert nodes * best.get_cost(ours[0].time_to_target_h * 3600) == pytest.approx(
        ours[0].cost_usd, rel=1e-9
    )


def test_estimator_rejects_bad_predictions(sky: Any) -> None:
    resources = plan_to_resources([homogeneous("g5.12xlarge", "use1-az1", 1, use_spot=False)])[0]
    assert make_time_estimator(lambda t, n: 0.5, 100)(resources) == pytest.approx(50.0)
    with pytest.raises(PredictionError, match="positive"):
        make_time_estimator(lambda t, n: float("nan"), 100)(resources)
    with pytest.raises(ConfigError):
        make_time_estimator(lambda t, n: 1.0, 0)


def test_dry_run_offline_prices_match_the_catalog(
    sky: Any, sky_runtime_dir: sky_runtime.OfflineRuntime, tmp_path: Path
) -> None:
    spot_group = ClusterGroup(offer("g4dn.12xlarge", "use1-az5"), 2, 4)
    ondemand = build_task(
        ClusterGroup(offer("g5.12xlarge", "use1-az1"), 1, 4),
        use_spot=False,
        script="train.py",
        name="ondemand",
    )
    spot = build_task(spot_group, use_spot=True, script="train.py", name="spot")
    # A plan priced from a stale catalog: 10 % below SkyPilot's price must be flagged.
    stale_offer = offer("g6.12xlarge", "use1-az2")
    assert stale_offer.spot_price is not None
    stale_offer = Offer(**{**stale_offer.__dict__, "spot_price": stale_offer.spot_price * 0.9})
    stale = build_task(ClusterGroup(stale_offer, 1, 4), use_spot=True, script="t.py", name="stale")

    report = dry_run([ondemand, spot, stale], tmp_path / "dry", runtime=sky_runtime_dir)

    by_name = {e.task_name: e for e in report.entries}
    g5 = by_name["ondemand"].sky_choice
    assert (g5.instance_type, g5.use_spot, g5.zone, g5.num_nodes) == (
        "g5.12xlarge",
        False,
        "use1-az1",
        1,
    )
    assert g5.node_hourly_usd == pytest.approx(
        float(catalog_row("g5.12xlarge", "use1-az1")["Price"])
    )
    spot_row = catalog_row("g4dn.12xlarge", "use1-az5")
    assert by_name["spot"].sky_hourly_usd == pytest.approx(2 * float(spot_row["SpotPrice"]))
    assert by_name["spot"].relative_difference == pytest.approx(0.0, abs=1e-6)
    assert by_name["stale"].relative_difference == pytest.approx(1 / 0.9 - 1, rel=1e-4)
    assert len(report.warnings) == 1 and "stale" in report.warnings[0]

    written = json.loads(Path(report.report_path).read_text())
    assert written["schema_version"] == 1
    assert [e["task_name"] for e in written["entries"]] == ["ondemand", "spot", "stale"]
    for entry in report.entries:
        assert sky.Task.from_yaml(entry.yaml_path).name == entry.task_name


def test_dry_run_reports_what_skypilot_rejects(
    sky: Any, sky_runtime_dir: sky_runtime.OfflineRuntime, tmp_path: Path
) -> None:
    bogus = tmp_path / "bogus.yaml"
    bogus.write_text(
        "name: bogus\nrun: 'true'\nresources:\n  infra: aws/us-east-1/use1-az3\n"
        "  instance_type: p3.8xlarge\n  use_spot: true\n"
    )
    with pytest.raises(LaunchError, match="rejected"):
        sky_runtime.run_offline_optimizer(sky_runtime_dir, [bogus], tmp_path / "out.json")


def test_offline_runtime_drops_credentials_and_blocks_network(tmp_path: Path) -> None:
    runtime = sky_runtime.prepare_offline_runtime(tmp_path / "rt")
    env = runtime.env(
        {"AWS_SECRET_ACCESS_KEY": "s", "AWS_PROFILE": "p", "PATH": "/bin", "HOME": "/root"}
    )
    assert not any(key.startswith("AWS_") and key != "AWS_EC2_METADATA_DISABLED" for key in env)
    assert env["HOME"] == str(runtime.home_dir) and env["PATH"] == "/bin"
    assert env["HTTPS_PROXY"].startswith("http://127.0.0.1:")
    assert (runtime.catalog_dir / "aws" / "vms.csv").stat().st_size > 0


def test_optimizer_result_of_another_schema_is_refused(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"schema_version": 99, "choices": []}))
    with pytest.raises(SchemaError, match="schema_version"):
        sky_runtime.read_optimizer_result(result)


def test_importing_the_adapter_does_not_import_sky() -> None:
    probe = (
        "import sys, lightning_srifty.launch.sky_backend, lightning_srifty.launch.sky_runtime\n"
        "sys.exit('sky' in sys.modules)"
    )
    proc = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------------------
# Status mapping
# ---------------------------------------------------------------------------------------


def test_status_mapping_table(sky: Any) -> None:
    from sky.skylet.job_lib import JobStatus
    from sky.utils.status_lib import ClusterStatus

    table = [
        # cluster, job -> first reading (the backend looks further at RUNNING/FAILED)
        (ClusterStatus.INIT, None, JobState.RUNNING),  # launched, now INIT: nodes lost?
        (ClusterStatus.UP, None, JobState.PENDING),
        (ClusterStatus.UP, JobStatus.PENDING, JobState.PENDING),
        (ClusterStatus.UP, JobStatus.SETTING_UP, JobState.PENDING),
        (ClusterStatus.UP, JobStatus.RUNNING, JobState.RUNNING),
        (ClusterStatus.UP, JobStatus.SUCCEEDED, JobState.SUCCEEDED),
        (ClusterStatus.UP, JobStatus.FAILED, JobState.FAILED),
        (ClusterStatus.UP, JobStatus.FAILED_SETUP, JobState.FAILED),
        (ClusterStatus.UP, JobStatus.FAILED_DRIVER, JobState.FAILED),
        (ClusterStatus.UP, JobStatus.CANCELLED, JobState.FAILED),
        (ClusterStatus.AUTOSTOPPING, JobStatus.SUCCEEDED, JobState.SUCCEEDED),
        (ClusterStatus.STOPPED, None, JobState.PREEMPTED),  # spot or on-demand alike
        (None, None, JobState.PREEMPTED),
        (None, JobStatus.SUCCEEDED, JobState.SUCCEEDED),
    ]
    for cluster, job, expected in table:
        for spot in (True, False):
            assert map_status(cluster, job, use_spot=spot) is expected, (cluster, job, spot)
    assert combine_states([JobState.RUNNING, JobState.PENDING]) is JobState.PENDING
    assert combine_states([JobState.SUCCEEDED, JobState.PREEMPTED]) is JobState.PREEMPTED
    assert combine_states([JobState.SUCCEEDED, JobState.SUCCEEDED]) is JobState.SUCCEEDED


# ---------------------------------------------------------------------------------------
# Launch / status / stop through the SDK surface (provisioning faked)
# ---------------------------------------------------------------------------------------


def spec(plan: Plan, name: str = "run") -> LaunchSpec:
    return LaunchSpec(
        script="train.py",
        script_args=("--steps", "$(whoami)"),
        plan=plan,
        envs={"SRIFTY_MODE": "train", "SRIFTY_TARGET_STEPS": "1000"},
        name=name,
    )


def backend_on(fake: FakeSkyApi, **options: Any) -> SkyBackend:
    """A SkyBackend whose SDK is the fake and whose time is the fake's."""
    values: dict[str, Any] = {"setup": "true", "ship_package": False, "run_id": "t3st01"}
    values.update(options)
    return SkyBackend(
        sdk=fake,
        clock=fake.clock.monotonic,
        sleep=fake.clock.sleep,
        log_sleep=fake.clock.wait,
        **values,
    )


def test_launch_status_stop_records_the_real_task(sky: Any, tmp_path: Path) -> None:
    fake = FakeSkyApi(scripts=[ClusterScript(preempt_after_s=600, notice=False)])
    backend = backend_on(fake, checkpoint_uri="s3://b/ckpt", run_dir=tmp_path)
    handle = backend.launch(spec(homogeneous("g5.12xlarge", "use1-az1", 2, use_spot=True)))

    ((cluster_name, task, kwargs),) = fake.launched
    assert isinstance(task, sky.Task)
    # SkyPilot itself takes the cluster down 10 idle minutes after its job ends.
    assert cluster_name == "run-t3st01" and kwargs["down"] is True
    assert kwargs["idle_minutes_to_autostop"] == 10
    (res,) = task.resources
    assert (res.instance_type, res.use_spot, res.region, res.zone) == (
        "g5.12xlarge",
        True,
        "us-east-1",
        None,  # real launches pin the region only: zone IDs are account-specific
    )
    assert task.num_nodes == 2
    assert task.envs[ENV_CHECKPOINT_URI] == "s3://b/ckpt"
    assert "'$(whoami)'" in task.run
    ledger = ClusterLedger(tmp_path).entries()
    assert [(e.name, e.state) for e in ledger] == [("run-t3st01", "up")]

    assert backend.status(handle) is JobState.PENDING  # setting up
    fake.clock.sleep(120)
    assert backend.status(handle) is JobState.RUNNING
    fake.clock.sleep(600)  # AWS took the nodes back without a notice: the record is gone
    assert backend.status(handle) is JobState.PREEMPTED
    backend.stop(handle)  # already gone: nothing to tear down, no error
    assert fake.downs == []
    assert ClusterLedger(tmp_path).entries()[0].state == "down"


def test_heterogeneous_launch_joins_groups_at_the_first_head(sky: Any) -> None:
    fake = FakeSkyApi(scripts=[ClusterScript(), ClusterScript(setup_s=300)])
    backend = backend_on(fake)
    handle = backend.launch(spec(mixed_plan()))
    names = [name for name, _, _ in fake.launched]
    assert names == ["run-t3st01-g0", "run-t3st01-g1"]
    first, second = (task for _, task, _ in fake.launched)
    assert isinstance(first, sky.Task) and isinstance(second, sky.Task)
    assert ENV_MASTER_ADDR not in first.envs
    assert second.envs[ENV_MASTER_ADDR] == handle.clusters[0].head_ip == "10.0.1.1"
    assert second.envs[ENV_NODE_RANK_OFFSET] == "2"

    fake.clock.sleep(100)
    assert backend.status(handle) is JobState.PENDING  # second group still setting up
    fake.clock.sleep(300)
    assert backend.status(handle) is JobState.RUNNING
    backend.stop(handle)
    assert fake.downs == ["run-t3st01-g1", "run-t3st01-g0"]
    backend.stop(handle)  # safe twice
    assert fake.downs == ["run-t3st01-g1", "run-t3st01-g0"]


def test_no_capacity_for_a_group_tears_down_the_rest(sky: Any) -> None:
    fake = FakeSkyApi(scripts=[ClusterScript(), ClusterScript(no_capacity=True)])
    backend = backend_on(fake)
    with pytest.raises(CapacityError, match="resources unavailable"):
        backend.launch(spec(mixed_plan()))
    assert fake.downs == ["run-t3st01-g0"]
    assert fake.left_up() == []


def test_cluster_names_are_unique_per_run(sky: Any) -> None:
    fake = FakeSkyApi()
    plan = homogeneous("g5.12xlarge", "use1-az1", 1, use_spot=False)
    first, second = SkyBackend(sdk=fake, setup="true"), SkyBackend(sdk=fake, setup="true")
    assert first.run_id != second.run_id
    first.launch(spec(plan, name="srifty-1"))
    second.launch(spec(plan, name="srifty-1"))  # the fake refuses a reused name
    names = [name for name, _, _ in fake.launched]
    assert len(set(names)) == 2 and all(n.startswith("srifty-1-") for n in names)


def test_missing_credentials_are_one_line_errors(sky: Any) -> None:
    plan = homogeneous("g5.12xlarge", "use1-az1", 1, use_spot=False)
    with pytest.raises(CredentialsError) as not_enabled:
        backend_on(FakeSkyApi(enabled=("Kubernetes",))).launch(spec(plan))
    assert "sky check aws" in str(not_enabled.value)
    assert "\n" not in str(not_enabled.value)

    rejected = FakeSkyApi(
        scripts=[
            ClusterScript(
                error=sky.exceptions.CloudUserIdentityError("AWS credentials are not set.")
            )
        ]
    )
    with pytest.raises(CredentialsError, match="credentials"):
        backend_on(rejected).launch(spec(plan))


def test_real_sdk_without_api_server_is_a_launch_error(sky: Any) -> None:
    backend = SkyBackend()  # the real sky.client.sdk; no API server may start here
    with pytest.raises(LaunchError, match="API server") as error:
        backend.check_credentials()
    assert not isinstance(error.value, CredentialsError)


def test_plans_priced_over_efa_ask_skypilot_for_it(sky: Any) -> None:
    """A plan priced with EFA gets ``network_tier: best`` (what makes SkyPilot attach the
    type's EFA interfaces); one node, or a type without EFA, stays on the default."""
    from sky.utils import resources_utils

    from lightning_srifty.io.catalog_io import load_catalog
    from lightning_srifty.launch.sky_jobs import managed_task

    offers = {o.instance_type: o for o in load_catalog("bundled").offers}
    p4d, g4dn = offers["p4d.24xlarge"], offers["g4dn.xlarge"]
    assert p4d.node_links.uses_efa and not g4dn.node_links.uses_efa  # as the CSV says

    def plan(o: Offer, nodes: int) -> Plan:
        cluster = Cluster((ClusterGroup(o, nodes, o.accelerator_count),))
        hourly = cluster.hourly_price(False) or 0.0
        return Plan(cluster=cluster, use_spot=False, step_s=1.0, step_low_s=1.0,
                    step_high_s=1.0, global_batch=cluster.world_size, steps_to_target=10,
                    time_to_target_h=1.0, cost_usd=hourly, hourly_usd=hourly)  # fmt: skip

    best = resources_utils.NetworkTier.BEST
    tiers = [r.network_tier for r in plan_to_resources([plan(p4d, 2), plan(p4d, 1)])]
    assert tiers == [best, None]
    assert plan_to_resources([plan(g4dn, 2)])[0].network_tier is None
    # Through the YAML SkyPilot reads back (schema validation included), managed too.
    (task,) = build_tasks(plan(p4d, 2), script="train.py", setup="true", envs={})
    again = sky.Task.from_yaml_config(task.to_yaml_config())
    assert {r.network_tier for r in again.resources} == {best}
    managed = managed_task([plan(p4d, 2)], script="train.py", setup="true")
    assert {r.network_tier for r in managed.resources} == {best}


def test_skypilots_optimizer_prices_an_efa_task(
    sky: Any, sky_runtime_dir: sky_runtime.OfflineRuntime, tmp_path: Path
) -> None:
    """``network_tier: best`` on an EFA type is a task SkyPilot's own optimizer accepts and
    prices as the catalog does (no EFA surcharge on AWS)."""
    from lightning_srifty.io.catalog_io import load_catalog

    p4d = next(o for o in load_catalog("bundled").offers if o.instance_type == "p4d.24xlarge")
    task = build_task(ClusterGroup(p4d, 2, 8), use_spot=False, script="train.py", name="efa")
    assert "network_tier: best" in task_to_yaml(task)
    report = dry_run([task], tmp_path / "dry", runtime=sky_runtime_dir)
    (entry,) = report.entries
    assert entry.sky_choice.instance_type == "p4d.24xlarge" and entry.sky_choice.num_nodes == 2
    assert entry.relative_difference == pytest.approx(0.0, abs=1e-6)


def test_efa_is_priced_as_the_users_skypilot_config_will_attach_it(
    sky: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SkyPilot attaches every EFA interface only with ``aws.use_internal_ips``; read
    through SkyPilot's own config loader."""
    from sky import skypilot_config

    from lightning_srifty.launch.sky_tasks import launched_efa_mode

    config = tmp_path / "config.yaml"
    try:
        for text, mode in (("aws:\n  use_internal_ips: true\n  use_ssm: true\n", "all"),
                           ("allowed_clouds:\n  - aws\n", "one")):  # fmt: skip
            config.write_text(text)
            monkeypatch.setenv("SKYPILOT_GLOBAL_CONFIG", str(config))
            skypilot_config.reload_config()
            assert launched_efa_mode() == mode
    finally:
        monkeypatch.undo()
        skypilot_config.reload_config()


def test_a_silent_head_on_a_cluster_that_reads_up_loses_the_attempt(sky: Any) -> None:
    """job_status raises CommandError (sky/backends/cloud_vm_ray_backend.py:
    get_job_status) while even a FORCE refresh reads UP: tolerated for the notice
    window, then the attempt counts as lost, never as a crash."""

    def head_silent() -> None:
        raise sky.exceptions.CommandError(
            255, "job_lib.get_statuses_payload", "Failed to get job status.", "ssh: timed out"
        )

    fake = FakeSkyApi(scripts=[ClusterScript(steps_per_s=0.1)])
    backend = backend_on(fake)
    handle = backend.launch(spec(homogeneous("g5.12xlarge", "use1-az1", 1, use_spot=False)))
    fake.clock.sleep(200)
    assert backend.status(handle) is JobState.RUNNING
    fake.restarts.extend(ApiFault("job_status", head_silent) for _ in range(40))
    assert backend.status(handle) is JobState.RUNNING
    fake.clock.sleep(100)
    assert backend.status(handle) is JobState.RUNNING
    fake.clock.sleep(60)
    assert backend.status(handle) is JobState.PREEMPTED
    assert "reads UP but its head did not answer for 160 s" in backend.failure_detail(handle)
    assert "status" in fake.calls and fake.downs == []  # moving on is the controller's call
