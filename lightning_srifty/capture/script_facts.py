"""What a script fixes in its own ``Trainer(...)``, seen from inside the profiling run.

``srifty-launch`` shapes an unchanged ``Trainer`` into the plan's DDP job through
``PL_TRAINER_*`` environment defaults, which Lightning applies only to the arguments a
script leaves out. Arguments the script passes itself are therefore constraints the
plan must meet (``devices=2`` means two processes on every node), not obstacles. They
cannot be read back from a built ``Trainer`` (Lightning resolves ``"auto"`` and merges
the environment in), so the profiling run (:mod:`lightning_srifty.capture.entry`) wraps
``Trainer.__init__`` and records the arguments as the script passed them.

``LightningCLI`` passes every ``Trainer`` argument explicitly (its parser fills in the
defaults), which overrides the launcher's environment. For such scripts an argument
counts as the script's own only when its value differs from ``Trainer``'s default; the
launcher then gives the plan's shape through the arguments LightningCLI reads
(``--trainer.devices`` ...), and during profiling the defaults are replaced by the
launcher's environment values so nothing lands in ``./lightning_logs``.

The same wrapper stops a script whose ``Trainer.fit`` runs without a
:class:`~lightning_srifty.SriftyCallback`, at once, instead of after training.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import os
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from lightning_srifty.core import launch_protocol as proto

SHAPE_ARGUMENTS = ("accelerator", "strategy", "devices", "num_nodes", "precision")
"""The ``Trainer`` arguments that decide where and how the job runs."""
_CLI_ENV_DEFAULTS = ("devices", "num_nodes", "strategy", "default_root_dir")
"""Arguments LightningCLI passes at their default that the launcher's environment sets."""

_FACTS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def facts_for(trainer: Any) -> dict[str, Any] | None:
    """What the profiling run recorded about ``trainer``'s construction (``None``: it was
    not built under :func:`install`, e.g. a plain ``python train.py``)."""
    return _FACTS.get(trainer)


def explicit_arguments(
    passed: Mapping[str, Any], defaults: Mapping[str, Any], *, from_cli: bool
) -> dict[str, Any]:
    """The shape arguments the script fixes, as plain JSON values.

    A plain script fixes what it passes; LightningCLI passes everything, so there only
    values other than ``Trainer``'s defaults count.
    """
    out: dict[str, Any] = {}
    for name in SHAPE_ARGUMENTS:
        if name not in passed:
            continue
        value = passed[name]
        if from_cli and _same(value, defaults.get(name)):
            continue
        out[name] = _plain(value)
    return out


