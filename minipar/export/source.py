"""A checkpoint's parameters, one tensor at a time, for exporters."""
from __future__ import annotations

from minipar import checkpoint


class CheckpointTensors:
    """names(), shape(name), tensor(name) of a checkpoint's parameters; ``model`` is its
    model config (dict), ``tokenizer`` its tokenizer (dict) or None."""

    def __init__(self, directory):
        params, _, meta = checkpoint.load(directory)
        self._params = params
        self.model = meta.get("model", {})
        self.tokenizer = meta.get("tokenizer")

    def names(self):
        return sorted(self._params)

    def shape(self, name):
        return tuple(self._params[name].shape)

    def tensor(self, name):
        return self._params[name]


def open_tensors(directory):
    return CheckpointTensors(directory)
