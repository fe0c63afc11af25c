"""One rank's checkpoint file (``checkpoint/rankfile.py``): pieces of any address, size
and dtype land at offsets congruent to their addresses, whole blocks straight from the
arrays, and read back bit for bit — O_DIRECT where the file system takes it, through
the page cache where it refuses."""
import errno
import os

import numpy as np
import pytest

from minipar.checkpoint import rankfile


def _pieces(seed):
    """Slices of a few arrays at odd offsets: empty, one element, under, across and
    over 4 KiB blocks, in three dtypes (the slot buffers' pieces look like this)."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(30000)
    out = []
    for j, n in enumerate([0, 1, 3, 511, 512, 513, 1000, 5000, 12345]):
        start = int(rng.integers(0, base.size - n))
        dtype = [np.float64, np.float32, np.int8][j % 3]
        values = base[start:start + n] if dtype is np.float64 else base[start:start + n].astype(dtype)
        out.append(("param", f"w{j}", values.shape, ((0,), values.shape), values))
    return out


def _check(path, records, pieces):
    raw = np.fromfile(path, np.uint8)
    assert raw.size % rankfile.BLOCK == 0
    for record, (_, name, _, _, values) in zip(records, pieces):
        assert record["name"] == name and record["offset"] % values.itemsize == 0
        got = raw[record["offset"]:record["offset"] + values.nbytes].view(values.dtype)
        np.testing.assert_array_equal(got, values, err_msg=name)


@pytest.mark.parametrize("seed", range(5))
def test_every_piece_reads_back_bit_for_bit(tmp_path, seed):
    pieces = _pieces(seed)
    records, buffers = rankfile.plan_pieces(pieces)
    for b in buffers:          # O_DIRECT's rule: addresses and lengths whole blocks
        address = np.frombuffer(b, np.uint8).__array_interface__["data"][0]
        assert address % rankfile.BLOCK == 0 and len(b) % rankfile.BLOCK == 0
    path = tmp_path / "rank-00000.bin"
    _check(path, rankfile.write_planned(path, (records, buffers)), pieces)


def test_a_file_system_without_o_direct_gets_the_same_file(tmp_path, monkeypatch):
    """tmpfs refuses O_DIRECT at open (EINVAL): the plan goes through the page cache."""
    real_open, flags_seen = os.open, []

    def refusing_open(path, flags, *args):
        flags_seen.append(flags)
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)
    monkeypatch.setattr(os, "open", refusing_open)
    pieces = _pieces(7)
    path = tmp_path / "rank-00000.bin"
    _check(path, rankfile.write_planned(path, rankfile.plan_pieces(pieces)), pieces)
    assert not flags_seen[-1] & getattr(os, "O_DIRECT", 0)


def test_nothing_to_write_is_an_empty_file(tmp_path):
    path = tmp_path / "rank-00001.bin"
    assert rankfile.write_planned(path, rankfile.plan_pieces([])) == []
    assert os.path.getsize(path) == 0
