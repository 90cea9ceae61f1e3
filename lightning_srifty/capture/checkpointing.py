"""Lightning checkpoints in a :mod:`~lightning_srifty.io.checkpoint_store`, resumed automatically.

The user's script never passes ``ckpt_path``: under the launcher the callback finds the
newest complete checkpoint in the store and makes ``Trainer.fit`` restore it. Lightning
2.x fixes ``ckpt_path`` before any hook runs, but it restores modules right *after* the
``setup`` hook (``Trainer._run``: ``_call_setup_hook`` then
``_checkpoint_connector._restore_modules_and_callbacks``), and every later restore step
(optimizers, schedulers, loops, precision) reads what that call loaded. So
:func:`install_auto_resume`, called from ``setup``, wraps that one call for one use. A
``ckpt_path`` the user passes explicitly still wins.

RNG states are not in Lightning's checkpoints; :func:`gather_rng_states` collects every
rank's (torch, CUDA, numpy, python) and the callback stores them as its own state, so a
resumed run draws the same random numbers as an uninterrupted one. Everything stored is
plain tensors, numbers and strings, so it loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import atexit
import logging
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import numpy as np
import torch

from lightning_srifty.core.errors import CheckpointError

if TYPE_CHECKING:
    from lightning_srifty.io.checkpoint_store import CheckpointStore

log = logging.getLogger(__name__)

RNG_STATE_VERSION = 1
CHECKPOINT_FILE = "checkpoint.ckpt"


# ------------------------------------------------------------------------- saving
def save_to_store(
    trainer: pl.Trainer, store: CheckpointStore, *, reason: str, step: int | None = None
) -> str:
    """Saves a full Lightning checkpoint and uploads it; every rank must call this.

    ``step`` is what the manifest records (the launcher's count of batches; Lightning's
    ``global_step`` when not given).

    ``Trainer.save_checkpoint`` is collective (all ranks build the state, rank zero
    writes), so is this. Rank zero uploads, then tells every rank the outcome, so no rank
    moves on (or exits, which makes torchrun kill the others) before the upload is done.

    Returns:
        The stored checkpoint's id (on every rank).

    Raises:
        CheckpointError: The upload failed; the previous checkpoint is still the newest.
    """
    folder = Path(tempfile.mkdtemp(prefix="srifty-ckpt-")) if trainer.is_global_zero else None
    path = (folder or Path(tempfile.gettempdir())) / CHECKPOINT_FILE
    from lightning_srifty.capture.launch_mode import time_limit

    started = time.monotonic()
    timed = time_limit(trainer)  # Trainer(max_time=...): the training time its Timer counted
    trainer.save_checkpoint(path, weights_only=False)
    outcome: tuple[str, str] = ("", "")
    if folder is not None:
        try:
            written = time.monotonic()
            extra: dict[str, Any] = {
                "epoch": int(trainer.current_epoch),
                "world_size": int(trainer.world_size),
                "save_s": round(written - started, 4),
                "upload_s": round(time.monotonic() - written, 4),
            }
            if timed is not None:
                extra["time_trained_s"] = round(timed[1], 3)  # what a resume's Timer counts on
            ref = store.save(
                path,
                step=int(trainer.global_step) if step is None else step,
                reason=reason,
                extra=extra,
            )
            outcome = (ref.id, "")
        except CheckpointError as exc:
            outcome = ("", str(exc))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    checkpoint_id, error = trainer.strategy.broadcast(outcome, src=0)
    if error:
        raise CheckpointError(error)
    return str(checkpoint_id)


# ---------------------------------------------------------------------- restoring
def restore_latest(store: CheckpointStore) -> tuple[Path, str] | None:
    """Downloads the newest verifiable checkpoint into a private temporary folder.

    Returns:
        ``(local path, checkpoint id)``, or None when the store holds no checkpoint.
        The folder is removed when the process exits.
    """
    folder = Path(tempfile.mkdtemp(prefix="srifty-restore-"))
    atexit.register(shutil.rmtree, folder, True)
    found = store.fetch_latest(folder)
    if found is None:
        return None
    path, ref = found
    return path, ref.id


def install_auto_resume(trainer: pl.Trainer, path: Path) -> None:
    """Makes this ``fit`` restore ``path`` unless the user passed ``ckpt_path``.

    Must be called from the ``setup`` hook (see the module docstring for why there).

    Raises:
        CheckpointError: This Lightning version restores checkpoints differently.
    """
    connector = getattr(trainer, "_checkpoint_connector", None)
    original = getattr(connector, "_restore_modules_and_callbacks", None)
    if connector is None or original is None:
        raise CheckpointError(
            f"cannot resume automatically with Lightning {pl.__version__}: "
            "Trainer._checkpoint_connector._restore_modules_and_callbacks is missing; "
            f"pass ckpt_path={str(path)!r} to Trainer.fit instead"
        )

    def restore_once(checkpoint_path: Any = None, weights_only: bool | None = None) -> None:
        del connector._restore_modules_and_callbacks  # back to the class method
        if checkpoint_path:
            log.info("ckpt_path=%s was given to fit; not resuming from the store", checkpoint_path)
            original(checkpoint_path, weights_only)
            return
        original(str(path), True)

    connector._restore_modules_and_callbacks = restore_once


# ---------------------------------------------------------------------------- RNG
def capture_rng_state() -> dict[str, Any]:
    """This process's random number generators, as tensors and plain values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "state_version": RNG_STATE_VERSION,
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Sets this process's generators from :func:`capture_rng_state` output."""
    if state.get("state_version") != RNG_STATE_VERSION:
        raise CheckpointError(
            f"RNG state_version {state.get('state_version')!r} in the checkpoint is not "
            f"supported (expected {RNG_STATE_VERSION})"
        )
    torch.set_rng_state(state["torch"])
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached"],
        )
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)


def gather_per_rank(mine: Any) -> list[Any]:
    """Every rank's ``mine``, in rank order (a collective under torch.distributed)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [mine]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return gathered


def for_this_rank(saved: list[Any]) -> Any:
    """The item of :func:`gather_per_rank` output this rank takes; with another world
    size, ``rank % saved`` (``None`` when nothing was saved)."""
    if not saved:
        return None
    dist = torch.distributed
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return saved[rank % len(saved)]


def gather_rng_states() -> list[dict[str, Any]]:
    """Every rank's RNG state, in rank order (a collective under torch.distributed)."""
    return gather_per_rank(capture_rng_state())


def rng_state_for_this_rank(states: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The saved state this rank should take; with another world size, ``rank % saved``."""
    mine = for_this_rank(states)
    return mine if isinstance(mine, dict) else None
