"""Atomic JSON writes and reads that name the file in every error."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from lightning_srifty.core.errors import SchemaError


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """Writes ``data`` next to ``path`` then renames, so readers never see half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_json(path: str | os.PathLike[str], error: type[SchemaError] = SchemaError) -> Any:
    """Parses a JSON file; a missing, unreadable or truncated file raises ``error``."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error("file not found", source=source) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read file ({exc})", source=source) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "the file may be truncated",
            source=source,
        ) from None
