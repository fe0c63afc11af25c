"""A checkpoint's parameters, one tensor at a time, for exporters."""
from __future__ import annotations

from minipar import checkpoint


class CheckpointTensors:
    """names(), shape(name), tensor(name) of a checkpoint's parameters; ``model`` is its
    model config (dict), ``tokenizer`` its tokenizer (dict) or None.  Each tensor is read
    from its pieces when asked for (``checkpoint.open_checkpoint``): one in memory at a time."""

    def __init__(self, directory):
        self._ckpt = checkpoint.open_checkpoint(directory)
        self.model = self._ckpt.meta.get("model", {})
        self.tokenizer = self._ckpt.meta.get("tokenizer")

    def names(self):
        return sorted(self._ckpt.names("param"))

    def shape(self, name):
        return self._ckpt.shape("param", name)

    def tensor(self, name):
        return self._ckpt.tensor(name)


def open_tensors(directory):
    return CheckpointTensors(directory)
