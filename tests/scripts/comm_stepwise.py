"""Stepped all-reduces (comm/stepwise.py) against the blocking ring and NumPy's sum:
every size (0, 1, odd, not divisible by p), several in flight advanced in a different
order on each rank, mixed with blocking collectives, and bit-identical results."""
import numpy as np

from minipar.comm import Communicator, abort_on_exception, all_reduce
from minipar.comm.stepwise import all_reduce_stepped
from tests.tolerance import assert_sums_close

abort_on_exception()
comm = Communicator(check=True)
p, r = comm.size, comm.rank
rng = np.random.default_rng(1000 + r)

for dtype in (np.float64, np.float32):
    for n in (0, 1, 2, p - 1, p, p + 1, 7, 1000, 12345, (1 << 17) + 3):
        data = rng.normal(size=n).astype(dtype)
        everyone = np.array(comm.mpi.allgather(data)).reshape(p, n)
        expected, abs_sum = everyone.sum(axis=0), np.abs(everyone).sum(axis=0)
        ring = data.copy()
        all_reduce(comm, ring, algorithm="ring")
        stepped = data.copy()
        h = all_reduce_stepped(comm, stepped)
        assert h.wait() is stepped
        assert np.array_equal(stepped, ring), (dtype, n)          # same bits as the ring
        assert_sums_close(stepped, expected, dtype=dtype, terms=p, abs_sum=abs_sum,
                          err_msg=f"{np.dtype(dtype).name} n={n}")

# several in flight, advanced by progress() in a rank-dependent order, with a blocking
# collective in between: the per-collective tags keep their messages apart
bufs = [np.full(5000 + 17 * i, float(r + i), np.float64) for i in range(5)]
hs = [all_reduce_stepped(comm, b) for b in bufs]
order = list(range(5)) if r % 2 == 0 else list(reversed(range(5)))
for _ in range(50):
    for i in order:
        hs[i].progress()
y = np.ones(33)
all_reduce(comm, y)
assert np.all(y == p)
for i in order:
    hs[i].wait()
    assert np.all(bufs[i] == sum(q + i for q in range(p))), i

# progress() never blocks and finishes the job when called often enough
x = np.full(1 << 16, 1.0)
h = all_reduce_stepped(comm, x)
for _ in range(100000):
    if h.progress():
        break
h.wait()
assert np.all(x == p) and h.test()

try:
    all_reduce_stepped(comm, np.ones((4, 4))[:, 0])
    raise AssertionError("a strided buffer must be refused")
except ValueError as err:
    assert "contiguous 1-D" in str(err)
print(f"rank {r} stepwise ok")
