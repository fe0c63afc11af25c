"""Corpus, batches, checkpoints and the backend's bookkeeping."""
import os

import numpy as np
import pytest

from minipar import backend, checkpoint
from minipar.data import Dataset, load_corpus, encode, decode, shard_rows


def test_stdlib_corpus_is_python_and_deterministic():
    a = load_corpus("stdlib", max_bytes=200_000)
    b = load_corpus("stdlib", max_bytes=200_000)
    assert len(a) == 200_000 and np.array_equal(a, b)
    text = decode(a[:100_000])
    assert "def " in text and "import " in text


def test_batches_are_a_pure_function_of_seed_and_step(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("hello world, " * 100)
    ds = Dataset(load_corpus(str(path)), seq_len=8, val_fraction=0.2)
    x1, y1 = ds.batch(seed=0, step=5, batch_size=4)
    x2, y2 = ds.batch(seed=0, step=5, batch_size=4)
    x3, _ = ds.batch(seed=0, step=6, batch_size=4)
    assert np.array_equal(x1, x2) and not np.array_equal(x1, x3)
    assert np.array_equal(x1[:, 1:], y1[:, :-1])            # targets are inputs shifted by one
    assert x1.shape == (4, 8) and x1.dtype == np.int64
    np.testing.assert_array_equal(shard_rows(x1, 1, 2), x1[2:])
    with pytest.raises(ValueError, match="evenly"):
        shard_rows(x1, 0, 3)


def test_folder_corpus_and_errors(tmp_path):
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "a.txt").write_text("first")
    assert decode(load_corpus(str(tmp_path))).startswith("first")
    with pytest.raises(FileNotFoundError):
        load_corpus(str(tmp_path / "missing"))
    assert decode(encode("é = 1")) == "é = 1"


def test_checkpoint_roundtrip_atomic_and_corrupt(tmp_path):
    w = np.arange(6.0).reshape(2, 3)
    pieces = [("param", "w", (2, 3), ((0, 0), (2, 2)), w[:, :2]),     # two ranks' columns
              ("param", "w", (2, 3), ((0, 2), (2, 1)), w[:, 2:]),
              ("adam_m", "w", (2, 3), ((0, 0), (2, 3)), np.ones((2, 3)))]
    assert checkpoint.save(None, tmp_path, 3, {"model": {"d_model": 4}, "optimizer_step": 3},
                           pieces) is None
    assert sorted(os.listdir(tmp_path)) == ["latest", "step-0000003"]   # no temporary left
    ckpt = checkpoint.open_checkpoint(tmp_path)
    np.testing.assert_array_equal(ckpt.tensor("w"), w)
    np.testing.assert_array_equal(ckpt.read("param", "w", ((1, 1), (1, 2))), w[1:, 1:])
    assert ckpt.meta["step"] == 3 and ckpt.names("adam_m") == ["w"]
    checkpoint.check_compatible(ckpt.meta, {"d_model": 4})
    with pytest.raises(ValueError, match="another model"):
        checkpoint.check_compatible(ckpt.meta, {"d_model": 8})
    data = tmp_path / "step-0000003" / "rank-00000.bin"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ValueError, match="truncated"):
        checkpoint.open_checkpoint(tmp_path).tensor("w", "adam_m")
    (tmp_path / "step-0000003" / "index.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt"):
        checkpoint.open_checkpoint(tmp_path / "step-0000003")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        checkpoint.open_checkpoint(tmp_path / "nowhere")


def test_backend_seam():
    assert backend.backend_name() == "numpy"
    assert backend.xp.zeros(3).shape == (3,)
    assert backend.dtype_of("fp64") == np.float64
    assert backend.dtype_of("bf16").itemsize == 2
    with pytest.raises(ValueError, match="unknown precision"):
        backend.dtype_of("fp8")
    with pytest.raises(ValueError, match="unknown backend"):
        backend.set_backend("jax")
    if not backend.cupy_available():
        with pytest.raises(RuntimeError, match="cupy"):
            backend.set_backend("cupy")
        assert backend.backend_name() == "numpy"


def test_memory_counter_tracks_live_bytes_and_peak():
    counter = backend.MemoryCounter()
    a = counter.track(np.zeros(1000))                  # 8000 bytes
    b = counter.track(np.zeros(500))                   # 4000 bytes
    view = counter.track(a[:10])                       # a view: its owner is already counted
    assert view.base is a and counter.live == 12000 and counter.peak == 12000
    c = counter.track(np.zeros((10, 10)).T)            # a view of an untracked array: owner counted
    assert counter.live == 12800
    del c
    assert counter.live == 12000
    del a
    assert counter.live == 12000                       # the view keeps its owner alive
    del view
    assert counter.live == 4000 and counter.peak == 12800
    counter.reset_peak()
    assert counter.peak == 4000
    del b
