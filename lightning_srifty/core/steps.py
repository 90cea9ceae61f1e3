"""Steps on clusters of different sizes, counted in what they are worth.

A step is one batch of the training loop on every process, so a step on 8 processes
consumes four times the samples of a step on 2. A run that migrates between clusters
of different sizes therefore cannot count its target in steps of any one of them. The
:class:`StepLedger` counts progress in *base steps*, steps at the profiled world size
(what ``--target-steps`` means), and remembers, for each attempt, the step it resumed
from and what one of its steps is worth; from that it tells each new attempt the step
at which the target is reached on its own processes.

Pure bookkeeping: the launcher stores the ledger as JSON in the run folder so that
``--resume`` continues the count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lightning_srifty.core.errors import SchemaError
from lightning_srifty.core.validate import Reader, check_version

LEDGER_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Segment:
    """From ``start_step`` on, each step of the job was worth ``base_per_step``."""

    start_step: int
    base_at_start: float
    """Base steps done when the segment started."""
    base_per_step: float


@dataclass
class StepLedger:
    """Progress of a run in base steps, across attempts on different world sizes.

    Args:
        target_base: base steps the run trains (``--target-steps``, or ``--epochs``
            converted at the profiled world size).
    """

    target_base: float
    segments: list[Segment] = field(default_factory=list)
    schema_version: int = LEDGER_SCHEMA_VERSION

    def base_at(self, step: int) -> float:
        """Base steps done when the job's counter reads ``step``.

        The newest segment that started at or before ``step`` ran it: a resume goes back
        to a checkpoint, and the steps after it are run again on the new processes.
        """
        for seg in reversed(self.segments):
            if seg.start_step <= step:
                return seg.base_at_start + (step - seg.start_step) * seg.base_per_step
        return float(step)  # before any attempt: steps at the profiled scale

    def start(self, step: int, base_per_step: float) -> int:
        """Records an attempt resuming at ``step``; returns the step it must stop at."""
        if not base_per_step > 0:
            raise ValueError(f"base_per_step must be positive, got {base_per_step}")
        self.segments.append(Segment(step, self.base_at(step), base_per_step))
        return self.target_step(step, base_per_step)

    def target_step(self, step: int, base_per_step: float) -> int:
        """The job's step counter at which the target is reached, resuming at ``step``."""
        left = self.target_base - self.base_at(step)
        return step + max(math.ceil(left / base_per_step - 1e-9), 0)

    def remaining_base(self, step: int) -> float:
        """Base steps still to train when the job's counter reads ``step``."""
        return max(self.target_base - self.base_at(step), 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "kind": "srifty-step-ledger",
            "target_base": self.target_base,
            "segments": [
                {
                    "start_step": s.start_step,
                    "base_at_start": s.base_at_start,
                    "base_per_step": s.base_per_step,
                }
                for s in self.segments
            ],
        }

    @staticmethod
    def from_dict(data: Any, *, source: str | None = None) -> StepLedger:
        r = Reader(data, source=source, error=SchemaError)
        version = check_version(r, LEDGER_SCHEMA_VERSION, kind="step ledger")
        segments = [
            Segment(
                start_step=s.int("start_step", minimum=0),
                base_at_start=s.float("base_at_start", minimum=0.0),
                base_per_step=s.float("base_per_step", positive=True),
            )
            for s in r.children("segments", [])
        ]
        return StepLedger(
            target_base=r.float("target_base", positive=True),
            segments=segments,
            schema_version=version,
        )
