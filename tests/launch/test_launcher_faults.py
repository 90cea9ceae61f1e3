"""The launcher under faults: whatever ends it, nothing it started is left billing.

Each row of the fault table drives one exception (SkyPilot's own exception types, a
server restart that keeps dropping the request, Ctrl-C, a real SIGTERM or SIGHUP to
this process) at one stage of a run (provisioning, just after provisioning, running,
a migration) through :func:`run_launch` and the fake API server (tests/fakes.py), and
checks that the launcher ends with one line and a non-zero exit, and that every
cluster (or managed job) is gone, by the launcher's teardown or, where the failure was
the API server's own while the job was healthy, by SkyPilot's autostop once the job
ended, without the job having been stopped. The last tests kill the launcher outright
(nothing of it runs any more) and send SIGTERM and SIGHUP to a real ``srifty-launch``
process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lightning_srifty.cli.main import run_guarded
from lightning_srifty.core.planner import PlanRequest
from lightning_srifty.io.cluster_ledger import ClusterLedger
from lightning_srifty.io.profile_io import save_profile
from lightning_srifty.launch.backend import LaunchSpec
from lightning_srifty.launch.launcher import LaunchOptions, run_launch
from lightning_srifty.launch.sky_backend import SkyBackend
from lightning_srifty.launch.sky_client import SkyClient
from lightning_srifty.launch.sky_jobs import SkyJobsBackend
from tests.conftest import REPO_ROOT
from tests.core.test_planner import make_profile
from tests.fakes import (
    ApiFault,
    ApiRestart,
    ClusterScript,
    FakeSkyApi,
    RecordingUI,
    VirtualClock,
)
from tests.launch.test_sky_backend import homogeneous

TARGET = 400
"""Steps: 200 virtual seconds of training at the fake's 2 steps a second."""
SPEED = 600.0
"""Virtual seconds per real second (the launcher's controller keeps real time)."""


def _sky_error(name: str) -> Callable[[], None]:
    def action() -> None:
        from sky import exceptions

        if name == "CommandError":
            raise exceptions.CommandError(
                255,
                "ssh -T ubuntu@203.0.113.10 'python3 -u -c \"from sky.skylet import job_lib\"'",
                "Failed to submit the job.",
                "ssh: connect to host 203.0.113.10 port 22: Connection timed out",
            )
        if name == "ProvisionPrechecksError":
            raise exceptions.ProvisionPrechecksError(
                [ValueError("Quota exceeded for g4dn instances in us-east-1")]
            )
        raise ValueError("Unexpected server answer")  # what any other failure looks like

    return action


def _signal(signum: int) -> Callable[[], None]:
    return lambda: os.kill(os.getpid(), signum)


def _ctrl_c() -> None:
    raise KeyboardInterrupt


FAULTS: dict[str, Callable[[], None] | None] = {
    "CommandError": _sky_error("CommandError"),
    "ProvisionPrechecksError": _sky_error("ProvisionPrechecksError"),
    "any-exception": _sky_error("ValueError"),
    "restarts-past-retries": None,  # six restarts in a row drop the same request
    "ctrl-c": _ctrl_c,
    "SIGTERM": _signal(signal.SIGTERM),
    "SIGHUP": _signal(signal.SIGHUP),
}
EXIT = {"ctrl-c": 130, "SIGTERM": 128 + signal.SIGTERM, "SIGHUP": 128 + signal.SIGHUP}
LINE = {"ctrl-c": "interrupted", "SIGTERM": "terminated by SIGTERM",
        "SIGHUP": "terminated by SIGHUP"}  # fmt: skip


@dataclass(frozen=True)
class Stage:
    op: str
    effect: str = "none"
    skip: int = 0
    """The fault hits the ``skip + 1``-th request of its kind."""
    scripts: tuple[ClusterScript, ...] = (ClusterScript(),)
    running: bool = False
    """The job was healthy and training when the fault came."""


SLOW = ClusterScript(steps_per_s=0.05)
"""Training that lasts hours of virtual time, so the fault finds it running."""

STAGES = {
    # sky.launch dies while provisioning: the cluster is INIT, part of its nodes up.
    "provisioning": Stage("launch", "partial"),
    # The cluster is up and its job submitted; the answer never arrives.
    "after-provisioning": Stage("launch", "done"),
    # The job trains (for hours); a status read fails.
    "running": Stage("status", skip=1, scripts=(SLOW,), running=True),
    # The first cluster was preempted; launching the next one fails.
    "migration": Stage(
        "launch",
        "partial",
        skip=1,
        scripts=(ClusterScript(preempt_after_s=60, notice=False), ClusterScript()),
    ),
}
MANAGED_STAGES = {
    "submitting": Stage("jobs.launch", "done"),
    "running": Stage("jobs.queue_v2", skip=2, scripts=(SLOW,), running=True),
}


