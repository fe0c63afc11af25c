"""Sharded checkpoints without MPI: boxes, the index, the commit, keep, the tools."""
import json
import os

import numpy as np
import pytest

from minipar import checkpoint
from minipar.checkpoint import layout
from minipar.checkpoint.boxes import flat_to_boxes, intersect, relative
from minipar.checkpoint.tools import consolidate, describe, upgrade
from minipar.nn import GPTConfig
from minipar.parallel.placement import Placement
from minipar.parallel.tensor.sharding import Shard


def test_intersect_is_per_axis_max_of_starts_min_of_ends():
    assert intersect(((0, 0), (4, 6)), ((2, 3), (4, 4))) == ((2, 3), (2, 3))
    assert intersect(((0,), (3,)), ((3,), (2,))) is None           # touching is not overlapping
    assert intersect(((0, 5), (4, 2)), ((1, 0), (1, 5))) is None    # apart on the second axis
    assert relative(((2, 3), (2, 3)), ((2, 0), (4, 6))) == (slice(0, 2), slice(3, 6))


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_flat_range_boxes_hold_exactly_the_range_in_order(shape):
    a = np.arange(np.prod(shape)).reshape(shape)
    rng = np.random.default_rng(0)
    for _ in range(40):
        lo, hi = sorted(rng.integers(0, a.size + 1, size=2))
        boxes = flat_to_boxes(shape, lo, hi)
        got = np.concatenate([a[relative(b, ((0,) * len(shape), shape))].reshape(-1)
                              for b in boxes] or [np.zeros(0, int)])
        np.testing.assert_array_equal(got, a.reshape(-1)[lo:hi])
        assert len(boxes) <= 2 * len(shape) - 1                     # a few boxes, not one per row


def test_a_tp_piece_maps_back_to_its_global_boxes():
    full = np.arange(4 * 12.0).reshape(4, 12)                        # qkv-like: 3 groups of 4 columns
    for rank in range(2):
        p = Placement("w", full.shape, Shard(1, groups=3), rank, 2)
        piece = p.piece(full)
        for lo, hi in ((0, piece.size), (5, 19)):
            for box in flat_to_boxes(piece.shape, lo, hi):
                for part, g in p.to_global(box):
                    np.testing.assert_array_equal(piece[relative(part, ((0, 0), piece.shape))],
                                                  full[relative(g, ((0, 0), full.shape))])
        assert [g for _, g in p.to_global(((0, 0), piece.shape))] == p.boxes()


def _save(directory, step, keep=0, value=1.0):
    a = np.full((2, 2), value)
    return checkpoint.save(None, directory, step, {"optimizer_step": step},
                           [("param", "w", a.shape, ((0, 0), a.shape), a)], keep=keep)


def test_an_uncommitted_directory_is_never_the_latest(tmp_path):
    _save(tmp_path, 2)
    (tmp_path / "step-0000004.tmp-7-7").mkdir()                      # a save that crashed
    (tmp_path / "step-0000005").mkdir()                              # renamed, but no index
    (tmp_path / "step-0000005" / "rank-00000.bin").write_bytes(b"x")
    assert checkpoint.latest(tmp_path).endswith("step-0000002")
    assert [s for s, _ in layout.committed(tmp_path)] == [2]
    assert checkpoint.open_checkpoint(tmp_path).meta["step"] == 2
    _save(tmp_path, 6)
    assert not (tmp_path / "step-0000004.tmp-7-7").exists()          # the next save cleans up
    assert checkpoint.latest(tmp_path).endswith("step-0000006")


def test_keep_removes_older_complete_checkpoints_after_the_commit(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep=2)
    assert sorted(os.listdir(tmp_path)) == ["latest", "step-0000003", "step-0000004"]
    _save(tmp_path, 4, keep=0, value=2.0)                            # the same step again
    assert checkpoint.latest(tmp_path).endswith("step-0000004.1")
    assert checkpoint.open_checkpoint(tmp_path).tensor("w")[0, 0] == 2.0
    assert (tmp_path / "step-0000004" / "index.json").exists()       # never overwritten


