"""Run folders: fresh per launch, refused when they hold a run, resumable from run.json."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from lightning_srifty.cli import launch_cmd
from lightning_srifty.core.errors import ConfigError, SchemaError
from lightning_srifty.launch.runs import (
    claim_run_dir,
    default_run_dir,
    next_attempt,
    read_run_record,
    read_startups,
    record_startup,
    write_run_record,
)


def test_default_folder_names_the_script_and_the_time() -> None:
    when = dt.datetime(2026, 3, 4, 5, 6, 7)
    assert default_run_dir("path/to/train net.py", when) == Path(
        "srifty_runs/train_net-20260304-050607"
    )


def test_each_launch_claims_a_new_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = claim_run_dir(None, "train.py")
    (first / "profile.json").write_text("{}")
    second = claim_run_dir(None, "train.py")  # same second: a suffix, not the same folder
    assert first != second and first.is_dir() and second.is_dir()
    assert (first / "profile.json").read_text() == "{}"


def test_a_folder_holding_a_run_is_refused_naming_resume(tmp_path: Path) -> None:
    folder = tmp_path / "exp"
    assert claim_run_dir(folder, "train.py") == folder  # new (or empty) folders are fine
    (folder / "checkpoints").mkdir()
    (folder / "profile.json").write_text("{}")
    with pytest.raises(ConfigError) as err:
        claim_run_dir(folder, "train.py")
    message = str(err.value)
    assert f"--resume {folder}" in message and "profile.json" in message
    assert (folder / "profile.json").read_text() == "{}"


def test_attempts_of_a_resumed_run_follow_the_earlier_ones(tmp_path: Path) -> None:
    assert next_attempt(tmp_path) == 1
    (tmp_path / "progress-1.jsonl").write_text("")
    (tmp_path / "attempt-3").mkdir()
    assert next_attempt(tmp_path) == 4


def test_run_record_round_trip_and_bad_folders(tmp_path: Path) -> None:
    write_run_record(tmp_path, ["/abs/train.py", "--target-steps", "9", "--", "--epochs", "2"])
    assert read_run_record(tmp_path).argv == (
        "/abs/train.py", "--target-steps", "9", "--", "--epochs", "2"
    )  # fmt: skip
    with pytest.raises(ConfigError, match="has no run.json"):
        read_run_record(tmp_path / "..")
    with pytest.raises(ConfigError, match="does not exist"):
        read_run_record(tmp_path / "nope")
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": 1, "argv": "x"}))
    with pytest.raises(SchemaError, match="argv"):
        read_run_record(tmp_path)


def test_start_ups_are_kept_per_backend_and_a_bad_record_is_named(tmp_path: Path) -> None:
    assert read_startups(tmp_path) == ()
    record_startup(tmp_path, "local", 3.5)
    record_startup(tmp_path, "sky", 240.0)
    assert read_startups(tmp_path) == (("local", 3.5), ("sky", 240.0))
    assert read_startups(tmp_path, "sky") == (("sky", 240.0),)
    assert read_startups(tmp_path, "sky-jobs") == ()
    path = tmp_path / "startups.json"
    data = json.loads(path.read_text())
    data["startups"][1]["seconds"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(SchemaError, match=r"startups\.json.*startups\[1\]\.seconds"):
        read_startups(tmp_path)
    path.write_text(json.dumps({"schema_version": 9, "startups": []}))
    with pytest.raises(SchemaError, match="schema_version"):
        read_startups(tmp_path)


def test_recorded_command_drops_this_launch_only_options(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    argv = ["--run-dir", "r", str(script), "--profile=p.json", "--dry-run", "--yes", "--",
            "--run-dir", "kept for the script"]  # fmt: skip
    assert launch_cmd.record_argv(argv, str(script)) == (
        str(script.resolve()), "--yes", "--", "--run-dir", "kept for the script"
    )  # fmt: skip


def test_resume_puts_new_options_after_the_stored_ones(tmp_path: Path) -> None:
    write_run_record(tmp_path, ["/abs/train.py", "--target-steps", "9", "--", "--lr", "1"])
    folder, line = launch_cmd.resume_argv(["--resume", str(tmp_path), "--deadline", "5h"])
    assert folder == tmp_path
    assert line == ["/abs/train.py", "--target-steps", "9", "--deadline", "5h", "--", "--lr", "1"]
    assert launch_cmd.resume_argv(["train.py", "--target-steps", "3"]) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--resume"], "--resume needs the run folder"),
        (["--resume", "{run}", "other.py"], "takes the script and its arguments from the run"),
        (["--resume", "{run}", "--run-dir", "x"], "leave out --run-dir"),
        (["--resume", "{run}", "--", "--lr", "2"], "drop `--`"),
    ],
)
def test_bad_resume_lines_are_one_line_errors(
    argv: list[str], message: str, tmp_path: Path
) -> None:
    write_run_record(tmp_path, ["/abs/train.py", "--target-steps", "9"])
    with pytest.raises(ConfigError, match=message):
        launch_cmd.resume_argv([a.format(run=tmp_path) for a in argv])