@dataclass
class Ran:
    code: int
    err: str
    fake: FakeSkyApi
    backend: SkyClient
    run_dir: Path
    ui: RecordingUI


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, Path]:
    """A script that never runs here (the fake cloud trains) and a reused profile."""
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('runs on the cloud only')\n")
    import lightning
    import torch

    made = make_profile()
    # A real profile records the stack it ran on; the nodes install exactly that.
    environment = dataclasses.replace(
        made.environment, torch_version=torch.__version__, lightning_version=lightning.__version__
    )
    profile = save_profile(
        dataclasses.replace(made, environment=environment), tmp_path / "profile.json"
    )
    return script, profile


def _launch(
    project: tuple[Path, Path],
    s3_uri: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fake: FakeSkyApi,
    *,
    managed: bool = False,
    keep: bool = False,
) -> Ran:
    script, profile = project
    run_dir = tmp_path / "run"
    settings: dict[str, Any] = {
        "sdk": fake,
        "setup": "true",
        "ship_package": False,
        "run_dir": run_dir,
        "checkpoint_uri": s3_uri,
        "keep_clusters": keep,
        "clock": fake.clock.monotonic,
        "sleep": fake.clock.sleep,
        "log_sleep": fake.clock.sleep,
    }
    backend: SkyClient = (
        SkyJobsBackend(jobs_sdk=fake.jobs, plugins=fake.api_plugins, **settings)
        if managed
        else SkyBackend(**settings)
    )
    options = LaunchOptions(
        script=str(script),
        script_args=(),
        request=PlanRequest(target_steps=TARGET, top_k=3),
        backend="sky-jobs" if managed else "sky",
        checkpoint_uri=s3_uri,
        run_dir=run_dir,
        profile_path=profile,
        assume_yes=True,
        catalog="bundled",
        probe="off",
        refine=False,
        keep_clusters=keep,
    )
    ui = RecordingUI()
    capsys.readouterr()
    code = run_guarded(lambda: bool(run_launch(options, ui, backend=backend)) and 0)
    return Ran(code, capsys.readouterr().err, fake, backend, run_dir, ui)


def _fake(stage: Stage, fault: str) -> FakeSkyApi:
    fake = FakeSkyApi(clock=VirtualClock(speed=SPEED), scripts=list(stage.scripts))
    action = FAULTS[fault]
    if action is None:
        fake.restarts.extend(ApiRestart(stage.op, stage.effect, skip=stage.skip) for _ in range(6))
    else:
        fake.restarts.append(ApiFault(stage.op, action, stage.effect, skip=stage.skip))
    return fake


def _after_the_jobs_ended(fake: FakeSkyApi, minutes: float) -> None:
    """Moves the fake cloud's time to ``minutes`` after its last job ended."""
    for job in fake.managed.values():
        fake.jobs._advance(job)  # noqa: SLF001 - the jobs controller's decisions so far
    fake.clock.now = max(c.death_at() for c in fake.clusters.values()) + minutes * 60
    for job in fake.managed.values():
        fake.jobs._advance(job)  # noqa: SLF001


def _check(ran: Ran, fault: str, stage: Stage) -> None:
    assert ran.fake.duplicate_jobs == []
    ledger = ClusterLedger(ran.run_dir).entries()
    if fault == "restarts-past-retries" and stage.effect == "done":
        # The dropped request had done its work: the job it submitted is followed (no
        # second one), and the run completes.
        assert ran.code == 0 and ran.err == "", ran.err
        assert len(ran.fake.launched) == 1 and ran.fake.left_up() == []
        assert [e.state for e in ledger] == ["down"]
        return
    lines = [line for line in ran.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in ran.err, ran.err
    assert ran.code == EXIT.get(fault, 2)
    if fault in LINE:
        assert lines[0] == LINE[fault]
    else:
        assert lines[0].startswith("error: ")
    assert ran.fake.restarts == [], "the fault never came"
    if fault == "restarts-past-retries" and stage.running:
        # The API server failed, not the job: it trains on, untouched ...
        assert ran.fake.downs == [] and ran.fake.cancels == []
        assert "dropped the request 6 times in a row" in lines[0]
        assert "10 min after its job ends" in lines[0]
        assert [e.state for e in ledger] == ["up"]
        assert ran.fake.left_up() != [] or ran.fake.managed
        # ... and SkyPilot takes its cluster down 10 idle minutes after it ended.
        _after_the_jobs_ended(ran.fake, 10)
        assert ran.fake.left_up() == []
        return
    assert ran.fake.left_up() == [], ran.ui.messages
    assert ledger and all(e.state == "down" for e in ledger), ledger


@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_table(
    fault: str,
    stage: str,
    project: tuple[Path, Path],
    s3_uri: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sky_offline: object,
) -> None:
    handlers = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP))
    ran = _launch(project, s3_uri, tmp_path, capsys, _fake(STAGES[stage], fault))
    _check(ran, fault, STAGES[stage])
    if stage == "migration":
        assert len(ran.fake.clusters) == 2  # the fault came on the second launch
    if fault in ("SIGTERM", "SIGHUP"):
        assert any(m.startswith(f"{LINE[fault]}; took down ") for m in ran.ui.messages)
    # The launcher's signal handlers are gone with it.
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == handlers


