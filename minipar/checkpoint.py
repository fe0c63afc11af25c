"""Checkpoints: one ``.npz`` file holding full (unsharded) arrays plus JSON metadata.

Arrays are stored by parameter name (``param/<name>``, ``adam_m/<name>``,
``adam_v/<name>``), never by rank, so a checkpoint written under one parallel
layout can be read under any other.  Writes are atomic: the file is written under
a temporary name, flushed to disk, then renamed over the old one, so a crash
leaves either the previous checkpoint or the new one, never half of one.
"""
from __future__ import annotations

import json
import os
import shutil
import zipfile

import numpy as np

FORMAT = "minipar-checkpoint-1"
FILENAME = "checkpoint.npz"


class CheckpointWriteError(OSError):
    """The checkpoint could not be written; the previous one (if any) is intact."""


def remove_stale_temporaries(directory):
    """Delete ``checkpoint.npz.tmp-*`` left by writes that crashed (they can be large)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.startswith(FILENAME + ".tmp-"):
            try:
                os.remove(os.path.join(directory, name))
            except OSError:
                pass


def save(directory, params, optimizer_state, meta):
    """Write ``directory/checkpoint.npz`` atomically.

    params: {name: array}; optimizer_state: {"step": int, "m": {name: array}, "v": {...},
    optional "hook": {world rank: {key: array}} (gradient compression's residuals, per rank)};
    meta: JSON-serialisable (model config, step, seed, ...).  A failed write (full disk,
    lost permission) removes its temporary file and raises ``CheckpointWriteError``
    with one line; the previous checkpoint stays as it was.
    """
    arrays = {f"param/{k}": v for k, v in params.items()}
    for slot in ("m", "v"):
        arrays.update({f"adam_{slot}/{k}": v for k, v in optimizer_state.get(slot, {}).items()})
    for rank, state in optimizer_state.get("hook", {}).items():   # per-rank compression state
        arrays.update({f"hook/{rank}/{k}": v for k, v in state.items()})
    meta = dict(meta, format=FORMAT, optimizer_step=int(optimizer_state.get("step", 0)))
    arrays["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
    final = os.path.join(directory, FILENAME)
    tmp = f"{final}.tmp-{os.getpid()}"
    try:
        os.makedirs(directory, exist_ok=True)
        remove_stale_temporaries(directory)
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except OSError as err:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise CheckpointWriteError(f"could not write the checkpoint to {directory}: "
                                   f"{err.strerror or err}; the previous checkpoint is "
                                   "unchanged") from None
    return final


def probe_directory(directory, need_bytes=0):
    """Before training: can a checkpoint of ``need_bytes`` be written to ``directory``?
    Creates it, writes and removes a probe file (``paths.probe_output_dir``), removes a
    crashed save's temporaries, checks the free space; raises ValueError with one line."""
    from minipar.paths import probe_output_dir
    probe_output_dir(directory)
    remove_stale_temporaries(directory)
    free = shutil.disk_usage(directory).free
    if need_bytes and free < need_bytes:
        raise ValueError(f"only {free / 2**20:.1f} MiB free; a checkpoint needs about "
                         f"{need_bytes / 2**20:.1f} MiB (written beside the previous one)")


def check_loadable(params, model, precision):
    """One clear line for a checkpoint whose contents cannot be this run's: a missing or
    extra parameter, a wrong shape or dtype, non-finite values, another precision."""
    own = dict(model.named_parameters())
    missing, extra = sorted(set(own) - set(params)), sorted(set(params) - set(own))
    if missing or extra:
        raise ValueError(f"parameters do not match the model: missing {missing[:3]}, "
                         f"unexpected {extra[:3]}")
    want = np.float64 if precision == "fp64" else np.float32
    for name, p in own.items():
        a = params[name]
        if tuple(a.shape) != tuple(p.shape):
            raise ValueError(f"{name} has shape {tuple(a.shape)}, the model {tuple(p.shape)}")
        if a.dtype != want:
            raise ValueError(f"{name} is {a.dtype}, a {precision} run keeps {np.dtype(want)}")
        if not np.isfinite(a).all():
            raise ValueError(f"{name} holds non-finite values (inf or nan)")


def load(directory):
    """(params, optimizer_state, meta) from ``directory``, with clear errors for a
    missing, corrupt or foreign file."""
    path = os.path.join(directory, FILENAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path} (--resume takes the --save directory)")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays.pop("meta").tobytes().decode())
    except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError) as err:
        raise ValueError(f"checkpoint {path} is corrupt or unreadable: {err}") from err
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} file (format {meta.get('format')!r})")
    params = {k[6:]: v for k, v in arrays.items() if k.startswith("param/")}
    state = {"step": meta["optimizer_step"],
             "m": {k[7:]: v for k, v in arrays.items() if k.startswith("adam_m/")},
             "v": {k[7:]: v for k, v in arrays.items() if k.startswith("adam_v/")}}
    hook = {}
    for k, v in arrays.items():
        if k.startswith("hook/"):
            _, rank, key = k.split("/", 2)
            hook.setdefault(int(rank), {})[key] = v
    if hook:
        state["hook"] = hook
    return params, state, meta


# model fields added after checkpoints were first written, at the value those had
OLDER_DEFAULTS = {"arch": "gpt2", "n_kv_head": None, "rope_theta": 10000.0, "d_ff": None}


def _vocab_rows(model_config):
    """The embedding's rows: the vocabulary padded to its multiple (1 before padding existed)."""
    vocab, multiple = model_config.get("vocab_size"), model_config.get("pad_vocab_to") or 1
    return None if vocab is None else -(-vocab // multiple) * multiple


def check_compatible(meta, model_config: dict):
    """Refuse a checkpoint made for another model configuration."""
    saved = dict(OLDER_DEFAULTS, **meta.get("model", {}))
    diff = {k: (saved.get(k), v) for k, v in model_config.items()
            if k not in ("attention", "pad_vocab_to") and saved.get(k) != v}
    rows = [_vocab_rows(c) for c in (saved, model_config)]   # the padding's multiple may differ
    if rows[0] != rows[1]:                                   # (cupy 64, numpy 1) if the rows agree
        diff["vocabulary rows"] = tuple(rows)
    if diff:
        details = ", ".join(f"{k}: checkpoint {a!r} vs run {b!r}" for k, (a, b) in sorted(diff.items()))
        raise ValueError(f"checkpoint was written for another model ({details})")
