"""``preflight(config)``: the run's inputs and outputs, probed before any work.  IMPURE.

The checks of ``sections.py`` and ``rules.py`` read the config alone.  What they cannot
know is on the disk, and preflight looks:

    the data         the name resolved to its files (``stdlib``: its cached BPE shards,
                     built the first time, ``data/named.py``), which must be there, and
                     the model's vocabulary taken from it (256 for bytes, or the
                     tokenizer's) unless given
    the resume       a checkpoint is there (whether it fits this run is decided once the
                     model exists: ``train.load_resume``)
    the outputs      --save can be written, with room for a checkpoint (params, m, v),
                     made if missing; --log-json and --trace can be written (an existing
                     one is left as it is)

It returns the config with the data's facts filled in, or raises ConfigError with one
line.  It sends no message: every rank may run it (each probes with a file of its own
process's name, ``paths.py``), so a bad path stops every rank alike.
"""
from __future__ import annotations

from dataclasses import replace

from minipar.config.error import ConfigError


def preflight(config):
    """``config`` with its data's facts, its resume and outputs probed; or ConfigError."""
    config = with_data(config)
    check_resume_exists(config)
    check_outputs(config)
    return config


def with_data(config):
    """The data a name stands for (a text corpus: its files are there), and the model's
    vocabulary: the data's unless given."""
    from minipar.data import corpus_paths
    from minipar.data.named import resolve_data
    from minipar.data.tokens import is_token_dataset, vocab_size_of
    try:
        config = replace(config, data=resolve_data(config.data, quiet=config.quiet))
        if not is_token_dataset(config.data):
            corpus_paths(config.data)
        if config.vocab_size is not None:
            return config
        return replace(config, vocab_size=vocab_size_of(config.data))
    except (ValueError, OSError) as err:
        raise ConfigError(str(err)) from None


def check_resume_exists(config):
    if config.resume:
        from minipar.checkpoint import exists
        if not exists(config.resume):
            raise ConfigError(f"`resume` {config.resume}: no checkpoint there")


def checkpoint_bytes(config):
    """Bytes of one checkpoint: the weights and AdamW's m and v, 8 bytes each in fp64 and
    4 otherwise (half-precision runs keep fp32 masters)."""
    from minipar.nn import make_model
    params = make_model(config.model_config(), materialize=False).num_parameters()
    return 3 * (8 if config.precision == "fp64" else 4) * params


def check_outputs(config):
    """Every output of the run can be written: the --save directory first, with room for
    a checkpoint — made if missing, so the README's ``--save runs/stdlib --log-json
    runs/stdlib.json`` finds its folder — then the --log-json and --trace files."""
    from minipar import checkpoint
    from minipar.paths import PathError, probe_output_file
    if config.save:
        try:
            checkpoint.probe_directory(config.save, need_bytes=checkpoint_bytes(config))
        except ValueError as err:
            raise ConfigError(f"`save` {config.save}: {err}") from None
    for name in ("log_json", "trace"):
        path = getattr(config, name)
        if path is not None:
            try:
                probe_output_file(path)
            except PathError as err:
                raise ConfigError(f"`{name}` {path}: {err}") from None
