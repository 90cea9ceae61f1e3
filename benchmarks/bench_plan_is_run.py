"""The plan is the run: does a 2-process run's measured step fall inside the interval
the launcher printed for it, with and without a probe?

A user script (``tests/launch/scripts/user_ddp.py --conv``: a small convolutional
model, batch 32 on every process) is launched ``--runs`` times through the real
command line on a 4-GPU plan, which the local backend runs as 2 processes on this
machine. Each run prints the step time it predicted for those processes (with its
10-90 % interval) and the step it measured, both as the mean over the run (start-up,
DDP set-up and the first steps included) and as the steady step (the median step
report after warm-up: what the prediction is for); the benchmark reports how many
measurements fell inside their interval, and the load average when each run began:

* ``--probe off``: the prediction comes from the one-process profile alone (the model
  carries a GPU's co-location and all-reduce costs; two processes sharing this
  machine's cores cost what no profile of one process shows);
* ``--probe on``: a probe of the same shape is measured first (Srifty's way: measure
  where you will run) and the plan is made on it.

Timing on a shared machine is noisy (other work on the same cores), so this lives in a
benchmark, not in a test. Run: ``.venv/bin/python benchmarks/bench_plan_is_run.py
[--runs 3]``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = Path(sys.executable).with_name("srifty-launch")
SCRIPT = ROOT / "tests" / "launch" / "scripts" / "user_ddp.py"
PREDICTED = re.compile(r"step time \(predicted\): ([\d.]+) ms \[([\d.]+), ([\d.]+)\]")
MEASURED = re.compile(r"step time \(measured\): ([\d.]+) ms mean")
STEADY = re.compile(r"([\d.]+) ms steady")


def _one(probe: str, work: Path, env: dict[str, str]) -> tuple[float, float, float, float, float]:
    """(predicted, low, high, measured mean, measured steady) in ms of one launch."""
    argv = [str(LAUNCH), str(SCRIPT), "--conv", "--batch-size", "32", "--target-steps", "400",
            "--cluster", "g4dn.12xlarge:1", "--no-refine", "--probe", probe, "--yes",
            "--catalog", "bundled"]  # fmt: skip
    done = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, check=True)  # noqa: S603
    predicted = PREDICTED.search(done.stdout)
    measured = MEASURED.search(done.stdout)
    steady = STEADY.search(done.stdout)
    if predicted is None or measured is None or steady is None:
        raise SystemExit(f"no step times in the summary:\n{done.stdout[-2000:]}")
    found = [float(predicted.group(i)) for i in (1, 2, 3)]
    return found[0], found[1], found[2], float(measured.group(1)), float(steady.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    env = {**os.environ, "SRIFTY_IMDS": "off", "OMP_NUM_THREADS": "1",
           "SKYPILOT_DISABLE_LOCAL_API_SERVER": "1"}  # fmt: skip
    print("mode        predicted [10-90 %]        mean   inside   steady   inside   load")
    verdicts: dict[str, list[int]] = {}
    for probe in ("off", "on"):
        inside = [0, 0]
        for _ in range(args.runs):
            load = os.getloadavg()[0]
            with tempfile.TemporaryDirectory(prefix="srifty-bench-") as tmp:
                step, low, high, mean, steady = _one(probe, Path(tmp), env)
            hits = [low <= mean <= high, low <= steady <= high]
            inside = [a + b for a, b in zip(inside, hits, strict=True)]
            print(f"probe {probe:<4} {step:7.1f} ms [{low:6.1f}, {high:6.1f}] {mean:7.1f} ms  "
                  f"{'yes' if hits[0] else 'no':<4} {steady:7.1f} ms  "
                  f"{'yes' if hits[1] else 'no':<4}  {load:4.1f}")  # fmt: skip
        verdicts[probe] = inside
    for probe, (mean_in, steady_in) in verdicts.items():
        print(f"--probe {probe}: {steady_in} of {args.runs} steady steps (median after warm-up) "
              f"inside their interval; {mean_in} of {args.runs} means over the run (start-up "
              "included)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
