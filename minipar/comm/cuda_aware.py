"""Ask the MPI library whether it can read and write GPU memory itself (CUDA-aware MPI).

A CUDA-aware MPI takes a device pointer in ``MPI_Send``: inside a node it copies GPU to GPU
(CUDA IPC, NVLink), across nodes it hands the GPU's memory to the network card (GPUDirect
RDMA) — no bounce through host memory.  An MPI built without CUDA reads a device pointer as
host memory and crashes, or worse, sends garbage; so before handing it one, minipar asks.

Both large MPIs answer the same question under the same name, outside the MPI standard
(an "MPIX" extension) and so outside mpi4py:

    int MPIX_Query_cuda_support(void)   // 1: built with CUDA and usable now; 0: not

Open MPI has it in every build (its ``mpi-ext.h``); MPICH from 4.0.  It is looked up in the
MPI library mpi4py loaded (``ctypes.CDLL`` on mpi4py's extension module finds the symbols
of the libraries it links), after ``MPI_Init`` (importing ``mpi4py.MPI`` initialises MPI).
An MPI without the symbol cannot say yes: the answer is then False.

``MINIPAR_CUDA_AWARE=1`` (or ``=0``) overrides the answer: an MPI may be CUDA-aware without
the query (a vendor build), and a test on a CPU uses it to stand in for CUDA-aware MPI.
"""
from __future__ import annotations

import ctypes
import os

QUERY = "MPIX_Query_cuda_support"
ENV = "MINIPAR_CUDA_AWARE"
_answer = {}


def env_override():
    """True/False where ``MINIPAR_CUDA_AWARE`` is set to a yes or a no; None where unset."""
    value = os.environ.get(ENV, "").strip().lower()
    if value == "":
        return None
    return value not in ("0", "false", "no", "off")


def mpi_says_cuda_aware() -> bool:
    """What the MPI library answers to ``MPIX_Query_cuda_support`` (False without it)."""
    if "mpi" not in _answer:
        from mpi4py import MPI
        try:
            query = getattr(ctypes.CDLL(MPI.__file__), QUERY)
        except (OSError, AttributeError):
            _answer["mpi"] = False
        else:
            query.restype, query.argtypes = ctypes.c_int, []
            _answer["mpi"] = bool(query())
    return _answer["mpi"]


def cuda_aware() -> bool:
    """Whether device buffers may go to MPI directly: the override, else MPI's answer."""
    override = env_override()
    return mpi_says_cuda_aware() if override is None else override
