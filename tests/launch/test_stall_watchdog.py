"""The launcher's stall watchdog, on a real job that hangs.

Real command line, real profiling run, real ``torchrun`` worker on 127.0.0.1. The
script hangs for good at one step of its first training attempt (a deadlocked collective
or a DataLoader worker stuck in its fork look the same from outside: no progress line,
ever). Nothing in the job ends it; gloo would fail it after 30 minutes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lightning_srifty.cli import launch_cmd
from tests.launch.e2e import attempt_logs, events, only_run

pytestmark = pytest.mark.slow

VALIDATED = str(Path(__file__).resolve().parent / "scripts" / "validated.py")
BASE = ["--yes", "--catalog", "bundled"]
HANG_AT = 170


def test_a_hung_job_is_relaunched_from_its_checkpoint_and_a_long_validation_is_not_a_hang(
    in_tmp: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every validation pass (3 batches of 1.5 s, at every 40th step) is longer than the
    3 s stall timeout, and alive: its heartbeats keep it from being taken for a hang.
    The hang at step 170 (after the pass at step 160) is one: the job is stopped after
    3 s of silence, relaunched on the same plan from the newest checkpoint, and reaches
    its target."""
    marker = in_tmp / "hung-once"
    monkeypatch.setenv("VAL_SLEEP_S", "1.5")
    monkeypatch.setenv("HANG_AT_STEP", str(HANG_AT))
    monkeypatch.setenv("HANG_MARKER", str(marker))
    code = launch_cmd.main(
        [VALIDATED, "--val-samples", "12", "--profile-steps", "30", "--target-steps", "240",
         "--cluster", "g4dn.xlarge:1", "--no-refine", "--stall-timeout", "3s", *BASE]
    )  # fmt: skip
    out, err = capfd.readouterr()
    assert code == 0, err[-3000:] + "\n" + attempt_logs(in_tmp)
    assert marker.exists()  # it did hang
    run = only_run(in_tmp)
    moves = [json.loads(line) for line in (run / "migrations.jsonl").read_text().splitlines()]
    assert len(moves) == 1, moves  # the hang, and no validation pass
    (move,) = moves
    assert move["reason"].startswith("hung (no progress line for "), move
    assert move["from_plan"] == move["to_plan"]
    hung = events(run, "progress-1.jsonl")
    last_reported = max(e.step for e in hung)  # lines come once a second at most
    assert last_reported <= HANG_AT
    assert [e for e in hung if e.event == "validating"]  # the pass before it beat
    relaunched = events(run, "progress-2.jsonl")
    resumed = next(e for e in relaunched if e.event == "resumed")
    assert 0 < resumed.step <= HANG_AT  # the newest checkpoint, not step 0
    assert move["resumed_step"] == resumed.step
    assert relaunched[-1].event == "done" and relaunched[-1].step == 240
    said = re.search(r"hung \(no progress line for (\d+) s after step (\d+)\)", out + err)
    assert said and int(said.group(1)) >= 3 and int(said.group(2)) == last_reported
    # half-way through the silence the user was told what would happen
    assert f"no progress line for 2 s after step {last_reported}: taken as a hang" in out
    # the job wrote its own stacks under the stall limit, before the launcher stopped it
    # (a cloud backend cannot ask it for them): faulthandler's timeout, at 90 % of 3 s
    hung_log = (run / "attempt-1" / "node-0.log").read_text(errors="replace")
    assert "Timeout (0:00:02.700000)!" in hung_log, attempt_logs(in_tmp)
    assert "training_step" in hung_log.split("Timeout (0:00:02.700000)!")[1]


