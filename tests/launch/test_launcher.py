"""srifty-launch end to end: real profiling run, planner, local backend, checkpoint stores."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import socket
import sys
import textwrap
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import GradientAccumulationScheduler
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import SriftyCallback
from lightning_srifty.cli import launch_cmd
from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.errors import ConfigError, CredentialsError
from lightning_srifty.core.launch_protocol import ProgressEvent
from lightning_srifty.core.planner import PlanRequest
from lightning_srifty.core.steps import StepLedger
from lightning_srifty.io.checkpoint_store import open_store
from lightning_srifty.launch.launcher import (
    LaunchOptions,
    _time_trained_s,
    run_launch,
    time_limit_step,
    user_limit_steps,
)
from tests.conftest import REPO_ROOT, S3_TEST_ENV
from tests.fakes import ClusterScript, FakeSkyApi, RecordingUI, VirtualClock

pytestmark = pytest.mark.slow

EXAMPLES = REPO_ROOT / "examples"
TRAIN_DIGITS = EXAMPLES / "train_digits.py"
ODD_ARGS = ("two words", "$HOME", "; echo pwned", "*", "--not-a-flag-of-ours", "")


def argv_recording_script(tmp_path: Path) -> Path:
    """The digits example, plus a record of the exact argv each run received."""
    script = tmp_path / "train_recording.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, sys
            sys.path.insert(0, {str(EXAMPLES)!r})
            from train_digits import main
            mode = os.environ.get("SRIFTY_MODE", "none")
            with open({str(tmp_path / "argv.jsonl")!r}, "a") as fh:
                fh.write(json.dumps([mode, sys.argv[1:]]) + "\\n")
            sys.exit(main(["--hidden", "64"]))
            """
        )
    )
    return script


def _events(path: Path) -> list[ProgressEvent]:
    return [ProgressEvent.from_line(line) for line in path.read_text().splitlines() if line]


def _options(tmp_path: Path, script: Path, **overrides: object) -> LaunchOptions:
    values: dict[str, object] = {
        "script": str(script),
        "script_args": (),
        "request": PlanRequest(target_steps=90, top_k=3),
        "backend": "local",
        "run_dir": tmp_path / "run",
        "assume_yes": True,
        "catalog": "bundled",
    }
    values.update(overrides)
    return LaunchOptions(**values)  # type: ignore[arg-type]


def test_a_cpu_profile_is_probed_on_gpus_before_a_skypilot_run(
    s3_uri: str, tmp_path: Path, sky_offline: object
) -> None:
    """Srifty profiles on the VMs it prices: a profile taken on a CPU says nothing about
    any GPU, so the distinct GPU types at the top of the ranking are probed first, each
    on its own cluster that is taken down, and the plan is made again on them."""
    from lightning_srifty.launch.sky_backend import SkyBackend

    project = examples_copy(tmp_path)
    fake = FakeSkyApi(
        clock=VirtualClock(speed=600.0),
        scripts=[ClusterScript(provision_s=60, setup_s=30, steps_per_s=2.0)] * 4,
    )
    fake.initial_step = 25
    run_dir = project / "srifty_runs" / "r1"
    backend = SkyBackend(sdk=fake, workdir=str(project), checkpoint_uri=s3_uri, run_dir=run_dir)
    options = _options(tmp_path, project / "train_digits.py", backend="sky",
                       checkpoint_uri=s3_uri, run_dir=run_dir)  # fmt: skip
    ui = RecordingUI()
    outcome = run_launch(options, ui, backend=backend)
    assert outcome.run is not None
    modes = [task.envs[proto.ENV_MODE] for _, task, _ in fake.launched]
    probes = modes.index(proto.MODE_TRAIN)
    assert probes >= 2 and set(modes[:probes]) == {proto.MODE_PROBE}
    assert modes[probes:] == [proto.MODE_TRAIN]
    probed = [name for name, _, _ in fake.launched[:probes]]
    assert set(probed) <= set(fake.downs)  # every probe cluster was taken down
    kinds = {
        (task.resources.copy().pop().instance_type, task.num_nodes > 1)
        for _, task, _ in fake.launched[:probes]
    }
    assert len(kinds) == probes  # one probe per instance type, on one node and on several
    said = "\n".join(ui.messages)
    assert "the profile ran on a CPU" in said and "the probes cost $" in said


