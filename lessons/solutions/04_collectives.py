"""Solutions of lesson 04's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "ring_shift": r'''
def ring_shift(comm, send, recv):
    """Send `send` to rank (r+1) % p, receive from rank (r-1) % p into `recv`; blocking calls only."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    if comm.rank % 2 == 0:
        comm.send(send, right)
        comm.recv(recv, left)
    else:
        comm.recv(recv, left)
        comm.send(send, right)
''',
    "ring_reduce_scatter": r'''
def ring_reduce_scatter(comm, buf):
    """In place: afterwards chunk comm.rank of buf holds that chunk summed over all ranks."""
    p, r = comm.size, comm.rank
    b = chunk_bounds(buf.size, p)
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        out, into = (r - s - 1) % p, (r - s - 2) % p
        scratch = xp.empty(b[into + 1] - b[into], dtype=buf.dtype)
        comm.sendrecv(buf[b[out]:b[out + 1]], right, scratch, left)
        buf[b[into]:b[into + 1]] += scratch
''',
    "recursive_doubling": r'''
def recursive_doubling(comm, buf):
    """In place: every rank ends with buf summed over all ranks, for any number of ranks."""
    p, r = comm.size, comm.rank
    p2 = 1 << (p.bit_length() - 1)           # p' = the largest power of two <= p
    extra = p - p2                           # e: ranks 0 .. 2e-1 fold in pairs
    if r < 2 * extra and r % 2 == 0:         # an extra rank: hand its buffer over, wait for the sum
        comm.send(buf, r + 1)
        comm.recv(buf, r + 1)
        return
    scratch = xp.empty_like(buf)
    if r < 2 * extra:                        # the extra's partner adds it in
        comm.recv(scratch, r - 1)
        buf += scratch
    new = r // 2 if r < 2 * extra else r - extra
    distance = 1
    while distance < p2:
        other = new ^ distance
        partner = 2 * other + 1 if other < extra else other + extra
        comm.sendrecv(buf, partner, scratch, partner)
        buf += scratch
        distance *= 2
    if r < 2 * extra:
        comm.send(buf, r - 1)
''',
    "ring_time": r'''
def ring_time(p, S, alpha, beta, gamma):
    """Seconds of a ring all-reduce of S bytes over p ranks, by the alpha-beta-gamma model."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * S * beta + (p - 1) / p * S * gamma
''',
}
