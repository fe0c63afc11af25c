"""Fake-only: what a GPU step would cost, counted as the fake runs it (``cupy._counts``).

A GPU is fast at array work and slow at three things this file counts, because a CPU run
can count them exactly even though it cannot time them:

- ``syncs``: the host waits for the device — every device→host read (``get``, ``item``,
  ``bool(a)``, ``float(a)``, ``tolist``) and every explicit ``synchronize``.  Each one drains
  the launch queue, so the GPU idles while Python catches up (``d2h`` counts the reads alone,
  ``h2d`` the host→device copies, which do not block);
- ``launches``: kernels — an array operation that writes memory (a new array, ``out=``, an
  in-place operator, ``a[i] = v``), a ``RawKernel`` call, a cuBLAS call; views are free;
  ``raw_kernels`` names the ``RawKernel`` calls ({name: count});
- ``gemms``: (entry, operand ranks, operand dtypes) per matrix product.  ``matmul`` with a
  half operand of three or more dimensions is CuPy 14.2's batched path, which casts both
  operands to fp32 and runs without tensor cores (CuPy PR 10317): ``batched_half_matmuls``;
- ``stream_log``, ``pinned_allocs``, ``pinned_bytes``: side streams' copies and waits, and
  pinned host allocations (``_streams.py``);
- ``upcasts``: (op, shape, input dtypes, result dtype) for every result wider than a half
  input of its size where the code did not ask for it (no ``astype``, no ``dtype=``) and no
  operand of its size was that wide already: NumPy 2's promotion, e.g. fp16 array · float32
  scalar (or 0-d array) -> float32, silently doubling the bytes of a whole activation.

``cupy._counts.mark()`` notes where the counts stand; ``summary(min_size, since=mark)`` gives
the numbers since then, upcasts of arrays smaller than ``min_size`` elements left out (a
per-row statistic is not an activation).
"""
import numpy

VIEWS = {"reshape", "view", "transpose", "swapaxes", "squeeze", "broadcast_to", "expand_dims",
         "__getitem__", "T", "diagonal", "real", "imag", "moveaxis", "ravel"}
GEMMS = {"matmul", "__matmul__", "__rmatmul__", "dot", "tensordot", "inner"}
SYNC_READS = {"get", "item", "tolist", "__bool__", "__float__", "__int__", "__complex__",
              "asnumpy"}


def is_half(dtype):
    dtype = numpy.dtype(dtype)
    return dtype.itemsize == 2 and (dtype.kind == "f" or dtype.name == "bfloat16")


def check_gemm(name, arrays):
    """CuPy 14.2's batched ``matmul`` crashes on bfloat16 operands: so does the fake."""
    if name in GEMMS and any(len(a.shape) >= 3 and a.dtype.name == "bfloat16" for a in arrays[:2]):
        raise NotImplementedError("fake cupy (as CuPy 14.2): batched matmul of bfloat16 "
                                  "operands fails; use cuBLAS's gemmStridedBatchedEx")


class Counts:
    def __init__(self):
        self.reset()

    def reset(self):
        self.syncs = self.d2h = self.h2d = self.launches = 0
        self.gemms, self.upcasts, self.raw = [], [], []
        self.pinned_allocs = self.pinned_bytes = 0
        self.stream_log = []   # asynchronous copies and waits, in order (``_streams.py``)

    # ------------------------------------------------------------ recording
    def read(self):
        self.syncs += 1
        self.d2h += 1

    def synchronize(self):
        self.syncs += 1

    def raw_kernel(self, name):
        self.launches += 1
        self.raw.append(name)

    def gemm(self, entry, operands):
        self.gemms.append((entry, tuple(len(o.shape) for o in operands),
                           tuple(numpy.dtype(o.dtype).name for o in operands)))

    def op(self, name, arrays, result, explicit=False, writes=False):
        """One array operation: ``arrays`` its device inputs, ``result`` what it returned."""
        if name in GEMMS and len(arrays) >= 2:
            self.gemm("matmul" if "matmul" in name else name, arrays[:2])
        res = getattr(result, "_a", None)
        if writes or (res is not None and name not in VIEWS and res.base is None):
            self.launches += 1
        if explicit or res is None or res.dtype.kind != "f" or res.dtype.itemsize <= 2:
            return
        # silent: a half operand as large as the result, and the width came from something
        # smaller (a scalar, a 0-d array, a broadcast row) — not from a full-size wide operand
        full = [a for a in arrays if a._a.size == res.size]
        if any(is_half(a.dtype) for a in full) and all(a.dtype.itemsize < res.dtype.itemsize
                                                       for a in full):
            self.upcasts.append((name, res.shape, tuple(a.dtype.name for a in arrays),
                                 res.dtype.name))

    # ------------------------------------------------------------ reading
    def mark(self):
        """Where the counts stand now: ``summary(since=mark)`` counts from here on."""
        return (self.syncs, self.d2h, self.h2d, self.launches, len(self.gemms), len(self.upcasts),
                len(self.raw))

    def summary(self, min_size=0, since=(0, 0, 0, 0, 0, 0, 0)):
        syncs, d2h, h2d, launches, gemms, upcasts, raw = since
        gemms = self.gemms[gemms:]
        batched = [g for g in gemms
                   if g[0] == "matmul" and max(g[1]) >= 3 and any(is_half(d) for d in g[2])]
        big = [u for u in self.upcasts[upcasts:] if int(numpy.prod(u[1])) >= min_size]
        return {"syncs": self.syncs - syncs, "d2h": self.d2h - d2h, "h2d": self.h2d - h2d,
                "launches": self.launches - launches, "gemms": len(gemms),
                "cublas_gemms": sum(g[0].startswith("gemm") for g in gemms),
                "batched_half_matmuls": len(batched), "upcasts": len(big),
                "raw_kernels": {k: self.raw[raw:].count(k) for k in sorted(set(self.raw[raw:]))},
                "upcast_examples": [" ".join(map(str, u)) for u in big[:4]]}


counts = Counts()
