"""How an AWS instance's published network facts become the links NCCL uses.

Every expected figure is worked out by hand from the facts given to the function (AWS's
per-card bandwidth split, SkyPilot's EFA attachment, NCCL's socket counts), never read
back from the code under test.
"""

from __future__ import annotations

import math

import pytest

from lightning_srifty.core.links import NodeLinks, skypilot_vm_links


def test_an_efa_type_drives_every_interface_at_one_cards_rate() -> None:
    # a p5-like node: 3200 Gbps over 32 cards, one EFA interface on each, 8 GPUs
    links = skypilot_vm_links(
        "NVSwitch", 450.0, 3200.0, efa_interfaces=32, network_cards=32, accelerators=8
    )
    assert links.uses_efa and links.transport == "efa"
    assert links.nic_gbps == pytest.approx(32 * 3200.0 / 32)
    assert links.rails == 8  # four interfaces per GPU: eight GPU rails
    # with SkyPilot's default config (no internal IPs) only card 0's interface is used
    one = skypilot_vm_links(
        "NVSwitch", 450.0, 3200.0, efa_interfaces=32, network_cards=32, accelerators=8, efa="one"
    )
    assert one.uses_efa and one.nic_gbps == pytest.approx(100.0) and one.rails == 1


def test_tcp_on_a_type_with_several_cards_sees_one_card() -> None:
    # a p4d-like node on the standard tier: 400 Gbps over 4 cards, sockets on card 0
    links = skypilot_vm_links(
        "NVSwitch", 300.0, 400.0, efa_interfaces=4, network_cards=4, accelerators=8, efa="off"
    )
    assert not links.uses_efa
    assert links.socket_rate_gbps == pytest.approx(100.0)
    assert "one 100 Gbps card" in links.describe()


def test_a_type_without_efa_keeps_its_tcp_links() -> None:
    links = skypilot_vm_links("NVLink", 150.0, 25.0, efa_interfaces=0, network_cards=1)
    assert links == NodeLinks("NVLink", 150.0, "tcp", 25.0, 25.0, 1, 5.0, 16)
    assert not links.uses_efa and links.socket_rate_gbps == 25.0
    # a burst type's sockets may reach the peak
    burst = skypilot_vm_links("none", 0.0, 5.0, 25.0)
    assert burst.socket_rate_gbps == 25.0 and math.isfinite(burst.flow_cap_gbps)


def test_an_unknown_efa_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="efa 'maybe'"):
        skypilot_vm_links("none", 0.0, 5.0, efa="maybe")
