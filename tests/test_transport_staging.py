"""The transport's device paths (``minipar/comm/device_paths.py``, ``staging.py``), checked on
the fake CuPy of ``tests/fake_cupy``, whose side streams queue copies until something waits
for them and record them in order (``tests/fake_cupy/cupy/_streams.py``).

- staging: the copy-out of chunk i+1 and the copy-in of chunk i-1 are in flight while MPI
  carries chunk i; pinned buffers are reused; the collectives' fuzz passes through it;
- every path (pageable, staging, cuda-aware) delivers the same bytes and counts the same;
- cuda-aware: one stream sync per step on a collective's context, one per message on a
  user's communicator; CUDA-awareness is asked of MPI, and the override is kept;
- nccl: the collectives' messages go over the fake NCCL (carried by MPI) and the fuzz passes;
- a transport that cannot run (unknown; nccl on NumPy or with shared GPUs) is refused in
  one line.
"""
import ctypes
import json
import os
import re
import subprocess
import sys

import pytest
from mpi4py import MPI

from minipar.comm.cuda_aware import QUERY, mpi_says_cuda_aware
from minipar.comm.device_paths import resolve
from minipar.comm.transport import Transport
from minipar.config import ConfigError, Numerics
from tests.mpirun import REPO, run_mpi

FAKE_CUPY = os.path.join(REPO, "tests", "fake_cupy")
ON_FAKE_CUPY = dict(PYTHONPATH=os.pathsep.join([FAKE_CUPY, REPO]), OMP_NUM_THREADS="1")
CHUNKS = 5   # transport_paths.py's message: 300 bytes in 64-byte chunks


