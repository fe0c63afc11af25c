"""PowerSGD (Vogels, Karimireddy & Jaggi, 2019): a rank-r power iteration per matrix.

A weight gradient is a matrix M (n×m, after error feedback M = G + E).  Instead of its
n·m numbers, the ranks agree on a rank-r approximation M ≈ P Qᵀ with one step of power
iteration, warm-started from the previous step's Q:

    P_r = M_r Q                 (n×r)   each rank, with the shared Q
    P   = Σ_r P_r               all-reduce (1)        — the span of the average's columns
    P   = orthonormalise(P)     (QR; the same on every rank: same input, same bits)
    Q_r = M_rᵀ P                (m×r)
    Q   = (1/n) Σ_r Q_r         all-reduce (2)        — next step's warm start too
    use   P Qᵀ = P Pᵀ · (1/n)Σ_r M_r                  — the average, projected on span(P)

Linearity does the averaging: (1/n)Σ_r P Q_rᵀ = P Qᵀ, so what rank r contributed is
P Q_rᵀ and its error feedback is E_r ← M_r − P Q_rᵀ.  Bytes per rank: two ring
all-reduces of (n+m)·r numbers instead of one of n·m — for a 512×512 weight at r = 4,
1/64 of the traffic.  At full rank (r = min(n, m)) P spans all of M's columns and the
step is exact.

1-D tensors (biases, norm gains) and the bucket's padding are all-reduced uncompressed,
in the same message as the Ps (one latency fewer).  The first ``start`` steps use the
plain all-reduce (PowerSGD's warm-up: early gradients change fast and are not low-rank).
This is PyTorch's ``powerSGD_hook``; state: Q per matrix (the same on every rank) and E
per rank.  A bucket is a flat buffer of several parameters: its ``offsets`` and
``shapes`` view each ≥2-D parameter as a matrix (shape[0] × the rest).
"""
from __future__ import annotations

import numpy as np  # the seeded initial Q, drawn on the host so every rank draws the same

from minipar.backend import to_device, to_host, xp
from minipar.comm import all_reduce
from minipar.parallel.sync.compression.base import CompressionHook
from minipar.parallel.sync.compression.wire import ring_all_reduce_bytes


def orthonormalise(p):
    """Orthonormal columns spanning ``p``'s (reduced QR, stable where Gram-Schmidt is not)."""
    return xp.linalg.qr(p)[0] if p.size else p


class PowerSGDHook(CompressionHook):
    name = "powersgd"

    def __init__(self, rank=4, start=10, seed=0, error_feedback=True, algorithm="ring"):
        super().__init__(algorithm=algorithm, start=start)
        if rank < 1:
            raise ValueError(f"PowerSGD `rank` must be at least 1, not {rank}")
        self.rank, self.seed, self.error_feedback = int(rank), int(seed), error_feedback
        self.q = {}              # (bucket, param) -> Q (m×r), shared by the ranks

    def setup(self):
        """Per bucket: [(param j, offset, n, m, r)] of the matrices, and the indices of
        the elements sent uncompressed (1-D parameters and padding)."""
        self.layout, self.vector_index = [], []
        for bucket in self.buckets:
            mats, dense = [], xp.ones(bucket.padded, dtype=bool)
            for j, (off, shape) in enumerate(zip(bucket.offsets, bucket.shapes)):
                if len(shape) >= 2:
                    n, m = shape[0], int(np.prod(shape[1:]))
                    mats.append((j, off, n, m, min(self.rank, n, m)))
                    dense[off:off + n * m] = False
            self.layout.append(mats)
            self.vector_index.append(xp.nonzero(dense)[0])

    def initial_q(self, index, j, m, r, dtype):
        rng = np.random.default_rng([self.seed, index, j])
        return to_device(rng.standard_normal((m, r)), dtype=dtype)

    def reduce(self, ctx, flat, index):
        x = self.corrected(flat, index)
        n_ranks, vec, mats = ctx.size, self.vector_index[index], self.layout[index]
        ms, ps = [], []
        for j, off, n, m, r in mats:
            q = self.q.get((index, j))
            if q is None:
                q = self.q[(index, j)] = self.initial_q(index, j, m, r, x.dtype)
            ms.append(x[off:off + n * m].reshape(n, m))
            ps.append(ms[-1] @ q)
        first = xp.concatenate([x[vec]] + [p.reshape(-1) for p in ps])
        all_reduce(ctx, first, algorithm=self.algorithm)                 # (1) 1-D + Ps
        out = xp.zeros_like(x)
        out[vec] = first[:vec.size] * (1.0 / n_ranks)
        if mats:
            start, ps = vec.size, []
            for j, off, n, m, r in mats:
                ps.append(orthonormalise(first[start:start + n * r].reshape(n, r)))
                start += n * r
            local_qs = [mt.T @ p for mt, p in zip(ms, ps)]
            second = xp.concatenate([q.reshape(-1) for q in local_qs])
            all_reduce(ctx, second, algorithm=self.algorithm)            # (2) Qs
            second *= 1.0 / n_ranks
            sent = x.copy()            # 1-D parts: sent as they are, residual 0
            start = 0
            for (j, off, n, m, r), p, q_local in zip(mats, ps, local_qs):
                q = second[start:start + m * r].reshape(m, r)
                start += m * r
                self.q[(index, j)] = q
                out[off:off + n * m] = (p @ q.T).reshape(-1)
                sent[off:off + n * m] = (p @ q_local.T).reshape(-1)
            if self.error_feedback:
                self.keep(index, x - sent)
        return out.astype(flat.dtype)

    def expected_wire_bytes(self, bucket, n, rank):
        index = self.buckets.index(bucket)
        mats = self.layout[index]
        b = 4 if bucket.dtype.itemsize == 2 else bucket.dtype.itemsize
        first = int(self.vector_index[index].size) + sum(n_ * r for _, _, n_, _, r in mats)
        second = sum(m * r for _, _, _, m, r in mats)
        return ring_all_reduce_bytes(first, b, n, rank) + ring_all_reduce_bytes(second, b, n, rank)

    # ------------------------------------------------------------------ checkpoints
    def extra_state(self):
        """``powersgd_q.<param name>``: each matrix's Q (m×r), the warm start."""
        return {f"powersgd_q.{self.names[i][j]}": to_host(q).copy()
                for (i, j), q in sorted(self.q.items())}

    def load_extra_state(self, state):
        self.q = {}
        for i, mats in enumerate(self.layout):
            for j, *_ in mats:
                a = state.pop(f"powersgd_q.{self.names[i][j]}", None)
                if a is not None:
                    dtype = xp.float32 if self.buckets[i].dtype.itemsize == 2 else self.buckets[i].dtype
                    self.q[(i, j)] = to_device(a, dtype=dtype)
