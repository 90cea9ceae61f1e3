"""Reading and writing profile documents."""

from __future__ import annotations

import os
from pathlib import Path

from lightning_srifty.core.errors import ProfileError
from lightning_srifty.core.profile import Profile
from lightning_srifty.io.jsonfile import read_json, write_json_atomic


def save_profile(profile: Profile, path: str | os.PathLike[str]) -> Path:
    """Writes ``profile`` atomically as versioned JSON."""
    return write_json_atomic(path, profile.to_dict())


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Loads and validates a profile; errors name the file and the field."""
    return Profile.from_dict(read_json(path, ProfileError), source=str(path))
