"""``srifty down RUN_DIR``: one line per outcome, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_srifty.cli import main
from lightning_srifty.io.cluster_ledger import ClusterLedger


def test_nothing_recorded_is_nothing_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main(["down", str(tmp_path)]) == 0
    assert "no clusters recorded; nothing to do" in capsys.readouterr().out


def test_a_missing_run_dir_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main.main(["down", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code != 0
    assert err.strip() == f"error: RUN_DIR {tmp_path / 'nope'} is not a directory"


def test_without_an_api_server_it_says_so_and_keeps_the_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sky_offline: object
) -> None:
    ledger = ClusterLedger(tmp_path, "ab12cd")
    ledger.mark("srifty-1-ab12cd", "up")
    ledger.mark("srifty-2-ab12cd", "down")
    code = main.main(["down", str(tmp_path)])  # the real SDK; no API server here
    captured = capsys.readouterr()
    assert code != 0
    assert "taking down srifty-1-ab12cd (cluster)" in captured.out
    (line,) = [x for x in captured.err.splitlines() if x.startswith("error: ")]
    assert "could not take down srifty-1-ab12cd" in line and "SkyPilot API server" in line
    assert "Traceback" not in captured.err
    states = {e.name: e.state for e in ClusterLedger(tmp_path).entries()}
    assert states == {"srifty-1-ab12cd": "up", "srifty-2-ab12cd": "down"}


def test_a_garbled_ledger_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "clusters.json").write_text('{"schema_version": 1, "entries": [{"name": 3}]}')
    assert main.main(["down", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "clusters.json" in err and "entries[0].name" in err
