"""Start-up of ``srifty plan`` against ``srifty --help`` (goal: plan <= help + 1 s).

``srifty plan --catalog auto`` reads SkyPilot's local catalog when there is one. It
finds the file without importing ``sky`` (that import alone took 2.7 s), so what is
left over ``--help`` is reading the catalog and the search itself.

The profile is real: the digits example (``examples/train_digits.py``) is profiled
once on this machine. SkyPilot's catalog is present: a private ``SKY_RUNTIME_DIR``
seeded with the bundled snapshot, so ``auto`` takes the SkyPilot path. Each command
runs ``--runs`` times in a fresh process; the medians are printed.

Run: ``.venv/bin/python benchmarks/bench_cli_startup.py [--runs 5]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightning_srifty.launch.sky_runtime import prepare_offline_runtime

ROOT = Path(__file__).resolve().parents[1]
SRIFTY = Path(sys.executable).with_name("srifty")
GOAL_S = 1.0


def _time(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)  # noqa: S603
        samples.append(time.perf_counter() - start)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="srifty-bench-") as tmp:
        work = Path(tmp)
        runtime = prepare_offline_runtime(work / "sky")
        env = {
            **os.environ,
            "SKY_RUNTIME_DIR": str(runtime.runtime_dir),
            "SKYPILOT_DISABLE_LOCAL_API_SERVER": "1",
            "SKYPILOT_DISABLE_USAGE_COLLECTION": "1",
            "SRIFTY_IMDS": "off",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }
        print("profiling examples/train_digits.py once ...", flush=True)
        subprocess.run(  # noqa: S603
            [sys.executable, str(ROOT / "examples" / "train_digits.py"), "--max-steps", "30"],
            env={**env, "PL_TRAINER_DEFAULT_ROOT_DIR": str(work / "digits")},
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        profile = work / "digits" / "srifty" / "profile.json"
        plan = [str(SRIFTY), "plan", "--profile", str(profile), "--target-steps", "20000",
                "--deadline", "12h", "--catalog", "auto"]  # fmt: skip
        subprocess.run(plan, env=env, check=True, stdout=subprocess.DEVNULL)  # warm disk cache
        help_s = _time([str(SRIFTY), "--help"], env, args.runs)
        plan_s = _time(plan, env, args.runs)
        check = subprocess.run(  # noqa: S603
            [sys.executable, "-c",
             "import sys\nfrom lightning_srifty.cli import main\n"
             "main.main(sys.argv[1:])\nprint('sky imported:', 'sky' in sys.modules, "
             "file=sys.stderr)", *plan[1:]],
            env=env, check=True, capture_output=True, text=True,
        )  # fmt: skip
    help_med, plan_med = statistics.median(help_s), statistics.median(plan_s)
    print(f"srifty --help          median {help_med:.2f} s  (runs: {_fmt(help_s)})")
    print(f"srifty plan (auto)     median {plan_med:.2f} s  (runs: {_fmt(plan_s)})")
    print(f"plan over --help       {plan_med - help_med:.2f} s  (goal <= {GOAL_S:.1f} s)")
    print(check.stderr.strip().splitlines()[-1])
    verdict = "meets" if plan_med - help_med <= GOAL_S else "MISSES"
    print(f"verdict: {verdict} the goal")
    return 0


def _fmt(samples: list[float]) -> str:
    return ", ".join(f"{s:.2f}" for s in samples)


if __name__ == "__main__":
    sys.exit(main())
