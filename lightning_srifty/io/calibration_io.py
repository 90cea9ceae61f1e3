"""Reading and writing calibration files (versioned JSON), and the shipped default.

How a calibration is fitted lives in :mod:`lightning_srifty.fit.calibration`; this
module only moves :class:`~lightning_srifty.core.calibration.Calibration` records to
and from disk. No pickle is ever written or read.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from lightning_srifty.core.calibration import Calibration
from lightning_srifty.core.errors import CalibrationError
from lightning_srifty.io.jsonfile import read_json, write_json_atomic

DEFAULT_CALIBRATION = "default_calibration.json"
"""The calibration shipped in ``lightning_srifty/data/``: fitted on every shared trace
set (see its ``sources``), used whenever no ``--calibration`` is given."""


def save_calibration(calibration: Calibration, path: str | os.PathLike[str]) -> Path:
    """Writes the calibration atomically as versioned JSON."""
    return write_json_atomic(path, calibration.to_dict())


def load_calibration(path: str | os.PathLike[str]) -> Calibration:
    """Loads and validates a calibration; errors name the file and the field."""
    return Calibration.from_dict(read_json(path, CalibrationError), source=str(path))


def load_default_calibration() -> Calibration:
    """The calibration shipped with the package."""
    ref = resources.files("lightning_srifty") / "data" / DEFAULT_CALIBRATION
    with resources.as_file(ref) as path:
        if not Path(path).is_file():
            raise CalibrationError(
                "the package's default calibration is missing; reinstall lightning-srifty "
                "or pass --calibration",
                source=f"lightning_srifty/data/{DEFAULT_CALIBRATION}",
            )
        data = read_json(path, CalibrationError)
    return Calibration.from_dict(data, source=f"lightning_srifty/data/{DEFAULT_CALIBRATION}")


def calibration_or_default(path: str | os.PathLike[str] | None) -> Calibration:
    """The calibration at ``path``, or the shipped default when ``path`` is ``None``."""
    return load_calibration(path) if path is not None else load_default_calibration()