@pytest.fixture(scope="module")
def paths():
    proc = subprocess.run([sys.executable, "tests/scripts/transport_paths.py"], cwd=REPO,
                          env=dict(os.environ, **ON_FAKE_CUPY), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def positions(order, *entry):
    """Where each occurrence of ``entry`` (a prefix of a log tuple) stands in ``order``."""
    return [i for i, e in enumerate(order) if tuple(e[:len(entry)]) == entry]


def test_staging_overlaps_copy_out_wire_and_copy_in(paths):
    order = paths["order"]
    copies = [e for e in order if e[0] == "queue"]
    d2h_stream = {e[1] for e in copies if e[2] == "d2h"}
    h2d_stream = {e[1] for e in copies if e[2] == "h2d"}
    assert len(d2h_stream) == len(h2d_stream) == 1 and d2h_stream != h2d_stream != {"null"}
    sends = positions(order, "wire", "send")
    d2h_queued, d2h_ran = positions(order, "queue", *d2h_stream, "d2h"), positions(order, "run", *d2h_stream)
    h2d_queued, h2d_ran = positions(order, "queue", *h2d_stream, "h2d"), positions(order, "run", *h2d_stream)
    assert len(sends) == len(d2h_ran) == len(h2d_ran) == CHUNKS, order
    for i in range(CHUNKS):
        assert d2h_ran[i] < sends[i], f"chunk {i} sent before its copy-out ran"
        if i + 1 < CHUNKS:
            assert d2h_queued[i + 1] < sends[i] < d2h_ran[i + 1], \
                f"the copy-out of chunk {i + 1} was not in flight while chunk {i} was sent: {order}"
        if i >= 1:
            assert h2d_queued[i - 1] < sends[i] < h2d_ran[i - 1], \
                f"the copy-in of chunk {i - 1} was not in flight while chunk {i} was sent: {order}"
    # the compute stream is ordered after the last copy-in, without the host waiting for it
    assert order[-3] == ["stream waits", "null", *h2d_stream] and order[-1][:2] == ["run", *h2d_stream]
    assert paths["delivered"]


def test_pinned_buffers_are_reused(paths):
    assert paths["pinned"] == [4, 4]   # two slots each way, for the first message and after


def test_every_path_delivers_the_same_bytes_and_counts_them_alike(paths):
    assert paths["same_bytes"] == {name: [True] * 4 for name in ("pageable", "staging", "cuda-aware")}
    counts = paths["counters"]
    assert counts["staging"] == counts["cuda-aware"] == counts["pageable"] == [674, 674, 5, 5]


def test_cuda_aware_syncs_once_per_step_in_a_collective_context(paths):
    # a sendrecv, then an irecv and an isend posted together: two steps, three messages
    assert paths["syncs"] == {"context": 2, "user": 4}


def test_cuda_awareness_is_asked_of_mpi_and_the_override_kept(monkeypatch):
    if MPI.Get_library_version().startswith(("MPICH", "Open MPI")):
        assert hasattr(ctypes.CDLL(MPI.__file__), QUERY)   # asked, not assumed
    assert isinstance(mpi_says_cuda_aware(), bool)
    monkeypatch.delenv("MINIPAR_TRANSPORT", raising=False)
    monkeypatch.setenv("MINIPAR_CUDA_AWARE", "1")
    assert resolve() == "cuda-aware"
    monkeypatch.setenv("MINIPAR_CUDA_AWARE", "0")
    assert resolve() == "pageable"      # the NumPy backend: nothing to stage
    assert resolve("staging") == "staging" and resolve(cuda_aware_flag=True) == "cuda-aware"


def test_a_transport_that_cannot_run_is_refused_in_one_line():
    """By the config check (the command line) and by the communicator, before any message."""
    refusals = {
        Numerics(transport="gloo"): "`transport`: unknown transport 'gloo'; choose one of "
                                    "auto, pageable, staging, cuda-aware, nccl",
        Numerics(transport="nccl", backend="numpy"): "`transport` nccl moves device arrays: it "
                                                     "needs `backend` cupy",
        Numerics(transport="nccl", backend="cupy", share_gpus=True): "NCCL refuses two ranks on "
                                                                     "one GPU"}
    for config, why in refusals.items():
        with pytest.raises(ConfigError) as err:
            config.check()
        assert why in str(err.value) and "\n" not in str(err.value)
    Numerics(transport="staging").check()
    with pytest.raises(ValueError, match="^transport 'nccl' moves device arrays: it needs "
                                         "--backend cupy$"):
        Transport(MPI.COMM_SELF, transport="nccl")    # on the NumPy backend


def fuzz(nprocs, transport, more=(), chunk=256):
    """The fuzz on ``nprocs`` ranks, a fake GPU each; returns the fake NCCL's calls."""
    env = dict(ON_FAKE_CUPY, MINIPAR_TRANSPORT=transport, MINIPAR_STAGING_CHUNK_BYTES=str(chunk),
               MINIPAR_COMM_CHECK="1", MINIPAR_HANG_TIMEOUT="60",
               MINIPAR_FAKE_CUPY_DEVICES=str(nprocs))
    proc = run_mpi(nprocs, ["tests/scripts/transport_fuzz.py", *more], timeout=300, env=env)
    found = re.search(f"transport fuzz OK {transport} 1 counter check, (\\d+) NCCL calls", proc.stdout)
    assert found, proc.stdout
    return int(found.group(1))


def test_the_collectives_fuzz_passes_through_the_staging_and_nccl_transports():
    assert fuzz(2, "staging", ["--quick", "--big", "3000"]) == 0
    assert fuzz(2, "nccl", ["--quick", "--big", "3000"]) > 0   # the collectives went by NCCL


@pytest.mark.slow
@pytest.mark.parametrize("nprocs", [3, 4])
def test_the_whole_fuzz_passes_through_the_staging_transport(nprocs):
    fuzz(nprocs, "staging", ["--big", "70001"] if nprocs == 3 else [])


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["cuda-aware", "nccl"])
def test_the_whole_fuzz_passes_through_the_cuda_aware_and_nccl_transports(transport):
    fuzz(3, transport, ["--big", "70001"])


def test_bench_comm_prints_minipar_beside_nccls_own_all_reduce():
    """On the fake NCCL the times mean nothing; the table must hold NCCL's row as the
    baseline (100 %) and each algorithm's share of it."""
    env = dict(ON_FAKE_CUPY, MINIPAR_FAKE_CUPY_DEVICES="2")
    out = run_mpi(2, ["-m", "minipar", "bench", "comm", "--backend", "cupy", "--transport",
                      "nccl", "--min-size", "1K", "--max-size", "1K", "--budget", "0.01",
                      "--max-iters", "3", "--algorithms", "ring,tree"], timeout=120, env=env).stdout
    rows = {line.split()[1]: line.split() for line in out.splitlines()
            if line.strip().startswith("1K")}
    assert "% of NCCL" in out and set(rows) == {"nccl", "ring", "tree"}, out
    assert rows["nccl"][-1] == "100" and all(float(rows[a][-1]) > 0 for a in ("ring", "tree"))
