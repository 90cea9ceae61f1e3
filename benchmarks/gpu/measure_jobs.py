"""Measure the shared traces' training jobs on the GPU this script runs on.

The performance model transfers a job's step time from the GPU it was profiled on to
GPUs nobody measured it on. The traces in ``../shared/data`` hold the same six jobs on
three kinds of hardware; this script adds a fourth, wherever it runs (a lent H100 in
this project), so a transfer can be checked against a GPU that no fit has seen.

Two parts, one JSON file each under ``--out``:

* ``steps.json``: plain PyTorch training steps of four of the jobs, rebuilt from
  ``pollux-traces/models.json`` (same network, optimizer and precision), on synthetic
  inputs already on the device, at the local batch sizes of the traces' one-GPU rows.
  No data loading is in them, so the per-sample slope (step time against batch) is the
  device's, which is what the model scales between GPUs; the fixed part of the traces'
  steps (AdaptDL's host work) is not reproduced.
* ``profile-<job>.json``: the same networks trained by a real ``lightning.Trainer`` with
  :class:`~lightning_srifty.SriftyCallback` attached: the detailed profile a user would
  capture on this GPU, per-layer timings and FLOPs included.

yolov3 (multi-scale, input size per row unknown) and ncf (host-bound: its steps are
AdaptDL's Python, not the GPU) are left out. deepspeech2's utterance length is not in
the traces; 300 frames (3 s at a 10 ms stride, CMU ARCTIC's typical utterance) is used.

    python benchmarks/gpu/measure_jobs.py --out results/      # on a CUDA machine
    python benchmarks/gpu/measure_jobs.py --out /tmp/x --smoke  # anywhere, tiny sizes
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

SCHEMA = "srifty.gpu-job-steps/1"
SEQ_LEN = 384  # bert: SQuAD max_seq_length
DS2_FRAMES = 300  # deepspeech2: assumed utterance length (see module docstring)
DS2_FREQ = 161  # 20 ms window at 16 kHz: n_fft 320 -> 161 bins
DS2_LABELS = 29


# ---------------------------------------------------------------- the networks
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet18(nn.Module):
    """kuangliu/pytorch-cifar ResNet-18: 3x3 stride-1 stem, no max-pool."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers: list[nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.linear = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        out = F.avg_pool2d(out, 4).flatten(1)
        return self.linear(out)