def test_full_loop_resumes_at_the_exact_profile_step(tmp_path: Path) -> None:
    script = argv_recording_script(tmp_path)
    ui = RecordingUI()
    outcome = run_launch(_options(tmp_path, script, script_args=ODD_ARGS), ui)

    run_dir = tmp_path / "run"
    profile_events = _events(run_dir / "profile-progress.jsonl")
    stopped = next(e for e in profile_events if e.event == "profile-done")
    profile_ckpt = next(e for e in profile_events if e.event == "checkpoint")
    assert profile_ckpt.step == stopped.step > 0

    assert outcome.run is not None
    first = outcome.run.attempts[0]
    resumed = next(e for e in first.events if e.event == "resumed")
    assert resumed.step == stopped.step  # training continued exactly where profiling stopped
    assert resumed.checkpoint == profile_ckpt.checkpoint == first.resumed_from
    assert outcome.run.steps_done == 90
    assert ui.summaries and ui.plans and ui.profiles
    # the plan prices cloud hardware; the line before the run names both steps, so the
    # plan's figure and the one the run is measured against are not confused
    best, expected = outcome.plan_result.best, first.expectation
    pace = next(m for m in ui.messages if "this machine's processes are predicted" in m)
    assert f"{best.step_s * 1e3:.3g} ms" in pace and best.cluster.describe() in pace
    found = re.search(r"predicted at ([\d.]+) ms \[([\d.]+), ([\d.]+)\]", pace)
    assert found is not None, pace
    step, low, high = (float(x) / 1e3 for x in found.groups())
    assert low < step < high
    # the attempt predicts again from the cores this machine gives its processes when it
    # starts (a shared machine's load moves): the same figure, to that noise
    assert step == pytest.approx(expected.step_s, rel=0.1)

    store = open_store(str(run_dir / "checkpoints"))
    newest = store.refs()[0]
    assert newest.step == 90 and newest.reason == "final"
    # the summary counts what the store holds, not only the progress lines it read
    assert outcome.run.final_checkpoint_step == newest.step == outcome.run.steps_done
    lost = dataclasses.replace(outcome.run, attempts=())  # as if every line were lost
    assert lost.steps_done == 90
    found = store.fetch_latest(tmp_path / "restore")
    assert found is not None
    checkpoint = torch.load(found[0], weights_only=True)  # no pickled objects needed
    assert checkpoint["global_step"] == 90

    runs = [json.loads(line) for line in (tmp_path / "argv.jsonl").read_text().splitlines()]
    assert [mode for mode, _ in runs] == ["profile", "train"]
    assert all(argv == list(ODD_ARGS) for _, argv in runs)  # no shell touched them


def test_full_loop_on_s3_writes_no_credentials(s3_uri: str, tmp_path: Path) -> None:
    script = argv_recording_script(tmp_path)
    outcome = run_launch(_options(tmp_path, script, checkpoint_uri=s3_uri), RecordingUI())
    assert outcome.run is not None and outcome.run.steps_done == 90
    assert open_store(s3_uri).refs()[0].step == 90
    secrets = (S3_TEST_ENV["AWS_SECRET_ACCESS_KEY"], S3_TEST_ENV["AWS_ACCESS_KEY_ID"])
    written = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert written
    for path in written:
        text = path.read_bytes()
        assert not any(secret.encode() in text for secret in secrets), path


