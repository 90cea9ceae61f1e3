"""Column arrays describing many candidate clusters at once.

The planner evaluates hundreds of thousands of clusters per second, so the performance
model takes clusters as numpy columns rather than as :class:`Cluster` objects. Each
candidate has up to ``G`` groups (column ``g``); a group with ``nodes == 0`` is absent,
so homogeneous and heterogeneous candidates share one array.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_srifty.core.cluster import Cluster
from lightning_srifty.core.links import LinkColumns, NodeLinks


@dataclass(frozen=True)
class CandidateArrays:
    """``n`` candidate clusters of at most ``G`` groups; every array has shape (n, G)."""

    accelerator: np.ndarray
    """Catalog accelerator name per group (dtype object or str)."""
    gpus_per_node: np.ndarray
    """int: accelerators used on each node of the group."""
    nodes: np.ndarray
    """int: nodes in the group; 0 means the group is absent."""
    link_index: np.ndarray
    """int: index into :attr:`links` of the group's node links."""
    gpu_memory_gib: np.ndarray
    """float: memory of one accelerator in the group."""
    links: tuple[NodeLinks, ...]
    """The distinct node links the groups use (see :mod:`lightning_srifty.core.links`)."""
    instance_type: np.ndarray | None = None
    """Instance type name per group (dtype object or str; ``None``: not known, as for
    synthetic candidates): where a probe refitted an instance type's own constants."""
    vcpus: np.ndarray | None = None
    """float: vCPUs of one node of the group (``None`` or 0: not known), for the data
    loader's workers (:class:`~lightning_srifty.core.profile.DataLoading`)."""

    def single_type(self) -> np.ndarray:
        """Per candidate, the one instance type all its groups use (``""`` for a mix or
        when the types are not known)."""
        n = self.size
        if self.instance_type is None:
            return np.full(n, "", dtype=object)
        present = self.nodes > 0
        names = np.where(present, self.instance_type, "").astype(object)
        first = names[np.arange(n), np.argmax(present, axis=1)] if n else names[:, 0]
        same = np.all(~present | (names == first[:, None]), axis=1)
        return np.where(same, first, "").astype(object)

    def take(self, rows: np.ndarray) -> CandidateArrays:
        """The candidates at ``rows`` (an index or boolean mask)."""
        return CandidateArrays(
            self.accelerator[rows],
            self.gpus_per_node[rows],
            self.nodes[rows],
            self.link_index[rows],
            self.gpu_memory_gib[rows],
            self.links,
            None if self.instance_type is None else self.instance_type[rows],
            None if self.vcpus is None else self.vcpus[rows],
        )

    def link_columns(self) -> LinkColumns:
        """The groups' links as numpy columns (shape (n, G))."""
        return LinkColumns.build(self.links, self.link_index)

    @property
    def size(self) -> int:
        return int(self.nodes.shape[0])

    @staticmethod
    def from_clusters(clusters: Sequence[Cluster]) -> CandidateArrays:
        """Packs :class:`Cluster` objects (slow path, for single predictions and tests)."""
        n = len(clusters)
        width = max((len(c.groups) for c in clusters), default=1)
        acc = np.full((n, width), "", dtype=object)
        gpn = np.zeros((n, width), dtype=np.int64)
        nodes = np.zeros((n, width), dtype=np.int64)
        link_index = np.zeros((n, width), dtype=np.int64)
        mem = np.zeros((n, width), dtype=np.float64)
        types = np.full((n, width), "", dtype=object)
        vcpus = np.zeros((n, width), dtype=np.float64)
        links: dict[NodeLinks, int] = {}
        for i, cluster in enumerate(clusters):
            for j, group in enumerate(cluster.groups):
                acc[i, j] = group.offer.accelerator
                types[i, j] = group.offer.instance_type
                gpn[i, j] = group.gpus_per_node
                nodes[i, j] = group.nodes
                link_index[i, j] = links.setdefault(group.offer.node_links, len(links))
                mem[i, j] = group.offer.gpu_memory_gib
                vcpus[i, j] = group.offer.vcpus
        return CandidateArrays(acc, gpn, nodes, link_index, mem, tuple(links), types, vcpus)


@dataclass(frozen=True)
class StepTimeArrays:
    """The model's answer for ``n`` candidates."""

    step_s: np.ndarray
    """(n,) predicted seconds per synchronous step."""
    low_s: np.ndarray
    """(n,) lower end of the prediction interval."""
    high_s: np.ndarray
    """(n,) upper end of the prediction interval."""
    fits: np.ndarray
    """(n,) bool: every group holds the model at its local batch."""
    local_batch: np.ndarray
    """(n, G) int: samples per GPU per step assigned to each group (0 where absent)."""
    global_batch: np.ndarray
    """(n,) int: samples per step across the cluster."""
    validation_s: np.ndarray | None = None
    """(n,) validation seconds per training batch (the profile's passes on each
    candidate; :mod:`~lightning_srifty.core.validation`), not part of the step; zeros
    without validation (``None`` only where an answer was built by hand)."""
