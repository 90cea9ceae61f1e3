"""A cluster is one or more groups of identical nodes; a plan is a priced cluster."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_srifty.core.catalog import Offer
from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.lognormal import mean_factor, step_sigma


@dataclass(frozen=True)
class ClusterGroup:
    """``nodes`` instances of ``offer``, each using ``gpus_per_node`` accelerators."""

    offer: Offer
    nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Cluster:
    """Synchronous data-parallel cluster: the slowest group paces every step."""

    groups: tuple[ClusterGroup, ...]

    @property
    def world_size(self) -> int:
        return sum(g.gpus for g in self.groups)

    @property
    def nodes(self) -> int:
        return sum(g.nodes for g in self.groups)

    @property
    def uses_efa(self) -> bool:
        """NCCL crosses nodes over EFA, so the SkyPilot task must ask for it
        (``network_tier: best``): several nodes, every one of an EFA type. A cluster
        that mixes EFA and TCP nodes is priced over sockets (NCCL runs one network)."""
        return self.nodes > 1 and all(g.offer.node_links.uses_efa for g in self.groups)

    @property
    def is_heterogeneous(self) -> bool:
        return len({g.offer.instance_type for g in self.groups}) > 1

    def hourly_price(self, use_spot: bool) -> float | None:
        total = 0.0
        for g in self.groups:
            price = g.offer.price(use_spot)
            if price is None:
                return None
            total += price * g.nodes
        return total

    def describe(self) -> str:
        parts = []
        for g in self.groups:
            partial = g.gpus_per_node != g.offer.accelerator_count
            suffix = f" ({g.gpus_per_node} GPU/node)" if partial else ""
            parts.append(f"{g.nodes}x {g.offer.instance_type}{suffix}")
        return " + ".join(parts)


def parse_placement(text: str) -> tuple[int, ...]:
    """``"4444"`` -> (4, 4, 4, 4): GPUs used on each node, as in Pollux traces."""
    if not text or not text.isdigit() or "0" in text:
        raise ConfigError(
            f"--placement {text!r} is not valid: give one digit 1-9 per node, e.g. 4444"
        )
    return tuple(int(c) for c in text)


@dataclass(frozen=True)
class Plan:
    """A priced, timed cluster choice the planner recommends or compares."""

    cluster: Cluster
    use_spot: bool
    step_s: float
    """Median seconds per step: one batch of the training loop on every process."""
    step_low_s: float
    """10 % end of the step's interval."""
    step_high_s: float
    """90 % end of the step's interval."""
    global_batch: int
    """Samples per step across the cluster (the per-process batch times the GPUs)."""
    steps_to_target: int
    """Steps on this cluster to the target (the same samples on any cluster)."""
    time_to_target_h: float
    """Expected wall time: at the mean step (:attr:`step_mean_s`), with the preemption
    overheads of spot plans."""
    cost_usd: float
    """Expected cost: at the mean step, with lost work and restarts for spot plans."""
    hourly_usd: float
    deadline_probability: float = 1.0
    checkpoint_interval_s: float | None = None
    preemptions_per_hour: float = 0.0
    label: str = ""
    per_process_batch: int = 0
    """Samples per step on each process: the script's own batch (0: not recorded)."""
    validation_s: float = 0.0
    """Validation seconds per step (the script's passes between training batches): in
    :attr:`time_to_target_h` and :attr:`cost_usd`, not in :attr:`step_s`."""
    stops_at_step: int | None = None
    """Steps this run trains before the script's own limits end it, short of
    :attr:`steps_to_target` (``None``: it reaches the target); :attr:`time_to_target_h`
    and :attr:`cost_usd` are then to there."""
    stopped_by: str = ""
    """The script's setting that ends the run there (``max_time=0:00:25``)."""

    @property
    def step_sigma(self) -> float:
        """Log-normal sigma of the step, from its 10-90 % interval (0 when it has none)."""
        return float(step_sigma(self.step_s, self.step_low_s, self.step_high_s))

    @property
    def step_mean_s(self) -> float:
        """Mean seconds per step, ``step_s·exp(sigma²/2)``: what the expected time and
        cost are priced at (a wide interval costs more on average than a narrow one)."""
        return self.step_s * float(mean_factor(self.step_sigma))
