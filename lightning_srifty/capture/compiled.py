"""Where a training step runs ``torch.compile``'d code, and when it compiles.

Per-layer hooks and a compiled model do not mix. Dynamo traces a module's hooks into
its graph: the clock a hook reads breaks the graph, and each hook's closure is a guard,
so the model recompiles for every layer until Dynamo's recompile limit sends it back to
eager (seen with ``Trainer.fit(torch.compile(model))``, torch 2.13: "hit
config.recompile_limit (8)", function ``hook``). The profile then timed eager code and
seconds of compilation, and the plan priced a 1.1 ms step at 29.7 ms. So a compiled
model is timed whole, step by step, and a step that compiled (a new shape, a mode
switch) is left out of the window: compiling is a one-off cost, not the step's.

The FLOP count has its own hazard: a compiled frame called once under
``FlopCounterMode`` (a dispatch mode) is never run compiled again in that process
(measured, torch 2.13: the backend's graph was not called on any later call, and a new
shape did not recompile), so a script training on with the callback lost its
compilation for good. The counted step runs under ``torch.compiler.set_stance
("force_eager")`` instead (:func:`run_eagerly`), and compiled code resumes after it.

Nothing here imports ``torch._dynamo``: a process that never compiled has not loaded
it, and then nothing is compiled.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch


def describe_compiled(root: torch.nn.Module) -> str:
    """What in ``root`` is compiled, as a clause; empty when nothing is known to be.

    Three ways a Lightning script compiles its model: ``Trainer.fit(torch.compile(m))``
    (Lightning unwraps it and keeps ``_compiler_ctx``; ``lightning/pytorch/utilities/
    compile.py: from_compiled``), a submodule replaced by ``torch.compile(sub)`` (an
    ``OptimizedModule`` in the tree) and ``sub.compile()`` in place (``nn.Module.compile``
    sets ``_compiled_call_impl``). Code compiled some other way (a compiled function
    called from ``training_step``) shows only when it compiles: :func:`compiled_frames`.
    """
    if getattr(root, "_compiler_ctx", None):
        return f"{type(root).__name__} is compiled (torch.compile passed to Trainer.fit)"
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(eval_frame, "OptimizedModule", None)
    for name, module in root.named_modules():
        label = name or type(root).__name__
        if optimized is not None and isinstance(module, optimized):
            return f"module {label!r} is compiled (torch.compile)"
        if getattr(module, "_compiled_call_impl", None) is not None:
            return f"module {label!r} is compiled (.compile())"
    return ""


def compiled_frames() -> int:
    """Python frames ``torch.compile`` has converted in this process so far.

    It grows at a first compile and at every recompile (a new input shape, a guard
    that failed), so a step during which it grew spent part of its time compiling.
    Read from Dynamo's counters (``torch._dynamo.utils.counters["frames"]["total"]``,
    a private table): 0 when Dynamo was never loaded or the table has moved.
    """
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    try:
        return int(counters["frames"]["total"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        return 0


def run_eagerly() -> Callable[[], None]:
    """Runs ``torch.compile``'d code eagerly until the returned function is called.

    For the FLOP count's step (see the module's docstring). A no-op where Dynamo was
    never loaded (nothing is compiled) or ``torch.compiler.set_stance`` is missing
    (torch before 2.6).
    """
    set_stance = getattr(torch.compiler, "set_stance", None)
    if "torch._dynamo" not in sys.modules or set_stance is None:
        return lambda: None
    stance = set_stance("force_eager")  # takes effect now; __exit__ restores the last
    return lambda: stance.__exit__(None, None, None)
