"""``srifty profile show``: what a profile says, at a glance or as JSON."""

from __future__ import annotations

import argparse
import json

from lightning_srifty.core.catalog import precision_kind
from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.profile import Profile


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds ``profile show``."""
    p = sub.add_parser("profile", help="inspect profiles written by SriftyCallback")
    actions = p.add_subparsers(dest="profile_command", required=True, parser_class=type(p))
    show = actions.add_parser(
        "show",
        help="summarise a profile",
        description="Split of step time, top layers, environment, memory and buckets.",
    )
    show.add_argument("profile", metavar="PROFILE.json")
    show.add_argument("--top", type=int, default=10, metavar="N", help="layers to list")
    show.add_argument("--json", action="store_true", help="print the parsed profile as JSON")
    show.set_defaults(func=run_show)


def phase_split(profile: Profile) -> list[tuple[str, float, float]]:
    """(phase, seconds per step, share of step) for forward, backward, optimizer, data, comm.

    Exposed communication is shown on its own and taken out of backward, because under
    DDP ``backward`` ends only when the last bucket is reduced; "other" is whatever the
    phases do not cover (Lightning bookkeeping, logging).
    """
    steps = profile.steps
    exposed = profile.communication.exposed_s if profile.communication else 0.0
    rows = [
        ("forward", steps.forward_s),
        ("backward", max(steps.backward_s - exposed, 0.0)),
        ("optimizer", steps.optimizer_s),
        ("data wait", steps.data_wait_s),
        ("communication (exposed)", exposed),
    ]
    total = steps.step.mean_s
    rows.append(("other", max(total - sum(v for _, v in rows), 0.0)))
    return [(name, value, value / total if total > 0 else 0.0) for name, value in rows]


def run_show(args: argparse.Namespace) -> int:
    from lightning_srifty.io.profile_io import load_profile

    if args.top < 0:
        raise ConfigError(f"--top must be >= 0, got {args.top}")
    profile = load_profile(args.profile)
    if args.json:
        print(json.dumps(profile.to_dict(), indent=1))
        return 0
    _print_summary(profile, args.profile, args.top)
    return 0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _print_summary(profile: Profile, source: str, top: int) -> None:
    from rich.console import Console
    from rich.markup import escape

    from lightning_srifty.cli.output import print_rows

    console = Console()
    env, steps = profile.environment, profile.steps
    console.print(
        f"[bold]{escape(source)}[/bold]: {profile.kind} profile of "
        f"{escape(profile.model_name or '?')} ({escape(profile.created_at or 'time unknown')})"
    )
    console.print(
        f"device {env.device_name} ({env.accelerator}), {env.world_size} rank(s) = "
        f"{env.num_nodes} node(s) x {env.devices_per_node}, precision {env.precision}, "
        f"local batch {env.local_batch_size}, instance {env.instance_type or '-'} "
        f"in {env.region or '-'}, torch {env.torch_version}, lightning {env.lightning_version}",
        markup=False,
    )
    if precision_kind(env.precision) == "fp32":
        console.print(float32_math_line(profile), markup=False)
    console.print(
        f"step {_ms(steps.step.mean_s)} mean, {_ms(steps.step.p50_s)} p50, "
        f"{_ms(steps.step.p90_s)} p90 over {steps.measured_steps} steps "
        f"(after {steps.warmup_steps} warm-up); {profile.flops_per_step / 1e9:.3f} GFLOP/step"
    )

    print_rows(
        console,
        "Where a step goes",
        ("phase", "per step", "share"),
        [(name, _ms(value), f"{100 * share:.1f}%") for name, value, share in phase_split(profile)],
        right=("per step", "share"),
    )

    if profile.layers and top > 0:
        ranked = sorted(profile.layers, key=lambda x: x.forward_s + x.backward_s, reverse=True)
        print_rows(
            console,
            f"Top {min(top, len(profile.layers))} layers by time",
            ("layer", "type", "forward", "backward", "params", "GFLOP", "activ."),
            [
                (
                    layer.name,
                    layer.module_type,
                    _ms(layer.forward_s),
                    _ms(layer.backward_s),
                    _bytes(layer.param_bytes),
                    f"{layer.flops / 1e9:.4f}",
                    _bytes(layer.activation_bytes),
                )  # fmt: skip
                for layer in ranked[:top]
            ],
            right=("forward", "backward", "params", "GFLOP", "activ."),
        )

    mem = profile.memory
    console.print(
        f"memory: params {_bytes(mem.param_bytes)}, grads {_bytes(mem.grad_bytes)}, "
        f"optimizer state {_bytes(mem.optimizer_state_bytes)}, activations "
        f"{_bytes(mem.activation_bytes)}, peak {_bytes(mem.peak_bytes)} ({mem.peak_kind})"
    )
    if profile.data_loading is not None:
        console.print(data_loading_line(profile), markup=False)
    latency = layer_latency_line(profile)
    if latency:
        console.print(latency, markup=False)
    if profile.communication is not None:
        comm = profile.communication
        console.print(
            f"communication ({comm.backend}): all-reduce {_ms(comm.allreduce_s)} per step, "
            f"exposed {_ms(comm.exposed_s)}; {_bytes(profile.grad_bytes)} of gradients"
        )
    if profile.buckets:
        columns = ("order", "index", "size", "params", "ready at", "all-reduce")
        print_rows(
            console,
            "DDP buckets (in ready order)",
            columns,
            [
                (
                    str(b.ready_order),
                    str(b.index),
                    _bytes(b.bytes),
                    str(b.num_params),
                    _ms(b.ready_offset_s),
                    _ms(b.allreduce_s),
                )  # fmt: skip
                for b in sorted(profile.buckets, key=lambda b: b.ready_order)
            ],
            right=columns,
        )
    if len(profile.ranks) > 1:
        columns = ("rank", "step", "forward", "backward", "all-reduce", "exposed")
        print_rows(
            console,
            "Ranks",
            columns,
            [
                (
                    str(r.rank),
                    _ms(r.step_mean_s),
                    _ms(r.forward_s),
                    _ms(r.backward_s),
                    _ms(r.allreduce_s),
                    _ms(r.exposed_comm_s),
                )  # fmt: skip
                for r in profile.ranks
            ],
            right=columns,
        )


def data_loading_line(profile: Profile) -> str:
    """What the loader's workers cost, and the step they would set on any faster GPU."""
    loading = profile.data_loading
    assert loading is not None
    pace = loading.cpu_s_per_batch / loading.workers
    return (
        f"data loading: {loading.workers} worker(s), {_ms(loading.cpu_s_per_batch)} of CPU "
        f"per batch ({loading.batches} batches): no step shorter than {_ms(pace)} at this "
        f"batch, however fast the GPU, with a vCPU for each worker and one for training "
        f"(fewer vCPUs per process raise it: training's compute shares them)"
    )


