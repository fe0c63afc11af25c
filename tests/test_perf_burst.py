"""A shaped link's burst (perf/comm.burst_seconds): a collective across nodes after the link
idled longer than in calibration gets the credit the idle time earned, up to the burst."""
import dataclasses

import pytest

from minipar.config import TrainConfig
from minipar.perf import comm as pcomm
from minipar.perf.estimate import predict, small_all_reduces_seconds
from minipar.perf.profile import Profile

MIB = 1 << 20
BW, BURST, GAP_CAL = 1.25e8, 500e3, 1e-3
CURVE = [[4096, 1e-3], [MIB, 12e-3], [8 * MIB, 100e-3]]
LINK = Profile("link", kind="measured", peak_flops={"fp32": 1e10}, mem_bw=1e10,
               ranks_per_node=2, cores_per_node=8, nodes_per_host=1,
               links={"intra": {"alpha": 1e-5, "bw": 1e9}, "inter": {"alpha": 1e-4, "bw": BW}},
               collectives={k: {"4:inter": CURVE, "2:inter": CURVE, "2:intra": CURVE}
                            for k in ("all_reduce", "all_gather", "reduce_scatter", "p2p")},
               cost_params={"burst_inter": BURST}, efficiency={"comm_gap_s": GAP_CAL})


def seconds(gap, where="inter", prof=LINK, kind="all_reduce", p=4):
    return pcomm.collective_seconds(prof, kind, p, MIB, where, gap)


def test_the_calibrated_gap_gives_the_curve():
    assert seconds(None) == seconds(GAP_CAL) == pytest.approx(12e-3)


def test_a_long_idle_saves_the_burst_over_what_calibration_earned():
    # 2(p-1)/p · 1 MiB cross the link: more than the burst, so all of it is used
    saved = (BURST - GAP_CAL * BW) / BW
    assert seconds(1.0) == pytest.approx(12e-3 - saved)
    assert seconds(1.0) == seconds(10.0)                       # the bucket holds no more
    assert seconds(2e-3) == pytest.approx(12e-3 - GAP_CAL * BW / BW)   # credit grows with the idle
    assert seconds(0.0) == pytest.approx(12e-3 + GAP_CAL)      # none earned: slower than calibrated


def test_a_transfer_smaller_than_the_burst_saves_only_its_bytes():
    """A 300 kB send after a long idle passes all 300 kB on credit, 175 kB more than
    calibration's 1 ms earned (1.4 ms); a 1 MiB send uses the whole 500 kB (3 ms)."""
    def saved(nbytes):
        return (pcomm.collective_seconds(LINK, "p2p", 2, nbytes, "inter")
                - pcomm.collective_seconds(LINK, "p2p", 2, nbytes, "inter", 1.0))
    assert saved(300e3) == pytest.approx(1.4e-3)
    assert saved(MIB) == pytest.approx(3e-3)


def test_no_burst_inside_a_node_nor_without_the_calibrated_gap():
    assert seconds(1.0, where="intra") == seconds(None, where="intra")
    bare = dataclasses.replace(LINK, efficiency={})
    assert seconds(1.0, prof=bare) == seconds(None, prof=bare)
    flat = dataclasses.replace(LINK, cost_params={})
    assert seconds(1.0, prof=flat) == seconds(None, prof=flat)


def test_tp_across_nodes_gets_the_credit_of_the_compute_between_its_collectives():
    c = TrainConfig(model="small", batch_size=16, data="stdlib-bytes", tp=4).resolve(4)
    with_burst = predict(c, LINK, ranks_per_node=2)
    without = predict(c, dataclasses.replace(LINK, efficiency={}), ranks_per_node=2)
    assert 0 < with_burst.breakdown["tp_s"] < without.breakdown["tp_s"]


def test_a_step_agrees_on_the_norm_and_the_loss():
    one = TrainConfig(model="small", batch_size=16, data="stdlib-bytes").resolve(1)
    assert small_all_reduces_seconds(LINK, one, 2) == 0.0
    dp4 = TrainConfig(model="small", batch_size=16, data="stdlib-bytes", dp=4).resolve(4)
    # the world's norm and the loss over dp: two latency-bound all-reduces across the nodes
    assert small_all_reduces_seconds(LINK, dp4, 2) == pytest.approx(2 * 1e-3)
