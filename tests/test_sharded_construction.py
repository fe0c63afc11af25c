"""Initial weights drawn by (seed, name), and layouts that build only their own part."""
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from minipar import backend
from minipar.nn import GPT, config_from_preset
from minipar.nn.init import (Normal, generator, init_specs, initial_value, is_placeholder,
                             name_key, placeholder)
from minipar.parallel.placement import Placement, SlotRange
from minipar.parallel.tensor.sharding import Shard
from tests.mpirun import REPO, run_mpi


def test_initial_value_is_a_function_of_seed_and_name():
    a = initial_value(3, "blocks.0.mlp.fc.weight", (4, 5), Normal(0.02))
    np.testing.assert_array_equal(a, initial_value(3, "blocks.0.mlp.fc.weight", (4, 5), Normal(0.02)))
    assert not np.array_equal(a, initial_value(4, "blocks.0.mlp.fc.weight", (4, 5), Normal(0.02)))
    assert not np.array_equal(a, initial_value(3, "blocks.1.mlp.fc.weight", (4, 5), Normal(0.02)))
    digest = hashlib.sha256(b"wte.weight").digest()
    assert name_key(3, "wte.weight")[1] == int.from_bytes(digest[:4], "little")
    assert generator(3, "wte.weight").integers(1 << 30) == generator(3, "wte.weight").integers(1 << 30)


def test_initial_values_agree_across_processes_with_other_string_hashes():
    """Python salts hash() of strings per process; the key must not depend on it."""
    code = ("from minipar.nn.init import initial_value, Normal;"
            "print(initial_value(0, 'blocks.2.attn.qkv.weight', (3,), Normal(1.0)).tolist())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=REPO, env=dict(os.environ, PYTHONHASHSEED=str(salt))).stdout
            for salt in (1, 2)}
    assert len(outs) == 1, outs


def test_weights_do_not_depend_on_what_else_is_built():
    """Per-name draws: a block's weights are the same in a deeper model, and the same
    whether drawn at construction or later from placeholders."""
    two, four = (GPT(config_from_preset("tiny", n_layer=n), seed=5) for n in (2, 4))
    for name, p in two.named_parameters():
        if "proj.weight" in name:       # std 0.02/sqrt(2L) depends on the depth
            continue
        np.testing.assert_array_equal(p.data, dict(four.named_parameters())[name].data, err_msg=name)
    cfg = config_from_preset("tiny")
    lazy = GPT(cfg, seed=5, materialize=False)
    assert all(is_placeholder(p.data) for n, p in lazy.named_parameters() if "ln" not in n)
    specs = init_specs(lazy)
    for name, p in GPT(cfg, seed=5).named_parameters():
        shape, spec = specs[name]
        np.testing.assert_array_equal(p.data, initial_value(5, name, shape, spec).astype(p.dtype))


def test_placeholder_costs_nothing_and_loads_a_state_dict():
    ph = placeholder((1000, 1000), np.float64)
    assert is_placeholder(ph) and ph.shape == (1000, 1000) and ph.strides == (0, 0)
    assert not is_placeholder(np.zeros((3, 3)))
    cfg = config_from_preset("tiny")
    state = GPT(cfg, seed=1).state_dict()
    lazy = GPT(cfg, seed=2, materialize=False)
    lazy.load_state_dict(state)
    for name, p in lazy.named_parameters():
        np.testing.assert_array_equal(backend.to_host(p.data), state[name], err_msg=name)


def test_placement_cuts_tp_then_zero3_range():
    full = np.arange(24.0).reshape(4, 6)
    cols = Placement("w", (4, 6), Shard(1), tp_rank=1, tp_size=2)
    np.testing.assert_array_equal(cols.local(full), full[:, 3:])
    assert cols.piece_shape == (4, 3) and cols.local_size == 12
    ranged = Placement("w", (4, 6), Shard(1), 1, 2,
                       owned=SlotRange(0, 2, 7, 0, weights_sharded=True))
    np.testing.assert_array_equal(ranged.local(full), full[:, 3:].reshape(-1)[2:7])
    assert ranged.local_size == 5
    optimizer_only = Placement("w", (4, 6), Shard(1), 1, 2, owned=SlotRange(0, 2, 7, 0))
    np.testing.assert_array_equal(optimizer_only.local(full), full[:, 3:])   # ZeRO-1/2
    qkv = Placement("qkv", (2, 6), Shard(1, groups=3), tp_rank=0, tp_size=2)
    np.testing.assert_array_equal(qkv.local(np.arange(12).reshape(2, 6)), [[0, 2, 4], [6, 8, 10]])


@pytest.mark.parametrize("shard, rank, size", [(None, 0, 1), (Shard(0), 1, 3), (Shard(1), 2, 3),
                                               (Shard(1, groups=3), 1, 2)])
def test_boxes_cover_exactly_the_piece(shard, rank, size):
    """Reading the placement's boxes out of the global tensor, in order, gives the piece:
    what a checkpoint index needs to put a rank's bytes back where they belong."""
    full = np.arange(7 * 12).reshape(7, 12)
    pl = Placement("w", full.shape, shard, rank, size)
    parts = [full[tuple(slice(o, o + n) for o, n in zip(offsets, lengths))]
             for offsets, lengths in pl.boxes()]
    axis = 0 if shard is None else shard.axis
    np.testing.assert_array_equal(np.concatenate(parts, axis=axis), pl.piece(full))


@pytest.mark.parametrize("n", [2, 4])
def test_every_layout_builds_the_single_process_weights_and_only_its_part(n):
    out = run_mpi(n, ["tests/scripts/sharded_construction.py"], timeout=240).stdout
    assert out.count("ok rank") == n * {2: 4, 4: 7}[n], out