@pytest.mark.parametrize("stage", list(MANAGED_STAGES))
@pytest.mark.parametrize("fault", ["CommandError", "restarts-past-retries", "SIGTERM", "SIGHUP"])
def test_fault_table_managed(
    fault: str,
    stage: str,
    project: tuple[Path, Path],
    s3_uri: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sky_offline: object,
) -> None:
    fake = _fake(MANAGED_STAGES[stage], fault)
    ran = _launch(project, s3_uri, tmp_path, capsys, fake, managed=True)
    _check(ran, fault, MANAGED_STAGES[stage])
    (job,) = fake.managed.values()
    fake.jobs._advance(job)  # noqa: SLF001 - the jobs controller's next step
    if fault == "restarts-past-retries":
        assert job.status == "SUCCEEDED"  # never cancelled: it trained to the end
    else:
        assert job.status == "CANCELLED"


def test_keep_clusters_leaves_them_on_sigterm(
    project: tuple[Path, Path],
    s3_uri: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sky_offline: object,
) -> None:
    stage = STAGES["running"]
    ran = _launch(project, s3_uri, tmp_path, capsys, _fake(stage, "SIGTERM"), keep=True)
    assert ran.code == 143 and ran.err.strip() == "terminated by SIGTERM"
    (name,) = ran.fake.left_up()
    assert ran.fake.downs == [] and [e.state for e in ClusterLedger(ran.run_dir).entries()] == [
        "up"
    ]
    assert any("--keep-clusters" in m and "srifty down" in m for m in ran.ui.messages)
    _after_the_jobs_ended(ran.fake, 10)  # autostop
    assert ran.fake.left_up() == []


# ------------------------------------------------------------------- SIGKILL
@pytest.mark.parametrize("stage", ["provisioning", "running", "migration"])
def test_a_killed_launcher_leaves_nothing_past_the_autostop_window(
    stage: str, tmp_path: Path, sky_offline: object
) -> None:
    """SIGKILL: no handler runs, and nothing of the launcher acts after the moment it
    dies (here: its thread freezes there for good); SkyPilot's autostop with down,
    which every launch asks for, must end each cluster by itself."""
    preempted = ClusterScript(preempt_after_s=100, notice=False)
    fake = FakeSkyApi(scripts=[preempted if stage == "migration" else ClusterScript()])
    backend = SkyBackend(
        sdk=fake, setup="true", ship_package=False, run_dir=tmp_path,
        clock=fake.clock.monotonic, sleep=fake.clock.sleep,
    )  # fmt: skip
    plan = homogeneous("g5.12xlarge", "use1-az1", 2, use_spot=True)
    envs = {"SRIFTY_TARGET_STEPS": str(TARGET)}
    killed = threading.Event()
    answer = fake.stream_and_get

    def stream_and_get(request_id: str) -> Any:
        if killed.is_set():
            threading.Event().wait()  # the process is gone: this never returns
        return answer(request_id)

    fake.stream_and_get = stream_and_get  # type: ignore[method-assign]

    def launch_and_die(name: str) -> None:
        killed.set()
        spec = LaunchSpec("train.py", (), plan, envs, name)
        threading.Thread(target=backend.launch, args=(spec,), daemon=True).start()
        deadline = time.monotonic() + 30
        while not any(n.startswith(name) for n, _, _ in fake.launched):
            assert time.monotonic() < deadline, "the launch was never sent"
            time.sleep(0.01)

    if stage == "provisioning":
        launch_and_die("srifty-1")
    else:
        handle = backend.launch(LaunchSpec("train.py", (), plan, envs, "srifty-1"))
        fake.clock.sleep(300)
        if stage == "migration":
            assert backend.status(handle).value == "preempted"
            backend.stop(handle)
            launch_and_die("srifty-2")
    # The launcher is gone. The jobs end (trained, or lost with their nodes) ...
    assert fake.left_up()
    last_end = max(c.death_at() for c in fake.clusters.values())
    fake.clock.now = last_end + 10 * 60 - 1
    assert fake.left_up()  # (its last job ended less than 10 minutes ago)
    fake.clock.now = last_end + 10 * 60
    # ... and 10 idle minutes later no cluster is left.
    assert fake.left_up() == []
    assert all(kw["down"] is True and kw["idle_minutes_to_autostop"] == 10
               for _, _, kw in fake.launched)  # fmt: skip


