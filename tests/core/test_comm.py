"""All-reduce costs and the bucket/backward overlap simulation, against hand values."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_srifty.core.comm import (
    bucket_count,
    buckets_from_layers,
    exposed_allreduce_s,
    hierarchical_allreduce_s,
    pollux_overlap,
    ring_allreduce_s,
    simulate_overlap,
    tree_allreduce_s,
)


def test_ring_matches_the_textbook_formula() -> None:
    # p=4, S=1e9 B, beta=1e10 B/s, alpha=1e-5 s: 6 alpha + 1.5 S/beta
    got = ring_allreduce_s(1e9, 4, 1e10, 1e-5)
    assert float(got) == pytest.approx(6e-5 + 0.15)


def test_ring_is_free_on_one_worker_and_vectorises() -> None:
    got = ring_allreduce_s(1e9, np.array([1, 2, 8]), 1e9, 0.0)
    assert got.tolist() == pytest.approx([0.0, 1.0, 1.75])


def test_latency_is_paid_per_message() -> None:
    one = ring_allreduce_s(1e6, 2, 1e12, 1e-3, messages=1)
    ten = ring_allreduce_s(1e6, 2, 1e12, 1e-3, messages=10)
    assert float(ten - one) == pytest.approx(9 * 2e-3)


def test_hierarchical_splits_intra_and_inter_node() -> None:
    intra, inter = hierarchical_allreduce_s(8e8, 4, 2, 1e10, 0.0, 1e9, 0.0)
    assert float(intra) == pytest.approx(1.5 * 8e8 / 1e10)
    assert float(inter) == pytest.approx(1.0 * 8e8 / 1e9)
    intra1, inter1 = hierarchical_allreduce_s(8e8, 4, 1, 1e10, 0.0, 1e9, 0.0)
    assert float(inter1) == 0.0 and float(intra1) == float(intra)


def test_tree_moves_what_the_ring_moves_but_pays_log_hops() -> None:
    # two nodes: each tree is a pair, every node moves S; many nodes: inner nodes 2S
    assert float(tree_allreduce_s(1e9, 2, 1e9, 0.0)) == pytest.approx(1.0)
    assert float(tree_allreduce_s(1e9, 16, 1e9, 0.0)) == pytest.approx(2 * 15 / 16)
    # 16 participants: 2*ceil(log2 16) = 8 latency hops, the ring would pay 30
    assert float(tree_allreduce_s(1e9, 16, 1e9, 1e-3)) == pytest.approx(2 * 15 / 16 + 8e-3)
    assert float(ring_allreduce_s(0.0, 16, 1e9, 1e-3)) == pytest.approx(30e-3)


def test_pollux_overlap_between_sum_and_max() -> None:
    assert float(pollux_overlap(3.0, 4.0, 1.0)) == pytest.approx(7.0)
    assert float(pollux_overlap(3.0, 4.0, 2.0)) == pytest.approx(5.0)
    big = float(pollux_overlap(3.0, 4.0, 10.0))
    assert 4.0 < big < 4.1
    assert float(pollux_overlap(1e-200, 0.0, 10.0)) == pytest.approx(1e-200)


def test_fluid_overlap_has_the_textbook_limits() -> None:
    # no overlap at all: the whole all-reduce is exposed
    assert float(exposed_allreduce_s(0.3, 1.0, 1.0, 0.0)) == pytest.approx(0.3)
    # fast network: only the tail that is ready when backward ends is left
    assert float(exposed_allreduce_s(0.3, 1.0, 0.2, 0.8)) == pytest.approx(0.06)
    # slow network: everything after the window opens, minus the window
    got = exposed_allreduce_s(np.array([2.0, 0.5]), np.array([1.0, 1.0]), 0.2, 0.8)
    assert got.tolist() == pytest.approx([1.2, 0.1])


@pytest.mark.parametrize("comm", [0.05, 0.4, 0.9, 3.0])
def test_fluid_overlap_is_the_limit_of_many_small_buckets(comm: float) -> None:
    tail, window, k = 0.3, 0.6, 2000
    ready = np.concatenate([np.linspace(1 - window, 1.0, k, endpoint=False)[1:], [1.0, 1.0]])
    share = np.concatenate([np.full(k - 1, (1 - tail) / (k - 1)), [0.0, tail]])
    costs = [np.array([comm * x]) for x in share]
    _, simulated = simulate_overlap(np.array([1.0]), ready, costs)
    fluid = exposed_allreduce_s(comm, 1.0, tail, window)
    assert float(simulated[0]) == pytest.approx(float(fluid), abs=2e-3)


def test_event_simulation_hides_comm_that_fits_inside_backward() -> None:
    end, exposed = simulate_overlap(
        np.array([1.0]), np.array([0.25, 0.5]), [np.array([0.2]), np.array([0.2])]
    )
    # bucket 0: 0.25 -> 0.45; bucket 1: 0.5 -> 0.7; backward ends at 1.0
    assert end[0] == pytest.approx(1.0) and exposed[0] == pytest.approx(0.0)


def test_event_simulation_queues_buckets_on_one_stream() -> None:
    _, exposed = simulate_overlap(
        np.array([1.0, 1.0]),
        np.array([0.5, 1.0]),
        [np.array([1.0, 0.3]), np.array([0.1, 0.3])],
    )
    # candidate 0: 0.5 -> 1.5, then 1.5 -> 1.6: 0.6 exposed
    # candidate 1: 0.5 -> 0.8, then ready at 1.0 -> 1.3: 0.3 exposed
    assert exposed.tolist() == pytest.approx([0.6, 0.3])


def test_buckets_fill_in_reverse_layer_order() -> None:
    sizes, ready = buckets_from_layers([10, 20, 30], [0.1, 0.2, 0.3], bucket_bytes=25)
    assert sizes.tolist() == [30, 30]
    assert ready.tolist() == pytest.approx([0.5, 1.0])


def test_bucket_count_uses_ddp_default() -> None:
    assert bucket_count(0) == 0
    assert bucket_count(1) == 1
    assert bucket_count(25 * 1024 * 1024 + 1) == 2
