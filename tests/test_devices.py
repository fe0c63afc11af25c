"""One GPU per rank (``minipar/process/devices.py``): rank r of a node computes on GPU
``r % GPUs``, a node with more ranks than GPUs is refused unless ``--share-gpus``, and the
header prints the map.  The multi-rank cases run the trainer's own set-up under mpiexec on
the fake CuPy of ``tests/fake_cupy`` pretending to have N devices
(``MINIPAR_FAKE_CUPY_DEVICES``), which records the device current when each array is made.
"""
import json
import os
import socket
import subprocess
import sys

import pytest

from minipar.observe.monitor_text import gpu_map
from minipar.process.devices import Placement, check_placements, device_for
from tests.mpirun import REPO, run_mpi
from tests.test_cluster import WHY_NOT    # root, ip and tc: the simulated cluster can be built

FAKE_CUPY = os.path.join(REPO, "tests", "fake_cupy")
SCRIPT = "tests/scripts/device_placement.py"
HOST = socket.gethostname()


def on_fake_cupy(devices, **more):
    return dict(PYTHONPATH=os.pathsep.join([FAKE_CUPY, REPO]), MINIPAR_FAKE_CUPY_DEVICES=str(devices),
                MINIPAR_BACKEND="numpy", **more)


def reports(stdout):
    """The JSON object each rank printed (lines may run together), by rank."""
    decoder, found, i = json.JSONDecoder(), {}, stdout.find("{")
    while i != -1:
        obj, end = decoder.raw_decode(stdout, i)
        found[obj["rank"]] = obj
        i = stdout.find("{", end)
    return found


def placements(hosts_ranks, devices, bus=True):
    """Placements of consecutive ranks on nodes [(host, ranks), ...], each seeing ``devices``."""
    out, rank = [], 0
    for host, ranks in hosts_ranks:
        first = rank
        for local in range(ranks):
            d = device_for(local, devices)
            out.append(Placement(rank, host, first, local, ranks, devices, d,
                                 f"0000:{d + 1:02x}:00.0" if bus else None))
            rank += 1
    return out


def test_the_local_rank_picks_the_device_modulo_the_gpus():
    assert [device_for(r, 4) for r in range(6)] == [0, 1, 2, 3, 0, 1]


def test_a_node_with_more_ranks_than_gpus_is_refused_unless_shared():
    crowded = placements([("node-a", 4), ("node-b", 5)], devices=4)
    with pytest.raises(ValueError, match=r"node node-b has 5 ranks and 4 GPUs: pass `share_gpus`"
                                          r" .* or start at most 4 ranks per node"):
        check_placements(crowded, share=False)
    check_placements(crowded, share=True)
    check_placements(placements([("node-a", 4), ("node-b", 4)], devices=4), share=False)


def test_ranks_given_their_own_card_by_cuda_visible_devices_do_not_share():
    """Each rank sees one device, numbered 0: the bus ids tell the cards apart."""
    own = [Placement(r, "node-a", 0, r, 2, 1, 0, f"0000:{r + 1:02x}:00.0") for r in range(2)]
    check_placements(own, share=False)
    same = [Placement(r, "node-a", 0, r, 2, 1, 0, "0000:01:00.0") for r in range(2)]
    with pytest.raises(ValueError, match="has 2 ranks and 1 GPU:"):
        check_placements(same, share=False)


def test_the_map_names_each_rank_or_ranges_per_node():
    few = placements([("node-a", 2)], devices=2)
    assert gpu_map([vars(p) for p in few]) == ("rank 0 -> node-a GPU 0 (0000:01:00.0), "
                                               "rank 1 -> node-a GPU 1 (0000:02:00.0)")
    many = placements([("node-a", 8), ("node-b", 8)], devices=4, bus=False)
    assert gpu_map([vars(p) for p in many]) == ("node-a ranks 0-7 -> GPUs 0-3,0-3; "
                                                "node-b ranks 8-15 -> GPUs 0-3,0-3")
    namespaces = placements([("vm", 1), ("vm", 1)], devices=1, bus=False)   # one host name
    assert gpu_map([vars(p) for p in namespaces]) == "rank 0 -> vm#0 GPU 0, rank 1 -> vm#1 GPU 0"


