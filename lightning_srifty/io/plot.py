"""The time-cost Pareto picture of a plan (matplotlib, an optional dependency).

matplotlib is imported only when a picture is asked for, so ``srifty plan`` works in an
installation without it and says how to add it when ``--plot`` is given.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.planner import PlanResult


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError as err:
        raise ConfigError(
            "--plot needs matplotlib, which is not installed: pip install 'lightning-srifty[plot]'"
        ) from err
    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    return plt


def plot_pareto(result: PlanResult, path: str | os.PathLike[str]) -> Path:
    """Writes a PNG of the feasible Pareto front with the chosen plan and baselines.

    Log axes because fronts span orders of magnitude in both hours and dollars.

    Raises:
        ConfigError: matplotlib is missing, or the file cannot be written.
    """
    plt = _pyplot()
    out = Path(path)
    fig, ax = plt.subplots(figsize=(7.0, 4.5), dpi=110)
    try:
        if result.front:
            hours = [t for t, _ in result.front]
            dollars = [c for _, c in result.front]
            ax.step(hours, dollars, where="post", color="0.6", lw=1)
            ax.scatter(hours, dollars, s=12, color="0.4", label="Pareto front")
        best = result.best
        ax.scatter(
            [best.time_to_target_h], [best.cost_usd], s=90, marker="*", color="tab:red",
            zorder=3, label=f"chosen: {best.cluster.describe()}",
        )  # fmt: skip
        markers = ("s", "^", "D", "v")
        for i, base in enumerate(result.baselines):
            ax.scatter(
                [base.time_to_target_h], [base.cost_usd], s=40, marker=markers[i % 4],
                zorder=3, label=f"{base.label}: {base.cluster.describe()}",
            )  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("time to target (h)")
        ax.set_ylabel("expected cost ($)")
        ax.set_title("srifty plan: time vs cost")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        try:
            fig.savefig(out, format="png")
        except OSError as err:
            raise ConfigError(f"--plot {str(out)!r}: cannot write the file ({err})") from err
    finally:
        plt.close(fig)
    return out
