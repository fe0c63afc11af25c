"""The shared-core bound (perf/host.py): ranks sharing a host's cores cannot finish a
step faster than all their work over the cores; with a core per rank nothing changes."""
import dataclasses

from minipar.config import TrainConfig
from minipar.perf import host
from minipar.perf.estimate import predict
from minipar.perf.profile import Profile

# a CPU host of 2 cores running 2 nodes x 2 ranks (the simulated cluster), rates linear
# in the work (no measured curves), no fixed costs: each rank's work is its FLOPs and bytes
SHARED = Profile("shared", kind="measured", peak_flops={"fp32": 1e10}, mem_bw=1e10,
                 optimizer_s_per_param={"fp32": 1e-9}, ranks_per_node=2, cores_per_node=2,
                 nodes_per_host=2, links={"intra": {"alpha": 1e-5, "bw": 1e9},
                                          "inter": {"alpha": 1e-4, "bw": 1.25e8}})


def config(**kw):
    return TrainConfig(model="small", batch_size=16, data="stdlib-bytes", **kw)


def test_a_pipeline_on_shared_cores_takes_at_least_all_its_work_over_the_cores():
    """dp2 x pp2 on 4 ranks sharing 2 cores: its ranks' work together is at least the
    whole batch's on one rank, so the step is at least that over 2 cores — where the
    rank's own critical path (a quarter of the work plus the bubble) says less."""
    one = predict(config().resolve(1), SHARED, ranks_per_node=1)      # one rank: all the work
    assert one.step_s == one.breakdown["critical_path_s"]             # a core to itself
    four = predict(config(dp=2, pp=2, schedule="1f1b", microbatches=4).resolve(4), SHARED,
                   ranks_per_node=2)
    assert four.breakdown["critical_path_s"] < one.step_s / SHARED.cores_per_node
    assert four.step_s >= one.step_s / SHARED.cores_per_node
    assert four.step_s == four.breakdown["shared_cores_s"]


def test_a_core_per_rank_changes_nothing():
    """With a core per rank (16 cores, or as many as the 4 ranks, or nodes with cores of
    their own) every layout's step is its critical path: the prediction of the model
    without the bound (no core count at all)."""
    layouts = [dict(dp=4), dict(dp=2, tp=2), dict(dp=2, pp=2, schedule="1f1b", microbatches=4),
               dict(tp=4, zero=0)]
    for kw in layouts:
        c = config(**kw).resolve(4)
        plain = predict(c, dataclasses.replace(SHARED, cores_per_node=0), ranks_per_node=2)
        for prof in (dataclasses.replace(SHARED, cores_per_node=16),
                     dataclasses.replace(SHARED, cores_per_node=4),
                     dataclasses.replace(SHARED, nodes_per_host=1)):
            p = predict(c, prof, ranks_per_node=2)
            assert p.breakdown["shared_cores_s"] == 0.0, kw
            assert p.step_s == plain.step_s == p.breakdown["critical_path_s"], kw


def test_nodes_on_one_kernel_share_its_cores():
    class FakeMPI:
        def __init__(self, hosts):
            self.hosts = hosts

        def allgather(self, _):
            return self.hosts

    class FakeComm:
        def __init__(self, hosts):
            self.mpi = FakeMPI(hosts)
    me = host.host_id()
    assert host.nodes_per_host(FakeComm([me] * 4), 2) == 2               # namespaces of one machine
    assert host.nodes_per_host(FakeComm([me, me, "other", "other"]), 2) == 1
    assert host.ranks_sharing_cores(SHARED, 2, 4) == 4
    assert host.ranks_sharing_cores(SHARED, 2, 2) == 2                   # no more than the world
