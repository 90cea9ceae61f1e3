"""What a cloud node needs to run the job: this exact package, the user's requirements,
and a workdir upload that leaves out what does not belong on a node.

* :func:`build_wheel` packs the ``lightning_srifty`` files *installed here* (editable
  or not) into a pure-Python wheel whose version carries a content hash
  (``0.1.0+b1a2b3c4d5e6f``). No index holds it, so the node cannot get a different
  build: SkyPilot copies it with the task's ``file_mounts`` and :func:`setup_script`
  installs it. Its ``Requires-Dist`` lines are the installed distribution's, so pip on
  the node resolves torch and Lightning as usual.
* :func:`setup_script` installs the wheel, then ``requirements.txt`` from the script's
  folder when there is one, then the user's own ``--setup`` commands.
* :func:`ensure_skyignore` makes SkyPilot's own ignore file leave ``srifty_runs/``
  (checkpoints, logs, profiles), ``.venv`` and ``.git`` out of the workdir upload.
  SkyPilot reads ``.skyignore`` *instead of* ``.gitignore`` when it exists
  (``sky/data/storage_utils.py: get_excluded_files``, and the rsync filter in
  ``sky/utils/command_runner.py``), so a new one starts with the ``.gitignore``'s
  patterns; an existing one only gets the missing lines appended.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import zipfile
from dataclasses import dataclass
from pathlib import Path

import lightning_srifty
from lightning_srifty.core.errors import LaunchError

DIST_NAME = "lightning-srifty"
WHEEL_REMOTE_DIR = "~/.srifty/wheels"
"""Where ``file_mounts`` puts the wheel on every node."""
PACKAGE_DATA = ("*.py", "py.typed", "data/*.csv", "data/*.json", "data/*.md")
"""The package's files, as ``pyproject.toml`` ships them."""
SKYIGNORE = ".skyignore"
ALWAYS_IGNORED = ("srifty_runs/", ".venv/", ".git/")
SKYIGNORE_HEADER = (
    "# Written by srifty-launch. SkyPilot uploads this folder to every node and reads\n"
    "# .skyignore instead of .gitignore, so the .gitignore patterns are repeated here.\n"
)
_FIXED_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class BuiltWheel:
    """A wheel of the installed package and where it goes on the nodes."""

    path: Path
    version: str

    @property
    def remote_path(self) -> str:
        return f"{WHEEL_REMOTE_DIR}/{self.path.name}"


def package_files(root: Path | None = None) -> list[Path]:
    """The package's files (sources, ``py.typed``, bundled data), sorted."""
    base = root or Path(lightning_srifty.__file__).resolve().parent
    found: set[Path] = set()
    for pattern in PACKAGE_DATA:
        if pattern.endswith(".py"):
            found.update(p for p in base.rglob(pattern) if "__pycache__" not in p.parts)
        else:
            found.update(base.glob(pattern))
    return sorted(p for p in found if p.is_file())


