"""``python -m minipar export DIR --format hf --out OUT``: a checkpoint as a Hugging Face model.

Writes ``OUT/config.json`` and ``OUT/model.safetensors`` that ``transformers`` loads with
``AutoModelForCausalLM.from_pretrained(OUT)``.  The checkpoint is read one tensor at a time
and each tensor is streamed into the file (``safetensors_file.write``), so the exporter
never holds the whole model.  Where the run used a BPE tokenizer, its JSON travels as
``OUT/minipar_tokenizer.json`` (minipar's own format; ``transformers`` does not read it).
"""
from __future__ import annotations

import json
import os

import numpy as np

from minipar.cli_checks import CommandError, OneLineParser
from minipar.export import hf, safetensors_file
from minipar.export.source import open_tensors

DTYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64}


def export_hf(directory, out, dtype="float32"):
    """Write OUT/config.json and OUT/model.safetensors from checkpoint ``directory``;
    returns the safetensors file's path."""
    source = open_tensors(directory)
    rename, config_of = hf.mapping(source.model)
    entries, origin = [], {}
    for name in source.names():
        hf_name, transpose = rename(name)
        shape = source.shape(name)
        entries.append((hf_name, tuple(reversed(shape)) if transpose else tuple(shape), DTYPES[dtype]))
        origin[hf_name] = (name, transpose)

    def produce(hf_name):
        name, transpose = origin[hf_name]
        array = source.tensor(name)
        return array.T if transpose else array

    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "model.safetensors")
    safetensors_file.write(path, entries, produce, metadata={"format": "pt", "source": "minipar"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config_of(source.model, dtype), f, indent=2, sort_keys=True)
    if source.tokenizer is not None:
        with open(os.path.join(out, "minipar_tokenizer.json"), "w") as f:
            json.dump(source.tokenizer, f)
    return path


def main(argv):
    p = OneLineParser(prog="python -m minipar export",
                      description="a checkpoint as a Hugging Face model (config.json + model.safetensors)")
    p.add_argument("directory", help="a --save directory")
    p.add_argument("--format", default="hf", choices=["hf"])
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    args = p.parse_args(argv)
    from minipar.cli_checks import output_dir
    output_dir("--out", args.out)
    try:
        path = export_hf(args.directory, args.out, args.dtype)
    except (FileNotFoundError, ValueError) as err:
        raise CommandError(str(err)) from None
    print(f"wrote {path} ({os.path.getsize(path) / 2**20:.1f} MiB) and config.json; "
          f"load with transformers.AutoModelForCausalLM.from_pretrained({args.out!r})")
    return 0
