"""Solutions of lesson 16's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "merge": r'''
def my_merge(out, lse, o, l):
    m = np.maximum(lse, l)                        # finite: l is, for every row it touches
    new = m + np.log(np.exp(lse - m) + np.exp(l - m))
    out *= np.exp(lse - new)[..., None]           # e^{-inf} = 0 on the first block
    out += o * np.exp(l - new)[..., None]
    lse[...] = new
''',
    "zigzag": r'''
def my_chunks_of(rank, cp):
    return rank, 2 * cp - 1 - rank
''',
    "ring_loop": r'''
%%writefile {MINE}/ring.py
"""Your ring attention (lesson 16): run under mpiexec by 16_yours.py."""
from minipar.backend import xp
from minipar.parallel.context.ring import pair_forward


def merge(out, lse, o, l):
    """The online-softmax merge of one block's (o, l) into the running (out, lse), in place."""
    m = xp.maximum(lse, l)
    new = m + xp.log(xp.exp(lse - m) + xp.exp(l - m))
    out *= xp.exp(lse - new)[..., None]
    out += o * xp.exp(l - new)[..., None]
    lse[...] = new


def ring_attention(comm, q, k, v):
    """Causal attention of my query block over the whole sequence; (out, lse)."""
    C, r = comm.size, comm.rank
    out, lse = xp.zeros_like(q), xp.full(q.shape[:3], -xp.inf)
    kv = xp.stack([k, v])                    # one message per step
    for t in range(C):
        owner = (r - t) % C                  # whose keys I hold at step t
        if owner <= r:                       # later blocks are all masked: skip the compute
            o, l = pair_forward(q, kv[0], kv[1], "naive", diagonal=owner == r)
            merge(out, lse, o, l)
        if t < C - 1:                        # pass the block on, take the next one
            incoming = xp.empty_like(kv)
            comm.sendrecv(kv, (r + 1) % C, incoming, (r - 1) % C)
            kv = incoming
    return out, lse
''',
    "ulysses_swap": r'''
%%writefile {MINE}/ulysses.py
"""Your Ulysses swaps (lesson 16): run under mpiexec by 16_yours.py."""
from minipar.backend import xp
from minipar.comm import all_to_all


def sequence_to_heads(comm, x):
    """(B, H, n, d), my n positions of every head -> (B, H/U, U·n, d), every rank's
    positions of my H/U heads."""
    U = comm.size
    b, h, n, d = x.shape
    # block t (of U) goes to rank t: its H/U heads, my positions
    send = xp.ascontiguousarray(x.reshape(b, U, h // U, n, d).transpose(1, 0, 2, 3, 4))
    received, _ = all_to_all(comm, send, [1] * U)        # block s: rank s's positions
    return received.transpose(1, 2, 0, 3, 4).reshape(b, h // U, U * n, d)


def heads_to_sequence(comm, y):
    """The inverse: (B, H/U, U·n, d) -> (B, H, n, d)."""
    U = comm.size
    b, mine, length, d = y.shape
    n = length // U
    # block t goes to rank t: its positions, my heads
    send = xp.ascontiguousarray(y.reshape(b, mine, U, n, d).transpose(2, 0, 1, 3, 4))
    received, _ = all_to_all(comm, send, [1] * U)        # block s: heads of rank s
    return received.transpose(1, 0, 2, 3, 4).reshape(b, U * mine, n, d)
''',
}
