"""What reaches a node: this package's wheel, the user's requirements and setup, and a
workdir upload that leaves out runs, virtualenvs and git, by SkyPilot's own rules."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import lightning_srifty
from lightning_srifty.launch import shipping

PACKAGE = Path(lightning_srifty.__file__).resolve().parent


def test_the_wheel_holds_exactly_the_installed_package(tmp_path: Path) -> None:
    wheel = shipping.build_wheel(tmp_path / "a")
    again = shipping.build_wheel(tmp_path / "b")
    assert wheel.path.read_bytes() == again.path.read_bytes()  # reproducible
    assert wheel.version.startswith(lightning_srifty.__version__ + "+b")
    assert wheel.path.name == f"lightning_srifty-{wheel.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel.path) as archive:
        names = set(archive.namelist())
        for path in shipping.package_files():
            name = f"lightning_srifty/{path.relative_to(PACKAGE).as_posix()}"
            assert archive.read(name) == path.read_bytes(), name
        assert "lightning_srifty/data/aws_vms.csv" in names
        assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
        info = f"lightning_srifty-{wheel.version}.dist-info"
        metadata = archive.read(f"{info}/METADATA").decode()
        assert f"Version: {wheel.version}" in metadata
        assert "Requires-Dist: lightning" in metadata  # pip on the node resolves these
        assert "srifty-launch" in archive.read(f"{info}/entry_points.txt").decode()


def test_pip_installs_the_wheel_and_it_imports(tmp_path: Path) -> None:
    wheel = shipping.build_wheel(tmp_path / "wheel")
    target = tmp_path / "site"
    subprocess.run(  # noqa: S603 - fixed argv; no index, no dependencies: offline
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--target", str(target), str(wheel.path)],
        check=True,
    )  # fmt: skip
    probe = (
        "import importlib.metadata as m, lightning_srifty, sys\n"
        "print(lightning_srifty.__file__)\nprint(m.version('lightning-srifty'))"
    )
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True,
        check=True,
    ).stdout.split()  # fmt: skip
    assert out[0].startswith(str(target))
    assert out[1] == wheel.version
    installed = target / "lightning_srifty" / "launch" / "shipping.py"
    digest = hashlib.sha256(installed.read_bytes()).hexdigest()
    assert digest == hashlib.sha256((PACKAGE / "launch" / "shipping.py").read_bytes()).hexdigest()


def _stub_pip(bin_dir: Path, record: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    pip = bin_dir / "pip"
    pip.write_text(f'#!/bin/sh\necho "pip $*" >> {record}\n')
    pip.chmod(pip.stat().st_mode | stat.S_IXUSR)


def test_the_setup_script_installs_wheel_requirements_then_user_setup(tmp_path: Path) -> None:
    wheel = shipping.build_wheel(tmp_path / "wheel")
    home = tmp_path / "home"
    mounted = home / ".srifty" / "wheels" / wheel.path.name  # where file_mounts puts it
    mounted.parent.mkdir(parents=True)
    shutil.copy(wheel.path, mounted)
    workdir = tmp_path / "sky_workdir"
    workdir.mkdir()
    (workdir / "requirements.txt").write_text("scikit-learn\n")
    record = tmp_path / "pip.log"
    _stub_pip(tmp_path / "bin", record)
    script = shipping.setup_script(wheel, requirements=True, extra="echo user-setup > done")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(home)}
    subprocess.run(["bash", "-c", script], cwd=workdir, env=env, check=True)  # noqa: S603
    assert record.read_text().splitlines() == [
        f"pip install {mounted}",
        "pip install -r requirements.txt",
    ]
    assert (workdir / "done").read_text().strip() == "user-setup"
    bare = shipping.setup_script(wheel, requirements=False)
    assert "requirements" not in bare and bare.count("pip install") == 1


def _project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    for rel in ("train.py", "data/x.bin", "notes.log", "srifty_runs/demo/ckpt",
                "sub/srifty_runs/a", ".venv/bin/python", ".git/HEAD", "keep/me.py"):  # fmt: skip
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    (folder / ".gitignore").write_text("data/\n*.log\n")
    return folder


def test_skyignore_keeps_runs_venv_and_git_out_by_skypilots_rules(
    tmp_path: Path, sky_offline: object
) -> None:
    from sky.data import storage_utils

    folder = _project(tmp_path)
    path, added = shipping.ensure_skyignore(folder, ("/custom-run/",))
    assert added == ["srifty_runs/", ".venv/", ".git/", "/custom-run/"]
    # SkyPilot's own reader (bucket uploads, managed jobs) ...
    excluded = set(storage_utils.get_excluded_files(str(folder)))
    assert {"srifty_runs", "sub/srifty_runs", ".venv", ".git", "data", "notes.log"} <= excluded
    assert not excluded & {"train.py", "keep", "keep/me.py"}
    # ... and the rsync filter it uses for cluster workdirs.
    if shutil.which("rsync") is None:
        pytest.skip("rsync is not installed")
    from sky.utils import command_runner

    assert command_runner.RSYNC_FILTER_SKYIGNORE == "--filter='dir-merge,- .skyignore'"
    listing = subprocess.run(  # noqa: S603 - fixed argv, a dry run into a scratch folder
        ["rsync", "-an", "--out-format=%n", "--filter=dir-merge,- .skyignore",
         f"{folder}/", str(tmp_path / "dest")],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert "train.py" in listing and "keep/me.py" in listing
    assert not any(n.startswith(("srifty_runs", ".venv", ".git/", "data")) for n in listing)
    assert not any("srifty_runs" in n or n.endswith(".log") for n in listing)


def test_an_existing_skyignore_only_gets_the_missing_lines(tmp_path: Path) -> None:
    folder = _project(tmp_path)
    (folder / ".skyignore").write_text("# mine\n.venv\nbig-data/")
    path, added = shipping.ensure_skyignore(folder)
    assert added == ["srifty_runs/", ".git/"]
    lines = path.read_text().splitlines()
    assert lines[:3] == ["# mine", ".venv", "big-data/"]  # the user's lines, untouched
    assert lines[-2:] == ["srifty_runs/", ".git/"]
    assert shipping.ensure_skyignore(folder) == (path, [])  # idempotent


def test_a_dry_run_touches_nothing(tmp_path: Path) -> None:
    folder = _project(tmp_path)
    path, would = shipping.ensure_skyignore(folder, write=False)
    assert would == ["srifty_runs/", ".venv/", ".git/"]
    assert not path.exists()
