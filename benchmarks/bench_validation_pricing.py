"""Validation passes: does the plan's price for them match what the run spends?

A Lightning script with a validation loader (``tests/launch/scripts/validated.py``,
validated at every epoch's end) is launched through the real command line on the local
backend, ``--runs`` times per job, with a run of the same job without validation beside
each (``--val-samples 0``). From the training attempt's own progress lines:

* the measured step (the attempt's mean, which leaves the passes out);
* the wall time beyond the steps: ``done.time - resumed.time - step * steps``, which
  holds the passes, and checkpoints and start-up work the run without validation has
  too; their difference per step is the measured validation;
* the validation per step the summary predicted (``validation (predicted)``).

Jobs: a large pass (as many validation samples as training samples), a small one (an
eighth), and the small one through 2 loader workers (a pass starts its workers anew).

Timing on a shared machine is noisy, so this is a benchmark, not a test. Run:
``.venv/bin/python benchmarks/bench_validation_pricing.py [--runs 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = Path(sys.executable).with_name("srifty-launch")
SCRIPT = ROOT / "tests" / "launch" / "scripts" / "validated.py"
PREDICTED = re.compile(r"validation \(predicted\): ([\d.]+) (ms|s) a step")
STEPS = 1500
TRAIN = 2000  # 500 training batches of 4 an epoch
JOBS = {
    "large pass (2000 samples)": ["--val-samples", "2000"],
    "small pass (250 samples)": ["--val-samples", "250"],
    "small pass, 2 workers": ["--val-samples", "250", "--num-workers", "2"],
}


def _events(run: Path) -> list[dict[str, object]]:
    lines = (run / "progress-1.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _one(job: list[str], env: dict[str, str]) -> tuple[float | None, float, float, int]:
    """(predicted validation ms/step, measured step ms, wall beyond the steps s, steps)."""
    with tempfile.TemporaryDirectory(prefix="srifty-bench-") as tmp:
        argv = [str(LAUNCH), str(SCRIPT), "--train-samples", str(TRAIN), "--width", "256",
                *job, "--target-steps", str(STEPS), "--cluster", "g4dn.xlarge:1",
                "--no-refine", "--probe", "off", "--yes", "--catalog", "bundled",
                "--run-dir", f"{tmp}/run"]  # fmt: skip
        done = subprocess.run(argv, env=env, cwd=tmp, capture_output=True, text=True)  # noqa: S603
        if done.returncode != 0:
            raise SystemExit(f"launch failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        found = PREDICTED.search(done.stdout)
        events = _events(Path(tmp) / "run")
    start = next(e for e in events if e["event"] == "resumed")
    end = next(e for e in events if e["event"] == "done")
    steps = int(end["step"]) - int(start["step"])  # type: ignore[call-overload]
    step_s = float(end["step_s"])  # type: ignore[arg-type]
    beyond = float(end["time"]) - float(start["time"]) - step_s * steps  # type: ignore[arg-type]
    predicted = None
    if found:
        predicted = float(found.group(1)) * (1.0 if found.group(2) == "ms" else 1e3)
    return predicted, step_s * 1e3, beyond, steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    env = {**os.environ, "SRIFTY_IMDS": "off", "OMP_NUM_THREADS": "1",
           "SKYPILOT_DISABLE_LOCAL_API_SERVER": "1"}  # fmt: skip
    print(f"{STEPS} steps of 4 samples, {TRAIN // 4} training batches an epoch, one pass per epoch")
    print(f"{'job':<28}{'predicted':>11}{'measured':>10}{'ratio':>7}{'step':>8}{'load':>6}")
    ratios = []
    for name, job in JOBS.items():
        for _ in range(args.runs):
            load = os.getloadavg()[0]
            predicted, step_ms, beyond, steps = _one(job, env)
            _, _, plain_beyond, plain_steps = _one(["--val-samples", "0"], env)
            measured = (beyond / steps - plain_beyond / plain_steps) * 1e3
            ratio = predicted / measured if predicted and measured > 0 else float("nan")
            ratios.append(ratio)
            shown = f"{predicted:.2f}" if predicted is not None else "-"
            print(f"{name:<28}{shown:>8} ms{measured:>7.2f} ms{ratio:>7.2f}{step_ms:>6.1f} ms"
                  f"{load:>6.1f}")  # fmt: skip
    finite = [r for r in ratios if r == r]
    if finite:
        print(f"predicted / measured validation per step: median {statistics.median(finite):.2f}, "
              f"range {min(finite):.2f}-{max(finite):.2f} over {len(finite)} runs")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
