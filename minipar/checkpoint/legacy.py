"""The single-file format, "minipar-checkpoint-1": one ``checkpoint.npz`` of full arrays
(``param/<name>``, ``adam_m/<name>``, ``adam_v/<name>``, ``hook/<rank>/<key>``) and a
JSON ``meta`` array.  Only read, array by array, by ``checkpoint upgrade``."""
from __future__ import annotations

import json
import os
import zipfile

import numpy as np

FORMAT = "minipar-checkpoint-1"
FILENAME = "checkpoint.npz"
# model fields a file may not record, at the value every run without them had (a GPT-2
# block, no vocabulary padding): resuming compares every field
MODEL_FIELDS_NOT_RECORDED = {"arch": "gpt2", "n_kv_head": None, "rope_theta": 10000.0,
                             "d_ff": None, "pad_vocab_to": 1}


def open_legacy(directory):
    """(the open NpzFile — arrays load one at a time on access —, its meta, with the
    model fields it does not record filled in)."""
    path = os.path.join(directory, FILENAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint in {directory} (upgrade takes a folder "
                                f"holding an old {FILENAME})")
    try:
        z = np.load(path, allow_pickle=False)
        meta = json.loads(z["meta"].tobytes().decode())
    except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError) as err:
        raise ValueError(f"checkpoint {path} is corrupt or unreadable: {err}") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} file (format {meta.get('format')!r})")
    if "model" in meta:
        meta["model"] = {**MODEL_FIELDS_NOT_RECORDED, **meta["model"]}
    return z, meta
