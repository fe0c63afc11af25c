"""The two-level cost model (comm/two_level.py): collectives as steps of messages, each
priced by the link it crosses.  Its bytes per rank equal the code's traffic counters
(tests/scripts/comm_traffic.py); here its prices: with one kind of link it is the flat
model, and across a slow link it sees what the flat model cannot."""
from dataclasses import replace

import pytest

from minipar.comm import cost_model, two_level
from minipar.comm.cost_params import CostParams

FLAT = CostParams(alpha=2e-5, beta=5e-10, gamma=1e-10)             # one β, one γ
SLOW = replace(FLAT, alpha_inter=1e-4, beta_inter=8e-9, ranks_per_node=2)   # ~1 Gbit/s


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("nbytes", [64, 4096, 1 << 18])
def test_one_kind_of_link_is_the_flat_model(p, nbytes):
    """Every rank its own node, the wire as fast as the node: the flat ring and tree."""
    same = replace(FLAT, alpha_inter=FLAT.alpha, beta_inter=FLAT.beta, ranks_per_node=1)
    for algorithm in ("ring", "tree"):
        assert cost_model.predict(algorithm, p, nbytes, same) == pytest.approx(
            cost_model.predict(algorithm, p, nbytes, FLAT), rel=1e-12)


def test_a_ring_over_two_nodes_pays_the_wire_every_step():
    """Nodes {0,1}, {2,3}: each of the 2(p-1) steps sends S/p from 1 to 2 and from 3 to 0."""
    S = 64 << 20
    got = cost_model.predict("ring", 4, S, SLOW)
    wire = 2 * 3 * (S / 4 * SLOW.beta_inter)
    assert wire < got < wire * 1.1


def test_hierarchical_sends_a_qth_across_and_wins_on_a_slow_wire():
    S = 64 << 20
    ring, hier = (cost_model.predict(a, 4, S, SLOW) for a in ("ring", "hierarchical"))
    # across: a ring of 2 on S/2, both ranks of a node at once through its one link:
    # 2 steps of 2 · S/4 out of each node
    across = 2 * (2 * S / 4) * SLOW.beta_inter
    assert across < hier < across * 1.15
    assert hier < 0.75 * ring
    assert cost_model.choose(4, S, SLOW, ("ring", "tree", "hierarchical")) == "hierarchical"
    assert cost_model.choose(4, 1 << 10, SLOW, ("ring", "recursive_doubling", "hierarchical")) \
        == "recursive_doubling"                               # small: fewest wire crossings


def test_a_node_link_is_shared_by_every_message_through_it():
    msgs = [(0, 2, 1000.0), (1, 3, 1000.0)]                  # two flows out of node 0
    one = two_level.step_seconds(msgs[:1], 0.0, 2, SLOW)
    both = two_level.step_seconds(msgs, 0.0, 2, SLOW)
    assert both == pytest.approx(SLOW.alpha_inter + 2000 * SLOW.beta_inter)
    assert both > one
    inside = two_level.step_seconds([(0, 1, 1000.0), (2, 3, 1000.0)], 0.0, 2, SLOW)
    assert inside == pytest.approx(FLAT.alpha + 1000 * FLAT.beta)


def test_groups_inside_one_node_use_the_flat_model():
    assert cost_model.predict("ring", 2, 1 << 20, SLOW) == cost_model.predict("ring", 2, 1 << 20, FLAT)
    assert not two_level.crosses_nodes(2, 2) and two_level.crosses_nodes(4, 2)


@pytest.mark.parametrize("p,q", [(6, 4), (5, 2)])
def test_uneven_nodes_reduce_to_leaders(p, q):
    """Nodes of unequal size: a binomial all-reduce inside each node (2(n-1)·S), a ring
    all-reduce of the whole S among the m node leaders (2(m-1)·S in all)."""
    S = 800.0
    sizes = [len(range(p)[i:i + q]) for i in range(0, p, q)]
    m = len(sizes)
    sent = two_level.bytes_sent("hierarchical", p, S, q)
    assert sum(sent) == pytest.approx(sum(2 * (n - 1) * S for n in sizes) + 2 * (m - 1) * S)


def test_a_shaped_links_burst_is_credited_where_the_link_idles():
    """A token bucket passes B bytes at once after idling, and a collective starts on
    idle links.  A ring keeps both ways of the link busy every step: it saves B in its
    first step, then earns credit only while it reduces and waits out α.  A tree
    reduces across one way and broadcasts back the other: each crossing finds a full B
    (the broadcast's way idled during the reduce)."""
    S, B = 4 << 20, 500e3
    shaped = replace(SLOW, burst_inter=B)
    ring_saved = cost_model.predict("ring", 4, S, SLOW) - cost_model.predict("ring", 4, S, shaped)
    not_sending = SLOW.alpha_inter + S / 4 * cost_model.gamma_of(SLOW, S / 4)
    assert B * SLOW.beta_inter < ring_saved <= B * SLOW.beta_inter + 2 * 3 * not_sending
    tree_saved = cost_model.predict("tree", 4, S, SLOW) - cost_model.predict("tree", 4, S, shaped)
    assert tree_saved == pytest.approx(2 * B * SLOW.beta_inter, rel=1e-9)


def test_a_winner_timed_without_hierarchical_does_not_hide_it():
    """A calibration that timed the flat algorithms only (winners_among empty: the four
    flat ones) must not stop auto from taking hierarchical where the two-level model
    prices it under that winner; one that timed hierarchical too and saw ring win keeps
    ring; flat candidates only: the winner decides, as before."""
    S = 8 << 20
    both = cost_model.FLAT + ("hierarchical",)
    assert cost_model.predict("hierarchical", 4, S, SLOW) < cost_model.predict("ring", 4, S, SLOW)
    flat_timed = replace(SLOW, winners=((S, "ring"),), winners_p=4)
    assert cost_model.choose(4, S, flat_timed, both) == "hierarchical"
    assert cost_model.choose(4, S, flat_timed) == "ring"
    all_timed = replace(flat_timed, winners_among=both)
    assert cost_model.choose(4, S, all_timed, both) == "ring"
    assert CostParams.from_dict(all_timed.to_dict()) == all_timed