def layer_latency_line(profile: Profile) -> str:
    """How much of a GPU profile's layer time is latency, kept per step on every GPU and
    batch, and how much is work that scales (empty where the model splits nothing)."""
    from lightning_srifty.core.perfmodel import ROOFLINE_EFFICIENCY, PerformanceModel
    from lightning_srifty.io.catalog_io import load_gpu_specs

    if not profile.layers or profile.environment.accelerator in ("", "cpu"):
        return ""
    model = PerformanceModel(load_gpu_specs())
    if profile.environment.accelerator not in model.gpu_specs:
        return ""
    latency = model.layer_latency_s(profile)
    work = sum(seconds for _, seconds in model.layer_work(profile))
    return (
        f"layer time: {_ms(work)} of work (scaled with the batch and by each layer's "
        f"roofline on another GPU) and {_ms(latency)} of latency (launches and kernels too "
        f"small to fill the GPU: time beyond {1 / ROOFLINE_EFFICIENCY:.1f}x a layer's "
        f"roofline, kept per step on every GPU and batch)"
    )


def float32_math_line(profile: Profile) -> str:
    """What a float32 job's matrix products run on Ampere and later, and how to change
    it: the setting moves an H100 step by up to 7x and is planned as recorded."""
    env = profile.environment
    recorded = env.float32_matmul_precision
    matmul = (
        f"float32_matmul_precision {recorded!r}"
        if recorded
        else f"not recorded: torch {env.torch_version or '?'}'s default"
    )
    cudnn = "not recorded" if env.cudnn_allow_tf32 is None else str(env.cudnn_allow_tf32)
    line = (
        f"float32 math: matmuls {'TF32' if env.matmul_tf32 else 'FP32'} ({matmul}), "
        f"convolutions/RNNs {'TF32' if env.cudnn_tf32 else 'FP32'} "
        f"(cudnn.allow_tf32 {cudnn}); planned so on Ampere and later"
    )
    if not env.matmul_tf32:
        line += '; torch.set_float32_matmul_precision("high") in the script allows TF32'
    return line