def install(env: Mapping[str, str] | None = None) -> Callable[[], None]:
    """Wraps ``Trainer.__init__`` and ``Trainer.fit`` in this process; returns the undo.

    The profiling run installs it for good; tests undo it (see :func:`installed`).
    """
    from lightning.pytorch import Trainer

    environ = os.environ if env is None else env
    defaults = {
        name: p.default
        for name, p in inspect.signature(Trainer.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    original_init = Trainer.__init__
    original_fit = Trainer.fit

    @functools.wraps(original_init)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        from_cli = _lightning_cli_in_stack()
        explicit = explicit_arguments(kwargs, defaults, from_cli=from_cli)
        if from_cli:
            kwargs = _cli_defaults_from_env(kwargs, defaults, environ)
        try:
            original_init(self, *args, **kwargs)
        except Exception:
            _stop_if_no_gpu_for(explicit.get("accelerator"), environ)
            raise
        _FACTS[self] = {
            "entry_point": "lightning_cli" if from_cli else "script",
            "explicit": explicit,
        }

    @functools.wraps(original_fit)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        from lightning_srifty.capture.callback import SriftyCallback

        if not any(isinstance(c, SriftyCallback) for c in self.callbacks):
            _stop_without_callback(environ)
        return original_fit(self, *args, **kwargs)

    Trainer.__init__ = init  # type: ignore[method-assign]
    Trainer.fit = fit  # type: ignore[method-assign]

    def undo() -> None:
        Trainer.__init__ = original_init  # type: ignore[method-assign]
        Trainer.fit = original_fit  # type: ignore[method-assign]

    return undo


@contextlib.contextmanager
def installed(env: Mapping[str, str] | None = None) -> Iterator[None]:
    """:func:`install` for the duration of a ``with`` block."""
    undo = install(env)
    try:
        yield
    finally:
        undo()


def _stop_without_callback(environ: Mapping[str, str]) -> None:
    """Ends the profiling run before training starts, leaving the reason for the launcher."""
    state_dir = environ.get(proto.ENV_STATE_DIR)
    if state_dir:
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        (Path(state_dir) / proto.NO_CALLBACK_MARKER).write_text(proto.NO_CALLBACK_MESSAGE + "\n")
    print(f"srifty: {proto.NO_CALLBACK_MESSAGE}", file=sys.stderr, flush=True)
    raise SystemExit(proto.NO_CALLBACK_EXIT_CODE)


GPU_ACCELERATORS = ("gpu", "cuda")
"""``Trainer(accelerator=...)`` values that need an NVIDIA GPU."""


def no_gpu_message(accelerator: str, environ: Mapping[str, str]) -> str:
    """Why a script fixing ``Trainer(accelerator=accelerator)`` cannot be profiled here,
    and what to do: the launcher hid the GPUs (the local backend trains on the CPU), or
    this machine has none."""
    fixed = f"the script fixes Trainer(accelerator={accelerator!r})"
    leave = (
        "leave accelerator= out (on GPU VMs the launcher sets it to 'gpu' through "
        f"{proto.TRAINER_ENV_PREFIX}ACCELERATOR)"
    )
    if environ.get("CUDA_VISIBLE_DEVICES") == "":
        return (
            f"{fixed}, and the local backend runs every process on this machine's CPU (a "
            f"node of N processes would need N GPUs): {leave}, or launch from a GPU "
            "machine with --backend sky"
        )
    return (
        f"{fixed}, and this machine has no GPU to profile on: {leave}, or profile on a GPU "
        "machine and pass its profile with --profile P.json"
    )


def _stop_if_no_gpu_for(accelerator: Any, environ: Mapping[str, str]) -> None:
    """Ends the profiling run in one line where the script's ``Trainer`` failed because
    it asks for a GPU that this process cannot see (Lightning's own error says only "No
    supported gpu backend found!"); any other failure is left to propagate."""
    if not isinstance(accelerator, str) or accelerator.lower() not in GPU_ACCELERATORS:
        return
    import torch

    if torch.cuda.is_available():
        return
    message = no_gpu_message(accelerator, environ)
    state_dir = environ.get(proto.ENV_STATE_DIR)
    if state_dir:
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        (Path(state_dir) / proto.NO_GPU_FOR_PROFILE_MARKER).write_text(message + "\n")
    print(f"srifty: {message}", file=sys.stderr, flush=True)
    raise SystemExit(proto.NO_GPU_EXIT_CODE)


def _cli_defaults_from_env(
    kwargs: dict[str, Any], defaults: Mapping[str, Any], environ: Mapping[str, str]
) -> dict[str, Any]:
    """LightningCLI's defaults replaced by the launcher's ``PL_TRAINER_*`` values, as
    Lightning would have applied them to a script that left the arguments out."""
    out = dict(kwargs)
    for name in _CLI_ENV_DEFAULTS:
        raw = environ.get(f"{proto.TRAINER_ENV_PREFIX}{name.upper()}", "")
        if raw and _same(out.get(name, defaults.get(name)), defaults.get(name)):
            try:
                out[name] = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                out[name] = raw
    return out


def _lightning_cli_in_stack() -> bool:
    """The ``Trainer`` is being built by a ``LightningCLI`` (found on the call stack)."""
    try:
        from lightning.pytorch.cli import LightningCLI
    except ImportError:  # jsonargparse missing: no LightningCLI can be running
        return False
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, LightningCLI):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except (TypeError, ValueError):
        return False


def _plain(value: Any) -> Any:
    """A JSON value for a Trainer argument (objects by their class name)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return type(value).__name__
