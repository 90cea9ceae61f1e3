"""``srifty predict``: predicted step time (with its interval) of a profile on a cluster."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lightning_srifty.core.catalog import GpuSpec, Offer
from lightning_srifty.core.cluster import Cluster, ClusterGroup, parse_placement
from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.perfmodel import PerformanceModel, Prediction
from lightning_srifty.core.planner import per_batch, predict_per_step
from lightning_srifty.core.profile import Profile


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds the ``predict`` sub-command."""
    p = sub.add_parser(
        "predict",
        help="predict step time of a profiled job on a cluster",
        description="Predicts seconds per step (with an interval) for a profile on a cluster.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", help="profile JSON written by SriftyCallback")
    source.add_argument(
        "--trace-model",
        metavar="DIR/MODEL",
        help="a model folder of a Pollux-format trace (uses its single-GPU rows only)",
    )
    p.add_argument("--cluster", metavar="TYPE:N", help="N nodes of instance TYPE")
    p.add_argument("--placement", help="GPUs used per node, one digit each, e.g. 4444")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument(
        "--local-bsz",
        type=int,
        help="samples per process per step (default: the profile's own batch, which every "
        "process of a Lightning DDP job keeps)",
    )
    batch.add_argument(
        "--global-bsz",
        type=int,
        help="what-if: samples per step split across GPUs by speed (srifty-launch never "
        "splits a script's batch)",
    )
    p.add_argument(
        "--calibration",
        help="calibration JSON from `srifty calibrate` (default: the one shipped, fitted on "
        "every shared trace set)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def _parse_cluster_flag(text: str) -> tuple[str, int]:
    name, sep, count = text.rpartition(":")
    if not sep or not name or not count.isdigit() or int(count) < 1:
        raise ConfigError(f"--cluster {text!r} is not valid: use TYPE:N, e.g. g4dn.12xlarge:4")
    return name, int(count)


def _catalog_offer(instance_type: str) -> tuple[Offer, dict[str, GpuSpec]]:
    """Looks the instance type up in the catalog (loaded lazily: it reads files)."""
    from lightning_srifty.fit.calibration import optional_catalog_io

    catalog_io = optional_catalog_io()
    if catalog_io is None:
        raise ConfigError(
            f"--cluster {instance_type}: the instance catalog is not available in this "
            "installation; use --trace-model with its hardware.json instead"
        )
    offer = catalog_io.load_catalog().offer(instance_type)
    return offer, dict(catalog_io.load_gpu_specs())


def _gpu_specs() -> dict[str, GpuSpec]:
    from lightning_srifty.fit.calibration import optional_catalog_io

    catalog_io = optional_catalog_io()
    return {} if catalog_io is None else dict(catalog_io.load_gpu_specs())


def build_cluster(offer: Offer, nodes: int | None, placement: tuple[int, ...] | None) -> Cluster:
    """Nodes of one offer; ``placement`` chooses GPUs per node (all GPUs otherwise)."""
    per_node = max(offer.accelerator_count, 1)
    if placement is None:
        return Cluster((ClusterGroup(offer, nodes or 1, per_node),))
    if nodes is not None and len(placement) != nodes:
        raise ConfigError(
            f"--placement has {len(placement)} digits but --cluster asks for {nodes} nodes"
        )
    too_many = [g for g in placement if g > per_node]
    if too_many:
        raise ConfigError(
            f"--placement uses {max(too_many)} GPUs on a node but {offer.instance_type} has "
            f"{per_node}"
        )
    counts: dict[int, int] = {}
    for gpus in placement:
        counts[gpus] = counts.get(gpus, 0) + 1
    return Cluster(tuple(ClusterGroup(offer, n, g) for g, n in sorted(counts.items())))


def _load_inputs(args: argparse.Namespace) -> tuple[Profile, Offer | None, dict[str, GpuSpec]]:
    from lightning_srifty.io.traces import coarse_profile, load_traces

    if args.profile:
        from lightning_srifty.io.profile_io import load_profile

        return load_profile(args.profile), None, {}
    folder = Path(args.trace_model)
    traces = load_traces(folder.parent, models=[folder.name])
    model = folder.name
    profile = coarse_profile(traces.models[model], traces.single_gpu_rows(model), traces.hardware)
    return profile, traces.hardware.offer(), {}


def predict_from_args(args: argparse.Namespace) -> tuple[Prediction, Cluster, Profile]:
    """Everything ``srifty predict`` computes, for the CLI and for tests."""
    from lightning_srifty.io.calibration_io import calibration_or_default

    profile, trace_offer, specs = _load_inputs(args)
    placement = parse_placement(args.placement) if args.placement else None
    nodes: int | None = None
    if args.cluster:
        instance_type, nodes = _parse_cluster_flag(args.cluster)
        if trace_offer is not None and trace_offer.instance_type == instance_type:
            offer = trace_offer
            specs = _gpu_specs()
        else:
            offer, specs = _catalog_offer(instance_type)
    elif trace_offer is not None:
        offer = trace_offer
        specs = _gpu_specs()
    else:
        raise ConfigError("--cluster TYPE:N is required with --profile")
    cluster = build_cluster(offer, nodes, placement)
    calibration = calibration_or_default(args.calibration)
    for flag in ("local_bsz", "global_bsz"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be a positive integer")
    model = PerformanceModel(specs, calibration)
    k = profile.environment.accumulate_grad_batches
    if args.local_bsz is None and args.global_bsz is None:
        return predict_per_step(model, profile, cluster), cluster, profile
    # the model prices an optimizer update of k batches; the CLI speaks in batches
    prediction = model.predict(
        profile,
        cluster,
        local_batch=None if args.local_bsz is None else args.local_bsz * k,
        global_batch=None if args.global_bsz is None else args.global_bsz * k,
    )
    return per_batch(prediction, k), cluster, profile


def prediction_dict(prediction: Prediction, cluster: Cluster, profile: Profile) -> dict[str, Any]:
    return {
        "model": profile.model_name,
        "cluster": cluster.describe(),
        "world_size": cluster.world_size,
        "step_s": prediction.step_s,
        "low_s": prediction.low_s,
        "high_s": prediction.high_s,
        "compute_s": prediction.compute_s,
        "comm_exposed_s": prediction.comm_s,
        "allreduce_s": prediction.allreduce_s,
        "local_batch": list(prediction.local_batch),
        "global_batch": prediction.global_batch,
        "memory_gib_per_gpu": list(prediction.memory_gib),
        "fits": prediction.fits,
        "links": [g.offer.node_links.describe() for g in cluster.groups],
        "effective_intra_gbytes_s": _finite(prediction.intra_bytes_s / 1e9),
        "effective_network_gbps": _finite(prediction.inter_bytes_s * 8 / 1e9),
    }


def _finite(value: float) -> float | None:
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def prediction_rows(
    prediction: Prediction, cluster: Cluster, data: dict[str, Any]
) -> list[tuple[str, str]]:
    """(quantity, value) rows, shared by the terminal table and the plain lines."""
    rows = [
        ("step time", f"{prediction.step_s:.4f} s"),
        ("interval", f"{prediction.low_s:.4f} - {prediction.high_s:.4f} s"),
        ("compute (slowest group)", f"{prediction.compute_s:.4f} s"),
        ("exposed communication", f"{prediction.comm_s:.4f} s"),
        ("all-reduce (total)", f"{prediction.allreduce_s:.4f} s"),
        ("batch per process", ", ".join(str(b) for b in prediction.local_batch)),
        ("global batch", str(prediction.global_batch)),
        ("GPUs", str(cluster.world_size)),
    ]
    if data["effective_network_gbps"] is not None and cluster.nodes > 1:
        rows.append(("network (effective)", f"{data['effective_network_gbps']:.2f} Gbps"))
    if (
        data["effective_intra_gbytes_s"] is not None
        and max(g.gpus_per_node for g in cluster.groups) > 1
    ):
        rows.append(("GPU link (effective)", f"{data['effective_intra_gbytes_s']:.1f} GB/s"))
    rows.extend(("links", text) for text in dict.fromkeys(data["links"]))
    return rows


def run(args: argparse.Namespace) -> int:
    prediction, cluster, profile = predict_from_args(args)
    data = prediction_dict(prediction, cluster, profile)
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    title = f"srifty predict: {data['model'] or 'profile'} on {data['cluster']}"
    rows = prediction_rows(prediction, cluster, data)
    console = Console()
    if not console.is_terminal:
        # a pipe or a log: plain lines, no box drawing
        print(title)
        for name, value in rows:
            print(f"  {name}: {value}")
        return 0
    table = Table(title=title)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    return 0
