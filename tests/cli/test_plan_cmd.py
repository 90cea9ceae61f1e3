"""``srifty plan``: table, JSON, Pareto picture, infeasible and bad-flag messages."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from lightning_srifty.cli import plan_cmd
from lightning_srifty.cli.main import build_parser, main, run_guarded
from lightning_srifty.core.units import format_money
from lightning_srifty.io.profile_io import save_profile
from tests.core.test_planner import SPECS, make_profile, small_catalog


@pytest.fixture
def profile_path(tmp_path: Path) -> Path:
    return save_profile(make_profile(dataset_size=40_000), tmp_path / "profile.json")


def run_plan(argv: list[str]) -> int:
    """The CLI path end to end, with the small test catalog in place of the bundled one."""
    args = build_parser().parse_args(["plan", *argv])
    return run_guarded(lambda: plan_cmd.run(args, small_catalog(), SPECS))


def test_table_on_a_terminal_ranks_plans_and_shows_baselines(profile_path: Path) -> None:
    args = build_parser().parse_args(["plan", "--profile", str(profile_path), "--target-steps",
                                      "20000", "--deadline", "2h", "--top", "3"])  # fmt: skip
    result, request = plan_cmd.plan_from_args(args, small_catalog(), SPECS)
    screen = io.StringIO()
    plan_cmd.print_table(result, request, Console(file=screen, force_terminal=True, width=240))
    out = screen.getvalue()
    for header in ("cluster", "market", "time to target", "expected cost", "P(deadline)"):
        assert header in out
    assert "cheapest $/h that fits" in out and "fastest single node" in out
    assert "g4dn" in out and "searched" in out


def test_output_off_a_terminal_fits_80_columns_and_cuts_nothing(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_plan(["--profile", str(profile_path), "--target-steps", "20000",
                     "--deadline", "2h", "--top", "3"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert lines and all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in out
    args = build_parser().parse_args(["plan", "--profile", str(profile_path), "--target-steps",
                                      "20000", "--deadline", "2h", "--top", "3"])  # fmt: skip
    result, _ = plan_cmd.plan_from_args(args, small_catalog(), SPECS)
    for rank, p in enumerate(result.plans, 1):
        line = next(x for x in lines if x.startswith(f"{rank:>2}. "))
        assert p.cluster.describe() in line and p.cluster.groups[0].offer.zone in line
        assert format_money(p.cost_usd) in out
    assert "cheapest $/h that fits" in out and "fastest single node" in out


def test_json_is_versioned_and_ranked(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_plan(["--profile", str(profile_path), "--epochs", "3", "--budget", "$50",
                     "--objective", "time", "--json", "--no-spot"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["schema_version"] == 1 and doc["kind"] == "srifty-plan"
    assert doc["target_steps_at_base"] == -(-3 * 40_000 // 32)
    assert [p["rank"] for p in doc["plans"]] == list(range(1, len(doc["plans"]) + 1))
    assert all(p["market"] == "on-demand" and p["cost_usd"] <= 50 for p in doc["plans"])
    times = [p["time_to_target_h"] for p in doc["plans"]]
    assert times == sorted(times)
    assert {b["label"] for b in doc["baselines"]} >= {"fastest single node"}


def test_time_and_cost_are_said_to_be_expectations_at_the_mean_step(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--profile", str(profile_path), "--target-steps", "20000", "--deadline", "2h"]
    assert run_plan([*argv, "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "expected" in text and "median" in text and "P(deadline) counts both" in text
    assert run_plan([*argv, "--top", "3", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    for p in plans:
        sigma = math.log(p["step_high_s"] / p["step_low_s"]) / (2 * 1.2816)
        assert p["step_sigma"] == pytest.approx(sigma)
        assert p["step_mean_s"] == pytest.approx(p["step_s"] * math.exp(sigma**2 / 2))


def test_plot_writes_a_png(profile_path: Path, tmp_path: Path) -> None:
    png = tmp_path / "front.png"
    code = run_plan(["--profile", str(profile_path), "--target-steps", "20000",
                     "--objective", "knee", "--plot", str(png), "--json"])  # fmt: skip
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_infeasible_deadline_is_one_line_with_what_is_achievable(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_plan(["--profile", str(profile_path), "--target-steps", "2000000",
                     "--deadline", "10m"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "the fastest plan needs" in err and "> deadline" in err


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--deadline", "tomorrow"), ("--deadline", "0h"), ("--budget", "-5"),
     ("--budget", "five"), ("--objective", "fast"), ("--catalog", "gcp"),
     ("--max-nodes", "0"), ("--restart-delay", "soon"), ("--confidence", "1.5")],
)  # fmt: skip
def test_bad_flag_values_are_one_line_exit_2(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", "--profile", str(tmp_path / "unread.json"), "--target-steps", "10",
                 flag, value])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and flag in err and "Traceback" not in err


def test_epochs_without_dataset_size_explains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save_profile(make_profile(), tmp_path / "p.json")
    code = run_plan(["--profile", str(path), "--epochs", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "--dataset-size" in err


def test_bundled_catalog_end_to_end(profile_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("lightning_srifty.io.catalog_io", reason="catalog module not present")
    code = main(["plan", "--profile", str(profile_path), "--target-steps", "20000",
                 "--deadline", "4h", "--catalog", "bundled", "--json"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["search_space"]["total"] > 10_000
    assert doc["plans"][0]["time_to_target_h"] <= 4