def test_each_rank_makes_its_arrays_on_its_own_gpu():
    """Four ranks on four devices: rank r's weights on device r, and no array of the
    process made on any other device (none before the choice, on the default GPU 0)."""
    got = reports(run_mpi(4, [SCRIPT, "--dp", "4"], timeout=120, env=on_fake_cupy(4)).stdout)
    assert sorted(got) == [0, 1, 2, 3], got
    for rank, report in got.items():
        assert report["current"] == rank and report["weights"] == [rank], report
        assert list(report["made_on"]) == [str(rank)], report
    assert got[0]["map"] == ", ".join(f"rank {r} -> {HOST} GPU {r} (0000:{r + 1:02x}:00.0)"
                                      for r in range(4))


def test_five_ranks_on_four_gpus_are_refused_in_one_line():
    proc = run_mpi(5, [SCRIPT, "--dp", "5"], timeout=120, env=on_fake_cupy(4), check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"minipar train: node {HOST} has 5 ranks and 4 GPUs: pass --share-gpus to let ranks "
        "share a GPU, or start at most 4 ranks per node"], proc.stderr


def test_five_ranks_share_four_gpus_when_asked():
    got = reports(run_mpi(5, [SCRIPT, "--dp", "5", "--share-gpus"], timeout=120,
                          env=on_fake_cupy(4)).stdout)
    assert {rank: r["weights"] for rank, r in got.items()} == {0: [0], 1: [1], 2: [2], 3: [3], 4: [0]}
    assert got[0]["map"].endswith(f"rank 4 -> {HOST} GPU 0 (0000:01:00.0)")


def test_the_train_header_prints_the_map_of_the_visible_gpus():
    """CUDA_VISIBLE_DEVICES=2,3: the ranks number them 0 and 1, on physical cards 2 and 3."""
    flags = ["-m", "minipar", "train", "--backend", "cupy", "--model", "tiny", "--n-layer", "1",
             "--steps", "1", "--seq-len", "16", "--batch-size", "2", "--data", "stdlib-bytes",
             "--eval-batches", "0", "--quiet"]
    out = run_mpi(2, flags, timeout=120, env=on_fake_cupy(4, CUDA_VISIBLE_DEVICES="2,3")).stdout
    header = [line for line in out.splitlines() if line.startswith("  GPUs:")]
    assert header == [f"  GPUs: rank 0 -> {HOST} GPU 0 (0000:03:00.0), "
                      f"rank 1 -> {HOST} GPU 1 (0000:04:00.0)"], out


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
def test_each_node_of_the_simulated_cluster_numbers_its_own_gpus():
    """Two nodes (network namespaces: MPI's shared-memory split stops at each) of two
    ranks, two fake GPUs each: local ranks 0 and 1 of each node take GPUs 0 and 1."""
    prefix = f"gpu{os.getpid() % 10000}"
    env = dict(os.environ, OMP_NUM_THREADS="1", MINIPAR_COMM_CHECK="1", **on_fake_cupy(2))

    def cluster(action, *args):
        return subprocess.run([sys.executable, "-m", "minipar", "cluster", action, "--prefix", prefix,
                               *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    up = cluster("up", "--nodes", "2", "--ranks-per-node", "2", "--inter-gbps", "1")
    assert up.returncode == 0, up.stderr
    try:
        proc = cluster("run", "--", SCRIPT, "--dp", "4")
    finally:
        cluster("down")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = reports(proc.stdout)
    assert {rank: r["weights"] for rank, r in got.items()} == {0: [0], 1: [1], 2: [0], 3: [1]}
    assert got[0]["map"] == (f"rank 0 -> {HOST}#0 GPU 0 (0000:01:00.0), rank 1 -> {HOST}#0 GPU 1 "
                             f"(0000:02:00.0), rank 2 -> {HOST}#1 GPU 0 (0000:01:00.0), "
                             f"rank 3 -> {HOST}#1 GPU 1 (0000:02:00.0)")