def build_wheel(out_dir: str | Path) -> BuiltWheel:
    """Writes a wheel of the installed ``lightning_srifty`` into ``out_dir``.

    The bytes depend only on the package's files and metadata (fixed zip times, sorted
    entries), so the same tree always gives the same wheel and version.

    Raises:
        LaunchError: the package is not installed (no distribution metadata).
    """
    try:
        dist = importlib.metadata.distribution(DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        raise LaunchError(
            f"{DIST_NAME} is not installed here (no package metadata), so it cannot be "
            "shipped to the nodes; install it with `pip install -e .` or from a wheel"
        ) from None
    metadata = _metadata(dist)
    entry_points = dist.read_text("entry_points.txt") or ""
    root = Path(lightning_srifty.__file__).resolve().parent
    files = [(f"lightning_srifty/{p.relative_to(root).as_posix()}", p.read_bytes())
             for p in package_files(root)]  # fmt: skip
    digest = hashlib.sha256()
    for name, data in files:
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    digest.update(metadata.encode() + entry_points.encode())
    base_version = str(dist.version).split("+", 1)[0]
    version = f"{base_version}+b{digest.hexdigest()[:12]}"
    info = f"lightning_srifty-{version}.dist-info"
    entries = list(files)
    entries.append((f"{info}/METADATA", metadata.replace("@VERSION@", version).encode()))
    entries.append(
        (
            f"{info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: lightning-srifty\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n",
        )
    )
    if entry_points:
        entries.append((f"{info}/entry_points.txt", entry_points.encode()))
    path = write_wheel(out_dir, f"lightning_srifty-{version}-py3-none-any.whl", info, entries)
    return BuiltWheel(path, version)


def write_wheel(
    out_dir: str | Path, filename: str, info: str, entries: list[tuple[str, bytes]]
) -> Path:
    """Writes ``entries`` (name, bytes) plus their ``RECORD`` as a reproducible wheel
    (fixed zip times), replacing ``out_dir/filename`` atomically."""
    record = "".join(f"{name},sha256={_b64(data)},{len(data)}\n" for name, data in entries)
    record += f"{info}/RECORD,,\n"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / filename
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for name, data in [*entries, (f"{info}/RECORD", record.encode())]:
            item = zipfile.ZipInfo(name, date_time=_FIXED_ZIP_TIME)
            item.compress_type = zipfile.ZIP_DEFLATED
            item.external_attr = 0o644 << 16
            wheel.writestr(item, data)
    tmp.replace(path)
    return path


def _metadata(dist: importlib.metadata.Distribution) -> str:
    """Core metadata for the wheel (version left as ``@VERSION@``).

    Written from the distribution's fields rather than copied: an editable install may
    be found through its ``.egg-info`` (``PKG-INFO`` without ``Requires-Dist``; the
    requirements are in ``requires.txt``), and the node must get the dependencies.
    """
    meta = dist.metadata
    lines = ["Metadata-Version: 2.1", f"Name: {DIST_NAME}", "Version: @VERSION@"]
    for key in ("Summary", "Requires-Python", "License"):
        value = meta[key] if key in meta else None
        if value:
            lines.append(f"{key}: {value}")
    lines.extend(f"Provides-Extra: {extra}" for extra in meta.get_all("Provides-Extra") or [])
    lines.extend(f"Requires-Dist: {req}" for req in dist.requires or [])
    return "\n".join(lines) + "\n"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def setup_script(wheel: BuiltWheel, *, requirements: bool, extra: str | None = None) -> str:
    """The task's ``setup``: this wheel, then the user's requirements and commands.

    SkyPilot runs setup in the synced workdir, where ``requirements.txt`` sits beside
    the script. ``extra`` is the user's own shell (``--setup``), run last as given.
    """
    remote = wheel.remote_path.replace("~/", "$HOME/", 1)
    lines = ["set -euo pipefail", f'pip install "{remote}"']
    if requirements:
        lines.append("pip install -r requirements.txt")
    if extra and extra.strip():
        lines.append(extra.strip())
    return "\n".join(lines)


def ensure_skyignore(
    workdir: str | Path, extra: tuple[str, ...] = (), *, write: bool = True
) -> tuple[Path, list[str]]:
    """Makes ``workdir/.skyignore`` exclude :data:`ALWAYS_IGNORED` and ``extra``.

    Args:
        workdir: The folder SkyPilot uploads.
        extra: More patterns (the run folder when it is elsewhere inside ``workdir``).
        write: False only reports what would be added (dry runs touch nothing).

    Returns:
        The file and the lines this call added (or would add; empty: nothing to change).
    """
    folder = Path(workdir)
    path = folder / SKYIGNORE
    wanted = [*ALWAYS_IGNORED, *extra]
    if path.exists():
        text = path.read_text(encoding="utf-8")
        have = {line.strip() for line in text.splitlines()}
        missing = [w for w in wanted if w not in have and w.rstrip("/") not in have]
        if missing and write:
            tail = "" if text.endswith("\n") or not text else "\n"
            addition = "# added by srifty-launch: not for the nodes\n" + "\n".join(missing)
            path.write_text(text + tail + addition + "\n", encoding="utf-8")
        return path, missing
    if not write:
        return path, wanted
    gitignore = folder / ".gitignore"
    inherited = gitignore.read_text(encoding="utf-8") if gitignore.is_file() else ""
    body = SKYIGNORE_HEADER
    if inherited.strip():
        body += "# from .gitignore\n" + inherited.rstrip("\n") + "\n"
    body += "# not for the nodes\n" + "\n".join(wanted) + "\n"
    path.write_text(body, encoding="utf-8")
    return path, wanted


def requirements_file(workdir: str | Path) -> Path | None:
    """``requirements.txt`` beside the script, if the user has one."""
    candidate = Path(workdir) / "requirements.txt"
    return candidate if candidate.is_file() else None