def test_a_start_up_that_hangs_before_its_first_progress_line_is_relaunched(
    in_tmp: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first training attempt hangs in the module's ``setup``, before it writes any
    progress line: it is stopped once it has written nothing for three times the longest
    start-up the job measured (its profiling run's) and relaunched on the same plan,
    where it trains to its target. Before, only a job that had reported progress was
    watched, and this one would have been waited on for ever (on a cloud, billing)."""
    marker = in_tmp / "hung-at-setup"
    monkeypatch.setenv("HANG_AT_SETUP_MARKER", str(marker))
    code = launch_cmd.main(
        [VALIDATED, "--target-steps", "120", "--cluster", "g4dn.xlarge:1", "--no-refine",
         "--stall-timeout", "3s", *BASE]
    )  # fmt: skip
    out, err = capfd.readouterr()
    assert code == 0, err[-3000:] + "\n" + attempt_logs(in_tmp)
    assert marker.exists()  # it did hang
    run = only_run(in_tmp)
    startups = json.loads((run / "startups.json").read_text())["startups"]
    profiled = [s["seconds"] for s in startups if s["backend"] == "profile"]
    assert len(profiled) == 1 and profiled[0] > 0
    moves = [json.loads(line) for line in (run / "migrations.jsonl").read_text().splitlines()]
    assert len(moves) == 1, moves
    (move,) = moves
    said = re.match(
        r"hung \(no output for (\d+) s before its first progress line\)", move["reason"]
    )
    assert said, move
    # silent for at least 3x the profiling run's start-up (and the 3 s timeout)
    assert int(said.group(1)) >= max(3.0, 3 * profiled[0]) - 1
    assert move["from_plan"] == move["to_plan"]
    hung = run / "progress-1.jsonl"
    assert not hung.exists() or not events(run, hung.name)  # it wrote no progress line
    relaunched = events(run, "progress-2.jsonl")
    assert relaunched[-1].event == "done" and relaunched[-1].step == 120
    assert "before its first progress line: taken as a hang and relaunched at" in out


def test_a_slow_silent_start_up_is_told_and_not_taken_for_a_hang(
    in_tmp: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every run's ``setup`` is silent for 5 s, beyond the 2 s stall timeout: the
    profiling run is told once that it has not reached its first step and goes on; the
    training attempt, silent as long, is within three times the profiled start-up and
    is not stopped."""
    monkeypatch.setenv("SETUP_SLEEP_S", "5")
    code = launch_cmd.main(
        [VALIDATED, "--target-steps", "100", "--cluster", "g4dn.xlarge:1", "--no-refine",
         "--stall-timeout", "2s", *BASE]
    )  # fmt: skip
    out, err = capfd.readouterr()
    assert code == 0, err[-3000:] + "\n" + attempt_logs(in_tmp)
    assert err.count("and not reached its first training step") == 1, err[-2000:]
    run = only_run(in_tmp)
    assert (
        not (run / "migrations.jsonl").exists()
        or not (run / "migrations.jsonl").read_text().strip()
    )
    assert events(run, "progress-1.jsonl")[-1].event == "done"
    assert "before its first progress line: taken as a hang" not in out


def test_a_profiling_run_that_hangs_is_stopped_in_one_line(
    in_tmp: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The profiling run (one process on this machine) hangs at step 10: it is killed
    after the stall timeout, and the launch stops with one line, launching nothing."""
    marker = in_tmp / "hung-once"
    monkeypatch.setenv("HANG_AT_STEP", "10")
    monkeypatch.setenv("HANG_MARKER", str(marker))
    code = launch_cmd.main(
        [VALIDATED, "--target-steps", "200", "--cluster", "g4dn.xlarge:1", "--stall-timeout",
         "3s", *BASE]
    )  # fmt: skip
    _, err = capfd.readouterr()
    assert code != 0 and marker.exists()
    assert "validated.py hung while profiled: no progress line for 3 s" in err, err[-2000:]
    assert "Traceback" not in err
    run = only_run(in_tmp)
    assert not list(run.glob("progress-*.jsonl"))  # no training attempt was launched


def test_a_bad_stall_timeout_is_refused_by_name(
    in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code = launch_cmd.main(
        [VALIDATED, "--target-steps", "10", "--stall-timeout", "soon", "--dry-run", *BASE]
    )
    _, err = capfd.readouterr()
    assert code != 0
    assert "--stall-timeout 'soon' is not a duration" in err
    assert "Traceback" not in err