class SequenceBatchNorm(nn.Module):
    """BatchNorm1d over (time, batch, features), as deepspeech.pytorch's SequenceWise."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, n, f = x.shape
        return self.bn(x.reshape(t * n, f)).reshape(t, n, f)


class BiGRULayer(nn.Module):
    def __init__(self, cin: int, hidden: int, batch_norm: bool) -> None:
        super().__init__()
        self.norm: nn.Module = SequenceBatchNorm(cin) if batch_norm else nn.Identity()
        self.rnn = nn.GRU(cin, hidden, bidirectional=True)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.norm(x))
        t, n, _ = out.shape
        return out.view(t, n, 2, self.hidden).sum(2)  # directions summed


class DeepSpeech2(nn.Module):
    """SeanNaren deepspeech.pytorch: 2 conv + 5 bi-GRU(800) + BN + Linear(800->29)."""

    def __init__(self, hidden: int = 800, layers: int = 5) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, 32, (41, 11), (2, 2), (20, 5)),
            nn.BatchNorm2d(32),
            nn.Hardtanh(0, 20, inplace=True),
            nn.Conv2d(32, 32, (21, 11), (2, 1), (10, 5)),
            nn.BatchNorm2d(32),
            nn.Hardtanh(0, 20, inplace=True),
        )
        freq = (DS2_FREQ + 2 * 20 - 41) // 2 + 1
        freq = (freq + 2 * 10 - 21) // 2 + 1
        cin = 32 * freq
        self.rnns = nn.Sequential(
            *[BiGRULayer(cin if i == 0 else hidden, hidden, i > 0) for i in range(layers)]
        )
        self.norm = SequenceBatchNorm(hidden)
        self.fc = nn.Linear(hidden, DS2_LABELS, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)  # (n, c, freq, time)
        n, c, f, t = x.shape
        x = x.view(n, c * f, t).permute(2, 0, 1).contiguous()  # (time, n, features)
        return self.fc(self.norm(self.rnns(x))).log_softmax(-1)


# ------------------------------------------------------------------ the jobs
@dataclass(frozen=True)
class Job:
    """One trace job: how to build its network, inputs, loss and optimizer."""

    name: str
    precision: str  # "fp32" or "amp" (apex O1 in the traces: fp16 autocast)
    batches: tuple[int, ...]
    build: Callable[[], nn.Module]
    inputs: Callable[[int, torch.device], tuple[Any, ...]]
    loss: Callable[[nn.Module, tuple[Any, ...]], torch.Tensor]
    optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    clip: float | None = None


def _images(size: int, classes: int) -> Callable[[int, torch.device], tuple[Any, ...]]:
    def make(b: int, dev: torch.device) -> tuple[Any, ...]:
        return (
            torch.randn(b, 3, size, size, device=dev),
            torch.randint(0, classes, (b,), device=dev),
        )

    return make


def _classify(model: nn.Module, batch: tuple[Any, ...]) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def _sgd(lr: float, momentum: float, wd: float) -> Callable[[nn.Module], torch.optim.Optimizer]:
    return lambda m: torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum, weight_decay=wd)


def _bert() -> nn.Module:
    from transformers import BertConfig, BertForQuestionAnswering

    return BertForQuestionAnswering(BertConfig())  # bert-base-uncased's shape


def _bert_inputs(b: int, dev: torch.device) -> tuple[Any, ...]:
    ids = torch.randint(1000, 30000, (b, SEQ_LEN), device=dev)
    starts = torch.randint(0, SEQ_LEN, (b,), device=dev)
    return ids, starts, torch.clamp(starts + 5, max=SEQ_LEN - 1)


def _bert_loss(model: nn.Module, batch: tuple[Any, ...]) -> torch.Tensor:
    ids, starts, ends = batch
    out = model(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        token_type_ids=torch.zeros_like(ids),
        start_positions=starts,
        end_positions=ends,
    )
    return out.loss


def _ds2_inputs(b: int, dev: torch.device) -> tuple[Any, ...]:
    spect = torch.randn(b, 1, DS2_FREQ, DS2_FRAMES, device=dev)
    targets = torch.randint(1, DS2_LABELS, (b, 40), device=dev)
    return spect, targets


def _ds2_loss(model: nn.Module, batch: tuple[Any, ...]) -> torch.Tensor:
    spect, targets = batch
    log_probs = model(spect)  # (time, n, labels)
    t, n, _ = log_probs.shape
    in_len = torch.full((n,), t, dtype=torch.long)
    tgt_len = torch.full((n,), targets.shape[1], dtype=torch.long)
    return F.ctc_loss(log_probs.float(), targets, in_len, tgt_len, zero_infinity=True)


def _resnet50() -> nn.Module:
    import torchvision

    return torchvision.models.resnet50()


JOBS: dict[str, Job] = {
    "cifar10": Job(
        "cifar10",
        "fp32",
        (32, 64, 129, 257, 363),
        CifarResNet18,
        _images(32, 10),
        _classify,
        _sgd(0.08, 0.9, 5e-4),
    ),
    "imagenet": Job(
        "imagenet",
        "amp",
        (20, 40, 81, 163, 231),
        _resnet50,
        _images(224, 1000),
        _classify,
        _sgd(0.08, 0.9, 1e-4),
    ),
    "bert": Job(
        "bert",
        "fp32",
        (4, 8, 12, 23, 47),
        _bert,
        _bert_inputs,
        _bert_loss,
        lambda m: torch.optim.AdamW(m.parameters(), lr=3e-5, eps=1e-8),
        clip=1.0,
    ),
    "deepspeech2": Job(
        "deepspeech2",
        "fp32",
        (10, 20, 40, 80),
        DeepSpeech2,
        _ds2_inputs,
        _ds2_loss,
        lambda m: torch.optim.SGD(m.parameters(), lr=0.12, momentum=0.95),
        clip=1.0,
    ),
}


# ---------------------------------------------------------------- step timing
def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_steps(job: Job, batch: int, dev: torch.device, warmup: int, steps: int) -> dict[str, Any]:
    """Median wall time of ``steps`` full training steps (forward, backward, optimizer)."""
    torch.manual_seed(0)
    model = job.build().to(dev)
    model.train()
    opt = job.optimizer(model)
    amp = job.precision == "amp" and dev.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    data = [job.inputs(batch, dev) for _ in range(2)]  # two sets: no cache-resident input

    def step(i: int) -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.float16, enabled=amp):
            loss = job.loss(model, data[i % 2])
        scaler.scale(loss).backward()
        if job.clip is not None:
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), job.clip)
        scaler.step(opt)
        scaler.update()

    for i in range(warmup):
        step(i)
    _sync(dev)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(i)
        _sync(dev)
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "job": job.name,
        "precision": job.precision,
        "local_bsz": batch,
        "step_s": statistics.median(times),
        "step_s_min": min(times),
        "step_s_max": max(times),
        "steps_timed": steps,
        "peak_bytes": int(peak),
    }


def measure_steps(args: argparse.Namespace, dev: torch.device) -> list[dict[str, Any]]:
    rows = []
    for name in args.jobs:
        job = JOBS[name]
        batches = job.batches[:2] if args.smoke else job.batches
        modes = (
            ["tf32", "fp32"] if job.precision == "fp32" and name in ("bert", "cifar10") else [""]
        )
        for mode in modes:
            if mode:
                torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
                torch.backends.cudnn.allow_tf32 = mode == "tf32"
            for b in batches:
                b = min(b, 4) if args.smoke else b
                try:
                    row = time_steps(job, b, dev, args.warmup, args.steps)
                except ImportError as exc:
                    print(f"{name}: skipped ({exc})", flush=True)
                    break
                except torch.OutOfMemoryError:
                    print(f"{name} b={b}: out of memory", flush=True)
                    torch.cuda.empty_cache()
                    continue
                row["math"] = mode or job.precision
                rows.append(row)
                print(
                    f"{name:12s} {row['math']:5s} b={b:4d} step {row['step_s'] * 1e3:8.2f} ms"
                    f"  ({row['step_s_min'] * 1e3:.2f}-{row['step_s_max'] * 1e3:.2f})",
                    flush=True,
                )
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = True  # PyTorch's defaults
    return rows


# ------------------------------------------------------- Lightning + callback
WARMUP, PROFILE, CLEAN = 5, 20, 10
"""SriftyCallback's window here, and how many steps after it both runs are timed on."""


