"""Sharded checkpoints that reshard: every rank writes what it owns, any layout reads.

A checkpoint is a directory per step (``layout.py``): one raw file per rank holding that
rank's pieces — its ZeRO shards, tp slices, pipeline stage's parameters, Adam m and v
for them, its gradient-compression state — and one small ``index.json`` that says, for
every tensor (kind, global name), its global shape, dtype and where each piece is:

    "adam_m/blocks.0.attn.qkv.weight": {"shape": [64, 192], "dtype": "<f8", "pieces": [
        {"file": "rank-00000.bin", "offset": 4096, "box": [[0, 0], [64, 32]]}, ...]}

plus the step, optimizer step, config, layout, seed, precision, loss scaler, tokenizer
(the data position is the step: batch k is a function of (seed, k)).

    shards.py       what this rank owns as global boxes (from the slots and placements)
    boxes.py        box intersection and ZeRO's flat ranges as boxes (pure functions)
    write.py        each rank's file, the agreed commit (index, rename, ``latest``)
    read.py         ``open_checkpoint(DIR)``: any box of any tensor, from memmaps
    tools.py        ``checkpoint inspect`` / ``consolidate`` / ``upgrade`` (streamed)
    legacy.py       the single-file format (minipar-checkpoint-1), read only by ``upgrade``

A resumed run under any layout is built with zeros, then asks, per slot (masters, m, v),
for the boxes it owns and reads only the bytes of the pieces they intersect: no rank
gathers or holds a tensor it does not own (``train/saving.load_state``).
"""
from __future__ import annotations

import shutil

import numpy as np

from minipar.checkpoint import layout
from minipar.checkpoint.layout import FORMAT, latest, resolve
from minipar.checkpoint.read import Checkpoint, load_full, open_checkpoint
from minipar.checkpoint.write import CheckpointWriteError, PendingSave, plan_pieces, save

__all__ = ["FORMAT", "Checkpoint", "open_checkpoint", "load_full", "PendingSave", "plan_pieces", "save", "latest",
           "resolve", "CheckpointWriteError", "probe_directory", "check_compatible",
           "check_loadable", "exists"]


def exists(directory):
    """Is there a checkpoint (of any format) that ``--resume directory`` would find?"""
    try:
        layout.resolve(directory)
    except FileNotFoundError:
        return False
    except ValueError:
        return True             # an old one: resume refuses it with the command to convert
    return True


def probe_directory(directory, need_bytes=0):
    """Before training: can a checkpoint of ``need_bytes`` be written to ``directory``?
    Creates it, writes and removes a probe file (``paths.probe_output_dir``), removes
    crashed saves' temporaries, checks the free space; raises ValueError with one line."""
    from minipar.paths import probe_output_dir
    probe_output_dir(directory)
    layout.remove_temporaries(directory)
    free = shutil.disk_usage(directory).free
    if need_bytes and free < need_bytes:
        raise ValueError(f"only {free / 2**20:.1f} MiB free; a checkpoint needs about "
                         f"{need_bytes / 2**20:.1f} MiB (written beside the previous one)")


def check_loadable(ckpt, model, precision):
    """One clear line for a checkpoint whose contents cannot be this run's: a missing or
    extra parameter, a wrong shape or dtype, non-finite values, another precision.
    Reads the index, then scans the parameters' bytes in blocks for inf/nan."""
    own = dict(model.named_parameters())
    saved = set(ckpt.names("param"))
    missing, extra = sorted(set(own) - saved), sorted(saved - set(own))
    if missing or extra:
        raise ValueError(f"parameters do not match the model: missing {missing[:3]}, "
                         f"unexpected {extra[:3]}")
    want = np.dtype(np.float64 if precision == "fp64" else np.float32)
    for name, p in own.items():
        shape, dtype = ckpt.shape("param", name), ckpt.dtype("param", name)
        if shape != tuple(p.shape):
            raise ValueError(f"{name} has shape {shape}, the model {tuple(p.shape)}")
        if dtype != want:
            raise ValueError(f"{name} is {dtype}, a {precision} run keeps {want}")
    bad = ckpt.nonfinite("param")
    if bad is not None:
        raise ValueError(f"{bad} holds non-finite values (inf or nan)")


def _vocab_rows(model_config):
    """The embedding's rows: the vocabulary padded to its multiple (None where the
    configuration does not say both)."""
    vocab, multiple = model_config.get("vocab_size"), model_config.get("pad_vocab_to")
    return None if vocab is None or multiple is None else -(-vocab // multiple) * multiple


def check_compatible(meta, model_config: dict, defaults=None):
    """Refuse a checkpoint made for another model configuration.  The vocabulary's padding
    multiple may differ (CuPy pads to 64, NumPy to 1) where the rows it gives agree.  A
    field the checkpoint does not record (it was written before the field existed) stands
    for the model that field's value in ``defaults`` builds: a dense model predates the
    mixture-of-experts fields, and their defaults build it."""
    saved = dict(defaults or {}, **meta.get("model", {}))
    diff = {k: (saved.get(k), v) for k, v in model_config.items()
            if k not in ("attention", "pad_vocab_to") and saved.get(k) != v}
    rows = [_vocab_rows(c) for c in (saved, model_config)]
    if rows[0] != rows[1]:
        diff["vocabulary rows"] = tuple(rows)
    if diff:
        details = ", ".join(f"{k}: checkpoint {a!r} vs run {b!r}" for k, (a, b) in sorted(diff.items()))
        raise ValueError(f"checkpoint was written for another model ({details})")
