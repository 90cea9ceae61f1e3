"""The links a node's GPUs talk over, in absolute physical terms.

A calibration must mean the same thing on every instance type, so bandwidth is never a
fitted fraction of one cluster's NIC. Each node is described by what is published
about it (:class:`NodeLinks`): the GPU-to-GPU link and its nominal rate, the network
transport NCCL uses between nodes, the NIC's sustained and burst rate, how many
network rails the GPUs can drive in parallel, the cloud's cap on one TCP flow and the
number of sockets NCCL opens per connection. The model then takes

* inside a node: ``nominal per-GPU rate × efficiency[NVLink|PCIe]``;
* between nodes over TCP: ``min(NIC, flows × per-flow cap, sockets × one socket's
  rate) × efficiency[tcp]``, with ``sockets = NCCL channels × sockets per connection``
  (NCCL is paced by its slowest socket, and one socket driven by one thread has a rate
  of its own, the fitted ``tcp_flow_gbps``) and as many capped flows as sockets,
  except through a tunnel, which the cloud counts as one flow per host pair;
* between nodes over RDMA (EFA, InfiniBand): ``NIC × share of rails in use ×
  efficiency[efa|ib]`` (a ring that uses one GPU per node drives one HCA of a
  rail-optimised DGX, not all eight).

Only the efficiencies (one per transport) and one socket's rate are fitted, so what
the Pollux T4 cluster teaches about TCP applies to every TCP instance, and nothing
about TCP leaks into NVLink or InfiniBand.

How NCCL is *deployed* matters as much as the wires. When every GPU runs in its own
container with its own hostname (``isolated_gpus``: how AdaptDL, which measured every
trace folder, runs one pod per replica), NCCL's host hash differs between GPUs of one
machine, so it never uses NVLink, P2P or shared memory: every hop takes the network
transport, over the host's TCP stack or through the HCA. A SkyPilot VM runs all its
GPUs under one host name, so NVLink and PCIe carry the intra-node hops.

Sources of the constants below are named where they are defined.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

INTERCONNECTS = ("NVSwitch", "NVLink", "PCIe", "none")
"""GPU-to-GPU link inside a node: NVLink through NVSwitch, a direct NVLink mesh, PCIe,
or nothing (one accelerator)."""
TRANSPORTS = ("tcp", "efa", "ib")
"""How NCCL moves data between nodes: its socket transport over TCP, libfabric over AWS
EFA (aws-ofi-nccl), or InfiniBand verbs."""

PCIE_X16_GBYTES_S = {3: 15.75, 4: 31.5, 5: 63.0}
"""Nominal one-direction rate of a x16 link per PCIe generation (PCI-SIG: 8, 16 and
32 GT/s per lane with 128b/130b encoding)."""
NVLINK_V100_GBYTES_S = 150.0
"""Per-GPU one-direction NVLink rate of a V100 SXM2 (6 links x 25 GB/s, NVIDIA V100
datasheet); the fallback when a row names NVLink but no rate."""

NCCL_TCP_CHANNELS = 2
"""Channels NCCL runs over a single NIC: its ring search finds one channel per NIC and
then duplicates every channel (NVIDIA/nccl ``src/graph/connect.cc``,
``ncclTopoPostset``: ``nChannels = min(MAXCHANNELS, nChannels*2)``). Each channel has
its own connection to the next node."""
NCCL_AWS_SOCKETS = 16
"""Sockets per NCCL connection when NCCL can read the NIC's PCI vendor and it is AWS's
ENA (0x1d0f): 2 helper threads x 8 sockets (``src/transport/net_socket.cc``,
``ncclSocketGetNsockNthread``, since NCCL 2.4.8)."""
NCCL_DEFAULT_SOCKETS = 1
"""Sockets per connection otherwise: on-premises NICs, and any NCCL running in a
container with its own network namespace (a Kubernetes pod's veth has no PCI vendor),
fall back to the main thread and one socket."""
AWS_FLOW_CAP_GBPS = 5.0
"""AWS caps one TCP flow (5-tuple) at 5 Gbit/s between instances that are not in the
same cluster placement group (EC2 User Guide, "Amazon EC2 instance network
bandwidth"). SkyPilot creates no placement group, so this is the cap its clusters see."""
AWS_PLACEMENT_GROUP_FLOW_CAP_GBPS = 10.0
"""The same cap inside a cluster placement group (same page)."""
IB_HCA_GBPS = 200.0
"""Rate of one InfiniBand HDR port (NVIDIA ConnectX-6); a node with more than this has
one HCA per GPU rail (a DGX A100 has eight for compute: NVIDIA DGX A100 user guide)."""
EFA_MODES = ("all", "one", "off")
"""How a SkyPilot cluster of an EFA-capable type is launched. ``"all"``: with
``network_tier: best`` and ``aws.use_internal_ips: true``, SkyPilot attaches one EFA
interface per network card, up to the type's maximum (``sky/provision/aws/instance.py``,
``_create_instances``: device 0 plus ``efa-only`` interfaces on cards 1..n-1); ``"one"``:
``network_tier: best`` without internal IPs, one EFA interface on card 0 (SkyPilot warns
and uses one, ``sky/clouds/aws.py``, ``make_deploy_resources_variables``); ``"off"``:
the standard tier, ENA and TCP only."""
DEFAULT_EFA_MODE = "all"
"""EFA as AWS ships the type: every interface (see :data:`EFA_MODES`)."""


@dataclass(frozen=True)
class NodeLinks:
    """Published link facts of one node type, plus how NCCL is deployed on it."""

    interconnect: str
    """One of :data:`INTERCONNECTS`."""
    intra_gbytes_s: float
    """Nominal one-direction GPU-to-GPU rate per GPU in GB/s (0 for ``"none"``)."""
    transport: str = "tcp"
    """One of :data:`TRANSPORTS`."""
    nic_gbps: float = 0.0
    """Sustained (baseline) network rate of the node in Gbit/s, all rails together."""
    peak_gbps: float = 0.0
    """Burst rate in Gbit/s (equal to ``nic_gbps`` unless the type is "up to" a peak)."""
    rails: int = 1
    """Network rails (HCAs, EFA interfaces) the node's GPUs can drive in parallel."""
    flow_cap_gbps: float = math.inf
    """Cap on one TCP flow in Gbit/s (``inf`` where the network imposes none)."""
    sockets_per_connection: int = NCCL_AWS_SOCKETS
    """Sockets NCCL opens per connection (TCP only)."""
    isolated_gpus: bool = False
    """Each GPU runs in its own container with its own host name, so NCCL sends even
    intra-node traffic through its network transport (see the module docstring)."""
    encapsulated: bool = False
    """Traffic between nodes is tunnelled (a Kubernetes overlay such as Calico's IPIP).
    AWS counts a flow by its 5-tuple only for TCP and UDP; for other protocols after
    the IP header it uses the 3-tuple of source, destination and protocol (EC2 User
    Guide, "Amazon EC2 instance network bandwidth"), so all tunnelled traffic from one
    host to another is a single capped flow, whatever NCCL's socket count."""
    socket_gbps: float = 0.0
    """Rate of the one interface TCP sockets leave through (0: ``peak_gbps``). On a type
    with several network cards each card has its own share of the bandwidth and the
    primary ENA interface sits on card 0, so sockets see one card's rate; on an EFA
    node this is the rate NCCL falls back to when it must use sockets."""

    def __post_init__(self) -> None:
        if self.interconnect not in INTERCONNECTS:
            raise ValueError(f"interconnect {self.interconnect!r}; valid: {INTERCONNECTS}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport {self.transport!r}; valid: {TRANSPORTS}")

    @property
    def uses_efa(self) -> bool:
        """NCCL crosses nodes over EFA (libfabric): a SkyPilot task must ask for it with
        ``network_tier: best``."""
        return self.transport == "efa"

    @property
    def socket_rate_gbps(self) -> float:
        """The rate TCP sockets can reach through the node's socket interface."""
        peak = max(self.peak_gbps, self.nic_gbps)
        return min(self.socket_gbps, peak) if self.socket_gbps > 0 else peak

    @property
    def flows(self) -> int:
        """TCP flows NCCL runs per connection: channels x sockets."""
        return NCCL_TCP_CHANNELS * self.sockets_per_connection

    @property
    def capped_flows(self) -> int:
        """Flows the cloud's per-flow cap applies to: one per host pair when tunnelled."""
        return 1 if self.encapsulated else self.flows

    def describe(self) -> str:
        inside = (
            "one GPU"
            if self.interconnect == "none"
            else f"{self.interconnect} {self.intra_gbytes_s:g} GB/s per GPU"
        )
        net = f"{self.transport.upper()} {self.nic_gbps:g} Gbps"
        if self.peak_gbps > self.nic_gbps:
            net += f" (up to {self.peak_gbps:g})"
        if self.transport == "tcp" and math.isfinite(self.flow_cap_gbps):
            net += (
                f", {self.sockets_per_connection} socket(s) x {NCCL_TCP_CHANNELS} channels"
                f" at {self.flow_cap_gbps:g} Gbps per flow"
            )
        if self.rails > 1:
            net += f", {self.rails} rails"
        if self.transport == "tcp" and self.socket_gbps and self.socket_gbps < self.nic_gbps:
            net += f", sockets through one {self.socket_gbps:g} Gbps card"
        if self.encapsulated and self.transport == "tcp":
            net += ", tunnelled (one flow per host pair)"
        if self.isolated_gpus:
            inside += " (unused: one container per GPU, NCCL's network transport instead)"
        return f"{inside}; {net}"


def pcie_gbytes_s(generation: int | None) -> float:
    """Nominal x16 rate of a PCIe generation; Gen3 when unknown (the slowest in use)."""
    return PCIE_X16_GBYTES_S.get(int(generation or 3), PCIE_X16_GBYTES_S[3])


def intra_rate(interconnect: str, nvlink_gbytes_s: float, pcie_gen: int | None) -> float:
    """Nominal per-GPU GPU-to-GPU rate (GB/s) for an interconnect kind."""
    if interconnect in ("NVSwitch", "NVLink"):
        return float(nvlink_gbytes_s) if nvlink_gbytes_s > 0 else NVLINK_V100_GBYTES_S
    if interconnect == "PCIe":
        return pcie_gbytes_s(pcie_gen)
    return 0.0


def skypilot_vm_links(
    interconnect: str,
    intra_gbytes_s: float,
    nic_gbps: float,
    peak_gbps: float | None = None,
    *,
    efa_interfaces: int = 0,
    network_cards: int = 1,
    accelerators: int = 1,
    efa: str = DEFAULT_EFA_MODE,
) -> NodeLinks:
    """Links of an AWS instance as SkyPilot launches it.

    A type with several network cards shares its bandwidth among them (AWS EC2 User
    Guide, "Network cards": each card has its own bandwidth; the table's figure is the
    sum over cards, taken here as equal shares). SkyPilot's primary interface sits on
    card 0, so NCCL's sockets see one card's rate. Over TCP, NCCL sees ENA and opens
    :data:`NCCL_AWS_SOCKETS` sockets per connection, each flow capped at
    :data:`AWS_FLOW_CAP_GBPS` (no placement group).

    An EFA-capable type (``efa_interfaces > 0``) launched with ``network_tier: best``
    runs NCCL over libfabric on its EFA interfaces (``efa``: how many, see
    :data:`EFA_MODES`): the node's rate is interfaces x one card's rate. The interfaces
    form rails: a GPU drives the interfaces of its own PCIe switch, so a node that uses
    ``k`` of its ``g`` GPUs reaches ``k/g`` of it (``rails = min(interfaces, g)``).
    """
    if efa not in EFA_MODES:
        raise ValueError(f"efa {efa!r}; valid: {EFA_MODES}")
    cards = max(int(network_cards), 1)
    per_card = float(nic_gbps) / cards
    peak = max(float(peak_gbps or nic_gbps), float(nic_gbps))
    socket = peak / cards
    if efa != "off" and efa_interfaces > 0:
        used = int(efa_interfaces) if efa == "all" else 1
        used = min(used, cards)
        rate = per_card * used
        rails = max(min(used, max(int(accelerators), 1)), 1)
        return NodeLinks(
            interconnect, intra_gbytes_s, "efa", rate, rate, rails, AWS_FLOW_CAP_GBPS,
            NCCL_AWS_SOCKETS, socket_gbps=socket,
        )  # fmt: skip
    return NodeLinks(
        interconnect,
        intra_gbytes_s,
        "tcp",
        float(nic_gbps),
        peak,
        1,
        AWS_FLOW_CAP_GBPS,
        NCCL_AWS_SOCKETS,
        socket_gbps=socket if cards > 1 else 0.0,
    )


def fabric_links(
    interconnect: str,
    intra_gbytes_s: float,
    nic_gbps: float,
    gpus_per_node: int,
    fabric: str,
    nodes: int = 2,
    *,
    sockets_per_connection: int = NCCL_DEFAULT_SOCKETS,
    isolated_gpus: bool = True,
    encapsulated: bool = True,
) -> NodeLinks:
    """Links of a measured cluster described in words (a trace's ``hardware.json``).

    ``fabric`` is the ``inter_node_fabric`` sentence: "InfiniBand" means verbs over
    one HCA per :data:`IB_HCA_GBPS` (at most one per GPU), "EFA" (unless "no EFA")
    libfabric, anything else NCCL's sockets over TCP; "placement group" means AWS's
    10 Gbps flow cap, other AWS wording ("ENA", "AWS", "EC2") the 5 Gbps cap, and an
    on-premises network no cap. Trace folders were measured by AdaptDL, which runs one
    Kubernetes pod per replica, each with one GPU and its own host name
    (adaptdl ``sched/adaptdl_sched/controller.py``, ``_create_pod``): NCCL cannot read
    the NIC's vendor from the pod's veth (one socket) and its host hash (host name +
    boot id, ``getHostHash``) differs between pods of one machine, so it treats every
    GPU as a host of its own (``isolated_gpus``); pod traffic between nodes crosses the
    cluster's overlay (``encapsulated``: Calico IPIP on the Pollux cluster, adaptdl
    ``benchmark/main.tf``), which matters only where a cloud caps flows. A single-node
    cluster's fabric carries none of its traffic: its pods talk over the host's own TCP
    stack (an RDMA device inside pods is a multi-node cluster's set-up).
    """
    text = fabric.lower() if nodes > 1 else "single node"
    if "infiniband" in text or "infini band" in text:
        rails = int(min(max(round(nic_gbps / IB_HCA_GBPS), 1), max(gpus_per_node, 1)))
        return NodeLinks(
            interconnect, intra_gbytes_s, "ib", nic_gbps, nic_gbps, rails,
            isolated_gpus=isolated_gpus,
        )  # fmt: skip
    if "efa" in text and "no efa" not in text and "without efa" not in text:
        return NodeLinks(
            interconnect, intra_gbytes_s, "efa", nic_gbps, nic_gbps, 1,
            isolated_gpus=isolated_gpus,
        )  # fmt: skip
    if "placement group" in text:
        cap = AWS_PLACEMENT_GROUP_FLOW_CAP_GBPS
    elif any(word in text for word in ("ena", "aws", "ec2", "amazon")):
        cap = AWS_FLOW_CAP_GBPS
    else:
        cap = math.inf
    return NodeLinks(
        interconnect, intra_gbytes_s, "tcp", nic_gbps, nic_gbps, 1, cap, sockets_per_connection,
        isolated_gpus, encapsulated,
    )  # fmt: skip


def loopback_links(interconnect: str, gbps: float, *, gloo: bool = False) -> NodeLinks:
    """Processes on one machine talking over loopback: no cap, one socket.

    With ``gloo`` (CPU processes) every hop, even between processes of one machine,
    takes TCP sockets: ``ProcessGroupGloo`` builds its devices with gloo's TCP
    transport (``createDefaultDevice`` in ``torch/csrc/distributed/c10d/
    ProcessGroupGloo.cpp``) and has no shared-memory or peer-to-peer path, so the
    processes are isolated hosts to the model, with TCP's per-hop latency.
    """
    rate = intra_rate(interconnect, 0.0, None)
    return NodeLinks(
        interconnect, rate, "tcp", gbps, gbps, 1, math.inf, NCCL_DEFAULT_SOCKETS,
        isolated_gpus=gloo,
    )  # fmt: skip


def default_links(intra_node_link: str, network_gbps: float) -> NodeLinks:
    """Links for an offer that carries no table row: a SkyPilot VM with a V100-class
    NVLink or a Gen3 PCIe link (the conservative figures)."""
    kind = {"NVLink": "NVLink", "PCIe": "PCIe"}.get(intra_node_link, "none")
    return skypilot_vm_links(kind, intra_rate(kind, 0.0, 3), network_gbps)


@dataclass(frozen=True)
class LinkColumns:
    """:class:`NodeLinks` as numpy columns, indexed like a candidate's groups."""

    interconnect: np.ndarray
    """int8 index into :data:`INTERCONNECTS`."""
    intra_bytes_s: np.ndarray
    transport: np.ndarray
    """int8 index into :data:`TRANSPORTS`."""
    nic_bytes_s: np.ndarray
    peak_bytes_s: np.ndarray
    rails: np.ndarray
    flow_cap_bytes_s: np.ndarray
    socket_bytes_s: np.ndarray
    """Rate TCP sockets reach through the node's socket interface (one card)."""
    flows: np.ndarray
    capped_flows: np.ndarray
    isolated: np.ndarray
    """bool: intra-node hops take the network transport."""
    encapsulated: np.ndarray

    @staticmethod
    def build(links: Sequence[NodeLinks], index: np.ndarray) -> LinkColumns:
        """Columns for ``index`` (any shape) into the distinct ``links``."""
        if not links:
            links = (default_links("none", 0.0),)
        idx = np.asarray(index, dtype=np.int64)

        def col(values: Sequence[float], dtype: type = np.float64) -> np.ndarray:
            return np.asarray(values, dtype=dtype)[idx]

        return LinkColumns(
            interconnect=col([INTERCONNECTS.index(x.interconnect) for x in links], np.int8),
            intra_bytes_s=col([x.intra_gbytes_s * 1e9 for x in links]),
            transport=col([TRANSPORTS.index(x.transport) for x in links], np.int8),
            nic_bytes_s=col([x.nic_gbps * 1e9 / 8 for x in links]),
            peak_bytes_s=col([max(x.peak_gbps, x.nic_gbps) * 1e9 / 8 for x in links]),
            rails=col([max(x.rails, 1) for x in links]),
            flow_cap_bytes_s=col([x.flow_cap_gbps * 1e9 / 8 for x in links]),
            socket_bytes_s=col([x.socket_rate_gbps * 1e9 / 8 for x in links]),
            flows=col([x.flows for x in links]),
            capped_flows=col([x.capped_flows for x in links]),
            isolated=col([x.isolated_gpus for x in links], bool),
            encapsulated=col([x.encapsulated for x in links], bool),
        )


def inter_node_bytes_s(
    cols: LinkColumns,
    gpus_used: np.ndarray,
    efficiency: Sequence[float],
    tcp_flow_gbps: float,
    sockets_only: np.ndarray | None = None,
) -> np.ndarray:
    """Effective per-node network rate (bytes/s) for each group.

    Args:
        cols: the groups' links.
        gpus_used: GPUs each node of the group runs (same shape as the columns).
        efficiency: one factor per :data:`TRANSPORTS` entry, in that order.
        tcp_flow_gbps: what one TCP socket driven by one NCCL thread carries at most.
        sockets_only: where ``True``, an RDMA node talks over NCCL's sockets instead
            (a cluster mixing EFA and TCP nodes: NCCL needs one network for every rank).
    """
    transport = np.asarray(cols.transport)
    if sockets_only is not None:
        transport = np.where(np.asarray(sockets_only, dtype=bool), 0, transport)
    eff = np.asarray(efficiency, dtype=np.float64)[transport]
    sockets = cols.flows * tcp_flow_gbps * 1e9 / 8
    capped = cols.capped_flows * cols.flow_cap_bytes_s
    tcp = np.minimum(cols.socket_bytes_s, np.minimum(capped, sockets))
    share = np.minimum(np.maximum(np.asarray(gpus_used, dtype=np.float64), 1.0), cols.rails)
    rdma = cols.nic_bytes_s * share / cols.rails
    return np.where(transport == 0, tcp, rdma) * eff


def intra_node_bytes_s(
    cols: LinkColumns,
    efficiency: Sequence[float],
    net_efficiency: Sequence[float],
    tcp_flow_gbps: float,
) -> np.ndarray:
    """Effective per-GPU rate inside a node (bytes/s); ``inf`` for ``"none"``.

    ``efficiency`` has one factor per :data:`INTERCONNECTS` entry (NVSwitch and NVLink
    usually share one). Isolated GPUs talk through the network transport instead: over
    TCP the host's own stack (no NIC, no cloud cap: only the sockets' rate), over
    RDMA one HCA rail each.
    """
    eff = np.asarray(efficiency, dtype=np.float64)[cols.interconnect]
    rate = cols.intra_bytes_s * eff
    direct = np.where(rate > 0, rate, np.inf)
    net_eff = np.asarray(net_efficiency, dtype=np.float64)[cols.transport]
    local_tcp = cols.flows * tcp_flow_gbps * 1e9 / 8
    rail = cols.nic_bytes_s / cols.rails
    local = np.where(cols.transport == 0, local_tcp, rail) * net_eff
    return np.where(cols.isolated, local, direct)
