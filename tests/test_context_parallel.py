"""Context parallelism: ring attention over the sequence, against the single process.

fp64 parity (losses, final weights and Adam moments to 1e-9 relative — of each array's
largest entry, since an element whose gradient cancels to near zero carries the absolute
noise of a different summation order) for cp2, cp4 and cp2 composed with dp, tp and pp,
with naive and flash attention, zig-zag and contiguous splits; the split itself; the
work balance the zig-zag split buys; bad layouts refused before any message.  Ring
attention with grouped-query K/V at op level (tests/scripts/ring_gqa.py): fp64 parity
with one process, and the bytes sent — K/V travel with their Hkv heads only."""
import re

import numpy as np
import pytest

from minipar.config import ConfigError, TrainConfig
from minipar.parallel.context.split import chunks_of, positions_of, work_units
from tests.cli import train
from tests.mpirun import run_mpi

MODEL = ["--model", "tiny", "--n-layer", "2", "--d-model", "16", "--n-head", "2", "--seq-len", "16"]


def assert_close_run(a, b, rtol=1e-9):
    (la, pa, sa), (lb, pb, sb) = a, b
    np.testing.assert_allclose(la, lb, rtol=rtol, atol=0)
    for name in pb:
        for got, want in ((pa[name], pb[name]), (sa["m"][name], sb["m"][name]),
                          (sa["v"][name], sb["v"][name])):
            np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max(),
                                       err_msg=name)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return train(tmp_path_factory.mktemp("single"), "single", 1, model=MODEL, batch=8)


@pytest.fixture(scope="module")
def single_flash(tmp_path_factory):
    return train(tmp_path_factory.mktemp("single_flash"), "single", 1, "--attention", "flash",
                 model=MODEL, batch=8)


@pytest.mark.parametrize("n,flags", [
    (2, ["--cp", "2"]),
    (4, ["--cp", "4"]),
    (2, ["--cp", "2", "--cp-split", "contiguous"]),
    pytest.param(4, ["--cp", "2", "--dp", "2"], marks=pytest.mark.slow),   # by default with ZeRO-3:
    (4, ["--cp", "2", "--tp", "2"]),
    (4, ["--cp", "2", "--pp", "2", "--microbatches", "2"]),
    (4, ["--cp", "2", "--dp", "2", "--zero", "3"]),
    (2, ["--cp", "2", "--recompute", "selective"]),
], ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_parity_with_single_process(tmp_path, single, n, flags):
    assert_close_run(train(tmp_path, "run", n, *flags, model=MODEL, batch=8, timeout=240), single)


@pytest.mark.parametrize("n,flags", [
    (2, ["--cp", "2"]), (4, ["--cp", "4"]), (4, ["--cp", "2", "--tp", "2"]),
    # dp and pp do not touch the attention kernels' ring: with flash, the slow run's
    pytest.param(4, ["--cp", "2", "--dp", "2"], marks=pytest.mark.slow),
    pytest.param(4, ["--cp", "2", "--pp", "2", "--microbatches", "2"], marks=pytest.mark.slow)],
                         ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_parity_with_flash_attention(tmp_path, single_flash, n, flags):
    run = train(tmp_path, "run", n, *flags, "--attention", "flash", model=MODEL, batch=8, timeout=240)
    assert_close_run(run, single_flash)


def test_split_covers_the_sequence_once_and_balances_the_work():
    for cp in (1, 2, 3, 4):
        for zigzag in (True, False):
            held = np.concatenate([positions_of(r, cp, 24, zigzag) for r in range(cp)])
            assert sorted(held) == list(range(24))
    assert chunks_of(0, 4) == (0, 7) and chunks_of(3, 4) == (3, 4)
    for cp in (2, 4, 8):
        zig = [work_units(r, cp, True) for r in range(cp)]
        plain = [work_units(r, cp, False) for r in range(cp)]
        assert zig == [2.0 * cp] * cp                       # the same on every rank
        assert plain == [4.0 * r + 2 for r in range(cp)]    # the last rank: 2x the mean
        assert sum(zig) == sum(plain)


@pytest.mark.parametrize("fields,message", [
    (dict(cp=2, seq_len=6), "`seq_len` 6 must be divisible by 2·cp = 4"),
    (dict(cp=2, dp=2), "world size 2 != dp·cp·tp·pp = 2·2·1·1"),
    (dict(cp_split="contiguous"), "`cp_split` belongs to context parallelism"),
    (dict(cp=0), "`cp` must be >= 1"),
])
def test_bad_context_layouts_are_refused(fields, message):
    config = TrainConfig(model="tiny", **fields)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        config.resolve(world_size=2)


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_with_grouped_kv_heads(cp):
    """Every (Hkv, naive|flash, zig-zag|contiguous) within 1e-12 of one process on every
    rank; bytes sent equal (3C-2)·2·B·Hkv·(S/C)·d·8 exactly, so Hkv = H/4 moves a quarter."""
    output = run_mpi(cp, ["tests/scripts/ring_gqa.py"], timeout=240).stdout
    parity = re.findall(r"^parity Hkv=(\d+) kind=(\w+) split=(\w+) max_rel=(\S+)$", output, re.M)
    assert len(parity) == 12, output
    assert all(float(error) <= 1e-12 for *_, error in parity), output
    sent = {int(h): (int(counted), int(formula)) for h, counted, formula in
            re.findall(r"^bytes cp=\d+ H=8 Hkv=(\d+) counted=\[(\d+)\] formula=(\d+)$", output, re.M)}
    assert set(sent) == {8, 2, 1} and all(c == f for c, f in sent.values()), output
    assert sent[8][0] == 4 * sent[2][0] == 8 * sent[1][0]   # n_kv_head = n_head/4: a quarter
