"""Diagnostic: does any part of SriftyCallback slow a GPU job outside its window?

Written when one run of ``capture_trace.py`` read a ResNet-18 profile 1.25x its plain
run. Each variant trains the same job under a real Trainer; every batch end's host
clock is kept, and the SM clock read at four batches:

* ``plain``: no callback; ``events``: a callback that only records a CUDA event at each
  batch start and end (what the hook-free warm-up steps do);
* ``srifty``: SriftyCallback as shipped; ``srifty-hostclock``: with its CUDA-event clock
  swapped for the host clock (a diagnosis only: the spans then read host time).

Result on an H100 (2026-11-28, ``h100-2026-11-28/variants-call2.json``): the SM clock
stayed at 1980 MHz, events alone cost nothing measurable, and two plain runs and two
SriftyCallback runs straddled each other; the 1.25 was the machine's run-to-run noise.

    python benchmarks/gpu/capture_variants.py OUT plain,srifty,events cifar10 320
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_jobs import JOBS, PROFILE_BATCHES, job_loader, job_module, job_trainer  # noqa: E402


def run(name: str, variant: str, steps: int, out: Path) -> dict[str, Any]:
    import lightning.pytorch as pl

    import lightning_srifty.capture.callback as cbmod
    from lightning_srifty import SriftyCallback

    job, batch = JOBS[name], PROFILE_BATCHES[name]

    class Trace(pl.Callback):
        def __init__(self) -> None:
            self.host: list[float] = []
            self.clock: dict[int, int] = {}

        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            self.host.append(time.perf_counter())
            if len(self.host) in (3, 20, 50, 250):
                self.clock[len(self.host)] = torch.cuda.clock_rate()

    class Events(pl.Callback):
        def __init__(self) -> None:
            self.marks: list[Any] = []

        def _mark(self) -> None:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)

        def on_train_batch_start(self, *a: Any) -> None:
            self._mark()

        def on_train_batch_end(self, *a: Any) -> None:
            self._mark()

    trace = Trace()
    cbs: list[Any] = [trace]
    saved = cbmod.CudaClock
    if variant.startswith("srifty"):
        if variant == "srifty-hostclock":
            cbmod.CudaClock = cbmod.CpuClock  # type: ignore[misc]
        cbs.append(SriftyCallback(profile_path=out / f"p-{name}-{variant}.json", verbose=False))
    elif variant == "events":
        cbs.append(Events())
    trainer = job_trainer(job, steps, cbs)
    try:
        trainer.fit(job_module(job), train_dataloaders=job_loader(job, batch))
    finally:
        cbmod.CudaClock = saved  # type: ignore[misc]
    torch.cuda.synchronize()
    iv = [b - a for a, b in zip(trace.host, trace.host[1:], strict=False)]
    res: dict[str, Any] = {
        "variant": variant,
        "job": name,
        "host_interval_s": iv,
        "clock_mhz": trace.clock,
    }
    if variant.startswith("srifty"):
        s = cbs[1]
        res["clean_spans_s"] = [s._clock.seconds(a, b) for a, b in s._clean_marks]
        p = out / f"p-{name}-{variant}.json"
        if p.exists():
            w = json.loads(p.read_text())
            res["profile_step"] = w["steps"]["step"]
            res["hooks"] = w["extra"].get("hooks")
    bounds = [b for b in (1, 5, 35, 60, 160, 240) if b < len(iv)] + [len(iv)]
    segs = list(zip(bounds, bounds[1:], strict=False))
    med = [round(1e3 * statistics.median(iv[a:b]), 2) for a, b in segs]
    extra = ""
    if "profile_step" in res:
        profile_ms = 1e3 * res["profile_step"]["mean_s"]
        clean_ms = 1e3 * statistics.median(res["clean_spans_s"])
        extra = f" profile mean {profile_ms:.2f} clean med {clean_ms:.2f}"
    whole_ms = 1e3 * statistics.median(iv[5:])
    print(
        f"{name:9s} {variant:17s} segs {med} whole {whole_ms:.2f} clocks {trace.clock}{extra}",
        flush=True,
    )
    return res


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    order = sys.argv[2].split(",")
    jobs = sys.argv[3].split(",")
    steps = int(sys.argv[4])
    allres = []
    for name in jobs:
        for v in order:
            allres.append(run(name, v, steps, out))
            (out / "variants.json").write_text(json.dumps(allres))
