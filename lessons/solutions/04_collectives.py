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
    "ring_time": r'''
def ring_time(p, S, alpha, beta, gamma):
    """Seconds of a ring all-reduce of S bytes over p ranks, by the alpha-beta-gamma model."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * S * beta + (p - 1) / p * S * gamma
''',
}
