"""The spinning thread pool (``autograd/spin_pool.py``): every block runs once, on the
caller and the workers, errors come back to the caller, and a worker that went to sleep
after ``SPIN_LIMIT`` idle looks is woken by the next task."""
import threading
import time

import numpy as np
import pytest

from minipar.autograd import rows, spin_pool

pytestmark = pytest.mark.skipif(not spin_pool.available(), reason="needs numba and sched_yield")


def record_blocks(pool, bounds):
    seen, lock = [], threading.Lock()

    def kernel(lo, hi):
        with lock:
            seen.append((lo, hi, threading.current_thread().name))

    pool.run(kernel, bounds)
    return seen


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_every_block_runs_once_and_the_caller_takes_the_first(workers):
    pool = spin_pool.SpinPool(workers)
    bounds = [0, 3, 7, 8, 20, 21][:workers + 2]
    for _ in range(50):                         # many rounds: the counters move on correctly
        seen = record_blocks(pool, bounds)
        assert sorted((lo, hi) for lo, hi, _ in seen) == list(zip(bounds[:-1], bounds[1:]))
        first = [name for lo, _, name in seen if lo == 0]
        assert first == [threading.current_thread().name]
        assert len({name for *_, name in seen}) == len(bounds) - 1


def test_fewer_blocks_than_workers():
    pool = spin_pool.SpinPool(3)
    assert sorted(b[:2] for b in record_blocks(pool, [0, 5, 9])) == [(0, 5), (5, 9)]
    assert sorted(b[:2] for b in record_blocks(pool, [0, 2, 4, 6, 8])) == [(0, 2), (2, 4), (4, 6), (6, 8)]


HANG_S = 60       # a guard only: a pool that works takes milliseconds, one that hangs forever


def test_a_sleeping_worker_is_woken(monkeypatch):
    """Idle workers go to sleep, and the next task wakes them.  Both are waited for, not
    timed: HANG_S only turns a worker that never sleeps, or is never woken, into a failure
    instead of a hung suite."""
    monkeypatch.setattr(spin_pool, "SPIN_LIMIT", 10)       # sleep almost at once
    pool = spin_pool.SpinPool(2)
    deadline = time.monotonic() + HANG_S
    while not all(pool.sleeping):
        assert time.monotonic() < deadline, "idle workers never went to sleep"
        time.sleep(0.001)
    out = np.zeros(9)
    task = threading.Thread(target=pool.run, daemon=True,
                            args=(lambda lo, hi: out.__setitem__(slice(lo, hi), 1.0), [0, 3, 6, 9]))
    task.start()
    task.join(timeout=HANG_S)
    assert not task.is_alive(), "the sleeping workers were never woken"
    assert out.sum() == 9


def test_a_workers_error_is_raised_by_the_caller_and_the_pool_goes_on():
    pool = spin_pool.SpinPool(2)

    def kernel(lo, hi):
        if lo == 4:
            raise ValueError("block 4")

    with pytest.raises(ValueError, match="block 4"):
        pool.run(kernel, [0, 2, 4, 6])
    assert sorted(b[:2] for b in record_blocks(pool, [0, 2, 4, 6])) == [(0, 2), (2, 4), (4, 6)]


def test_the_callers_error_waits_for_the_workers():
    pool = spin_pool.SpinPool(1)
    finished = []

    def kernel(lo, hi):
        if lo == 0:
            raise KeyError("caller")
        time.sleep(0.02)
        finished.append(lo)

    with pytest.raises(KeyError):
        pool.run(kernel, [0, 1, 2])
    assert finished == [1]                     # the worker's block was done before the raise


def test_rows_uses_the_spin_pool(monkeypatch):
    monkeypatch.setattr(rows, "_pools", {})
    assert isinstance(rows._get_pool(1), spin_pool.SpinPool)
    for spinning in (False, True):
        rows.use_spin_pool(spinning)
        try:
            out = np.zeros(10)
            rows.for_row_blocks(10, lambda lo, hi: out.__setitem__(slice(lo, hi), lo), 1 << 30, threads=2)
            np.testing.assert_array_equal(out, [0] * 5 + [5] * 5)
            assert isinstance(rows._get_pool(1), spin_pool.SpinPool) == spinning
        finally:
            rows.use_spin_pool(True)


def _split_in_child(queue):
    out = np.zeros(6)
    rows.for_row_blocks(6, lambda lo, hi: out.__setitem__(slice(lo, hi), 1.0), 1 << 30, threads=2)
    queue.put(out.sum())


def test_a_forked_child_starts_its_own_workers():
    import multiprocessing
    rows.for_row_blocks(4, lambda lo, hi: None, 1 << 30, threads=2)     # the parent's pool exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_split_in_child, args=(queue,))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0 and queue.get(timeout=5) == 6.0