# ------------------------------------------------- a real srifty-launch process
HARNESS = Path(__file__).with_name("fake_sky_launch.py")


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_signals_to_a_real_srifty_launch_take_its_cluster_down(
    signame: str,
    project: tuple[Path, Path],
    s3_uri: str,
    s3_env: dict[str, str],
    tmp_path: Path,
) -> None:
    script, profile = project
    run_dir = tmp_path / "run"
    state = tmp_path / "fake-state.json"
    argv = [
        sys.executable, str(HARNESS), str(state),
        str(script), "--backend", "sky", "--checkpoint-uri", s3_uri, "--run-dir", str(run_dir),
        "--profile", str(profile), "--target-steps", str(TARGET), "--catalog", "bundled",
        "--probe", "off", "--yes",
    ]  # fmt: skip
    env = {**os.environ, **s3_env, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(  # noqa: S603 - fixed argv
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    ledger = run_dir / "clusters.json"
    deadline = time.monotonic() + 120
    while not (ledger.is_file() and '"up"' in ledger.read_text()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the launch never came up"
        time.sleep(0.2)
    proc.send_signal(getattr(signal, signame))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + getattr(signal, signame), err
    assert err.strip().splitlines()[-1] == f"terminated by {signame}", err
    assert "Traceback" not in err
    seen = json.loads(state.read_text())
    assert seen["launched"] and seen["left_up"] == [], seen
    assert seen["downs"] == seen["launched"]
    assert [e.state for e in ClusterLedger(run_dir).entries()] == ["down"]


# ---------------------------------------------------------------- a preemption, recovered
@pytest.mark.parametrize("plugin", [True, False], ids=["with-plugin", "without-plugin"])
def test_managed_preemption_is_recovered_where_the_summary_says(
    plugin: bool,
    project: tuple[Path, Path],
    s3_uri: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sky_offline: object,
) -> None:
    """``srifty-launch --backend sky-jobs`` (``--job-recovery auto``, the default) on a
    spot notice: SkyPilot's controller relaunches the job on the next ordered offer when
    the server has our plugin, on the preempted one without it, and the summary names
    both offers."""
    from lightning_srifty.cli.launch_cmd import summary_rows
    from lightning_srifty.launch.sky_recovery import PLUGIN_CLASS

    fake = FakeSkyApi(
        # Slower than the fault table: the launcher polls every 0.5 s of real time and
        # reads where the job runs while it is RUNNING, so it must see each run once.
        clock=VirtualClock(speed=SPEED / 10),
        scripts=[ClusterScript(preempt_after_s=100), ClusterScript()],
        plugins=(PLUGIN_CLASS,) if plugin else (),
    )
    ran = _launch(project, s3_uri, tmp_path, capsys, fake, managed=True)
    assert ran.code == 0, ran.err
    ((_, task, _),) = fake.launched
    ordered = list(task.resources)
    assert {r.job_recovery["strategy"] for r in ordered} == {
        "SRIFTY_NEXT_OFFER" if plugin else "EAGER_NEXT_REGION"
    }
    warned = [m for m in ran.ui.messages if m.startswith("--job-recovery auto")]
    assert len(warned) == (0 if plugin else 1)  # one line, and only without the plugin
    (outcome,) = ran.ui.summaries
    rows = dict(summary_rows(outcome))  # type: ignore[arg-type]
    assert rows["preemptions survived"] == "1"
    assert rows["steps done"] == f"{TARGET} / {TARGET}"
    moved_to = ordered[1] if plugin else ordered[0]
    recovery = rows["  SkyPilot recovery"]
    before, after = recovery.removeprefix("#1: ").split(" -> ")
    assert ordered[0].instance_type[:12] in before and ordered[0].region in before
    assert moved_to.instance_type[:12] in after and moved_to.region in after
    assert rows["  managed job ran on"] == before
