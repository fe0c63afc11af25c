"""Ranks sharing a host's cores (perf/host.py): a step cannot be shorter than all their
work over the cores, and where waiting ranks spin every compute second counts R/C; with
a core per rank nothing changes."""
import dataclasses
import re

import pytest

from minipar.config import TrainConfig
from minipar.perf import host
from minipar.perf.estimate import predict
from minipar.perf.profile import Profile
from tests.mpirun import run_mpi

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
        # one bucket size for every profile: left to the run, the size is chosen per
        # profile (perf/bucket_size.py), and whether transfers overlap changes the choice
        c = config(bucket_mb=25.0, **kw).resolve(4)
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


def test_waits_that_spin_slow_every_compute_second_by_ranks_over_cores():
    """Where waiting ranks poll (MPI's progress engine), 4 ranks on 2 cores are all
    runnable all step and each gets half a core: every compute second of the critical
    path counts twice.  Where waits sleep, or each rank has a core, nothing changes."""
    spinning = dataclasses.replace(SHARED, wait_cpu_share=1.0)
    c = config(dp=2, pp=2, schedule="1f1b", microbatches=4).resolve(4)
    calm, slowed = predict(c, SHARED, ranks_per_node=2), predict(c, spinning, ranks_per_node=2)
    for part in ("t_f", "t_b", "t_w", "optimizer_s", "overhead_s"):
        assert slowed.breakdown[part] == 2 * calm.breakdown[part], part
    assert slowed.breakdown["t_comm"] == calm.breakdown["t_comm"]      # the wire is not slowed
    assert slowed.breakdown["shared_cores_s"] == calm.breakdown["shared_cores_s"]
    assert slowed.step_s > calm.step_s
    assert host.compute_slowdown(spinning, 2, 4) == 2.0
    # what sharing costs beyond the time split, as calibrate measured it
    costly = dataclasses.replace(spinning, efficiency={"core_sharing_excess": 1.1})
    assert host.compute_slowdown(costly, 2, 4) == pytest.approx(2.2)
    assert host.compute_slowdown(dataclasses.replace(costly, cores_per_node=4), 2, 4) == 1.0
    assert host.compute_slowdown(dataclasses.replace(spinning, cores_per_node=4), 2, 4) == 1.0
    assert host.compute_slowdown(dataclasses.replace(spinning, nodes_per_host=1), 2, 4) == 1.0
    assert host.compute_slowdown(dataclasses.replace(spinning, kind="spec"), 2, 4) == 1.0


def test_the_model_compute_scale_multiplies_the_compute_only():
    """calibrate's measured/modelled ratio of the model's own pass scales each
    micro-batch's compute, not the optimizer or a collective."""
    c = config(tp=2).resolve(2)
    plain = predict(c, SHARED, ranks_per_node=2)
    scaled = predict(c, dataclasses.replace(SHARED, efficiency={"model_compute_scale": 1.5}),
                     ranks_per_node=2)
    assert scaled.breakdown["t_w"] == 1.5 * plain.breakdown["t_w"]      # weight gradients only
    assert 1.0 < scaled.breakdown["t_f"] / plain.breakdown["t_f"] < 1.5  # + tp's all-reduces
    assert scaled.breakdown["optimizer_s"] == plain.breakdown["optimizer_s"]


class _Clocks:
    """``time`` as ``perf/host.py`` reads it, moved by the stand-ins below instead of by
    the machine: what they do sets the figures, so no load or speed can change them."""

    def __init__(self):
        self.wall = self.cpu = 0.0
        self.sleeps = []

    def perf_counter(self):
        return self.wall

    def process_time(self):
        return self.cpu

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.wall += seconds


class _Rank0:
    """An mpi4py stand-in for rank 0 of 2: its receive waits ``wait_s`` with the CPU busy
    ``cpu_share`` of the time (1: MPI polls, 0: the rank sleeps); its Barrier spins 1 s,
    before the receive, which must not count."""
    rank, size = 0, 2

    def __init__(self, clocks, cpu_share, wait_s=0.1):
        self.clocks, self.cpu_share, self.wait_s = clocks, cpu_share, wait_s

    def Barrier(self):
        self.clocks.wall += 1.0
        self.clocks.cpu += 1.0

    def Ibarrier(self):
        return self

    def Test(self):
        return True

    def bcast(self, value, root=0):
        return value

    def Recv(self, buf, source, tag):
        self.clocks.wall += self.wait_s
        self.clocks.cpu += self.cpu_share * self.wait_s


@pytest.mark.parametrize("cpu_share", [1.0, 0.0, 0.25])
def test_wait_cpu_share_tells_a_polling_wait_from_a_sleeping_one(monkeypatch, cpu_share):
    """CPU seconds over wall seconds of the receive alone: 1 where the wait polls, 0 where
    it sleeps, and what a polling wait got where something else took part of its core."""
    clocks = _Clocks()
    monkeypatch.setattr(host, "time", clocks)
    assert host.wait_cpu_share(_Rank0(clocks, cpu_share)) == pytest.approx(cpu_share, abs=1e-12)


class _Waiting:
    """An mpi4py stand-in for rank 1 of 3 while rank 0 works: its Ibarrier completes at
    the ``polls``-th Test; bcast gives rank 0's ``result``; Barrier (which spins) refused."""
    rank, size = 1, 3

    def __init__(self, polls, result):
        self.polls, self.result, self.tests = polls, result, 0

    def Ibarrier(self):
        return self

    def Test(self):
        self.tests += 1
        return self.tests >= self.polls

    def Barrier(self):
        raise AssertionError("Barrier spins: a rank waiting for rank 0 must sleep")

    def bcast(self, value, root=0):
        return self.result


def test_while_rank0_works_alone_the_others_sleep_between_polls(monkeypatch):
    """A rank waiting for rank 0 sleeps between its looks at the barrier (its core is
    rank 0's meanwhile), never runs the work itself, and gets rank 0's result."""
    clocks = _Clocks()
    monkeypatch.setattr(host, "time", clocks)
    waiting = _Waiting(polls=5, result={"from": 0})
    got = host.on_rank0_alone(waiting, lambda: pytest.fail("only rank 0 runs the work"))
    assert got == {"from": 0}
    assert waiting.tests == 5 and len(clocks.sleeps) == 4 and all(s > 0 for s in clocks.sleeps)
    assert clocks.cpu == 0.0


def test_rank0_alone_shares_its_result():
    """Through MPI, 3 ranks: rank 0 computes, and all three get its result."""
    out = run_mpi(3, ["tests/scripts/rank0_alone.py"], timeout=60).stdout   # ranks' lines may interleave
    found = re.findall(r"rank (\d) got (\d) (\d+)", out)
    lines = {int(r): (got, n) for r, got, n in found}
    assert sorted(lines) == [0, 1, 2], out
    assert set(lines.values()) == {("0", lines[0][1])}
