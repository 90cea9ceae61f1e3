"""Reading and writing probe records (``probe-<n>.json`` in a run folder)."""

from __future__ import annotations

import os
from pathlib import Path

from lightning_srifty.core.probing import ProbeRecord
from lightning_srifty.io.jsonfile import read_json, write_json_atomic


def save_probe_record(record: ProbeRecord, path: str | os.PathLike[str]) -> Path:
    """Writes ``record`` atomically (versioned JSON)."""
    return write_json_atomic(path, record.to_dict())


def load_probe_record(path: str | os.PathLike[str]) -> ProbeRecord:
    """Reads a probe record; a missing, truncated or invalid file raises
    :class:`~lightning_srifty.core.errors.SchemaError` naming the file and field."""
    return ProbeRecord.from_dict(read_json(path), source=str(path))