def test_refused_confirmation_launches_nothing(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="plan not confirmed"):
        run_launch(_options(tmp_path, TRAIN_DIGITS, assume_yes=False), RecordingUI(False))
    assert not list((tmp_path / "run").glob("progress-*.jsonl"))


def examples_copy(tmp_path: Path) -> Path:
    """The examples folder in tmp_path: a SkyPilot workdir the test may write into."""
    folder = tmp_path / "project"
    shutil.copytree(EXAMPLES, folder, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    (folder / ".gitignore").write_text("*.log\n")
    (folder / "requirements.txt").write_text("scikit-learn\n")
    return folder


def test_sky_backend_launches_real_tasks_through_the_sdk(
    s3_uri: str, tmp_path: Path, sky_offline: object
) -> None:
    from lightning_srifty.launch.sky_backend import SkyBackend

    project = examples_copy(tmp_path)
    script = project / "train_digits.py"
    # The fake cloud runs 600 virtual seconds per real one; its job resumes where the
    # profiling run's checkpoint left it (25 steps here) and trains to the target.
    fake = FakeSkyApi(
        clock=VirtualClock(speed=600.0),
        scripts=[ClusterScript(provision_s=60, setup_s=30, steps_per_s=1.0)],
    )
    fake.initial_step = 25
    run_dir = project / "srifty_runs" / "r1"
    backend = SkyBackend(
        sdk=fake,
        workdir=str(project),
        checkpoint_uri=s3_uri,
        run_dir=run_dir,
        user_setup="echo extra-setup",
    )
    options = _options(
        tmp_path,
        script,
        backend="sky",
        checkpoint_uri=s3_uri,
        script_args=("--seed", "3"),
        run_dir=run_dir,
        probe="off",  # the probes of a CPU profile have a test of their own
    )
    ui = RecordingUI()
    outcome = run_launch(options, ui, backend=backend)
    assert outcome.run is not None
    (name, task, _), *_ = fake.launched
    envs = task.envs
    assert envs[proto.ENV_MODE] == proto.MODE_TRAIN
    assert envs[proto.ENV_CHECKPOINT_URI] == s3_uri
    assert envs[proto.ENV_TARGET_STEPS] == "90"
    assert proto.ENV_PROGRESS_PATH not in envs  # a path on this machine means nothing there
    assert envs[proto.ENV_PROGRESS_STDOUT] == "1"
    events = outcome.run.attempts[0].events  # followed from the job's log
    assert (events[0].event, events[0].step) == ("resumed", 25)
    assert (events[-1].event, events[-1].step) == ("done", 90)
    assert outcome.run.steps_done == 90
    assert "train_digits.py --seed 3" in task.run
    assert not any(secret in json.dumps(envs) for secret in S3_TEST_ENV.values())
    best = outcome.plan_result.best
    group = best.cluster.groups[0]
    assert {(r.instance_type, r.use_spot) for r in task.resources} == {
        (group.offer.instance_type, best.use_spot)
    }
    assert task.num_nodes == group.nodes
    assert fake.downs == [name]  # billing stops once the job is done
    assert name.startswith("srifty-1-") and name.endswith(backend.run_id)
    # This exact package, the user's requirements and --setup, in that order.
    ((remote, local),) = task.file_mounts.items()
    assert remote.startswith("~/.srifty/wheels/lightning_srifty-") and Path(local).is_file()
    setup_lines = (task.setup or "").splitlines()
    # After the profiled torch and Lightning (tests/launch/test_sky_node.py checks those).
    setup_lines = setup_lines[setup_lines.index("set -euo pipefail") :]
    assert Path(remote).name in setup_lines[1] and setup_lines[1].startswith("pip install")
    assert setup_lines[2:] == ["pip install -r requirements.txt", "echo extra-setup"]
    ignore = (project / ".skyignore").read_text().splitlines()
    assert {"srifty_runs/", ".venv/", ".git/", "*.log"} <= set(ignore)
    assert any(".skyignore" in message for message in ui.messages)
    ledger = json.loads((run_dir / "clusters.json").read_text())
    assert [(e["name"], e["state"]) for e in ledger["entries"]] == [(name, "down")]


def test_sky_without_aws_is_refused_before_profiling(s3_uri: str, tmp_path: Path) -> None:
    from lightning_srifty.launch.sky_backend import SkyBackend

    backend = SkyBackend(sdk=FakeSkyApi(enabled=()), checkpoint_uri=s3_uri)
    options = _options(tmp_path, TRAIN_DIGITS, backend="sky", checkpoint_uri=s3_uri)
    with pytest.raises(CredentialsError, match="AWS is not enabled"):
        run_launch(options, RecordingUI(), backend=backend)
    assert not (tmp_path / "run" / "profile.json").exists()


def test_sky_needs_an_s3_checkpoint_uri(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--backend sky needs --checkpoint-uri s3://"):
        run_launch(_options(tmp_path, TRAIN_DIGITS, backend="sky"), RecordingUI())


@pytest.mark.parametrize("backend", ["sky", "sky-jobs"])
def test_dry_run_writes_yaml_that_skypilot_loads(
    backend: str, tmp_path: Path, sky_offline: object, capsys: pytest.CaptureFixture[str]
) -> None:
    import sky

    code = launch_cmd.main(
        [str(TRAIN_DIGITS), "--target-steps", "200", "--backend", backend, "--dry-run",
         "--catalog", "bundled", "--run-dir", str(tmp_path / "run"), "--hidden", "32"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    yaml_path = tmp_path / "run" / "sky" / "task-0.yaml"
    task = sky.Task.from_yaml(str(yaml_path))
    assert task.envs[proto.ENV_TARGET_STEPS] == "200"
    assert "train_digits.py --hidden 32" in task.run
    ((remote, local),) = task.file_mounts.items()  # the wheel of this package
    assert remote.startswith("~/.srifty/wheels/") and Path(local).is_file()
    report = json.loads((tmp_path / "run" / "sky" / "dry-run.json").read_text())
    entry = report["entries"][0]
    assert entry["sky_hourly_usd"] == pytest.approx(entry["our_hourly_usd"], rel=0.01)
    assert "SkyPilot's optimizer" in out
    assert not (tmp_path / "run" / "progress-1.jsonl").exists()  # nothing was launched
    assert not (EXAMPLES / ".skyignore").exists()  # a dry run touches nothing of the user's
    if backend == "sky-jobs":
        assert isinstance(task.resources, list) and len(task.resources) >= 2
        shapes = {(r.instance_type, r.use_spot) for r in task.resources}
        assert len(shapes) == len(task.resources)  # ordered candidates, no repeats
        recovery = task.resources[0].job_recovery
        assert recovery["recover_on_exit_codes"] == [proto.PREEMPTED_EXIT_CODE]
        # --job-recovery auto: a dry run asks no server, and says what its task shows.
        assert recovery["strategy"] == "EAGER_NEXT_REGION"
        assert "--job-recovery auto: a dry run does not ask the API server" in out
        assert recovery["max_restarts_on_errors"] == 0


# ------------------------------------------------------------------ one-line errors
def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


CRASHING = """
import sys
sys.path.insert(0, {examples!r})
import lightning.pytorch as pl
from digits import DigitsDataModule, DigitsModule
from lightning_srifty import SriftyCallback

class Broken(DigitsModule):
    def training_step(self, batch, batch_idx):
        if self.global_step == 3:
            raise ValueError("boom in the user's training_step")
        return super().training_step(batch, batch_idx)

pl.Trainer(max_steps=50, callbacks=[SriftyCallback()], logger=False,
           enable_checkpointing=False, default_root_dir={root!r}).fit(
    Broken(hidden=16), DigitsDataModule())
"""

NO_CALLBACK = """
import sys
sys.path.insert(0, {examples!r})
import lightning.pytorch as pl
from digits import DigitsDataModule, DigitsModule

pl.Trainer(max_steps=5, logger=False, enable_checkpointing=False,
           default_root_dir={root!r}).fit(DigitsModule(hidden=16), DigitsDataModule())
"""

GPU_FIXED = """
import sys
sys.path.insert(0, {examples!r})
import lightning.pytorch as pl
from digits import DigitsDataModule, DigitsModule
from lightning_srifty import SriftyCallback

pl.Trainer(accelerator="gpu", devices=1, max_steps=50, callbacks=[SriftyCallback()],
           logger=False, enable_checkpointing=False, default_root_dir={root!r}).fit(
    DigitsModule(hidden=16), DigitsDataModule())
"""

TOO_SHORT = """
import sys
sys.path.insert(0, {examples!r})
import lightning.pytorch as pl
from digits import DigitsDataModule, DigitsModule
from lightning_srifty import SriftyCallback

pl.Trainer(max_epochs=1, limit_train_batches=3, callbacks=[SriftyCallback()], logger=False,
           enable_checkpointing=False, default_root_dir={root!r}).fit(
    DigitsModule(hidden=16), DigitsDataModule())
"""


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing-script", "script not found: "),
        ("no-script", "no training script given"),
        ("bad-deadline", "--deadline 'soon' is not a duration"),
        ("bad-backend", "--backend 'gcp' is not valid"),
        ("bad-procs", "--local-procs must be >= 1"),
        ("unknown-option", "unknown srifty-launch option '--colour'"),
        ("typo-after-script", "unknown option '--deadlin': did you mean --deadline"),
        ("epochs-beside-target", "pass it after `--`: srifty-launch SCRIPT.py"),
        ("bad-cluster", "--cluster 'g4dn.12xlarge' is not valid: use TYPE:N"),
        ("unknown-cluster-type", "'p9.huge' is not an instance type"),
        ("resume-nothing", "the folder does not exist"),
        ("no-callback", "has no SriftyCallback"),
        (
            "gpu-fixed",
            "fixes Trainer(accelerator='gpu'), and the local backend runs every process on "
            "this machine's CPU",
        ),
        ("sky-missing", "--backend sky needs SkyPilot, which is not installed: pip install"),
        ("crash", "crashed during profiling (exit code 1); its own traceback is above"),
        (
            "too-short",
            "after 3 batches, before the profiling window (25 batches); the script's "
            "own Trainer(max_epochs=1 with 3 batches an epoch) stopped it",
        ),
        ("unreachable-bucket", "S3 check failed for s3://srifty-unreachable/x"),
        ("no-credentials", "no usable AWS credentials"),
    ],
)
def test_failures_are_one_line_with_a_nonzero_exit(
    case: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    run = ["--run-dir", str(tmp_path / "run"), "--yes", "--catalog", "bundled"]
    target = ["--target-steps", "20"]
    script = str(TRAIN_DIGITS)
    args = [script, *target, *run]
    if case == "missing-script":
        args = [str(tmp_path / "nope.py"), *target, *run]
    elif case == "no-script":
        args = [*target, *run]
    elif case == "bad-deadline":
        args += ["--deadline", "soon"]
    elif case == "bad-backend":
        args += ["--backend", "gcp"]
    elif case == "bad-procs":
        args += ["--local-procs", "0"]
    elif case == "unknown-option":
        args = ["--colour", "red", *args]
    elif case == "typo-after-script":
        args += ["--deadlin", "5h"]
    elif case == "epochs-beside-target":
        args += ["--epochs", "3"]
    elif case == "bad-cluster":
        args += ["--cluster", "g4dn.12xlarge"]
    elif case == "unknown-cluster-type":
        args += ["--cluster", "p9.huge:1"]
    elif case == "resume-nothing":
        args = ["--resume", str(tmp_path / "nope")]
    elif case == "sky-missing":
        monkeypatch.setitem(sys.modules, "sky", None)  # what `import sky` sees without it
        args += ["--backend", "sky", "--checkpoint-uri", "s3://bucket/x"]
    elif case in ("no-callback", "crash", "too-short", "gpu-fixed"):
        bodies = {"no-callback": NO_CALLBACK, "crash": CRASHING, "too-short": TOO_SHORT,
                  "gpu-fixed": GPU_FIXED}  # fmt: skip
        body = bodies[case]
        path = tmp_path / f"{case}.py"
        path.write_text(body.format(examples=str(EXAMPLES), root=str(tmp_path / "root")))
        args = [str(path), *target, *run]
    elif case == "unreachable-bucket":
        monkeypatch.setenv("SRIFTY_S3_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
        for key, value in S3_TEST_ENV.items():
            monkeypatch.setenv(key, value)
        args += ["--checkpoint-uri", "s3://srifty-unreachable/x"]
    elif case == "no-credentials":
        monkeypatch.setenv("SRIFTY_S3_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        args += ["--checkpoint-uri", "s3://srifty-any/x"]

    code = launch_cmd.main(args)
    captured = capfd.readouterr()
    assert code != 0
    ours = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1, captured.err
    assert message in ours[0]
    if case == "crash":
        assert "ValueError: boom in the user's training_step" in captured.err  # the script's own
    else:
        assert "Traceback" not in captured.err
    if case in ("missing-script", "no-script", "typo-after-script", "unknown-cluster-type"):
        assert not (tmp_path / "run").exists()  # refused before any folder was made


def test_preemptions_are_survived_migrated_and_logged(tmp_path: Path) -> None:
    from lightning_srifty.launch.injection import EveryInterval

    options = _options(
        tmp_path,
        TRAIN_DIGITS,
        request=PlanRequest(target_steps=2500, top_k=3),
        preemptions=EveryInterval(0.5),  # of training: a move on any machine
        grace_s=20.0,
    )
    ui = RecordingUI()
    outcome = run_launch(options, ui)
    assert outcome.run is not None
    moves = outcome.run.migrations
    assert moves
    # The UI hears of each move when it starts, before the resume and the time lost.
    assert [m.to_plan for m in ui.migrations] == [m.to_plan for m in moves]
    for move in moves:
        assert move.reason.startswith("spot preemption; srifty")
        assert move.to_plan != move.from_plan  # the revoked offer is cooling down
        # SIGTERM gave the job its notice: the emergency checkpoint lost nothing.
        assert move.resumed_step == move.step_at_preemption > 0
        assert move.lost_s > 0
    logged = [
        json.loads(line)
        for line in (tmp_path / "run" / "migrations.jsonl").read_text().splitlines()
    ]
    assert [m["to_plan"] for m in logged] == [m.to_plan for m in moves]
    reasons = {
        ref.reason for ref in open_store(str(tmp_path / "run" / "checkpoints"), keep=99).refs()
    }
    assert "final" in reasons
    # A move to more processes makes each step worth more of the target (the run's step
    # ledger): the run ends at its ledger's target step, where 2500 profiled steps are done.
    ledger = StepLedger.from_dict(json.loads((tmp_path / "run" / "steps.json").read_text()))
    done = outcome.run.steps_done
    assert done == outcome.run.target_steps
    last_worth = ledger.segments[-1].base_per_step
    assert 2500 <= ledger.base_at(done) < 2500 + last_worth
    assert len(outcome.run.attempts) == len(moves) + 1


def test_uniform_progress_waits_for_its_home_zone_then_returns(tmp_path: Path) -> None:
    from lightning_srifty.launch.injection import EveryInterval

    options = _options(
        tmp_path,
        TRAIN_DIGITS,
        request=PlanRequest(target_steps=1500, deadline_h=100.0, top_k=3),
        preemptions=EveryInterval(0.5),  # of training: a move on any machine
        policy="uniform-progress",
    )
    ui = RecordingUI()
    outcome = run_launch(options, ui)
    assert outcome.run is not None and outcome.run.steps_done == 1500
    moves = outcome.run.migrations
    assert moves
    # Far ahead of t*C/D with the home offer cooling down: it waits, then goes home.
    assert any(m.startswith("waiting") and "uniform-progress" in m for m in ui.messages)
    assert all(m.to_plan == m.from_plan for m in moves)
    assert all("uniform-progress" in m.reason for m in moves)


class _Counting(pl.LightningModule):
    """A linear model on ``batches`` batches an epoch that counts the batches it trains."""

    def __init__(self, batches: int) -> None:
        super().__init__()
        self.batches, self.trained = batches, 0
        self.net = torch.nn.Linear(4, 1)

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        x = torch.randn(4 * self.batches, 4, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        self.trained += 1
        return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize(
    ("accumulate", "batches", "max_steps"),
    [(3, 10, 13), (3, 9, 13), (4, 10, 9), (1, 7, 11), ({0: 1, 2: 3, 4: 2}, 10, 40)],
)
def test_the_scripts_max_steps_bound_the_batches_lightning_runs(
    accumulate: int | dict[int, int], batches: int, max_steps: int, tmp_path: Path
) -> None:
    """Lightning steps the optimizer every ``accumulate`` batches and at an epoch's last
    batch; the window's measured steps-per-batch ratio (10/29 here before) put a
    ``max_steps=300`` script with 40-batch epochs at 870 batches where Lightning ran 858.
    A ``GradientAccumulationScheduler`` (a dict here) changes the factor by epoch after
    the window. The bound is what the same Trainer really runs."""
    pl.seed_everything(0)
    callbacks: list[pl.Callback] = [SriftyCallback(warmup_steps=1, profile_steps=2, verbose=False)]
    if isinstance(accumulate, dict):
        callbacks.append(GradientAccumulationScheduler(scheduling=accumulate))
    module = _Counting(batches)
    pl.Trainer(max_steps=max_steps, accelerator="cpu",
               accumulate_grad_batches=1 if isinstance(accumulate, dict) else accumulate,
               devices=1, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
               ).fit(module)  # fmt: skip
    callback = callbacks[0]
    assert isinstance(callback, SriftyCallback)
    assert callback.profile is not None
    assert user_limit_steps(callback.profile, 1) == (module.trained, f"max_steps={max_steps}")


def test_a_checkpoint_keeps_the_time_its_timer_counted_for_a_resumes_plan(tmp_path: Path) -> None:
    """A resumed run's plan counts ``max_time`` from the training time Lightning's
    ``Timer`` had counted at its newest checkpoint: the manifest keeps it, so the
    launcher reads it without downloading the checkpoint. Without a ``Timer`` nothing is
    kept, and the profile's count at its window end stands in."""
    from lightning_srifty.capture.checkpointing import save_to_store

    callback = SriftyCallback(warmup_steps=1, profile_steps=2, verbose=False)
    trainer = pl.Trainer(max_steps=6, max_time={"hours": 1}, accelerator="cpu", devices=1,
                         default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[callback])  # fmt: skip
    trainer.fit(_Counting(10))
    store = open_store(str(tmp_path / "store"))
    save_to_store(trainer, store, reason="periodic", step=6)
    (ref,) = store.refs()
    timer = next(c for c in trainer.callbacks if isinstance(c, pl.callbacks.Timer))
    assert ref.extra["time_trained_s"] == pytest.approx(timer.time_elapsed(), abs=0.01)
    assert callback.profile is not None
    assert _time_trained_s(ref, callback.profile) == ref.extra["time_trained_s"]
    untimed = dataclasses.replace(ref, extra={})
    profiled = callback.profile.extra["trainer"]["time_elapsed_s"]
    assert _time_trained_s(untimed, callback.profile) == profiled < ref.extra["time_trained_s"]
    assert _time_trained_s(None, dataclasses.replace(callback.profile, extra={})) == 0.0


@pytest.mark.parametrize("max_time", [{"hours": 1}, None])
def test_the_scripts_max_time_is_recorded_and_placed_at_a_step(
    max_time: dict[str, int] | None, tmp_path: Path
) -> None:
    """``Trainer(max_time=...)``: the profile keeps the limit and the training time
    Lightning's ``Timer`` counted by the window's end; the rest, at the run's step, is
    where the script will stop. No limit, no step."""
    callback = SriftyCallback(warmup_steps=1, profile_steps=2, verbose=False)
    pl.Trainer(max_steps=6, max_time=max_time, accelerator="cpu", devices=1,
               default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
               ).fit(_Counting(10))  # fmt: skip
    assert callback.profile is not None
    limits = callback.profile.extra["trainer"]
    if max_time is None:
        assert "max_time_s" not in limits
        assert time_limit_step(callback.profile, 0.5, 10) is None
        return
    elapsed = limits["time_elapsed_s"]
    assert limits["max_time_s"] == 3600.0 and 0 < elapsed < 60
    assert time_limit_step(callback.profile, 0.5, 10) == (10 + int((3600 - elapsed) / 0.5), 3600.0)


def test_a_re_plan_after_a_preemption_prices_the_scripts_limits_left() -> None:
    """At step 400 of a script with max_steps=500, 100 steps are left to it: of the 1,600
    base steps still to train, only a cluster of 16 or more GPUs trains them all in 100
    steps. A re-plan offers those first, as the launch's own plan does; without the
    limits it would offer one GPU, which the script stops after 100 steps."""
    from lightning_srifty.core.script_trainer import ScriptTrainer
    from lightning_srifty.launch.launcher import _candidate_source
    from tests.core.test_planner import MODEL, make_profile, small_catalog

    profile = make_profile(trainer={"max_steps": 500, "automatic_optimization": False})
    request = ScriptTrainer.of(profile).constrain(PlanRequest(target_steps=2_000))
    assert request.script_stop is not None
    left = request.script_stop.after(400, 0.0)
    limited = _candidate_source(profile, small_catalog(), MODEL, request, (), lambda: left)
    found = limited(1_600, 0.0, request.restart_delay_h)
    assert found.spot and found.on_demand is not None
    for p in (*found.spot, found.on_demand):
        assert p.cluster.world_size >= 16 and p.stops_at_step is None, p.cluster.describe()
    free = _candidate_source(profile, small_catalog(), MODEL, request, (), lambda: None)
    assert min(p.cluster.world_size for p in free(1_600, 0.0, request.restart_delay_h).spot) < 16


def test_a_preemption_at_the_scripts_own_stop_re_plans_the_end_not_an_error() -> None:
    """Revoked when the newest checkpoint is at the script's max_time: every plan trains
    nothing, and the re-plan prices the resume that only ends the run (one step) where
    it raised "no candidate cluster can run this job" (found with a 25 s max_time)."""
    from lightning_srifty.core.script_trainer import ScriptTrainer
    from lightning_srifty.launch.launcher import _candidate_source
    from tests.core.test_planner import MODEL, make_profile, small_catalog

    profile = make_profile(trainer={"max_time_s": 25.0, "time_elapsed_s": 2.0})
    request = ScriptTrainer.of(profile).constrain(PlanRequest(target_steps=2_000))
    assert request.script_stop is not None
    spent = request.script_stop.after(630, 25.0)
    found = _candidate_source(profile, small_catalog(), MODEL, request, (), lambda: spent)(
        1_370, 0.01, request.restart_delay_h
    )
    assert found.spot and found.on_demand is not None
    assert {p.steps_to_target for p in (*found.spot, found.on_demand)} == {1}
