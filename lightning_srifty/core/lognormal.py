"""A predicted step time as the log-normal its 10-90 % interval describes.

The performance model gives each cluster a median step and a 10-90 % interval whose
ends are multiplicative (a factor either way: the errors it carries, a compute ratio to
another GPU or a host it never ran on, multiply). A log-normal with that median and
``sigma = ln(high/low) / (2·1.2816)`` has those ends as its 10th and 90th percentiles
when the interval is symmetric in log, and their geometric middle otherwise.

Why the planner needs it: a job's cost and wall time are proportional to its step, so
what a user pays on average is the cost at the *mean* step, ``median·exp(sigma²/2)``,
not at the median; a wide interval costs more on average than a narrow one with the
same median. And the chance of meeting a deadline counts the step's own uncertainty as
well as the preemptions.
"""

from __future__ import annotations

import numpy as np

Z90 = 1.2816
"""Standard-normal 90th percentile: a 10-90 % interval is +-1.2816 sigma."""


def step_sigma(
    step_s: np.ndarray | float, low_s: np.ndarray | float, high_s: np.ndarray | float
) -> np.ndarray:
    """Log-normal sigma of steps with these medians and 10-90 % ends (vectorised).

    ``(ln(high/step) + ln(step/low)) / (2·Z90)``: zero where the interval has no width
    or is not a positive, finite range (a step the model could not predict).
    """
    step = np.asarray(step_s, dtype=np.float64)
    low = np.asarray(low_s, dtype=np.float64)
    high = np.asarray(high_s, dtype=np.float64)
    valid = (low > 0) & (high > low) & np.isfinite(high) & (step > 0) & np.isfinite(step)
    with np.errstate(divide="ignore", invalid="ignore"):
        sigma = np.log(np.where(valid, high, 1.0) / np.where(valid, low, 1.0)) / (2.0 * Z90)
    return np.where(valid, sigma, 0.0)


def mean_factor(sigma: np.ndarray | float) -> np.ndarray:
    """Mean over median of a log-normal: ``exp(sigma²/2)`` (1 where sigma is 0)."""
    s = np.asarray(sigma, dtype=np.float64)
    return np.exp(0.5 * s * s)