def test_inspect_consolidate_and_an_old_checkpoint(tmp_path):
    w = np.arange(12.0).reshape(3, 4)
    pieces = [("param", "w", w.shape, ((0, 0), (3, 2)), w[:, :2]),
              ("param", "w", w.shape, ((0, 2), (3, 2)), w[:, 2:]),
              ("hook", "1/step", (), ((), ()), np.array(5))]
    checkpoint.save(None, tmp_path / "a", 7, {"optimizer_step": 7, "layout": {"name": "tp2"}}, pieces)
    text = "\n".join(describe(tmp_path / "a"))
    assert "step 7" in text and "layout tp2" in text and "1 param, 1 hook" in text
    out = consolidate(tmp_path / "a", tmp_path / "b")
    index = json.loads(open(os.path.join(out, "index.json")).read())
    assert [len(t["pieces"]) for t in index["tensors"].values()] == [1, 1]   # whole tensors
    np.testing.assert_array_equal(checkpoint.open_checkpoint(tmp_path / "b").tensor("w"), w)
    assert checkpoint.open_checkpoint(tmp_path / "b").tensor("1/step", "hook") == 5
    old = tmp_path / "old"                                           # minipar-checkpoint-1
    old.mkdir()
    gpt2 = GPTConfig().to_dict()                          # a file without the fields below
    unrecorded = {k: v for k, v in gpt2.items() if k not in ("arch", "n_kv_head", "rope_theta",
                                                             "d_ff", "pad_vocab_to")}
    meta = {"format": "minipar-checkpoint-1", "step": 3, "optimizer_step": 3, "model": unrecorded}
    np.savez(old / "checkpoint.npz", **{"param/w": w, "adam_m/w": w + 1, "hook/0/step": np.array(2),
                                        "meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)})
    with pytest.raises(ValueError, match=f"checkpoint upgrade {old} NEW_DIR"):
        checkpoint.open_checkpoint(old)
    upgrade(old, tmp_path / "new")
    params, state, meta = checkpoint.load_full(tmp_path / "new")
    np.testing.assert_array_equal(state["m"]["w"], w + 1)
    assert meta["step"] == 3 and state["hook"] == {0: {"step": 2}}
    checkpoint.check_compatible(meta, gpt2)               # resumes a GPT-2 run


def test_non_finite_weights_are_found_in_blocks(tmp_path):
    a = np.ones(10)
    a[7] = np.inf
    checkpoint.save(None, tmp_path, 1, {}, [("param", "b", a.shape, ((0,), a.shape), a)])
    assert checkpoint.open_checkpoint(tmp_path).nonfinite(block=3) == "b"


def test_a_checkpoint_from_before_a_model_field_existed_stands_for_its_default():
    """A checkpoint written before the mixture-of-experts fields existed records none of
    them: it holds the dense model their defaults build, and resumes on a dense run only."""
    import dataclasses
    from minipar.checkpoint import check_compatible
    from minipar.nn import GPTConfig
    dense = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, d_model=32, n_head=2, arch="llama")
    defaults = {f.name: f.default for f in dataclasses.fields(dense)
                if f.default is not dataclasses.MISSING}
    before = {k: v for k, v in dense.to_dict().items() if not k.startswith("moe_")}
    check_compatible({"model": before}, dense.to_dict(), defaults)
    moe = dataclasses.replace(dense, moe_experts=4)
    with pytest.raises(ValueError, match="moe_experts: checkpoint 0 vs run 4"):
        check_compatible({"model": before}, moe.to_dict(), defaults)
    with pytest.raises(ValueError, match="moe_experts"):
        check_compatible({"model": before}, dense.to_dict() | {"moe_experts": 4})   # no defaults
