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
import zipfile

import numpy as np

FORMAT = "minipar-checkpoint-1"
FILENAME = "checkpoint.npz"


def save(directory, params, optimizer_state, meta):
    """Write ``directory/checkpoint.npz`` atomically.

    params: {name: array}; optimizer_state: {"step": int, "m": {name: array}, "v": {...}};
    meta: JSON-serialisable (model config, step, seed, ...).
    """
    os.makedirs(directory, exist_ok=True)
    arrays = {f"param/{k}": v for k, v in params.items()}
    for slot in ("m", "v"):
        arrays.update({f"adam_{slot}/{k}": v for k, v in optimizer_state.get(slot, {}).items()})
    meta = dict(meta, format=FORMAT, optimizer_step=int(optimizer_state.get("step", 0)))
    arrays["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
    final = os.path.join(directory, FILENAME)
    tmp = f"{final}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


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
    return params, state, meta


def check_compatible(meta, model_config: dict):
    """Refuse a checkpoint made for another model configuration."""
    saved = meta.get("model", {})
    diff = {k: (saved.get(k), v) for k, v in model_config.items()
            if k != "attention" and saved.get(k) != v}
    if diff:
        details = ", ".join(f"{k}: checkpoint {a!r} vs run {b!r}" for k, (a, b) in sorted(diff.items()))
        raise ValueError(f"checkpoint was written for another model ({details})")
