"""Every step of a real Trainer on a GPU, with SriftyCallback and without it.

``measure_jobs.py`` compares one median of the profile with one median of the plain run.
This script keeps the whole series, so the profile's step can be checked against the
rate the job really trains at and a difference traced to the steps it comes from:

* each batch end's host clock (``perf_counter``, never synchronised: in steady state the
  host is held back by the GPU's queue, so its intervals are the training rate) and a
  CUDA event recorded there (the GPU's own timeline);
* for the callback's run, the callback's own records: hook-free spans, hooked spans and
  every window step's phases, and the step at which the profile was written.

Results go to ``--out/trace.json`` (schema ``srifty.gpu-capture-trace/2``). With
``--repeats N`` each job trains N plain and N callback runs, interleaved: on a lent H100
the same host-bound ResNet-18 run moved 11.5-14.4 ms from run to run, so one run of each
cannot tell the profile's error from the machine's.

    python benchmarks/gpu/capture_trace.py --out DIR [--jobs cifar10] [--steps 320] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_jobs import JOBS, PROFILE_BATCHES, Job, job_loader, job_module, job_trainer  # noqa: E402

SCHEMA = "srifty.gpu-capture-trace/2"


def run(job: Job, batch: int, steps: int, out: Path, with_callback: bool) -> dict[str, Any]:
    """Trains ``steps`` steps of ``job`` and returns its per-step series."""
    import lightning.pytorch as pl

    from lightning_srifty import SriftyCallback

    cuda = torch.cuda.is_available()

    class Trace(pl.Callback):
        def __init__(self) -> None:
            self.host: list[float] = []
            self.events: list[Any] = []
            self.profiled_at: int | None = None

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            self.host.append(time.perf_counter())
            if cuda:
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                self.events.append(event)
            if srifty is not None and srifty.profiled and self.profiled_at is None:
                self.profiled_at = len(self.host)

    path = out / f"profile-{job.name}.json"
    srifty = SriftyCallback(profile_path=path) if with_callback else None
    trace = Trace()
    trainer = job_trainer(job, steps, [trace] if srifty is None else [trace, srifty])
    started = time.perf_counter()
    trainer.fit(job_module(job), train_dataloaders=job_loader(job, batch))
    if cuda:
        torch.cuda.synchronize()
    host = [b - a for a, b in zip(trace.host, trace.host[1:], strict=False)]
    gpu = [a.elapsed_time(b) / 1e3 for a, b in zip(trace.events, trace.events[1:], strict=False)]
    result: dict[str, Any] = {
        "callback": with_callback,
        "steps": steps,
        "wall_s": time.perf_counter() - started,
        "host_interval_s": host,
        "gpu_interval_s": gpu,
    }
    if srifty is not None:
        result["profiled_at_batch_end"] = trace.profiled_at
        result["clean_spans_s"] = [srifty._clock.seconds(a, b) for a, b in srifty._clean_marks]
        result["hooked_spans_s"] = list(srifty._hooked_spans)
        result["window_steps"] = [dataclasses.asdict(s) for s in srifty._steps]
        if path.exists():
            written = json.loads(path.read_text())
            result["profile_steps"] = written["steps"]
            result["profile_extra_hooks"] = written["extra"].get("hooks")
    return result


def steady_rate(result: dict[str, Any]) -> float:
    """The run's training rate: the median batch-end interval after warm-up and window."""
    intervals = result["host_interval_s"]
    skip = min((result.get("profiled_at_batch_end") or 0) + 10, len(intervals) // 2)
    return statistics.median(intervals[max(skip, 5) :] or intervals)


def summary(name: str, runs: list[dict[str, Any]]) -> str:
    """One line: the profiles' steps against the plain runs' rates, all repeats."""
    plain = [steady_rate(r) for r in runs if not r["callback"]]
    after = [steady_rate(r) for r in runs if r["callback"]]
    profiles = [r["profile_steps"]["step"]["mean_s"] for r in runs if "profile_steps" in r]
    reference = statistics.median(plain)
    if not profiles:
        return f"{name:12s} no profile was written in {runs[0]['steps']} steps"
    ms = " ".join
    return (
        f"{name:12s} plain runs {ms(f'{1e3 * x:.2f}' for x in plain)} ms; "
        f"callback runs after the window {ms(f'{1e3 * x:.2f}' for x in after)} ms; "
        f"profiles {ms(f'{1e3 * x:.2f}' for x in profiles)} ms; "
        f"profile/plain median {statistics.median(profiles) / reference:.3f} "
        f"(each {ms(f'{x / reference:.2f}' for x in profiles)})"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--jobs", nargs="+", default=list(PROFILE_BATCHES), choices=list(JOBS))
    p.add_argument("--steps", type=int, default=320)
    p.add_argument(
        "--repeats", type=int, default=1, help="plain and callback runs, interleaved, per job"
    )
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True  # as measure_jobs.py's Lightning runs
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "jobs": {},
    }
    for name in args.jobs:
        job, batch = JOBS[name], PROFILE_BATCHES[name]
        runs = []
        for _ in range(args.repeats):
            for with_callback in (False, True):
                runs.append(run(job, batch, args.steps, args.out, with_callback))
                results["jobs"][name] = {"local_bsz": batch, "runs": runs}
                (args.out / "trace.json").write_text(json.dumps(results) + "\n")
        print(summary(name, runs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