def job_module(job: Job) -> Any:
    """``job`` as a ``LightningModule``: its network, loss and optimizer, nothing else."""
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = job.build()

        def training_step(self, batch: tuple[Any, ...], batch_idx: int) -> torch.Tensor:
            return job.loss(self.net, batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return job.optimizer(self.net)

    return Module()


def job_loader(job: Job, batch: int) -> torch.utils.data.DataLoader[tuple[Any, ...]]:
    """Synthetic samples of ``job`` through a ``DataLoader`` with 2 workers (pinned on
    GPUs), as a user's loader would feed it."""

    class Synthetic(torch.utils.data.Dataset[tuple[Any, ...]]):
        # Distinct samples: a batch of one repeated sample has no variance, and its
        # normalised activations underflow to denormals that stall CPU arithmetic.
        def __init__(self) -> None:
            cpu = torch.device("cpu")
            self.pool = [tuple(x[0] for x in job.inputs(1, cpu)) for _ in range(32)]

        def __len__(self) -> int:
            return 100_000

        def __getitem__(self, i: int) -> tuple[Any, ...]:
            return self.pool[i % len(self.pool)]

    return torch.utils.data.DataLoader(
        Synthetic(), batch_size=batch, num_workers=2, pin_memory=torch.cuda.is_available()
    )


def job_trainer(job: Job, max_steps: int, callbacks: list[Any]) -> Any:
    """One device, ``job``'s precision (AMP on GPUs) and clipping, no logger, checkpoint,
    progress bar or summary: the steps and the callbacks' own work alone."""
    import lightning.pytorch as pl

    cuda = torch.cuda.is_available()
    return pl.Trainer(
        accelerator="auto",
        devices=1,
        precision="16-mixed" if job.precision == "amp" and cuda else "32-true",
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=job.clip,
        callbacks=callbacks,
    )


def lightning_run(
    job: Job, batch: int, out: Path, smoke: bool, profile: bool
) -> tuple[Path | None, float | None]:
    """Train ``job`` under a real Trainer, with SriftyCallback or without it.

    Returns the profile path (``None`` without the callback) and the median wall time of
    steps 26-35 (after the callback's 5 warm-up and 20 hooked ones), each from one
    batch end to the next with a synchronisation at both.
    """
    import lightning.pytorch as pl

    from lightning_srifty import SriftyCallback

    warmup, window, clean = (4, 4, 2) if smoke else (WARMUP, PROFILE, CLEAN)

    class StepTimer(pl.Callback):
        """Each of the timed steps, batch end to batch end, synchronised at both ends."""

        def __init__(self) -> None:
            self.seen = 0
            self.last = 0.0
            self.steps: list[float] = []

        def on_train_batch_end(self, *args: Any) -> None:
            self.seen += 1
            if warmup + window <= self.seen <= warmup + window + clean:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                now = time.perf_counter()
                if self.seen > warmup + window:
                    self.steps.append(now - self.last)
                self.last = now

    path = out / f"profile-{job.name}.json"
    timer = StepTimer()
    callbacks: list[pl.Callback] = [timer]
    if profile:
        callbacks.append(
            SriftyCallback(warmup_steps=warmup, profile_steps=window, profile_path=path)
        )
    trainer = job_trainer(job, warmup + window + clean + 2, callbacks)
    try:
        trainer.fit(job_module(job), train_dataloaders=job_loader(job, batch))
    except ImportError as exc:
        print(f"{job.name}: skipped ({exc})", flush=True)
        return None, None
    median = statistics.median(timer.steps) if timer.steps else None
    return (path if profile and path.exists() else None), median


PROFILE_BATCHES = {"cifar10": 129, "imagenet": 81, "bert": 8, "deepspeech2": 20}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script")
    p.add_argument("--skip-profiles", action="store_true")
    p.add_argument("--skip-steps", action="store_true", help="only the Lightning runs")
    args = p.parse_args(argv)
    if args.smoke:
        args.warmup, args.steps = 1, 2
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = True
    started = time.time()
    rows = [] if args.skip_steps else measure_steps(args, dev)
    header = {
        "schema": SCHEMA,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "method": "median of timed steps after warm-up; synthetic inputs on the device; "
        "cudnn.benchmark on; fp32 rows with TF32 on (PyTorch <1.12 default, the traces' era) "
        "and off (today's default for matmuls)",
        "deepspeech2_frames": DS2_FRAMES,
        "bert_seq_len": SEQ_LEN,
        "rows": rows,
    }
    if rows:
        (args.out / "steps.json").write_text(json.dumps(header, indent=1) + "\n")
    if not args.skip_profiles:
        torch.backends.cuda.matmul.allow_tf32 = True  # as the traces' PyTorch did
        runs = []
        for name in args.jobs:
            job, batch = JOBS[name], PROFILE_BATCHES[name]
            _, plain = lightning_run(job, batch, args.out, args.smoke, profile=False)
            path, clean = lightning_run(job, batch, args.out, args.smoke, profile=True)
            if path is None:
                print(f"{name}: no profile", flush=True)
                continue
            written = json.loads(path.read_text())
            runs.append(
                {
                    "job": name,
                    "local_bsz": batch,
                    "plain_lightning_step_s": plain,
                    "clean_phase_step_s": clean,
                    "profile_step_s": written["steps"]["step"]["mean_s"],
                    "hooks": written["extra"].get("hooks"),
                }
            )
            print(
                f"{name:12s} b={batch:4d} plain Lightning {1e3 * (plain or 0):7.2f} ms; "
                f"profile {1e3 * runs[-1]['profile_step_s']:7.2f} ms "
                f"(hooks {runs[-1]['hooks']})",
                flush=True,
            )
        header.pop("rows")
        header["method"] = (
            "a real Trainer (tf32 matmuls on), synthetic data through a DataLoader with 2 "
            "workers; plain = the same run without SriftyCallback: median of the steps the "
            "callback times hook-free, each batch end to batch end, synchronised"
        )
        header["runs"] = runs
        (args.out / "lightning.json").write_text(json.dumps(header, indent=1) + "\n")
    print(f"done in {math.ceil(time.time() - started)} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
